"""Tiny LR fits on whatever master spark-submit gives it, one embedded PS after another.

Run by tests/test_cluster.py on a standalone cluster whose executors live on other hosts:
``cluster_fit.py default 127.0.0.1`` fits on an embedded PS with default settings, stops
it, then fits on one bound to ``spark.ps.host=127.0.0.1`` (one application: the second
case costs no second start of Spark and its executors). Prints one ``RESULT <json>``
line: per case, whether the fit worked (or the error's type and message), how long it
took and the PS address; and the application id.
"""

from __future__ import annotations

import json
import sys
import time

from pyspark.ml.linalg import Vectors
from pyspark.sql import SparkSession


def fit(spark, df, host: str) -> dict:
    from spark_ps import PSContext
    from spark_ps.ml.classification import LogisticRegression

    ps = PSContext.getOrCreate(spark, **({} if host == "default" else {"host": host}))
    out: dict = {"address": ps.address}
    t0 = time.monotonic()
    try:
        model = LogisticRegression(maxIter=5, regParam=0.1).fit(df)
        out.update(ok=True, coefficients=model.coefficients.toArray().tolist())
    except Exception as e:  # noqa: BLE001 - reported to the test
        out.update(ok=False, type=type(e).__name__, error=str(e)[:3000])
    out["seconds"] = time.monotonic() - t0
    ps.stop()
    return out


def main() -> None:
    start = time.monotonic()
    spark = SparkSession.builder.getOrCreate()
    rows = [
        (float(i % 2), Vectors.dense([i % 2 + 0.3 * (i % 5), 1.0 - 0.1 * i])) for i in range(40)
    ]
    df = spark.createDataFrame(rows, ["label", "features"]).repartition(2).cache()
    df.count()
    out: dict = {"app": spark.sparkContext.applicationId}
    out["ready_seconds"] = time.monotonic() - start  # session, executors, cached rows
    out["fits"] = {host: fit(spark, df, host) for host in sys.argv[1:]}
    print("RESULT " + json.dumps(out), flush=True)
    spark.stop()


if __name__ == "__main__":
    main()
