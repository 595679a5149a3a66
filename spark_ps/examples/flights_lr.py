"""The main job: logistic regression on 3M real US flights, trained on the PS.

Label: arrival delayed more than 15 minutes. Features: one-hot fields and their crosses
(origin, destination, origin x destination, hour, weekday, ...) hashed into 2^20
dimensions by MLlib's FeatureHasher. Train on January to May of 2001, test on June.

    spark-submit examples/flights_lr.py                  # the master spark-submit is given
    spark-submit --master spark://host:7077 examples/flights_lr.py --fraction 0.1
    python -m spark_ps.examples.flights_lr --compare              # local; also fit MLlib's LR

The only change from an MLlib job is the import of LogisticRegression. On a cluster the
embedded PS binds the driver's address (``spark.driver.host``), so executors on other
hosts reach it; ``--conf spark.ps.address=host:port`` trains on a running PS service
instead. The data path must be readable by every executor (``--data``).
"""

from __future__ import annotations

import argparse
import time

from spark_ps.examples.flights_common import flights, hashed_vectors, roc_auc, session


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--log2-dim", type=int, default=20)
    p.add_argument("--max-iter", type=int, default=20)
    p.add_argument("--reg", type=float, default=0.01)
    p.add_argument("--fraction", type=float, default=1.0, help="sample of the rows")
    p.add_argument("--data", help="flights-3m.parquet (default: $SPARK_PS_DATA/...)")
    p.add_argument("--compare", action="store_true", help="also fit MLlib's LR")
    args = p.parse_args()

    spark = session("spark-ps flights LR")
    from spark_ps import PSContext
    from spark_ps.ml.classification import LogisticRegression

    sc = spark.sparkContext
    ps = PSContext.getOrCreate(spark)  # embedded unless spark.ps.address names a service
    print(f"Spark: {sc.master} ({sc.applicationId})\nPS: {ps}")
    train, test = flights(spark, args.data, args.fraction)
    train = hashed_vectors(train, args.log2_dim).cache()
    test = hashed_vectors(test, args.log2_dim)
    n = train.count()
    print(f"flights: {n:,} training rows, 2^{args.log2_dim} hashed features")
    impls = [("spark-ps", LogisticRegression)]
    if args.compare:
        from pyspark.ml.classification import LogisticRegression as MLlibLR

        impls.append(("MLlib", MLlibLR))
    for name, cls in impls:
        t = time.perf_counter()
        model = cls(maxIter=args.max_iter, regParam=args.reg).fit(train)
        secs = time.perf_counter() - t
        loss = model.summary.objectiveHistory[-1]
        auc = roc_auc(model, test)
        print(
            f"{name:9s} fit {secs:6.1f} s  iterations {model.summary.totalIterations:3d}  "
            f"final loss {loss:.6f}  test AUC {auc:.6f}"
        )
    spark.stop()  # stops the embedded PS too


if __name__ == "__main__":
    main()
