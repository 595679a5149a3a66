"""Saved parses: a second fit on the same persisted DataFrame reads each partition's parse
from its executor's local directory instead of its rows (no Arrow pass), with the model
of a fresh fit; anything else (not persisted, re-cached, switched off, files gone) reads
the rows."""

from __future__ import annotations

import glob
import logging
import os
import shutil
import time

import numpy as np
import pytest
from pyspark.ml.linalg import Vectors
from pyspark.ml.tuning import CrossValidator, ParamGridBuilder
from pyspark.sql import functions as F

from spark_ps.data import CSRBatch
from spark_ps.ml import parse_cache
from spark_ps.ml.classification import LogisticRegression
from spark_ps.ml.regression import LinearRegression

READ = "the workers read their saved parses"
MISSED = "a saved parse was not on its executor"


def _sparse_df(spark, n=3000, d=200, seed=3, parts=2, val=False):
    rng = np.random.default_rng(seed)
    beta = rng.normal(size=d)
    rows = []
    for i in range(n):
        idx = np.sort(rng.choice(d, 8, replace=False))
        x = rng.normal(size=8)
        y = float(rng.uniform() < 1 / (1 + np.exp(-x @ beta[idx])))
        rows.append((y, Vectors.sparse(d, idx.tolist(), x.tolist()), bool(i % 4 == 0)))
    df = spark.createDataFrame(rows, ["label", "features", "isVal"]).repartition(parts)
    return df if val else df.drop("isVal")


def _saved(spark) -> list[str]:
    """The saved parse folders of this (local) application's executor."""
    dirs = spark.sparkContext.parallelize([0], 1).map(lambda _: _local_dirs()).first()
    root = dirs.split(",")[0]
    return glob.glob(os.path.join(root, "spark-ps-parsed", "*", "p*"))


def _local_dirs() -> str:
    return os.environ["SPARK_LOCAL_DIRS"]  # in a Python worker: its executor's blockmgr dirs


def _key_dirs(spark) -> set[str]:
    return {os.path.dirname(p) for p in _saved(spark)}


def _fit(est, df, caplog):
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="spark_ps.job"):
        model = est.fit(df)
    return model, READ in caplog.text, MISSED in caplog.text


def _same(a, b):
    """Both fits ran the same rounds on the same arrays: equal up to the order in which the
    PS adds the two partitions' pushes (a few ulps)."""
    np.testing.assert_allclose(
        a.coefficients.toArray(), b.coefficients.toArray(), rtol=1e-9, atol=1e-12
    )
    assert a.intercept == pytest.approx(b.intercept, rel=1e-9, abs=1e-12)


def test_a_refit_on_a_persisted_dataframe_reads_the_saved_parses(spark_ps, caplog):
    spark, _ = spark_ps
    df = _sparse_df(spark).cache()
    lr = LogisticRegression(maxIter=15, regParam=0.01)
    before = _key_dirs(spark)
    first, read1, _ = _fit(lr, df, caplog)
    new = _key_dirs(spark) - before
    assert not read1 and len(new) == 1, new  # the first fit read the rows and saved them
    assert sorted(os.listdir(new.pop())) == ["p0", "p1"]
    second, read2, missed = _fit(lr, df, caplog)
    assert read2 and not missed
    _same(second, first)
    # another estimator on the same rows reads them too; so does another regParam
    other, read3, _ = _fit(LogisticRegression(maxIter=15, regParam=0.1), df, caplog)
    assert read3
    assert other.summary.totalIterations > 0
    df.unpersist()


@pytest.mark.parametrize("damage", ["folder", "weights file"])
def test_files_gone_from_the_executor_are_read_again_as_rows(spark_ps, caplog, damage):
    spark, _ = spark_ps
    df = _sparse_df(spark, seed=4).withColumn("w", F.lit(1.0) + F.rand(3)).cache()
    lr = LogisticRegression(maxIter=10, regParam=0.01, weightCol="w")
    before = _key_dirs(spark)
    first, _, _ = _fit(lr, df, caplog)
    (key_dir,) = _key_dirs(spark) - before
    if damage == "folder":  # evicted, or the task lands on another host
        shutil.rmtree(os.path.join(key_dir, "p1"))
    else:  # a file of it lost: never a fit with unit weights
        os.remove(os.path.join(key_dir, "p1", "local.weights.npy"))
    second, read, missed = _fit(lr, df, caplog)
    assert missed and not read  # the first launch missed; the relaunch read the rows
    _same(second, first)
    assert sorted(os.listdir(key_dir)) == ["p0", "p1"]  # and saved them again
    assert "local.weights.npy" in os.listdir(os.path.join(key_dir, "p1"))
    third, read, missed = _fit(lr, df, caplog)
    assert read and not missed
    _same(third, first)
    df.unpersist()


