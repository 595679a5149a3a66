"""The dense fast path of LR: dense vectors as arrays, DenseBatch workers, folded label checks."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from pyspark.ml.classification import LogisticRegression as MLlibLR
from pyspark.ml.linalg import Vectors
from pyspark.sql import functions as F

from spark_ps.data import DenseBatch, arrow_to_csr, read_partition
from spark_ps.ml.base import prepare_fit_data
from spark_ps.ml.classification import LogisticRegression


def _dense_batches(X: np.ndarray, y: np.ndarray, w: np.ndarray, cut: int) -> list:
    def batch(lo, hi):
        col = pa.array([list(r) for r in X[lo:hi]], pa.list_(pa.float64()))
        return pa.RecordBatch.from_arrays(
            [col, pa.array(y[lo:hi]), pa.array(w[lo:hi])], names=["f", "label", "w"]
        )

    return [batch(0, cut), batch(cut, cut), batch(cut, len(X))]


def test_read_partition_dense_matrix_equals_the_csr_read():
    rng = np.random.default_rng(0)
    X, y, w = rng.normal(size=(50, 7)), rng.integers(0, 2, 50) * 1.0, rng.uniform(size=50)
    batches = _dense_batches(X, y, w, 20)
    dense = read_partition(batches, "f", label_col="label", weight_col="w", dense_matrix=True)
    csr = read_partition(batches, "f", label_col="label", weight_col="w")
    assert isinstance(dense, DenseBatch) and dense.matrix.shape == (50, 7)
    np.testing.assert_array_equal(dense.matrix, csr.to_dense())
    np.testing.assert_array_equal(dense.labels, y)
    np.testing.assert_array_equal(dense.weights, w)
    keys, local = dense.localize()
    assert local is dense and np.array_equal(keys, np.arange(7))
    empty = read_partition([], "f", label_col="label", num_features=7, dense_matrix=True)
    assert empty.matrix.shape == (0, 7) and empty.labels.shape == (0,)


def test_read_partition_dense_matrix_names_the_bad_row():
    rng = np.random.default_rng(1)
    X, y, w = rng.normal(size=(30, 4)), np.zeros(30), np.ones(30)
    X[25, 2] = np.nan
    with pytest.raises(ValueError, match="value nan at row 25 is not finite"):
        read_partition(_dense_batches(X, y, w, 20), "f", label_col="label", dense_matrix=True)
    short = pa.array([[1.0, 2.0], [3.0]], pa.list_(pa.float64()))
    batch = pa.RecordBatch.from_arrays([short], names=["f"])
    with pytest.raises(ValueError, match="vector size 1 at row 1 differs"):
        read_partition([batch], "f", dense_matrix=True)
    keys = pa.RecordBatch.from_arrays([pa.array([[1, 2]], pa.list_(pa.int64()))], names=["f"])
    with pytest.raises(TypeError, match="needs an array<float|double> features column"):
        read_partition([keys], "f", dense_matrix=True)
    assert arrow_to_csr(batch.slice(0, 1), "f").nnz == 2  # the CSR read is unchanged


def _mixed_df(spark, n=600, d=9, seed=2, first=0):
    """First row dense, then dense and sparse rows mixed (as VectorAssembler writes them)."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d)) * rng.uniform(0.5, 3.0, d)
    X[rng.uniform(size=(n, d)) < 0.5] = 0.0
    X[:, 4] = 0.0  # never stored: std 0, coefficient 0
    y = (rng.uniform(size=n) < 1 / (1 + np.exp(-(X @ rng.normal(size=d))))).astype(float)
    rows = []
    for i in range(n):
        nz = np.flatnonzero(X[i])
        vec = Vectors.dense(X[i]) if i % 3 == first else Vectors.sparse(d, nz, X[i, nz])
        rows.append((float(y[i]), float(1 + i % 4), vec))
    return spark.createDataFrame(rows, ["label", "weight", "features"]).cache()


