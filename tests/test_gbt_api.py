"""The pyspark.ml shell of spark-ps GBT against MLlib's own GBTClassifier / GBTRegressor.

Models are built from the very trees a fitted MLlib model holds (read node by node through
py4j), so every output (rawPrediction, probability, prediction, leafCol, featureImportances,
toDebugString, evaluateEachIteration) must equal MLlib's. Fitting goes through a local trainer
(``fit_gbt_local`` on the collected rows) registered the way the PS trainer is.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
from pyspark.ml import Pipeline
from pyspark.ml import classification as mllib_clf
from pyspark.ml import regression as mllib_reg
from pyspark.ml.evaluation import BinaryClassificationEvaluator
from pyspark.ml.feature import VectorAssembler
from pyspark.ml.linalg import SparseVector, Vectors
from pyspark.ml.tuning import CrossValidator, ParamGridBuilder

from spark_ps.data import arrow_to_csr
from spark_ps.ml.gbt import (
    GBTClassificationModel,
    GBTClassifier,
    GBTRegressionModel,
    GBTRegressor,
    register_trainer,
)
from spark_ps.ml.tree.local import GBTParams, fit_gbt_local
from spark_ps.ml.tree.tree import TreeArrays

pytestmark = pytest.mark.timeout(240)

N_ROWS, N_FEATURES = 240, 6


# --------------------------------------------------------------------------- helpers


def _rows(seed: int = 0):
    """Mixed dense/sparse rows with weights, a binary label and a real label."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(N_ROWS, N_FEATURES))
    X[rng.random(X.shape) < 0.3] = 0.0
    y = (X[:, 0] + 0.7 * X[:, 1] - 0.5 * X[:, 2] + 0.3 * rng.normal(size=N_ROWS) > 0).astype(float)
    r = 2.0 * X[:, 0] - X[:, 3] ** 2 + 0.1 * rng.normal(size=N_ROWS)
    w = rng.uniform(0.5, 2.0, size=N_ROWS)
    out = []
    for i in range(N_ROWS):
        nz = np.flatnonzero(X[i])
        vec = Vectors.sparse(N_FEATURES, nz, X[i, nz]) if i % 2 else Vectors.dense(X[i])
        out.append((float(y[i]), float(r[i]), float(w[i]), bool(i % 5 == 0), vec))
    return out, X


@pytest.fixture(scope="module")
def data(spark):
    rows, X = _rows()
    df = spark.createDataFrame(rows, ["label", "target", "w", "isVal", "features"]).cache()
    df.count()
    yield df, X
    df.unpersist()


def _to_tree_arrays(jtree) -> TreeArrays:
    """An MLlib tree (JVM object) as TreeArrays, nodes in pre-order (children after parents)."""
    nodes: list[dict] = []

    def walk(node) -> int:
        i = len(nodes)
        nodes.append({})
        rec = {"value": node.prediction(), "impurity": node.impurity()}
        rec["count"] = node.impurityStats().count()
        if node.getClass().getSimpleName() == "InternalNode":
            split = node.split()
            left, right = walk(node.leftChild()), walk(node.rightChild())
            rec.update(feature=split.featureIndex(), threshold=split.threshold(), gain=node.gain())
            rec.update(left=left, right=right)
        else:
            rec.update(feature=-1, threshold=0.0, left=-1, right=-1, gain=-1.0)
        nodes[i] = rec
        return i

    walk(jtree.rootNode())
    return TreeArrays(**{k: np.array([n[k] for n in nodes]) for k in nodes[0]})


def _copy_of(mllib_model, cls):
    """Our model holding MLlib's trees, uids and Params."""
    jtrees = list(mllib_model._call_java("trees"))
    ours = cls(
        trees=[_to_tree_arrays(t) for t in jtrees],
        treeWeights=mllib_model.treeWeights,
        numFeatures=mllib_model.numFeatures,
        uid=mllib_model.uid,
        treeUids=[t.uid() for t in jtrees],
    )
    for p in mllib_model.params:
        if mllib_model.isSet(p) and ours.hasParam(p.name):
            ours._set(**{p.name: mllib_model.getOrDefault(p)})
    return ours


def _matrix(pdf, col: str) -> np.ndarray:
    """A vector column of a pandas frame as a 2-D array."""
    return np.stack([v.toArray() for v in pdf[col]])


