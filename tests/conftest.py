"""Shared fixtures: one real local[2] SparkSession for the run, real PS processes per module."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


sys.path.insert(0, str(ROOT))
from bench.common import spark_home  # noqa: E402 - one SPARK_HOME recipe for tests and benches

os.environ.setdefault("SPARK_HOME", spark_home())
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
# executor Python workers unpickle functions defined in test modules by reference
os.environ["PYTHONPATH"] = os.pathsep.join(
    p for p in (str(ROOT / "tests"), str(ROOT), os.environ.get("PYTHONPATH", "")) if p
)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)


def _builder(master: str, app: str):
    from pyspark.sql import SparkSession

    return (
        SparkSession.builder.master(master)
        .appName(app)
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.driver.memory", "2g")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config("spark.python.worker.reuse", "true")
        .config("spark.task.maxFailures", "4")
    )


@pytest.fixture(scope="session")
def spark():
    """A real local[2] SparkSession (tasks may retry), shared by the run, stopped at its end."""
    session = _builder("local[2, 4]", "spark-ps-tests").getOrCreate()  # 4 attempts per task
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.fixture(scope="session")
def ps():
    """A real embedded PS (coordinator + 2 shard processes on loopback), stopped at the end."""
    from spark_ps import PSContext

    ctx = PSContext.getOrCreate(numShards=2)
    yield ctx
    ctx.stop()


@pytest.fixture(scope="session")
def spark_ps(spark, ps):
    """Spark and the PS together: `PSContext.getOrCreate(spark)` returns the same PS."""
    from spark_ps import PSContext

    assert PSContext.getOrCreate(spark) is ps
    return spark, ps
