"""A shard primary SIGKILLed mid-fit on a replicated PS: the fit finishes with the clean model.

LR (L-BFGS) and GBT run on a PS with ``replicas=2``; right after the driver posts a
chosen round, the primary of a shard is killed. Its backup is promoted, workers and
driver retry against it, and the result must EQUAL a clean run's: same coefficients
and loss history bit for bit, same trees.
"""

from __future__ import annotations

import os
import signal
import time

import numpy as np
import pytest
from test_gbt_fit import _probs, _structure
from test_lr_fit import _dense_df

from spark_ps import PSContext
from spark_ps.ml import _job
from spark_ps.ml.classification import GBTClassifier, LogisticRegression
from spark_ps.ml.gbt import boost_worker

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def replicated(spark_ps):
    """A replicated embedded PS made the active one for the fits, then the old one back."""
    ctx = PSContext.start(numShards=2, replicas=2)
    previous = PSContext._active
    PSContext._active = ctx
    yield ctx
    PSContext._active = previous
    ctx.stop()


def _wait_for_backups(ps, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not all(b is not None for _, b in ps.client.replica_digests()):
        assert time.monotonic() < deadline, "no backup was resynced"
        time.sleep(0.2)


@pytest.fixture
def kill_primary_at(monkeypatch, replicated):
    """kill_primary_at(op, {n: shard}): SIGKILL shard's primary right after the n-th `op`
    the driver posts, or (op "tree") right after it reads the n-th finished tree of a GBT
    fit, whose workers grow the trees without driver commands."""
    killed: list[int] = []

    def arm(op: str, plan: dict[int, int]) -> list[int]:
        original, original_wait = _job.PSJob.command, _job.PSJob.wait_posted
        seen = [0]

        def maybe_kill():
            if seen[0] in plan:
                _wait_for_backups(replicated)  # the previous kill's resync is done
                pid = replicated.client.health()[plan[seen[0]]].pid
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
            seen[0] += 1

        def command(self, name, **payload):
            r = original(self, name, **payload)
            if name == op:
                maybe_kill()
            return r

        def wait_posted(self, topic):
            r = original_wait(self, topic)
            if op == "tree" and "/tree/" in topic:
                maybe_kill()
            return r

        monkeypatch.setattr(_job.PSJob, "command", command)
        monkeypatch.setattr(_job.PSJob, "wait_posted", wait_posted)
        return killed

    return arm


def _assert_replicas_identical(ps) -> None:
    _wait_for_backups(ps)
    for i, (p, b) in enumerate(ps.client.replica_digests()):
        assert p.digest == b.digest, f"shard {i}: replicas differ after the fit"


def test_lr_fit_with_killed_primaries_equals_the_clean_fit(spark, replicated, kill_primary_at):
    df = _dense_df(spark, n=800, d=6, seed=9)
    lr = LogisticRegression(maxIter=30, regParam=0.01, tol=1e-9)
    clean = lr.fit(df)
    killed = kill_primary_at("grad", {3: 0, 8: 1})
    faulted = lr.fit(df)
    assert len(killed) == 2  # both primaries really died mid-fit
    np.testing.assert_array_equal(faulted.coefficients.toArray(), clean.coefficients.toArray())
    assert faulted.intercept == clean.intercept
    assert faulted.summary.objectiveHistory == clean.summary.objectiveHistory
    _assert_replicas_identical(replicated)


def test_gbt_fit_with_a_killed_primary_grows_the_clean_trees(
    spark, replicated, kill_primary_at, monkeypatch
):
    # every shard finds splits of its features, so the killed primary serves the fit
    monkeypatch.setattr(boost_worker, "CELLS_PER_SHARD", 1)
    rng = np.random.default_rng(0)
    n, d = 2000, 5
    X = np.round(rng.normal(size=(n, d)), 1)
    y = (X[:, 0] + X[:, 1] * X[:, 2] + 0.5 * rng.normal(size=n) > 0).astype(float)
    from pyspark.ml.linalg import Vectors

    data = spark.createDataFrame(
        [(float(y[i]), Vectors.dense(X[i])) for i in range(n)], ["label", "features"]
    ).cache()
    gbt = GBTClassifier(maxIter=8, maxDepth=3, seed=7)
    clean = gbt.fit(data)
    killed = kill_primary_at("tree", {1: 1})  # workers are growing tree 2 or later
    faulted = gbt.fit(data)
    assert len(killed) == 1
    assert _structure(faulted) == _structure(clean)
    np.testing.assert_array_equal(_probs(faulted, data), _probs(clean, data))
    _assert_replicas_identical(replicated)


def test_lr_fit_with_both_replicas_of_a_shard_killed_recovers_by_default(
    spark, replicated, monkeypatch
):
    """Backup and primary of shard 1 SIGKILLed together mid-fit (no checkpoint directory):
    nothing holds the shard's state, so it restarts empty and the fit recovers as on an
    unreplicated PS (spark_ps.ml._recovery): from the iterate held at iteration 10, or
    from the start. Within 1e-6 of the clean fit (see tests/test_default_recovery.py)."""
    from ps_server.proto import ps_pb2 as pb
    from ps_server.proto import ps_pb2_grpc as pb_grpc

    df = _dense_df(spark, n=800, d=6, seed=9)
    lr = LogisticRegression(maxIter=100, regParam=0.01, tol=1e-10)
    clean = lr.fit(df)
    _wait_for_backups(replicated)
    original, seen, killed = _job.PSJob.command, [0], []

    def command(self, name, **payload):
        r = original(self, name, **payload)
        if name == "grad":
            seen[0] += 1
            if seen[0] == 5:
                client = replicated.client
                client.refresh()
                stub = pb_grpc.ShardStub(client._channel(client.backups[1]))
                backup = stub.Health(pb.Empty(), metadata=client._md, timeout=30).pid
                primary = client.health()[1].pid
                before = client.shard_restarts()
                os.kill(backup, signal.SIGKILL)
                os.kill(primary, signal.SIGKILL)
                killed.extend([backup, primary])
                deadline = time.monotonic() + 60
                while client.shard_restarts() == before:
                    assert time.monotonic() < deadline, "shard 1 was not restarted"
                    time.sleep(0.05)
        return r

    monkeypatch.setattr(_job.PSJob, "command", command)
    before = replicated.metrics()
    faulted = lr.fit(df)
    assert len(killed) == 2
    after = {k: v - before.get(k, 0) for k, v in replicated.metrics().items()}
    assert after["restart"] == 1 and after["restore"] == 1
    np.testing.assert_allclose(
        faulted.coefficients.toArray(), clean.coefficients.toArray(), rtol=0, atol=1e-6
    )
    assert faulted.intercept == pytest.approx(clean.intercept, abs=1e-6)