def _local_trainer(data, params, validation=None):
    """Collect the prepared rows to the driver and fit with the numpy reference trainer."""

    def load(prepared):
        csr = arrow_to_csr(
            prepared.df.toArrow(), prepared.features_col,
            label_col=prepared.label_col, weight_col=prepared.weight_col,
        )  # fmt: skip
        return csr.to_dense(), csr.labels, csr.weights

    X, y, w = load(data)
    known = {k: v for k, v in params.items() if k in GBTParams.__dataclass_fields__}
    val = load(validation) if validation is not None else None
    trees, weights, history = fit_gbt_local(X, y, w, known, validation=val)
    return trees, weights, X.shape[1], history


@pytest.fixture
def local_trainer():
    previous = register_trainer(_local_trainer)
    yield _local_trainer
    register_trainer(previous)


@pytest.fixture(scope="module")
def mllib_models(data):
    df, _ = data
    clf = mllib_clf.GBTClassifier(maxIter=4, maxDepth=3, weightCol="w", leafCol="leaf", seed=1)
    reg = mllib_reg.GBTRegressor(
        maxIter=3, maxDepth=3, labelCol="target", weightCol="w", leafCol="leaf", seed=1
    )
    return clf.fit(df), reg.fit(df)


# --------------------------------------------------------------------------- Params

#: spark-ps's additions to MLlib's GBT Params
_ADDED = {"numWorkers", "gossTopRate", "gossOtherRate"}


@pytest.mark.parametrize(
    "ours_cls, theirs_cls",
    [
        (GBTClassifier, mllib_clf.GBTClassifier),
        (GBTRegressor, mllib_reg.GBTRegressor),
    ],
)
def test_params_match_mllib(spark, ours_cls, theirs_cls):
    ours, theirs = ours_cls(), theirs_cls()
    for p in theirs.params:
        assert ours.hasParam(p.name), p.name
        q = ours.getParam(p.name)
        assert q.doc == p.doc, p.name
        assert q.typeConverter is p.typeConverter, p.name
        assert ours.hasDefault(p.name) == theirs.hasDefault(p.name), p.name
        if theirs.hasDefault(p.name):
            assert ours.getOrDefault(p.name) == theirs.getOrDefault(p.name), p.name
    assert {p.name for p in ours.params} - {p.name for p in theirs.params} == _ADDED
    for name in dir(theirs):
        if name.startswith(("set", "get")) and callable(getattr(theirs, name)):
            assert callable(getattr(ours, name, None)), name
    assert ours.setMaxDepth(3) is ours and ours.getMaxDepth() == 3
    assert ours.setParams(maxBins=16, numWorkers=1) is ours and ours.getMaxBins() == 16


def test_model_params_match_mllib(mllib_models):
    for theirs, cls in zip(mllib_models, (GBTClassificationModel, GBTRegressionModel), strict=True):
        ours = cls()
        names = {p.name for p in ours.params}
        assert {p.name for p in theirs.params} <= names
        assert names - {p.name for p in theirs.params} == _ADDED


@pytest.mark.parametrize(
    "kwargs, param",
    [
        ({"maxBins": 1}, "maxBins"),
        ({"maxDepth": 31}, "maxDepth"),
        ({"stepSize": 0.0}, "stepSize"),
        ({"stepSize": 1.5}, "stepSize"),
        ({"subsamplingRate": 0.0}, "subsamplingRate"),
        ({"subsamplingRate": 1.1}, "subsamplingRate"),
        ({"minInstancesPerNode": 0}, "minInstancesPerNode"),
        ({"minWeightFractionPerNode": 0.5}, "minWeightFractionPerNode"),
        ({"minInfoGain": -1.0}, "minInfoGain"),
        ({"featureSubsetStrategy": "most"}, "featureSubsetStrategy"),
        ({"impurity": "gini"}, "impurity"),
        ({"lossType": "squared"}, "lossType"),
        ({"maxIter": 0}, "maxIter"),
        ({"validationTol": -0.1}, "validationTol"),
        ({"checkpointInterval": 0}, "checkpointInterval"),
        ({"numWorkers": -1}, "numWorkers"),
        ({"gossTopRate": 1.0}, "gossTopRate"),
        ({"gossOtherRate": 0.0}, "gossOtherRate"),
        ({"thresholds": [0.0, 0.0]}, "thresholds"),
    ],
)
def test_bad_params_rejected_with_their_name(data, local_trainer, kwargs, param):
    df, _ = data
    value = next(iter(kwargs.values()))
    with pytest.raises(
        ValueError, match=rf"parameter {param} given invalid value {re.escape(repr(value))}"
    ):
        GBTClassifier(**kwargs).fit(df)


