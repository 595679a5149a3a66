"""pyspark.ml-compatible estimators trained on the parameter server.

User-facing classes are re-exported from ``spark_ps.ml.classification``; the shared plumbing
(data preparation, Arrow scoring, save/load) lives in :mod:`spark_ps.ml.base`.
"""

__all__: list[str] = []
