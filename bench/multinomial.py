"""Multinomial LogisticRegression: spark-ps vs MLlib side by side on hashed sparse text.

Rows are bags of tokens drawn from class-specific (Dirichlet) distributions over a vocabulary
hashed into ``2**log2_dim`` features; both implementations fit the same cached DataFrame with
the same Params in one process, and the table gives wall time, seconds per iteration, the
ratio, and how far spark-ps's coefficient matrix is from MLlib's (relative Frobenius norm).
spark-ps fits first: MLlib keeps its L-BFGS history (20 vectors of features x classes
doubles) and a dense gradient per task in the JVM, and at 2^22 x 10 it can run out of heap,
which in local mode may take the JVM down; its failure is then reported as its row.

    python -m bench.multinomial --log2-dim 20 --classes 10 --rows 20000 --max-iter 10
    python -m bench.multinomial --log2-dim 22 --classes 10 --rows 20000 --max-iter 10
"""

from __future__ import annotations

import argparse
import gc
import os
import re
import time

import numpy as np

from bench.common import markdown_table


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--log2-dim", type=int, default=20)
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--rows", type=int, default=20_000)
    p.add_argument("--tokens", type=int, default=30, help="tokens per row")
    p.add_argument("--vocab", type=int, default=50_000)
    p.add_argument("--max-iter", type=int, default=10)
    p.add_argument("--reg-param", type=float, default=0.01)
    p.add_argument("--partitions", type=int, default=2)
    p.add_argument("--driver-memory", default="6g")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def hashed_text(spark, args: argparse.Namespace):
    """(DataFrame of label, features) built from numpy rows; cached and counted."""
    from pyspark.ml.linalg import Vectors

    rng = np.random.default_rng(args.seed)
    dim, K = 2**args.log2_dim, args.classes
    vocab = rng.choice(dim, size=args.vocab, replace=False)
    topics = rng.dirichlet(np.full(args.vocab, 0.05), size=K)
    labels = rng.integers(K, size=args.rows)
    rows = []
    for c in labels:  # data set-up, not timed
        keys, counts = np.unique(
            rng.choice(vocab, size=args.tokens, p=topics[c]), return_counts=True
        )
        rows.append((float(c), Vectors.sparse(dim, keys.tolist(), counts.astype(float).tolist())))
    df = spark.createDataFrame(rows, ["label", "features"]).repartition(args.partitions).cache()
    df.count()
    return df


def main(argv: list[str] | None = None) -> list[dict]:
    args = parse_args(argv)
    from pyspark.ml.classification import LogisticRegression as MLlibLR
    from pyspark.sql import SparkSession

    from spark_ps.ml.classification import LogisticRegression

    spark = (
        SparkSession.builder.master(f"local[{args.partitions}]")
        .config("spark.driver.memory", args.driver_memory)
        .config("spark.ui.enabled", "false")
        .config("spark.ps.parseCache", "false")  # every timed fit reads its rows
        .getOrCreate()
    )
    print(f"load average: {os.getloadavg()}")
    df = hashed_text(spark, args)
    params = dict(maxIter=args.max_iter, regParam=args.reg_param, tol=1e-10)
    for est in (MLlibLR, LogisticRegression):  # untimed warm-up: JIT, Python workers, PS
        est(maxIter=2, regParam=args.reg_param).fit(df.limit(200))
    out, models = [], {}
    for name, est in (("spark-ps", LogisticRegression), ("mllib", MLlibLR)):
        gc.collect()
        time.sleep(1)
        t0 = time.perf_counter()
        try:
            model = est(**params).fit(df)
        except Exception as e:  # e.g. MLlib's OutOfMemoryError: reported, not fatal
            why = re.findall(r"java\.lang\.\w+Error", str(e)) or [type(e).__name__]
            wall = time.perf_counter() - t0
            out.append({"impl": name, "fit s": f"failed after {wall:.0f} s: {why[0]}"})
            print(out[-1], flush=True)
            continue
        wall = time.perf_counter() - t0
        iters = model.summary.totalIterations
        models[name] = model
        out.append(
            {
                "impl": name,
                "fit s": round(wall, 2),
                "iterations": iters,
                "s/iter": round(wall / max(iters, 1), 3),
                "accuracy": round(model.summary.accuracy, 4),
            }
        )
        print(out[-1], flush=True)
    rel = "n/a"
    if len(models) == 2:
        ref = models["mllib"].coefficientMatrix.toArray()
        got = models["spark-ps"].coefficientMatrix.toArray()
        rel = f"{float(np.linalg.norm(got - ref) / np.linalg.norm(ref)):.1e}"
    mllib_s = out[-1].get("fit s")
    for row in out:
        ok = isinstance(mllib_s, float) and isinstance(row["fit s"], float)
        row["speed-up vs MLlib"] = round(mllib_s / row["fit s"], 2) if ok else "n/a"
        row["rel. diff W"] = rel if row["impl"] == "spark-ps" else "-"
    title = (
        f"multinomial LR, 2^{args.log2_dim} features x {args.classes} classes, "
        f"{args.rows} rows, maxIter {args.max_iter}"
    )
    print(f"\n### {title}\n")
    print(markdown_table(out))
    spark.stop()
    return out


if __name__ == "__main__":
    main()
