"""Fits that survive a SIGKILLed shard, checkpoints during fits, torn checkpoints.

Each test runs its own PS with a checkpoint directory (made the active one for the fit),
kills a real shard process with SIGKILL, and compares with a clean run on the same PS.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from child_jobs import result_of, spark_submit
from pyspark.ml.linalg import Vectors

from ps_server.checkpoint import latest_version, read_manifest, sealed_versions
from ps_server.shard.snapshot import load_shard
from spark_ps import PSContext, PSVector
from spark_ps.client import PSError
from spark_ps.ml import _recovery
from spark_ps.ml.classification import GBTClassifier, LogisticRegression
from spark_ps.ml.gbt import boost_worker


@pytest.fixture
def ckpt_ps(spark, tmp_path):
    """A 2-shard PS that checkpoints to tmp_path, active for the test's fits."""
    own = PSContext.start(numShards=2, checkpointDir=str(tmp_path / "ckpt"))
    previous, PSContext._active = PSContext._active, own
    yield own
    PSContext._active = previous
    own.stop()


def _kill_shard(ps, index: int) -> int:
    pid = ps.client.health()[index].pid
    os.kill(pid, signal.SIGKILL)
    return pid


def _kill_at(monkeypatch, ps, boundary: int, after_rounds: int = 0) -> list:
    """SIGKILL shard 1 when a fit reaches `boundary`, or `after_rounds` worker rounds
    later (inside the next iteration); returns the list the victim's pid goes into."""
    from spark_ps.ml import _job

    killed: list[int] = []
    armed: list[int] = []
    original, collect = _recovery.FitRecovery.boundary, _job.PSJob.collect

    def kill() -> None:
        killed.append(ps.client.health()[1].pid)
        os.kill(killed[0], signal.SIGKILL)

    def boundary_then_arm(self, iteration, state):
        original(self, iteration, state)
        if iteration == boundary and not killed and not armed:
            armed.append(after_rounds)
            if not after_rounds:
                kill()

    def collect_then_kill(self, round_):
        out = collect(self, round_)
        if armed and not killed:
            armed[0] -= 1
            if armed[0] == 0:
                kill()
        return out

    monkeypatch.setattr(_recovery.FitRecovery, "boundary", boundary_then_arm)
    monkeypatch.setattr(_job.PSJob, "collect", collect_then_kill)
    return killed


def _lr_data(spark, n=1500, d=8, seed=21):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d)) * rng.uniform(0.5, 3.0, d)
    y = (rng.uniform(size=n) < 1 / (1 + np.exp(-(X @ rng.normal(size=d)) * 0.5))).astype(float)
    rows = [(float(y[i]), Vectors.dense(X[i])) for i in range(n)]
    return spark.createDataFrame(rows, ["label", "features"]).cache()


