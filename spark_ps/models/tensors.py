"""PSVector, PSMatrix, PSEmbedding: handles that travel into executor closures.

A handle holds only the tensor's spec and the PS address/token; the connection
is the per-process cached client, so pickling a handle into a Spark closure costs
a few hundred bytes and every Python worker reuses one channel set. Arrays follow
the contract written once in `spark_ps.client.client`.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import numpy as np

from spark_ps.client import PSClient, TensorSpec, get_client

__all__ = ["PSTensor", "PSVector", "PSMatrix", "PSEmbedding"]

MAX_KEY = 2**63 - 1


#: The active PS connection (``PSContext.active``) for handles made without ``context=``:
#: set by ``spark_ps.context`` (which sits above the models and imports them, never the
#: other way round) through `use_active_context`.
_active_context: Callable[[], Any] | None = None


def use_active_context(active: Callable[[], Any]) -> None:
    """Handles made without ``context=`` use what `active()` returns (a PSContext)."""
    global _active_context
    _active_context = active


def _context(context):
    if context is not None:
        return context
    if _active_context is None:
        raise RuntimeError("no active PSContext: call PSContext.getOrCreate(spark) first")
    return _active_context()


class PSTensor:
    """A named sharded tensor on the PS (base of the handle types).

    Every factory takes ``budget_bytes`` (memory budget of the model's slice on each
    shard, 0 = none: a push or pull that would grow a sparse slice past it is refused with
    RESOURCE_EXHAUSTED and changes nothing) and ``nan_policy`` ("refuse": a push holding
    NaN/inf is refused whole; "skip": those rows are dropped and the rest applied).
    """

    def __init__(self, spec: TensorSpec, address: str, token: str, tls_ca: bytes | None = None):
        self.spec, self.address, self.token, self.tls_ca = spec, address, token, tls_ca

    def __repr__(self) -> str:
        s = self.spec
        return f"{type(self).__name__}({s.name!r}, {s.kind}, dim={s.dim}, cols={s.cols})"

    def __getstate__(self):
        return {
            "spec": self.spec,
            "address": self.address,
            "token": self.token,
            "tls_ca": self.tls_ca,
        }

    def __setstate__(self, state):
        self.tls_ca = None
        self.__dict__.update(state)

    @classmethod
    def _create(
        cls,
        kind: str,
        dim: int,
        cols: int,
        *,
        name: str | None,
        dtype: str,
        optimizer: str | None,
        context,
        opt_params: dict,
        init: str = "zeros",
        init_scale: float = 0.0,
        seed: int = 0,
        create_on_pull: bool = False,
        budget_bytes: int = 0,
        nan_policy: str = "refuse",
        exist_ok: bool = False,
    ) -> PSTensor:
        ctx = _context(context)
        spec = TensorSpec(
            name=name or f"{cls.__name__.lower()}-{uuid.uuid4().hex[:12]}",
            kind=kind,
            dim=int(dim),
            cols=int(cols),
            num_shards=ctx.num_shards,
            dtype=dtype,
            init=init,
            init_scale=float(init_scale),
            seed=int(seed),
            optimizer=optimizer or "",
            opt_params=tuple(sorted((k, float(v)) for k, v in opt_params.items())),
            create_on_pull=create_on_pull,
            budget_bytes=int(budget_bytes),
            nan_policy=nan_policy,
        )
        ctx.client.create(spec, exist_ok=exist_ok)
        return cls(spec, ctx.address, ctx.token, getattr(ctx, "tls_ca", None))

    @property
    def client(self) -> PSClient:
        return get_client(self.address, self.token, self.tls_ca)

    @property
    def name(self) -> str:
        return self.spec.name

    # --- data plane (arrays: see spark_ps.client.client) ---
    def pull(self, keys: np.ndarray | None = None, slot: str = "", *, unique: bool = False):
        """Values at `keys`; with no keys, everything (dense: the full array; sparse:
        a (keys, values) pair of the touched rows). `unique=True`: the keys are known to be
        distinct, so no deduplication pass is made (see ``PSClient.pull``)."""
        if keys is None:
            k, v = self.client.pull_all(self.spec, slot)
            return v if self.spec.kind == "dense" else (k, v)
        return self.client.pull(self.spec, keys, slot, unique=unique)

    def push(self, keys: np.ndarray, grads: np.ndarray, *, unique: bool = False) -> None:
        """A gradient: the tensor's server-side optimizer steps (plain add without one).
        `unique=True`: the keys are known to be distinct, so no combining pass is made."""
        op = "step" if self.spec.optimizer else "add"
        self.client.push(self.spec, keys, grads, op, unique=unique)

    def increment(self, keys: np.ndarray, deltas: np.ndarray, *, unique: bool = False) -> None:
        """w[keys] += deltas (equal keys summed)."""
        self.client.push(self.spec, keys, deltas, "add", unique=unique)

    def update(self, keys: np.ndarray, values: np.ndarray) -> None:
        """w[keys] = values (keys must be unique)."""
        self.client.push(self.spec, keys, values, "set")

    def aggregate(
        self,
        keys: np.ndarray,
        values: np.ndarray,
        *,
        round: int,
        part: int,
        unique: bool = False,
    ) -> None:
        """This part's exactly-once contribution to `round` (a retry replaces it)."""
        self.client.push(self.spec, keys, values, "add", round=round, part=part, unique=unique)

    def reduce(self, round: int, op: str = "set", how: str = "sum") -> None:
        """Apply the combined contributions of `round` (set: the tensor becomes the sum,
        or with how="max" the element-wise max, at the keys any part touched)."""
        self.client.reduce(self.spec, round, op, how)

    def fill(self, value: float) -> None:
        self._vop("fill", value)

    def reset(self) -> None:
        self.fill(0.0)

    def drop(self) -> None:
        self.client.drop(self.spec)

    def _vop(self, op: str, alpha: float = 0.0, *others: PSTensor, **kw) -> float:
        return self.client.vector_op(op, [self.spec, *[o.spec for o in others]], alpha, **kw)


