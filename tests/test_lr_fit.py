"""LogisticRegression trained on the PS reaches MLlib's optimum on the same data."""

from __future__ import annotations

import numpy as np
import pytest
from pyspark.ml.classification import LogisticRegression as MLlibLR
from pyspark.ml.linalg import Vectors
from pyspark.sql import functions as F

from spark_ps.ml import _job
from spark_ps.ml.classification import LogisticRegression


def _dense_df(spark, n=2000, d=12, seed=0, weights=False):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d)) * rng.uniform(0.1, 5.0, d) + rng.normal(size=d)
    X[:, 2] = 3.0  # a constant feature: std 0, as MLlib handles it
    beta = rng.normal(size=d)
    y = (rng.uniform(size=n) < 1 / (1 + np.exp(-0.4 * (X @ beta)))).astype(float)
    w = rng.uniform(0.2, 3.0, n) if weights else np.ones(n)
    rows = [(float(y[i]), float(w[i]), Vectors.dense(X[i])) for i in range(n)]
    return spark.createDataFrame(rows, ["label", "weight", "features"]).cache()


def _sparse_df(spark, n=3000, d=200, seed=1):
    rng = np.random.default_rng(seed)
    beta = rng.normal(size=d)
    rows = []
    for _ in range(n):
        idx = np.sort(rng.choice(d, size=8, replace=False))
        val = rng.uniform(0.5, 2.0, 8)
        p = 1 / (1 + np.exp(-(beta[idx] @ val)))
        rows.append((float(rng.uniform() < p), Vectors.sparse(d, idx.tolist(), val.tolist())))
    return spark.createDataFrame(rows, ["label", "features"]).cache()


def _compare(ours, ref, rel=1e-6):
    a, b = ours.coefficients.toArray(), ref.coefficients.toArray()
    assert np.linalg.norm(a - b) <= rel * max(np.linalg.norm(b), 1e-12), (a, b)
    assert ours.intercept == pytest.approx(ref.intercept, rel=rel, abs=1e-9)


@pytest.mark.parametrize(
    "params",
    [
        dict(regParam=0.0),
        dict(regParam=0.02),
        dict(regParam=0.02, elasticNetParam=0.6),
        dict(regParam=0.05, standardization=False),
        dict(regParam=0.01, fitIntercept=False),
    ],
)
def test_dense_matches_mllib(spark_ps, params):
    spark, _ = spark_ps
    df = _dense_df(spark)
    ref = MLlibLR(maxIter=200, tol=1e-10, **params).fit(df)
    ours = LogisticRegression(maxIter=200, tol=1e-10, **params).fit(df)
    _compare(ours, ref)
    assert ours.summary.totalIterations == ref.summary.totalIterations
    np.testing.assert_allclose(
        ours.summary.objectiveHistory, ref.summary.objectiveHistory, rtol=1e-8
    )


def test_weighted_sparse_matches_mllib(spark_ps):
    spark, _ = spark_ps
    df = _dense_df(spark, weights=True, seed=5)
    ref = MLlibLR(maxIter=200, tol=1e-10, regParam=0.01, weightCol="weight").fit(df)
    ours = LogisticRegression(maxIter=200, tol=1e-10, regParam=0.01, weightCol="weight").fit(df)
    _compare(ours, ref)
    sdf = _sparse_df(spark)
    ref = MLlibLR(maxIter=200, tol=1e-10, regParam=0.001, elasticNetParam=0.3).fit(sdf)
    ours = LogisticRegression(maxIter=200, tol=1e-10, regParam=0.001, elasticNetParam=0.3).fit(sdf)
    _compare(ours, ref, rel=1e-5)
    assert ours.summary.areaUnderROC == pytest.approx(ref.summary.areaUnderROC, abs=1e-3)


@pytest.mark.slow
def test_task_failing_once_mid_fit_gives_the_clean_coefficients(spark_ps, tmp_path):
    spark, _ = spark_ps
    df = _dense_df(spark, n=800, d=6, seed=9)
    lr = LogisticRegression(maxIter=30, regParam=0.01, tol=1e-9)
    clean = lr.fit(df)
    marker = tmp_path / "failed"
    _job.inject_failure_once("grad", nth=3, part=1, marker=str(marker))
    try:
        retried = lr.fit(df)
    finally:
        _job.clear_failures()
    assert marker.exists()  # the task really died after pushing its gradient once
    np.testing.assert_array_equal(retried.coefficients.toArray(), clean.coefficients.toArray())
    assert retried.intercept == clean.intercept
    assert retried.summary.objectiveHistory == clean.summary.objectiveHistory


