"""FMClassifier / FMRegressor on the PS against MLlib's, on the same data: real Spark
(local[2]), real PS shards.

MLlib draws its initial factors from its own generator, so the exact comparisons start both
from the same point: MLlib's fit with maxIter=0 returns its initial factors, which our fit
takes as its starting rows. From there both run MLlib's iteration (full batch), and the
factors, linear weights, intercept and objective history agree to summation-order rounding
(rtol 1e-8 after a few steps of relative size ~1e-1: every step is a contraction of smooth
functions of sums of ~10^3 terms, each rounding at ~1e-16).
"""

from __future__ import annotations

import time

import numpy as np
import pytest
from pyspark.ml import classification as mc
from pyspark.ml import regression as mr
from pyspark.ml.functions import vector_to_array
from pyspark.ml.linalg import Vectors

from bench.common import auc
from ps_server.shard.storage import init_values
from spark_ps.ml.classification import FMClassificationModel, FMClassifier
from spark_ps.ml.regression import FMRegressionModel, FMRegressor
from spark_ps.models import PSEmbedding

pytestmark = pytest.mark.timeout(300)

NF, K = 14, 4


def _data(spark, n: int, seed: int, classify: bool, unseen: int = 0, parts: int = 2):
    """Sparse rows over NF features, from a planted FM; the last `unseen` features appear
    in no row (features a model holds but never trained)."""
    rng = np.random.default_rng(seed)
    used = NF - unseen
    v = rng.normal(scale=0.5, size=(NF, K))
    w = rng.normal(size=NF)
    rows, X = [], np.zeros((n, NF))
    for i in range(n):
        idx = np.sort(rng.choice(used, size=4, replace=False))
        X[i, idx] = rng.uniform(0.5, 1.5, size=4)
    xv = X @ v
    raw = 0.3 + X @ w + 0.5 * ((xv**2).sum(1) - ((X**2) @ (v**2)).sum(1))
    y = (raw + rng.normal(scale=0.5, size=n) > np.median(raw)).astype(float) if classify else raw
    for i in range(n):
        idx = np.flatnonzero(X[i])
        rows.append((float(y[i]), Vectors.sparse(NF, idx.tolist(), X[i, idx].tolist())))
    return spark.createDataFrame(rows, ["label", "features"]).repartition(parts).cache()


def _factors(model) -> np.ndarray:
    return model.factors.toArray()


def _start_from_mllib(mllib_cls, ours, df, **params):
    """(our fitted model, MLlib's, the initial factors) from MLlib's start, same Params."""
    init = _factors(mllib_cls(**{**params, "maxIter": 0}).fit(df))
    ours._initial_factors = init
    return ours.fit(df), mllib_cls(**params).fit(df), init


def _assert_same_model(got, want, rtol=1e-8):
    np.testing.assert_allclose(_factors(got), _factors(want), rtol=rtol, atol=1e-12)
    np.testing.assert_allclose(got.linear.toArray(), want.linear.toArray(), rtol=rtol, atol=1e-12)
    np.testing.assert_allclose(got.intercept, want.intercept, rtol=rtol, atol=1e-12)


@pytest.mark.parametrize("solver,reg", [("gd", 0.01), ("adamW", 0.001)])
def test_classifier_steps_are_mllibs_from_the_same_start(spark_ps, solver, reg):
    spark, _ = spark_ps
    df = _data(spark, 400, 1, classify=True)
    params = dict(
        solver=solver, maxIter=5, stepSize=0.5, regParam=reg, factorSize=K, seed=11, tol=0.0
    )
    got, want, init = _start_from_mllib(mc.FMClassifier, FMClassifier(**params), df, **params)
    _assert_same_model(got, want)
    np.testing.assert_allclose(
        got.objectiveHistory, want.summary().objectiveHistory, rtol=1e-9, atol=0
    )
    assert len(got.objectiveHistory) == 6  # maxIter + 1, as MLlib 4.3 (see trainer)
    ours, theirs = got.summary(), want.summary()
    assert isinstance(ours, mc.FMClassificationTrainingSummary)
    np.testing.assert_allclose(ours.objectiveHistory, theirs.objectiveHistory, rtol=1e-9)
    assert ours.totalIterations == theirs.totalIterations
    for metric in ("areaUnderROC", "accuracy", "weightedPrecision"):
        np.testing.assert_allclose(getattr(ours, metric), getattr(theirs, metric), rtol=1e-9)
    np.testing.assert_allclose(got.evaluate(df).areaUnderROC, ours.areaUnderROC, rtol=1e-12)
    # the steps moved the model far beyond the tolerance
    assert np.abs(_factors(want) - init).max() > 1e-3
    assert abs(want.intercept) > 1e-3


