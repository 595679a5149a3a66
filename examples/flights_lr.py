"""The main job: logistic regression on 3M real US flights, trained on an embedded PS.

Label: arrival delayed more than 15 minutes. Features: hashed one-hot fields and their
crosses (origin, destination, origin x destination, hour, weekday, ...) into 2^20
dimensions. Train on the first 80% of the half-year, test on the rest.

    spark-submit examples/flights_lr.py            # or: python examples/flights_lr.py
    python examples/flights_lr.py --compare        # also fit MLlib's, side by side

The only change from an MLlib job is the import of LogisticRegression.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench.datagen (features)

from bench.common import bench_session, model_auc  # noqa: E402
from bench.datagen import flights_ctr  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--log2-dim", type=int, default=20)
    p.add_argument("--max-iter", type=int, default=20)
    p.add_argument("--reg", type=float, default=0.01)
    p.add_argument("--fraction", type=float, default=1.0, help="sample of the rows")
    p.add_argument("--compare", action="store_true", help="also fit MLlib's LR")
    args = p.parse_args()

    spark = bench_session("4g", app="spark-ps flights LR")
    from spark_ps import PSContext
    from spark_ps.ml.classification import LogisticRegression

    ps = PSContext.getOrCreate(spark)  # embedded: shard processes on loopback
    print(f"PS: {ps}")
    train, test = flights_ctr(spark, log2_dim=args.log2_dim, fraction=args.fraction)
    train = train.cache()
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
        auc = model_auc(model, test)
        print(
            f"{name:9s} fit {secs:6.1f} s  iterations {model.summary.totalIterations:3d}  "
            f"final loss {loss:.6f}  test AUC {auc:.4f}"
        )
    spark.stop()  # stops the embedded PS too


if __name__ == "__main__":
    main()