def test_a_refit_whose_worker_dies_reads_the_rows_in_its_relaunch(spark_ps, caplog, tmp_path):
    from spark_ps.ml import _job

    spark, _ = spark_ps
    df = _sparse_df(spark, seed=11).cache()
    lr = LogisticRegression(maxIter=10, regParam=0.01)
    first, _, _ = _fit(lr, df, caplog)
    marker = tmp_path / "failed"
    _job.inject_failure_once("grad", nth=3, part=1, marker=str(marker))
    try:
        second, read, missed = _fit(lr, df, caplog)
    finally:
        _job.clear_failures()
    assert marker.exists() and not missed  # a real failure, not a miss
    assert not read  # the relaunch read the rows (its executor might have been new)
    _same(second, first)


def test_inputs_that_are_not_persisted_or_recached_or_switched_off_read_rows(spark_ps, caplog):
    spark, _ = spark_ps
    lr = LogisticRegression(maxIter=5, regParam=0.01)
    plain = _sparse_df(spark, n=500, seed=5)
    before = _key_dirs(spark)
    _fit(lr, plain, caplog)
    _, read, _ = _fit(lr, plain, caplog)
    assert not read and _key_dirs(spark) == before  # nothing saved for unpersisted input

    df = _sparse_df(spark, n=500, seed=6).withColumn("w", F.lit(2.0)).cache()
    _fit(lr, df, caplog)
    df.unpersist()
    df.cache()  # a new cache of the same plan: its source may have changed meanwhile
    _, read, _ = _fit(lr, df, caplog)
    assert not read
    _, read, _ = _fit(lr, df, caplog)
    assert read

    # other columns or another partitioning of the same cached rows: another parse
    _, read, _ = _fit(LogisticRegression(maxIter=5, weightCol="w"), df, caplog)
    assert not read
    _, read, _ = _fit(LogisticRegression(maxIter=5, numWorkers=1), df, caplog)
    assert not read

    spark.conf.set("spark.ps.parseCache", "false")
    try:
        _, read, _ = _fit(lr, df, caplog)
        assert not read
    finally:
        spark.conf.unset("spark.ps.parseCache")
    df.unpersist()


def test_validation_rows_and_dense_rows_come_back_as_saved(spark_ps, caplog):
    spark, _ = spark_ps
    df = _sparse_df(spark, seed=7, val=True).cache()
    lr = LogisticRegression(maxIter=10, regParam=0.01, validationIndicatorCol="isVal")
    first, _, _ = _fit(lr, df, caplog)
    second, read, _ = _fit(lr, df, caplog)
    assert read
    _same(second, first)
    assert second.summary.validationAucHistory == pytest.approx(first.summary.validationAucHistory)
    df.unpersist()

    rng = np.random.default_rng(8)
    X = rng.normal(size=(1500, 6))
    y = X @ rng.normal(size=6) + 0.1 * rng.normal(size=1500)
    rows = [(float(y[i]), Vectors.dense(X[i])) for i in range(1500)]
    dense = spark.createDataFrame(rows, ["label", "features"]).repartition(2).cache()
    lin = LinearRegression(maxIter=20, regParam=0.01, solver="l-bfgs")
    a, _, _ = _fit(lin, dense, caplog)
    b, read, _ = _fit(lin, dense, caplog)
    assert read
    _same(b, a)
    dense.unpersist()


