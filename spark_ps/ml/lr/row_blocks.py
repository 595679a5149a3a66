"""A CSR batch's products over one range of its rows, for a task's threads.

Why not scipy: a ``csr_matrix`` built on part of a batch's arrays copies them (scipy prunes
a view much smaller than its base), so one matrix a thread held a second copy of the
partition, ~12 bytes a non-zero. These kernels read the batch's own arrays. They add in
scipy's order (a row's products in storage order; the transposed product row by row), so a
block's margins and gradient are the ones scipy computes for the same rows.

Compiled lazily (a worker that never runs on several threads pays no numba import);
without numba (or with ``SPARK_PS_NO_JIT=1``) :func:`kernels` returns None and a task's
products run on one thread.
"""

from __future__ import annotations

from ps_server.jit import compiled

__all__ = ["kernels"]

_KERNELS: list = []


def kernels():
    """``(matvec, rmatvec)`` compiled, or None without numba."""
    if not _KERNELS:
        _KERNELS.append(compiled(_matvec, _rmatvec))
    return _KERNELS[0]


def _matvec(indptr, indices, data, v, a, b, out):
    """``out[r - a] = row r . v`` for rows ``a <= r < b``."""
    for r in range(a, b):
        s = 0.0
        for p in range(indptr[r], indptr[r + 1]):
            s += data[p] * v[indices[p]]
        out[r - a] = s


def _rmatvec(indptr, indices, data, x, a, b, out):
    """``out += rows[a:b].T @ x`` (``x`` indexed from row `a`)."""
    for r in range(a, b):
        xr = x[r - a]
        for p in range(indptr[r], indptr[r + 1]):
            out[indices[p]] += data[p] * xr