@pytest.mark.timeout(300)
def test_mixed_dense_and_sparse_vectors_take_the_dense_path_and_match_mllib(spark_ps):
    spark, _ = spark_ps
    df = _mixed_df(spark)
    kw = dict(features_col="features", label_col="label", num_workers=2)
    assert prepare_fit_data(df, densify_max=4096, **kw).features_kind == "dense"
    assert prepare_fit_data(df, densify_max=8, **kw).features_kind == "vector"  # too wide
    sparse_first = _mixed_df(spark, n=20, first=1)  # the first row decides
    assert prepare_fit_data(sparse_first, densify_max=4096, **kw).features_kind == "vector"
    for params in (dict(regParam=0.03), dict(regParam=0.02, standardization=False)):
        ref = MLlibLR(maxIter=100, tol=1e-10, weightCol="weight", **params).fit(df)
        ours = LogisticRegression(maxIter=100, tol=1e-10, weightCol="weight", **params).fit(df)
        a, b = ours.coefficients.toArray(), ref.coefficients.toArray()
        assert np.linalg.norm(a - b) <= 1e-6 * np.linalg.norm(b), (a, b)
        assert ours.intercept == pytest.approx(ref.intercept, rel=1e-6)
        assert a[4] == 0.0
        assert ours.summary.totalIterations == ref.summary.totalIterations
        assert ours._fit_phases["statistics"] >= 0.0  # the set-up phases are timed


@pytest.mark.timeout(300)
def test_label_errors_are_refused_before_any_ps_work(spark_ps):
    """Bad labels on the dense path: MLlib's wording from the one pre-fit check, and
    nothing reaches the PS (the statistics round counts labels again, as a second guard)."""
    spark, ps = spark_ps
    before = ps.client.models()
    df = _mixed_df(spark, n=200).withColumn("id", F.monotonically_increasing_id())
    negative = df.withColumn("label", F.when(F.col("id") == 7, -1.0).otherwise(F.col("label")))
    with pytest.raises(ValueError, match=r"'label' \(labelCol\) has 1 negative or non-integer"):
        LogisticRegression(maxIter=3).fit(negative)
    half = df.withColumn("label", F.when(F.col("id") < 3, 0.5).otherwise(F.col("label")))
    with pytest.raises(ValueError, match=r"has 3 negative or non-integer"):
        LogisticRegression(maxIter=3).fit(half)
    three = df.withColumn("label", F.when(F.col("id") == 9, 2.0).otherwise(F.col("label")))
    with pytest.raises(ValueError, match=r"Binomial family only supports 1 or 2 outcome classes"):
        LogisticRegression(maxIter=3, family="binomial").fit(three)
    assert ps.client.models() == before


def test_a_declared_vector_size_above_the_bound_needs_no_first_row_job(spark_ps):
    """ML attributes (VectorAssembler, FeatureHasher, HashingTF write ``num_attrs``) that
    declare more features than the densify bound decide without a Spark job; otherwise the
    first row still decides, in one small job."""
    spark, _ = spark_ps
    sc = spark.sparkContext
    df = _mixed_df(spark, n=30)
    declared = df.withColumn(
        "features", F.col("features").alias("features", metadata={"ml_attr": {"num_attrs": 9}})
    )
    kw = dict(features_col="features", label_col="label", num_workers=2)

    def jobs(group: str, densify_max: int) -> tuple[str, int]:
        sc.setJobGroup(group, "prepare_fit_data")
        try:
            kind = prepare_fit_data(declared, densify_max=densify_max, **kw).features_kind
        finally:
            sc.setLocalProperty("spark.jobGroup.id", None)
        return kind, len(sc.statusTracker().getJobIdsForGroup(group))

    assert jobs("declared-wide", 8) == ("vector", 0)  # 9 features declared, 8 allowed
    assert jobs("declared-narrow", 4096) == ("dense", 1)  # the first row (dense) decides
