"""spark-ps LogisticRegression as a drop-in for pyspark.ml's: Params, transform, summaries,
save/load, Pipeline/CrossValidator/TrainValidationSplit, array<bigint> keys.

MLlib itself is the reference: its Params, its fitted model (whose numbers we copy into ours)
and its summaries. Training uses a local scipy trainer registered for the test (the real
trainer runs on the PS and is tested elsewhere).
"""

from __future__ import annotations

import numpy as np
import pytest
from pyspark.ml import Pipeline, PipelineModel
from pyspark.ml.classification import BinaryLogisticRegressionSummary as MLlibBinarySummary
from pyspark.ml.classification import LogisticRegression as MLlibLR
from pyspark.ml.evaluation import BinaryClassificationEvaluator
from pyspark.ml.linalg import DenseMatrix, DenseVector, SparseVector, Vectors, VectorUDT
from pyspark.ml.tuning import CrossValidator, ParamGridBuilder, TrainValidationSplit
from pyspark.sql import functions as F
from pyspark.sql import types as T
from scipy.optimize import minimize
from scipy.special import expit

from spark_ps.data import arrow_to_csr
from spark_ps.ml.base import ArrowRegressionScoring, ArrowScoring
from spark_ps.ml.lr import scoring
from spark_ps.ml.lr.estimator import LogisticRegression, TrainResult, register_trainer
from spark_ps.ml.lr.model import LogisticRegressionModel
from spark_ps.ml.lr.summary import BinaryLogisticRegressionTrainingSummary

pytestmark = pytest.mark.timeout(300)

NUM_FEATURES = 4


# --------------------------------------------------------------------------- local trainer


def local_trainer(prepared, params):
    """MLlib's L2 objective (weighted mean log-loss + standardized L2), minimized by scipy.

    Tests only: collects the prepared data to the driver through Arrow.
    """
    table = prepared.df.toArrow()
    csr = arrow_to_csr(
        table,
        prepared.features_col,
        label_col=prepared.label_col,
        weight_col=prepared.weight_col,
        values_col=prepared.values_col,
    )
    x, y = csr.to_dense(), csr.labels
    w = csr.weights if csr.weights is not None else np.ones_like(y)
    wsum = w.sum()
    mean = w @ x / wsum
    std = np.sqrt((w @ (x - mean) ** 2) / (wsum - (w**2).sum() / wsum))
    scale2 = std**2 if params["standardization"] else np.ones_like(std)
    reg, fit_b, d = params["regParam"], params["fitIntercept"], x.shape[1]

    def objective(theta):
        beta, b = theta[:d], (theta[d] if fit_b else 0.0)
        m = x @ beta + b
        g = w * (expit(m) - y) / wsum
        value = (w * (np.logaddexp(0.0, m) - y * m)).sum() / wsum
        value += 0.5 * reg * (beta**2 * scale2).sum()
        grad = np.concatenate([x.T @ g + reg * beta * scale2, [g.sum()] if fit_b else []])
        return value, grad

    theta0 = np.zeros(d + int(fit_b))
    history = [objective(theta0)[0]]
    res = minimize(
        objective,
        theta0,
        jac=True,
        method="L-BFGS-B",
        callback=lambda th: history.append(objective(th)[0]),
        options={"maxiter": params["maxIter"], "gtol": 1e-11, "ftol": 1e-15},
    )
    return TrainResult(
        coefficients=res.x[:d],
        intercept=float(res.x[d]) if fit_b else 0.0,
        objective_history=history,
        total_iterations=int(res.nit),
    )


@pytest.fixture
def local_lbfgs():
    """Register the local trainer for solver lbfgs for one test, then restore."""
    previous = register_trainer("lbfgs", local_trainer)
    yield
    register_trainer("lbfgs", previous)


# --------------------------------------------------------------------------- data


def _rows(n: int, seed: int):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, NUM_FEATURES))
    x[rng.random(size=x.shape) < 0.3] = 0.0
    beta = np.array([1.5, -2.0, 0.7, 0.0])
    y = (rng.random(n) < expit(x @ beta - 0.3)).astype(float)
    w = rng.uniform(0.5, 2.0, size=n)
    rows = []
    for i in range(n):  # test data construction, not a hot path
        nz = np.flatnonzero(x[i])
        vec = (
            Vectors.sparse(NUM_FEATURES, nz.tolist(), x[i, nz].tolist())
            if i % 2
            else Vectors.dense(x[i].tolist())
        )
        rows.append((i, vec, float(y[i]), float(w[i])))
    return rows