def test_goss_rates_are_checked_together(data, local_trainer):
    df, _ = data
    with pytest.raises(ValueError, match=r"gossTopRate \+ gossOtherRate given invalid values"):
        GBTClassifier(gossTopRate=0.5, gossOtherRate=0.6).fit(df)
    with pytest.raises(ValueError, match="subsamplingRate given invalid value 0.5 with gossTop"):
        GBTClassifier(gossTopRate=0.2, subsamplingRate=0.5).fit(df)
    est = GBTRegressor().setGossTopRate(0.2).setGossOtherRate(0.3)
    assert (est.getGossTopRate(), est.getGossOtherRate()) == (0.2, 0.3)
    assert GBTClassifier().getGossTopRate() == 0.0  # off unless asked for


def test_regressor_loss_and_good_spellings(data, local_trainer):
    df, _ = data
    with pytest.raises(ValueError, match="parameter lossType given invalid value 'logistic'"):
        GBTRegressor(lossType="logistic", labelCol="target").fit(df)
    ok = GBTClassifier(lossType="Logistic", impurity="Variance", featureSubsetStrategy="0.5")
    ok._validate_params()  # MLlib accepts these case-insensitively / as fractions
    GBTClassifier(featureSubsetStrategy="3")._validate_params()


def test_thresholds_length_must_be_two(data, local_trainer):
    df, _ = data
    with pytest.raises(ValueError, match="numClasses=2, but thresholds has length 3"):
        GBTClassifier(thresholds=[0.2, 0.3, 0.5]).fit(df)


def test_unsupported_params_fail_loudly(data):
    df, _ = data
    previous = register_trainer(_local_trainer, unsupported=("subsamplingRate",))
    try:
        with pytest.raises(ValueError, match=r"subsamplingRate=0\.5 is not supported"):
            GBTClassifier(maxIter=1, subsamplingRate=0.5).fit(df)
        GBTClassifier(maxIter=1, maxDepth=1, subsamplingRate=1.0).fit(df)  # default: fine

        def no_validation(data, params):
            return _local_trainer(data, params)

        register_trainer(no_validation)
        with pytest.raises(ValueError, match="validationIndicatorCol='isVal' is not supported"):
            GBTClassifier(maxIter=1, validationIndicatorCol="isVal").fit(df)
        register_trainer(None)
        with pytest.raises(RuntimeError, match="No GBT trainer is registered"):
            GBTClassifier(maxIter=1).fit(df)
    finally:
        register_trainer(previous)


def test_categorical_metadata_rejected(data, local_trainer):
    df, _ = data
    meta = {"ml_attr": {"attrs": {"nominal": [{"idx": 2, "num_vals": 4}]}, "num_attrs": 6}}
    cat = df.withColumn("features", df["features"].alias("features", metadata=meta))
    with pytest.raises(ValueError, match=r"categorical features .*\(2, 4\)"):
        GBTClassifier(maxIter=1).fit(cat)


@pytest.mark.parametrize(
    "label, weight, message",
    [
        (2.0, 1.0, r"Labels MUST be in \{0, 1\}, but got 2\.0 \(labelCol 'label'\)"),
        (float("nan"), 1.0, "Labels MUST NOT be Null or NaN"),
        (1.0, -1.0, r"Negative or Infinity, but got -1\.0 \(weightCol 'w'; 1 such rows\)"),
        (1.0, float("inf"), r"Weights MUST NOT be Negative or Infinity, but got Infinity"),
    ],
)
def test_bad_labels_and_weights(spark, local_trainer, label, weight, message):
    rows = [(0.0, 1.0, Vectors.dense(0.0)), (label, weight, Vectors.dense(1.0))]
    df = spark.createDataFrame(rows, ["label", "w", "features"])
    with pytest.raises(ValueError, match=message):
        GBTClassifier(maxIter=1, weightCol="w").fit(df)


