"""A whole host lost in the middle of a Spark fit (LR, GBT, online FTRL), with replicas: it ends
with the model of a fit that nothing disturbed.

Three hosts (network namespaces, `bench/netns.py`) run `spark-ps-server shards --join`
with two shard slots each under a coordinator with ``--replicas 2`` in the root
namespace, where Spark (local[2]) fits with ``spark.ps.address``. Mid-fit every process of
the host holding partition 0's primary is SIGKILLed: its primaries' backups on the other
hosts are promoted (they applied every acknowledged update), the backups it held are
seeded anew elsewhere, and clients retry the same request ids. Nothing restarts empty,
so no fit rolls back: the float operations are the clean fit's, in the same order
(contributions are summed in partition order), and the models are equal.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from pyspark.ml.linalg import Vectors

from bench.netns import Hosts, service, unavailable
from ps_server.coordinator.status import status
from spark_ps import PSContext
from spark_ps.ml import _job
from spark_ps.ml.classification import GBTClassifier, LogisticRegression

_WHY = unavailable()
pytestmark = [
    pytest.mark.skipif(bool(_WHY), reason=_WHY or "-"),
    pytest.mark.slow,
    pytest.mark.timeout(600),
]
TOKEN = "host-loss-token"


def _backed_up(address: str, timeout: float = 60.0) -> dict:
    """The status once every partition has a backup on another host than its primary."""
    deadline = time.monotonic() + timeout
    while True:
        st = status(address, TOKEN)
        parts = st["partitions"]
        if all(p["backup_host"] and p["backup_host"] != p["host"] for p in parts):
            return st
        assert time.monotonic() < deadline, f"backups not all seeded: {parts}"
        time.sleep(0.2)


def _kill_when(monkeypatch, hosts: Hosts, victim: int, op: str, nth: int) -> threading.Event:
    """SIGKILL every process of host `victim` (on a thread, the fit going on) right after
    the driver posts its `nth` command `op` (or reads its `nth` finished tree, op "tree")."""
    done, seen = threading.Event(), [0]
    command, wait_posted = _job.PSJob.command, _job.PSJob.wait_posted

    def kill() -> None:
        assert hosts.kill_host(victim) >= 3  # its supervisor and its shard processes
        done.set()

    def maybe(name: str) -> None:
        if name == op:
            seen[0] += 1
            if seen[0] == nth:
                threading.Thread(target=kill, daemon=True).start()

    def command_then(self, name, **payload):
        r = command(self, name, **payload)
        maybe(name)
        return r

    def wait_then(self, topic):
        r = wait_posted(self, topic)
        if "/tree/" in topic:
            maybe("tree")
        return r

    monkeypatch.setattr(_job.PSJob, "command", command_then)
    monkeypatch.setattr(_job.PSJob, "wait_posted", wait_then)
    return done


def test_lr_and_gbt_fits_lose_a_whole_host_mid_fit_and_end_with_the_clean_model(
    spark, tmp_path, monkeypatch
):
    rng = np.random.default_rng(11)
    x = np.round(rng.normal(size=(2000, 8)), 2)
    y = ((x[:, 0] + x[:, 1] * x[:, 2] + 0.3 * rng.normal(size=2000)) > 0).astype(float)
    df = spark.createDataFrame(
        [(float(y[i]), Vectors.dense(x[i])) for i in range(len(y))], ["label", "features"]
    ).repartition(2)
    df.cache().count()
    args = ["--replicas", "2", "--host-timeout", "4"]
    with Hosts(3) as hosts, service(hosts, tmp_path, TOKEN, shards=2, coordinator_args=args) as svc:
        previous, PSContext._active = PSContext._active, None
        ps = PSContext.getOrCreate(spark, address=svc.address, token=TOKEN)
        try:
            st = _backed_up(svc.address)
            victim_id = st["partitions"][0]["host"]
            victim = next(i for i in range(3) if hosts.address(i) == victim_id)
            lr = LogisticRegression(maxIter=30, regParam=0.01, tol=0.0)
            gbt = GBTClassifier(maxIter=5, maxDepth=3, seed=3)
            clean_lr, clean_gbt = lr.fit(df), gbt.fit(df)

            killed = _kill_when(monkeypatch, hosts, victim, "grad", 6)
            faulted_lr = lr.fit(df)
            assert clean_lr.summary.totalIterations > 6  # the kill at round 6 is mid-fit
            assert killed.wait(60)
            assert faulted_lr.summary.objectiveHistory == clean_lr.summary.objectiveHistory
            np.testing.assert_array_equal(
                faulted_lr.coefficients.toArray(), clean_lr.coefficients.toArray()
            )
            assert faulted_lr.intercept == clean_lr.intercept
            after = status(svc.address, TOKEN)
            lost = [p["index"] for p in st["partitions"] if p["host"] == victim_id]
            assert after["counters"]["promotion"] >= len(lost)
            assert after["counters"]["restart"] == 0  # nothing restarted empty: no rollback
            alive = {h["id"] for h in after["hosts"] if h["alive"]}
            assert victim_id not in alive and len(alive) == 2

            monkeypatch.undo()
            _backed_up(svc.address)  # the lost backups seeded anew on the two hosts left
            # GBT on two hosts now: kill the one with partition 0's primary after tree 2 is
            # read; the workers' rendezvous fails over, the job is relaunched and regrows
            # the current tree from the trees the driver holds
            st = status(svc.address, TOKEN)
            victim_id = st["partitions"][0]["host"]
            victim = next(i for i in range(3) if hosts.address(i) == victim_id)
            killed = _kill_when(monkeypatch, hosts, victim, "tree", 2)
            faulted_gbt = gbt.fit(df)
            assert killed.wait(60)
            assert (
                faulted_gbt.toDebugString.split("\n", 1)[1]
                == (clean_gbt.toDebugString.split("\n", 1)[1])
            )
            np.testing.assert_array_equal(faulted_gbt.treeWeights, clean_gbt.treeWeights)
            assert status(svc.address, TOKEN)["counters"]["restart"] == 0
        finally:
            ps.stop()  # an external service: only this process's connection closes
            PSContext._active = previous


def test_an_online_ftrl_stream_loses_a_whole_host_between_batches_and_ends_where_a_clean_one_does(
    spark, tmp_path, monkeypatch
):
    """Online FTRL on the same service: the host of partition 0's primary is SIGKILLed
    after micro-batch 1 was learned and before its commit. Its backups are promoted with
    the batch's pending contributions (a seed and every forward carry them), so the commit
    goes on and the model's state ends bit for bit where a clean stream's does."""
    from online_data import learner_state as state
    from online_data import train_stream, write_stream_files

    from spark_ps.ml.online import OnlineLogisticRegression
    from spark_ps.ml.online import learner as online_learner

    src = tmp_path / "src"
    write_stream_files(src, 3, 1000, 40)
    schema = spark.read.parquet(str(src)).schema

    def run(learner, ckpt):
        train_stream(spark, learner, src, tmp_path / ckpt, schema)

    args = ["--replicas", "2", "--host-timeout", "4"]
    logs = tmp_path / "logs"
    logs.mkdir()
    with Hosts(3) as hosts, service(hosts, logs, TOKEN, shards=2, coordinator_args=args) as svc:
        previous, PSContext._active = PSContext._active, None
        ps = PSContext.getOrCreate(spark, address=svc.address, token=TOKEN)
        clean = OnlineLogisticRegression(featuresCol="keys", alpha=0.1, modelName="hl-clean")
        faulted = OnlineLogisticRegression(featuresCol="keys", alpha=0.1, modelName="hl-faulted")
        try:
            st = _backed_up(svc.address)
            victim_id = st["partitions"][0]["host"]
            victim = next(i for i in range(3) if hosts.address(i) == victim_id)
            run(clean, "ck-clean")
            keys_a, zn_a = state(clean)
            chaos, killed = online_learner._chaos, []

            def kill_at(point: str, batch_id: int) -> None:
                chaos(point, batch_id)
                if (point, int(batch_id)) == ("before_commit", 1) and not killed:
                    killed.append(hosts.kill_host(victim))

            monkeypatch.setattr(online_learner, "_chaos", kill_at)
            run(faulted, "ck-faulted")
            assert killed and killed[0] >= 3  # its supervisor and its shard processes
            assert faulted.appliedBatches().tolist() == [0, 1, 2]
            keys_b, zn_b = state(faulted)
            np.testing.assert_array_equal(keys_a, keys_b)
            np.testing.assert_array_equal(zn_a, zn_b)
            after = status(svc.address, TOKEN)
            assert after["counters"]["promotion"] >= 1 and after["counters"]["restart"] == 0
        finally:
            for learner in (clean, faulted):
                try:
                    learner.drop()
                except Exception:  # noqa: BLE001 - the service may be gone; it stops anyway
                    pass
            ps.stop()
            PSContext._active = previous
