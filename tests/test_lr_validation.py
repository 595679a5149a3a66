"""LogisticRegression's ``validationIndicatorCol``: the flagged rows are held out of the fit
(the model is the fit of the other rows alone, ours and MLlib's), and their binned AUC after
each iteration is on the training summary, close to the exact AUC of the final model."""

from __future__ import annotations

import numpy as np
import pytest
from pyspark.ml.classification import LogisticRegression as MLlibLR
from pyspark.ml.linalg import Vectors

from spark_ps.ml.binned_metrics import NUM_BINS, binned_auc
from spark_ps.ml.classification import LogisticRegression


def _compare(ours, ref, rel=1e-6):
    """test_lr_fit's tolerance: coefficient vectors within `rel` in norm, intercepts alike."""
    a, b = ours.coefficients.toArray(), ref.coefficients.toArray()
    assert np.linalg.norm(a - b) <= rel * max(np.linalg.norm(b), 1e-12), (a, b)
    assert ours.intercept == pytest.approx(ref.intercept, rel=rel, abs=1e-9)


def _dense_df(spark, n=2000, d=10, seed=7):
    """Weighted dense rows, a quarter flagged for validation; the validation rows are
    shifted and relabelled so that training on them would move the model visibly."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d)) * rng.uniform(0.2, 4.0, d) + rng.normal(size=d)
    beta = rng.normal(size=d)
    y = (rng.uniform(size=n) < 1 / (1 + np.exp(-0.5 * (X @ beta)))).astype(float)
    w = rng.uniform(0.2, 3.0, n)
    val = rng.uniform(size=n) < 0.25
    X[val] += 2.0
    y[val & (rng.uniform(size=n) < 0.2)] = 1.0
    rows = [(float(y[i]), float(w[i]), Vectors.dense(X[i]), bool(val[i])) for i in range(n)]
    return spark.createDataFrame(rows, ["label", "weight", "features", "isVal"]).cache()


def _binned_and_exact(model, vdf):
    """(binned AUC, exact weighted AUC, half the weighted share of positive/negative pairs
    in a common bin) of `model`'s P(y=1) on `vdf`: the binned AUC counts those pairs half,
    the exact one 0 or 1, so they differ by at most that bound."""
    from pyspark.ml.evaluation import BinaryClassificationEvaluator
    from pyspark.ml.functions import vector_to_array

    scored = model.transform(vdf)
    t = scored.select("label", "weight", vector_to_array("probability")[1].alias("p"))
    arrow = t.toArrow()
    y, w, p1 = (arrow.column(c).to_numpy() for c in ("label", "weight", "p"))
    bins = np.minimum((p1 * NUM_BINS).astype(np.int64), NUM_BINS - 1)
    pos, neg = (np.bincount(bins, weights=w * (y == c), minlength=NUM_BINS) for c in (1.0, 0.0))
    exact = BinaryClassificationEvaluator(
        rawPredictionCol="probability", weightCol="weight", numBins=0
    ).evaluate(scored)
    ties = float(np.dot(pos, neg) / (pos.sum() * neg.sum()))
    return binned_auc(pos, neg), exact, 0.5 * ties


def test_validation_rows_are_held_out_and_scored_each_iteration(spark_ps):
    spark, _ = spark_ps
    df = _dense_df(spark)
    train, vdf = df.filter("not isVal"), df.filter("isVal")
    params = dict(maxIter=100, tol=1e-10, regParam=0.01, weightCol="weight")
    ours = LogisticRegression(validationIndicatorCol="isVal", **params).fit(df)
    alone = LogisticRegression(**params).fit(train)
    ref = MLlibLR(**params).fit(train)
    _compare(ours, alone)
    _compare(ours, ref)
    s = ours.summary
    assert s.totalIterations == ref.summary.totalIterations
    np.testing.assert_allclose(s.objectiveHistory, ref.summary.objectiveHistory, rtol=1e-8)
    # the training summary is over the training rows only, as MLlib's on `train`
    assert s.areaUnderROC == pytest.approx(ref.summary.areaUnderROC, abs=1e-9)
    # had the validation rows trained, the shifted/relabelled rows would move the model
    everything = MLlibLR(**params).fit(df)
    a, b = everything.coefficients.toArray(), ref.coefficients.toArray()
    assert np.linalg.norm(a - b) > 1e-3 * np.linalg.norm(b)

    aucs = s.validationAucHistory
    assert len(aucs) == s.totalIterations > 3
    assert all(0.0 <= v <= 1.0 for v in aucs)
    assert alone.summary.validationAucHistory == []
    binned, exact, bound = _binned_and_exact(ours, vdf)
    # the workers' histograms at the last iterate are the final model's, binned alike
    assert aucs[-1] == pytest.approx(binned, rel=1e-9)
    assert abs(aucs[-1] - exact) <= bound + 1e-12
    assert 0.6 < exact < 1.0 and bound < 0.01


def _sparse_df(spark, n=1600, d=70_000, seed=3):
    """Sparse vectors beyond 2**16 features (the keys are numbered on the PS); validation
    rows also touch 5 features no training row has."""
    rng = np.random.default_rng(seed)
    used = rng.choice(d - 10, size=300, replace=False)
    only_val = np.arange(d - 5, d)
    beta = rng.normal(size=d)
    rows = []
    for i in range(n):
        val = i % 4 == 0
        idx = np.unique(rng.choice(used, size=8, replace=False))
        if val and i % 8 == 0:
            idx = np.concatenate([idx, rng.choice(only_val, size=2, replace=False)])
        v = rng.uniform(0.5, 2.0, idx.size)
        y = float(rng.uniform() < 1 / (1 + np.exp(-(beta[idx] @ v))))
        order = np.argsort(idx)
        sv = Vectors.sparse(d, idx[order].tolist(), v[order].tolist())
        rows.append((y, 1.0, sv, val))
    return spark.createDataFrame(rows, ["label", "weight", "features", "isVal"]).cache(), only_val


def test_keys_only_validation_rows_touch_stay_out_of_the_model_owlqn(spark_ps):
    spark, _ = spark_ps
    df, only_val = _sparse_df(spark)
    train = df.filter("not isVal")
    params = dict(maxIter=100, tol=1e-10, regParam=0.01, elasticNetParam=0.3)
    ours = LogisticRegression(validationIndicatorCol="isVal", **params).fit(df)
    ref = MLlibLR(**params).fit(train)
    _compare(ours, ref, rel=1e-5)  # test_lr_fit's tolerance for sparse OWL-QN fits
    assert ours.numFeatures == ref.numFeatures
    assert not ours.coefficients.toArray()[only_val].any()
    aucs = ours.summary.validationAucHistory
    assert len(aucs) == ours.summary.totalIterations and all(0.0 <= v <= 1.0 for v in aucs)
    binned, exact, bound = _binned_and_exact(ours, df.filter("isVal"))
    assert aucs[-1] == pytest.approx(binned, rel=1e-9)
    assert abs(aucs[-1] - exact) <= bound + 1e-12


def test_keys_column_numbers_features_from_the_training_rows(spark_ps):
    """array<bigint> keys: a key only validation rows hold (beyond every training key) is
    scored but is not in the model, whose numFeatures is the training rows' largest key + 1."""
    spark, _ = spark_ps
    rng = np.random.default_rng(11)
    rows = []
    for i in range(1200):
        keys = np.unique(rng.integers(0, 400, size=6)) + (1 << 33)
        val = i % 5 == 0
        if val:
            keys = np.append(keys, (1 << 34) + i)  # beyond every training key
        y = float(rng.uniform() < 1 / (1 + np.exp(-(keys % 7 - 3).sum() / 6)))
        rows.append((y, keys.tolist(), val))
    df = spark.createDataFrame(rows, "label double, keys array<bigint>, isVal boolean").cache()
    params = dict(featuresCol="keys", maxIter=50, tol=1e-10, regParam=0.01)
    ours = LogisticRegression(validationIndicatorCol="isVal", **params).fit(df)
    alone = LogisticRegression(**params).fit(df.filter("not isVal"))
    assert ours.numFeatures == alone.numFeatures < 1 << 34
    np.testing.assert_array_equal(ours.coefficientKeys, alone.coefficientKeys)
    a, b = ours.coefficientValues, alone.coefficientValues
    assert np.linalg.norm(a - b) <= 1e-6 * np.linalg.norm(b)
    assert ours.intercept == pytest.approx(alone.intercept, rel=1e-6, abs=1e-9)
    aucs = ours.summary.validationAucHistory
    assert len(aucs) == ours.summary.totalIterations and 0.5 < aucs[-1] <= 1.0


