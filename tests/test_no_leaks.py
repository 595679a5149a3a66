"""Many fits in one SparkContext leave the PS as they found it: shard processes' memory,
file descriptors and threads stay flat, and so do the driver's. Real Spark, real PS."""

from __future__ import annotations

import threading

import numpy as np
import psutil
import pytest
from pyspark.ml.linalg import Vectors

from spark_ps.ml.classification import GBTClassifier, LogisticRegression

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def _footprint(ps) -> dict[str, float]:
    shards = [psutil.Process(h.pid) for h in ps.client.health()]
    service = psutil.Process(ps.process.pid)
    procs = [*shards, service]
    return {
        "rss_mb": sum(p.memory_info().rss for p in procs) / 2**20,
        "fds": sum(p.num_fds() for p in procs),
        "threads": sum(p.num_threads() for p in procs),
        "driver_fds": psutil.Process().num_fds(),
        "driver_threads": threading.active_count(),
    }


def test_a_hundred_fits_leave_the_ps_and_the_driver_flat(spark_ps):
    spark, ps = spark_ps
    rng = np.random.default_rng(9)
    X = rng.normal(size=(400, 6))
    y = (X[:, 0] - X[:, 1] + 0.3 * rng.normal(size=400) > 0).astype(float)
    df = spark.createDataFrame(
        [(float(y[i]), Vectors.dense(X[i])) for i in range(len(y))], ["label", "features"]
    ).cache()
    lr, gbt = LogisticRegression(maxIter=5), GBTClassifier(maxIter=3, maxDepth=2)

    def fits(n: int) -> None:
        for i in range(n):
            (gbt if i % 3 == 2 else lr).fit(df)

    fits(20)  # warm: worker daemons, numba caches, pools reach their working size
    before = _footprint(ps)
    fits(80)
    after = _footprint(ps)
    grew = {k: after[k] - before[k] for k in before}
    # bounds: a leak of one thread, fd or 1 MB per fit would pass 80, 80 and 80 MB
    assert grew["threads"] <= 4 and grew["driver_threads"] <= 4, grew
    assert grew["fds"] <= 8 and grew["driver_fds"] <= 8, grew
    assert grew["rss_mb"] <= 40, grew
