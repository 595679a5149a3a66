"""Compiled key passes of the data plane: combine, dedup, route, and the shards' hash index.

Why compiled: a push or pull of n keys used to sort them (``argsort``: 0.1 s for 1M random
int64 keys) to sum duplicates and group them by shard, and the shard's hash index probed in
numpy rounds. A radix partition (by shard, then hash bits, into cache-sized buckets) and an
open-addressing hash per bucket (key -> first occurrence) do the same work in linear time,
and release the GIL, so the gRPC threads of a shard and the worker's other threads keep
running meanwhile.

Semantics, the same as the numpy reference in :mod:`ps_server.keys`: equal keys are summed in
their input order (sequentially, so the sum is bit-identical to ``np.add.at``); unique keys
come out grouped by shard, in an order fixed by the keys (hash bucket, then first
occurrence), not sorted.

Compile cost: numba compiles on first call per dtype (~1 s), and ``cache=True`` keeps the
machine code on disk, so a process pays a cache load once. The module imports numba on first
use. Without numba, or with ``SPARK_PS_NO_JIT=1``, :func:`available` is False and callers
use the numpy paths.
"""

from __future__ import annotations

import threading

import numpy as np

from ps_server.jit import jit_wanted

__all__ = [
    "available",
    "combine_grouped",
    "dedup_grouped",
    "route_order",
    "table_lookup",
    "table_insert",
    "scatter_add",
    "gather_rows",
]

_K: dict = {}
_LOCK = threading.Lock()


def available() -> bool:
    """Whether the compiled passes can be used (numba importable, not disabled)."""
    return _kernels() is not None


def _kernels():
    if "k" not in _K:
        with _LOCK:
            if "k" not in _K:
                _K["k"] = _compile()
    return _K["k"]


def _compile():
    if not jit_wanted():
        return None
    try:
        from ps_server import _keys_kernels
    except ImportError:
        return None
    return _keys_kernels


#: Keys per bucket of the radix partition (its hash table, 2x as many 16-byte slots, stays
#: within a core's L2 cache).
BUCKET_KEYS = 2048


def _bits(n: int, num_shards: int) -> int:
    """Hash bits that split each shard's keys into buckets of about BUCKET_KEYS."""
    bits, per = 0, n // max(num_shards, 1)
    while (per >> bits) > BUCKET_KEYS and bits < 16:
        bits += 1
    return bits


def _bounds(num_shards: int, bounds: np.ndarray | None) -> tuple[np.ndarray, bool]:
    if bounds is None:
        return np.zeros(num_shards + 1, dtype=np.int64), False
    return np.ascontiguousarray(bounds, dtype=np.int64), True


def combine_grouped(
    keys: np.ndarray, values: np.ndarray, num_shards: int, bounds: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Unique keys with equal keys' values summed, grouped by shard, in one hash pass.

    `bounds`: range partitioning (dense tensors) by these bounds; None: hash partitioning
    (``mix64(key) % num_shards``). `values` is ``[n, cols]`` (C-contiguous after this call).

    Returns
    -------
    keys, values, offsets : np.ndarray, np.ndarray, np.ndarray
        ``keys[offsets[s]:offsets[s + 1]]`` are shard s's keys (first-occurrence order).
    """
    k = _kernels()
    v = np.ascontiguousarray(values)
    b, dense = _bounds(num_shards, bounds)
    ukeys = np.empty(keys.size, dtype=np.int64)
    uvals = np.empty_like(v)
    offsets = np.zeros(num_shards + 1, dtype=np.int64)
    bits = _bits(keys.size, num_shards)
    m = k.combine_route(keys, v, num_shards, b, dense, bits, ukeys, uvals, offsets)
    return ukeys[:m], uvals[:m], offsets


def dedup_grouped(
    keys: np.ndarray, num_shards: int, bounds: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Unique keys grouped by shard and the inverse map (``unique[inverse] == keys``).

    Returns
    -------
    unique, offsets, inverse : np.ndarray, np.ndarray, np.ndarray | None
        `inverse` is None when it is the identity (unique keys, one shard).
    """
    k = _kernels()
    b, dense = _bounds(num_shards, bounds)
    ukeys = np.empty(keys.size, dtype=np.int64)
    inverse = np.empty(keys.size, dtype=np.int64)
    offsets = np.zeros(num_shards + 1, dtype=np.int64)
    bits = _bits(keys.size, num_shards)
    m, identity = k.dedup_route(keys, num_shards, b, dense, bits, ukeys, inverse, offsets)
    return ukeys[:m], offsets, None if identity else inverse


def route_order(
    keys: np.ndarray, num_shards: int, bounds: np.ndarray | None = None
) -> tuple[np.ndarray | None, np.ndarray]:
    """Positions of `keys` grouped by shard (stable), by one counting pass.

    Returns
    -------
    order, offsets : np.ndarray | None, np.ndarray
        ``order[offsets[s]:offsets[s + 1]]`` are shard s's positions; `order` is None when
        it is the identity (the keys are already grouped by shard).
    """
    k = _kernels()
    b, dense = _bounds(num_shards, bounds)
    order = np.empty(keys.size, dtype=np.int64)
    offsets = np.zeros(num_shards + 1, dtype=np.int64)
    identity = k.route(keys, num_shards, b, dense, order, offsets)
    return (None if identity else order), offsets


def table_lookup(table: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """Row of each key in a linear-probing table (``[cap, 2]``: key, row) on
    ``mix64(key) & mask``; -1 where absent."""
    out = np.empty(keys.size, dtype=np.int64)
    _kernels().lookup(table, keys, out)
    return out


def table_insert(
    table: np.ndarray,
    row_keys: np.ndarray,
    n: int,
    keys: np.ndarray,
    rows: np.ndarray,
    start: int,
) -> tuple[int, int]:
    """Find or insert keys[start:] (rows numbered n, n+1, ... by first occurrence) until
    the table would pass load 0.5; returns (next position, rows now held)."""
    return _kernels().insert(table, row_keys, n, keys, rows, start)


def scatter_add(arr: np.ndarray, rows: np.ndarray, values: np.ndarray) -> None:
    """``np.add.at(arr, rows, values)`` (duplicates summed in order), compiled."""
    _kernels().scatter_add(arr, rows, values)


def gather_rows(arr: np.ndarray, rows: np.ndarray, fill) -> np.ndarray:
    """``arr[rows]`` with rows of -1 reading as `fill`."""
    out = np.empty((rows.size, arr.shape[1]), dtype=arr.dtype)
    _kernels().gather(arr, rows, arr.dtype.type(fill), out)
    return out
