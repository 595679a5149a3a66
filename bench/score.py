"""LR scoring paths and model compression, measured side by side in one run.

Run from the repository root, e.g.::

    python -m bench.score --rows 200000 --log2 24 --compress-datasets synthetic,flights

Scoring: one fitted model scores the same cached rows (``array<bigint>`` keys, one-hot,
written to Spark's noop sink) through each path, against one Arrow pass that only
parses those rows into CSR batches (the floor of any Python-side scoring):

* ``jvm``: the in-memory model on the JVM (weights broadcast once);
* ``python``: the in-memory model in Python workers (mapInArrow);
* ``compressed8``: ``model.compress(8)`` in Python workers (codes dequantized per batch);
* ``ps-pull`` / ``ps-partial``: the model's weights on the PS (``model.toPS()``), each
  batch pulling the weights of its keys / asking the shards for partial margins.

Throughput is rows per second; ``x arrow`` is the path's throughput over the Arrow pass's
(>= 0.5 is the goal). Compression: a model fitted on the synthetic (bench.lr's generator)
and flights data, compressed at 8 and 16 bits, with and without pruning
``--prune-fraction`` of its non-zeros, with its test AUC and sizes in memory and on disk
against the full model's (held as it was fitted: dense float64 for vector input).
``--paths ''`` skips the scoring part.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a file: make `bench` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import Timer, bench_session, load_note, markdown_table, model_auc
from bench.datagen import flights_ctr, synthetic_ctr

__all__ = ["main", "parse_args"]

PATHS = ("jvm", "python", "compressed8", "ps-pull", "ps-partial")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.score", description=__doc__.split("\n")[0])
    p.add_argument("--rows", type=int, default=200_000, help="rows scored")
    p.add_argument("--log2", type=int, default=24, help="hashed dimension of the scored rows")
    p.add_argument("--nnz", type=int, default=30, help="synthetic fields per row")
    p.add_argument("--fit-iter", type=int, default=5, help="L-BFGS iterations of the model")
    p.add_argument("--paths", default=",".join(PATHS), help=f"comma list of {PATHS}")
    p.add_argument("--compress-datasets", default="synthetic,flights", help="'' to skip")
    p.add_argument("--compress-rows", type=int, default=200_000, help="synthetic train rows")
    p.add_argument("--compress-log2", type=int, default=20)
    p.add_argument("--compress-iter", type=int, default=20)
    p.add_argument("--flights-fraction", type=float, default=0.2)
    p.add_argument("--prune-fraction", type=float, default=0.1, help="of the pruned variants")
    p.add_argument("--partitions", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--driver-memory", default="4g")
    p.add_argument("--json-out", default=None)
    return p.parse_args(argv)


def _noop(df: Any) -> float:
    with Timer() as t:
        df.write.format("noop").mode("overwrite").save()
    return t.elapsed


def arrow_pass(df: Any, features: str, values: str, dim: int) -> float:
    """Seconds of one mapInArrow pass parsing every batch into CSR (no scoring)."""
    import pyarrow as pa

    from spark_ps.data import arrow_to_csr

    def parse(batches):
        n = 0
        for b in batches:
            csr = arrow_to_csr(b, features, values_col=values, num_features=dim)
            n += csr.n_rows
        yield pa.RecordBatch.from_pydict({"n": pa.array([n], pa.int64())})

    return _noop(df.mapInArrow(parse, "n long"))


def scoring_bench(spark: Any, args: argparse.Namespace) -> list[dict[str, Any]]:
    """Each scoring path over the same cached rows, as throughput and ratio to Arrow."""
    from spark_ps.ml.classification import LogisticRegression
    from spark_ps.ml.lr import scoring

    paths = [p for p in args.paths.split(",") if p]
    dim = 1 << args.log2
    df = synthetic_ctr(spark, args.rows, args.log2, args.nnz, args.seed, args.partitions, keys=True)
    df = df.cache()
    df.count()
    lr = LogisticRegression(featuresCol="keys", maxIter=args.fit_iter, regParam=0.01)
    model = lr.fit(df)
    print(f"model: {model.coefficientKeys.size:,} non-zeros in 2^{args.log2}", flush=True)
    arrow_pass(df, "keys", None, dim)  # warm the Python workers
    base = arrow_pass(df, "keys", None, dim)
    rows = [{"path": "arrow pass", "s": base, "rows/s": args.rows / base, "x arrow": 1.0}]
    on_ps = model.toPS() if any(p.startswith("ps-") for p in paths) else None
    try:
        for path in paths:
            scoring.ENGINE = "jvm" if path == "jvm" else "python"
            if path in ("jvm", "python"):
                m = model
            elif path == "compressed8":
                m = model.compress(8)
            else:
                m = on_ps.setScoringPath(path[3:])
            _noop(m.transform(df))  # warm (broadcasts, workers, connections)
            s = _noop(m.transform(df))
            rows.append({"path": path, "s": s, "rows/s": args.rows / s, "x arrow": base / s})
        if on_ps is not None:
            assert on_ps.collects == 0, "a PS path collected the model"
    finally:
        scoring.ENGINE = "auto"
        if on_ps is not None:
            on_ps.drop()
    df.unpersist()
    return rows


def _nnz(model: Any) -> int:
    return int((model.coefficientValues != 0.0).sum())


def _dir_bytes(path: str) -> int:
    return sum(
        os.path.getsize(os.path.join(root, f))
        for root, _, files in os.walk(path)
        for f in files
        if not f.startswith(".")
    )


def compression_bench(spark: Any, args: argparse.Namespace) -> list[dict[str, Any]]:
    """Full vs compressed models: test AUC and bytes in memory and on disk."""
    from spark_ps.ml.classification import LogisticRegression

    out: list[dict[str, Any]] = []
    for name in [d for d in args.compress_datasets.split(",") if d]:
        log2 = args.compress_log2
        if name == "synthetic":
            n = args.compress_rows
            train = synthetic_ctr(spark, n, log2, args.nnz, args.seed, args.partitions)
            test = synthetic_ctr(spark, n // 4, log2, args.nnz, args.seed, args.partitions, start=n)
        else:
            train, test = flights_ctr(spark, log2_dim=log2, fraction=args.flights_fraction)
            train, test = train.repartition(args.partitions), test.repartition(args.partitions)
        train, test = train.cache(), test.cache()
        full = LogisticRegression(maxIter=args.compress_iter, regParam=0.001).fit(train)
        full_auc = model_auc(full, test)
        f = args.prune_fraction
        variants = [
            ("full", full),
            ("8 bit", full.compress(8)),
            (f"8 bit, prune {f:.0%}", full.compress(8, pruneFraction=f)),
            ("16 bit", full.compress(16)),
            (f"16 bit, prune {f:.0%}", full.compress(16, pruneFraction=f)),
        ]
        with tempfile.TemporaryDirectory() as tmp:
            for label, m in variants:
                path = os.path.join(tmp, label.replace(" ", "_").replace(",", ""))
                m.write().save(path)
                disk = _dir_bytes(os.path.join(path, "data"))
                a = full_auc if m is full else model_auc(m, test)
                out.append({
                    "data": f"{name} 2^{log2}", "model": label, "non-zeros": _nnz(m),
                    "test AUC": a, "dAUC": a - full_auc, "memory B": m.nbytes, "disk B": disk,
                })  # fmt: skip
        full_row = out[-len(variants)]
        for r in out[-len(variants) :]:
            r["x smaller (mem)"] = full_row["memory B"] / r["memory B"]
            r["x smaller (disk)"] = full_row["disk B"] / r["disk B"]
        train.unpersist()
        test.unpersist()
    return out


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    args = parse_args(argv)
    spark = bench_session(args.driver_memory, app="spark-ps-bench-score")
    from spark_ps import PSContext

    PSContext.getOrCreate(spark)
    print(load_note(), flush=True)
    rows = scoring_bench(spark, args) if args.paths else []
    if rows:
        print(f"\n### LR scoring: {args.rows:,} rows of {args.nnz} keys at 2^{args.log2}\n")
        print(markdown_table(rows, ["path", "s", "rows/s", "x arrow"]), flush=True)
    comp = compression_bench(spark, args) if args.compress_datasets else []
    if comp:
        print("\n### LR compression\n")
        print(markdown_table(comp), flush=True)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(rows + comp, default=str))
    return rows + comp


if __name__ == "__main__":
    main()