@pytest.fixture(scope="module")
def data(spark):
    return spark.createDataFrame(_rows(160, 7), ["id", "features", "label", "weight"]).cache()


@pytest.fixture(scope="module")
def mllib_model(data):
    return MLlibLR(regParam=0.05, weightCol="weight").fit(data)


def _ours_like(mllib_model) -> LogisticRegressionModel:
    """Our model with MLlib's coefficients, intercept and explicitly set Params."""
    ours = LogisticRegressionModel.fromCoefficients(mllib_model.coefficients, mllib_model.intercept)
    for p in mllib_model.params:
        if mllib_model.isSet(p):
            ours.set(ours.getParam(p.name), mllib_model.getOrDefault(p))
    return ours


def _collect(df, cols):
    """Columns ``cols`` as lists ordered by ``id`` (sorted locally: no extra Spark job)."""
    rows = sorted(df.select("id", *cols).collect(), key=lambda r: r["id"])
    return [[r[c] for r in rows] for c in cols]


def _vectors(values) -> np.ndarray:
    return np.array([v.toArray() for v in values])


# --------------------------------------------------------------------------- Params


def test_every_mllib_param_exists_with_same_default_and_converter(spark):
    mllib, ours = MLlibLR(), LogisticRegression()
    assert len(mllib.params) > 15
    for p in mllib.params:
        assert ours.hasParam(p.name), p.name
        q = ours.getParam(p.name)
        assert q.doc == p.doc, p.name
        assert q.typeConverter is p.typeConverter, p.name
        assert ours.hasDefault(q) == mllib.hasDefault(p), p.name
        if mllib.hasDefault(p):
            assert ours.getOrDefault(q) == mllib.getOrDefault(p), p.name
    model = LogisticRegressionModel()
    assert {p.name for p in mllib.params} <= {p.name for p in model.params}


def test_additional_params_and_setters_return_self():
    lr = LogisticRegression()
    expected = {
        "solver": "lbfgs",
        "batchSize": 4096,
        "stepSize": 0.1,
        "numShards": 0,
        "staleness": 0,
        "numWorkers": 0,
    }
    assert {k: lr.getOrDefault(k) for k in expected} == expected
    assert not lr.isDefined(lr.featureValuesCol)
    chained = (
        lr.setSolver("adam")
        .setBatchSize(128)
        .setStepSize(0.5)
        .setNumShards(3)
        .setStaleness(2)
        .setNumWorkers(2)
        .setFeatureValuesCol("vals")
        .setMaxIter(7)
        .setRegParam(0.1)
        .setThreshold(0.4)
    )
    assert chained is lr
    assert (lr.getSolver(), lr.getBatchSize(), lr.getStaleness(), lr.getMaxIter()) == (
        "adam",
        128,
        2,
        7,
    )
    lr._validate_params()  # adam may run stale
    with pytest.raises(TypeError, match="keyword"):
        LogisticRegression().setParams("features")


@pytest.mark.parametrize(
    ("kwargs", "pattern"),
    [
        ({"maxIter": -1}, r"parameter maxIter given invalid value -1"),
        ({"regParam": -0.5}, r"parameter regParam given invalid value -0.5"),
        ({"elasticNetParam": 1.5}, r"parameter elasticNetParam given invalid value 1.5"),
        ({"tol": float("nan")}, r"parameter tol given invalid value nan"),
        ({"threshold": 1.2}, r"parameter threshold given invalid value 1.2"),
        ({"thresholds": [0.0, 0.0]}, r"parameter thresholds given invalid value \[0.0, 0.0\]"),
        ({"family": "poisson"}, r"parameter family given invalid value 'poisson'"),
        ({"aggregationDepth": 1}, r"parameter aggregationDepth given invalid value 1"),
        ({"solver": "newton"}, r"parameter solver given invalid value 'newton'"),
        ({"batchSize": 0}, r"parameter batchSize given invalid value 0"),
        ({"stepSize": 0.0}, r"parameter stepSize given invalid value 0.0"),
        ({"numWorkers": -2}, r"parameter numWorkers given invalid value -2"),
        ({"staleness": 2}, r"parameter staleness given invalid value 2: must be 0 with solver"),
    ],
)
def test_bad_params_are_rejected_by_name(kwargs, pattern):
    with pytest.raises(ValueError, match=pattern):
        LogisticRegression(**kwargs)._validate_params()


