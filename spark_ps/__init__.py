"""spark-ps: a sharded parameter server for Apache Spark, with drop-in MLlib estimators."""

from pathlib import Path

from spark_ps.client import PSError
from spark_ps.context import PSContext
from spark_ps.models import PSEmbedding, PSMatrix, PSVector

__all__ = ["PSContext", "PSVector", "PSMatrix", "PSEmbedding", "PSError", "jar_path"]
__version__ = "0.1.0"


def jar_path() -> Path:
    """The JVM bridge jar inside the installed package, for ``spark.jars`` / ``--jars``.

    spark-ps adds it to a running session by itself; name it explicitly where a session
    is built before spark-ps is imported and must export models from its first job.
    """
    from spark_ps._jvm import bridge_jar

    return bridge_jar()