class _DenseAlgebra(PSTensor):
    """Server-side algebra over co-located dense tensors (same dim, same shards); only
    scalars come back. A dense matrix takes part as its flat row-major values, so vectors
    and ``[dim, cols]`` matrices of one shape combine alike."""

    def axpy(self, alpha: float, x: _DenseAlgebra) -> None:
        """self += alpha * x."""
        self.client.vector_op("axpy", [x.spec, self.spec], alpha)

    def scale(self, alpha: float) -> None:
        self._vop("scale", alpha)

    def copy_from(self, x: _DenseAlgebra) -> None:
        self._vop("copy", 0.0, x)

    def dot(self, x: _DenseAlgebra) -> float:
        return self._vop("dot", 0.0, x)

    def nrm2(self) -> float:
        return self._vop("nrm2")

    def sum(self) -> float:
        return self._vop("sum")

    def apply(self, kernel: str, *inputs: _DenseAlgebra, **scalars: float) -> float:
        """Run element-wise kernel `kernel` (ps_server.functions.vector) with self as output."""
        return self.client.vector_op(
            "kernel", [self.spec, *[i.spec for i in inputs]], kernel=kernel, **scalars
        )


class PSVector(_DenseAlgebra):
    """A vector: dense (range-partitioned, co-located by dim) or sparse (int64 keys)."""

    @classmethod
    def dense(
        cls,
        dim: int,
        *,
        name: str | None = None,
        dtype: str = "float64",
        optimizer: str | None = None,
        budget_bytes: int = 0,
        nan_policy: str = "refuse",
        context=None,
        **opt_params: float,
    ) -> PSVector:
        return cls._create(
            "dense",
            dim,
            1,
            name=name,
            dtype=dtype,
            optimizer=optimizer,
            context=context,
            opt_params=opt_params,
            budget_bytes=budget_bytes,
            nan_policy=nan_policy,
        )

    @classmethod
    def sparse(
        cls,
        dim: int = MAX_KEY,
        *,
        name: str | None = None,
        dtype: str = "float64",
        optimizer: str | None = None,
        budget_bytes: int = 0,
        nan_policy: str = "refuse",
        context=None,
        exist_ok: bool = False,
        **opt_params: float,
    ) -> PSVector:
        """A lazily grown int64-keyed vector; ``exist_ok`` attaches to an identical one."""
        return cls._create(
            "sparse",
            dim,
            1,
            name=name,
            dtype=dtype,
            optimizer=optimizer,
            context=context,
            opt_params=opt_params,
            budget_bytes=budget_bytes,
            nan_policy=nan_policy,
            exist_ok=exist_ok,
        )

    def like(self, name: str | None = None) -> PSVector:
        """A new zero vector co-located with this one (same dim, same shards)."""
        return PSVector.dense(self.spec.dim, name=name, dtype=self.spec.dtype, context=_Ctx(self))


