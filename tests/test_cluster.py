"""spark-ps on a Spark standalone cluster whose executors live on other hosts.

The Master and two Workers (1 core, 1 GiB each) run in network namespaces
(:mod:`bench.standalone`); the driver is a ``spark-submit`` in the root namespace at the
bridge's address, as a user's edge node would be. What a ``local`` master cannot show:
an embedded PS bound to the driver's loopback is out of the executors' reach, and an
example that forces its master never reaches the cluster at all.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
from test_jvm_bridge import bridge_jar as _bridge_jar  # noqa: F401 - fixture: jar, rebuilt if stale

from bench.standalone import StandaloneCluster, unavailable

ROOT = Path(__file__).resolve().parents[1]
# where spark_ps/examples/flights_common.py looks: $SPARK_PS_DATA, else ../shared/data
DATA = Path(os.environ.get("SPARK_PS_DATA") or ROOT.parent / "shared/data") / "flights-3m.parquet"

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.skipif(bool(unavailable()), reason=f"standalone cluster: {unavailable()}"),
]


@pytest.fixture(scope="module")
def cluster():
    """Master on one host, a Worker on each of two others; every JVM killed at the end."""
    with StandaloneCluster(workers=2, cores=1, memory="1g") as c:
        yield c


def _result(done) -> dict:
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")]
    assert lines, f"no RESULT (exit {done.returncode}):\n{done.stdout}\n{done.stderr[-6000:]}"
    print(lines[-1])  # shown with -rP: where a slow run spent its time
    return json.loads(lines[-1][len("RESULT ") :])


def _workers(cluster: StandaloneCluster) -> set[str]:
    return {cluster.worker_address(w) for w in range(cluster.workers)}


@pytest.fixture(scope="module")
def fits(cluster) -> dict:
    """One application: a fit with default settings, then one with spark.ps.host=127.0.0.1."""
    job = [str(ROOT / "tests" / "cluster_fit.py"), "default", "127.0.0.1"]
    return _result(cluster.submit(job, timeout=200))


@pytest.mark.slow
def test_default_embedded_ps_is_reached_by_executors_on_other_hosts(cluster, fits):
    """No spark.ps.* setting: the PS binds spark.driver.host, and the fit's workers, on
    executors in the Workers' namespaces, train on it."""
    r = fits["fits"]["default"]
    assert r["ok"], r
    assert r["address"].rsplit(":", 1)[0] == cluster.driver_host
    assert set(cluster.task_hosts(fits["app"])) == _workers(cluster)


@pytest.mark.slow
def test_unreachable_ps_fails_the_fit_within_seconds_naming_address_and_settings(cluster, fits):
    """spark.ps.host=127.0.0.1 on a cluster: each executor's loopback is its own, so the
    fit fails fast (one connect timeout, no relaunch, no 90 s of RPC retries) with an
    error that names the address tried and the settings to change."""
    r = fits["fits"]["127.0.0.1"]
    assert not r["ok"] and r["type"] == "PSUnreachable", r
    assert r["address"].startswith("127.0.0.1:")
    assert f"at {r['address']} from host " in r["error"]
    assert "spark.ps.host" in r["error"] and "spark.ps.address" in r["error"]
    # the executors' hosts, not the driver's, are where it was tried from
    assert any(f"from host {a}" in r["error"] for a in _workers(cluster)), r["error"]
    assert r["seconds"] < 30, r  # a 10 s connect timeout and one Spark job, not minutes


@pytest.fixture(scope="module")
def plugin_jar(request) -> Path:
    """The bridge jar (test_jvm_bridge's fixture: rebuilt when older than its sources)."""
    return request.getfixturevalue("_bridge_jar")


@pytest.mark.slow
def test_plugin_started_ps_is_reached_by_executors_on_other_hosts(cluster, plugin_jar):
    """--conf spark.plugins=io.sparkps.bridge.PSPlugin alone on a cluster: the plugin starts
    the embedded PS on spark.driver.host (not loopback) and the fit trains on it."""
    conf = {"spark.plugins": "io.sparkps.bridge.PSPlugin"}
    job = ["--jars", str(plugin_jar), str(ROOT / "tests" / "cluster_fit.py"), "default"]
    r = _result(cluster.submit(job, conf=conf, timeout=200))
    fit = r["fits"]["default"]
    assert fit["ok"], fit
    assert fit["address"].rsplit(":", 1)[0] == cluster.driver_host
    assert set(cluster.task_hosts(r["app"])) == _workers(cluster)


_FIT = re.compile(r"^spark-ps\s+fit .* final loss (\S+)\s+test AUC (\S+)", re.M)