def _auc(model, df) -> float:
    from pyspark.ml.evaluation import BinaryClassificationEvaluator

    return BinaryClassificationEvaluator().evaluate(model.transform(df))


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_lr_fit_survives_a_shard_sigkill_and_equals_the_clean_run(spark, ckpt_ps, monkeypatch):
    df = _lr_data(spark)
    train, test = df.randomSplit([0.7, 0.3], seed=3)
    lr = LogisticRegression(maxIter=25, regParam=0.01, tol=1e-9, numWorkers=2, checkpointInterval=4)
    clean = lr.fit(train)
    before = ckpt_ps.metrics()
    killed = _kill_at(monkeypatch, ckpt_ps, boundary=6)  # checkpoints at 0, 4: 2 iterations lost
    restarted = lr.fit(train)
    assert killed and killed[0] not in [h.pid for h in ckpt_ps.client.health()]
    after = {k: v - before.get(k, 0) for k, v in ckpt_ps.metrics().items()}
    assert after["restart"] == 1 and after["restore"] == 1
    assert after["iteration_lost"] == 2
    # the resumed solver walks the clean run's path: the same floats, not just close ones
    np.testing.assert_array_equal(restarted.coefficients.toArray(), clean.coefficients.toArray())
    assert restarted.intercept == clean.intercept
    assert restarted.summary.objectiveHistory == clean.summary.objectiveHistory
    assert abs(_auc(restarted, test) - _auc(clean, test)) <= 0.002


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("spread", [True, False], ids=["shard-in-use", "idle-shard"])
def test_gbt_fit_survives_a_shard_sigkill_with_identical_trees(spark, ckpt_ps, monkeypatch, spread):
    """`spread`: every shard finds splits, so the killed shard serves the fit (its workers
    fail and resume); else 5 features need one shard and the killed one only spoils the
    checkpoint being written, which is written again."""
    rng = np.random.default_rng(5)
    X = np.round(rng.normal(size=(2000, 5)), 1)
    y = ((X[:, 0] + X[:, 1] * X[:, 2]) > 0).astype(float)
    df = spark.createDataFrame(
        [(float(y[i]), Vectors.dense(X[i])) for i in range(len(y))], ["label", "features"]
    ).cache()
    if spread:
        monkeypatch.setattr(boost_worker, "CELLS_PER_SHARD", 1)
    gbt = GBTClassifier(maxIter=5, maxDepth=4, seed=3, numWorkers=2, checkpointInterval=2)
    clean = gbt.fit(df)
    before = ckpt_ps.metrics()
    # the workers grow trees on their own: when the driver reads tree 1 they are inside tree 2
    killed = _kill_at(monkeypatch, ckpt_ps, boundary=2)
    restarted = gbt.fit(df)
    assert killed
    after = {k: v - before.get(k, 0) for k, v in ckpt_ps.metrics().items()}
    assert after["restart"] == 1  # the relaunched workers resumed from the trees read
    assert after["checkpoint"] >= 2  # at trees 2 and 4
    assert restarted.toDebugString.split("\n", 1)[1] == clean.toDebugString.split("\n", 1)[1]
    np.testing.assert_array_equal(restarted.treeWeights, clean.treeWeights)


@pytest.mark.timeout(300)
def test_checkpoint_on_demand_during_a_fit_holds_the_fit_state(spark, ckpt_ps, monkeypatch):
    df = _lr_data(spark, n=600, d=4, seed=2)
    lr = LogisticRegression(maxIter=12, regParam=0.01, numWorkers=2, checkpointInterval=-1)
    asked: list = []
    original = _recovery.FitRecovery.boundary

    def ask_at_3(self, iteration, state):
        original(self, iteration, state)
        if iteration == 3 and not asked:  # from another thread, as a user would
            t = threading.Thread(target=lambda: asked.append(ckpt_ps.checkpoint()))
            t.start()
            asked.append(t)
            time.sleep(0.5)  # let the request land before the next boundary

    monkeypatch.setattr(_recovery.FitRecovery, "boundary", ask_at_3)
    model = lr.fit(df)
    asked[0].join(60)
    version = asked[1]
    assert sealed_versions(ckpt_ps.checkpoint_dir) == [version]  # only the one asked for
    (fit,) = read_manifest(ckpt_ps.checkpoint_dir, version)["fits"].values()
    assert fit["iteration"] == 4  # taken at the next iteration boundary
    assert fit["state"]["iter"] == 4 and len(fit["state"]["history"]) == 5
    assert fit["state"]["history"] == model.summary.objectiveHistory[:5]


@pytest.mark.timeout(180)
def test_shard_killed_mid_checkpoint_write_leaves_the_previous_version(tmp_path):
    """A real shard process SIGKILLed while writing its file: that version is never sealed,
    the restarted shard and `recover()` load the previous one."""
    uri = str(tmp_path / "ckpt")
    ps = PSContext.start(numShards=2, checkpointDir=uri)
    try:
        n = 4_000_000  # ~16 MB per shard file: the write takes long enough to be caught
        w = PSVector.dense(n, context=ps)
        w.update(np.arange(n), np.ones(n))
        assert ps.checkpoint() == 1
        w.increment(np.arange(n), np.ones(n))  # now 2.0 everywhere
        box: list = []
        writer = threading.Thread(target=lambda: box.append(_try(lambda: ps.checkpoint())))
        writer.start()
        tmp = _wait_for_tmp(tmp_path / "ckpt" / "v000002")
        victim = int(tmp.name.split(".tmp-")[1].split("-")[0])  # the writing shard's pid
        os.kill(victim, signal.SIGKILL)
        writer.join(120)
        assert tmp.exists()  # the rename never happened: it died mid-write
        assert isinstance(box[0], PSError) and "stays unsealed" in str(box[0])
        assert latest_version(uri) == 1 and sealed_versions(uri) == [1]
        with pytest.raises(Exception, match="no manifest"):
            load_shard(uri, 2, 0)
        assert victim not in [h.pid for h in ps.client.health()]
        # the restarted shard came back with version 1 (ones), the other still holds twos
        assert set(np.unique(w.pull()).tolist()) == {1.0, 2.0}
        assert ps.recover() == 1
        np.testing.assert_array_equal(w.pull(), np.ones(n))
        assert ps.metrics()["restart"] == 1 and ps.metrics()["checkpoint"] == 1
    finally:
        ps.stop()