class PSMatrix(_DenseAlgebra):
    """Rows of width `cols`: dense (rows range-partitioned) or sparse (lazy int64 rows)."""

    @classmethod
    def dense(
        cls,
        rows: int,
        cols: int,
        *,
        name: str | None = None,
        dtype: str = "float64",
        optimizer: str | None = None,
        budget_bytes: int = 0,
        nan_policy: str = "refuse",
        context=None,
        **opt_params: float,
    ) -> PSMatrix:
        return cls._create(
            "dense",
            rows,
            cols,
            name=name,
            dtype=dtype,
            optimizer=optimizer,
            context=context,
            opt_params=opt_params,
            budget_bytes=budget_bytes,
            nan_policy=nan_policy,
        )

    @classmethod
    def sparse(
        cls,
        cols: int,
        rows: int = MAX_KEY,
        *,
        name: str | None = None,
        dtype: str = "float64",
        optimizer: str | None = None,
        budget_bytes: int = 0,
        nan_policy: str = "refuse",
        context=None,
        exist_ok: bool = False,
        **opt_params: float,
    ) -> PSMatrix:
        """Lazily grown int64-keyed rows; ``exist_ok`` attaches to an identical matrix."""
        return cls._create(
            "sparse",
            rows,
            cols,
            name=name,
            dtype=dtype,
            optimizer=optimizer,
            context=context,
            opt_params=opt_params,
            budget_bytes=budget_bytes,
            nan_policy=nan_policy,
            exist_ok=exist_ok,
        )


class PSEmbedding(PSMatrix):
    """An embedding table: int64 ids -> rows of width `dim`, created (initialised) on first pull.

    Initial values depend only on (seed, id), so every shard, replica and restart agrees.
    """

    @classmethod
    def create(
        cls,
        dim: int,
        *,
        init: str = "normal",
        scale: float = 0.01,
        seed: int = 0,
        num_ids: int = MAX_KEY,
        name: str | None = None,
        dtype: str = "float32",
        optimizer: str | None = "adagrad",
        budget_bytes: int = 0,
        nan_policy: str = "refuse",
        context=None,
        **opt_params: float,
    ) -> PSEmbedding:
        if optimizer and "lr" not in opt_params:
            opt_params["lr"] = 0.05
        return cls._create(
            "sparse",
            num_ids,
            dim,
            name=name,
            dtype=dtype,
            optimizer=optimizer,
            init=init,
            init_scale=scale,
            seed=seed,
            create_on_pull=True,
            context=context,
            opt_params=opt_params,
            budget_bytes=budget_bytes,
            nan_policy=nan_policy,
        )


class _Ctx:
    """The connection facts of an existing handle, usable where a PSContext is expected."""

    def __init__(self, t: PSTensor):
        self.address, self.token, self.num_shards = t.address, t.token, t.spec.num_shards
        self.tls_ca = t.tls_ca
        self.client = t.client
