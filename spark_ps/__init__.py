"""spark-ps: a sharded parameter server for Apache Spark, with drop-in MLlib estimators."""

from spark_ps.client import PSError
from spark_ps.context import PSContext
from spark_ps.models import PSEmbedding, PSMatrix, PSVector

__all__ = ["PSContext", "PSVector", "PSMatrix", "PSEmbedding", "PSError"]
__version__ = "0.1.0"
