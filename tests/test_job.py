"""The worker model: one barrier job serves a whole fit; retried tasks replace, never add."""

from __future__ import annotations

import os

import numpy as np
import pytest

from spark_ps import PSVector
from spark_ps.data import read_partition
from spark_ps.ml._job import PSJob, partitions_for


def _setup(batches, ctx):
    csr = read_partition(batches, "features", label_col="label")
    ctx.state.update(csr=csr, rows=csr.n_rows)


def _grad(ctx, round_, cmd):
    """Push X^T y for this partition exactly once per round; fail once if asked to."""
    csr = ctx.state["csr"]
    g = ctx.tensor(cmd["g"])
    keys, local = csr.localize()
    contrib = local.rmatvec(local.labels, keys.size)
    g.aggregate(keys, contrib, round=round_, part=ctx.part)
    marker = cmd.get("fail_once")
    if marker and ctx.part == 0 and not os.path.exists(marker):
        open(marker, "w").close()  # the retried stage will find it and go on
        raise RuntimeError("injected failure after pushing")
    ctx.contribute(round_, [local.labels.sum(), csr.n_rows])


def _data(spark):
    from pyspark.ml.linalg import Vectors

    rng = np.random.default_rng(3)
    rows = [
        (
            float(rng.integers(0, 5)),
            Vectors.sparse(20, sorted(rng.choice(20, 3, False).tolist()), [1.0, 2.0, 3.0]),
        )
        for _ in range(200)
    ]
    return spark.createDataFrame(rows, ["label", "features"]), rows


def _reference(rows):
    ref = np.zeros(20)
    for y, v in rows:
        ref[v.indices] += y * v.values
    return ref


@pytest.mark.slow
def test_one_job_serves_many_rounds_and_retry_replaces(spark_ps, tmp_path):
    spark, ps = spark_ps
    df, rows = _data(spark)
    df = partitions_for(df, 2)
    g = PSVector.dense(20)
    with PSJob(ps, df, 2, _setup, {"grad": _grad}, "test") as job:
        marker = str(tmp_path / "failed-once")
        for fail in ("", marker, ""):  # round 2 fails once on partition 0, after pushing
            r, out = job.call("grad", g=g.name, fail_once=fail)
            g.reduce(r)
            np.testing.assert_array_equal(out, [sum(y for y, _ in rows), 200.0])
            np.testing.assert_array_equal(g.pull(), _reference(rows))
    assert os.path.exists(marker)  # the failure really happened
    assert job.result is not None and sum(r.rows for r in job.result) == 200
