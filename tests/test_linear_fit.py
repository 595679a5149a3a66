"""LinearRegression and LinearSVC trained on the PS reach MLlib's optimum on the same data.

Coefficients are compared in the Euclidean norm: ``|ours - mllib| <= 1e-3 * |mllib|``
(both solvers stop at breeze's relative tolerance, so their iterates agree to a few
digits, not bit for bit); intercepts to 1e-3 relative (an absolute floor for ~0 ones).
"""

from __future__ import annotations

import numpy as np
import pytest
from pyspark.ml.classification import LinearSVC as MLlibSVC
from pyspark.ml.linalg import Vectors
from pyspark.ml.regression import LinearRegression as MLlibLinReg
from pyspark.sql import functions as F

from spark_ps.ml.classification import LinearSVC
from spark_ps.ml.regression import LinearRegression

REL = 1e-3


def _regression_df(spark, n=1500, d=8, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d)) * rng.uniform(0.2, 4.0, d) + rng.normal(size=d)
    X[:, 1] = 2.5  # constant feature: std 0, coefficient 0 as in MLlib
    beta = rng.normal(size=d)
    y = X @ beta + 3.0 + rng.normal(scale=2.0, size=n)
    y[:20] += rng.normal(scale=40.0, size=20)  # outliers, for huber
    w = rng.uniform(0.2, 3.0, n)
    rows = [(float(y[i]), float(w[i]), Vectors.dense(X[i])) for i in range(n)]
    return spark.createDataFrame(rows, ["label", "weight", "features"]).cache()


def _svc_df(spark, n=1500, d=8, seed=1):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d)) * rng.uniform(0.2, 4.0, d) + rng.normal(size=d)
    beta = rng.normal(size=d)
    m = (X - X.mean(0)) @ beta
    y = (m + rng.normal(scale=np.std(m), size=n) > 0).astype(float)
    w = rng.uniform(0.2, 3.0, n)
    rows = [(float(y[i]), float(w[i]), Vectors.dense(X[i])) for i in range(n)]
    return spark.createDataFrame(rows, ["label", "weight", "features"]).cache()


def _close(ours, ref, rel=REL):
    a, b = ours.coefficients.toArray(), ref.coefficients.toArray()
    assert np.linalg.norm(a - b) <= rel * np.linalg.norm(b), (a, b)
    assert ours.intercept == pytest.approx(ref.intercept, rel=rel, abs=rel * 1e-2), (
        ours.intercept,
        ref.intercept,
    )


@pytest.mark.parametrize(
    "params",
    [
        dict(regParam=0.0),
        dict(regParam=0.3),
        dict(regParam=0.3, elasticNetParam=0.5),
        dict(regParam=0.3, standardization=False, weightCol="weight"),
        dict(regParam=0.1, elasticNetParam=1.0, fitIntercept=False),
    ],
)
def test_linear_regression_matches_mllib(spark_ps, params):
    spark, _ = spark_ps
    df = _regression_df(spark)
    ref = MLlibLinReg(solver="l-bfgs", maxIter=300, tol=1e-12, **params).fit(df)
    ours = LinearRegression(solver="l-bfgs", maxIter=300, tol=1e-12, **params).fit(df)
    _close(ours, ref)
    assert ours.scale == 1.0
    assert ours.coefficients[1] == 0.0  # the constant feature
    s, r = ours.summary, ref.summary
    for name in ("rootMeanSquaredError", "meanSquaredError", "meanAbsoluteError", "r2", "r2adj"):
        assert getattr(s, name) == pytest.approx(getattr(r, name), rel=1e-6), name
    assert s.explainedVariance == pytest.approx(r.explainedVariance, rel=1e-5)
    assert s.numInstances == r.numInstances == 1500
    assert s.degreesOfFreedom == r.degreesOfFreedom
    assert s.objectiveHistory[-1] == pytest.approx(r.objectiveHistory[-1], rel=1e-6)
    assert s.totalIterations == len(s.objectiveHistory) - 1


@pytest.mark.parametrize(
    "params",
    [
        dict(regParam=0.0),
        dict(regParam=0.2, standardization=False, weightCol="weight"),
        dict(regParam=0.05, fitIntercept=False),
    ],
)
def test_huber_matches_mllib(spark_ps, params):
    spark, _ = spark_ps
    df = _regression_df(spark)
    ref = MLlibLinReg(loss="huber", maxIter=400, tol=1e-12, **params).fit(df)
    ours = LinearRegression(loss="huber", maxIter=400, tol=1e-12, **params).fit(df)
    _close(ours, ref)
    assert ours.scale == pytest.approx(ref.scale, rel=REL)
    assert ours.summary.objectiveHistory[-1] == pytest.approx(
        ref.summary.objectiveHistory[-1], rel=1e-6
    )


