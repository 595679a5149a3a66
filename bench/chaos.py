"""Chaos soak: fits keep finishing, with their clean answers, while shards and executors die.

Run from the repository root::

    python -m bench.chaos --minutes 12                # the full soak: at least 30 kills
    python -m bench.chaos --minutes 1.5 --min-kills 4 --rows 6000   # a quick check

A child process runs Spark on ``local-cluster[2,1,1024]`` (executors are separate JVMs) with
an embedded PS and **default settings**, fits each estimator once undisturbed (its clean
twin), then loops over LR (L-BFGS), GBT and LR with the FTRL solver until the time is up,
while a killer thread SIGKILLs a random PS shard or executor JVM at random moments of each
fit and of its scoring. Every fit must finish; LR and FTRL test AUC must stay within 0.002
of the twin's and GBT trees must equal the twin's. The parent prints a table of kills by
phase, recoveries and time lost, then checks that nothing the child started outlived it:
processes, listening ports, shared memory and files under the child's temporary folder.
Exit status 0 only when all of that holds and at least ``--min-kills`` kills landed.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a file: make `bench` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

__all__ = ["main"]

#: AUC a disturbed LR/FTRL fit may differ from its clean twin by (rollbacks re-run whole
#: iterations from checkpointed state; mini-batch order can change with a relaunch).
AUC_TOLERANCE = 0.002
MARKER = "SPARK_PS_CHAOS_RUN"
PHASES = ("set-up", "iterations", "scoring")


# --------------------------------------------------------------------------- child side


class _Killer(threading.Thread):
    """SIGKILLs one shard or executor JVM after a random pause, while a fit is armed."""

    def __init__(self, ps: Any, driver_pid: int, seed: int, pause: tuple[float, float]):
        super().__init__(daemon=True, name="chaos-killer")
        self.ps, self.driver_pid = ps, driver_pid
        self.rng, self.pause = random.Random(seed), pause
        self.phase: str | None = None  # None: nothing to disturb
        self.estimator = ""
        self.kills: list[dict] = []
        self.per_fit = 0
        self.max_per_fit = 2  # more would exhaust Spark's barrier-stage retries by design
        self._halt = threading.Event()

    def executors(self) -> list[int]:
        import psutil

        pids = []
        for p in psutil.Process(self.driver_pid).children(recursive=True):
            try:  # Python workers come and go: one gone since the listing is no executor
                if "CoarseGrainedExecutorBackend" in " ".join(p.cmdline()):
                    pids.append(p.pid)
            except psutil.Error:
                continue
        return pids

    def run(self) -> None:
        while not self._halt.wait(self.rng.uniform(*self.pause)):
            phase = self.phase
            if phase is None or self.per_fit >= self.max_per_fit:
                continue
            try:
                if self.rng.random() < 0.6:
                    health = self.ps.client.health()
                    victim, kind = health[self.rng.randrange(len(health))].pid, "shard"
                else:
                    pids = self.executors()
                    if not pids:
                        continue
                    victim, kind = self.rng.choice(pids), "executor"
                os.kill(victim, signal.SIGKILL)
            except Exception:  # a target that is restarting right now: try again later
                continue
            self.per_fit += 1
            self.kills.append(
                {"kind": kind, "phase": phase, "estimator": self.estimator, "t": time.time()}
            )

    def arm(self, estimator: str, phase: str) -> None:
        self.estimator, self.phase = estimator, phase

    def disarm(self) -> None:
        self.phase, self.per_fit = None, 0

    def stop(self) -> None:
        self._halt.set()


#: Worker commands that start a fit's iterations (LR lbfgs, mini-batch epochs, GBT trees).
ITERATION_OPS = frozenset({"grad", "epoch", "boost"})


def _phase_hook(killer: _Killer) -> None:
    """The killer's phase moves from set-up to iterations at a fit's first iteration command."""
    from spark_ps.ml._job import PSJob

    command = PSJob.command

    def marked(job, op, **payload):
        if killer.phase == "set-up" and op in ITERATION_OPS:
            killer.phase = "iterations"
        return command(job, op, **payload)

    PSJob.command = marked


def _estimators() -> dict[str, Any]:
    from spark_ps.ml.classification import GBTClassifier, LogisticRegression

    return {
        "LR": lambda: LogisticRegression(maxIter=15, regParam=0.01),
        "GBT": lambda: GBTClassifier(maxIter=6, maxDepth=4, seed=3),
        "FTRL": lambda: LogisticRegression(solver="ftrl", maxIter=6, regParam=0.01),
    }


def _answer(name: str, model: Any, test: Any) -> Any:
    from bench.common import model_auc

    if name == "GBT":
        return [repr(t) for t in model.treeArrays] + [model.treeWeights]
    return model_auc(model, test)


def _agrees(name: str, got: Any, clean: Any) -> bool:
    return got == clean if name == "GBT" else abs(got - clean) <= AUC_TOLERANCE


def child(args: argparse.Namespace) -> None:
    from bench.common import bench_session
    from bench.datagen import dense_features, synthetic_ctr
    from spark_ps import PSContext

    conf = {
        "spark.task.maxFailures": "8",
        "spark.stage.maxConsecutiveAttempts": "8",
        "spark.scheduler.barrier.maxConcurrentTasksCheck.interval": "2s",
        "spark.scheduler.barrier.maxConcurrentTasksCheck.maxFailures": "60",
    }
    conf.update(kv.split("=", 1) for kv in args.conf)
    spark = bench_session("2g", master="local-cluster[2,1,1024]", app="chaos", conf=conf)
    ps = PSContext.getOrCreate(spark)
    ctr = synthetic_ctr(spark, args.rows, 16, partitions=2, seed=5)
    train, test = ctr.randomSplit([0.8, 0.2], seed=1)
    dense = dense_features(spark, args.rows // 2, 10, partitions=2, seed=6)
    data = {"LR": train.cache(), "GBT": dense.cache(), "FTRL": train}
    for df in (data["LR"], data["GBT"]):
        df.count()
    makers = _estimators()
    clean, clean_s = {}, {}
    for name, make in makers.items():
        t0 = time.perf_counter()
        clean[name] = _answer(name, make().fit(data[name]), test)
        clean_s[name] = time.perf_counter() - t0

    driver_pid = int(spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid())
    killer = _Killer(ps, driver_pid, args.seed, (args.min_pause, args.max_pause))
    _phase_hook(killer)
    killer.start()
    fits, deadline = [], time.monotonic() + args.minutes * 60
    order = list(makers)
    # On a slow (busy) machine the loop runs on, up to three times as long, until the
    # required kills landed and every estimator had a fit: a bounded soak all the same.
    hard_deadline = time.monotonic() + 3 * args.minutes * 60

    def more() -> bool:
        now = time.monotonic()
        short = len(killer.kills) < args.min_kills or len(fits) < len(order)
        return now < deadline or (short and now < hard_deadline)

    while more():
        name = order[len(fits) % len(order)]
        kills_before = len(killer.kills)
        t0 = time.perf_counter()
        error = ""
        try:
            killer.arm(name, "set-up")
            model = makers[name]().fit(data[name])
            killer.arm(name, "scoring")
            got = _answer(name, model, test)
        except Exception as e:  # a fit that does not survive is the finding: record it
            got, error = None, f"{type(e).__name__}: {str(e)[:2000]}"
        finally:
            killer.disarm()
        seconds = time.perf_counter() - t0
        fits.append(
            {
                "estimator": name,
                "seconds": seconds,
                "lost_s": max(0.0, seconds - clean_s[name]),
                "kills": len(killer.kills) - kills_before,
                "ok": not error and _agrees(name, got, clean[name]),
                "error": error
                or (
                    ""
                    if got is None or _agrees(name, got, clean[name])
                    else f"answer {got!r:.120} differs from clean {clean[name]!r:.120}"
                ),
            }
        )
    killer.stop()
    killer.join(timeout=10)
    ps.stop()
    spark.stop()
    threads = sorted(t.name for t in threading.enumerate() if t is not threading.main_thread())
    print(MARKER + json.dumps({"fits": fits, "kills": killer.kills, "threads": threads}))


# --------------------------------------------------------------------------- parent side


def _survivors(token: str) -> list[str]:
    """Processes still carrying this run's marker in their environment."""
    import psutil

    found = []
    for p in psutil.process_iter(["pid", "name"]):
        try:
            if p.environ().get(MARKER) == token:
                found.append(f"{p.info['pid']} {p.info['name']}")
        except (psutil.Error, OSError):
            continue
    return found


