"""What fault tolerance costs: LR with checkpoints during the fit, and with a shard SIGKILL.

Run from the repository root, e.g.::

    python -m bench.recovery --rows 100000 --log2-dim 18 --max-iter 15

Three fits on the same cached data and the same PS (2 shards, a checkpoint directory):
no checkpoints; a checkpoint every ``--interval`` iterations; the same plus shard 1
SIGKILLed right after iteration ``--kill-at``. The table gives fit time, the time spent
writing checkpoints and rolling back, iterations redone, and whether the model equals the
clean one.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a file: make `bench` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import Timer, bench_session, markdown_table, model_auc
from bench.datagen import synthetic_ctr

__all__ = ["main"]

COLUMNS = (
    "case", "fit s", "checkpoints", "checkpoint s", "restores", "rollback s",
    "iterations redone", "test AUC", "same model",
)  # fmt: skip


class _Probe:
    """Times FitRecovery's checkpoints and rollbacks; kills shard 1 at one boundary."""

    def __init__(self, ps, kill_at: int | None):
        from spark_ps.ml import _recovery

        self.ps, self.kill_at, self.mod = ps, kill_at, _recovery
        self.ckpt_s = self.rollback_s = 0.0
        self._orig = (_recovery.FitRecovery.boundary, _recovery.FitRecovery.rollback)

    def __enter__(self):
        probe, (boundary, rollback) = self, self._orig

        def timed_boundary(fit, iteration, state):
            t0 = time.perf_counter()
            boundary(fit, iteration, state)
            probe.ckpt_s += time.perf_counter() - t0
            if iteration == probe.kill_at:
                probe.kill_at = None
                os.kill(probe.ps.client.health()[1].pid, signal.SIGKILL)

        def timed_rollback(fit, cause):
            t0 = time.perf_counter()
            try:
                return rollback(fit, cause)
            finally:
                probe.rollback_s += time.perf_counter() - t0

        self.mod.FitRecovery.boundary = timed_boundary
        self.mod.FitRecovery.rollback = timed_rollback
        return self

    def __exit__(self, *exc):
        self.mod.FitRecovery.boundary, self.mod.FitRecovery.rollback = self._orig


def _run(ps, lr, train, test, case: str, kill_at: int | None, clean) -> tuple[dict, object]:
    before = ps.metrics()
    with _Probe(ps, kill_at) as probe, Timer() as t:
        model = lr.fit(train)
    m = {k: v - before.get(k, 0) for k, v in ps.metrics().items()}
    same = (
        ""
        if clean is None
        else str(
            (model.coefficients.toArray() == clean.coefficients.toArray()).all()
            and model.intercept == clean.intercept
        )
    )
    row = {
        "case": case,
        "fit s": round(t.elapsed, 1),
        "checkpoints": m["checkpoint"],
        "checkpoint s": round(probe.ckpt_s, 2),
        "restores": m["restore"],
        "rollback s": round(probe.rollback_s, 2),
        "iterations redone": m["iteration_lost"],
        "test AUC": round(model_auc(model, test), 4),
        "same model": same,
    }
    return row, model


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=100_000)
    p.add_argument("--log2-dim", type=int, default=18)
    p.add_argument("--max-iter", type=int, default=15)
    p.add_argument("--interval", type=int, default=5)
    p.add_argument("--kill-at", type=int, default=7)
    args = p.parse_args(argv)
    spark = bench_session()
    from spark_ps import PSContext
    from spark_ps.ml.classification import LogisticRegression

    with tempfile.TemporaryDirectory() as ckpt:
        ps = PSContext.getOrCreate(spark, numShards=2, checkpointDir=ckpt)
        train = synthetic_ctr(spark, args.rows, args.log2_dim, seed=1).cache()
        test = synthetic_ctr(spark, args.rows // 4, args.log2_dim, seed=1, start=args.rows)
        train.count()
        lr = LogisticRegression(maxIter=args.max_iter, regParam=1e-4, tol=0.0, numWorkers=2)
        rows = []
        row, clean = _run(ps, lr.copy({lr.checkpointInterval: -1}), train, test, "none", None, None)
        rows.append(row)
        every = lr.copy({lr.checkpointInterval: args.interval})
        rows.append(_run(ps, every, train, test, f"every {args.interval}", None, clean)[0])
        kill = f"every {args.interval} + kill at {args.kill_at}"
        rows.append(_run(ps, every, train, test, kill, args.kill_at, clean)[0])
        print(f"\n{args.rows} rows, 2^{args.log2_dim} features, {args.max_iter} iterations\n")
        print(markdown_table(rows, COLUMNS))
        ps.stop()
    spark.stop()


if __name__ == "__main__":
    main()
