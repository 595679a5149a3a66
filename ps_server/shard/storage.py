"""Shard-side parameter storage: a vectorized hash index, dense and sparse row stores,
and an exactly-once contribution buffer.

A store holds named *slots* that are row-aligned 2-D arrays: slot ``"w"`` holds the
weights, optimizers add their state (``"m"``, ``"v"``, ``"z"``, ...) beside it, so one
``locate`` gives the row of a key in every slot. Everything is whole-array numpy: no
Python loop over keys or rows.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod

import numpy as np

from ps_server import keys_jit
from ps_server.keys import combine, mix64

__all__ = [
    "HashIndex",
    "Store",
    "DenseStore",
    "SparseStore",
    "Contributions",
    "store_from_state",
    "init_values",
    "INITIALIZERS",
]

INITIALIZERS = ("zeros", "normal", "uniform")
_EMPTY = np.int64(-1)
_CLAIM = np.int64(-(2**62))  # slot-claim codes are _CLAIM + input position
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def _int_keys(keys: np.ndarray, where: str) -> np.ndarray:
    """1-D int64 keys, all >= 0 (-1 is the empty-slot sentinel of HashIndex)."""
    k = np.asarray(keys)
    if not np.issubdtype(k.dtype, np.integer):
        raise TypeError(f"{where}: keys must be an integer array, got dtype {k.dtype}")
    k = k.astype(np.int64, copy=False).reshape(-1)
    if k.size and k.min() < 0:
        pos = int(np.argmax(k < 0))
        raise ValueError(f"{where}: key {k[pos]} at position {pos} is negative")
    return k


def _count_distinct(keys: np.ndarray) -> int:
    """Number of distinct keys, by sorting (numpy's hash-based unique is slower here)."""
    s = np.sort(keys)
    return int(s.size and 1 + np.count_nonzero(s[1:] != s[:-1]))


class HashIndex:
    """Open-addressing hash table int64 key -> int64 row id, vectorized.

    Rows are numbered 0, 1, 2, ... in order of first insertion. Slots use linear
    probing on ``mix64(key) & mask``; a probe round moves every unresolved key by one
    slot at once, and new keys racing for one empty slot are settled in the same round
    by ``np.minimum.at`` over their input positions (first occurrence wins; a
    hash-based ``np.unique`` was 10x slower here). Capacity is a power of two kept at
    load factor <= 0.5, which keeps probe chains (and rounds) short.
    """

    def __init__(self, capacity: int = 64) -> None:
        cap = 16
        while cap < capacity:
            cap *= 2
        # slot s: its key at [s, 0] (-1: empty) and its row at [s, 1], side by side so
        # that a probe touches one cache line
        self._table = np.full((cap, 2), _EMPTY, dtype=np.int64)
        self._keys = np.empty(cap // 2, dtype=np.int64)
        self._n = 0

    def __len__(self) -> int:
        return self._n

    @property
    def _slot_keys(self) -> np.ndarray:
        """Each slot's key (-1: empty), a view of the table."""
        return self._table[:, 0]

    @property
    def _slot_rows(self) -> np.ndarray:
        """Each slot's row id, a view of the table."""
        return self._table[:, 1]

    @property
    def capacity(self) -> int:
        """Number of hash slots (a power of two)."""
        return int(self._table.shape[0])

    @property
    def nbytes(self) -> int:
        return int(self._table.nbytes + self._keys.nbytes)

    def keys(self) -> np.ndarray:
        """All keys in row order (a copy)."""
        return self._keys[: self._n].copy()

    def _home(self, keys: np.ndarray) -> np.ndarray:
        h = mix64(keys)
        h &= np.uint64(self.capacity - 1)
        return h.view(np.int64)

    def lookup(self, keys: np.ndarray) -> np.ndarray:
        """Row id of each key, -1 where absent."""
        k = _int_keys(keys, "HashIndex.lookup")
        if keys_jit.available():
            return keys_jit.table_lookup(self._table, k)
        out = np.full(k.size, _EMPTY, dtype=np.int64)
        mask = self.capacity - 1
        active = np.arange(k.size, dtype=np.int64)
        pos = self._home(k)
        kk = k
        while active.size:
            found = self._slot_keys[pos]
            hit = found == kk
            out[active[hit]] = self._slot_rows[pos[hit]]
            go_on = ~hit & (found != _EMPTY)
            active, kk, pos = active[go_on], kk[go_on], (pos[go_on] + 1) & mask
        return out

    def _probe_insert(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Find or claim a slot for every key (the table must have room for them all).

        Keys that find an empty slot claim it with ``np.minimum.at`` on a code that
        orders by input position, so the first occurrence wins; the others stay on
        that slot for one more round, where an equal key resolves to it (duplicates)
        and a different one moves on (linear probing). Claimed slots get their key;
        their row ids are left to the caller.

        Returns
        -------
        slots, created : np.ndarray, np.ndarray
            The slot of each key, and a bool mask of the positions that claimed one
            (exactly the first occurrence of each key not already in the table).
        """
        mask = self.capacity - 1
        slots = np.empty(keys.size, dtype=np.int64)
        created = np.zeros(keys.size, dtype=bool)
        active = np.arange(keys.size, dtype=np.int64)
        pos, kk = self._home(keys), keys
        while active.size:
            found = self._slot_keys[pos]
            done = found == kk
            empty = found == _EMPTY
            cand = np.flatnonzero(empty)
            if cand.size:
                cpos = pos[cand]
                code = active[cand] + _CLAIM  # far below the -1 of an empty slot
                np.minimum.at(self._slot_rows, cpos, code)
                won = cand[self._slot_rows[cpos] == code]
                self._slot_keys[pos[won]] = kk[won]
                created[active[won]] = True
                done[won] = True
            slots[active[done]] = pos[done]
            step = np.where(empty, 0, 1)  # claim losers re-check the slot they lost
            left = ~done
            active, kk, pos = active[left], kk[left], (pos[left] + step[left]) & mask
        return slots, created

    def _grow_to(self, n: int) -> None:
        """Ensure room for ``n`` keys at load <= 0.5, rehashing all keys at once."""
        if 2 * n <= self.capacity:  # self._keys always holds capacity // 2 rows
            return
        cap = self.capacity
        while 2 * n > cap:
            cap *= 2
        old = self._keys[: self._n]
        self._table = np.full((cap, 2), _EMPTY, dtype=np.int64)
        self._keys = np.empty(cap // 2, dtype=np.int64)
        self._keys[: self._n] = old
        if keys_jit.available():  # distinct keys, inserted in row order: row i stays row i
            rows = np.empty(self._n, dtype=np.int64)
            keys_jit.table_insert(self._table, self._keys, 0, old, rows, 0)
            return
        slots, _ = self._probe_insert(old)
        self._slot_rows[slots] = np.arange(self._n, dtype=np.int64)

    def get_or_insert(self, keys: np.ndarray) -> tuple[np.ndarray, int]:
        """Row ids of all keys, inserting the absent ones.

        New rows are numbered in order of first occurrence in ``keys`` and duplicates
        share a row, so the same calls give the same numbering.

        Returns
        -------
        rows, created : np.ndarray, int
            int64 row id per key and the number of rows created.
        """
        k = _int_keys(keys, "HashIndex.get_or_insert")
        if keys_jit.available():
            return self._get_or_insert_jit(np.ascontiguousarray(k))
        rows = self.lookup(k)
        missing = np.flatnonzero(rows == _EMPTY)
        if missing.size == 0:
            return rows, 0
        mk = k[missing]
        if 2 * (self._n + mk.size) > self.capacity:  # count exactly only when it matters
            self._grow_to(self._n + _count_distinct(mk))
        slots, created = self._probe_insert(mk)
        first = np.flatnonzero(created)  # ascending: order of first occurrence
        new_rows = self._n + np.arange(first.size, dtype=np.int64)
        self._slot_rows[slots[first]] = new_rows
        self._keys[new_rows] = mk[first]
        self._n += int(first.size)
        rows[missing] = self._slot_rows[slots]
        return rows, int(first.size)

    def _get_or_insert_jit(self, k: np.ndarray) -> tuple[np.ndarray, int]:
        """`get_or_insert` in one compiled pass; the table doubles whenever the next new key
        would put it above load 0.5, which ends at the capacity `_grow_to` would choose."""
        rows = np.empty(k.size, dtype=np.int64)
        before, at = self._n, 0
        while True:
            at, self._n = keys_jit.table_insert(self._table, self._keys, self._n, k, rows, at)
            if at == k.size:
                return rows, self._n - before
            self._grow_to(self._n + 1)

    @classmethod
    def from_keys(cls, keys: np.ndarray) -> HashIndex:
        """Index whose row ``i`` is ``keys[i]`` (keys must be distinct)."""
        k = _int_keys(keys, "HashIndex.from_keys")
        index = cls(2 * max(k.size, 8))
        rows, created = index.get_or_insert(k)
        if created != k.size:
            raise ValueError(f"HashIndex.from_keys: {k.size - created} duplicate keys")
        return index


def _as_values(values: np.ndarray, n: int, cols: int, where: str) -> np.ndarray:
    """Values as ``[n, cols]``; a 1-D ``[n]`` array is accepted when ``cols == 1``."""
    v = np.asarray(values)
    if v.ndim == 1 and cols == 1 and v.shape[0] == n:
        return v.reshape(n, 1)
    if v.shape != (n, cols):
        raise ValueError(f"{where}: values must have shape ({n}, {cols}), got {v.shape}")
    return v


def _last_occurrence(rows: np.ndarray) -> np.ndarray:
    """Positions of the last occurrence of each distinct row (for last-wins assign)."""
    order = np.argsort(rows[::-1], kind="stable")
    sr = rows[::-1][order]
    first = np.concatenate(([True], sr[1:] != sr[:-1])) if sr.size else sr.astype(bool)
    return rows.size - 1 - order[first]


def _jit_rows(arr: np.ndarray) -> bool:
    """Whether the compiled row passes serve this slot array (C-contiguous, a JIT dtype)."""
    return arr.flags.c_contiguous and arr.dtype.name in _JIT_DTYPES and keys_jit.available()


_JIT_DTYPES = ("float64", "float32", "int64")


class Store(ABC):
    """Row-aligned named slots of shape ``[rows, cols]`` addressed by int64 keys.

    Slot ``"w"`` holds the weights; ``add_slot`` adds optimizer state. A slot array
    may be replaced when a sparse store grows, so fetch ``slot()`` after ``locate()``.
    """

    def __init__(self, cols: int, dtype: np.dtype | str) -> None:
        if cols < 1:
            raise ValueError(f"{type(self).__name__}: cols must be >= 1, got {cols}")
        self.cols = int(cols)
        self.dtype = np.dtype(dtype)
        if self.dtype.kind != "f" and self.dtype != np.int64:
            raise TypeError(
                f"{type(self).__name__}: dtype must be floating or int64, got {self.dtype}"
            )
        self._slots: dict[str, np.ndarray] = {}
        self._fills: dict[str, float] = {}

    # -- what a concrete store provides -------------------------------------------
    @property
    @abstractmethod
    def num_rows(self) -> int:
        """Rows materialised (all rows for a dense store)."""

    @property
    @abstractmethod
    def _capacity(self) -> int:
        """Rows allocated in every slot array."""

    @abstractmethod
    def locate(self, keys: np.ndarray, create: bool = False) -> np.ndarray:
        """Row id of each key; -1 where absent and not created."""

    @abstractmethod
    def all_keys(self) -> np.ndarray:
        """Keys of all materialised rows, in row order."""

    def growth(self, keys: np.ndarray) -> int:
        """Bytes that ``locate(keys, create=True)`` would allocate (a fixed store: none)."""
        return 0

    @abstractmethod
    def _meta(self) -> dict:
        """Constructor arguments for ``state()``."""

    # -- slots ----------------------------------------------------------------------
    @property
    def slot_names(self) -> tuple[str, ...]:
        return tuple(self._slots)

    @property
    def nbytes(self) -> int:
        return int(sum(a.nbytes for a in self._slots.values()))

    def slot(self, name: str) -> np.ndarray:
        """The 2-D array of a slot (``[capacity, slot_cols]``), row-aligned with ``"w"``."""
        try:
            return self._slots[name]
        except KeyError:
            raise KeyError(f"no slot {name!r}; slots are {sorted(self._slots)}") from None

    def add_slot(
        self, name: str, fill: float = 0.0, dtype: np.dtype | str | None = None, cols: int = 0
    ) -> np.ndarray:
        """Create a state slot filled with ``fill`` (idempotent: an existing one is kept).

        ``dtype`` defaults to the store dtype; ``cols`` (default: the store's cols)
        lets per-row state such as Adam's step count take one column.
        """
        if name in self._slots:
            return self._slots[name]
        width = self.cols if cols <= 0 else int(cols)
        arr = np.full((self._capacity, width), fill, dtype=np.dtype(dtype or self.dtype))
        self._slots[name] = arr
        self._fills[name] = float(fill)
        return arr

    # -- reads and writes ---------------------------------------------------------
    def gather(self, keys: np.ndarray, slot: str = "w", create: bool = False) -> np.ndarray:
        """Values ``[n, slot_cols]`` of a slot; absent keys read as the slot's fill (0 for w)."""
        rows = self.locate(keys, create)
        arr = self.slot(slot)
        if _jit_rows(arr):
            return keys_jit.gather_rows(arr, rows, self._fills[slot])
        present = rows >= 0
        if present.all():
            return arr[rows]
        out = np.full((rows.size, arr.shape[1]), self._fills[slot], dtype=arr.dtype)
        out[present] = arr[rows[present]]
        return out

    def add(self, keys: np.ndarray, values: np.ndarray, slot: str = "w") -> None:
        """Add values into a slot, creating absent rows; duplicate keys are summed."""
        rows = self.locate(keys, create=True)
        arr = self.slot(slot)
        v = _as_values(values, rows.size, arr.shape[1], f"{type(self).__name__}.add")
        v = v.astype(arr.dtype, copy=False)
        if _jit_rows(arr):
            keys_jit.scatter_add(arr, rows, np.ascontiguousarray(v))
            return
        if rows.size < 2 or np.all(rows[1:] > rows[:-1]):  # sorted unique: plain fancy add
            arr[rows] += v
        else:
            np.add.at(arr, rows, v)

    def assign(self, keys: np.ndarray, values: np.ndarray, slot: str = "w") -> None:
        """Overwrite a slot's rows, creating absent ones; of duplicate keys the last wins."""
        rows = self.locate(keys, create=True)
        arr = self.slot(slot)
        v = _as_values(values, rows.size, arr.shape[1], f"{type(self).__name__}.assign")
        if rows.size < 2 or np.all(rows[1:] > rows[:-1]):  # sorted unique: no duplicates
            arr[rows] = v
            return
        last = _last_occurrence(rows)
        arr[rows[last]] = v[last]

    def fill(self, value: float, slot: str = "w") -> None:
        """Set every materialised row of a slot to ``value``."""
        self.slot(slot)[: self.num_rows] = value

    def all_values(self, slot: str = "w") -> np.ndarray:
        """Values of all materialised rows, aligned with ``all_keys()`` (a copy)."""
        return self.slot(slot)[: self.num_rows].copy()

    # -- snapshot -----------------------------------------------------------------
    def state(self) -> dict[str, np.ndarray]:
        """Complete snapshot: ``meta`` (a JSON string in a 0-d array) and ``slot:<name>``.

        Every entry is a plain numpy array, so ``np.savez``/``np.load`` round-trip it
        exactly (no pickle).
        """
        meta = dict(self._meta())
        meta["kind"] = type(self).__name__
        meta["cols"] = self.cols
        meta["dtype"] = self.dtype.str
        meta["fills"] = self._fills
        out = {"meta": np.array(json.dumps(meta, sort_keys=True))}
        for name, arr in self._slots.items():
            out[f"slot:{name}"] = arr[: self.num_rows].copy()
        return out

    @classmethod
    def from_state(cls, state: dict[str, np.ndarray]) -> Store:
        """Rebuild a store (of the kind recorded in ``state``) from ``state()`` output.

        Called on a concrete class, the recorded kind must be that class.
        """
        store = store_from_state(state)
        if not isinstance(store, cls):
            raise ValueError(f"state holds a {type(store).__name__}, not a {cls.__name__}")
        return store

    def _restore_slots(self, state: dict[str, np.ndarray], fills: dict[str, float]) -> None:
        for key in state:
            if not key.startswith("slot:"):
                continue
            name = key[len("slot:") :]
            data = np.asarray(state[key])
            arr = self.add_slot(name, fills.get(name, 0.0), data.dtype, data.shape[1])
            if arr.dtype != data.dtype or arr.shape[1] != data.shape[1]:  # "w" pre-exists
                raise ValueError(f"state: slot {name!r} has {data.dtype} {data.shape}")
            arr[: data.shape[0]] = data


class DenseStore(Store):
    """Rows ``[0, length)`` for the global keys ``[offset, offset + length)``.

    Used for range-partitioned dense tensors: a key's row is ``key - offset``.
    """

    def __init__(self, length: int, cols: int, offset: int, dtype: np.dtype | str) -> None:
        super().__init__(cols, dtype)
        if length < 0 or offset < 0:
            raise ValueError(f"DenseStore: length {length} and offset {offset} must be >= 0")
        self.length = int(length)
        self.offset = int(offset)
        self._slots["w"] = np.zeros((self.length, self.cols), dtype=self.dtype)
        self._fills["w"] = 0.0

    @property
    def num_rows(self) -> int:
        return self.length

    @property
    def _capacity(self) -> int:
        return self.length

    def locate(self, keys: np.ndarray, create: bool = False) -> np.ndarray:
        """``key - offset``; raises ValueError for a key outside this store's range."""
        k = np.asarray(keys)
        if not np.issubdtype(k.dtype, np.integer):
            raise TypeError(f"DenseStore.locate: keys must be integers, got dtype {k.dtype}")
        rows = k.astype(np.int64).reshape(-1) - self.offset
        if rows.size and (rows.min() < 0 or rows.max() >= self.length):
            pos = int(np.argmax((rows < 0) | (rows >= self.length)))
            raise ValueError(
                f"DenseStore.locate: key {k.reshape(-1)[pos]} at position {pos} is outside "
                f"[{self.offset}, {self.offset + self.length})"
            )
        return rows

    def all_keys(self) -> np.ndarray:
        return self.offset + np.arange(self.length, dtype=np.int64)

    def _meta(self) -> dict:
        return {"length": self.length, "offset": self.offset}


def _uniform_pairs(base: np.ndarray, pairs: int) -> tuple[np.ndarray, np.ndarray]:
    """Two ``[n, pairs]`` arrays of uniforms in (0, 1) from splitmix64 streams seeded by ``base``.

    Each 64-bit hash yields two 32-bit uniforms (plenty for an initializer), which
    halves the hashing work.
    """
    stream = np.arange(1, pairs + 1, dtype=np.uint64) * _GOLDEN
    bits = mix64((base[:, None] + stream[None, :]).view(np.int64))
    hi = (bits >> np.uint64(32)).astype(np.float64)
    lo = (bits & np.uint64(0xFFFFFFFF)).astype(np.float64)
    return (hi + 0.5) * 2.0**-32, (lo + 0.5) * 2.0**-32


def init_values(
    keys: np.ndarray, cols: int, init: str, scale: float, seed: int, dtype: np.dtype
) -> np.ndarray:
    """Initial rows for ``keys``, a pure function of (seed, key, column).

    Independent of insertion order, shard and process, so replicas and restarts agree.
    ``uniform`` draws from ``(-scale, scale)``; ``normal`` has std ``scale`` (Box-Muller,
    both the cosine and the sine branch).
    """
    k = np.asarray(keys, dtype=np.int64)
    if init == "zeros" or k.size == 0:
        return np.zeros((k.size, cols), dtype=dtype)
    seed_mix = mix64(np.array([seed], dtype=np.int64) ^ np.int64(0x5EED))[0]
    base = mix64((k.view(np.uint64) ^ seed_mix).view(np.int64))
    u1, u2 = _uniform_pairs(base, (cols + 1) // 2)
    if init == "uniform":
        pair = (u1, u2)
    else:
        radius = np.sqrt(-2.0 * np.log(u1))
        angle = (2.0 * np.pi) * u2
        pair = (radius * np.cos(angle), radius * np.sin(angle))
    out = np.stack(pair, axis=2).reshape(k.size, -1)[:, :cols]
    if init == "uniform":
        out = 2.0 * out - 1.0
    return (scale * out).astype(dtype)


class SparseStore(Store):
    """Lazily created rows for arbitrary int64 keys, found through a HashIndex.

    Slot arrays double when full; new rows of ``"w"`` take ``init`` values derived
    from (seed, key) and other slots their fill value. Memory grows with the keys
    touched, not with the key space.
    """

    def __init__(
        self,
        cols: int,
        dtype: np.dtype | str,
        init: str = "zeros",
        init_scale: float = 0.0,
        seed: int = 0,
    ) -> None:
        super().__init__(cols, dtype)
        if init not in INITIALIZERS:
            raise ValueError(f"SparseStore: init must be one of {INITIALIZERS}, got {init!r}")
        if not np.isfinite(init_scale) or init_scale < 0:
            raise ValueError(f"SparseStore: init_scale must be finite and >= 0, got {init_scale}")
        self.init = init
        self.init_scale = float(init_scale)
        self.seed = int(seed)
        self._index = HashIndex()
        self._slots["w"] = np.zeros((16, self.cols), dtype=self.dtype)
        self._fills["w"] = 0.0

    @property
    def num_rows(self) -> int:
        return len(self._index)

    @property
    def _capacity(self) -> int:
        return int(self._slots["w"].shape[0])

    @property
    def nbytes(self) -> int:
        return super().nbytes + self._index.nbytes

    def _reserve(self, n: int) -> None:
        """Grow every slot (by doubling) to hold ``n`` rows, keeping rows aligned."""
        cap = self._capacity
        if n <= cap:
            return
        while cap < n:
            cap *= 2
        for name, old in self._slots.items():
            arr = np.full((cap, old.shape[1]), self._fills[name], dtype=old.dtype)
            arr[: old.shape[0]] = old
            self._slots[name] = arr

    def growth(self, keys: np.ndarray) -> int:
        """Bytes that ``locate(keys, create=True)`` would allocate, without inserting anything.

        Mirrors the doubling of the slot arrays and of the hash index exactly, so a memory
        budget can be checked before anything changes. Cheap when the worst case (every key
        new) still fits the current capacity: then nothing grows and no lookup is needed.
        """
        n, fresh = self.num_rows, int(np.asarray(keys).size)
        if not fresh or (n + fresh <= self._capacity and 2 * (n + fresh) <= self._index.capacity):
            return 0
        missing = np.asarray(keys).reshape(-1)[self._index.lookup(keys) < 0]
        fresh = _count_distinct(missing) if missing.size else 0
        cap, slots_cap = self._index.capacity, self._capacity
        while 2 * (n + fresh) > cap:
            cap *= 2
        while slots_cap < n + fresh:
            slots_cap *= 2
        row_bytes = sum(a.shape[1] * a.itemsize for a in self._slots.values())
        extra = cap - self._index.capacity  # slot keys + slot rows + row keys, all int64
        return int((slots_cap - self._capacity) * row_bytes + extra * 16 + extra // 2 * 8)

    def locate(self, keys: np.ndarray, create: bool = False) -> np.ndarray:
        """Row ids via the hash index; with ``create`` absent keys get new initialised rows."""
        if not create:
            return self._index.lookup(keys)
        before = len(self._index)
        rows, created = self._index.get_or_insert(keys)
        if created:
            after = before + created
            self._reserve(after)
            new_keys = self._index._keys[before:after]
            self._slots["w"][before:after] = init_values(
                new_keys, self.cols, self.init, self.init_scale, self.seed, self.dtype
            )
        return rows

    def all_keys(self) -> np.ndarray:
        return self._index.keys()

    def _meta(self) -> dict:
        return {"init": self.init, "init_scale": self.init_scale, "seed": self.seed}

    def state(self) -> dict[str, np.ndarray]:
        out = super().state()
        out["keys"] = self.all_keys()
        return out


def store_from_state(state: dict[str, np.ndarray]) -> Store:
    """Rebuild a DenseStore or SparseStore from its ``state()`` (e.g. an ``np.load`` result)."""
    meta = json.loads(str(np.asarray(state["meta"])[()]))
    kind = meta["kind"]
    if kind == "DenseStore":
        store: Store = DenseStore(meta["length"], meta["cols"], meta["offset"], meta["dtype"])
    elif kind == "SparseStore":
        store = SparseStore(
            meta["cols"], meta["dtype"], meta["init"], meta["init_scale"], meta["seed"]
        )
        keys = np.asarray(state["keys"], dtype=np.int64)
        store._index = HashIndex.from_keys(keys)
        store._reserve(max(keys.size, 1))
    else:
        raise ValueError(f"state: unknown store kind {kind!r}")
    store._restore_slots(state, meta["fills"])
    return store


def _kept(arr: np.ndarray, dtype: type | None) -> np.ndarray:
    """`arr` itself when read-only (and of `dtype`): no one can change it under us; else a
    copy."""
    if not arr.flags.writeable and (dtype is None or arr.dtype == dtype):
        return arr
    return np.array(arr, dtype=dtype)


class Contributions:
    """Exactly-once aggregation buffer: contributions keyed by (round, part, chunk).

    A replayed or speculative task re-puts the same (round, part, chunk) and replaces
    its earlier contribution instead of adding to it. Chunk 0 replaces every chunk of the
    part: a replay that splits into fewer chunks, or sends this shard no keys at all (then
    an empty chunk 0), leaves nothing of the earlier attempt behind. Clients send chunk 0
    before a part's other chunks. ``reduce`` concatenates in sorted
    (part, chunk) order before ``combine``, so the sum is bit-identical whatever the
    arrival order. Arrays are copied on ``put`` unless read-only (a request's own arrays,
    read from its immutable bytes: keeping them saves a copy per contribution).
    """

    def __init__(self) -> None:
        self._rounds: dict[int, dict[tuple[int, int], tuple[np.ndarray, np.ndarray]]] = {}

    def put(self, round: int, part: int, chunk: int, keys: np.ndarray, values: np.ndarray) -> None:
        """Store one contribution, replacing any earlier one with the same ids."""
        k = _kept(np.asarray(keys), np.int64).reshape(-1)
        v = _kept(np.asarray(values), None)
        if v.ndim not in (1, 2) or v.shape[0] != k.size:
            raise ValueError(
                f"Contributions.put(round={round}, part={part}, chunk={chunk}): values must "
                f"be [{k.size}] or [{k.size}, cols], got {v.shape}"
            )
        entries = self._rounds.setdefault(int(round), {})
        ident = (int(part), int(chunk))
        # all entries of a round share one row shape, so checking one other suffices
        other = next(((pc, e[1]) for pc, e in entries.items() if pc != ident), None)
        if other is not None and other[1].shape[1:] != v.shape[1:]:
            raise ValueError(
                f"Contributions.put(round={round}, part={part}, chunk={chunk}): values shape "
                f"{v.shape} does not match part {other[0][0]} chunk {other[0][1]} "
                f"shape {other[1].shape}"
            )
        if ident[1] == 0:  # a new attempt of this part: nothing of an earlier one stays
            for pc in [pc for pc in entries if pc[0] == ident[0]]:
                del entries[pc]
        entries[ident] = (k, v)

    def rounds(self) -> list[int]:
        """Rounds with at least one contribution, sorted."""
        return sorted(self._rounds)

    def parts(self, round: int) -> set[int]:
        """Parts that contributed to ``round``."""
        return {p for p, _ in self._rounds.get(int(round), {})}

    def reduce(self, round: int) -> tuple[np.ndarray, np.ndarray]:
        """``combine`` of all contributions of a round in (part, chunk) order.

        An empty round gives empty int64 keys and empty float64 values.
        """
        entries = self._rounds.get(int(round), {})
        if not entries:
            return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.float64)
        items = [entries[pc] for pc in sorted(entries)]
        keys = np.concatenate([k for k, _ in items])
        values = np.concatenate([v for _, v in items])
        return combine(keys, values)

    def entries(
        self, round: int, num_parts: int | None = None
    ) -> list[tuple[np.ndarray, np.ndarray]]:
        """The (keys, values) contributions of a round in (part, chunk) order; with
        ``num_parts``, only those of parts below it (a replay with fewer partitions)."""
        entries = self._rounds.get(int(round), {})
        return [entries[pc] for pc in sorted(entries) if num_parts is None or pc[0] < num_parts]

    def items(self, round: int) -> list[tuple[tuple[int, int], tuple[np.ndarray, np.ndarray]]]:
        """((part, chunk), (keys, values)) of a round in (part, chunk) order (for snapshots)."""
        entries = self._rounds.get(int(round), {})
        return [(pc, entries[pc]) for pc in sorted(entries)]

    def drop(self, round: int) -> None:
        """Forget one round (no error if absent)."""
        self._rounds.pop(int(round), None)

    def drop_before(self, round: int) -> None:
        """Forget every round < ``round``."""
        for r in [r for r in self._rounds if r < round]:
            del self._rounds[r]

    @property
    def nbytes(self) -> int:
        return int(sum(k.nbytes + v.nbytes for e in self._rounds.values() for k, v in e.values()))


def warm_up() -> None:
    """Load the compiled key passes (:mod:`ps_server.keys_jit`) a shard's stores call.

    Why: a process's first compiled call loads numba's registries, which import SciPy's
    BLAS, then each signature from the on-disk cache: 0.4-0.5 s (measured), paid by the
    first push or pull of the first fit. A shard runs this on a thread as it starts, while
    the fit's Spark job is still launching. Stores of both kinds and both value dtypes
    take a write and a read (the passes they run); the stores are then dropped.
    """
    keys = np.arange(3, dtype=np.int64)
    for dtype in ("float64", "int64"):
        for store in (SparseStore(2, dtype), DenseStore(4, 2, 0, dtype)):
            store.add(keys, np.ones((3, 2), dtype=dtype))
            store.gather(keys)
