"""Key routing and aggregation helpers: hashing, range bounds, grouping, combining.

Every function here is whole-array numpy: routing, dedup and combine run on every
pull and push, so a per-key Python loop would dominate the cost of a mini-batch.
Keys are int64 (possibly far beyond 2**31); values are 1-D ``[n]`` or 2-D ``[n, cols]``.
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "mix64",
    "hash_shard",
    "range_bounds",
    "range_shard",
    "group_by",
    "combine",
    "dedup",
    "validate_keys",
    "is_strictly_increasing",
    "combine_by_shard",
    "dedup_by_shard",
    "group_by_shard",
]

_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_S30 = np.uint64(30)
_S27 = np.uint64(27)
_S31 = np.uint64(31)


def _as_int64(keys: np.ndarray) -> np.ndarray:
    """Keys as an int64 array, copying only when the dtype differs."""
    return np.asarray(keys, dtype=np.int64)


def mix64(keys: np.ndarray) -> np.ndarray:
    """Splitmix64 finalizer of int64 keys (viewed as uint64), vectorized.

    A bijection on 64-bit words that spreads consecutive ids over all bits, so
    ``mix64(k) % n`` balances shards and ``mix64(k) & mask`` balances hash slots.

    Parameters
    ----------
    keys : np.ndarray
        Integer keys of any shape; non-int64 input is converted to int64 first.

    Returns
    -------
    np.ndarray
        uint64 array of the same shape.
    """
    z = _as_int64(keys).astype(np.uint64)  # a fresh array: the steps below work in place
    z ^= z >> _S30
    z *= _M1  # uint64 arithmetic wraps modulo 2**64, as intended
    z ^= z >> _S27
    z *= _M2
    z ^= z >> _S31
    return z


def hash_shard(keys: np.ndarray, num_shards: int) -> np.ndarray:
    """Shard id of each key under hash partitioning: ``mix64(key) % num_shards`` (int64)."""
    if num_shards < 1:
        raise ValueError(f"hash_shard: num_shards must be >= 1, got {num_shards}")
    return (mix64(keys) % np.uint64(num_shards)).astype(np.int64)


def range_bounds(dim: int, num_shards: int) -> np.ndarray:
    """Contiguous near-equal ranges ``[bounds[s], bounds[s+1])`` covering ``[0, dim)``.

    The first ``dim % num_shards`` shards get one extra key. The bounds depend only
    on (dim, num_shards), so every dense tensor of one dimension is split the same
    way and element-wise ops between them stay shard-local (co-location).

    Returns
    -------
    np.ndarray
        int64 ``[num_shards + 1]`` with ``bounds[0] == 0`` and ``bounds[-1] == dim``.
    """
    if num_shards < 1:
        raise ValueError(f"range_bounds: num_shards must be >= 1, got {num_shards}")
    if dim < 0:
        raise ValueError(f"range_bounds: dim must be >= 0, got {dim}")
    base, extra = divmod(int(dim), int(num_shards))
    sizes = np.full(num_shards, base, dtype=np.int64)
    sizes[:extra] += 1
    bounds = np.zeros(num_shards + 1, dtype=np.int64)
    np.cumsum(sizes, out=bounds[1:])
    return bounds


def range_shard(keys: np.ndarray, bounds: np.ndarray) -> np.ndarray:
    """Shard id of each key under range partitioning by ``bounds`` (int64).

    Empty ranges (``dim < num_shards``) are skipped: a key goes to the last shard
    whose lower bound is <= key. Keys must lie in ``[0, bounds[-1])``.
    """
    return np.searchsorted(bounds, _as_int64(keys), side="right").astype(np.int64) - 1


def group_by(shard_ids: np.ndarray, num_groups: int) -> tuple[np.ndarray, np.ndarray]:
    """Positions of each group, via one stable argsort.

    Returns
    -------
    order, offsets : np.ndarray, np.ndarray
        int64 arrays; ``order[offsets[s]:offsets[s + 1]]`` are the positions whose id
        is ``s``, in their original relative order (so sorted keys stay sorted).
    """
    ids = _as_int64(shard_ids)
    if ids.size and (ids.min() < 0 or ids.max() >= num_groups):
        bad = ids[(ids < 0) | (ids >= num_groups)][0]
        raise ValueError(f"group_by: group id {bad} is outside [0, {num_groups})")
    order = np.argsort(ids, kind="stable").astype(np.int64)
    offsets = np.zeros(num_groups + 1, dtype=np.int64)
    np.cumsum(np.bincount(ids, minlength=num_groups), out=offsets[1:])
    return order, offsets


def combine(keys: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Unique sorted keys with the values of equal keys summed.

    Equal keys are summed in their input order (stable sort + ``np.add.reduceat``), so
    the same input gives a bit-identical result.

    Parameters
    ----------
    keys : np.ndarray
        int64 ``[n]``.
    values : np.ndarray
        ``[n]`` or ``[n, cols]``; the result keeps its dtype.

    Returns
    -------
    keys, values : np.ndarray, np.ndarray
        int64 ``[m]`` sorted unique keys and ``[m]`` or ``[m, cols]`` sums.
    """
    k = _as_int64(keys)
    v = np.asarray(values)
    if k.ndim != 1 or v.ndim not in (1, 2) or v.shape[0] != k.shape[0]:
        raise ValueError(
            f"combine: keys must be [n] and values [n] or [n, cols]; "
            f"got keys {k.shape} and values {v.shape}"
        )
    if k.size == 0:
        return k.copy(), v.copy()
    if is_strictly_increasing(k):  # already unique and sorted (the common gradient push)
        return k, v
    order = np.argsort(k, kind="stable")
    sk = k[order]
    starts = np.flatnonzero(np.concatenate(([True], sk[1:] != sk[:-1])))
    if starts.size == k.size:  # no duplicates: a permutation is enough
        return sk, np.take(v, order, axis=0)
    return sk[starts], np.add.reduceat(np.take(v, order, axis=0), starts, axis=0)


