"""Local-mode Python workers fork from spark_ps.worker_daemon, with spark-ps preloaded.

A real local[2] session: once a PSContext is attached, the next Python task is served by a
worker whose daemon has already imported the rounds and loaded the compiled kernels.
"""

from __future__ import annotations

import time

from spark_ps.worker_daemon import MODULE


def test_workers_fork_from_the_preloaded_daemon(spark, spark_ps):
    def probe(_):  # a closure: pickled by value, imports nothing of spark-ps itself
        import sys

        rounds = "spark_ps.ml.gbt.rounds" in sys.modules
        kernels = sys.modules.get("spark_ps.ml.tree.kernels")
        compiled = bool(kernels and kernels.HAVE_JIT and kernels._hist_node_rows.signatures)
        return [(rounds, compiled)]

    conf = spark.sparkContext._jsc.sc().conf()
    deadline = time.monotonic() + 60
    while not conf.contains("spark.python.daemon.module") and time.monotonic() < deadline:
        time.sleep(0.1)  # PSContext installs it from a background thread
    assert conf.get("spark.python.daemon.module") == MODULE
    got = spark.sparkContext.parallelize([0, 1], 2).flatMap(probe).collect()
    assert got == [(True, True), (True, True)]