@pytest.mark.slow
@pytest.mark.timeout(540)
@pytest.mark.skipif(not DATA.exists(), reason=f"no flights data at {DATA}")
def test_flights_example_runs_on_the_cluster_and_matches_a_local_run(cluster):
    """spark-submit --master spark://... of examples/flights_lr.py runs on the cluster's
    executors (tasks in both Workers' namespaces) and reaches a local[2] run's loss and
    AUC on the same rows."""
    args = [str(ROOT / "examples" / "flights_lr.py"), "--fraction", "0.01", "--max-iter", "10"]
    on_cluster = cluster.submit(args, timeout=240)
    assert on_cluster.returncode == 0, on_cluster.stderr[-6000:]
    assert f"Spark: {cluster.master_url} (" in on_cluster.stdout, on_cluster.stdout
    assert f"PS: PSContext(embedded, address='{cluster.driver_host}:" in on_cluster.stdout
    app = re.search(r"Spark: \S+ \((app-[^)]+)\)", on_cluster.stdout).group(1)
    assert set(cluster.task_hosts(app)) == _workers(cluster)
    local = cluster.submit(args, master="local[2]", timeout=240)
    assert local.returncode == 0, local.stderr[-6000:]
    assert "Spark: local[2] (" in local.stdout
    (cluster_fit,) = _FIT.findall(on_cluster.stdout)
    (local_fit,) = _FIT.findall(local.stdout)
    # Same rows, same partition count (2 task slots either way), same L-BFGS: only the
    # order in which partial sums meet can differ, ~1e-16 relative on the loss; the
    # printed 6 decimals of loss and AUC must agree.
    assert cluster_fit == local_fit, (cluster_fit, local_fit)


@pytest.fixture(scope="module")
def in_executors(cluster, plugin_jar) -> dict:
    """tests/executors_fit.py with spark.ps.mode=executors on the cluster (spark.cores.max 2
    over 1-core executors: the coordinator waits for 2 hosts), and the same job on local[2]
    (an embedded PS) for the reference model."""
    conf = {
        "spark.plugins": "io.sparkps.bridge.PSPlugin",
        "spark.ps.mode": "executors",
        "spark.cores.max": "2",
    }
    job = ["--jars", str(plugin_jar), str(ROOT / "tests" / "executors_fit.py")]
    return {
        "cluster": _result(cluster.submit(job, conf=conf, timeout=300)),
        "local": _result(cluster.submit(job, master="local[2]", conf=conf, timeout=300)),
    }


@pytest.mark.slow
@pytest.mark.timeout(700)
def test_executors_mode_runs_the_shards_on_the_executors_hosts(cluster, in_executors):
    """Each executor (one per Worker host, one core each) runs a shard supervisor that
    joins the coordinator beside the driver; one partition lands on each host; the same
    1-core executors still run the fit's tasks; nothing is left once the app stops."""
    r = in_executors["cluster"]
    st = r["status"]
    assert r["address"].rsplit(":", 1)[0] == cluster.driver_host
    assert {h["address"] for h in st["hosts"]} == _workers(cluster), st["hosts"]
    assert all(re.fullmatch(r"[\d.]+/executor-\d+", h["id"]) for h in st["hosts"]), st["hosts"]
    assert all(h["alive"] and len(h["primaries"]) == 1 for h in st["hosts"]), st["hosts"]
    assert {p["host"].split("/")[0] for p in st["partitions"]} == _workers(cluster)
    assert set(cluster.task_hosts(r["app"])) == _workers(cluster)
    kinds = sorted(p["kind"] for p in r["processes"])
    assert kinds == ["coordinator", "shard", "shard", "supervisor", "supervisor"], r["processes"]
    assert r["alive_after_stop"] == [], r["processes"]


@pytest.mark.slow
@pytest.mark.timeout(700)
def test_executors_mode_fit_matches_a_local_run(in_executors):
    """Same rows, 2 data partitions and 2 PS partitions either way, same L-BFGS: only the
    order in which partial sums meet differs (~1e-16 relative per sum), which after 30
    iterations moves coefficients by far less than 1e-6. The exact AUC counts ordered
    pairs (~1e6 here): 1e-6 is one swapped pair of nearly tied scores."""
    import numpy as np

    c, lo = in_executors["cluster"], in_executors["local"]
    assert lo["status"]["hosts"] == []  # local[2]: the plugin's single-host PS, no executors
    np.testing.assert_allclose(c["coefficients"], lo["coefficients"], rtol=1e-6, atol=1e-9)
    assert abs(c["intercept"] - lo["intercept"]) < 1e-6
    assert abs(c["auc"] - lo["auc"]) <= 1e-6, (c["auc"], lo["auc"])
