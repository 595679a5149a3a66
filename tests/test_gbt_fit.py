"""GBT trained on the PS: MLlib's trees, the same trees whatever the partitioning or retries."""

from __future__ import annotations

import logging
import re

import numpy as np
import pytest
from pyspark.ml.classification import GBTClassifier as MLlibGBT
from pyspark.ml.linalg import Vectors
from pyspark.ml.regression import GBTRegressor as MLlibGBTRegressor
from pyspark.sql import functions as F

from spark_ps.ml import _job
from spark_ps.ml.classification import GBTClassifier
from spark_ps.ml.gbt import boost_worker, distributed
from spark_ps.ml.gbt.boost_worker import layer_shards
from spark_ps.ml.regression import GBTRegressor
from spark_ps.ml.tree.local import fit_gbt_local


@pytest.fixture(scope="module")
def data(spark):
    rng = np.random.default_rng(0)
    n, d = 3000, 6
    X = np.round(rng.normal(size=(n, d)), 1)  # few distinct values: MLlib's splits are exact
    score = X[:, 0] + X[:, 1] * X[:, 2] + 0.5 * rng.normal(size=n)
    y = (score > 0).astype(float)
    rows = [(float(y[i]), float(score[i]), Vectors.dense(X[i])) for i in range(n)]
    return spark.createDataFrame(rows, ["label", "score", "features"]).cache()


def _structure(model) -> str:
    """The debug string below its header, numbers to 10 significant digits."""
    body = model.toDebugString.split("\n", 1)[1]
    return re.sub(r"-?\d+\.\d+(E-?\d+)?", lambda m: f"{float(m.group()):.10g}", body)


_NUMBER = re.compile(r"-?\d+\.\d+(E-?\d+)?")


def _assert_like_mllib(ours, ref) -> None:
    """The same trees as MLlib's: the same debug text with every number masked, and the
    numbers (thresholds, leaf values) within 1e-12 absolute. Our leaf values are means of
    fixed-point targets, each rounded to 2**-47 at 3000 rows (|target| <= 4): MLlib's float
    sums and ours may differ in the last digits of a near-zero mean."""
    a, b = (m.toDebugString.split("\n", 1)[1] for m in (ours, ref))
    assert _NUMBER.sub("#", a) == _NUMBER.sub("#", b)
    x, y = ([float(v.group()) for v in _NUMBER.finditer(t)] for t in (a, b))
    np.testing.assert_allclose(x, y, rtol=1e-9, atol=1e-12)


def _probs(model, df):
    from pyspark.ml.functions import vector_to_array

    col = (
        vector_to_array("probability")[1]
        if "probability" in model.transform(df).columns
        else "prediction"
    )
    return np.array([r[0] for r in model.transform(df).select(col).collect()])


def test_classifier_matches_mllib(spark_ps, data):
    params = dict(maxIter=6, maxDepth=3, seed=7)
    ours = GBTClassifier(**params).fit(data)
    ref = MLlibGBT(**params).fit(data)
    _assert_like_mllib(ours, ref)
    np.testing.assert_allclose(_probs(ours, data), _probs(ref, data), rtol=0, atol=1e-12)
    np.testing.assert_allclose(
        ours.featureImportances.toArray(), ref.featureImportances.toArray(), atol=1e-12
    )


def test_single_leaf_trees_match_mllib(spark_ps, data):
    """maxDepth 0: every tree is one leaf, yet waits at its root like any other (partition
    0 posts the tree before it there); each is posted and the driver reads them all."""
    params = dict(maxIter=4, maxDepth=0)
    ours = GBTClassifier(**params).fit(data)
    ref = MLlibGBT(**params).fit(data)
    assert [t.numNodes for t in ours.trees] == [1, 1, 1, 1]
    _assert_like_mllib(ours, ref)
    np.testing.assert_allclose(_probs(ours, data), _probs(ref, data), rtol=0, atol=1e-12)


def test_regressor_matches_mllib(spark_ps, data):
    params = dict(maxIter=4, maxDepth=3, labelCol="score")
    ours = GBTRegressor(**params).fit(data)
    ref = MLlibGBTRegressor(**params).fit(data)
    np.testing.assert_allclose(_probs(ours, data), _probs(ref, data), rtol=0, atol=1e-9)


