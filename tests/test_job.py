"""The worker model: one barrier job serves a whole fit; retried tasks replace, never add."""

from __future__ import annotations

import os
import tempfile
import time

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


def _fail_always(ctx, round_, cmd):
    """Partition 0 fails in every launch, leaving a file behind each time."""
    if ctx.part == 0:
        tempfile.mkstemp(prefix="launch-", dir=cmd["dir"])
        raise RuntimeError("injected failure in every launch")
    ctx.contribute(round_, [0.0])


def _block(ctx, round_, cmd):
    """Every partition says it runs the command, then waits until its job is cancelled."""
    tempfile.mkstemp(prefix="running-", dir=cmd["dir"])
    time.sleep(120)


@pytest.mark.slow
@pytest.mark.parametrize("shuffled", [False, True], ids=["plain", "shuffled-input"])
def test_a_task_failing_in_every_launch_fails_the_fit_after_sparks_stage_limit(
    spark_ps, tmp_path, shuffled
):
    """A failed task ends the barrier job and the driver launches it again, as often as
    Spark would re-run a failed stage (spark.stage.maxConsecutiveAttempts, 4), then the
    task's own error reaches the caller. Each launch runs its tasks again, also over an
    input with a shuffle (an adaptive plan: collecting the failed Dataset again would
    only rethrow its failure)."""
    spark, ps = spark_ps
    df = _data(spark)[0]
    df = partitions_for(df.repartition(2).cache() if shuffled else df, 2)
    with pytest.raises(RuntimeError, match="injected failure in every launch"):
        with PSJob(ps, df, 2, _setup, {"fail": _fail_always}, "test-fail") as job:
            job.call("fail", dir=str(tmp_path))
    assert len(os.listdir(tmp_path)) == 4  # one per launch
    assert job.error is not None and job.result is None


@pytest.mark.slow
def test_a_cancelled_worker_job_is_not_launched_again(spark_ps, tmp_path):
    spark, ps = spark_ps
    df = partitions_for(_data(spark)[0], 2)
    with pytest.raises(RuntimeError, match="(?s)worker job failed.*SPARK_JOB_CANCELLED"):
        with PSJob(ps, df, 2, _setup, {"block": _block}, "test-cancel") as job:
            r = job.command("block", dir=str(tmp_path))
            while len(os.listdir(tmp_path)) < 2:  # both tasks are inside the command
                job._check()
                time.sleep(0.05)
            spark.sparkContext.cancelAllJobs()
            job._thread.join(timeout=60)  # a relaunch would block in the command again
            assert not job._thread.is_alive(), "the cancelled job was launched again"
            job.collect(r)
    assert len(os.listdir(tmp_path)) == 2  # no task ran the command again


def test_a_worker_of_an_aborted_launch_exits_once_a_newer_launch_is_posted(ps, tmp_path):
    """A worker process whose launch the driver replaced exits, wherever it is blocked (here
    in a one-hour command wait): Spark's kill does not always reach it, and it would hold
    its slot and keep the relaunched barrier job from starting. A worker of the newest
    launch, and one whose task ended (its watch stopped), go on."""
    import subprocess
    import sys

    from spark_ps.ml._job import superseded

    client, topic = ps.client, f"job-test-{time.monotonic_ns()}"
    script = tmp_path / "worker.py"
    script.write_text(
        "import sys, time\n"
        "from spark_ps.client import PSClient\n"
        "from spark_ps.ml._job import LaunchWatch\n"
        "address, token, topic, launch, stop = sys.argv[1:6]\n"
        "c = PSClient(address, token=token)\n"
        "w = LaunchWatch(c, topic, int(launch), 0, every=0.2)\n"
        "w.start()\n"
        "if stop == 'stop':\n"
        "    w.stop()\n"
        "    time.sleep(2)\n"
        "    sys.exit(0)\n"
        "c.wait(topic + '/cmd', 1, timeout=3600)\n"
    )

    def worker(launch: int, stop: str = "") -> subprocess.Popen:
        args = [ps.address, ps.token or "", topic, str(launch), stop]
        return subprocess.Popen([sys.executable, str(script), *args])

    old, new, done = worker(1), worker(2), worker(1, "stop")
    try:
        time.sleep(1.0)
        assert old.poll() is None and new.poll() is None  # no newer launch yet: both wait
        assert not superseded(client, topic, 1)
        client.post(f"{topic}/launch", 2, {"launch": 2})
        assert superseded(client, topic, 1) and not superseded(client, topic, 2)
        assert old.wait(timeout=30) == 3  # the aborted launch's worker is gone
        assert done.wait(timeout=30) == 0  # a finished task's watch no longer acts
        time.sleep(1.0)
        assert new.poll() is None  # the newest launch's worker still waits for commands
    finally:
        for p in (old, new, done):
            p.kill()
            p.wait()


def _advice(ctx, round_, cmd):
    from ps_server.lifecycle import huge_page_advice_on

    ctx.contribute(round_, [float(huge_page_advice_on())])


@pytest.mark.skipif(
    "NUMPY_MADVISE_HUGEPAGE" in os.environ, reason="an operator's setting stands (test_malloc)"
)
def test_a_jobs_tasks_run_without_huge_page_advice_and_put_it_back(spark_ps):
    """numpy's huge-page advice is off while a fit's task runs (its fresh big arrays must
    not stall on memory compaction) and back on afterwards for whatever the reused Python
    worker runs next."""
    spark, ps = spark_ps
    df = partitions_for(_data(spark)[0], 2)
    with PSJob(ps, df, 2, _setup, {"advice": _advice}, "test-advice") as job:
        _, out = job.call("advice")
    assert out.tolist() == [0.0]  # the sum over both partitions: off in each

    def after(batches):
        import pyarrow as pa

        from ps_server.lifecycle import huge_page_advice_on

        for _ in batches:
            pass
        yield pa.RecordBatch.from_pydict({"on": [bool(huge_page_advice_on())]})

    assert all(r.on for r in df.mapInArrow(after, "on boolean").collect())