def test_regressor_steps_are_mllibs_with_convergence_stop(spark_ps):
    spark, _ = spark_ps
    df = _data(spark, 300, 2, classify=False)
    params = dict(solver="adamW", maxIter=40, stepSize=0.05, factorSize=K, seed=3, tol=0.05)
    got, want, _ = _start_from_mllib(mr.FMRegressor, FMRegressor(**params), df, **params)
    _assert_same_model(got, want, rtol=1e-7)
    hist = got.objectiveHistory
    assert 2 < len(hist) < 40, "the tol test stops the fit early, as MLlib's"
    # MLlib keeps no regressor summary: its own objective on the data bounds ours
    pred = got.transform(df).select("label", "prediction").toArrow()
    y, p = (pred.column(c).to_numpy() for c in ("label", "prediction"))
    assert np.mean((p - y) ** 2) < hist[0]


def test_export_gives_mllibs_transform_our_predictions(spark_ps):
    spark, _ = spark_ps
    train = _data(spark, 300, 3, classify=True, unseen=3)
    test = _data(spark, 100, 4, classify=True)  # uses the 3 features training never saw
    model = FMClassifier(solver="adamW", maxIter=5, factorSize=K, seed=5, stepSize=0.1).fit(train)
    assert model.factorKeys.size == NF - 3  # rows only for the keys the data touched
    exported = model.toMLlib()
    assert type(exported) is mc.FMClassificationModel
    cols = ["rawPrediction", "probability"]

    def scores(m):
        t = m.transform(test).select(*[vector_to_array(c).alias(c) for c in cols], "prediction")
        a = t.toArrow()
        return [np.stack(a.column(c).to_numpy(zero_copy_only=False)) for c in cols] + [
            a.column("prediction").to_numpy()
        ]

    ours, theirs = scores(model), scores(exported)
    for a, b in zip(ours, theirs, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-15)
    # unseen features carry their initial rows, so they change the raw scores
    assert np.abs(ours[0][:, 1]).max() > 0
    reg = FMRegressor(maxIter=3, factorSize=K, seed=5).fit(_data(spark, 200, 5, False))
    ex = reg.toMLlib()
    assert type(ex) is mr.FMRegressionModel
    a = reg.transform(test).select("prediction").toArrow().column(0).to_numpy()
    b = ex.transform(test).select("prediction").toArrow().column(0).to_numpy()
    np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-15)


def test_metrics_match_mllibs_from_its_own_random_start(spark_ps):
    """Different random starts (ours from the key, MLlib's from its generator), same data and
    Params: with initStd 0.01 the start is a small perturbation and both fits reach the same
    quality: AUC within 0.01 (the planted model's AUC on noise of std 0.5 is ~0.9)."""
    spark, _ = spark_ps
    df = _data(spark, 600, 6, classify=True)
    params = dict(maxIter=40, stepSize=0.05, factorSize=K, seed=9)

    def score(m):
        t = m.transform(df).select("label", vector_to_array("probability")[1].alias("p"))
        a = t.toArrow()
        return auc(a.column("label").to_numpy(), a.column("p").to_numpy())

    ours, theirs = score(FMClassifier(**params).fit(df)), score(mc.FMClassifier(**params).fit(df))
    assert theirs > 0.8
    assert abs(ours - theirs) < 0.01


def test_lazy_rows_are_a_function_of_the_key(ps):
    table = PSEmbedding.create(
        8, init="normal", scale=0.01, seed=42, dtype="float64", optimizer=None, context=ps
    )
    try:
        keys = np.array([2**40 + 3, 5, 5, 2**24 - 1, 7], dtype=np.int64)
        first = table.pull(keys[3:])  # created now, in this order, on their shards
        got = table.pull(keys)
        want = init_values(keys, 8, "normal", 0.01, 42, np.dtype(np.float64))
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(first, want[3:])
        np.testing.assert_array_equal(got[1], got[2])
        assert 0.003 < want.std() < 0.03
    finally:
        table.drop()


def _step(ps, tables, keys, grads, round_):
    factors, linear = tables
    factors.aggregate(keys, grads, round=round_, part=0)
    return ps.client.call(
        "fm.step",
        [factors.spec, linear.spec],
        {"round": round_, "parts": 1, "scale": 0.5, "solver": "adamW", "lr": 0.1, "reg": 0.01},
    )