@pytest.mark.slow
def test_same_trees_for_any_partitioning_and_after_a_retry(spark_ps, data, tmp_path):
    params = dict(maxIter=4, maxDepth=4, subsamplingRate=0.7, featureSubsetStrategy="sqrt")
    one = GBTClassifier(numWorkers=1, **params).fit(data.repartition(1))
    two = GBTClassifier(numWorkers=2, **params).fit(data.repartition(5))
    marker = tmp_path / "failed"
    _job.inject_failure_once("hist", nth=9, part=0, marker=str(marker))
    try:
        retried = GBTClassifier(numWorkers=2, **params).fit(data)
    finally:
        _job.clear_failures()
    assert marker.exists()  # a task really died mid-fit, after pushing its histogram
    for other in (two, retried):
        assert other.toDebugString.split("\n", 1)[1] == one.toDebugString.split("\n", 1)[1]
        np.testing.assert_array_equal(_probs(other, data), _probs(one, data))


def test_goss_trees_are_the_same_for_any_partitioning(spark_ps, data):
    """GOSS draws each tree's rows from counts summed over the partitions and hashed row
    ids: one worker and two workers over other partitions grow the same trees; rates that
    keep every row grow MLlib's trees."""
    base = dict(maxIter=5, maxDepth=3, stepSize=0.5, seed=2)
    one = GBTClassifier(numWorkers=1, gossTopRate=0.2, **base).fit(data.repartition(1))
    two = GBTClassifier(numWorkers=2, gossTopRate=0.2, **base).fit(data.repartition(5))
    assert _structure(two) == _structure(one)
    np.testing.assert_array_equal(_probs(two, data), _probs(one, data))
    plain = GBTClassifier(**base).fit(data)
    trees = [[t.toDebugString.split("\n", 1)[1] for t in m.trees] for m in (one, plain)]
    assert trees[0][:2] == trees[1][:2]
    assert trees[0][2] != trees[1][2]  # sampled from the third tree on
    every = GBTClassifier(gossTopRate=0.3, gossOtherRate=0.7, **base).fit(data)
    assert _structure(every) == _structure(plain)
    assert one.getGossTopRate() == 0.2  # the model carries the Params


@pytest.mark.slow
def test_a_goss_fit_retried_mid_tree_grows_the_same_trees(spark_ps, data, tmp_path):
    """A task dies in the third tree, the first GOSS samples: its retry replays the tree,
    its GOSS counts answered again from the shard's cache, and grows the clean fit's trees."""
    params = dict(maxIter=5, maxDepth=3, stepSize=0.5, seed=2, gossTopRate=0.2, numWorkers=2)
    clean = GBTClassifier(**params).fit(data)
    marker = tmp_path / "failed"
    _job.inject_failure_once("hist", nth=7, part=1, marker=str(marker))  # tree 2, layer 1
    try:
        retried = GBTClassifier(**params).fit(data)
    finally:
        _job.clear_failures()
    assert marker.exists()
    assert _structure(retried) == _structure(clean)
    np.testing.assert_array_equal(_probs(retried, data), _probs(clean, data))


def test_to_mllib_round_trip_through_stock_load(spark_ps, data, tmp_path):
    from pyspark.ml.classification import GBTClassificationModel as MLlibModel
    from pyspark.ml.classification import LogisticRegressionModel as MLlibLRModel

    from spark_ps.ml.classification import LogisticRegression

    ours = GBTClassifier(maxIter=3, maxDepth=3).fit(data)
    ours.toMLlib().save(str(tmp_path / "gbt"))
    stock = MLlibModel.load(str(tmp_path / "gbt"))
    # the same trees and margins; the probability's exp is Java's against numpy's (their
    # libms may differ in the last bits)
    np.testing.assert_allclose(_probs(stock, data), _probs(ours, data), rtol=0, atol=1e-15)
    lr = LogisticRegression(maxIter=10, regParam=0.01).fit(data)
    lr.toMLlib().save(str(tmp_path / "lr"))
    stock_lr = MLlibLRModel.load(str(tmp_path / "lr"))
    np.testing.assert_allclose(_probs(stock_lr, data), _probs(lr, data), rtol=1e-12)


def test_sparse_vectors_train_the_trees_of_their_dense_rows(spark_ps, data):
    """Sparse input: workers get every row densified, so sparse and dense spellings of the
    same rows (mixed in one column) give the same trees and predictions."""
    rows = data.select("label", "features").collect()
    mixed = [
        (r.label, Vectors.sparse(r.features.size, {i: v for i, v in enumerate(r.features) if v}))
        if i % 2
        else (r.label, r.features)
        for i, r in enumerate(rows)
    ]
    sparse = spark_ps[0].createDataFrame(mixed, ["label", "features"])
    assert sum(1 for _, v in mixed if type(v).__name__ == "SparseVector") == len(rows) // 2
    params = dict(maxIter=3, maxDepth=3, seed=5)
    dense_model = GBTClassifier(**params).fit(data)
    sparse_model = GBTClassifier(**params).fit(sparse)
    assert (
        sparse_model.toDebugString.split("\n", 1)[1] == dense_model.toDebugString.split("\n", 1)[1]
    )
    np.testing.assert_array_equal(_probs(sparse_model, sparse), _probs(dense_model, data))


