"""What the flights examples share: the session, the rows, the hashed features, the AUC.

Not an example itself. Everything here runs in the driver and builds Spark SQL / MLlib
plans, so the executors need nothing from this file beyond the installed package.

The rows are a pure function of the data and ``fraction`` (a sample by a hash of each
row's content, not by partition), and the split is by date, so a run on ``local[2]`` and
one on a cluster train on exactly the same rows.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

__all__ = ["FIELDS", "flights", "hashed_keys", "hashed_vectors", "roc_auc", "session"]

#: SQL expressions hashed one field each; crosses are concatenations. ``day``, ``hour``
#: and ``minute`` come from the UTC instant, so they do not depend on the session time zone.
FIELDS: tuple[str, ...] = (
    "origin",
    "destination",
    "concat(origin, '>', destination)",
    "hour",
    "dayofweek(day)",
    "concat(hour, '@', origin)",
    "concat(hour, '@', destination)",
    "concat(dayofweek(day), '@', hour)",
    "concat(dayofweek(day), '@', origin)",
    "floor(log2(greatest(distance, 1)) * 4)",
    "month(day)",
    "hour * 4 + minute div 15",
)
#: Train on January to May of 2001, test on June.
TEST_FROM = "2001-06-01"


def session(app: str, driver_memory: str = "4g") -> Any:
    """The SparkSession of an example. Under ``spark-submit`` its ``--master`` and settings
    rule; run with plain ``python``, the example starts a local Spark (``local[*]``, and
    `driver_memory`, which only a JVM still to be launched can take)."""
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName(app)
    if "PYSPARK_GATEWAY_PORT" not in os.environ:  # not launched by spark-submit
        builder = builder.master("local[*]").config("spark.driver.memory", driver_memory)
    return builder.getOrCreate()


def data_path(path: str | None = None) -> str:
    """The flights parquet: `path`, else $SPARK_PS_DATA, else ../shared/data beside a
    checkout of the repository. On a cluster it must be readable by every executor (HDFS,
    S3, NFS)."""
    if path:
        return path
    folder = os.environ.get("SPARK_PS_DATA") or Path(__file__).resolve().parents[3] / "shared/data"
    found = Path(folder) / "flights-3m.parquet"
    if not os.environ.get("SPARK_PS_DATA") and not found.exists():
        raise FileNotFoundError(
            f"flights-3m.parquet not found at {found}: pass --data PATH or set SPARK_PS_DATA "
            "(it ships in the npm package vega-datasets@3.2.1, package/data/)"
        )
    return str(found)


def flights(spark: Any, path: str | None = None, fraction: float = 1.0) -> tuple[Any, Any]:
    """(train, test): ``label`` (arrival more than 15 minutes late) and one column per
    :data:`FIELDS` (``f0``, ``f1``, ... as strings), split at :data:`TEST_FROM`.

    ``fraction`` < 1 keeps the rows whose content hash falls below it: the same rows
    whatever the partitioning, the master or the number of executors.
    """
    from pyspark.sql import functions as F

    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"--fraction {fraction} must be in (0, 1]")
    raw = spark.read.parquet(data_path(path))
    if fraction < 1.0:
        bucket = F.pmod(F.xxhash64("date", "delay", "distance", "origin", "destination"), 10**6)
        raw = raw.where(bucket < int(round(fraction * 10**6)))
    ts = F.unix_micros("date")
    raw = raw.select(
        "*",
        F.expr("date_from_unix_date(cast(unix_micros(date) div 86400000000 as int))").alias("day"),
        (F.floor(ts / 3_600_000_000) % 24).cast("int").alias("hour"),
        (F.floor(ts / 60_000_000) % 60).cast("int").alias("minute"),
    )
    fields = [F.expr(e).cast("string").alias(f"f{i}") for i, e in enumerate(FIELDS)]
    df = raw.select((F.col("delay") > 15).cast("double").alias("label"), "day", *fields)
    cut = F.lit(TEST_FROM).cast("date")
    return df.where(F.col("day") < cut).drop("day"), df.where(F.col("day") >= cut).drop("day")


def hashed_vectors(df: Any, log2_dim: int) -> Any:
    """``label, features``: the fields one-hot, hashed into ``2**log2_dim`` by MLlib's
    FeatureHasher (a JVM transformer: no Python runs per row)."""
    from pyspark.ml.feature import FeatureHasher

    cols = [c for c in df.columns if c != "label"]
    hasher = FeatureHasher(inputCols=cols, outputCol="features", numFeatures=1 << log2_dim)
    return hasher.transform(df).select("label", "features")


def hashed_keys(df: Any, log2_dim: int) -> Any:
    """``label, keys``: each field hashed with ``xxhash64(field number, value)`` into
    ``2**log2_dim`` as sorted int64 keys (a collision keeps both, so a key can repeat)."""
    from pyspark.sql import functions as F

    mask = F.lit((1 << log2_dim) - 1).cast("bigint")
    cols = [c for c in df.columns if c != "label"]
    keys = [F.xxhash64(F.lit(i), F.col(c)).bitwiseAND(mask) for i, c in enumerate(cols)]
    return df.select("label", F.array_sort(F.array(*keys)).alias("keys"))


def roc_auc(model: Any, test: Any) -> float:
    """Area under the ROC curve of `model` on `test`, exact (no binning of the scores)."""
    from pyspark.ml.evaluation import BinaryClassificationEvaluator

    scored = model.transform(test)
    return BinaryClassificationEvaluator(numBins=0).evaluate(scored)
