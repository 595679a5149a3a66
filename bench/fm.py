"""Factorization machines: spark-ps FMClassifier vs MLlib's on the same data, side by side.

Run from the repository root, e.g.::

    python -m bench.fm --log2-dims 20,24 --rows 50000 --iters 10

Each (dimension, implementation) case runs in a child process under a memory and time
watchdog (:func:`bench.common.run_guarded`), because MLlib holds numFeatures x factorSize
dense factors in the driver, broadcasts them, and sums a dense gradient of that size per
task (plus AdamW's two dense moments): at 2^24 x 8 that is ~1.2 GiB per copy, and its
expected failure (OutOfMemoryError, or the watchdog) must not take the machine down.
Both fit the same hashed CTR-like rows (:func:`bench.datagen.synthetic_ctr`) with the same
Params; the table gives fit time, test AUC, the driver's JVM heap peak and, for spark-ps,
the PS shards' RSS and the rows they hold.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a file: make `bench` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import (
    REPO_ROOT,
    PeakMemory,
    Timer,
    bench_session,
    fmt_ratio,
    load_note,
    markdown_table,
    model_auc,
    run_guarded,
)
from bench.datagen import synthetic_ctr

__all__ = ["main", "run_case"]

COLUMNS = (
    "dim", "impl", "iters", "fit s", "s/iter", "test AUC", "JVM heap MiB", "PS RSS MiB",
    "PS rows", "speedup", "status",
)  # fmt: skip


def _params(args) -> dict:
    return dict(
        factorSize=args.factors,
        maxIter=args.iters,
        stepSize=args.step,
        miniBatchFraction=1.0,
        solver="adamW",
        seed=7,
        tol=0.0,
    )


def run_case(impl: str, log2_dim: int, args) -> dict:
    """Fit one implementation on one dimension in this process; returns its figures."""
    spark = bench_session(args.driver_memory)
    train = synthetic_ctr(spark, args.rows, log2_dim, nnz=args.nnz, seed=1, partitions=2)
    test = synthetic_ctr(spark, args.rows // 4, log2_dim, nnz=args.nnz, seed=1, start=args.rows)
    train = train.cache()
    train.count()
    if impl == "mllib":
        from pyspark.ml.classification import FMClassifier
    else:
        from spark_ps.ml.classification import FMClassifier
    ps_rss = ps_rows = None
    with PeakMemory(spark) as mem, Timer() as t:
        model = FMClassifier(**_params(args)).fit(train)
    if impl == "sparkps":
        import psutil

        from spark_ps import PSContext

        ps = PSContext.getOrCreate(spark)
        ps_rss = sum(psutil.Process(h.pid).memory_info().rss for h in ps.client.health()) / 2**20
        ps_rows = model._rows_held
    return {
        "fit s": t.elapsed,
        "s/iter": t.elapsed / args.iters,
        "test AUC": model_auc(model, test),
        "JVM heap MiB": (mem.jvm_peak - mem.jvm_base) / 2**20,
        "PS RSS MiB": ps_rss,
        "PS rows": ps_rows,
    }


def _child(impl: str, log2_dim: int, args) -> dict:
    argv = [sys.executable, "-m", "bench.fm", "--case", f"{impl}:{log2_dim}", *args.passthrough]
    code, out, reason = run_guarded(
        argv, cwd=REPO_ROOT, mem_limit_gb=args.mem_limit_gb, timeout=args.timeout
    )
    row = {"dim": f"2^{log2_dim}", "impl": impl, "iters": args.iters}
    marker = next((ln for ln in out.splitlines() if ln.startswith("RESULT ")), None)
    if code == 0 and marker:
        return {**row, **json.loads(marker[7:]), "status": "ok"}
    if reason:
        return {
            **row,
            "status": f"killed ({reason}: > {args.mem_limit_gb} GiB or > {args.timeout}s)",
        }
    java = re.findall(r"java\.lang\.\w+(?:Error|Exception)[^\n]{0,80}", out)
    oom = [j for j in java if "OutOfMemoryError" in j]
    err = [ln for ln in out.splitlines() if "Error" in ln or "Exception" in ln]
    why = (oom or java or err or [f"exit {code}"])[0].strip()[:120]
    return {**row, "status": f"failed: {why}"}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--log2-dims", default="20,24")
    p.add_argument("--impl", default="mllib,sparkps")
    p.add_argument("--rows", type=int, default=50_000)
    p.add_argument("--nnz", type=int, default=20)
    p.add_argument("--factors", type=int, default=8)
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--step", type=float, default=0.01)
    p.add_argument("--driver-memory", default="4g")
    p.add_argument("--mem-limit-gb", type=float, default=7.0)
    p.add_argument("--timeout", type=float, default=900.0)
    p.add_argument("--case", default="", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.passthrough = [
        a
        for a in (argv if argv is not None else sys.argv[1:])
        if not a.startswith("--case") and a != args.case
    ]
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.case:
        impl, log2 = args.case.split(":")
        print("RESULT " + json.dumps(run_case(impl, int(log2), args)), flush=True)
        return
    print(load_note())
    rows = []
    for log2 in (int(x) for x in args.log2_dims.split(",")):
        by_impl = {impl: _child(impl, log2, args) for impl in args.impl.split(",")}
        mllib = by_impl.get("mllib", {})
        for impl, row in by_impl.items():
            if impl != "mllib":
                row["speedup"] = fmt_ratio(mllib.get("fit s"), row.get("fit s"))
            rows.append(row)
        print(markdown_table(rows[-len(by_impl) :], COLUMNS), flush=True)
    print()
    print(f"rows={args.rows} nnz={args.nnz} factorSize={args.factors} iters={args.iters}")
    print(markdown_table(rows, COLUMNS))


if __name__ == "__main__":
    main()
