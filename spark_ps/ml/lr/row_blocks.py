"""A CSR batch's products over one range of its rows, compiled.

Why not scipy: a ``csr_matrix`` built on part of a batch's arrays copies them (scipy prunes
a view much smaller than its base), so one matrix a thread held a second copy of the
partition, ~12 bytes a non-zero. These kernels read the batch's own arrays. They add in
scipy's order (a row's products in storage order; the transposed product row by row), so a
block's margins and gradient are the ones scipy computes for the same rows.

Rows whose values are all 1.0 (hashed one-hot features, the usual CTR input) skip reading
them: ``1.0 * v`` is ``v`` exactly, so the sums are the same bit for bit, and such a row's
product reads 12 bytes a non-zero instead of 20. The unit-row kernels take a flag per row,
so a batch where a few rows hold other values (two hashed fields colliding make a 2.0)
still runs them. Indices are read as unsigned, which spares the compiler the
negative-index check of every gather. On 500k hashed rows of 30 non-zeros (785k local
keys, one core, 150 rows holding a 2.0): scipy 21 + 24 ms a margin and gradient pass,
signed kernels 36 + 36 ms, unsigned 23 + 26 ms, the unit-row kernels 15.7-16 + 15.5-17 ms
(measured; without the per-row flag they took the same).

Compiled lazily (a worker that never runs them pays no numba import); without numba (or
with ``SPARK_PS_NO_JIT=1``) :func:`kernels` returns None and a task's products run in scipy
on one thread.
"""

from __future__ import annotations

import numpy as np

from ps_server.jit import compiled

__all__ = ["kernels", "unit_rows", "warm_up"]

_KERNELS: list = []


def kernels(units: bool = False):
    """``(matvec, rmatvec)`` compiled, or None without numba. `units`: the pair that
    takes a bool per row, True where all its values are 1.0 (those rows' values are not
    read), as the argument after ``data``."""
    if not _KERNELS:
        got = compiled(_matvec, _rmatvec, _matvec_units, _rmatvec_units)
        _KERNELS.append(None if got is None else (got[:2], got[2:]))
    pairs = _KERNELS[0]
    return None if pairs is None else pairs[1 if units else 0]


def unit_rows(indptr, values) -> np.ndarray:
    """bool per row of a CSR batch: whether every value it stores is 1.0 (an empty row's is
    True)."""
    flags = np.ones(len(indptr) - 1, dtype=bool)
    other = np.flatnonzero(values != 1.0)
    flags[np.searchsorted(indptr, other, side="right") - 1] = False
    return flags


def _matvec(indptr, indices, data, v, a, b, out):
    """``out[r - a] = row r . v`` for rows ``a <= r < b``."""
    for r in range(a, b):
        s = 0.0
        for p in range(np.uint64(indptr[r]), np.uint64(indptr[r + 1])):
            s += data[p] * v[np.uint64(indices[p])]
        out[r - a] = s


def _rmatvec(indptr, indices, data, x, a, b, out):
    """``out += rows[a:b].T @ x`` (``x`` indexed from row `a`)."""
    for r in range(a, b):
        xr = x[r - a]
        for p in range(np.uint64(indptr[r]), np.uint64(indptr[r + 1])):
            out[np.uint64(indices[p])] += data[p] * xr


def _matvec_units(indptr, indices, data, unit, v, a, b, out):
    """:func:`_matvec`, without reading the values of rows flagged in `unit`."""
    for r in range(a, b):
        s = 0.0
        lo, hi = np.uint64(indptr[r]), np.uint64(indptr[r + 1])
        if unit[r]:
            for p in range(lo, hi):
                s += v[np.uint64(indices[p])]
        else:
            for p in range(lo, hi):
                s += data[p] * v[np.uint64(indices[p])]
        out[r - a] = s


def _rmatvec_units(indptr, indices, data, unit, x, a, b, out):
    """:func:`_rmatvec`, without reading the values of rows flagged in `unit`."""
    for r in range(a, b):
        xr = x[r - a]
        lo, hi = np.uint64(indptr[r]), np.uint64(indptr[r + 1])
        if unit[r]:
            for p in range(lo, hi):
                out[np.uint64(indices[p])] += xr
        else:
            for p in range(lo, hi):
                out[np.uint64(indices[p])] += data[p] * xr


def warm_up() -> None:
    """Load the four products from numba's cache for scipy's int32 index arrays (what a
    batch's matrix holds): a process's first call otherwise pays it in its first fit."""
    pair, units = kernels(), kernels(units=True)
    if pair is None:
        return
    i32, x, flags = np.zeros(2, np.int32), np.zeros(1), np.ones(1, bool)
    for kernel in pair:
        kernel(i32, i32[:0], x[:0], x, 0, 1, x.copy())
    for kernel in units:
        kernel(i32, i32[:0], x[:0], flags, x, 0, 1, x.copy())