def test_duplicate_keys_in_a_push_are_one_row_with_the_summed_gradient(ps):
    def tables(tag):
        opt = dict(dtype="float64", context=ps, optimizer="adamw", lr=0.1, weight_decay=0.01)
        return (
            PSEmbedding.create(3, scale=0.01, seed=1, name=f"fm-dup-{tag}-v", **opt),
            PSEmbedding.create(1, init="zeros", name=f"fm-dup-{tag}-w", **opt),
        )

    a, b = tables("a"), tables("b")
    try:
        g1, g2 = np.array([[1.0, -2.0, 0.5]]), np.array([[0.25, 4.0, -1.0]])
        for r in (1, 2):
            _step(ps, a, np.array([5, 5, 9]), np.vstack([g1, g2, g1]), r)
            _step(ps, b, np.array([9, 5]), np.vstack([g1, g1 + g2]), r)
        for slot in ("", "m", "v"):
            np.testing.assert_array_equal(
                a[0].pull(np.array([5, 9]), slot), b[0].pull(np.array([5, 9]), slot)
            )
        keys, _ = a[0].pull()
        assert keys.tolist() == [5, 9]
        # one AdamW step per round on the summed (then scaled) gradient: MLlib's update
        w = init_values(np.array([5]), 3, "normal", 0.01, 1, np.dtype(np.float64))[0]
        g, m, v = 0.5 * (g1 + g2)[0], 0.0, 0.0
        for t in (1, 2):
            m, v = 0.9 * m + 0.1 * g, 0.999 * v + 0.001 * g * g
            step = 0.1 * (m / (1 - 0.9**t)) / (np.sqrt(v / (1 - 0.999**t)) + 1e-8)
            w = w - (step + 0.01 * w)
        np.testing.assert_allclose(a[0].pull(np.array([5]))[0], w, rtol=1e-12)
    finally:
        for t in (*a, *b):
            t.drop()


def test_bad_input_is_refused_by_name_and_leaves_the_ps_as_it_was(spark_ps):
    spark, ps = spark_ps
    before = sorted(ps.client.models())
    good = [(0.0, Vectors.sparse(4, [0], [1.0])), (1.0, Vectors.sparse(4, [1], [2.0]))]

    def fit(est, rows):
        est.fit(spark.createDataFrame(rows, ["label", "features"]))

    with pytest.raises(ValueError, match=r"Labels MUST be in \{0, 1\}.*'label'"):
        fit(FMClassifier(maxIter=2), [*good, (2.0, Vectors.sparse(4, [2], [1.0]))])
    with pytest.raises(ValueError, match="NaN or Infinity.*'features'"):
        fit(FMRegressor(maxIter=2), [*good, (0.0, Vectors.dense([1.0, float("nan"), 0, 0]))])
    with pytest.raises(ValueError, match="Labels MUST NOT be Null, NaN"):
        fit(FMRegressor(maxIter=2), [*good, (float("nan"), Vectors.sparse(4, [2], [1.0]))])
    with pytest.raises(ValueError, match="Dimensions mismatch"):
        fit(FMClassifier(maxIter=2), [*good, (0.0, Vectors.sparse(5, [2], [1.0]))])
    with pytest.raises(ValueError, match="Param factorSize=0"):
        fit(FMClassifier(factorSize=0), good)
    with pytest.raises(ValueError, match="Param solver='lbfgs'"):
        fit(FMRegressor(solver="lbfgs"), good)
    assert sorted(ps.client.models()) == before


@pytest.mark.slow  # two fits, one of them relaunched
def test_a_task_failing_once_mid_fit_gives_the_clean_model(spark_ps, tmp_path):
    """Partition 1's task dies in the 5th gradient round, after its push: the driver
    launches the worker job again (over this cached, shuffled input the plan is adaptive;
    the relaunch is a new Dataset, not the failed one's replayed failure), the retry's
    contribution replaces the first attempt's, and the model is the clean fit's, bit for
    bit (the cached partitions are read in the same order)."""
    from spark_ps.ml import _job

    spark, _ = spark_ps
    df = _data(spark, 400, seed=7, classify=True)
    fm = FMClassifier(factorSize=K, maxIter=8, seed=2, numWorkers=2)
    clean = fm.fit(df)
    marker = tmp_path / "failed"
    _job.inject_failure_once("grad", nth=4, part=1, marker=str(marker))
    try:
        retried = fm.fit(df)
    finally:
        _job.clear_failures()
    assert marker.exists()  # the task really died after pushing its gradient once
    np.testing.assert_array_equal(_factors(retried), _factors(clean))
    np.testing.assert_array_equal(retried.linear.toArray(), clean.linear.toArray())
    assert retried.intercept == clean.intercept


