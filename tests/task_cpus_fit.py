"""GBT and LR fits on whatever master and ``spark.task.cpus`` spark-submit gives them (the
tests: ``local[2]`` with 2 CPUs a task, so one worker with two threads). Prints one
``RESULT <json>`` line: the workers and threads the GBT fit used, its trees, and the LR
coefficients. :func:`frame` makes the same rows in the test's own session."""

from __future__ import annotations

import json
import re

import numpy as np
from child_jobs import LogLines
from pyspark.ml.linalg import Vectors
from pyspark.sql import SparkSession

ROWS, FEATURES = 70_000, 16  # enough rows for every pass to split over two threads


def frame(spark):
    """The fits' rows: a label from interactions of 16 continuous features."""
    rng = np.random.default_rng(23)
    X = rng.normal(size=(ROWS, FEATURES))
    z = X[:, 0] * X[:, 1] + np.sin(X[:, 2]) + 0.5 * X[:, 3] - 0.3 * X[:, 4] ** 2
    y = (z + rng.logistic(size=ROWS) > 0).astype(float)
    rows = [(float(y[i]), Vectors.dense(X[i])) for i in range(ROWS)]
    return spark.createDataFrame(rows, ["label", "features"])


GBT = {"maxIter": 6, "maxDepth": 4, "seed": 3}
LR = {"maxIter": 30, "regParam": 0.01}


def main() -> None:
    from spark_ps.ml._job import task_slots
    from spark_ps.ml.classification import GBTClassifier, LogisticRegression

    spark = SparkSession.builder.appName("task-cpus-fit").getOrCreate()
    df = frame(spark).cache()
    df.count()
    lines = LogLines("spark_ps.ml.gbt")
    gbt = GBTClassifier(**GBT).fit(df)
    threads = re.findall(r"threads (\d+)", "\n".join(lines.lines))
    lr = LogisticRegression(**LR).fit(df)
    out = {
        "slots": spark.sparkContext.defaultParallelism,
        "threads": [int(t) for t in threads],
        "trees": gbt.toDebugString,
        "task_slots": task_slots(spark.sparkContext),
        "coefficients": lr.coefficients.toArray().tolist(),
        "intercept": lr.intercept,
    }
    print("RESULT " + json.dumps(out), flush=True)
    spark.stop()


if __name__ == "__main__":
    main()