def _shm() -> set[str]:
    return set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()


def _table(fits: list[dict], kills: list[dict]) -> str:
    from bench.common import markdown_table

    rows = []
    for name in sorted({f["estimator"] for f in fits}):
        mine = [f for f in fits if f["estimator"] == name]
        by_phase = Counter(k["phase"] for k in kills if k["estimator"] == name)
        by_kind = Counter(k["kind"] for k in kills if k["estimator"] == name)
        rows.append(
            {
                "estimator": name,
                "fits": len(mine),
                "finished with clean answer": sum(f["ok"] for f in mine),
                **{f"kills in {p}": by_phase.get(p, 0) for p in PHASES},
                "shard kills": by_kind.get("shard", 0),
                "executor kills": by_kind.get("executor", 0),
                "recovered fits": sum(f["ok"] and f["kills"] > 0 for f in mine),
                "time lost s": round(sum(f["lost_s"] for f in mine), 1),
            }
        )
    return markdown_table(rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--minutes",
        type=float,
        default=12.0,
        help="length of the kill loop (it runs on, up to 3x as long, until --min-kills kills "
        "landed and every estimator had a fit)",
    )
    p.add_argument("--min-kills", type=int, default=30)
    p.add_argument("--rows", type=int, default=20000)
    p.add_argument("--seed", type=int, default=11)
    p.add_argument("--min-pause", type=float, default=1.0, help="seconds between kills, least")
    p.add_argument("--max-pause", type=float, default=6.0, help="seconds between kills, most")
    p.add_argument(
        "--conf", action="append", default=[], metavar="KEY=VALUE",
        help="a Spark setting beyond the defaults (e.g. spark.ps.replicas=2)",
    )  # fmt: skip
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        child(args)
        return 0

    token = f"{os.getpid()}-{time.time_ns()}"
    shm_before = _shm()
    with tempfile.TemporaryDirectory(prefix="spark-ps-chaos-") as tmp:
        root = str(Path(__file__).resolve().parents[1])  # executors import bench.datagen
        path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p)
        env = {**os.environ, MARKER: token, "TMPDIR": tmp, "SPARK_LOCAL_DIRS": tmp}
        env["PYTHONPATH"] = path
        cmd = [sys.executable, "-m", "bench.chaos", "--child", *(argv or sys.argv[1:])]
        t0 = time.perf_counter()
        done = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, text=True, cwd=root)
        wall = time.perf_counter() - t0
        lines = [ln for ln in done.stdout.splitlines() if ln.startswith(MARKER)]
        time.sleep(2)  # let the last JVMs' exit reach the process table
        survivors = _survivors(token)
        left = sorted(str(q.relative_to(tmp)) for q in Path(tmp).rglob("*"))
    leaked_shm = sorted(_shm() - shm_before)
    if done.returncode != 0 or not lines:
        print(done.stdout[-4000:])
        print(f"chaos: the soak process failed (exit {done.returncode})")
        return 1
    result = json.loads(lines[-1][len(MARKER) :])
    fits, kills = result["fits"], result["kills"]
    print(_table(fits, kills))
    print(
        f"\n{len(kills)} kills over {len(fits)} fits in {wall:.0f} s; "
        f"leftovers: processes {survivors or 'none'}, temp files {left[:5] or 'none'}, "
        f"shared memory {leaked_shm or 'none'}, threads after stop {result['threads'] or 'none'}"
    )
    failures = [f for f in fits if not f["ok"]]
    for f in failures:
        print(f"FAILED {f['estimator']} after {f['kills']} kills: {f['error']}")
    good = (
        not failures
        and len(kills) >= args.min_kills
        and not survivors
        and not left
        and not leaked_shm
    )
    if len(kills) < args.min_kills:
        print(f"chaos: only {len(kills)} kills landed, {args.min_kills} required")
    print("chaos: ok" if good else "chaos: FAILED")
    return 0 if good else 1


if __name__ == "__main__":
    sys.exit(main())