def test_fit_validates_params_first(data, local_lbfgs):
    with pytest.raises(ValueError, match="parameter maxIter given invalid value -3"):
        LogisticRegression(maxIter=-3).fit(data)


def test_unsupported_settings_fail_at_fit(spark, data, local_lbfgs):
    bounds = DenseMatrix(1, NUM_FEATURES, [0.0] * NUM_FEATURES)
    with pytest.raises(ValueError, match="lowerBoundsOnCoefficients is set.*solver='lbfgs'"):
        LogisticRegression(lowerBoundsOnCoefficients=bounds, solver="sgd").fit(data)
    with pytest.raises(ValueError, match="numClasses=2, but thresholds has length 3"):
        LogisticRegression(thresholds=[0.2, 0.3, 0.5]).fit(data)
    three = data.withColumn("label", F.when(F.col("id") == 3, 2.0).otherwise(F.col("label")))
    with pytest.raises(ValueError, match="Binomial family only supports 1 or 2 outcome classes"):
        LogisticRegression(family="binomial").fit(three)
    with pytest.raises(NotImplementedError, match="multinomial fit .3 classes. needs solver"):
        LogisticRegression(solver="sgd").fit(three)
    negative = data.withColumn("label", F.when(F.col("id") == 3, -1.0).otherwise(F.col("label")))
    with pytest.raises(ValueError, match=r"'label' \(labelCol\) has 1 negative"):
        LogisticRegression().fit(negative)
    bad_w = data.withColumn("weight", F.when(F.col("id") == 5, -1.0).otherwise(F.col("weight")))
    with pytest.raises(ValueError, match=r"but got -1\.0 \(weightCol 'weight'; 1 such"):
        LogisticRegression(weightCol="weight").fit(bad_w)


def test_unregistered_solver_is_named(data):
    previous = register_trainer("ftrl", None)
    try:
        with pytest.raises(NotImplementedError, match="no trainer is registered for solver='ftrl'"):
            LogisticRegression(solver="ftrl").fit(data)
    finally:
        register_trainer("ftrl", previous)


def test_threshold_and_thresholds_stay_consistent():
    lr = LogisticRegression().setThresholds([0.4, 0.6])
    assert not lr.isSet(lr.threshold)
    assert lr.getThreshold() == pytest.approx(0.6)
    lr.setThreshold(0.3)
    assert not lr.isSet(lr.thresholds) and lr.getThresholds() == pytest.approx([0.7, 0.3])
    with pytest.raises(ValueError, match="inconsistent values for threshold"):
        LogisticRegression(threshold=0.3, thresholds=[0.5, 0.5])


# --------------------------------------------------------------------------- transform


@pytest.fixture(params=["jvm", "python"])
def engine(request, monkeypatch):
    """Score on the JVM (bridge jar) or in Python workers (mapInArrow), both like MLlib."""
    monkeypatch.setattr(scoring, "ENGINE", request.param)
    return request.param


def test_transform_equals_mllib_for_same_coefficients(data, mllib_model, engine):
    ours = _ours_like(mllib_model)
    theirs_df, ours_df = mllib_model.transform(data), ours.transform(data)
    assert [(f.name, f.dataType, f.metadata) for f in ours_df.schema] == [
        (f.name, f.dataType, f.metadata) for f in theirs_df.schema
    ]
    cols = ["rawPrediction", "probability", "prediction", "features", "weight"]
    theirs, mine = _collect(theirs_df, cols), _collect(ours_df, cols)
    assert all(isinstance(v, DenseVector) for v in mine[0] + mine[1])
    np.testing.assert_allclose(_vectors(mine[0]), _vectors(theirs[0]), rtol=0, atol=1e-12)
    np.testing.assert_allclose(_vectors(mine[1]), _vectors(theirs[1]), rtol=0, atol=1e-12)
    assert mine[2] == theirs[2] and 0 < sum(mine[2]) < len(mine[2])
    assert mine[3] == theirs[3] and mine[4] == theirs[4]


_OUTPUT_SETUPS = [
    {"threshold": 0.3},
    {"thresholds": [0.35, 0.65]},
    {"threshold": 0.0},
    {"threshold": 0.6, "rawPredictionCol": ""},
    {"threshold": 0.45, "rawPredictionCol": "", "probabilityCol": ""},
    {"predictionCol": "", "probabilityCol": "p"},
]