def test_gbt_refits_read_the_saved_rows_and_grow_the_same_trees(spark_ps, caplog):
    from spark_ps.ml.classification import GBTClassifier

    spark, _ = spark_ps
    rng = np.random.default_rng(10)
    X = rng.normal(size=(2000, 5))
    y = ((X[:, 0] * X[:, 1] + X[:, 2]) > 0).astype(float)
    rows = [(float(y[i]), Vectors.dense(X[i])) for i in range(2000)]
    df = spark.createDataFrame(rows, ["label", "features"]).repartition(2).cache()
    gbt = GBTClassifier(maxIter=5, maxDepth=3, seed=1)
    first, read1, _ = _fit(gbt, df, caplog)
    second, read2, _ = _fit(gbt, df, caplog)
    assert not read1 and read2
    assert second.toDebugString == first.toDebugString  # the same splits and leaf values
    deeper, read3, _ = _fit(GBTClassifier(maxIter=5, maxDepth=4, seed=1), df, caplog)
    assert read3 and deeper.toDebugString != first.toDebugString
    df.unpersist()


def test_a_param_grid_in_cross_validation_parses_each_fold_once(spark_ps, caplog):
    from pyspark.ml.evaluation import BinaryClassificationEvaluator

    spark, _ = spark_ps
    df = _sparse_df(spark, n=2000, seed=9).cache()
    lr = LogisticRegression(maxIter=5)
    grid = ParamGridBuilder().addGrid(lr.regParam, [0.01, 0.1, 1.0]).build()
    cv = CrossValidator(
        estimator=lr,
        estimatorParamMaps=grid,
        evaluator=BinaryClassificationEvaluator(),
        numFolds=2,
        seed=1,
    )
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="spark_ps.job"):
        model = cv.fit(df)
    # each fold's first fit reads its rows; the two other regParams read its parse
    assert caplog.text.count(READ) == 2 * 2, caplog.text
    assert len(model.avgMetrics) == 3
    df.unpersist()


# ---------------------------------------------------------------- the files themselves


