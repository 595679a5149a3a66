"""The compute floor of a distributed LR fit, measured on the fit's own cached input.

A fit cannot be faster than reading its input once and evaluating its loss and gradient
as often as its solver asks, each core on its own partition with the weights at hand:

    floor = (a) one Arrow pass of the input into the Python workers (rows to a localized
                batch: the fit's own `read_partition` and `localize`)
          + evaluations x (b) one loss-and-gradient pass over a partition with the
                weights local (the fit's own `loss_and_grad` kernel; no PS, no Spark job)

Both are measured in a plain `mapInArrow` job over the same partitions, one task per
task slot as in the fit (on its ``spark.task.cpus`` threads), reading what the fit's
workers read: the estimator's own preparation of the input (`prepare_fit_data`), so a
small dense vector column travels packed and is read as one matrix, as in the fit.
(a) is the job's wall time less its tasks' time after reading, so it holds Spark's task
launch and the Arrow hand-over, which a fit pays once too; (b) is the slowest
partition's median, since evaluations wait for every partition. The job runs `passes`
times and the floor takes the fastest pass's (a) and the median pass's (b): a floor is
what the machine can do, and one pass alone swung by 60% on the same cached rows
(1.36-2.16 s at 2^24 and 1M rows). The first pass is often the slowest, partly a warm-up
that a fit's own read pays too, so a first fit cannot quite reach this floor.
Everything between the floor and the fit (pulls, pushes, rounds, line-search bookkeeping,
set-up phases) is a cost the fit's own phase timings list.
"""

from __future__ import annotations

import time
from typing import Any

__all__ = ["measure_floor", "floor_row"]

_SCHEMA = "read_s double, after_s double, eval_s double, rows long, keys long, batch string"


def measure_floor(
    df: Any, features_col: str, label_col: str = "label", reps: int = 5, passes: int = 3
) -> dict:
    """(a) Arrow pass seconds and (b) seconds per local evaluation on `df`'s partitions,
    from `passes` jobs (every pass's (a) is kept too)."""
    from spark_ps.data import DENSE_MAX_FEATURES
    from spark_ps.ml.base import prepare_fit_data

    prepared = prepare_fit_data(
        df, features_col=features_col, label_col=label_col, densify_max=DENSE_MAX_FEATURES
    )
    dense = prepared.features_kind == "dense"  # the fit's workers read these as one matrix

    def task(batches):
        import numpy as np
        import pyarrow as pa
        from pyspark import TaskContext

        from spark_ps.data import read_partition
        from spark_ps.ml import threads
        from spark_ps.ml.lr.objective import loss_and_grad

        threads.set_threads(TaskContext.get().cpus())  # as a fit's worker does
        t0 = time.perf_counter()
        csr = read_partition(batches, features_col, label_col=label_col, dense_matrix=dense)
        keys, local = csr.localize()
        t1 = time.perf_counter()
        rng = np.random.default_rng(0)
        coef = rng.normal(0.0, 0.01, keys.size)
        inv_std = np.ones(keys.size)
        rows = local.row_ids() if hasattr(local, "row_ids") else None
        loss_and_grad(local, coef, 0.0, inv_std, True, rows=rows)  # compiled kernels warm
        times = []
        for _ in range(reps):
            s = time.perf_counter()
            loss_and_grad(local, coef, 0.0, inv_std, True, rows=rows)
            times.append(time.perf_counter() - s)
        yield pa.RecordBatch.from_pydict(
            {
                "read_s": [t1 - t0],
                "after_s": [time.perf_counter() - t1],
                "eval_s": [float(np.median(times))],
                "rows": [int(csr.n_rows)],
                "keys": [int(keys.size)],
                "batch": [type(local).__name__],  # what the read made: the fit's kind?
            }
        )

    runs = []
    for _ in range(max(passes, 1)):
        t0 = time.perf_counter()
        parts = prepared.df.mapInArrow(task, _SCHEMA).collect()
        wall = time.perf_counter() - t0
        after = max((p.after_s for p in parts), default=0.0)
        runs.append(
            {
                "arrow pass s": max(wall - after, 0.0),
                "read in task s": max((p.read_s for p in parts), default=0.0),
                "eval s": max((p.eval_s for p in parts), default=0.0),
                "rows": sum(p.rows for p in parts),
                "partitions": len(parts),
                "batches": sorted({p.batch for p in parts}),
            }
        )
    evals = sorted(r["eval s"] for r in runs)
    best = min(runs, key=lambda r: r["arrow pass s"])
    return best | {
        "read as": " and ".join(best["batches"]),  # DenseBatch: one matrix, as the fit
        "eval s": evals[len(evals) // 2],
        "arrow passes s": [round(r["arrow pass s"], 3) for r in runs],
    }


#: The fit's own timings (``model._fit_phases``) that lie between the floor and the fit.
_COSTS = (
    "job start + read", "key numbering", "statistics", "solver vectors", "first objective",
    "eval offset", "eval reduce", "eval finish", "worker pull", "worker push+contribute",
    "coefficients",
)  # fmt: skip


#: The fit's consecutive phases (``model._fit_phases``): together they span the fit's job.
_MARKS = (
    "job start + read", "key numbering", "statistics", "solver vectors", "first objective",
    "iterations", "coefficients",
)  # fmt: skip
_EVAL_PARTS = ("eval offset", "eval round", "eval reduce", "eval finish")


def floor_row(fit_s: float, phases: dict, floor: dict) -> dict:
    """The floor of one fit and the fit's distance from it, with its listed costs."""
    evaluations = int(phases.get("evaluations", 0))
    total = floor["arrow pass s"] + evaluations * floor["eval s"]
    costs = {k: round(float(phases[k]), 3) for k in _COSTS if k in phases}
    # the evaluation rounds' wall time beyond the workers' own compute: barrier rounds,
    # command/collect latency and the slowest worker's wait
    if "eval round" in phases and "worker compute" in phases:
        costs["rounds beyond compute"] = round(
            float(phases["eval round"])
            - float(phases["worker compute"])
            - float(phases.get("worker pull", 0.0))
            - float(phases.get("worker push+contribute", 0.0)),
            3,
        )
    if all(k in phases for k in ("first objective", "iterations", *_EVAL_PARTS)):
        # the solver's own work between evaluations: its vector algebra on the shards
        # (the L-BFGS history's dots and combinations), vectors made and dropped
        solving = float(phases["first objective"]) + float(phases["iterations"])
        costs["solver algebra"] = round(solving - sum(float(phases[k]) for k in _EVAL_PARTS), 3)
    if "iterations" in phases:  # (a fit without a phase, e.g. key numbering, skips it)
        # the estimator's work around its job: checks, the job's stop, the model object
        spanned = sum(float(phases[k]) for k in _MARKS if k in phases)
        costs["outside the phases"] = round(fit_s - spanned, 3)
    return {
        "evaluations": evaluations,
        "arrow pass s": floor["arrow pass s"],
        "eval s": floor["eval s"],
        "floor s": total,
        "fit/floor": fit_s / total if total > 0 else None,
        "costs": costs,
    }