_OUTPUT_COLS = ("rawPredictionCol", "probabilityCol", "predictionCol")


def _configured(model, i, setup):
    """A copy of ``model`` with ``setup`` applied and its output columns suffixed ``_i``."""
    model = model.copy()
    for col in _OUTPUT_COLS:
        name = setup.get(col, model.getOrDefault(col))
        model.set(model.getParam(col), f"{name}_{i}" if name else "")
    for name in ("threshold", "thresholds"):
        if name in setup:
            getattr(model, "set" + name[0].upper() + name[1:])(setup[name])
    return model


def test_thresholds_and_empty_output_cols_like_mllib(data, mllib_model, engine):
    ours_base = _ours_like(mllib_model)
    for i, setup in enumerate(_OUTPUT_SETUPS):  # one job per side and setup: workers are reused
        theirs_df = _configured(mllib_model, i, setup).transform(data)
        ours_df = _configured(ours_base, i, setup).transform(data)
        assert ours_df.columns == theirs_df.columns
        new = [c for c in ours_df.columns if c not in data.columns]
        assert len(new) == 3 - sum(setup.get(c) == "" for c in _OUTPUT_COLS), setup
        theirs, mine = _collect(theirs_df, new), _collect(ours_df, new)
        for name, a, b in zip(new, mine, theirs, strict=True):
            if name.startswith("prediction"):
                assert a == b, (setup, name)
            else:
                np.testing.assert_allclose(_vectors(a), _vectors(b), rtol=0, atol=1e-12)


def test_single_row_predictions_equal_mllib(mllib_model):
    ours = _ours_like(mllib_model).setThreshold(0.4)
    theirs = mllib_model.copy().setThreshold(0.4)
    for v in [Vectors.dense([0.3, -1.0, 2.0, 0.5]), Vectors.sparse(NUM_FEATURES, [1], [0.2])]:
        np.testing.assert_allclose(
            ours.predictRaw(v).toArray(), theirs.predictRaw(v).toArray(), rtol=0, atol=1e-12
        )
        np.testing.assert_allclose(
            ours.predictProbability(v).toArray(),
            theirs.predictProbability(v).toArray(),
            rtol=0,
            atol=1e-12,
        )
        assert ours.predict(v) == theirs.predict(v)
    with pytest.raises(ValueError, match="vector size 3 does not match"):
        ours.predict(Vectors.dense([1.0, 2.0, 3.0]))


def test_transform_rejects_bad_columns(spark, data, mllib_model, engine):
    ours = _ours_like(mllib_model)
    with pytest.raises(TypeError, match=r"Column 'label' \(featuresCol\) must be of type"):
        ours.copy().setFeaturesCol("label").transform(data)
    with pytest.raises(ValueError, match=r"Column 'nope' \(featuresCol\) does not exist"):
        ours.copy().setFeaturesCol("nope").transform(data)
    with pytest.raises(ValueError, match="Output column weight already exists"):
        ours.copy().setPredictionCol("weight").transform(data)
    with pytest.raises(ValueError, match="numClasses=2, but thresholds has length 3"):
        ours.copy().setThresholds([0.2, 0.3, 0.5]).transform(data)
    short = spark.createDataFrame([(0, Vectors.dense([1.0, 2.0]))], ["id", "features"])
    with pytest.raises(Exception, match="vector size 2 at row 0 differs from num_features=4"):
        ours.transform(short).collect()