def test_a_worker_lost_while_a_finished_fit_stops_does_not_fail_the_fit(spark_ps, tmp_path, caplog):
    """A task that dies on the final ``stop`` command (an executor killed as the job winds
    down) comes after the fit's last round was collected: the fit returns its model,
    with a warning, instead of failing."""
    spark, _ = spark_ps
    df = _dense_df(spark, n=400, d=4, seed=3)
    lr = LogisticRegression(maxIter=8, regParam=0.01)
    clean = lr.fit(df)
    marker = tmp_path / "failed"
    _job.inject_failure_once("stop", nth=0, part=1, marker=str(marker))
    try:
        with caplog.at_level("WARNING", logger="spark_ps.job"):
            lost = lr.fit(df)
    finally:
        _job.clear_failures()
    assert marker.exists()  # the task really died on stop
    assert "the fit is complete" in caplog.text
    np.testing.assert_array_equal(lost.coefficients.toArray(), clean.coefficients.toArray())


def test_long_keys_beyond_2pow31_match_the_same_data_as_vectors(spark_ps):
    """Keys at 2**40 train on the K touched keys only; same optimum as MLlib on vectors."""
    spark, _ = spark_ps
    rng = np.random.default_rng(11)
    d, n = 60, 1500
    universe = np.sort(rng.choice(2**40, size=d, replace=False))
    beta = rng.normal(size=d)
    rows_v, rows_k = [], []
    for _ in range(n):
        idx = np.sort(rng.choice(d, size=5, replace=False))
        y = float(rng.uniform() < 1 / (1 + np.exp(-beta[idx].sum())))
        rows_v.append((y, Vectors.sparse(d, idx.tolist(), [1.0] * 5)))
        rows_k.append((y, universe[idx].tolist()))
    vdf = spark.createDataFrame(rows_v, ["label", "features"])
    kdf = spark.createDataFrame(rows_k, "label double, features array<bigint>")
    ref = MLlibLR(maxIter=100, tol=1e-10, regParam=0.01).fit(vdf)
    ours = LogisticRegression(maxIter=100, tol=1e-10, regParam=0.01).fit(kdf)
    assert ours.numFeatures == int(universe[-1]) + 1 > 2**31
    keys, values = ours.coefficientKeys, ours.coefficientValues
    got = dict(zip(keys.tolist(), values.tolist(), strict=True))
    want = ref.coefficients.toArray()
    np.testing.assert_allclose([got.get(int(k), 0.0) for k in universe], want, rtol=1e-6, atol=1e-9)
    assert ours.intercept == pytest.approx(ref.intercept, rel=1e-6)
    p_ours = ours.transform(kdf).select("probability").collect()
    p_ref = ref.transform(vdf).select("probability").collect()
    np.testing.assert_allclose([r[0][1] for r in p_ours], [r[0][1] for r in p_ref], rtol=1e-6)


def test_summary_reports_when_each_iteration_ended(spark_ps):
    spark, _ = spark_ps
    model = LogisticRegression(maxIter=8, regParam=0.01).fit(_dense_df(spark, n=500, d=4))
    ts = model.summary.iterationTimestamps
    assert len(ts) == len(model.summary.objectiveHistory)
    assert all(b >= a for a, b in zip(ts, ts[1:], strict=False)) and ts[0] > 0


@pytest.mark.parametrize("solver, step", [("sgd", 0.5), ("adam", 0.05), ("ftrl", 0.5)])
def test_minibatch_solvers_learn_what_lbfgs_learns(spark_ps, solver, step):
    """Server-side optimizers over mini-batches reach an AUC close to the full-batch optimum."""
    spark, _ = spark_ps
    df = _sparse_df(spark, n=3000, d=200, seed=4)
    full = LogisticRegression(maxIter=50, regParam=0.001).fit(df)
    ours = LogisticRegression(
        solver=solver, stepSize=step, batchSize=256, maxIter=8, regParam=0.001, tol=0.0
    ).fit(df)
    assert ours.summary.totalIterations == 8
    hist = ours.summary.objectiveHistory
    assert hist[-1] < hist[0]  # the epoch loss falls
    assert ours.summary.areaUnderROC > full.summary.areaUnderROC - 0.02


def _one_hot_df(spark, n=2500, d=2**17, used=300, seed=3):
    """One-hot rows over `used` scattered columns of a 2**17 space (beyond the identity
    numbering): every stored value is 1.0, and one column is stored in every row."""
    rng = np.random.default_rng(seed)
    cols = np.sort(rng.choice(np.arange(1, d), size=used, replace=False))
    beta = rng.normal(size=used)
    rows = []
    for _ in range(n):
        pick = np.sort(rng.choice(used, size=6, replace=False))
        y = float(rng.uniform() < 1 / (1 + np.exp(-beta[pick].sum())))
        idx = [0, *cols[pick].tolist()]  # column 0: constant 1 (std 0, as MLlib drops it)
        rows.append((y, Vectors.sparse(d, idx, [1.0] * len(idx))))
    return spark.createDataFrame(rows, ["label", "features"]).cache()


