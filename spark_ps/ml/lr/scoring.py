"""What an LR model ships to executors for scoring, and its per-row margins.

A dense model over 2^24 features is 128 MB of float64, pickled into every scoring task;
its non-zeros are usually far fewer. :class:`ScoringCoefficients` travels as its
non-zeros only and rebuilds the dense array once per task, so the per-entry weight
lookup stays one gather. Row sums run in scipy's CSR loop: each row summed in its
stored order (as MLlib's sparse dot) without an nnz-sized row-id array.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from spark_ps.data import CSRBatch

__all__ = ["ScoringCoefficients", "row_sums"]


class ScoringCoefficients:
    """Coefficients of a binomial model for scoring: dense (by feature id) or sparse keys.

    ``keys`` None means ``values`` is dense; with ``dense_size`` the sparse ``(keys,
    values)`` stand for a dense array of that size, rebuilt lazily where it is used.
    """

    def __init__(
        self,
        keys: np.ndarray | None,
        values: np.ndarray,
        intercept: float,
        dense_size: int | None = None,
    ):
        self.keys, self.values, self.intercept = keys, values, float(intercept)
        self.dense_size = dense_size
        self._dense: np.ndarray | None = None

    @classmethod
    def of(cls, keys: np.ndarray | None, values: np.ndarray, intercept: float):
        """Ship a dense model as its non-zeros when fewer than half of it is non-zero."""
        if keys is None:
            nz = np.flatnonzero(values)
            if nz.size * 2 < values.size:
                return cls(nz, values[nz], intercept, dense_size=values.size)
        return cls(keys, values, intercept)

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_dense": None}  # the rebuilt dense array never travels

    def weights_at(self, indices: np.ndarray) -> np.ndarray:
        """The coefficient of each feature id in ``indices`` (0 for ids the model lacks)."""
        if self.dense_size is not None:
            if self._dense is None:
                self._dense = np.zeros(self.dense_size)
                self._dense[self.keys] = self.values
            return self._dense[indices]
        if self.keys is None:
            return self.values[indices]
        if self.keys.shape[0] == 0:
            return np.zeros(indices.shape[0])
        pos = np.minimum(np.searchsorted(self.keys, indices), self.keys.shape[0] - 1)
        return np.where(self.keys[pos] == indices, self.values[pos], 0.0)

    def margins(self, csr: CSRBatch) -> np.ndarray:
        """``x . w + b`` per row."""
        return row_sums(csr.indptr, csr.values * self.weights_at(csr.indices)) + self.intercept


def row_sums(indptr: np.ndarray, products: np.ndarray) -> np.ndarray:
    """Sum of ``products[indptr[i]:indptr[i+1]]`` for each row i, left to right from 0.0.

    scipy's CSR mat-vec against a one-column matrix of ones is exactly that loop.
    """
    n = indptr.shape[0] - 1
    if products.shape[0] == 0:
        return np.zeros(n)
    cols = np.zeros(products.shape[0], dtype=np.int32)
    return sp.csr_matrix((products, cols, indptr), shape=(n, 1)) @ np.ones(1)