def test_layer_splits_spread_over_shards_by_histogram_size():
    assert layer_shards(6, 32, 2) == 1  # 192 cells: one shard answers faster than two
    assert layer_shards(24, 32, 2) == 1
    assert layer_shards(1000, 32, 2) == 2  # wide data: every shard its feature range
    assert layer_shards(1000, 32, 4, cells_per_shard=10_000) == 4
    assert layer_shards(6, 32, 2, cells_per_shard=1) == 2
    assert layer_shards(0, 32, 2) == 1


def test_same_trees_whether_one_shard_or_every_shard_finds_the_splits(
    spark_ps, data, monkeypatch, caplog
):
    caplog.set_level(logging.INFO, logger="spark_ps.ml.gbt")
    params = dict(maxIter=3, maxDepth=4, seed=3)
    one = GBTClassifier(**params).fit(data)  # 6 features: one shard finds every split
    assert "shards 1.000" in caplog.text  # the fit's logged worker profile
    caplog.clear()
    monkeypatch.setattr(boost_worker, "CELLS_PER_SHARD", 1)  # each shard its feature range
    spread = GBTClassifier(**params).fit(data)
    assert "shards 2.000" in caplog.text
    assert _structure(spread) == _structure(one)


def test_losses_ride_on_the_root_call_and_trees_equal_the_local_trainers(spark_ps, data, caplog):
    """LogLoss bounds its targets, so a fit without validation needs no per-tree gather of
    their min and max: each tree's losses come back with the next root's splits and one
    gather is left (the last tree's losses). Squared error keeps a gather a tree. Either
    way the trees are the local trainer's bit for bit, and so is the loss history. Absolute
    error bounds the targets from tree 1 on (signs), so it gathers at tree 0 and the end."""
    caplog.set_level(logging.INFO, logger="spark_ps.ml.gbt")
    pdf = data.toPandas()
    X = np.stack([v.toArray() for v in pdf["features"]])
    for cls, label, loss, gathers in (
        (GBTClassifier, "label", "logistic", 1),
        (GBTRegressor, "score", "squared", 5),
        (GBTRegressor, "score", "absolute", 2),
    ):
        caplog.clear()
        params = dict(maxIter=4, maxDepth=3, seed=5)
        est = cls(numWorkers=2, labelCol=label, lossType=loss, **params)
        ours = est.fit(data.repartition(2))
        assert f"gathers {gathers}.000" in caplog.text  # the fit's logged worker profile
        local = {**params, "lossType": loss}
        trees, weights, hist = fit_gbt_local(X, pdf[label].to_numpy(), None, local)
        assert ours.treeArrays == trees and ours.treeWeights == weights.tolist()
        # per-partition float sums, then their sum: the order differs from the local one
        np.testing.assert_allclose(ours.lossHistory, hist["train_loss"], rtol=1e-13)


def test_min_weight_fraction_uses_the_exact_total_weight_from_either_sketch(
    spark_ps, data, monkeypatch
):
    """minWeightFractionPerNode needs the rows' total weight: the sketch round sums it
    exactly (pooled rows or merged summaries alike), and the trees are the local
    trainer's, whose minimum weight per node comes from the same integer sum."""
    weighted = data.withColumn("w", 0.25 + F.abs(F.col("score")))  # uneven weights
    pdf = weighted.toPandas()
    X = np.stack([v.toArray() for v in pdf["features"]])
    params = dict(maxIter=3, maxDepth=4, seed=5, minWeightFractionPerNode=0.05)
    local = {**params, "lossType": "logistic"}
    trees, _, _ = fit_gbt_local(X, pdf["label"].to_numpy(), pdf["w"].to_numpy(), local)
    pruned, _, _ = fit_gbt_local(
        X, pdf["label"].to_numpy(), pdf["w"].to_numpy(), {**local, "minWeightFractionPerNode": 0}
    )
    assert sum(t.feature.size for t in trees) < sum(t.feature.size for t in pruned)  # it binds
    pooled = GBTClassifier(numWorkers=2, weightCol="w", **params).fit(weighted.repartition(2))
    assert pooled.treeArrays == trees
    monkeypatch.setattr(distributed, "POOLED_SKETCH_VALUES", 0)
    merged = GBTClassifier(numWorkers=2, weightCol="w", **params).fit(weighted.repartition(2))
    assert merged.treeArrays == trees


