"""Three LR fits on one persisted DataFrame on whatever master spark-submit gives it (the
tests use ``local-cluster[2,1,1024]``: separate executor JVMs, each with its own local
directory). Prints one ``RESULT <json>`` line: per fit, whether its workers read saved
parses or missed them (then the rows were read), and its coefficients and intercept."""

from __future__ import annotations

import json

import numpy as np
from child_jobs import LogLines
from pyspark.ml.linalg import Vectors
from pyspark.sql import SparkSession


def main() -> None:
    from spark_ps.ml.classification import LogisticRegression

    spark = SparkSession.builder.appName("parse-cache-fit").getOrCreate()
    rng = np.random.default_rng(5)
    X = rng.normal(size=(3000, 12))
    y = (rng.random(3000) < 1 / (1 + np.exp(-X @ np.linspace(-1, 1, 12)))).astype(float)
    rows = [(float(y[i]), Vectors.dense(X[i].tolist())) for i in range(3000)]
    df = spark.createDataFrame(rows, ["label", "features"]).repartition(2).cache()
    df.count()
    lines = LogLines("spark_ps.job")
    fits = []
    for _ in range(3):
        del lines.lines[:]
        model = LogisticRegression(maxIter=20, regParam=0.01).fit(df)
        text = "\n".join(lines.lines)
        fits.append(
            {
                "read": "read their saved parses" in text,
                "missed": "was not on its executor" in text,
                "coefficients": model.coefficients.toArray().tolist(),
                "intercept": model.intercept,
            }
        )
    print("RESULT " + json.dumps({"fits": fits}), flush=True)
    spark.stop()


if __name__ == "__main__":
    main()