def test_empty_and_bad_regression_labels(spark, local_trainer):
    rows = [(float("inf"), Vectors.dense(0.0)), (1.0, Vectors.dense(1.0))]
    df = spark.createDataFrame(rows, ["label", "features"])
    with pytest.raises(ValueError, match="Labels MUST NOT be Infinity, but got inf"):
        GBTRegressor(maxIter=1).fit(df)
    with pytest.raises(ValueError, match="requires size of input RDD > 0"):
        GBTRegressor(maxIter=1).fit(df.limit(0))
    rows = [(0.0, False, Vectors.dense(0.0)), (float("nan"), True, Vectors.dense(1.0))]
    df = spark.createDataFrame(rows, ["label", "isVal", "features"])
    with pytest.raises(ValueError, match="Labels MUST NOT be Null or NaN"):  # validation rows too
        GBTRegressor(maxIter=1, validationIndicatorCol="isVal").fit(df)
    with pytest.raises(ValueError, match="requires size of input RDD > 0"):  # no training row
        GBTRegressor(maxIter=1, validationIndicatorCol="isVal").fit(df.where("isVal"))
    with pytest.raises(ValueError, match="'isVal' is true on no row"):  # no validation row
        GBTRegressor(maxIter=1, validationIndicatorCol="isVal").fit(df.where("not isVal"))
    rows = [(float("inf"), False, Vectors.dense(0.0)), (1.0, False, Vectors.dense(1.0))]
    bad = spark.createDataFrame(rows, ["label", "isVal", "features"])
    with pytest.raises(ValueError, match="MUST NOT be Infinity"):  # the rows' error comes first
        GBTRegressor(maxIter=1, validationIndicatorCol="isVal").fit(bad)


# --------------------------------------------------------------------------- MLlib equivalence


def test_classifier_scores_like_mllib(data, mllib_models):
    df, X = data
    theirs = mllib_models[0]
    ours = _copy_of(theirs, GBTClassificationModel)
    a, b = ours.transform(df), theirs.transform(df)
    assert [(f.name, f.dataType) for f in a.schema] == [(f.name, f.dataType) for f in b.schema]
    assert a.schema["leaf"].metadata == b.schema["leaf"].metadata
    a, b = a.toPandas(), b.toPandas()
    for col, tol in (("rawPrediction", 1e-12), ("probability", 1e-12), ("leaf", 0.0)):
        np.testing.assert_allclose(_matrix(a, col), _matrix(b, col), rtol=0, atol=tol)
    np.testing.assert_array_equal(a["prediction"], b["prediction"])
    assert 0 < a["prediction"].sum() < len(a)
    for v in (Vectors.dense(X[3]), Vectors.sparse(N_FEATURES, [0, 4], [-0.3, 2.0])):
        np.testing.assert_allclose(ours.predictRaw(v), theirs.predictRaw(v), rtol=0, atol=1e-12)
        np.testing.assert_allclose(
            ours.predictProbability(v), theirs.predictProbability(v), rtol=0, atol=1e-12
        )
        assert ours.predict(v) == theirs.predict(v)
        assert ours.predictLeaf(v) == theirs.predictLeaf(v)
    ours.setThresholds([0.2, 0.8])
    theirs_t = theirs.copy({theirs.thresholds: [0.2, 0.8]})
    pa_, pb = (m.transform(df).toPandas()["prediction"].to_numpy() for m in (ours, theirs_t))
    np.testing.assert_array_equal(pa_, pb)


def test_classifier_reports_like_mllib(data, mllib_models):
    df, _ = data
    theirs = mllib_models[0]
    ours = _copy_of(theirs, GBTClassificationModel)
    assert ours.toDebugString == theirs.toDebugString
    assert repr(ours) == theirs._call_java("toString")
    fi, fi_ref = ours.featureImportances, theirs.featureImportances
    assert isinstance(fi, SparseVector) and fi.size == fi_ref.size
    np.testing.assert_array_equal(fi.indices, fi_ref.indices)
    np.testing.assert_allclose(fi.values, fi_ref.values, rtol=1e-12)
    assert (ours.getNumTrees, ours.totalNumNodes) == (theirs.getNumTrees, theirs.totalNumNodes)
    assert ours.treeWeights == theirs.treeWeights and ours.numClasses == theirs.numClasses
    for t, u in zip(ours.trees, theirs.trees, strict=True):
        assert (t.numNodes, t.depth) == (u.numNodes, u.depth)
        assert t.toDebugString == u.toDebugString and repr(t) == u._call_java("toString")
        np.testing.assert_allclose(
            t.featureImportances.toArray(), u._call_java("featureImportances").toArray(), 1e-12
        )
    np.testing.assert_allclose(
        ours.evaluateEachIteration(df), theirs.evaluateEachIteration(df), rtol=1e-12
    )


