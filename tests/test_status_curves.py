"""The status page's live curves of a GBT fit (tree count, training and validation loss per
tree), of a LogisticRegression fit (loss and validation AUC per iteration), of
LinearRegression and FM fits (loss per iteration) and of an FTRL stream (each micro-batch's
window metrics): real local[2] Spark, an embedded PS with ``spark.ps.uiPort=0``, the curves
read back from the page and its JSON and compared with what the model and the learner
report."""

from __future__ import annotations

import json
import re
import time
import urllib.request

import numpy as np
import pytest
from online_data import write_stream_files


def _page(ctx) -> tuple[str, list[dict]]:
    """The page's HTML and the fits of its status.json (past the page's one-second cache)."""
    time.sleep(1.1)
    req = urllib.request.Request(ctx.ui_url)
    req.add_header("Authorization", f"Bearer {ctx.token}")
    with urllib.request.urlopen(req, timeout=30) as r:
        html = r.read().decode()
    req = urllib.request.Request(ctx.ui_url + "status.json")
    req.add_header("Authorization", f"Bearer {ctx.token}")
    with urllib.request.urlopen(req, timeout=30) as r:
        fits = json.loads(r.read())["fits"]
    return html, fits


def _svg_points(html: str, fit: str, metric: str) -> int:
    """How many points the page's curve of `metric` in fit `fit`'s block has (0: none)."""
    block = re.search(rf"<div class='fit' data-fit='{re.escape(fit)}'>(.*?)</div>", html, re.S)
    assert block, f"fit {fit} is not on the page"
    m = re.search(rf"<svg class='curve' data-metric='{metric}' data-points='(\d+)'", block[1])
    return int(m[1]) if m else 0


@pytest.fixture(scope="module")
def ui_ps(spark):
    """An embedded PS of its own with a status page, active for this module's fits."""
    from spark_ps import PSContext

    own = PSContext.start(spark, numShards=2, uiPort="0")
    previous, PSContext._active = PSContext._active, own
    try:
        assert own.ui_url
        yield own
    finally:
        PSContext._active = previous
        own.stop()


@pytest.mark.slow
def test_gbt_reports_each_tree_and_its_training_and_validation_loss(spark, ui_ps):
    from pyspark.ml.linalg import Vectors

    from spark_ps.ml.classification import GBTClassifier

    rng = np.random.default_rng(3)
    n = 600
    X = rng.normal(size=(n, 4))
    y = (X @ [1.0, -1.5, 0.5, 0.0] + rng.normal(size=n) > 0).astype(float)
    val = np.arange(n) % 4 == 0
    df = spark.createDataFrame(
        [(float(y[i]), Vectors.dense(X[i]), bool(val[i])) for i in range(n)],
        ["label", "features", "isVal"],
    )
    est = GBTClassifier(maxIter=6, maxDepth=3, validationIndicatorCol="isVal", seed=1)
    model = est.fit(df)
    html, fits = _page(ui_ps)
    (fit,) = [f for f in fits if f["name"] == "spark-ps GBT"]
    assert fit["finished"] and fit["unit"] == "tree" and fit["total"] == 6
    grown = len(model.lossHistory)  # trees grown; early stopping may keep fewer
    assert model.getNumTrees <= grown == fit["done"] >= 2
    points = fit["points"]
    assert [p["done"] for p in points] == list(range(1, grown + 1))  # the tree count
    assert np.allclose([p["train loss"] for p in points], model.lossHistory, rtol=1e-12)
    # the validation loss after each kept tree, as the model itself scores the split
    kept = model.getNumTrees
    truth = model.evaluateEachIteration(df.filter("isVal"))
    assert np.allclose([p["validation loss"] for p in points][:kept], truth[:kept], rtol=1e-9)
    # the validation AUC after each tree: the score histograms' AUC (ties within a bin count
    # half) equals the one of the model's probabilities binned alike, and is within the
    # bins' tie share of the exact AUC
    from pyspark.ml.evaluation import BinaryClassificationEvaluator
    from pyspark.ml.functions import vector_to_array

    from spark_ps.ml.online.metrics import NUM_BINS, binned_auc

    vdf = df.filter("isVal")
    t = model.transform(vdf).select("label", vector_to_array("probability")[1].alias("p"))
    arrow = t.toArrow()
    label, p1 = arrow.column("label").to_numpy(), arrow.column("p").to_numpy()
    bins = np.minimum((p1 * NUM_BINS).astype(np.int64), NUM_BINS - 1)
    hist = [np.bincount(bins, weights=label == c, minlength=NUM_BINS) for c in (1.0, 0.0)]
    page_auc = [p["validation auc"] for p in points]
    assert page_auc[kept - 1] == pytest.approx(binned_auc(*hist), rel=1e-12)
    exact = BinaryClassificationEvaluator(rawPredictionCol="probability").evaluate(
        model.transform(vdf)
    )
    assert page_auc[kept - 1] == pytest.approx(exact, abs=0.01)
    assert 0.7 < page_auc[kept - 1] <= 1.0
    assert f"tree {grown}/6" in html
    for metric in ("train loss", "validation loss", "validation auc"):
        assert _svg_points(html, fit["fit"], metric) == grown