@pytest.mark.parametrize(
    "params",
    [
        dict(regParam=0.01),
        dict(regParam=0.05, standardization=False),
        dict(regParam=0.01, fitIntercept=False, weightCol="weight"),
        dict(regParam=0.02, weightCol="weight", threshold=0.3),
    ],
)
def test_linear_svc_matches_mllib(spark_ps, params):
    spark, _ = spark_ps
    df = _svc_df(spark)
    ref = MLlibSVC(maxIter=50, tol=1e-4, **params).fit(df)  # MLlib's hinge fit is the slow part
    ours = LinearSVC(maxIter=50, tol=1e-4, **params).fit(df)
    _close(ours, ref)
    s, r = ours.summary(), ref.summary()
    # the same OWL-QN rules from the same start: the same path, iteration for iteration
    assert s.totalIterations == r.totalIterations
    np.testing.assert_allclose(s.objectiveHistory, r.objectiveHistory, rtol=1e-6)
    assert s.accuracy == pytest.approx(r.accuracy, abs=2 / 1500)
    assert s.areaUnderROC == pytest.approx(r.areaUnderROC, abs=1e-3)
    got = ours.transform(df).select("rawPrediction", "prediction").toPandas()
    want = ref.transform(df).select("rawPrediction", "prediction").toPandas()
    raw_o = np.stack(got.rawPrediction.map(lambda v: v.toArray()))
    raw_m = np.stack(want.rawPrediction.map(lambda v: v.toArray()))
    assert np.abs(raw_o - raw_m).max() <= REL * np.abs(raw_m).max()
    near = np.abs(raw_m[:, 1] - ours.getThreshold()) < 1e-2  # margins at the threshold may flip
    assert (got.prediction.values[~near] == want.prediction.values[~near]).all()


@pytest.mark.slow  # two fits
def test_a_task_failing_once_mid_fit_gives_the_clean_coefficients(spark_ps, tmp_path):
    """The docstrings' "pushes its gradient exactly once": a task that dies after its push
    is retried, and its first push counts for nothing."""
    from spark_ps.ml import _job

    spark, _ = spark_ps
    df = _regression_df(spark, n=600, seed=4)
    lin = LinearRegression(solver="l-bfgs", maxIter=15, regParam=0.1, tol=1e-9)
    clean = lin.fit(df)
    marker = tmp_path / "failed"
    _job.inject_failure_once("linear_grad", nth=3, part=1, marker=str(marker))
    try:
        retried = lin.fit(df)
    finally:
        _job.clear_failures()
    assert marker.exists()  # the task really died after its push
    np.testing.assert_array_equal(retried.coefficients.toArray(), clean.coefficients.toArray())
    assert retried.intercept == clean.intercept
    # (the summary needs the bridge jar built from this tree; the model is what counts)


@pytest.fixture(scope="module")
def normal_df(spark):
    """300 weighted rows, 4 features of different scales (none constant), the last without
    effect on the label (so its p-value is far from 0)."""
    rng = np.random.default_rng(5)
    X = rng.normal(size=(300, 4)) * np.array([1.0, 3.0, 0.5, 2.0]) + np.array([0.5, -1, 2, 0])
    y = X @ np.array([1.0, -0.4, 0.3, 0.0]) + 0.7 + rng.normal(size=300)  # x3: no effect
    w = rng.uniform(0.5, 2.0, 300)
    rows = [(float(y[i]), float(w[i]), Vectors.dense(X[i])) for i in range(300)]
    return spark.createDataFrame(rows, ["label", "weight", "features"]).cache()