def test_bad_validation_columns_and_unsupported_fits_are_refused(spark_ps):
    spark, _ = spark_ps
    rows = [(float(i % 2), Vectors.dense([i % 3, i % 5]), i % 4 == 0, i % 3) for i in range(60)]
    df = spark.createDataFrame(rows, ["label", "features", "isVal", "three"])
    with pytest.raises(
        ValueError, match=r"Column 'nope' \(validationIndicatorCol\) does not exist"
    ):
        LogisticRegression(validationIndicatorCol="nope").fit(df)
    with pytest.raises(
        TypeError, match=r"Column 'three' \(validationIndicatorCol\) must be of type boolean"
    ):
        LogisticRegression(validationIndicatorCol="three").fit(df)
    with pytest.raises(ValueError, match=r"supported by the binomial L-BFGS fit.*solver='sgd'"):
        LogisticRegression(validationIndicatorCol="isVal", solver="sgd").fit(df)
    multi = df.withColumn("label", df["three"].cast("double"))
    with pytest.raises(ValueError, match=r"binomial L-BFGS fit.*multinomial fit \(3 classes\)"):
        LogisticRegression(validationIndicatorCol="isVal").fit(multi)
    # a validation label the training rows' classes do not cover cannot be scored
    from pyspark.sql import functions as F

    odd = df.withColumn(
        "label", F.when(F.col("isVal") & (F.col("three") == 2), 2.0).otherwise(F.col("label"))
    )
    with pytest.raises(ValueError, match=r"validation row \(column 'isVal'.*has label 2.0"):
        LogisticRegression(validationIndicatorCol="isVal").fit(odd)
    # a column true on no row: refused, not a fit whose every validation AUC is NaN; from
    # the workers' label counts (a fit) and from the estimator's own Spark job alike
    none = df.where(~F.col("isVal"))
    with pytest.raises(ValueError, match=r"validationIndicatorCol 'isVal' is true on no row"):
        LogisticRegression(validationIndicatorCol="isVal").fit(none)
    est = LogisticRegression(validationIndicatorCol="isVal")
    counts = est._check_labels(none, "isVal")
    assert counts["vmax"] is None and counts["n"] == none.count()
    with pytest.raises(ValueError, match=r"validationIndicatorCol 'isVal' is true on no row"):
        est._decide(counts, 0, "isVal")