def test_array_bigint_keys_scoring(spark, engine):
    big = 1 << 40
    keys = np.array([3, 70_000, (1 << 31) + 5, big - 1], dtype=np.int64)
    model = LogisticRegressionModel.fromCoefficients(
        [0.5, -1.25, 2.0, 0.75], -0.1, keys=keys, numFeatures=big
    ).setFeatureValuesCol("vals")
    rows = [
        (0, [3, (1 << 31) + 5], [2.0, -1.0]),
        (1, [big - 1, 12, 70_000], [1.0, 4.0, 0.5]),
        (2, [], []),
    ]
    schema = "id long, keys array<bigint>, vals array<double>"
    df = spark.createDataFrame(rows, schema).repartition(2)
    out = model.setFeaturesCol("keys").transform(df)
    assert out.schema["probability"].dataType == VectorUDT()
    raw, pred = _collect(out, ["rawPrediction", "prediction"])
    margins = np.array([0.5 * 2.0 + 2.0 * -1.0, 0.75 - 1.25 * 0.5, 0.0]) - 0.1
    np.testing.assert_allclose(_vectors(raw)[:, 1], margins, rtol=0, atol=1e-15)
    assert pred == [0.0, 1.0, 0.0]
    ones = model.copy()
    ones.clear(ones.featureValuesCol)
    (raw1,) = _collect(ones.transform(df), ["rawPrediction"])
    np.testing.assert_allclose(_vectors(raw1)[:, 1], [2.5 - 0.1, 0.75 - 1.25 - 0.1, -0.1])
    with pytest.raises(ValueError, match="exceeds the int32 indices"):
        _ = model.coefficients
    small = LogisticRegressionModel.fromCoefficients(Vectors.sparse(10, [2, 7], [1.0, -1.0]))
    assert small.coefficients == SparseVector(10, [2, 7], [1.0, -1.0])
    assert small.coefficientMatrix.toArray().tolist() == [small.coefficients.toArray().tolist()]


# --------------------------------------------------------------------------- summaries


def test_evaluate_summary_equals_mllib(data, mllib_model):
    ours, theirs = _ours_like(mllib_model).evaluate(data), mllib_model.evaluate(data)
    assert isinstance(ours, MLlibBinarySummary)
    for attr in ("areaUnderROC", "accuracy", "weightedPrecision", "weightedRecall",
                 "weightedTruePositiveRate", "weightedFalsePositiveRate"):  # fmt: skip
        assert getattr(ours, attr) == pytest.approx(getattr(theirs, attr), abs=1e-12), attr
    assert ours.weightedFMeasure() == pytest.approx(theirs.weightedFMeasure(), abs=1e-12)
    for attr in ("labels", "precisionByLabel", "recallByLabel", "truePositiveRateByLabel",
                 "falsePositiveRateByLabel"):  # fmt: skip
        np.testing.assert_allclose(getattr(ours, attr), getattr(theirs, attr), atol=1e-12)
    np.testing.assert_allclose(ours.fMeasureByLabel(), theirs.fMeasureByLabel(), atol=1e-12)
    for attr in ("predictionCol", "probabilityCol", "labelCol", "featuresCol", "weightCol"):
        assert getattr(ours, attr) == getattr(theirs, attr), attr
    for curve in ("roc", "pr", "fMeasureByThreshold", "precisionByThreshold"):
        a = np.array(getattr(ours, curve).collect())
        b = np.array(getattr(theirs, curve).collect())
        assert a.shape == b.shape and a.shape[0] > 2, curve
        np.testing.assert_allclose(a, b, atol=1e-12)
    assert ours.recallByThreshold.count() == theirs.recallByThreshold.count()
    assert ours.predictions.columns == theirs.predictions.columns


def test_fit_with_local_trainer_builds_model_and_training_summary(data, mllib_model, local_lbfgs):
    seen = {}

    def spy(prepared, params):
        seen["cols"] = prepared.df.columns
        seen["parts"] = prepared.df.rdd.getNumPartitions()
        seen["params"] = params
        return local_trainer(prepared, params)

    register_trainer("lbfgs", spy)
    lr = LogisticRegression(regParam=0.05, weightCol="weight", numWorkers=2, probabilityCol="")
    model = lr.fit(data)
    assert seen["cols"] == ["features", "label", "weight"] and seen["parts"] == 2
    assert seen["params"]["regParam"] == 0.05 and seen["params"]["solver"] == "lbfgs"
    assert model.uid == lr.uid and model.getWeightCol() == "weight"
    assert model.getProbabilityCol() == ""
    np.testing.assert_allclose(
        model.coefficients.toArray(), mllib_model.coefficients.toArray(), rtol=1e-4, atol=1e-5
    )
    assert model.intercept == pytest.approx(mllib_model.intercept, rel=1e-4, abs=1e-5)
    summary = model.summary
    assert model.hasSummary and isinstance(summary, BinaryLogisticRegressionTrainingSummary)
    history = summary.objectiveHistory
    assert summary.totalIterations > 1 and len(history) >= 2 and history[-1] < history[0]
    assert history[-1] == pytest.approx(mllib_model.summary.objectiveHistory[-1], rel=1e-6)
    assert summary.probabilityCol.startswith("probability_")
    assert summary.areaUnderROC == pytest.approx(mllib_model.summary.areaUnderROC, abs=1e-9)
    assert not LogisticRegressionModel.fromCoefficients([1.0], 0.0).hasSummary
    with pytest.raises(RuntimeError, match="No training summary"):
        _ = LogisticRegressionModel.fromCoefficients([1.0], 0.0).summary


