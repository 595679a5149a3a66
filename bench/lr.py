"""Logistic regression: spark-ps vs MLlib on the same cached DataFrames, printed as ratios.

Run from the repository root, e.g.::

    python -m bench.lr --impl mllib,sparkps --datasets synthetic,flights --log2-dims 20,24

Every implementation gets identical Params; spark-ps is skipped with a note while
``spark_ps.ml.classification.LogisticRegression`` cannot be imported. Cases whose
dimension is at least ``--isolate-log2`` run MLlib in a child process, because MLlib's
expected failure there (driver/executor OutOfMemoryError) can kill the JVM.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a file: make `bench` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import (
    REPO_ROOT,
    PeakMemory,
    ProcessCPU,
    Timer,
    bench_session,
    fmt_ratio,
    import_sparkps,
    load_note,
    markdown_table,
    model_auc,
    parse_impls,
    run_guarded,
)
from bench.datagen import MAX_VECTOR_LOG2, dense_features, flights_ctr, synthetic_ctr
from bench.floor import floor_row, measure_floor

__all__ = ["COLUMNS", "Case", "main", "parse_args"]

IMPLS = ("mllib", "sparkps")
DATASETS = ("synthetic", "flights", "dense")
COLUMNS = (
    "dataset", "dim", "train rows", "impl", "iters", "fit s", "fits s", "s/iter", "setup s",
    "iter s",
    "final loss",
    "t to MLlib loss s", "JVM heap MiB", "py RSS MiB", "test AUC",
    "speedup", "speedup to loss", "heap ratio", "dAUC", "floor s", "fit/floor",
    "refit s", "refit/floor", "status",
)  # fmt: skip


@dataclass
class Case:
    """One training/test pair to benchmark."""

    dataset: str
    dim: str
    log2_dim: int | None
    train: Any
    test: Any
    features_col: str = "features"
    rows: int | None = None  # generated train rows (synthetic/dense), for child re-runs
    floor: dict | None = None  # bench/floor.py's measures on `train`, once per case


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command line of the LR benchmark (see bench/README.md)."""
    p = argparse.ArgumentParser(prog="python -m bench.lr", description=__doc__.split("\n")[0])
    p.add_argument("--impl", default="mllib,sparkps", help=f"comma list of {IMPLS}")
    p.add_argument("--datasets", default="synthetic,flights,dense", help=f"of {DATASETS}")
    p.add_argument("--log2-dims", default="20,24", help="hashed dims for synthetic and flights")
    p.add_argument("--rows", type=int, default=1_000_000, help="synthetic/dense train rows")
    p.add_argument("--test-rows", type=int, default=None, help="default rows/4")
    p.add_argument("--nnz", type=int, default=30, help="synthetic fields per row")
    p.add_argument("--dense-features", type=int, default=100)
    p.add_argument("--flights-fraction", type=float, default=1.0, help="row sample of flights")
    p.add_argument("--huge", action="store_true", help="add synthetic 2**30 (MLlib may fail)")
    p.add_argument("--huge-rows", type=int, default=None, help="rows of the 2**30 case")
    p.add_argument("--isolate-log2", type=int, default=28, help="fits in a child from here")
    p.add_argument("--mem-limit-gb", type=float, default=12.0, help="child process-tree cap")
    p.add_argument("--target-loss", type=float, default=None, help=argparse.SUPPRESS)
    p.add_argument("--transform", action="store_true", help="also time scoring at 2**24")
    p.add_argument("--transform-rows", type=int, default=200_000)
    p.add_argument("--transform-log2", type=int, default=24)
    p.add_argument("--transform-keys", action="store_true", help="score array<bigint> keys")
    p.add_argument("--transform-fit-iter", type=int, default=5)
    p.add_argument("--max-iter", type=int, default=20)
    p.add_argument("--reg-param", type=float, default=0.01)
    p.add_argument("--elastic-net-param", type=float, default=0.0)
    p.add_argument("--tol", type=float, default=1e-6)
    p.add_argument("--standardization", choices=("true", "false"), default="false")
    p.add_argument("--sparkps-params", default="{}", help="JSON of extra spark-ps Params")
    p.add_argument("--loss-rtol", type=float, default=1e-4, help="'reached MLlib loss' margin")
    p.add_argument(
        "--mllib-ref",
        default="",
        help="MLlib s/iter measured elsewhere, e.g. '24=8.9': ratios for cases MLlib cannot run",
    )
    p.add_argument(
        "--refit",
        action="store_true",
        help="fit spark-ps again on the same cached rows (it reads its saved parses)",
    )
    p.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="fits per implementation and case; the row is the median fit's (not with --refit)",
    )
    p.add_argument(
        "--task-cpus",
        type=int,
        default=1,
        help="spark.task.cpus: each spark-ps worker (and floor task) uses this many threads",
    )
    p.add_argument("--partitions", type=int, default=None, help="default: 2 / --task-cpus")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--driver-memory", default="6g")
    p.add_argument("--no-warmup", action="store_true", help="skip the tiny JIT warm-up fit")
    p.add_argument("--json-out", default=None, help="also write the rows as JSON here")
    p.add_argument("--child-timeout", type=float, default=1800.0)
    args = p.parse_args(argv)
    if args.repeat < 1:
        p.error("--repeat must be at least 1")
    if args.repeat > 1 and args.refit:  # a repeated first fit would read the saved parses
        p.error("--repeat and --refit do not combine: every fit after the first is a refit")
    return args