def _shard_ids(keys: np.ndarray, num_shards: int, bounds: np.ndarray | None) -> np.ndarray:
    return hash_shard(keys, num_shards) if bounds is None else range_shard(keys, bounds)


def _use_jit(*arrays: np.ndarray) -> bool:
    from ps_server import keys_jit

    return keys_jit.available() and all(a.dtype.name in _JIT_DTYPES for a in arrays)


#: value dtypes the compiled passes take as they are (others are summed by numpy)
_JIT_DTYPES = ("int64", "float64", "float32")


def combine_by_shard(
    keys: np.ndarray, values: np.ndarray, num_shards: int, bounds: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Unique keys with equal keys' values summed, grouped by shard.

    `bounds`: range partitioning by these bounds (dense tensors); None: hash partitioning.
    Equal keys are summed in input order, like ``np.add.at``. Unique keys come out in
    order of first occurrence within their shard (compiled pass, :mod:`ps_server.keys_jit`)
    or sorted (the numpy fallback).

    Returns
    -------
    keys, values, offsets : np.ndarray, np.ndarray, np.ndarray
        ``keys[offsets[s]:offsets[s + 1]]`` (and those rows of ``values [m, cols]``) go to
        shard s.
    """
    k = np.ascontiguousarray(keys, dtype=np.int64).reshape(-1)
    v = np.asarray(values)
    v = v.reshape(-1, 1) if v.ndim == 1 else v
    if v.ndim != 2 or v.shape[0] != k.size:
        raise ValueError(
            f"combine_by_shard: keys must be [n] and values [n] or [n, cols]; "
            f"got keys {k.shape} and values {np.shape(values)}"
        )
    if _use_jit(v):
        from ps_server import keys_jit

        return keys_jit.combine_grouped(k, v, num_shards, bounds)
    k, v = combine(k, v)
    order, offsets = group_by(_shard_ids(k, num_shards, bounds), num_shards)
    return k[order], np.take(v, order, axis=0), offsets


def dedup_by_shard(
    keys: np.ndarray, num_shards: int, bounds: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Unique keys grouped by shard (see :func:`combine_by_shard`) and the inverse map.

    Returns
    -------
    unique, offsets, inverse : np.ndarray, np.ndarray, np.ndarray | None
        ``unique[inverse]`` equals `keys`; `inverse` is None when that is the identity.
    """
    k = np.ascontiguousarray(keys, dtype=np.int64).reshape(-1)
    if _use_jit(k):
        from ps_server import keys_jit

        return keys_jit.dedup_grouped(k, num_shards, bounds)
    uniq, inverse = dedup(k)
    order, offsets = group_by(_shard_ids(uniq, num_shards, bounds), num_shards)
    place = np.empty(order.size, dtype=np.int64)
    place[order] = np.arange(order.size, dtype=np.int64)
    return uniq[order], offsets, place[inverse]


def group_by_shard(
    keys: np.ndarray, num_shards: int, bounds: np.ndarray | None = None
) -> tuple[np.ndarray | None, np.ndarray]:
    """Positions of `keys` grouped by shard, stable: ``(order, offsets)`` as in
    :func:`group_by`, with `order` None when the keys are already grouped (one shard,
    or sorted keys of a range-partitioned tensor): then nothing needs to move."""
    k = np.ascontiguousarray(keys, dtype=np.int64).reshape(-1)
    if num_shards == 1:
        return None, np.array([0, k.size], dtype=np.int64)
    if _use_jit(k):
        from ps_server import keys_jit

        return keys_jit.route_order(k, num_shards, bounds)
    order, offsets = group_by(_shard_ids(k, num_shards, bounds), num_shards)
    return (None if is_strictly_increasing(order) else order), offsets


def is_strictly_increasing(keys: np.ndarray) -> bool:
    """True when `keys` are sorted and unique: dedup/combine/routing have nothing to do."""
    return bool(keys.size < 2 or np.all(keys[1:] > keys[:-1]))


def dedup(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Unique sorted keys and the inverse map: ``pulled[inverse]`` restores input order."""
    k = _as_int64(keys).reshape(-1)
    order = np.argsort(k, kind="stable")
    sk = k[order]
    head = np.empty(k.size, dtype=bool)
    head[:1] = True
    np.not_equal(sk[1:], sk[:-1], out=head[1:])
    inverse = np.empty(k.size, dtype=np.int64)
    inverse[order] = np.cumsum(head) - 1
    return sk[head], inverse


def validate_keys(keys: np.ndarray, dim: int, where: str) -> None:
    """Reject keys outside ``[0, dim)`` or of a non-integer dtype.

    Raises
    ------
    TypeError
        If ``keys`` is not an integer array.
    ValueError
        Naming the first bad key, its position and ``where`` it came from.
    """
    arr = np.asarray(keys)
    if not np.issubdtype(arr.dtype, np.integer):
        raise TypeError(f"{where}: keys must be an integer array, got dtype {arr.dtype}")
    flat = arr.reshape(-1)
    if flat.size == 0:
        return
    if flat.min() >= 0 and flat.max() < dim:
        return
    bad = (flat < 0) | (flat >= dim)
    pos = int(np.argmax(bad))
    raise ValueError(f"{where}: key {flat[pos]} at position {pos} is outside [0, {dim})")
