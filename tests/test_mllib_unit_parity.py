"""pyspark.ml's own unit tests for the estimators we replace, in our words, against MLlib.

Spark's ``python/pyspark/ml/tests/test_classification.py`` / ``test_regression.py`` check
each estimator on a four-row weighted dataset: Params, the fitted model's numbers, per-row
predictions, output columns, summaries, save/load. Here each check is made against MLlib's
own estimator fitted on the same data in the same run, rather than against numbers
written down, so the tests say "same as MLlib" and stay true across Spark versions.
"""

from __future__ import annotations

import numpy as np
import pytest
from pyspark.ml import classification as mllib_clf
from pyspark.ml.linalg import Vectors
from pyspark.sql import DataFrame

from spark_ps.ml import classification as ours_clf


@pytest.fixture(scope="module")
def four(spark):
    """The four weighted rows of pyspark's tests, one partition in weight order."""
    return (
        spark.createDataFrame(
            [
                (1.0, 1.0, Vectors.dense(0.0, 5.0)),
                (0.0, 2.0, Vectors.dense(1.0, 2.0)),
                (1.0, 3.0, Vectors.dense(2.0, 1.0)),
                (0.0, 4.0, Vectors.dense(3.0, 3.0)),
            ],
            ["label", "weight", "features"],
        )
        .coalesce(1)
        .sortWithinPartitions("weight")
    )


VEC = Vectors.dense(0.0, 5.0)


def _round_trip(est, model, tmp_path, est_cls, model_cls) -> None:
    """Estimator and model survive write().overwrite().save / load with the same string."""
    d = str(tmp_path / type(est).__name__)
    est.write().overwrite().save(d)
    assert str(est_cls.load(d)) == str(est)
    model.write().overwrite().save(d)
    back = model_cls.load(d)
    assert str(back) == str(model)
    return back


def test_logistic_regression_threshold(four):
    """Moving the threshold moves predictions exactly as MLlib's (0, 0.5, 1 and between)."""
    ours = ours_clf.LogisticRegression(weightCol="weight").fit(four)
    theirs = mllib_clf.LogisticRegression(weightCol="weight").fit(four)
    for t in [0.0, 0.1, 0.2, 0.5, 1.0]:
        got = [r.prediction for r in ours.setThreshold(t).transform(four).collect()]
        want = [r.prediction for r in theirs.setThreshold(t).transform(four).collect()]
        assert got == want, t
        assert ours.predict(VEC) == theirs.predict(VEC)
    assert [r.prediction for r in ours.setThreshold(0.5).transform(four).collect()] == [
        0.0,
        1.0,
        1.0,
        0.0,
    ]


def test_binary_logistic_regression_summary(spark):
    df = spark.createDataFrame(
        [(1.0, 2.0, Vectors.dense(1.0)), (0.0, 2.0, Vectors.sparse(1, [], []))],
        ["label", "weight", "features"],
    )
    params = dict(maxIter=5, regParam=0.01, weightCol="weight", fitIntercept=False)
    est = ours_clf.LogisticRegression(**params)
    model = est.fit(df)
    ref = mllib_clf.LogisticRegression(**params).fit(df)
    assert model.uid == est.uid and model.hasSummary
    s, r = model.summary, ref.summary
    assert isinstance(s.predictions, DataFrame)
    assert (s.probabilityCol, s.labelCol, s.featuresCol, s.predictionCol) == (
        r.probabilityCol,
        r.labelCol,
        r.featuresCol,
        r.predictionCol,
    )
    assert isinstance(s.objectiveHistory[0], float) and s.totalIterations > 0
    np.testing.assert_allclose(s.objectiveHistory, r.objectiveHistory, rtol=1e-9)
    for name in (
        "labels",
        "truePositiveRateByLabel",
        "falsePositiveRateByLabel",
        "precisionByLabel",
        "recallByLabel",
    ):
        np.testing.assert_allclose(getattr(s, name), getattr(r, name), rtol=1e-12, err_msg=name)
    np.testing.assert_allclose(s.fMeasureByLabel(), r.fMeasureByLabel(), rtol=1e-12)
    np.testing.assert_allclose(s.fMeasureByLabel(1.0), r.fMeasureByLabel(1.0), rtol=1e-12)
    for name in (
        "areaUnderROC",
        "accuracy",
        "weightedTruePositiveRate",
        "weightedFalsePositiveRate",
        "weightedRecall",
        "weightedPrecision",
    ):
        assert getattr(s, name) == pytest.approx(getattr(r, name), rel=1e-12), name
    assert s.weightedFMeasure() == pytest.approx(r.weightedFMeasure(), rel=1e-12)
    for name in ("roc", "pr", "fMeasureByThreshold", "precisionByThreshold", "recallByThreshold"):
        a = np.array(getattr(s, name).toPandas().to_numpy(), dtype=float)
        b = np.array(getattr(r, name).toPandas().to_numpy(), dtype=float)
        np.testing.assert_allclose(a, b, rtol=1e-9, err_msg=name)
    same = model.evaluate(df)
    assert isinstance(same, ours_clf.BinaryLogisticRegressionSummary)
    assert same.areaUnderROC == pytest.approx(s.areaUnderROC)


