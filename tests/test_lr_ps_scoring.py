"""Scoring a model whose weights live on the PS: per-batch pulls and shard-side partial
margins equal the in-memory model's scores, and a model above the byte limit is never
collected."""

from __future__ import annotations

import numpy as np
import pytest
from pyspark.sql import functions as F

from spark_ps.data import CSRBatch
from spark_ps.ml.lr import ps_model, scoring
from spark_ps.ml.lr.model import LogisticRegressionModel
from spark_ps.ml.lr.ps_model import PSLogisticRegressionModel, PSScoring, choose_path
from spark_ps.ml.lr.scoring import ScoringCoefficients
from spark_ps.models import PSVector

pytestmark = pytest.mark.timeout(300)

D24 = 1 << 24


def _model(rng, nnz=50_000, d=D24):
    keys = np.unique(rng.integers(0, d, nnz))
    return LogisticRegressionModel.fromCoefficients(
        rng.normal(size=keys.size), 0.3, keys=keys, numFeatures=d
    )


def _csr(rng, keys, d=D24, n=3000, per_row=25, ones=False):
    lengths = rng.integers(0, per_row, n)
    lengths[-3:] = [4, 0, 0]  # empty rows last: the shards' row sums must keep the last entry
    indptr = np.concatenate([[0], np.cumsum(lengths)])
    idx = np.where(
        rng.uniform(size=indptr[-1]) < 0.7,
        keys[rng.integers(0, keys.size, indptr[-1])],
        rng.integers(0, d, indptr[-1]),  # mostly keys the model lacks
    )
    values = np.ones(indptr[-1]) if ones else rng.normal(size=indptr[-1])
    return CSRBatch(indptr, idx, values, d)


def _scale(model, csr):
    """sum_i |x_i w_i| per row: what a relative 1e-12 is relative to."""
    w = ScoringCoefficients.of(model._keys, model._values, 0.0).weights_at(csr.indices)
    sums = np.add.reduceat(np.append(np.abs(csr.values * w), 0.0), csr.indptr[:-1])
    return np.where(np.diff(csr.indptr) > 0, sums, 0.0)


@pytest.mark.parametrize("ones", [False, True])
def test_pulled_and_partial_margins_equal_the_in_memory_ones(ps, ones):
    rng = np.random.default_rng(7)
    model = _model(rng)
    on_ps = model.toPS()
    try:
        csr = _csr(rng, model._keys, ones=ones)
        exact = ScoringCoefficients.of(model._keys, model._values, 0.3).margins(csr)
        tol = 1e-12 * (_scale(model, csr) + 1.0)
        for path in ("pull", "partial", "auto"):
            got = PSScoring(on_ps.weights, 0.3, path).margins(csr)
            assert np.all(np.abs(got - exact) <= tol), (path, np.abs(got - exact).max())
        ps_model.PARTIAL_MAX_BYTES = 4096  # many row ranges, the same sums
        try:
            got = PSScoring(on_ps.weights, 0.3, "partial").margins(csr)
        finally:
            ps_model.PARTIAL_MAX_BYTES = None
        assert np.all(np.abs(got - exact) <= tol)
        empty = CSRBatch(np.zeros(3, np.int64), np.zeros(0, np.int64), np.zeros(0), D24)
        np.testing.assert_array_equal(PSScoring(on_ps.weights, 0.3, "partial").margins(empty), 0.3)
        assert on_ps.collects == 0
    finally:
        on_ps.drop()


def test_choose_path_follows_the_byte_counts():
    # values present: pull always moves fewer bytes (16 U vs >= 8 U + 12 E, U <= E)
    assert choose_path(100_000, 100_000, 1000, 2, keys_only=False) == "pull"
    # keys only, rows sharing few keys: partial (8 U + 4 E + 16 (n+1) S < 16 U)
    assert choose_path(90_000, 100_000, 1000, 2, keys_only=True) == "partial"
    # keys only, rows sharing most keys: pull
    assert choose_path(20_000, 100_000, 1000, 2, keys_only=True) == "pull"


def test_transform_above_the_byte_limit_never_collects_the_model(spark_ps, monkeypatch):
    spark, _ = spark_ps
    rng = np.random.default_rng(3)
    model = _model(rng, nnz=20_000)
    csr = _csr(rng, model._keys, n=400, per_row=12)
    rows = [
        (i, csr.indices[csr.indptr[i] : csr.indptr[i + 1]].tolist(),
         csr.values[csr.indptr[i] : csr.indptr[i + 1]].tolist())
        for i in range(csr.n_rows)
    ]  # fmt: skip
    df = spark.createDataFrame(rows, "id long, keys array<bigint>, vals array<double>")
    df = df.repartition(2).cache()
    model.setFeaturesCol("keys").setFeatureValuesCol("vals")
    on_ps = model.toPS()
    try:
        assert isinstance(on_ps, PSLogisticRegressionModel)
        assert on_ps.numNonZeros == model._keys.size
        monkeypatch.setattr(scoring, "ENGINE", "python")
        ref = _raw(model.transform(df))
        monkeypatch.setattr(scoring, "ENGINE", "auto")
        tol = 1e-12 * (_scale(model, csr) + 1.0)
        on_ps.setMaxCollectBytes(16 * on_ps.numNonZeros - 1)  # one byte too small
        for path in ("auto", "pull", "partial"):
            out = on_ps.setScoringPath(path).transform(df)
            assert "MapInArrow" in out._jdf.queryExecution().executedPlan().toString()
            got = _raw(out)
            assert np.all(np.abs(got - ref) <= tol), (path, np.abs(got - ref).max())
        assert on_ps.collects == 0  # no path pulled the whole model to the driver
        local = _raw(on_ps.setScoringPath("local").transform(df))
        assert on_ps.collects == 1
        assert np.all(np.abs(local - ref) <= tol)
        np.testing.assert_array_equal(on_ps.coefficientValues, model.coefficientValues)
        assert on_ps.collects == 1  # collected once, then reused
        with pytest.raises(ValueError, match="scoringPath must be one of"):
            on_ps.setScoringPath("broadcast")
    finally:
        on_ps.drop()


def _raw(df) -> np.ndarray:
    rows = sorted(df.select("id", F.col("rawPrediction")).collect(), key=lambda r: r["id"])
    return np.array([r["rawPrediction"][1] for r in rows])


def test_from_ps_counts_the_keys_and_refuses_a_dense_vector(ps):
    w = PSVector.sparse(1 << 30)
    try:
        w.update(np.array([5, 1 << 29], dtype=np.int64), np.array([1.5, -2.0]))
        model = PSLogisticRegressionModel.fromPS(w, -0.5, 1 << 30)
        assert model.numNonZeros == 2 and model.numFeatures == 1 << 30
        csr = CSRBatch(np.array([0, 2]), np.array([5, 1 << 29]), np.array([2.0, 1.0]), 1 << 30)
        for path in ("pull", "partial"):
            got = PSScoring(w, -0.5, path).margins(csr)
            np.testing.assert_allclose(got, [3.0 - 2.0 - 0.5], rtol=1e-15)
    finally:
        w.drop()
    dense = PSVector.dense(8)
    try:
        with pytest.raises(ValueError, match="must be a sparse PS vector"):
            PSLogisticRegressionModel.fromPS(dense, 0.0, 8)
    finally:
        dense.drop()