def test_regressor_like_mllib(data, mllib_models):
    df, X = data
    theirs = mllib_models[1]
    ours = _copy_of(theirs, GBTRegressionModel)
    a, b = ours.transform(df), theirs.transform(df)
    assert [(f.name, f.dataType) for f in a.schema] == [(f.name, f.dataType) for f in b.schema]
    a, b = a.toPandas(), b.toPandas()
    np.testing.assert_allclose(a["prediction"], b["prediction"], rtol=0, atol=1e-12)
    np.testing.assert_array_equal(_matrix(a, "leaf"), _matrix(b, "leaf"))
    assert abs(ours.predict(Vectors.dense(X[7])) - theirs.predict(Vectors.dense(X[7]))) < 1e-12
    assert ours.toDebugString == theirs.toDebugString
    np.testing.assert_allclose(
        ours.featureImportances.toArray(), theirs.featureImportances.toArray(), rtol=1e-12
    )
    for loss in ("squared", "absolute"):
        np.testing.assert_allclose(
            ours.evaluateEachIteration(df, loss),
            theirs.evaluateEachIteration(df, loss),
            rtol=1e-12,
        )
    with pytest.raises(ValueError, match="loss given invalid value 'logistic'"):
        ours.evaluateEachIteration(df, "logistic")


def test_trees_are_pyspark_tree_models(data, mllib_models, tmp_path):
    """User code written for MLlib's ensembles (isinstance checks, per-tree transform with
    leafCol/varianceCol, save and pyspark's load) keeps working on our trees."""
    df, X = data
    theirs = mllib_models[1]
    ours = _copy_of(theirs, GBTRegressionModel)
    for t, u in zip(ours.trees, theirs.trees, strict=True):
        assert isinstance(t, mllib_reg.DecisionTreeRegressionModel)
        assert t.uid == u.uid and t.numFeatures == u.numFeatures == N_FEATURES
        assert (t.numNodes, t.depth, t.toDebugString) == (u.numNodes, u.depth, u.toDebugString)
        v = Vectors.dense(X[5])
        assert abs(t.predict(v) - u.predict(v)) < 1e-12 and t.predictLeaf(v) == u.predictLeaf(v)
        np.testing.assert_allclose(
            t.featureImportances.toArray(), u.featureImportances.toArray(), rtol=1e-12
        )
        t.setLeafCol("lf").setVarianceCol("var").setPredictionCol("p")
        u = u.copy({u.leafCol: "lf", u.varianceCol: "var", u.predictionCol: "p"})
        a, b = t.transform(df), u.transform(df)
        assert [(f.name, f.dataType) for f in a.schema] == [(f.name, f.dataType) for f in b.schema]
        assert a.schema["lf"].metadata == b.schema["lf"].metadata
        a, b = a.toPandas(), b.toPandas()
        np.testing.assert_allclose(a["p"], b["p"], rtol=0, atol=1e-12)
        np.testing.assert_allclose(a["var"], b["var"], rtol=1e-12, atol=1e-15)
        np.testing.assert_array_equal(a["lf"], b["lf"])
        assert a["var"].nunique() > 1 and a["lf"].nunique() > 1
        only_var = t.copy({t.leafCol: ""}).transform(df)
        assert "lf" not in only_var.columns and not any("__" in c for c in only_var.columns)
    tree = ours.trees[0].setLeafCol("lf").setVarianceCol("var")
    genuine = tree.toMLlib()
    assert type(genuine) is mllib_reg.DecisionTreeRegressionModel and genuine.uid == tree.uid
    assert genuine.toDebugString == tree.toDebugString
    path = str(tmp_path / "tree")
    tree.save(path)
    back = mllib_reg.DecisionTreeRegressionModel.load(path)
    assert back.uid == tree.uid and back.toDebugString == tree.toDebugString
    assert back.getLeafCol() == "lf" and back.getVarianceCol() == "var"