def test_gbt_classifier(four, tmp_path):
    params = dict(maxIter=3, maxDepth=2, labelCol="label", leafCol="leaf", seed=1)
    est = ours_clf.GBTClassifier(**params)
    assert (est.getMaxIter(), est.getMaxDepth(), est.getSeed(), est.getLeafCol()) == (
        3,
        2,
        1,
        "leaf",
    )
    model = est.fit(four)
    ref = mllib_clf.GBTClassifier(**params).fit(four)
    assert model.uid == est.uid
    assert (model.numClasses, model.numFeatures) == (ref.numClasses, ref.numFeatures)
    assert model.treeWeights == ref.treeWeights and model.totalNumNodes == ref.totalNumNodes
    np.testing.assert_allclose(
        model.featureImportances.toArray(), ref.featureImportances.toArray(), atol=1e-12
    )
    assert model.toDebugString.split("\n", 1)[1] == ref.toDebugString.split("\n", 1)[1]
    assert model.predict(VEC) == ref.predict(VEC)
    np.testing.assert_allclose(model.predictRaw(VEC), ref.predictRaw(VEC), atol=1e-12)
    np.testing.assert_allclose(
        model.predictProbability(VEC), ref.predictProbability(VEC), atol=1e-12
    )
    assert model.predictLeaf(VEC) == ref.predictLeaf(VEC)
    np.testing.assert_allclose(
        model.evaluateEachIteration(four), ref.evaluateEachIteration(four), rtol=1e-12
    )
    assert model.transform(four).columns == ref.transform(four).columns
    trees, ref_trees = model.trees, ref.trees
    assert len(trees) == len(ref_trees) == 3
    for tree, ref_tree in zip(trees, ref_trees, strict=True):
        assert isinstance(tree, type(ref_tree))
        assert tree.predict(VEC) == pytest.approx(ref_tree.predict(VEC), abs=1e-12)
        assert tree.transform(four).columns == ref_tree.transform(four).columns
        assert tree.transform(four).count() == 4
    back = _round_trip(
        est, model, tmp_path, ours_clf.GBTClassifier, ours_clf.GBTClassificationModel
    )
    assert back.toDebugString == model.toDebugString


def test_linear_svc(four, tmp_path):
    from spark_ps.ml.classification import LinearSVC, LinearSVCModel

    est = LinearSVC(maxIter=1, regParam=1.0)
    assert (est.getMaxIter(), est.getRegParam()) == (1, 1.0)
    model = est.fit(four)
    ref = mllib_clf.LinearSVC(maxIter=1, regParam=1.0).fit(four)
    assert model.uid == est.uid
    assert (model.numClasses, model.numFeatures) == (ref.numClasses, ref.numFeatures) == (2, 2)
    assert model.intercept == pytest.approx(ref.intercept, rel=1e-9, abs=1e-12)
    np.testing.assert_allclose(model.coefficients, ref.coefficients, rtol=1e-9, atol=1e-12)
    assert model.predict(VEC) == ref.predict(VEC)
    np.testing.assert_allclose(model.predictRaw(VEC), ref.predictRaw(VEC), rtol=1e-9)
    assert model.transform(four).columns == ref.transform(four).columns
    s, r = model.summary(), ref.summary()
    assert (s.labels, s.accuracy, s.areaUnderROC) == (r.labels, r.accuracy, r.areaUnderROC)
    assert s.predictions.columns == r.predictions.columns
    s2, r2 = model.evaluate(four), ref.evaluate(four)
    assert isinstance(s, mllib_clf.LinearSVCTrainingSummary)
    assert isinstance(s2, mllib_clf.LinearSVCSummary)
    assert not isinstance(s2, mllib_clf.LinearSVCTrainingSummary)
    assert (s2.accuracy, s2.areaUnderROC) == (r2.accuracy, r2.areaUnderROC)
    _round_trip(est, model, tmp_path, LinearSVC, LinearSVCModel)


