"""``spark.ps.mode=executors``: the PS's shards run beside the application's own executors
(started by the bridge plugin's executor half), the coordinator beside the driver.

On ``local-cluster[2,1,1024]`` (separate executor JVMs on this host); the same across
hosts, on a standalone cluster in network namespaces, is in ``tests/test_cluster.py``.
"""

from __future__ import annotations

import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from child_jobs import result_of, run_script, spark_submit
from test_jvm_bridge import bridge_jar as _bridge_jar  # noqa: F401 - fixture: jar, rebuilt if stale

from ps_server.coordinator.host_service import HostService
from ps_server.proto import ps_pb2 as pb
from spark_ps.context import _in_executors

ROOT = Path(__file__).resolve().parents[1]
JOB = ROOT / "tests" / "executors_fit.py"
PLUGIN = "io.sparkps.bridge.PSPlugin"


@pytest.fixture(scope="module")
def jar(request) -> Path:
    return request.getfixturevalue("_bridge_jar")


def test_an_unknown_mode_is_refused_naming_the_setting():
    with pytest.raises(ValueError, match=r"spark.ps.mode must be embedded or executors.*'shards'"):
        _in_executors(None, {"mode": "shards"})


def test_a_local_master_keeps_the_embedded_ps():
    assert _in_executors(None, {"mode": "executors"}) is False  # no Spark: local


def _joined_after(join_wait: float, delays: dict[str, float]) -> tuple[set[str], float]:
    """Hosts the coordinator places on, and when, if each host joins after its delay."""
    service = HostService(min_hosts=1, join_wait=join_wait)

    def join(host: str, delay: float) -> None:
        time.sleep(delay)
        info = pb.HostInfo(id=host, address=f"addr-{host}", shards=1, run_id=f"run-{host}")
        service.table.report(pb.HostReport(host=info))

    try:
        for host, delay in delays.items():
            threading.Thread(target=join, args=(host, delay), daemon=True).start()
        t0 = time.monotonic()
        hosts = service._wait_for_joins()
        return {h.id for h in hosts}, time.monotonic() - t0
    finally:
        service.stop()


def test_join_wait_takes_the_executors_that_join_close_together():
    """With no host count to wait for (spark.ps.joinWait): every host that joins within
    join_wait of the previous one, not one that comes later; without it, the first."""
    hosts, seconds = _joined_after(0.8, {"a": 0.0, "b": 0.4, "late": 3.0})
    assert hosts == {"a", "b"}
    assert 1.1 < seconds < 2.5, seconds  # b at 0.4 s, then 0.8 s without a join
    hosts, seconds = _joined_after(0.0, {"a": 0.0, "b": 0.4})
    assert hosts == {"a"} and seconds < 0.4


_NO_PLUGIN_JOB = textwrap.dedent(
    """
    import json, time
    from pyspark.sql import SparkSession
    from spark_ps import PSContext

    spark = (SparkSession.builder.master("local-cluster[1,1,1024]").appName("no-plugin")
             .config("spark.ui.enabled", "false").config("spark.ps.mode", "executors")
             .getOrCreate())
    t0 = time.monotonic()
    try:
        PSContext.getOrCreate(spark)
        out = {"error": None}
    except ValueError as e:
        out = {"error": str(e)}
    out["seconds"] = time.monotonic() - t0
    spark.stop()
    print("RESULT " + json.dumps(out))
    """
)


@pytest.mark.cluster
@pytest.mark.slow
def test_executors_mode_without_the_plugin_fails_at_once_naming_the_conf_to_add():
    r = run_script(_NO_PLUGIN_JOB, timeout=120)
    assert r["error"] is not None, r
    assert f"--conf spark.plugins={PLUGIN}" in r["error"]
    assert "--jars " in r["error"] and "spark-ps-bridge.jar" in r["error"]
    assert r["seconds"] < 5, r  # no waiting for executors or shards