def test_clean_rows_cost_no_check_job_and_bad_rows_get_mllibs_words(spark_ps, data, monkeypatch):
    calls = []
    check = GBTClassifier._check_rows

    def counted(self, *args, **kwargs):
        calls.append(args)
        return check(self, *args, **kwargs)

    monkeypatch.setattr(GBTClassifier, "_check_rows", counted)
    GBTClassifier(maxIter=1, maxDepth=2).fit(data)
    assert calls == []  # the workers' read found nothing to refuse: no extra Spark job
    bad = data.union(data.limit(1).withColumn("label", F.lit(2.0)))
    with pytest.raises(ValueError, match=r"Labels MUST be in \{0, 1\}, but got 2\.0"):
        GBTClassifier(maxIter=1, maxDepth=2).fit(bad)
    assert len(calls) == 1  # refused by a worker, worded by the estimator's check


def test_without_a_check_job_the_workers_refusal_is_the_error(spark_ps, data):
    from spark_ps.ml.gbt.distributed import train_gbt

    bad = data.union(data.limit(1).withColumn("label", F.lit(2.0)))
    est = GBTClassifier(maxIter=1, maxDepth=2)
    with pytest.raises(ValueError, match=r"partition \d: GBT classification needs labels 0 or 1"):
        train_gbt(est._prepare(bad), est._params_dict())


def test_a_validation_column_true_on_no_row_is_refused_by_name(spark_ps, data):
    """MLlib fails with "empty collection"; a NaN validation loss must not pass for a model
    (before, the fit kept one tree and warned of 0/0)."""
    from spark_ps.ml.gbt.distributed import train_gbt

    flagged = data.withColumn("isVal", F.lit(False))
    est = GBTClassifier(maxIter=3, maxDepth=2, validationIndicatorCol="isVal")
    with pytest.raises(ValueError, match="validationIndicatorCol 'isVal' is true on no row"):
        est.fit(flagged)
    train, validation = est._split(flagged)  # the trainer's own refusal, from its meta round
    with pytest.raises(ValueError, match="validationIndicatorCol 'isVal' is true on no row"):
        train_gbt(est._prepare(train), est._params_dict(), validation=est._prepare(validation))
    params = {k: v for k, v in est._params_dict().items() if k != "validationIndicatorCol"}
    with pytest.raises(ValueError, match="the validation set holds no row"):  # no Param set
        train_gbt(est._prepare(train), params, validation=est._prepare(validation))
    some = flagged.withColumn("isVal", F.abs(F.hash("score")) % 4 == 0)  # a quarter validate
    model = est.fit(some)
    assert 1 <= model.getNumTrees <= 3


def test_the_driver_state_snapshot_is_a_copy_later_trees_leave_alone():
    """A tree boundary keeps the driver's state for a rollback: later trees must not change
    the copy, and the trees read so far are shared, not copied again at every boundary."""
    from spark_ps.ml.gbt.distributed import _snapshot

    tree = {"feature": [0, -1, -1], "threshold": [0.5, 0.0, 0.0]}
    state = {"thresholds": [[0.5]], "loss": "logistic", "trees": [tree], "weights": [1.0]}
    state["validation_loss"] = [0.6]
    kept = _snapshot(state)
    state["trees"].append(dict(tree))
    state["weights"].append(0.1)
    state["validation_loss"].append(0.5)
    assert kept == {
        "thresholds": [[0.5]],
        "loss": "logistic",
        "trees": [tree],
        "weights": [1.0],
        "validation_loss": [0.6],
    }
    assert kept["trees"][0] is tree


def test_pooled_rows_and_merged_summaries_give_the_same_splits(spark_ps, data, monkeypatch):
    """The sketch from the sampled rows themselves (few enough: the default here) and the one
    merged on the PS from per-partition summaries are the same, sampling and duplicate
    rows included (equal rows share a content hash, yet each counts)."""
    twice = data.filter(F.col("score") > 0)  # some rows more often than others
    rows = data.union(data).union(data).union(twice).repartition(3)  # > 10,000: sampled
    params = dict(maxIter=2, maxDepth=3, seed=5)
    pooled = GBTClassifier(**params).fit(rows)
    monkeypatch.setattr(distributed, "POOLED_SKETCH_VALUES", 0)
    merged = GBTClassifier(**params).fit(rows)
    assert _structure(pooled) == _structure(merged)