@pytest.mark.parametrize("solver", ["normal", "l-bfgs"])
def test_linear_regression(spark, tmp_path, solver):
    """pyspark's test_linear_regression (solver='normal'); our 'normal' runs L-BFGS to MLlib's
    closed-form optimum, and its summary has the normal equations' statistics
    (coefficientStandardErrors, tValues, pValues), compared to 1e-6 relative."""
    from pyspark.ml import regression as mllib_reg

    from spark_ps.ml.regression import LinearRegression, LinearRegressionModel

    df = (
        spark.createDataFrame(
            [
                (1.0, 1.0, Vectors.dense(0.0, 5.0)),
                (0.0, 2.0, Vectors.dense(1.0, 2.0)),
                (1.5, 3.0, Vectors.dense(2.0, 1.0)),
                (0.7, 4.0, Vectors.dense(1.5, 3.0)),
            ],
            ["label", "weight", "features"],
        )
        .coalesce(1)
        .sortWithinPartitions("weight")
    )
    params = dict(regParam=0.0, maxIter=2, solver=solver, weightCol="weight")
    est = LinearRegression(**params)
    model = est.fit(df)
    ref = mllib_reg.LinearRegression(**params).fit(df)
    assert model.numFeatures == ref.numFeatures == 2
    assert model.scale == pytest.approx(ref.scale)
    assert model.intercept == pytest.approx(ref.intercept, rel=1e-6, abs=1e-9)
    np.testing.assert_allclose(model.coefficients, ref.coefficients, rtol=1e-6, atol=1e-9)
    assert model.predict(VEC) == pytest.approx(ref.predict(VEC), rel=1e-6, abs=1e-9)
    assert model.transform(df).columns == ref.transform(df).columns
    s, r = model.summary, ref.summary
    assert s.predictions.columns == r.predictions.columns
    assert s.residuals.columns == r.residuals.columns == ["residuals"]
    assert (s.degreesOfFreedom, s.numInstances) == (r.degreesOfFreedom, r.numInstances)
    for name in (
        "explainedVariance",
        "meanAbsoluteError",
        "meanSquaredError",
        "rootMeanSquaredError",
        "r2",
        "r2adj",
    ):
        assert getattr(s, name) == pytest.approx(getattr(r, name), rel=1e-6, abs=1e-9), name
    np.testing.assert_allclose(s.devianceResiduals, r.devianceResiduals, rtol=1e-6, atol=1e-9)
    if solver == "normal":  # closed form in MLlib: no iterations, whatever maxIter says
        assert s.objectiveHistory == r.objectiveHistory == [0.0]
        assert s.totalIterations == r.totalIterations == 0
        for name in ("coefficientStandardErrors", "tValues", "pValues"):
            np.testing.assert_allclose(getattr(s, name), getattr(r, name), rtol=1e-6, err_msg=name)
    s2 = model.evaluate(df)
    assert s2.rootMeanSquaredError == pytest.approx(s.rootMeanSquaredError, rel=1e-12)
    _round_trip(est, model, tmp_path, LinearRegression, LinearRegressionModel)


@pytest.fixture(scope="module")
def fm_four(spark):
    """pyspark's FMRegressor test rows: two features, one partition in index order."""
    return (
        spark.createDataFrame(
            [
                (1, 1.0, Vectors.dense(0.0, 0.0)),
                (2, 1.0, Vectors.dense(1.0, 2.0)),
                (3, 2.0, Vectors.dense(0.0, 0.0)),
                (4, 2.0, Vectors.dense(1.0, 1.0)),
            ],
            ["index", "label", "features"],
        )
        .coalesce(1)
        .sortWithinPartitions("index")
        .select("label", "features")
    )


