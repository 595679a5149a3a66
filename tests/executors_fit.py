"""One LR fit on whatever master and ``spark.ps.*`` settings spark-submit gives it, and
what the PS looked like: run by tests with ``spark.ps.mode=executors`` on a cluster master,
and on ``local[2]`` for the reference model.

Prints one ``RESULT <json>`` line: the application id, the PS address, the coefficients,
intercept and exact training AUC, the shard map (``spark-ps-server status``'s JSON; none
for a PS this process started itself), the PS processes of this machine that belong to
the application (the coordinator under the driver JVM, shard supervisors and shards that
name its address), and those of them still alive 30 s after ``spark.stop()``. With the
argument ``kill-executor``, one executor JVM is SIGKILLed before the stop (see
`kill_an_executor`). With ``kill-mid-fit WORKDIR`` (set ``spark.ps.checkpointDir``), the
same fit runs twice: cleanly, then with a worker task SIGKILLing its executor's JVM in
the middle (see `fit_with_a_killed_executor`).
"""

from __future__ import annotations

import json
import sys
import time

import numpy as np
import psutil
from pyspark.ml.linalg import Vectors
from pyspark.sql import SparkSession


def rows(n: int = 2000, d: int = 8, seed: int = 3) -> list:
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d))
    w = np.linspace(-1.0, 1.0, d)
    y = (rng.random(n) < 1.0 / (1.0 + np.exp(-(X @ w + 0.3)))).astype(float)
    return [(float(y[i]), Vectors.dense(X[i].tolist())) for i in range(n)]


def auc(labels: np.ndarray, scores: np.ndarray) -> float:
    """Exact ROC AUC (Mann-Whitney, ties count half). MLlib's evaluator bins the scores
    into 1000 groups that depend on how the rows are partitioned, so it differs in the
    sixth decimal between a cluster and a local run of the same model."""
    from scipy.stats import rankdata

    ranks = rankdata(scores)  # ties get their average rank
    pos = labels == 1.0
    n_pos, n_neg = pos.sum(), (~pos).sum()
    return float((ranks[pos].sum() - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))


def ps_processes(address: str) -> list[dict]:
    """The coordinator the driver JVM started, and supervisors/shards joined to `address`."""
    found = []
    jvm = psutil.Process().parent()  # spark-submit's JVM runs this Python
    for p in psutil.process_iter(["pid", "ppid", "cmdline"]):
        cmd = p.info["cmdline"] or []
        if "ps_server" not in " ".join(cmd):
            continue
        if ("coordinator" in cmd and p.info["ppid"] == jvm.pid) or address in cmd:
            parent = psutil.Process(p.info["ppid"]) if p.info["ppid"] else None
            found.append(
                {
                    "pid": p.info["pid"],
                    "kind": "coordinator"
                    if "coordinator" in cmd
                    else ("supervisor" if "shards" in cmd else "shard"),
                    "host_id": cmd[cmd.index("--host-id") + 1] if "--host-id" in cmd else "",
                    "parent": parent.name() if parent is not None else "",
                }
            )
    return found


def kill_an_executor(spark, ps, procs: list[dict]) -> dict:
    """SIGKILL the JVM of the executor that hosts partition 0; report its PS processes
    still alive 20 s later, and the map once the coordinator lost that host and Spark's
    replacement executor joined (or 90 s passed)."""
    from ps_server.coordinator.status import status

    app, before = spark.sparkContext.applicationId, status(ps.address, ps.token)
    victim = before["partitions"][0]["host"]
    executor = victim.rsplit("-", 1)[1]
    mine = [p["pid"] for p in procs if p["host_id"] == victim]
    for p in psutil.process_iter(["pid", "cmdline"]):
        cmd = p.info["cmdline"] or []
        if app in cmd and "--executor-id" in cmd[:-1]:
            if cmd[cmd.index("--executor-id") + 1] != executor:
                continue
            p.kill()
    t0 = time.monotonic()
    while time.monotonic() - t0 < 20 and any(_running(pid) for pid in mine):
        time.sleep(0.1)
    out = {"host": victim, "ps_pids": mine, "orphans": [pid for pid in mine if _running(pid)]}
    out["gone_seconds"] = time.monotonic() - t0
    old = {h["id"] for h in before["hosts"]}
    lost: list[str] = []  # as the coordinator said it once it lost the host: a replacement
    while time.monotonic() - t0 < 90:  # joining later may place a new (empty) shard there
        st = status(ps.address, ps.token)
        alive = {h["id"] for h in st["hosts"] if h["alive"]}
        if not any(lost):
            lost = [p["lost"] for p in st["partitions"]]
        if victim not in alive and alive - old and any(lost):
            break
        time.sleep(0.5)
    out.update(alive=sorted(alive), lost=lost)
    out["seconds"] = time.monotonic() - t0
    return out


