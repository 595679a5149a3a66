"""One shard's slice of a model: its store, optimizer and exactly-once buffer.

A `Tensor` validates every request completely before it mutates anything, so a
refused request leaves the state exactly as it was.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field

import numpy as np

from ps_server import keys_jit
from ps_server.proto import ps_pb2 as pb
from ps_server.shard.optim import OPTIMIZERS, Optimizer, make_optimizer
from ps_server.shard.storage import Contributions, DenseStore, SparseStore, Store
from ps_server.wire import RequestError

__all__ = ["Tensor", "ShardMemory", "spec_from_state", "VALUE_DTYPES", "NAN_POLICIES"]

VALUE_DTYPES = ("float64", "float32", "int64")  # int64: exact sums (histograms, counts)
#: What a push holding NaN/inf does: "refuse" it whole (the default) or "skip" those rows.
NAN_POLICIES = ("refuse", "skip")
_INITS = ("zeros", "normal", "uniform")


class ShardMemory:
    """A shard's memory budget over all its models (0 = none), and the lock that makes
    "check the budget, then grow" atomic across models."""

    def __init__(self, index: int, budget: int = 0, models: Callable[[], dict] | None = None):
        self.index, self.budget = index, int(budget)
        self._models = models or dict  # the shard's current models (a seed may replace them)
        self.lock = threading.Lock()

    def used(self) -> int:
        return sum(t.nbytes for t in list(self._models().values()))


def _check_spec(spec: pb.ModelSpec) -> None:
    where = f"model {spec.name!r}"
    if not spec.name:
        raise RequestError("INVALID_ARGUMENT", "model name must not be empty")
    if spec.kind not in ("dense", "sparse"):
        raise RequestError("INVALID_ARGUMENT", f"{where}: kind {spec.kind!r} (dense|sparse)")
    if spec.dim <= 0 or spec.cols <= 0:
        raise RequestError(
            "INVALID_ARGUMENT", f"{where}: dim {spec.dim} and cols {spec.cols} must be positive"
        )
    if spec.dtype not in VALUE_DTYPES:
        raise RequestError("INVALID_ARGUMENT", f"{where}: dtype {spec.dtype!r} {VALUE_DTYPES}")
    if spec.init and spec.init not in _INITS:
        raise RequestError("INVALID_ARGUMENT", f"{where}: init {spec.init!r} not in {_INITS}")
    if spec.budget_bytes < 0:
        raise RequestError("INVALID_ARGUMENT", f"{where}: budget_bytes {spec.budget_bytes} < 0")
    if spec.nan_policy and spec.nan_policy not in NAN_POLICIES:
        raise RequestError(
            "INVALID_ARGUMENT", f"{where}: nan_policy {spec.nan_policy!r} not in {NAN_POLICIES}"
        )
    if spec.optimizer and spec.dtype == "int64":
        raise RequestError("INVALID_ARGUMENT", f"{where}: an int64 tensor cannot have an optimizer")
    if spec.optimizer and spec.optimizer not in OPTIMIZERS:
        raise RequestError(
            "INVALID_ARGUMENT",
            f"{where}: optimizer {spec.optimizer!r} unknown (known: {', '.join(OPTIMIZERS)})",
        )
    if spec.kind == "dense" and not (0 <= spec.offset and spec.offset + spec.length <= spec.dim):
        raise RequestError(
            "INVALID_ARGUMENT",
            f"{where}: slice [{spec.offset}, {spec.offset + spec.length}) outside [0, {spec.dim})",
        )


@dataclass
class Tensor:
    """A model's slice on this shard."""

    spec: pb.ModelSpec
    store: Store
    optimizer: Optimizer | None
    contributions: Contributions = field(default_factory=Contributions)
    lock: threading.Lock = field(default_factory=threading.Lock)
    memory: ShardMemory | None = None

    @classmethod
    def create(cls, spec: pb.ModelSpec, memory: ShardMemory | None = None) -> Tensor:
        """A new slice; refused (RESOURCE_EXHAUSTED) if it alone is over a budget."""
        _check_spec(spec)
        dtype = np.dtype(spec.dtype)
        if spec.kind == "dense":
            store: Store = DenseStore(spec.length, spec.cols, spec.offset, dtype)
        else:
            store = SparseStore(spec.cols, dtype, spec.init or "zeros", spec.init_scale, spec.seed)
        t = cls(spec, store, _make_optimizer(spec, store), memory=memory)
        t._check_budget(t.nbytes, 0, "creating")
        return t

    @property
    def nbytes(self) -> int:
        """Memory held: the store (weights, optimizer state, index) and pending contributions."""
        return self.store.nbytes + self.contributions.nbytes

    def _check_budget(self, asked: int, used: int, doing: str) -> None:
        """Refuse growing by `asked` bytes past the model's or the shard's budget."""
        if asked <= 0:
            return
        shard = self.memory.index if self.memory is not None else "?"
        budget = self.spec.budget_bytes
        if budget and used + asked > budget:
            raise RequestError(
                "RESOURCE_EXHAUSTED",
                f"shard {shard}: {doing} {self.where} would grow it from {used} to "
                f"{used + asked} bytes (+{asked}), past its budget of {budget} bytes; "
                "nothing was changed",
            )
        if self.memory is not None and self.memory.budget:
            total = self.memory.used() + asked
            if total > self.memory.budget:
                raise RequestError(
                    "RESOURCE_EXHAUSTED",
                    f"shard {shard}: {doing} {self.where} needs {asked} more bytes; the shard "
                    f"would hold {total} bytes, past its budget of {self.memory.budget} bytes "
                    "(spark-ps-server --shard-memory-mb, spark.ps.shardMemoryMB); nothing "
                    "was changed",
                )

    @contextmanager
    def growing(self, keys: np.ndarray, doing: str, freed: int = 0) -> Iterator[None]:
        """Check the budgets for the rows `keys` would create, then let the caller create
        them while holding the shard's budget lock (so two models cannot both pass).

        `freed`: bytes the caller releases along with it (contributions it folds in and
        drops), so folding them into rows is checked by what it adds, not twice over.
        """
        shard_wide = self.memory is not None and self.memory.budget > 0
        if not shard_wide and not self.spec.budget_bytes:
            yield
            return
        with self.memory.lock if shard_wide else nullcontext():
            self._check_budget(self.store.growth(keys) - freed, self.nbytes, doing)
            yield

    @classmethod
    def from_state(cls, spec: pb.ModelSpec, state: dict[str, np.ndarray]) -> Tensor:
        store = (DenseStore if spec.kind == "dense" else SparseStore).from_state(state)
        return cls(spec, store, _make_optimizer(spec, store, attach=False))

    # ------------------------------------------------------------ validation
    @property
    def where(self) -> str:
        return f"model {self.spec.name!r}"

    def check_keys(self, keys: np.ndarray, what: str) -> np.ndarray:
        if keys.ndim != 1 or keys.dtype.kind not in "iu":
            raise RequestError(
                "INVALID_ARGUMENT", f"{what}: keys must be a 1-D int64 array, got {keys.dtype}"
            )
        keys = keys.astype(np.int64, copy=False)
        if keys.size == 0:
            return keys
        lo, hi = self._key_range()
        bad = (keys < lo) | (keys >= hi)
        if bad.any():
            i = int(np.argmax(bad))
            kind = "negative key" if keys[i] < 0 else "key out of range"
            raise RequestError(
                "OUT_OF_RANGE",
                f"{what}: {kind} {int(keys[i])} at position {i}; this shard holds keys "
                f"[{lo}, {hi}) of {self.where} (dim {self.spec.dim})",
            )
        return keys

    def _key_range(self) -> tuple[int, int]:
        if self.spec.kind == "dense":
            return self.spec.offset, self.spec.offset + self.spec.length
        return 0, self.spec.dim

    def check_values(self, values: np.ndarray, n: int, what: str) -> np.ndarray:
        cols = self.spec.cols
        if values.dtype.name not in VALUE_DTYPES or (
            (values.dtype.kind == "i") != (self.store.dtype.kind == "i")
        ):
            raise RequestError(
                "INVALID_ARGUMENT",
                f"{what}: values dtype {values.dtype.name} does not fit {self.where} "
                f"(dtype {self.spec.dtype})",
            )
        if values.ndim == 1 and cols == 1:
            values = values.reshape(-1, 1)
        if values.ndim != 2 or values.shape != (n, cols):
            raise RequestError(
                "INVALID_ARGUMENT",
                f"{what}: values of shape {values.shape} do not match {n} keys x {cols} cols "
                f"of {self.where}",
            )
        return values.astype(self.store.dtype, copy=False)

    def check_push(
        self, keys: np.ndarray, values: np.ndarray, what: str
    ) -> tuple[np.ndarray, np.ndarray]:
        """Validated (keys, values) of a push, after the model's NaN/inf policy.

        "refuse" (the default) refuses a push holding any NaN/inf whole; "skip" drops
        the rows holding one and keeps the rest.
        """
        keys = self.check_keys(keys, what)
        values = self.check_values(values, keys.size, what)
        finite = self._finite_rows(values, what)
        return (keys, values) if finite is None else (keys[finite], values[finite])

    def _finite_rows(self, values: np.ndarray, what: str) -> np.ndarray | None:
        """None when every row is finite (or values are integers); else, under "skip", the
        mask of the finite rows; under "refuse", RequestError naming the first bad value."""
        if values.dtype.kind != "f":
            return None
        finite = np.isfinite(values).all(axis=1)
        if finite.all():
            return None
        if self.spec.nan_policy == "skip":
            return finite
        i = int(np.argmax(~finite))
        raise RequestError(
            "INVALID_ARGUMENT",
            f"{what}: non-finite value {values[i][~np.isfinite(values[i])][0]} at row {i}; "
            f"{self.where} refuses NaN/inf updates (nan_policy='refuse'; 'skip' drops such rows)",
        )

    def check_range(self, start: int, stop: int, what: str) -> None:
        """Refuse a by-range request outside this dense slice (or to a sparse tensor)."""
        if self.spec.kind != "dense":
            raise RequestError(
                "INVALID_ARGUMENT", f"{what}: a by-range request needs a dense tensor"
            )
        lo, hi = self._key_range()
        if not (lo <= start <= stop <= hi):
            raise RequestError(
                "OUT_OF_RANGE",
                f"{what} range [{start}, {stop}) outside [{lo}, {hi}) of {self.where}",
            )

    # ------------------------------------------------------------ operations
    def pull(self, keys: np.ndarray, slot: str) -> np.ndarray:
        self._check_slot(slot)
        create = self.spec.create_on_pull
        with self.lock, self.growing(keys if create else keys[:0], "pull from"):
            return self.store.gather(keys, slot or "w", create=create)  # a fresh array

    def pull_range(self, start: int, stop: int, slot: str) -> tuple[np.ndarray | None, np.ndarray]:
        """Dense: the values of global keys [start, stop) (keys None: implied). Sparse:
        materialised rows [start, stop) and their keys."""
        self._check_slot(slot)
        with self.lock:
            if self.spec.kind == "dense":
                self.check_range(start, stop, "pull")
                lo = self.spec.offset
                return None, self.store.slot(slot or "w")[start - lo : stop - lo].copy()
            keys = self.store.all_keys()[start:stop]
            return keys, np.array(self.store.gather(keys, slot or "w"))

    def _check_slot(self, slot: str) -> None:
        known = ("w", *(self.optimizer.slots if self.optimizer else ()))
        if slot and slot not in known:
            raise RequestError(
                "INVALID_ARGUMENT", f"{self.where} has no slot {slot!r} (slots: {known})"
            )

    def push(self, keys: np.ndarray, values: np.ndarray, op: int) -> int:
        with self.lock, self.growing(keys, "push to"):
            return self._apply(keys, values, op)

    def push_range(self, start: int, values: np.ndarray, op: int, what: str) -> int:
        """A dense push of the rows of global keys [start, start + rows): slices, no keys."""
        n = values.shape[0] if values.ndim else 0
        self.check_range(start, start + n, what)
        values = self.check_values(values, n, what)
        finite = self._finite_rows(values, what)
        if finite is not None or op == pb.STEP:  # rows dropped, or the optimizer's rows
            keys = np.arange(start, start + n, dtype=np.int64)
            if finite is not None:
                keys, values = keys[finite], values[finite]
            return self.push(keys, values, op)
        lo = start - self.spec.offset
        with self.lock:
            w = self.store.slot("w")
            if op == pb.ADD:
                w[lo : lo + n] += values
            elif op == pb.SET:
                w[lo : lo + n] = values
            else:
                raise RequestError("INVALID_ARGUMENT", f"unknown push op {op}")
        return n

    def _apply(self, keys: np.ndarray, values: np.ndarray, op: int) -> int:
        """Apply a checked update (the caller holds `lock` and has passed the budgets)."""
        if op == pb.ADD:
            self.store.add(keys, values)
        elif op == pb.SET:
            self.store.assign(keys, values)
        elif op == pb.STEP:
            if self.optimizer is None:
                raise RequestError(
                    "FAILED_PRECONDITION", f"{self.where} has no optimizer; push ADD or SET"
                )
            from ps_server.keys import combine_by_shard, is_strictly_increasing

            if not is_strictly_increasing(keys):
                keys, values, _ = combine_by_shard(keys, values, 1)
            rows = self.store.locate(keys, create=True)
            self.optimizer.step(self.store, rows, values)
        else:
            raise RequestError("INVALID_ARGUMENT", f"unknown push op {op}")
        return int(keys.size)

    def contribute(
        self, round_: int, part: int, chunk: int, keys: np.ndarray, values: np.ndarray
    ) -> int:
        """Store an exactly-once contribution (it counts against the budgets until reduced)."""
        with self.lock:
            if self.spec.budget_bytes or (self.memory is not None and self.memory.budget):
                self._check_budget(keys.nbytes + values.nbytes, self.nbytes, "contributing to")
            self.contributions.put(round_, part, chunk, keys, values)
        return int(keys.size)

    def reduce(self, round_: int, op: int, zero_first: bool, how: str = "sum") -> int:
        """Apply the combined contributions of `round_` (in part order) and forget them.

        `how` = "sum" adds them up, "max" takes the element-wise maximum. Dense tensors
        accumulate straight into a buffer the size of their slice (no sort). Atomic: the
        lock is held from reading the contributions to forgetting them, so no pull sees
        the model zeroed by `zero_first`, no contribution arrives unseen in between, and
        a refusal (checked before anything changes) leaves model and round as they were.
        """
        if how not in ("", "sum", "max"):
            raise RequestError("INVALID_ARGUMENT", f"reduce: how={how!r} (sum|max)")
        if op not in (pb.ADD, pb.SET, pb.STEP):
            raise RequestError("INVALID_ARGUMENT", f"reduce: unknown push op {op}")
        if op == pb.STEP and self.optimizer is None:
            raise RequestError("FAILED_PRECONDITION", f"{self.where} has no optimizer")
        with self.lock:
            parts = self.contributions.parts(round_)
            entries = self.contributions.entries(round_)
            if zero_first and op == pb.ADD and how != "max" and self._sum_in_place(entries):
                self.contributions.drop_before(round_ + 1)
                return len(parts)
            if self.spec.kind == "dense":
                keys, values = self._combine_dense(entries, how)
            elif how == "max":
                keys, values = _combine_max(entries, self.spec.cols)
            else:
                keys, values = self.contributions.reduce(round_)
            with self.growing(keys, "reduce into"):
                if zero_first:
                    self.store.fill(0.0)
                if keys.size:
                    self._apply(keys, values.astype(self.store.dtype, copy=False), op)
            self.contributions.drop_before(round_ + 1)
        return len(parts)

    def _sum_in_place(self, entries) -> bool:
        """A dense slice's zero-first sum, straight into the weights: zeroed, then each
        contribution added in (part, chunk) order, which gives the bits that combining them
        first and adding the sums to zeros gives, without the buffer, its gather and the
        second scatter. False (nothing done) where that path does not apply."""
        w = self.store.slot("w") if self.spec.kind == "dense" else None
        if w is None or w.dtype.name not in ("float64", "float32") or not keys_jit.available():
            return False
        rows = [(k - self.spec.offset, np.ascontiguousarray(v, dtype=w.dtype)) for k, v in entries]
        cols = w.shape[1]
        w.fill(0.0)
        for r, v in rows:
            keys_jit.scatter_add(w, r, v.reshape(-1, cols))
        return True

    def _combine_dense(self, entries, how: str) -> tuple[np.ndarray, np.ndarray]:
        n, off = self.spec.length, self.spec.offset
        dtype = self.store.dtype
        init = (np.iinfo(dtype).min if dtype.kind == "i" else -np.inf) if how == "max" else 0
        buf = np.full((n, self.spec.cols), init, dtype=dtype)
        touched = np.zeros(n, dtype=bool)
        for keys, values in entries:
            rows = keys - off
            touched[rows] = True
            if how == "max":
                np.maximum.at(buf, rows, values)
            elif rows.size < 2 or np.all(rows[1:] > rows[:-1]):
                buf[rows] += values
            elif keys_jit.available() and dtype.name in ("float64", "float32", "int64"):
                v = np.ascontiguousarray(values.reshape(-1, buf.shape[1]), dtype=dtype)
                keys_jit.scatter_add(buf, rows, v)  # np.add.at's order, compiled
            else:
                np.add.at(buf, rows, values)
        rows = np.flatnonzero(touched)
        return rows + off, buf[rows]

    def dense_values(self) -> np.ndarray:
        """The weights as a flat, writable view (dense tensors only)."""
        if self.spec.kind != "dense":
            raise RequestError(
                "FAILED_PRECONDITION", f"vector ops need dense tensors; {self.where} is sparse"
            )
        return self.store.slot("w")[: self.spec.length].reshape(-1)

    def info(self) -> pb.ModelInfo:
        return pb.ModelInfo(spec=self.spec, num_rows=self.store.num_rows, nbytes=self.store.nbytes)


def _combine_max(entries, cols: int) -> tuple[np.ndarray, np.ndarray]:
    if not entries:
        return np.zeros(0, np.int64), np.zeros((0, cols))
    keys = np.concatenate([k for k, _ in entries])
    values = np.concatenate([v.reshape(-1, cols) for _, v in entries])
    uniq, inv = np.unique(keys, return_inverse=True)
    out = np.full((uniq.size, cols), -np.inf)
    np.maximum.at(out, inv.reshape(-1), values)
    return uniq, out


def _make_optimizer(spec: pb.ModelSpec, store: Store, attach: bool = True) -> Optimizer | None:
    if not spec.optimizer:
        return None
    try:
        opt = make_optimizer(spec.optimizer, dict(spec.opt_params))
    except ValueError as e:
        raise RequestError("INVALID_ARGUMENT", f"model {spec.name!r}: {e}") from None
    if attach:
        opt.attach(store)
    return opt


def spec_from_state(raw: bytes) -> pb.ModelSpec:
    spec = pb.ModelSpec()
    spec.ParseFromString(raw)
    return spec