@pytest.mark.parametrize("dense_keyset", [True, False])
def test_one_hot_keys_numbered_densely_or_hashed_match_mllib(spark_ps, monkeypatch, dense_keyset):
    """Vector input beyond 2**16 numbers its touched keys in a dense PS vector when that is
    small enough, else in a hash-indexed one; both reach MLlib's optimum, and the one-hot
    statistics (no per-entry min/max) give MLlib's standardization."""
    from spark_ps.ml.lr import distributed

    spark, _ = spark_ps
    df = _one_hot_df(spark)
    monkeypatch.setattr(distributed, "_DENSE_KEYSET_PER_KEY", 10**6 if dense_keyset else 0)
    calls = []
    real = distributed.PSVector.dense
    monkeypatch.setattr(
        distributed.PSVector,
        "dense",
        lambda dim, **kw: calls.append(kw.get("name", "")) or real(dim, **kw),
    )
    params = dict(maxIter=100, tol=1e-10, regParam=0.01)
    ours = LogisticRegression(**params).fit(df)
    assert any(c.endswith("/keyset") for c in calls) == dense_keyset
    ref = MLlibLR(**params).fit(df)
    _compare(ours, ref, rel=1e-5)
    assert ours.coefficients[0] == 0.0 == ref.coefficients[0]
    assert ours.summary.areaUnderROC == pytest.approx(ref.summary.areaUnderROC, abs=1e-4)


def _long_keys_df(spark, n=1500, d=80, seed=12):
    """Weighted rows of 2**40-range keys (numbered in a hash index, not in key order)."""
    rng = np.random.default_rng(seed)
    universe = np.sort(rng.choice(2**40, size=d, replace=False))
    beta = rng.normal(size=d)
    rows = []
    for _ in range(n):
        idx = np.sort(rng.choice(d, size=6, replace=False))
        y = float(rng.uniform() < 1 / (1 + np.exp(-beta[idx].sum() + 0.7)))
        rows.append((y, float(rng.uniform(0.2, 3.0)), universe[idx].tolist()))
    return spark.createDataFrame(rows, "label double, weight double, features array<bigint>")


@pytest.mark.parametrize(
    "case, params",
    [
        ("dense", dict(weightCol="weight")),
        ("dense", dict(fitIntercept=False, elasticNetParam=0.5)),
        ("one label", dict(fitIntercept=False)),  # MLlib trains; the start is all zeros
        ("long keys", dict(weightCol="weight")),
    ],
)
def test_start_from_the_statistics_equals_a_pass_over_the_rows(spark_ps, monkeypatch, case, params):
    """The solver's first evaluation (MLlib's start: coefficients 0, intercept log-odds) is
    derived from the statistics round's per-key sums instead of a pass over the rows: the
    same value and gradient up to float rounding, hence the same path, with one worker
    evaluation fewer."""
    from spark_ps.ml.lr import distributed

    spark, _ = spark_ps
    df = _long_keys_df(spark) if case == "long keys" else _dense_df(spark, weights=True, seed=7)
    if case == "one label":
        df = df.withColumn("label", F.lit(1.0)).cache()
    lr = LogisticRegression(maxIter=8, tol=1e-12, regParam=0.01, **params)
    derived = lr.fit(df)
    real = distributed._Fit.stats
    monkeypatch.setattr(distributed._Fit, "stats", lambda self, start=False: real(self, False))
    passed = lr.fit(df)
    h1, h2 = derived.summary.objectiveHistory, passed.summary.objectiveHistory
    assert len(h1) == len(h2) == 9
    assert h1[0] == pytest.approx(h2[0], rel=1e-14)
    np.testing.assert_allclose(h1, h2, rtol=1e-11)
    if case != "long keys":
        a, b = derived.coefficients.toArray(), passed.coefficients.toArray()
    else:
        a, b = derived.coefficientValues, passed.coefficientValues
        assert derived.coefficientKeys.tolist() == passed.coefficientKeys.tolist()
    np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-12)
    assert derived.intercept == pytest.approx(passed.intercept, rel=1e-9, abs=1e-12)
    evaluations = derived._fit_phases["evaluations"], passed._fit_phases["evaluations"]
    assert evaluations[0] == evaluations[1] - 1 > 0