def test_params_are_mllibs(spark_ps):
    for ours, theirs in ((FMClassifier(), mc.FMClassifier()), (FMRegressor(), mr.FMRegressor())):
        names = {p.name for p in theirs.params}
        assert names <= {p.name for p in ours.params}
        for name in names - {"seed"}:
            assert ours.hasDefault(name) == theirs.hasDefault(name), name
            if theirs.hasDefault(name):
                assert ours.getOrDefault(name) == theirs.getOrDefault(name), name
        assert ours.setFactorSize(3).getFactorSize() == 3


def test_save_load_round_trip(spark_ps, tmp_path):
    spark, _ = spark_ps
    df = _data(spark, 200, 7, classify=True, unseen=2)  # their rows come from seed and key
    model = FMClassifier(maxIter=3, factorSize=K, seed=2, thresholds=[0.3, 0.7]).fit(df)
    assert model.factorKeys.size == NF - 2
    model.write().overwrite().save(str(tmp_path / "m"))
    back = FMClassificationModel.load(str(tmp_path / "m"))
    assert back.uid == model.uid and back.getThresholds() == [0.3, 0.7]
    np.testing.assert_array_equal(_factors(back), _factors(model))
    assert back.objectiveHistory == model.objectiveHistory
    a = model.transform(df).select("prediction").toArrow().column(0).to_numpy()
    b = back.transform(df).select("prediction").toArrow().column(0).to_numpy()
    np.testing.assert_array_equal(a, b)
    reg = FMRegressor(maxIter=2, factorSize=K, fitLinear=False).fit(_data(spark, 100, 8, False))
    reg.save(str(tmp_path / "r"))
    r2 = FMRegressionModel.load(str(tmp_path / "r"))
    assert r2.linear.numNonzeros() == 0 and r2.intercept == reg.intercept