def lr_params(args: argparse.Namespace, features_col: str) -> dict[str, Any]:
    """The Params every implementation receives, identical by construction."""
    return {
        "featuresCol": features_col,
        "labelCol": "label",
        "maxIter": args.max_iter,
        "regParam": args.reg_param,
        "elasticNetParam": args.elastic_net_param,
        "tol": args.tol,
        "standardization": args.standardization == "true",
    }


def estimator(impl: str, args: argparse.Namespace, features_col: str) -> Any | None:
    """An unfitted LR of ``impl``, or None when spark-ps is not importable."""
    params = lr_params(args, features_col)
    if impl == "mllib":
        from pyspark.ml.classification import LogisticRegression

        return LogisticRegression(**params)
    cls = import_sparkps("LogisticRegression")
    if cls is None:
        return None
    return cls(**params, **json.loads(args.sparkps_params))


def build_cases(spark: Any, args: argparse.Namespace) -> list[Case]:
    """The (dataset, dim) grid of this run; DataFrames are not cached yet."""
    datasets = parse_impls(args.datasets, DATASETS)
    dims = [int(d) for d in args.log2_dims.split(",") if d.strip()]
    test_rows = args.test_rows or max(args.rows // 4, 1)
    cases: list[Case] = []
    for log2 in dims:
        if "synthetic" in datasets:
            col = "features" if log2 <= MAX_VECTOR_LOG2 else "keys"
            tr = synthetic_ctr(spark, args.rows, log2, args.nnz, args.seed, args.partitions)
            te = synthetic_ctr(
                spark, test_rows, log2, args.nnz, args.seed, args.partitions, start=args.rows
            )
            cases.append(Case("synthetic", f"2^{log2}", log2, tr, te, col, args.rows))
        if "flights" in datasets:
            tr, te = flights_ctr(spark, log2_dim=log2, fraction=args.flights_fraction)
            col = "features" if log2 <= MAX_VECTOR_LOG2 else "keys"
            tr, te = tr.repartition(args.partitions), te.repartition(args.partitions)
            cases.append(Case("flights-3m", f"2^{log2}", log2, tr, te, col))
    if "dense" in datasets:
        n = args.dense_features
        tr = dense_features(spark, args.rows, n, args.seed, args.partitions)
        te = dense_features(spark, test_rows, n, args.seed, args.partitions, start=args.rows)
        cases.append(Case("dense", str(n), None, tr, te))
    if args.huge:
        rows = args.huge_rows or args.rows
        tr = synthetic_ctr(spark, rows, 30, args.nnz, args.seed, args.partitions)
        te = synthetic_ctr(spark, test_rows, 30, args.nnz, args.seed, args.partitions, start=rows)
        cases.append(Case("synthetic", "2^30", 30, tr, te, rows=rows))
    return cases


def _time_to_loss(summary: Any, target: float, rtol: float) -> float | None:
    """Seconds until ``objectiveHistory`` first reaches ``target`` (within rtol), if known.

    Needs ``summary.iterationTimestamps``: seconds since the fit started, one per
    objectiveHistory entry. MLlib has none, so its column stays 'n/a'.
    """
    stamps = getattr(summary, "iterationTimestamps", None)
    if stamps is None or target is None:
        return None
    for loss, stamp in zip(summary.objectiveHistory, stamps, strict=False):
        if loss <= target + rtol * abs(target):
            return float(stamp)
    return float("inf")


def fit_one(
    impl: str,
    est: Any,
    case: Case,
    spark: Any,
    target: float | None,
    rtol: float,
    refit: bool = False,
    repeat: int = 1,
):
    """Fit and score one implementation on one case; a failure becomes a row, not a crash.
    With `refit` a fit that reports its phases (spark-ps) runs again on the same cached
    rows, reading the parses the first one saved, and is compared with the same floor.
    `repeat` fits: the row is the median one's (the lower median of an even count), with
    every fit's time beside it, against the same floor."""
    row: dict[str, Any] = {"impl": impl, "status": "ok"}
    try:
        fits = []
        for _ in range(repeat):
            with PeakMemory(spark) as mem, ProcessCPU() as cpu, Timer() as t:
                model = est.fit(case.train)
            line = f"{impl} {case.dataset} {case.dim} fit {t.elapsed:.3f} s; {cpu.line()}"
            print(line, flush=True)
            fits.append((t.elapsed, model, mem))
        elapsed, model, mem = sorted(fits, key=lambda f: f[0])[(len(fits) - 1) // 2]
        row["fits s"] = " / ".join(f"{f[0]:.2f}" for f in fits)
        summary = model.summary
        iters = int(summary.totalIterations)
        history = list(summary.objectiveHistory)
        stamps = getattr(summary, "iterationTimestamps", None) or []
        phases = getattr(model, "_fit_phases", None)
        if phases:
            print(f"{impl} {case.dataset} {case.dim} phases (s): {phases}", flush=True)
            row.update(_floor(case, elapsed, phases))
            if refit:
                row.update(_refit(impl, est, case, row, history))
        row.update(
            {
                "iters": iters,
                "fit s": elapsed,
                "s/iter": elapsed / max(iters, 1),
                "setup s": stamps[0] if stamps else None,
                "iter s": (stamps[-1] - stamps[0]) / iters if len(stamps) > 1 else None,
                "final loss": history[-1] if history else None,
                "t to MLlib loss s": _time_to_loss(summary, target, rtol),
                "JVM heap MiB": mem.jvm_mib,
                "py RSS MiB": mem.py_mib,
                "test AUC": model_auc(model, case.test),
            }
        )
    except Exception as exc:  # report the failure (e.g. MLlib's OOM at 2**30) and go on
        row["status"] = _failure(exc)
    return row


def _refit(impl: str, est: Any, case: Case, row: dict, history: list) -> dict[str, Any]:
    """A second fit on the same cached rows: its time and its ratio to the same floor."""
    with Timer() as t:
        again = est.fit(case.train)
    same = list(again.summary.objectiveHistory)[-1]
    print(
        f"{impl} {case.dataset} {case.dim} refit {t.elapsed:.3f} s "
        f"= {t.elapsed / row['floor s']:.2f}x the floor (final loss {same:.10g}, first fit "
        f"{history[-1]:.10g}); phases (s): {getattr(again, '_fit_phases', None)}",
        flush=True,
    )
    return {"refit s": t.elapsed, "refit/floor": t.elapsed / row["floor s"]}


def _floor(case: Case, fit_s: float, phases: dict) -> dict[str, Any]:
    """The fit's compute floor on the same cached partitions (bench/floor.py), printed
    with the costs that lie between the floor and the fit."""
    if case.floor is None:
        case.floor = measure_floor(case.train, case.features_col)
    f = floor_row(fit_s, phases, case.floor)
    print(
        f"floor {case.dataset} {case.dim}: Arrow pass {f['arrow pass s']:.3f} s (fastest of "
        f"{case.floor.get('arrow passes s')}, read as {case.floor.get('read as')}) + "
        f"{f['evaluations']} evaluations x {f['eval s']:.4f} s = {f['floor s']:.3f} s; "
        f"fit {fit_s:.3f} s = {f['fit/floor']:.2f}x the floor; costs (s): {f['costs']}",
        flush=True,
    )
    return {"floor s": f["floor s"], "fit/floor": f["fit/floor"]}


#: What a failed fit's status adds when the JVM ran out of heap (MLlib at 2^24 and 1M rows
#: ran out of a 6g driver and finished with 16g: bench/RESULTS.md, 2026-11-29).
HEAP_HINT = "; the JVM ran out of heap: give it more with --driver-memory (16g at 2^24)"


def _heap_hint(text: str) -> str:
    """HEAP_HINT if `text` reports the JVM's heap exhausted (not Metaspace or direct
    buffers, which more heap does not help), else ""."""
    out_of_heap = "Java heap space" in text or "GC overhead limit exceeded" in text
    return HEAP_HINT if out_of_heap and HEAP_HINT not in text else ""


def _failure(exc: Exception) -> str:
    """A one-line status for a failed fit: exception type and first message line (and how
    to give the JVM more heap, when it ran out)."""
    text = str(exc).strip()
    first = text.splitlines()[0][:160] if text else ""
    return f"failed: {type(exc).__name__}: {first}{_heap_hint(text)}"


def _child_argv(impl: str, case: Case, args: argparse.Namespace, target: float | None):
    """Command line that re-runs one (impl, case) of this run in a child process."""
    dataset = "flights" if case.dataset.startswith("flights") else case.dataset
    argv = [sys.executable, "-m", "bench.lr", "--impl", impl, "--datasets", dataset]
    argv += ["--log2-dims", str(case.log2_dim), "--rows", str(case.rows or args.rows)]
    argv += ["--flights-fraction", str(args.flights_fraction)]
    argv += ["--test-rows", str(args.test_rows or max(args.rows // 4, 1))]
    argv += ["--isolate-log2", "99", "--driver-memory", args.driver_memory]
    for flag in ("max_iter", "reg_param", "elastic_net_param", "tol", "standardization"):
        argv += [f"--{flag.replace('_', '-')}", str(getattr(args, flag))]
    argv += ["--nnz", str(args.nnz), "--seed", str(args.seed), "--partitions", str(args.partitions)]
    argv += ["--task-cpus", str(args.task_cpus), "--repeat", str(args.repeat)]
    argv += ["--sparkps-params", args.sparkps_params, "--loss-rtol", str(args.loss_rtol)]
    if target is not None:
        argv += ["--target-loss", repr(target)]
    if args.no_warmup:
        argv.append("--no-warmup")
    return argv


def _in_child(impl: str, case: Case, args: argparse.Namespace, target: float | None) -> dict:
    """Run one implementation on a huge case in its own Python+JVM, under a memory watchdog."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "rows.json"
        argv = _child_argv(impl, case, args, target) + ["--json-out", str(out)]
        code, log, reason = run_guarded(
            argv, cwd=REPO_ROOT, mem_limit_gb=args.mem_limit_gb, timeout=args.child_timeout
        )
        if reason == "memory":
            return {"impl": impl, "status": f"failed: process tree passed {args.mem_limit_gb} GiB"}
        if reason == "timeout":
            return {"impl": impl, "status": f"failed: timeout after {args.child_timeout:.0f} s"}
        rows = json.loads(out.read_text()) if out.exists() else []
        if rows and rows[0].get("status") == "ok":
            return rows[0] | {"impl": impl}
        lines = log.splitlines()
        errs = [ln for ln in lines if "OutOfMemoryError" in ln] or [
            ln for ln in lines if "Error" in ln or "failed" in ln
        ]
        msg = errs[0].strip()[:160] if errs else (rows[0]["status"] if rows else "no output")
        return {"impl": impl, "status": f"failed (exit {code}): {msg}{_heap_hint(msg)}"}


def add_ratios(rows: list[dict[str, Any]], ref_s_per_iter: float | None = None) -> None:
    """Fill the ratio columns of every row against the MLlib row of the same case.

    Without an MLlib row (it failed or was skipped) and with a reference MLlib s/iter
    measured elsewhere, 'speedup to loss' is ``ref * iters / fit s`` marked '(ref)': our
    L-BFGS walks MLlib's path, so MLlib's final loss is ours after the same iterations.
    """
    base = next((r for r in rows if r["impl"] == "mllib" and r["status"] == "ok"), None)
    if base is None and ref_s_per_iter:
        for r in rows:
            if r["impl"] != "mllib" and r["status"] == "ok":
                mllib_s = ref_s_per_iter * r["iters"]
                r["speedup to loss"] = f"{fmt_ratio(mllib_s, r['fit s'])} (ref)"
        return
    for r in rows:
        if base is None or r["status"] != "ok":
            continue
        r["speedup"] = fmt_ratio(base["fit s"], r["fit s"])
        r["speedup to loss"] = fmt_ratio(base["fit s"], r.get("t to MLlib loss s"))
        r["heap ratio"] = fmt_ratio(r["JVM heap MiB"], base["JVM heap MiB"])
        r["dAUC"] = f"{r['test AUC'] - base['test AUC']:+.4f}"


def _mllib_refs(text: str) -> dict[int, float]:
    """``'24=8.9,22=3.3'`` -> {24: 8.9, 22: 3.3} (log2 dim -> MLlib seconds per iteration)."""
    out = {}
    for item in filter(None, (t.strip() for t in text.split(","))):
        log2, _, sec = item.partition("=")
        try:
            out[int(log2)] = float(sec)
        except ValueError:
            raise ValueError(f"--mllib-ref: {item!r} is not LOG2=SECONDS") from None
    return out


def run_case(spark: Any, case: Case, impls: list[str], args: argparse.Namespace) -> list[dict]:
    """All implementations on one case, MLlib first so that its loss is the target.

    Cases at or above ``--isolate-log2`` run each implementation in a guarded child
    process (see :func:`bench.common.run_guarded`) and are not cached here.
    """
    big = case.log2_dim is not None and case.log2_dim >= args.isolate_log2
    n_train = None
    if not big:
        case.train.cache()
        case.test.cache()
        n_train = case.train.count()
        case.test.count()
    rows: list[dict[str, Any]] = []
    target = args.target_loss
    for impl in impls:
        if impl == "mllib" and case.features_col != "features":
            row = {"impl": impl, "status": "skipped: VectorUDT cannot hold > 2^30 dims"}
        elif estimator(impl, args, case.features_col) is None:  # spark-ps not importable
            continue
        elif big:
            row = _in_child(impl, case, args, target)
        else:
            est = estimator(impl, args, case.features_col)
            row = fit_one(impl, est, case, spark, target, args.loss_rtol, args.refit, args.repeat)
        if impl == "mllib" and row["status"] == "ok":
            target = row["final loss"]
        rows.append({"dataset": case.dataset, "dim": case.dim, "train rows": n_train} | row)
    if not big:
        try:
            case.train.unpersist()
            case.test.unpersist()
        except Exception as exc:  # the JVM may be gone after a fatal OOM
            print(f"note: could not unpersist {case.dataset} {case.dim}: {type(exc).__name__}")
    add_ratios(rows, _mllib_refs(args.mllib_ref).get(case.log2_dim))
    return rows


def transform_bench(spark: Any, impls: list[str], args: argparse.Namespace) -> list[dict]:
    """Score ``--transform-rows`` rows at ``2**--transform-log2`` with each implementation.

    Each model is first fitted for ``--transform-fit-iter`` iterations on the same rows;
    only the scoring passes (all output columns, written to Spark's noop sink) are timed:
    the first right after the fit (``transform s``), then the same model again (``again s``).
    With ``--transform-keys`` (or beyond 2^30) the ``keys`` column (``array<bigint>``) is
    scored instead of vectors; MLlib cannot read it, nor hold a dense model from
    ``--isolate-log2`` on, and is then skipped.
    """
    n, log2 = args.transform_rows, args.transform_log2
    keys = args.transform_keys or log2 > MAX_VECTOR_LOG2
    col = "keys" if keys else "features"
    df = synthetic_ctr(spark, n, log2, args.nnz, args.seed, args.partitions, keys=keys).cache()
    df.count()
    fit_args = argparse.Namespace(**{**vars(args), "max_iter": args.transform_fit_iter})
    rows: list[dict[str, Any]] = []
    for impl in impls:
        est = estimator(impl, fit_args, col)
        if est is None:
            continue
        row: dict[str, Any] = {"impl": impl, "rows": n, "dim": f"2^{log2}", "input": col}
        if impl == "mllib" and (keys or log2 >= args.isolate_log2):
            rows.append(row | {"status": "skipped: MLlib cannot score this input"})
            continue
        row["status"] = "ok"
        try:
            model = est.fit(df)
            for key in ("transform s", "again s"):
                with Timer() as t:
                    model.transform(df).write.format("noop").mode("overwrite").save()
                row[key] = t.elapsed
        except Exception as exc:
            row["status"] = _failure(exc)
        rows.append(row)
    base = next((r for r in rows if r["impl"] == "mllib" and r["status"] == "ok"), None)
    for r in rows:
        ok = base is not None and r["status"] == "ok"
        r["speedup"] = fmt_ratio(base["transform s"], r["transform s"]) if ok else "n/a"
        r["speedup again"] = fmt_ratio(base["again s"], r["again s"]) if ok else "n/a"
    df.unpersist()
    return rows


#: Dense rows of the warm-up when the run has its dense case (see `warmup`).
DENSE_WARMUP_ROWS = 20_000


def warmup(spark: Any, impls: list[str], args: argparse.Namespace) -> list[tuple[str, str, int]]:
    """Fit each implementation once on small data of each kind the run fits, so no timed
    fit pays JIT/worker start-up; returns (kind, impl, the model's numFeatures) per fit.
    Sparse synthetic rows always (2,000); with the dense case also `DENSE_WARMUP_ROWS`
    dense rows of its width, since a session's first dense fit pays for the packed read of
    dense rows once (see bench/RESULTS.md, 2026-11-29)."""
    frames = [("synthetic", synthetic_ctr(spark, 2000, 12, 10, args.seed, args.partitions))]
    if "dense" in parse_impls(args.datasets, DATASETS):
        n = args.dense_features
        frames.append(
            ("dense", dense_features(spark, DENSE_WARMUP_ROWS, n, args.seed, args.partitions))
        )
    fit_args = argparse.Namespace(**{**vars(args), "max_iter": 3})
    fitted = []
    with Timer() as t:
        for kind, df in frames:
            df = df.cache()
            for impl in impls:
                est = estimator(impl, fit_args, "features")
                if est is not None:
                    model = est.fit(df)
                    model_auc(model, df)
                    fitted.append((kind, impl, int(model.numFeatures)))
            df.unpersist()
    kinds = list(dict.fromkeys(kind for kind, _, _ in fitted))
    print(f"warm-up ({', '.join(kinds)}): {t.elapsed:.1f} s", flush=True)
    return fitted


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    """Run the grid, print one markdown table per case, return all rows."""
    args = parse_args(argv)
    impls = parse_impls(args.impl, IMPLS)
    impls = sorted(impls, key=lambda i: i != "mllib")  # MLlib first: its loss is the target
    args.partitions = args.partitions or max(1, 2 // args.task_cpus)
    conf = {"spark.task.cpus": str(args.task_cpus)}
    spark = bench_session(args.driver_memory, app="spark-ps-bench-lr", conf=conf)
    print(load_note(), flush=True)
    if args.refit:  # the first fit saves its parses, the refit reads them
        spark.conf.set("spark.ps.parseCache", "true")
    if not args.no_warmup:
        warmup(spark, impls, args)
    all_rows: list[dict[str, Any]] = []
    for case in build_cases(spark, args):
        rows = run_case(spark, case, impls, args)
        print(f"\n### LR {case.dataset} dim {case.dim}\n", flush=True)
        print(markdown_table(rows, COLUMNS), flush=True)
        all_rows += rows
    if args.transform:
        rows = transform_bench(spark, impls, args)
        print(f"\n### LR transform (score rows at 2^{args.transform_log2})\n")
        cols = ["impl", "rows", "dim", "input", "transform s", "again s", "speedup",
                "speedup again", "status"]  # fmt: skip
        print(markdown_table(rows, cols), flush=True)
        all_rows += rows
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(all_rows, default=str))
    return all_rows


if __name__ == "__main__":
    main()