# --------------------------------------------------------------------------- persistence


def test_save_load_round_trip(data, mllib_models, tmp_path):
    df, _ = data
    for theirs, cls in zip(mllib_models, (GBTClassificationModel, GBTRegressionModel), strict=True):
        ours = _copy_of(theirs, cls).setPredictionCol("pred")
        path = str(tmp_path / cls.__name__)
        ours.save(path)
        back = cls.load(path)
        assert type(back) is cls and back.uid == ours.uid
        assert back.treeArrays == ours.treeArrays and back.treeWeights == ours.treeWeights
        assert back.numFeatures == ours.numFeatures and back.toDebugString == ours.toDebugString
        assert back.extractParamMap() == ours.extractParamMap()
        assert back.getPredictionCol() == "pred" and back.getLeafCol() == "leaf"
        assert back.transform(df).collect() == ours.transform(df).collect()
    est = GBTClassifier(maxDepth=2, numWorkers=1, thresholds=[0.4, 0.6])
    est.save(str(tmp_path / "est"))
    est2 = GBTClassifier.load(str(tmp_path / "est"))
    assert est2.uid == est.uid and est2.extractParamMap() == est.extractParamMap()


# --------------------------------------------------------------------------- fit


def test_fit_matches_local_trainer_and_copies_params(data, local_trainer):
    df, _ = data
    est = GBTClassifier(maxIter=3, maxDepth=2, weightCol="w", leafCol="leaf", stepSize=0.3)
    model = est.fit(df)
    assert isinstance(model, GBTClassificationModel) and model.uid == est.uid
    assert model.getMaxDepth() == 2 and model.getLeafCol() == "leaf" and model.getWeightCol() == "w"
    pdf = df.toPandas()
    X = np.stack([v.toArray() for v in pdf["features"]])
    params = {"maxIter": 3, "maxDepth": 2, "stepSize": 0.3, "lossType": "logistic"}
    params["seed"] = est.getSeed()
    trees, weights, hist = fit_gbt_local(X, pdf["label"].to_numpy(), pdf["w"].to_numpy(), params)
    assert model.treeArrays == trees and model.treeWeights == weights.tolist()
    assert model.lossHistory == hist["train_loss"] and model.numFeatures == N_FEATURES
    out = model.transform(df)
    assert out.columns[-4:] == ["rawPrediction", "probability", "prediction", "leaf"]


def test_regressor_fit_with_validation(data, local_trainer):
    df, _ = data
    est = GBTRegressor(labelCol="target", maxIter=30, maxDepth=2, validationIndicatorCol="isVal")
    model = est.fit(df)
    assert isinstance(model, GBTRegressionModel) and 1 <= model.getNumTrees <= 30
    with pytest.raises(TypeError, match="validationIndicatorCol\\) must be of type boolean"):
        est.copy({est.validationIndicatorCol: "w"}).fit(df)


def test_pipeline_and_cross_validator(spark, local_trainer):
    rows, X = _rows(seed=3)
    df = spark.createDataFrame(
        [(r[0], *map(float, X[i, :3])) for i, r in enumerate(rows)], ["label", "a", "b", "c"]
    )
    assembler = VectorAssembler(inputCols=["a", "b", "c"], outputCol="features")
    gbt = GBTClassifier(maxIter=3, numWorkers=1)
    pipe_model = Pipeline(stages=[assembler, gbt]).fit(df)
    assert isinstance(pipe_model.stages[-1], GBTClassificationModel)
    assert pipe_model.transform(df).select("probability").count() == N_ROWS
    grid = ParamGridBuilder().addGrid(gbt.maxDepth, [1, 3]).build()
    cv = CrossValidator(
        estimator=gbt,
        estimatorParamMaps=grid,
        evaluator=BinaryClassificationEvaluator(),
        numFolds=2,
        seed=7,
    )
    cv_model = cv.fit(assembler.transform(df))
    assert isinstance(cv_model.bestModel, GBTClassificationModel)
    assert len(cv_model.avgMetrics) == 2 and all(0.5 < m <= 1.0 for m in cv_model.avgMetrics)