def test_more_workers_than_slots_warns(data, local_lbfgs):
    with pytest.warns(RuntimeWarning, match="numWorkers=3 exceeds the 2 task slots"):
        LogisticRegression(numWorkers=3, maxIter=3).fit(data)


# --------------------------------------------------------------------------- save / load


def test_model_save_load_round_trip_is_exact(tmp_path, data, mllib_model):
    ours = _ours_like(mllib_model).setThresholds([0.3, 0.7])
    ours.set(ours.numShards, 3)
    path = str(tmp_path / "model")
    ours.write().overwrite().save(path)
    ours.write().overwrite().save(path)  # overwrite really overwrites
    back = LogisticRegressionModel.load(path)
    assert type(back) is LogisticRegressionModel and back.uid == ours.uid
    assert back.coefficients == ours.coefficients and back.intercept == ours.intercept
    assert {p.name: v for p, v in back._paramMap.items()} == {
        p.name: v for p, v in ours._paramMap.items()
    }
    assert back.getThresholds() == [0.3, 0.7] and back.getNumShards() == 3
    cols = ["probability", "prediction"]
    assert _collect(back.transform(data), cols) == _collect(ours.transform(data), cols)
    with pytest.raises(Exception, match="already exists"):
        ours.save(path)


def test_sparse_model_and_estimator_round_trip(spark, tmp_path):
    keys = np.array([1, 5, (1 << 35) + 2], dtype=np.int64)
    values = np.array([0.1, -1e-300, np.pi])
    model = LogisticRegressionModel.fromCoefficients(
        values, float("-inf"), keys=keys, numFeatures=1 << 36
    )
    model.save(str(tmp_path / "sparse"))
    back = LogisticRegressionModel.load(str(tmp_path / "sparse"))
    assert np.array_equal(back.coefficientKeys, keys)
    assert np.array_equal(back.coefficientValues, values)
    assert back.intercept == float("-inf") and back.numFeatures == 1 << 36

    bounds = DenseMatrix(1, 2, [-1.0, -2.0])
    lr = LogisticRegression(regParam=0.2, solver="adam", staleness=1, weightCol="w")
    lr.setLowerBoundsOnCoefficients(bounds).setUpperBoundsOnIntercepts(DenseVector([3.0]))
    lr.save(str(tmp_path / "est"))
    lr2 = LogisticRegression.load(str(tmp_path / "est"))
    assert lr2.uid == lr.uid and lr2.extractParamMap() is not None
    assert {p.name: v for p, v in lr2._paramMap.items()} == {
        p.name: v for p, v in lr._paramMap.items()
    }


# --------------------------------------------------------------------------- meta-algorithms


def test_pipeline_crossvalidator_trainvalidationsplit(tmp_path, data, local_lbfgs):
    lr = LogisticRegression(maxIter=50)
    pipeline_model = Pipeline(stages=[lr]).fit(data)
    path = str(tmp_path / "pipeline")
    pipeline_model.save(path)
    reloaded = PipelineModel.load(path)
    assert isinstance(reloaded.stages[0], LogisticRegressionModel)
    cols = ["rawPrediction", "prediction"]
    assert _collect(reloaded.transform(data), cols) == _collect(
        pipeline_model.transform(data), cols
    )

    grid = ParamGridBuilder().addGrid(lr.regParam, [0.01, 0.5]).build()
    evaluator = BinaryClassificationEvaluator()
    cv = CrossValidator(
        estimator=lr, estimatorParamMaps=grid, evaluator=evaluator, numFolds=2, seed=3
    ).fit(data)
    assert len(cv.avgMetrics) == 2 and cv.avgMetrics[0] > 0.6
    assert isinstance(cv.bestModel, LogisticRegressionModel)
    best = grid[int(np.argmax(cv.avgMetrics))][lr.regParam]
    assert cv.bestModel.getRegParam() == best
    assert evaluator.evaluate(cv.transform(data)) > 0.6

    tvs = TrainValidationSplit(
        estimator=lr, estimatorParamMaps=grid, evaluator=evaluator, trainRatio=0.75, seed=3
    ).fit(data)
    assert len(tvs.validationMetrics) == 2
    assert isinstance(tvs.bestModel, LogisticRegressionModel)


