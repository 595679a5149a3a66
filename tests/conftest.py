"""Shared fixtures: one real local[2] SparkSession for the run, real PS processes per module."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
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


def _launch_report() -> str:
    """What spark-submit itself prints, plus disk and memory: pyspark's JAVA_GATEWAY_EXITED
    says only that the JVM died, and the JVM's own words land in one test's captured output."""
    home = os.environ["SPARK_HOME"]
    try:
        done = subprocess.run(
            [os.path.join(home, "bin", "spark-submit"), "--version"],
            capture_output=True,
            text=True,
            timeout=120,
            stdin=subprocess.DEVNULL,
        )
        said = f"exit {done.returncode}\n{done.stdout[-2000:]}{done.stderr[-4000:]}"
    except (OSError, subprocess.TimeoutExpired) as exc:
        said = repr(exc)
    free = shutil.disk_usage(tempfile.gettempdir()).free >> 20
    with open("/proc/meminfo") as f:
        avail = next((line.strip() for line in f if line.startswith("MemAvailable")), "?")
    return f"SPARK_HOME={home}; {free} MiB free in {tempfile.gettempdir()}; {avail}\n{said}"


def _session(master: str, app: str):
    """Start a session; a JVM that dies at launch is tried once more, and its report is kept."""
    from pyspark.errors import PySparkRuntimeError

    try:
        return _builder(master, app).getOrCreate()
    except PySparkRuntimeError as exc:
        if "JAVA_GATEWAY_EXITED" not in str(exc):
            raise
        first = _launch_report()
    print(
        f"spark-ps tests: Spark's JVM exited at launch; trying once more.\n{first}", file=sys.stderr
    )
    time.sleep(2)
    try:
        return _builder(master, app).getOrCreate()
    except PySparkRuntimeError as exc:
        raise RuntimeError(
            f"Spark's JVM exited at launch twice.\nFirst: {first}\nThen: {_launch_report()}"
        ) from exc


@pytest.fixture(scope="session")
def spark():
    """A real local[2] SparkSession (tasks may retry), shared by the run, stopped at its end."""
    session = _session("local[2, 4]", "spark-ps-tests")  # 4 attempts per task
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
