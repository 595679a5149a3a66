"""A CSR batch's per-key statistics in one compiled pass over its entries.

Why: the numpy path (``objective._batch_stats``) makes a dozen passes over the entries
(duplicate check, counts, sums, squares, extremes, each a ``bincount`` or ``ufunc.at``),
and ``label_sums`` one more product: on 500k hashed rows of 30 non-zeros (785k local
keys) 0.13-0.15 s for the statistics plus 0.09-0.15 s for the labels' sums (measured in
a fit's ``stats`` round). One pass reads each entry once and updates its key's record:
an entry of a row of 1.0s (hashed one-hot features) only counts and adds its row's label
and weight; the others update a second record with their sums and extremes.

A key's sums over the rows of 1.0s and over the other rows add up separately, then
together, so they may differ from the numpy path's in the last bits (which sums in entry
order, or by counting when one value fills most entries).

Compiled lazily (a worker that never fits LR pays no numba import); without numba (or
with ``SPARK_PS_NO_JIT=1``) :func:`key_sums` returns None and callers take the numpy path.
"""

from __future__ import annotations

import numpy as np

from ps_server.jit import compiled

__all__ = ["COLUMNS", "available", "key_sums", "warm_up"]

#: The statistics of a key, in :func:`key_sums`'s columns.
COLUMNS = ("count", "s1", "s2", "label_sum", "vmin", "vmax")

_KERNEL: list = []


def available() -> bool:
    """Whether the pass runs compiled (numba present, ``SPARK_PS_NO_JIT`` unset)."""
    if not _KERNEL:
        got = compiled(_key_sums)
        _KERNEL.append(None if got is None else got[0])
    return _KERNEL[0] is not None


def key_sums(indptr, indices, data, unit, weights, labels, k: int) -> np.ndarray | None:
    """float64 ``[k, 6]`` (:data:`COLUMNS`) over the rows of positive weight (`weights`
    None: all 1): per key the rows storing it, ``sum w*x``, ``sum w*x**2``, ``sum w*y*x``
    and the least and largest stored value (+-inf where none). `unit`: a bool per row,
    True where all its values are 1.0 (``row_blocks.unit_rows``), or None. None without
    numba, or when some row's keys are not strictly increasing (duplicates to merge first:
    the numpy path does). Callers have checked that every index is in ``[0, k)``."""
    if not available():
        return None
    kernel = _KERNEL[0]
    n = len(indptr) - 1
    hot = np.zeros((k, 3))  # count, weight of the rows of ones (with weights), label sum
    cold = np.zeros((k, 3))  # count, sum w*x, sum w*x**2 over the rows of other values
    lo, hi = np.full(k, np.inf), np.full(k, -np.inf)  # over the rows of other values
    w = np.ones(0) if weights is None else np.ascontiguousarray(weights, dtype=np.float64)
    y = np.ascontiguousarray(labels, dtype=np.float64)
    unit = np.zeros(n, dtype=bool) if unit is None else unit
    if kernel(indptr, indices, data, unit, w, weights is not None, y, hot, cold, lo, hi) >= 0:
        return None
    out = np.empty((k, len(COLUMNS)))
    out[:, 0], out[:, 3] = hot[:, 0], hot[:, 2]
    # a row of ones adds w to both sums (its count, without weights)
    ones = hot[:, 1] if weights is not None else hot[:, 0] - cold[:, 0]
    np.add(ones, cold[:, 1], out=out[:, 1])
    np.add(ones, cold[:, 2], out=out[:, 2])
    some = hot[:, 0] > cold[:, 0]  # some row of ones stores the key
    out[:, 4] = np.where(some, np.minimum(lo, 1.0), lo)
    out[:, 5] = np.where(some, np.maximum(hi, 1.0), hi)
    return out


def _key_sums(indptr, indices, data, unit, w, weighted, y, hot, cold, lo, hi):
    """Fill the outputs row by row; the first row whose keys do not increase, else -1
    (the outputs are then incomplete).

    Why rows of ones apart: an entry of such a row only counts, adds its row's label (and
    weight) and skips the extremes, in one small record per key, where updating six
    statistics an entry took 0.15 s on 500k hashed rows of 30 ones (457k keys; measured).
    The other rows' sums go to a second table, added in at the end."""
    for r in range(indptr.shape[0] - 1):
        wr = w[r] if weighted else 1.0
        if not wr > 0.0:  # zero-weight rows do not count (weights are checked >= 0)
            continue
        wy = wr * y[r]
        prev = np.int64(-1)
        ones = unit[r]
        for p in range(np.uint64(indptr[r]), np.uint64(indptr[r + 1])):
            j = np.int64(indices[p])
            if j <= prev:
                return r
            prev = j
            u = np.uint64(j)
            hot[u, 0] += 1.0
            if ones:  # v = 1.0
                if weighted:
                    hot[u, 1] += wr
                if wy != 0.0:
                    hot[u, 2] += wy
            else:
                v = data[p]
                wv = wr * v
                hot[u, 2] += v * wy
                cold[u, 0] += 1.0
                cold[u, 1] += wv
                cold[u, 2] += wv * v
                lo[u] = min(lo[u], v)
                hi[u] = max(hi[u], v)
    return -1


def warm_up() -> None:
    """Load the pass from numba's cache for a localized batch's index types (int32 ids and
    int64 offsets; int64 ids too), with and without weights."""
    indptr, x, flags = np.array([0, 1], np.int64), np.ones(1), np.ones(1, bool)
    for ids in (np.zeros(1, np.int32), np.zeros(1, np.int64)):
        key_sums(indptr, ids, x, flags, None, x, 1)
        key_sums(indptr, ids, x, flags, x, x, 1)