def _state(n_rows: int, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    indptr = np.arange(0, 3 * n_rows + 1, 3, dtype=np.int64)
    local = CSRBatch(indptr, rng.integers(0, 5, 3 * n_rows), rng.normal(size=3 * n_rows), 5)
    local.labels = rng.integers(0, 2, n_rows).astype(float)
    keys = np.array([2, 9, 11, 40, 41], dtype=np.int64)
    return {"keys": keys, "local": local, "rows": n_rows, "num_features": 50, "train_top": 41}


def test_saved_parses_round_trip_refuse_other_row_counts_and_fit_a_budget(tmp_path, monkeypatch):
    monkeypatch.setenv("SPARK_LOCAL_DIRS", str(tmp_path))
    state = _state(1000)
    arrays = (state["keys"], *vars(state["local"]).values())
    size = sum(a.nbytes for a in arrays if isinstance(a, np.ndarray))
    plan = parse_cache.ParsePlan("k1", max_bytes=int(2.5 * size))
    assert parse_cache.save(plan, 0, state, rows_in=1000)
    back = parse_cache.load(plan, 0, rows_in=1000)
    for f in ("indptr", "indices", "values", "labels"):
        np.testing.assert_array_equal(getattr(back["local"], f), getattr(state["local"], f))
    assert back["local"].weights is None
    np.testing.assert_array_equal(back["keys"], state["keys"])
    assert (back["rows"], back["num_features"], back["train_top"]) == (1000, 50, 41)
    back["local"].values[:] = 0.0  # copy-on-write: the file keeps its values
    again = parse_cache.load(plan, 0, rows_in=1000)
    np.testing.assert_array_equal(again["local"].values, state["local"].values)

    with pytest.raises(parse_cache.ParseCacheMiss, match="has 1000 rows but the partition has 999"):
        parse_cache.load(plan, 0, rows_in=999)
    assert not (tmp_path / "spark-ps-parsed" / "k1" / "p0").exists()  # stale: removed
    assert parse_cache.save(plan, 0, state, rows_in=1000)  # and saved again by the re-read
    with pytest.raises(
        parse_cache.ParseCacheMiss, match="partition 1: its saved parse is not usable"
    ):
        parse_cache.load(plan, 1, rows_in=1000)

    # a second key fits beside the first; a third pushes out the least recently used
    k2, k3 = (parse_cache.ParsePlan(k, plan.max_bytes) for k in ("k2", "k3"))
    assert parse_cache.save(k2, 0, _state(1000, 1), rows_in=1000)
    os.utime(tmp_path / "spark-ps-parsed" / "k1", (1, 1))  # k1 used longest ago
    assert parse_cache.save(k3, 0, _state(1000, 2), rows_in=1000)
    assert sorted(os.listdir(tmp_path / "spark-ps-parsed")) == ["k2", "k3"]
    # a damaged folder is a miss, is removed, and is saved again
    os.remove(tmp_path / "spark-ps-parsed" / "k3" / "p0" / "local.labels.npy")
    with pytest.raises(parse_cache.ParseCacheMiss, match="not usable"):
        parse_cache.load(k3, 0, rows_in=1000)
    assert not (tmp_path / "spark-ps-parsed" / "k3" / "p0").exists()
    assert parse_cache.save(k3, 0, _state(1000, 2), rows_in=1000)
    assert parse_cache.load(k3, 0, rows_in=1000)["local"].labels is not None
    # a parse larger than the whole budget is not saved
    tiny = parse_cache.ParsePlan("k4", max_bytes=size // 2)
    assert not parse_cache.save(tiny, 0, state, rows_in=1000)
    with pytest.raises(parse_cache.ParseCacheMiss):
        parse_cache.load(tiny, 0, rows_in=1000)


def test_a_save_sweeps_what_killed_tasks_left(tmp_path, monkeypatch):
    """Folders of saves and evictions that tasks left when they were killed are removed by
    the next save once they are stale; younger ones (a save in progress) and other
    partitions' stay."""
    monkeypatch.setenv("SPARK_LOCAL_DIRS", str(tmp_path))
    root = tmp_path / "spark-ps-parsed"
    key = root / "k1"
    old = time.time() - parse_cache.STALE_SECONDS - 60
    left = {
        "stale save": key / ".p0.dead0001",
        "young save": key / ".p0.live0001",
        "other part": key / ".p1.dead0002",
        "stale trash": root / ".trash-dead0003",
        "young trash": root / ".trash-live0004",
    }
    for name, folder in left.items():
        folder.mkdir(parents=True)
        (folder / "x.npy").write_bytes(b"\0" * 1000)
        if "stale" in name or "other" in name:
            os.utime(folder, (old, old))
    plan = parse_cache.ParsePlan("k1", max_bytes=1 << 30)
    assert parse_cache.save(plan, 0, _state(100), rows_in=100)
    gone = {name for name, folder in left.items() if not folder.exists()}
    assert gone == {"stale save", "stale trash"}
    assert parse_cache.load(plan, 0, rows_in=100)["rows"] == 100


def test_separate_executors_read_the_parses_they_saved():
    """local-cluster: two executor JVMs, each with its own local directory. The cached
    blocks stay where the first fit's tasks ran, Spark schedules the later fits' tasks by
    them, and each reads the parse its executor saved."""
    from child_jobs import ROOT, result_of, spark_submit

    fits = result_of(spark_submit(ROOT / "tests" / "parse_cache_fit.py", timeout=400))["fits"]
    assert [(f["read"], f["missed"]) for f in fits] == [
        (False, False),
        (True, False),
        (True, False),
    ]
    for f in fits[1:]:
        np.testing.assert_allclose(
            f["coefficients"], fits[0]["coefficients"], rtol=1e-9, atol=1e-12
        )
        assert f["intercept"] == pytest.approx(fits[0]["intercept"], rel=1e-9, abs=1e-12)


def test_memory_only_inputs_whose_blocks_could_change_are_not_saved(spark_ps, caplog, tmp_path):
    """A MEMORY_ONLY block may be dropped and recomputed; after a shuffle (or with rand)
    the recomputed block may hold other rows, so nothing is saved for such an input."""
    from pyspark import StorageLevel

    spark, _ = spark_ps
    lr = LogisticRegression(maxIter=5, regParam=0.01)
    shuffled = _sparse_df(spark, n=500, seed=12).persist(StorageLevel.MEMORY_ONLY)
    _fit(lr, shuffled, caplog)
    _, read, _ = _fit(lr, shuffled, caplog)
    assert not read
    shuffled.unpersist()
    _sparse_df(spark, n=500, seed=12).write.parquet(str(tmp_path / "rows"))
    plain = spark.read.parquet(str(tmp_path / "rows"))  # a file scan: its blocks repeat
    plain = plain.persist(StorageLevel.MEMORY_ONLY)
    _fit(lr, plain, caplog)
    _, read, _ = _fit(lr, plain, caplog)
    assert read
    plain.unpersist()
