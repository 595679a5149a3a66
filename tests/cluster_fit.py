"""A tiny LR fit on whatever master spark-submit gives it, with default spark-ps settings.

Run by tests/test_cluster.py on a standalone cluster whose executors live on other hosts.
Prints one ``RESULT <json>`` line: whether the fit worked (or the error's type and
message), how long the fit took, the PS address and the application id.
"""

from __future__ import annotations

import json
import time

from pyspark.ml.linalg import Vectors
from pyspark.sql import SparkSession


def main() -> None:
    start = time.monotonic()
    spark = SparkSession.builder.getOrCreate()
    from spark_ps import PSContext
    from spark_ps.ml.classification import LogisticRegression

    ps = PSContext.getOrCreate(spark)
    rows = [
        (float(i % 2), Vectors.dense([i % 2 + 0.3 * (i % 5), 1.0 - 0.1 * i])) for i in range(40)
    ]
    df = spark.createDataFrame(rows, ["label", "features"]).repartition(2).cache()
    df.count()
    out: dict = {"address": ps.address, "app": spark.sparkContext.applicationId}
    out["ready_seconds"] = time.monotonic() - start  # session, PS, executors, cached rows
    t0 = time.monotonic()
    try:
        model = LogisticRegression(maxIter=5, regParam=0.1).fit(df)
        out.update(ok=True, coefficients=model.coefficients.toArray().tolist())
    except Exception as e:  # noqa: BLE001 - reported to the test
        out.update(ok=False, type=type(e).__name__, error=str(e)[:3000])
    out["seconds"] = time.monotonic() - t0
    print("RESULT " + json.dumps(out), flush=True)
    spark.stop()


if __name__ == "__main__":
    main()
