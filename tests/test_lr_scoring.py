"""Scoring state of LR models: non-zeros on the wire, exact per-row margins."""

from __future__ import annotations

import pickle

import numpy as np

from spark_ps.data import CSRBatch
from spark_ps.ml.lr.scoring import ScoringCoefficients, row_sums


def _batch(rng, n=500, d=5000, per_row=(0, 40)):
    lengths = rng.integers(*per_row, n)
    indptr = np.concatenate([[0], np.cumsum(lengths)])
    indices = rng.integers(0, d, indptr[-1])
    return CSRBatch(indptr, indices, rng.normal(size=indptr[-1]), d)


def _reference(csr: CSRBatch, dense_w: np.ndarray, b: float) -> np.ndarray:
    """Row by row, left to right: the order MLlib's sparse dot sums in."""
    out = np.zeros(csr.n_rows)
    for i in range(csr.n_rows):
        acc = 0.0
        for j in range(csr.indptr[i], csr.indptr[i + 1]):
            acc += csr.values[j] * dense_w[csr.indices[j]]
        out[i] = acc + b
    return out


def test_margins_are_exact_for_dense_compressed_and_sparse_models():
    rng = np.random.default_rng(0)
    csr = _batch(rng)
    w = np.zeros(csr.num_features)
    nz = rng.choice(csr.num_features, 300, replace=False)
    w[nz] = rng.normal(size=300)
    ref = _reference(csr, w, 0.25)
    compressed = ScoringCoefficients.of(None, w, 0.25)  # 6% non-zero: travels sparse
    assert compressed.dense_size == w.size and compressed.keys.size == 300
    full = ScoringCoefficients.of(None, rng.normal(size=csr.num_features), -1.0)
    assert full.keys is None and full.dense_size is None
    keys = np.sort(nz)
    sparse = ScoringCoefficients.of(keys, w[keys], 0.25)
    for state in (compressed, sparse):
        np.testing.assert_array_equal(state.margins(csr), ref)
    np.testing.assert_array_equal(full.margins(csr), _reference(csr, full.values, -1.0))


def test_the_rebuilt_dense_array_never_travels():
    w = np.zeros(1 << 20)
    w[[3, 70_000]] = [1.5, -2.0]
    state = ScoringCoefficients.of(None, w, 0.0)
    csr = CSRBatch(np.array([0, 2, 2]), np.array([3, 70_000]), np.array([2.0, 1.0]), 1 << 20)
    np.testing.assert_array_equal(state.margins(csr), [1.0, 0.0])  # an empty row scores b
    assert state._dense is not None
    wire = pickle.dumps(state)
    assert len(wire) < 4096  # 8 MiB dense, a few hundred bytes shipped
    back = pickle.loads(wire)
    assert back._dense is None
    np.testing.assert_array_equal(back.margins(csr), [1.0, 0.0])


def test_row_sums_handles_empty_rows_and_batches():
    np.testing.assert_array_equal(row_sums(np.array([0, 0, 0]), np.zeros(0)), [0.0, 0.0])
    sums = row_sums(np.array([0, 3, 3, 5]), np.array([1.0, 1e16, -1e16, 2.0, 3.0]))
    np.testing.assert_array_equal(sums, [0.0, 0.0, 5.0])  # (1 + 1e16) - 1e16: left to right