def fit_with_a_killed_executor(spark, ps, df, lr, workdir: str) -> dict:
    """Fit `lr` on `df` cleanly, then again while partition 0's task SIGKILLs its executor
    JVM in the 8th gradient round (after the checkpoint at iteration 6, with
    checkpointInterval=3); both models, the PS counters the second fit moved, and the
    shard map before and after."""
    from pathlib import Path

    from ps_server.coordinator.status import status
    from spark_ps.ml import _job

    clean = lr.fit(df)
    before, counters = status(ps.address, ps.token), ps.metrics()
    marker = Path(workdir) / "killed"
    _job.inject_failure_once("grad", nth=7, part=0, marker=str(marker), kill_executor=True)
    t0 = time.monotonic()
    killed = lr.fit(df)
    seconds = time.monotonic() - t0
    _job.clear_failures()
    after = status(ps.address, ps.token)
    return {
        "models": [
            {
                "coefficients": m.coefficients.toArray().tolist(),
                "intercept": m.intercept,
                "objective": list(m.summary.objectiveHistory),
            }
            for m in (clean, killed)
        ],
        "jvm": int(marker.read_text()),
        "counters": {k: v - counters.get(k, 0) for k, v in ps.metrics().items()},
        "before": before,
        "after": after,
        "seconds": seconds,
    }


def main() -> None:
    from spark_ps import PSContext
    from spark_ps.ml.classification import LogisticRegression

    spark = SparkSession.builder.getOrCreate()
    df = spark.createDataFrame(rows(), ["label", "features"]).repartition(2).cache()
    df.count()
    t0 = time.monotonic()
    ps = PSContext.getOrCreate(spark)
    out: dict = {"app": spark.sparkContext.applicationId, "address": ps.address}
    out["ps_ready_seconds"] = time.monotonic() - t0
    if sys.argv[1:2] == ["kill-mid-fit"]:
        lr = LogisticRegression(maxIter=30, regParam=0.01, tol=1e-10, checkpointInterval=3)
        out.update(fit_with_a_killed_executor(spark, ps, df, lr, sys.argv[2]))
        spark.stop()
        print("RESULT " + json.dumps(out), flush=True)
        return
    model = LogisticRegression(maxIter=30, regParam=0.01, tol=1e-10).fit(df)
    out["fit_seconds"] = time.monotonic() - t0
    out["coefficients"] = model.coefficients.toArray().tolist()
    out["intercept"] = model.intercept
    scored = model.transform(df).select("label", "probability").collect()
    out["auc"] = auc(np.array([r[0] for r in scored]), np.array([r[1][1] for r in scored]))
    if not ps.embedded:
        from ps_server.coordinator.status import status

        out["status"] = status(ps.address, ps.token)
    procs = ps_processes(ps.address)
    out["processes"] = procs
    if sys.argv[1:] == ["kill-executor"]:
        out["killed"] = kill_an_executor(spark, ps, procs)
        procs = procs + ps_processes(ps.address)  # the replacement's too
    spark.stop()
    deadline = time.monotonic() + 30
    alive = sorted({p["pid"] for p in procs})
    while alive and time.monotonic() < deadline:
        time.sleep(0.2)
        alive = [pid for pid in alive if psutil.pid_exists(pid) and _running(pid)]
    out["alive_after_stop"] = alive
    print("RESULT " + json.dumps(out), flush=True)


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


if __name__ == "__main__":
    main()