@pytest.mark.cluster
@pytest.mark.slow
def test_local_cluster_executors_host_the_shards_and_take_them_down_with_the_app(jar):
    """Each executor JVM starts a shard supervisor (host id ``<address>/executor-<id>``);
    the coordinator waits for both (local-cluster[2,...]: 2 hosts), places one partition
    on each, the fit trains on them. A SIGKILLed executor JVM takes its supervisor and
    shard with it; the coordinator loses that host and says why its partition is lost (no
    backup, no checkpoint dir); Spark's replacement executor joins as a new host.
    spark.stop() leaves none of these processes."""
    conf = {"spark.plugins": PLUGIN, "spark.ps.mode": "executors", "spark.ui.enabled": "false"}
    r = result_of(spark_submit(JOB, "kill-executor", conf=conf, jars=(jar,), timeout=400))
    st = r["status"]
    hosts = {h["id"] for h in st["hosts"]}
    address = st["hosts"][0]["address"]
    assert hosts == {f"{address}/executor-0", f"{address}/executor-1"}, st["hosts"]
    assert all(h["alive"] and h["shards"] == 1 for h in st["hosts"]), st["hosts"]
    assert sorted(p["host"] for p in st["partitions"]) == sorted(hosts)  # one each
    kinds = sorted(p["kind"] for p in r["processes"])
    assert kinds == ["coordinator", "shard", "shard", "supervisor", "supervisor"], r["processes"]
    assert {p["parent"] for p in r["processes"] if p["kind"] == "supervisor"} == {"java"}
    assert {p["host_id"] for p in r["processes"] if p["kind"] != "coordinator"} == hosts
    assert 0.8 < r["auc"] < 0.9, r  # a real fit on the shards (its exact value: test_cluster)
    k = r["killed"]
    assert len(k["ps_pids"]) == 2 and k["orphans"] == [], k  # its supervisor and shard
    assert k["host"] not in k["alive"] and len(k["alive"]) == 2, k  # survivor + replacement
    assert k["host"] in hosts and (set(k["alive"]) - hosts), k
    assert "partition 0 is lost" in k["lost"][0] and "--checkpoint-dir" in k["lost"][0], k
    assert r["alive_after_stop"] == [], r["processes"]


@pytest.mark.cluster
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_an_lr_fit_survives_its_executor_jvm_killed_mid_fit(jar, tmp_path):
    """With spark.ps.checkpointDir: a worker task SIGKILLs its executor JVM (and so that
    executor's shard) in the 8th gradient round. Spark replaces the executor; the driver
    launches the worker job again (a new Dataset: the failed one's adaptive plan would
    rethrow its failure without running a job); the coordinator restores the lost
    partition from the checkpoint at iteration 6 on a live host; the fit rolls back to
    that checkpoint and finishes. One application runs the clean and the faulted fit."""
    import psutil

    conf = {
        "spark.plugins": PLUGIN,
        "spark.ps.mode": "executors",
        "spark.ps.checkpointDir": str(tmp_path / "ckpt"),
        "spark.ui.enabled": "false",
        "spark.scheduler.barrier.maxConcurrentTasksCheck.interval": "2s",
    }
    r = result_of(spark_submit(JOB, "kill-mid-fit", tmp_path, conf=conf, jars=(jar,), timeout=500))
    assert not psutil.pid_exists(r["jvm"])  # the executor JVM really died
    c = r["counters"]
    # One restart of the lost partition; one rollback, or two when that restart lands while
    # the first rollback restores (the fit then rolls back again to the same checkpoint:
    # spark_ps.ml._recovery.FitRecovery.rollback reads the restart count before restoring).
    assert c["restart"] == 1 and c["restore"] in (1, 2) and c["promotion"] == 0, c
    (lost,) = {h["id"] for h in r["before"]["hosts"]} - {
        h["id"] for h in r["after"]["hosts"] if h["alive"]
    }
    alive = {h["id"] for h in r["after"]["hosts"] if h["alive"]}
    assert all(p["host"] in alive and not p["lost"] for p in r["after"]["partitions"]), r["after"]
    assert lost in {p["host"] for p in r["before"]["partitions"]}  # it held a partition
    clean, killed = r["models"]
    # The rollback restores every tensor of the fit as of iteration 6 and L-BFGS goes on
    # from there as the clean fit did. The only difference: the lost executor's cached
    # partition is recomputed, its rows may come in another order, so its gradient sums
    # differ in the last bits (~1e-16 relative, measured); through the remaining ~10
    # iterations that stays far below 1e-9. A recovery that took another path (from the
    # start, or from x without L-BFGS's curvature history) stops elsewhere within the
    # solver's tolerance: loss changes of 1e-10, coefficients ~1e-5 apart.
    np.testing.assert_allclose(killed["coefficients"], clean["coefficients"], rtol=1e-9, atol=1e-12)
    assert killed["intercept"] == pytest.approx(clean["intercept"], rel=1e-9, abs=1e-12)
    np.testing.assert_allclose(killed["objective"], clean["objective"], rtol=1e-12)
    print(f"fit with a killed executor: {r['seconds']:.1f}s")