def _try(fn):
    try:
        return fn()
    except Exception as e:  # noqa: BLE001 - handed to the test
        return e


def _wait_for_tmp(vdir, timeout: float = 60.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            for entry in os.scandir(vdir):
                if ".tmp-" in entry.name:
                    return Path(entry.path)
        except FileNotFoundError:
            pass
    raise AssertionError(f"no shard file was being written under {vdir}")


_EXECUTOR_KILL_JOB = """
import json, sys, time
from pathlib import Path
import numpy as np
from pyspark.ml.linalg import Vectors
from pyspark.sql import SparkSession
from spark_ps import PSContext
from spark_ps.ml import _job
from spark_ps.ml.classification import GBTClassifier

work = Path(sys.argv[1])
spark = SparkSession.builder.appName("spark-ps-gbt-executor-kill").getOrCreate()
sc = spark.sparkContext
deadline = time.time() + 120
while sc._jsc.sc().getExecutorMemoryStatus().size() < 3 and time.time() < deadline:
    time.sleep(0.2)  # the driver + 2 executors
ps = PSContext.getOrCreate(spark)
rng = np.random.default_rng(4)
X = np.round(rng.normal(size=(600, 4)), 1)
y = ((X[:, 0] + X[:, 1] * X[:, 2]) > 0).astype(float)
df = spark.createDataFrame([(float(y[i]), Vectors.dense(X[i])) for i in range(len(y))],
                           ["label", "features"])
gbt = GBTClassifier(maxIter=3, maxDepth=3, seed=1, numWorkers=2)
t0 = time.time()
clean = gbt.fit(df)
clean_seconds = time.time() - t0
marker = work / "killed"
_job.inject_failure_once("hist", nth=4, part=1, marker=str(marker), kill_executor=True)
t0 = time.time()
killed = gbt.fit(df)
result = {
    "clean": clean.toDebugString.split("\\n", 1)[1],
    "killed": killed.toDebugString.split("\\n", 1)[1],
    "weights": [list(clean.treeWeights), list(killed.treeWeights)],
    "jvm": int(marker.read_text()),
    "seconds": time.time() - t0,
    "clean_seconds": clean_seconds,
}
spark.stop()
print("RESULT " + json.dumps(result))
"""


@pytest.mark.cluster
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_gbt_fit_survives_a_sigkilled_executor_jvm_with_identical_trees(tmp_path):
    """local-cluster[2,1,1024]: a worker task SIGKILLs its own executor JVM in the middle of
    a tree; the driver relaunches the barrier job on a new executor, the new tasks rebuild
    their memory from the posted state, and the trees equal the clean run's."""

    job = tmp_path / "job.py"
    job.write_text(_EXECUTOR_KILL_JOB)
    conf = {
        "spark.ui.enabled": "false",
        "spark.task.maxFailures": "4",
        "spark.ps.numShards": "2",
        "spark.scheduler.barrier.maxConcurrentTasksCheck.interval": "2s",
    }
    r = result_of(spark_submit(job, tmp_path, conf=conf))
    import psutil

    assert not psutil.pid_exists(r["jvm"])  # the executor JVM really died
    assert r["killed"] == r["clean"], f"fit with the kill took {r['seconds']:.1f}s"
    assert r["weights"][0] == r["weights"][1]
    print(f"clean fit {r['clean_seconds']:.1f}s, fit with a killed executor {r['seconds']:.1f}s")