def test_training_on_keys_with_values_column(spark, local_lbfgs):
    rows = [(i, [i % 3, 3 + i % 2], [1.0, float(i % 5)], float(i % 2)) for i in range(40)]
    schema = T.StructType(
        [
            T.StructField("id", T.LongType()),
            T.StructField("keys", T.ArrayType(T.LongType())),
            T.StructField("vals", T.ArrayType(T.DoubleType())),
            T.StructField("label", T.DoubleType()),
        ]
    )
    df = spark.createDataFrame(rows, schema)
    model = LogisticRegression(
        featuresCol="keys", featureValuesCol="vals", regParam=0.1, standardization=False
    ).fit(df)
    assert model.numFeatures == 5 and model.getFeatureValuesCol() == "vals"
    assert model.summary.areaUnderROC > 0.5


# --------------------------------------------------------------------------- shared bases


class _SoftmaxToy(ArrowScoring):
    """A 3-class linear softmax model: exercises the generic (MLlib) thresholds rule."""

    def __init__(self, weights: np.ndarray):
        super().__init__()
        self._w = weights

    numClasses = 3  # type: ignore[assignment]
    numFeatures = NUM_FEATURES  # type: ignore[assignment]

    def _scoring_state(self):
        return self._w

    @staticmethod
    def _margins(state, csr):
        return csr.to_dense() @ state

    @staticmethod
    def _raw_to_probability(state, raw):
        e = np.exp(raw - raw.max(axis=1, keepdims=True))
        return e / e.sum(axis=1, keepdims=True)


class _LinearToy(ArrowRegressionScoring):
    """x . w regression through the shared regression base."""

    numFeatures = NUM_FEATURES  # type: ignore[assignment]

    def _scoring_state(self):
        return np.array([1.0, -2.0, 0.5, 3.0])

    @staticmethod
    def _predict_values(state, csr):
        return csr.matvec(state)


def test_shared_bases_generic_thresholds_and_regression(data):
    w = np.arange(12.0).reshape(NUM_FEATURES, 3) / 10 - 0.5
    toy = _SoftmaxToy(w).setThresholds([0.5, 0.0001, 2.0])
    raw, prob, pred, feats = _collect(
        toy.transform(data), ["rawPrediction", "probability", "prediction", "features"]
    )
    x = _vectors(feats)
    p_ref = _SoftmaxToy._raw_to_probability(None, x @ w)
    np.testing.assert_allclose(_vectors(raw), x @ w, atol=1e-12)
    np.testing.assert_allclose(_vectors(prob), p_ref, atol=1e-12)
    expected = np.argmax(p_ref / np.array([0.5, 0.0001, 2.0]), axis=1)
    assert pred == expected.astype(float).tolist() and set(pred) == {1.0}
    toy.setThresholds([0.0, 1.0, 1.0])  # a zero threshold wins outright
    assert set(_collect(toy.transform(data), ["prediction"])[0]) == {0.0}
    assert toy.predict(Vectors.dense([1.0, 0.0, 0.0, 0.0])) == 0.0

    (reg_pred, feats) = _collect(_LinearToy().transform(data), ["prediction", "features"])
    np.testing.assert_allclose(reg_pred, _vectors(feats) @ np.array([1.0, -2.0, 0.5, 3.0]))
    assert _LinearToy().predict(Vectors.sparse(NUM_FEATURES, [3], [2.0])) == 6.0


def test_a_model_copies_given_coefficients_unless_they_are_the_fits_own():
    """`from_coefficients` and the like keep their own copy (the caller may change its
    array later); the estimator hands over its fresh result without a copy."""
    values = np.array([0.5, -1.0, 2.0])
    kept = LogisticRegressionModel()
    kept._set_coefficients(values, 0.1)
    taken = LogisticRegressionModel()
    taken._set_coefficients(values, 0.1, copy=False)
    values[0] = 9.0
    assert kept.coefficients.toArray().tolist() == [0.5, -1.0, 2.0]
    assert taken.coefficients.toArray().tolist() == [9.0, -1.0, 2.0]
    ints = LogisticRegressionModel()  # other dtypes are converted either way
    ints._set_coefficients(np.array([1, 2]), 0.0, copy=False)
    assert ints.coefficients.toArray().dtype == np.float64