def test_lr_reports_each_iterations_loss_and_validation_auc(spark, ui_ps):
    from pyspark.ml.linalg import Vectors

    from spark_ps.ml.classification import LogisticRegression

    rng = np.random.default_rng(5)
    n = 800
    X = rng.normal(size=(n, 5))
    y = (X @ [1.0, -2.0, 0.5, 0.0, 1.0] + rng.normal(size=n) > 0).astype(float)
    df = spark.createDataFrame(
        [(float(y[i]), Vectors.dense(X[i]), i % 3 == 0) for i in range(n)],
        ["label", "features", "isVal"],
    )
    model = LogisticRegression(maxIter=15, regParam=0.01, validationIndicatorCol="isVal").fit(df)
    summary = model.summary
    iters = summary.totalIterations
    html, fits = _page(ui_ps)
    fit = [f for f in fits if f["name"] == "spark-ps LogisticRegression"][-1]
    assert fit["finished"] and fit["unit"] == "iteration" and fit["done"] == iters >= 3
    points = fit["points"]
    assert [p["done"] for p in points] == list(range(1, iters + 1))
    assert np.allclose([p["loss"] for p in points], summary.objectiveHistory[1:], rtol=1e-12)
    aucs = [p["validation auc"] for p in points]
    assert np.allclose(aucs, summary.validationAucHistory, rtol=1e-12)
    assert 0.8 < aucs[-1] <= 1.0  # a separable signal: the held-out rows rank well
    for metric in ("loss", "validation auc"):
        assert _svg_points(html, fit["fit"], metric) == iters


@pytest.mark.parametrize("kind", ["LinearRegression", "FMClassifier"])
def test_linear_and_fm_fits_report_each_iterations_loss(spark, ui_ps, kind):
    from pyspark.ml.linalg import Vectors

    from spark_ps.ml.classification import FMClassifier
    from spark_ps.ml.regression import LinearRegression

    rng = np.random.default_rng(7)
    n = 400
    X = rng.normal(size=(n, 4))
    y = (X @ [1.0, -1.0, 0.5, 0.0] + rng.normal(size=n) > 0).astype(float)
    df = spark.createDataFrame(
        [(float(y[i]), Vectors.dense(X[i])) for i in range(n)], ["label", "features"]
    )
    if kind == "LinearRegression":
        model = LinearRegression(maxIter=8, regParam=0.1, solver="l-bfgs").fit(df)
        history = model.summary.objectiveHistory
    else:
        model = FMClassifier(maxIter=8, stepSize=0.5, seed=1).fit(df)
        history = model.summary().objectiveHistory
    iters = len(history) - 1  # the first value is the start point's
    html, fits = _page(ui_ps)
    fit = [f for f in fits if f["name"] == f"spark-ps {kind}"][-1]
    assert fit["finished"] and fit["unit"] == "iteration" and fit["total"] == 8
    assert fit["done"] == iters >= 3
    points = fit["points"]
    assert [p["done"] for p in points] == list(range(1, iters + 1))
    assert np.allclose([p["loss"] for p in points], history[1:], rtol=1e-12)
    assert _svg_points(html, fit["fit"], "loss") == iters


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_ftrl_stream_reports_each_micro_batchs_window_metrics(spark, ui_ps, tmp_path):
    from spark_ps.ml.online import OnlineLogisticRegression

    files = 3
    write_stream_files(tmp_path / "src", files, 800, 40)
    src = str(tmp_path / "src")
    schema = spark.read.parquet(src).schema
    stream = spark.readStream.schema(schema).option("maxFilesPerTrigger", 1).parquet(src)
    learner = OnlineLogisticRegression(featuresCol="keys", alpha=0.1, modelName="curves")
    try:
        q = learner.trainOn(stream, str(tmp_path / "ck"), trigger={"availableNow": True})
        q.awaitTermination(240)
        assert q.exception() is None
        history = learner.history
        assert len(history) == files
        deadline = time.monotonic() + 30  # the query's end reaches its listener soon after
        while True:
            html, fits = _page(ui_ps)
            (fit,) = [f for f in fits if f["name"] == "spark-ps OnlineLogisticRegression (curves)"]
            if fit["finished"] or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert fit["finished"], "the query ended: so do its curves"
        assert fit["unit"] == "batch" and fit["done"] == files
        points = fit["points"]
        assert [p["done"] for p in points] == list(range(1, files + 1))
        for key, metric in [
            ("rows", "window rows"),
            ("logloss", "window logloss"),
            ("auc", "window auc"),
            ("runningLogloss", "running logloss"),
            ("runningAuc", "running auc"),
        ]:
            got = [p[metric] for p in points]
            assert np.allclose(got, [h[key] for h in history], rtol=1e-12), metric
            assert _svg_points(html, fit["fit"], metric) == files, metric
        assert points[0]["window rows"] == 800
        assert points[-1]["window auc"] > 0.6  # it learns: later batches rank better
        assert f"batch {files}</span>" in html  # a stream has no total
    finally:
        learner.drop()