def test_bound_constrained_fit_holds_validation_rows_out_too(spark_ps):
    """L-BFGS-B (bounds) evaluates through the same rounds: the same held-out fit, the
    same per-iteration AUC."""
    from pyspark.ml.linalg import Matrices

    spark, _ = spark_ps
    rng = np.random.default_rng(4)
    X = rng.normal(size=(600, 4)) * np.array([1.0, 3.0, 0.5, 2.0]) + 0.7
    y = (rng.random(600) < 1 / (1 + np.exp(-(X @ [1.5, -0.8, 2.0, 0.3] - 0.4)))).astype(float)
    val = rng.random(600) < 0.3
    y[val] = 1.0 - y[val]  # held-out rows that would pull the fit the other way
    rows = [(float(y[i]), Vectors.dense(X[i]), bool(val[i])) for i in range(600)]
    df = spark.createDataFrame(rows, ["label", "features", "isVal"]).cache()
    params = dict(regParam=0.01, lowerBoundsOnCoefficients=Matrices.dense(1, 4, [0.0] * 4))
    ours = LogisticRegression(validationIndicatorCol="isVal", **params).fit(df)
    alone = LogisticRegression(**params).fit(df.filter("not isVal"))
    _compare(ours, alone)
    assert ours.coefficients[1] == 0.0  # on its bound
    aucs = ours.summary.validationAucHistory
    assert len(aucs) == ours.summary.totalIterations >= 2
    assert aucs[-1] < 0.5  # the held-out rows' labels are flipped: the ranking is reversed
