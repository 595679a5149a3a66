"""Server-side functions that run inside PS shard processes.

Each module here imports only numpy (never pyspark or spark_ps), because shards run without
Spark. ``gbt`` finds GBDT splits on the histograms of the features a shard owns.
"""

__all__ = ["gbt"]