@pytest.mark.parametrize(
    "params",
    [
        dict(solver="normal"),
        dict(solver="normal", weightCol="weight"),
        dict(solver="auto", regParam=0.2, weightCol="weight"),
        dict(solver="normal", regParam=0.2, standardization=False),
        dict(solver="normal", fitIntercept=False, weightCol="weight"),
    ],
    ids=["plain", "weighted", "auto-ridge", "ridge-unstandardized", "no-intercept"],
)
def test_normal_equation_statistics_are_mllibs(normal_df, params):
    """Where MLlib solves the normal equations its training summary has the coefficients'
    standard errors, t- and p-values (from the diagonal of (A^T W A)^-1, with the ridge
    term when regularized); ours gives the same within 1e-6 relative (the coefficients agree
    to ~1e-10, and the statistics are smooth in them). p-values near 0 are compared to an
    absolute 1e-12 (they are probabilities)."""
    ours = LinearRegression(**params).fit(normal_df)
    ref = MLlibLinReg(**params).fit(normal_df)
    s, r = ours.summary, ref.summary
    assert len(s.coefficientStandardErrors) == 4 + int(params.get("fitIntercept", True))
    for name in ("coefficientStandardErrors", "tValues"):
        np.testing.assert_allclose(getattr(s, name), getattr(r, name), rtol=1e-6, err_msg=name)
    np.testing.assert_allclose(s.pValues, r.pValues, rtol=1e-6, atol=1e-12)
    assert r.pValues[3] > 1e-3  # the feature without effect: a p-value the test can see
    with pytest.raises(Exception, match="No Std. Error"):  # evaluate() has none, as MLlib's
        ours.evaluate(normal_df).coefficientStandardErrors  # noqa: B018


def test_lbfgs_and_constant_features_have_no_normal_equation_statistics(normal_df, spark):
    """MLlib's l-bfgs summary has no standard errors; nor has ours (as before)."""
    s = LinearRegression(solver="l-bfgs").fit(normal_df).summary
    with pytest.raises(Exception, match="No Std. Error"):
        s.coefficientStandardErrors  # noqa: B018


@pytest.mark.parametrize(
    "estimator, params",
    [
        ("svc", dict(regParam=0.05, weightCol="weight")),
        ("svc", dict(regParam=0.0, fitIntercept=False)),
        ("svc zero weights", dict(regParam=0.05, weightCol="weight")),
        ("reg", dict(regParam=0.3, elasticNetParam=0.5, weightCol="weight")),
        ("reg", dict(regParam=0.1, fitIntercept=False, standardization=False)),
        # a constant label without intercept: the label's scale is |mean| (MLlib's rule)
        ("reg constant", dict(regParam=0.0, fitIntercept=False)),
    ],
)
def test_start_from_the_statistics_equals_a_pass_over_the_rows(
    spark_ps, monkeypatch, estimator, params
):
    """LinearSVC's and L-BFGS LinearRegression's first evaluation (zero coefficients) is
    derived from the statistics round's per-key ``sum w*x`` and ``sum w*y*x``: the same
    value and gradient as a worker round up to float rounding, hence the same path, with
    one gradient round fewer."""
    from spark_ps.ml import _job
    from spark_ps.ml.linear import fit as linear_fit

    spark, _ = spark_ps
    if estimator.startswith("svc"):
        df, make = _svc_df(spark), lambda: LinearSVC(maxIter=8, tol=1e-12, **params)
    else:
        df = _regression_df(spark)
        make = lambda: LinearRegression(solver="l-bfgs", maxIter=8, tol=1e-12, **params)  # noqa: E731
    if estimator == "svc zero weights":  # every 7th row weighs 0: not active at margin 0
        zero = (F.monotonically_increasing_id() % 7) == 0
        df = df.withColumn("weight", F.when(zero, 0.0).otherwise(F.col("weight"))).cache()
    if estimator == "reg constant":
        df = df.withColumn("label", F.lit(3.0)).cache()
    rounds = []
    command = _job.PSJob.command
    monkeypatch.setattr(
        _job.PSJob, "command", lambda self, op, **kw: rounds.append(op) or command(self, op, **kw)
    )
    derived = make().fit(df)
    n_derived, rounds[:] = rounds.count("linear_grad"), []
    real = linear_fit._Solve.stats
    monkeypatch.setattr(linear_fit._Solve, "stats", lambda self, start=False: real(self, False))
    passed = make().fit(df)
    # LinearSVCModel.summary is a method, as in pyspark
    summary = (lambda m: m.summary()) if estimator.startswith("svc") else (lambda m: m.summary)
    h1, h2 = summary(derived), summary(passed)
    h1, h2 = h1.objectiveHistory, h2.objectiveHistory
    assert len(h1) == len(h2) > 3  # some fits converge before maxIter
    assert h1[0] == pytest.approx(h2[0], rel=1e-14)
    np.testing.assert_allclose(h1, h2, rtol=1e-11)
    a, b = derived.coefficients.toArray(), passed.coefficients.toArray()
    np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-12)
    assert derived.intercept == pytest.approx(passed.intercept, rel=1e-9, abs=1e-12)
    assert n_derived == rounds.count("linear_grad") - 1 > 0