def test_fm_regressor(fm_four, tmp_path):
    """pyspark's test_factorization_machine (FMRegressor, factorSize=2, maxIter=1,
    regParam=1.0, seed=1, adamW with stepSize 1.0), against MLlib.

    One adamW step moves every coordinate by stepSize * g / (|g| + eps), i.e. by +-1 up to
    ~1e-8. The intercept and linear weights start at 0 and their gradients' signs do not
    depend on the ~0.01 random factors, so they equal MLlib's whatever the start; so does
    the prediction of (0, 5), which has no pair of non-zero features. The factors' signs are
    the signs of their gradients, which depend on the random start: ours is drawn from the
    key (the PS's lazy rows), MLlib's from its generator, so from our own start the factors
    equal MLlib's in magnitude only; started from MLlib's initial factors (MLlib's own fit
    with maxIter=0) every number and prediction equals MLlib's."""
    from pyspark.ml import regression as mllib_reg

    from spark_ps.ml.regression import FMRegressionModel, FMRegressor

    params = dict(factorSize=2, maxIter=1, regParam=1.0, seed=1)
    fm = FMRegressor(**params)
    assert (fm.getFactorSize(), fm.getMaxIter(), fm.getRegParam(), fm.getSeed()) == (2, 1, 1.0, 1)
    model = fm.fit(fm_four)
    ref = mllib_reg.FMRegressor(**params).fit(fm_four)
    assert model.uid == fm.uid and model.numFeatures == ref.numFeatures == 2
    assert model.intercept == pytest.approx(ref.intercept, abs=1e-4)
    np.testing.assert_allclose(model.linear.toArray(), ref.linear.toArray(), atol=1e-4)
    ours_f, ref_f = model.factors.toArray(), ref.factors.toArray()
    np.testing.assert_allclose(np.abs(ours_f), np.abs(ref_f), atol=1e-4)
    assert np.abs(ref_f).min() > 0.99  # every factor took its full step
    assert model.predict(VEC) == pytest.approx(ref.predict(VEC), abs=1e-4)
    assert model.transform(fm_four).columns == ref.transform(fm_four).columns
    assert model.transform(fm_four).count() == 4

    same = FMRegressor(**params)
    same._initial_factors = mllib_reg.FMRegressor(**{**params, "maxIter": 0}).fit(fm_four).factors
    same._initial_factors = same._initial_factors.toArray()
    from_mllib = same.fit(fm_four)
    np.testing.assert_allclose(from_mllib.factors.toArray(), ref_f, rtol=1e-8, atol=1e-12)

    def predictions(m):
        return np.array([r.prediction for r in m.transform(fm_four).collect()])

    np.testing.assert_allclose(predictions(from_mllib), predictions(ref), rtol=1e-8, atol=1e-12)
    _round_trip(fm, model, tmp_path, FMRegressor, FMRegressionModel)


def test_fm_classification_summary(spark):
    """pyspark's test_fm_classification_summary (FMClassifier(maxIter=5) on four rows of one
    feature), against MLlib. With one feature no row has a pair of non-zero features, so the
    random factors never enter a prediction or a gradient: the fit is MLlib's whatever the
    start, to summation-order rounding (1e-9), and so is every summary number."""
    df = spark.createDataFrame(
        [
            (1.0, Vectors.dense(2.0)),
            (0.0, Vectors.dense(2.0)),
            (0.0, Vectors.dense(6.0)),
            (1.0, Vectors.dense(3.0)),
        ],
        ["label", "features"],
    ).coalesce(1)
    model = ours_clf.FMClassifier(maxIter=5).fit(df)
    ref = mllib_clf.FMClassifier(maxIter=5).fit(df)
    assert model.hasSummary
    s, r = model.summary(), ref.summary()
    assert isinstance(s.predictions, DataFrame)
    assert (s.scoreCol, s.labelCol, s.predictionCol) == ("probability", "label", "prediction")
    assert isinstance(s.objectiveHistory, list) and isinstance(s.objectiveHistory[0], float)
    np.testing.assert_allclose(s.objectiveHistory, r.objectiveHistory, rtol=1e-9)
    assert s.totalIterations == r.totalIterations > 0
    assert s.labels == r.labels
    for name in (
        "truePositiveRateByLabel",
        "falsePositiveRateByLabel",
        "precisionByLabel",
        "recallByLabel",
    ):
        np.testing.assert_allclose(getattr(s, name), getattr(r, name), rtol=1e-9, err_msg=name)
    for name in ("accuracy", "weightedPrecision", "weightedRecall", "areaUnderROC"):
        assert getattr(s, name) == pytest.approx(getattr(r, name), rel=1e-9), name
    assert model.intercept == pytest.approx(ref.intercept, rel=1e-9)
    np.testing.assert_allclose(model.linear.toArray(), ref.linear.toArray(), rtol=1e-9)
    same = model.evaluate(df)
    assert same.accuracy == pytest.approx(s.accuracy, rel=1e-12)
