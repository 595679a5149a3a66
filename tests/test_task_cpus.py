"""A task given several CPUs (``spark.task.cpus``): one worker per task slot, its kernels on
that many threads, and the same models as single-CPU workers grow."""

from __future__ import annotations

import numpy as np
import pytest
from child_jobs import ROOT, result_of, spark_submit
from task_cpus_fit import GBT, LR, frame

from spark_ps.ml._job import slots_by_division, task_slots


def test_task_slots_are_the_cores_over_the_cpus_of_a_task(spark):
    assert task_slots(spark.sparkContext) == 2  # local[2], one CPU a task
    assert [slots_by_division(5, c) for c in ("1", "2", 3, "", None, "8")] == [5, 2, 1, 5, 5, 1]


def test_two_cpus_a_task_fit_one_threaded_worker_to_the_same_models(spark_ps):
    """local[2] with spark.task.cpus=2 has one task slot: a barrier job of two workers
    would never start (fits hung before). The fit runs one worker whose kernels use two
    threads, and grows the trees two single-CPU workers grow here (exact sums: the same
    trees, bit for bit); LR reaches the same optimum."""
    from spark_ps.ml.classification import GBTClassifier, LogisticRegression

    done = spark_submit(
        ROOT / "tests" / "task_cpus_fit.py",
        master="local[2]",
        conf={"spark.task.cpus": "2"},
        timeout=400,
    )
    child = result_of(done)
    assert child["slots"] == 2 and child["task_slots"] == 1
    assert child["threads"] == [2]  # worker 0's profile: its kernels ran on two threads
    spark, _ = spark_ps
    df = frame(spark).repartition(2).cache()
    trees = GBTClassifier(**GBT).fit(df).toDebugString
    assert child["trees"].split("\n", 1)[1] == trees.split("\n", 1)[1]  # after the uid
    lr = LogisticRegression(**LR).fit(df)
    np.testing.assert_allclose(
        child["coefficients"], lr.coefficients.toArray(), rtol=1e-5, atol=1e-8
    )
    assert child["intercept"] == pytest.approx(lr.intercept, rel=1e-5, abs=1e-8)
    df.unpersist()