def test_worker_function_loads_without_pyspark_ml(tmp_path):
    import subprocess
    import sys

    from pyspark import cloudpickle
    from test_worker_imports import _LOAD

    from spark_ps.ml._job import run_worker_loop
    from spark_ps.ml.fm.worker import HANDLERS, setup_rows

    fn = run_worker_loop("127.0.0.1:1", "t", "job-x", setup_rows("f", "label", None), HANDLERS)
    path = tmp_path / "task.pkl"
    path.write_bytes(cloudpickle.dumps(fn))
    out = subprocess.run(
        [sys.executable, "-c", _LOAD, str(path)], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "", f"the FM worker imported {out.stdout}"


def _shard_rss(ps) -> int:
    import psutil

    return sum(psutil.Process(h.pid).memory_info().rss for h in ps.client.health())


def test_two_to_the_24_features_by_8_factors_hold_only_touched_rows(spark_ps):
    """A dense 2^24 x 8 float64 table is 1 GiB (3 GiB with AdamW's moments); the PS holds
    the rows the data touches, ~30k here, so the shards grow by a few MB."""
    spark, ps = spark_ps
    dim, rng = 2**24, np.random.default_rng(24)
    keys = np.sort(rng.choice(dim, size=(3000, 10)), axis=1)
    rows = [
        (float(i % 2), Vectors.sparse(dim, np.unique(k).tolist(), [1.0] * np.unique(k).size))
        for i, k in enumerate(keys)
    ]
    df = spark.createDataFrame(rows, ["label", "features"]).repartition(2)
    rss0 = _shard_rss(ps)
    t0 = time.perf_counter()
    model = FMClassifier(maxIter=3, factorSize=8, stepSize=0.01, seed=1).fit(df)
    print(f"2^24 x 8 fit: {time.perf_counter() - t0:.1f}s")
    grown = _shard_rss(ps) - rss0
    touched = np.unique(keys).size
    assert model.numFeatures == dim
    assert model.factorKeys.size == touched
    assert model._rows_held == 2 * touched + 1  # factor rows, linear rows, the intercept
    assert grown < 150 << 20, f"the shards grew by {grown >> 20} MiB"
    pred = model.transform(df.limit(50)).select("probability").toArrow()
    assert pred.num_rows == 50


@pytest.mark.slow  # 100 iterations, ours and MLlib's
def test_pysparks_docstring_example_gives_mllibs_numbers(spark_ps):
    """pyspark's FMClassifier example: one feature, so no pair of features and the factors
    cannot reach a prediction; linear weights and intercept start at 0 in both, so the
    100 adamW steps are the same and so are the printed numbers (22.13...)."""
    spark, _ = spark_ps
    df = spark.createDataFrame(
        [(1.0, Vectors.dense(1.0)), (0.0, Vectors.sparse(1, [], []))], ["label", "features"]
    )
    test0 = spark.createDataFrame(
        [(Vectors.dense(x),) for x in (-1.0, 0.5, 1.0, 2.0)], ["features"]
    )
    ours = FMClassifier(factorSize=2).setSeed(11).fit(df)
    theirs = mc.FMClassifier(factorSize=2).setSeed(11).fit(df)
    assert ours.getMaxIter() == 100
    x = test0.head().features
    np.testing.assert_allclose(ours.predictRaw(x).toArray(), [22.13, -22.13], rtol=1e-3)
    np.testing.assert_allclose(ours.predictRaw(x), theirs.predictRaw(x), rtol=1e-9)
    np.testing.assert_allclose(
        ours.predictProbability(x), theirs.predictProbability(x), rtol=1e-9, atol=1e-300
    )
    np.testing.assert_allclose(ours.intercept, theirs.intercept, rtol=1e-9)
    np.testing.assert_allclose(ours.linear.toArray(), theirs.linear.toArray(), rtol=1e-9)
    assert ours.factors.numRows == 1 and ours.factors.numCols == 2
    # and FMRegressor's example: intercept -0.0032501766849261557, linear [0.9978]
    df = spark.createDataFrame(
        [(2.0, Vectors.dense(2.0)), (1.0, Vectors.dense(1.0)), (0.0, Vectors.sparse(1, [], []))],
        ["label", "features"],
    )
    ours, theirs = (cls(factorSize=2).setSeed(16).fit(df) for cls in (FMRegressor, mr.FMRegressor))
    np.testing.assert_allclose(ours.intercept, -0.0032501766849261557, rtol=1e-9)
    np.testing.assert_allclose(ours.intercept, theirs.intercept, rtol=1e-9)
    np.testing.assert_allclose(ours.linear.toArray(), theirs.linear.toArray(), rtol=1e-9)
    np.testing.assert_allclose(
        ours.predict(Vectors.dense(4.0)), theirs.predict(Vectors.dense(4.0)), rtol=1e-9
    )


def test_mini_batches_are_a_deterministic_sample(spark_ps):
    """miniBatchFraction samples rows per (seed, iteration, partition): the same fit twice
    gives the same model, another seed (same start rows, other samples) another one."""
    from spark_ps.ml.fm.worker import sample_rows

    spark, _ = spark_ps
    df = _data(spark, 300, 9, classify=True)
    params = dict(miniBatchFraction=0.5, maxIter=4, factorSize=K, stepSize=0.1, seed=4)
    a, b = FMClassifier(**params).fit(df), FMClassifier(**params).fit(df)
    np.testing.assert_array_equal(_factors(a), _factors(b))
    assert a.objectiveHistory == b.objectiveHistory
    full = FMClassifier(**{**params, "miniBatchFraction": 1.0}).fit(df)
    assert np.abs(_factors(full) - _factors(a)).max() > 1e-6
    picked = [sample_rows(10_000, 0.5, 4, i, 0) for i in (1, 2)]
    assert all(4700 < p.size < 5300 for p in picked)
    assert not np.array_equal(picked[0], picked[1])
    np.testing.assert_array_equal(picked[0], sample_rows(10_000, 0.5, 4, 1, 0))


def test_train_validation_split_and_pipeline_take_it_as_mllibs(spark_ps, tmp_path):
    from pyspark.ml import Pipeline, PipelineModel
    from pyspark.ml.evaluation import BinaryClassificationEvaluator
    from pyspark.ml.tuning import ParamGridBuilder, TrainValidationSplit

    spark, _ = spark_ps
    df = _data(spark, 300, 10, classify=True)
    fm = FMClassifier(maxIter=5, factorSize=K, seed=1)
    grid = ParamGridBuilder().addGrid(fm.stepSize, [0.001, 0.1]).build()
    tvs = TrainValidationSplit(
        estimator=fm, estimatorParamMaps=grid, evaluator=BinaryClassificationEvaluator(), seed=1
    )
    best = tvs.fit(df).bestModel
    assert isinstance(best, FMClassificationModel) and best.getStepSize() == 0.1
    model = Pipeline(stages=[fm]).fit(df)
    model.write().overwrite().save(str(tmp_path / "p"))
    back = PipelineModel.load(str(tmp_path / "p"))
    a = model.transform(df).select("prediction").toArrow().column(0).to_numpy()
    b = back.transform(df).select("prediction").toArrow().column(0).to_numpy()
    np.testing.assert_array_equal(a, b)
