"""GBT's vector rows handed to the workers packed by the bridge (one float64 ``binary`` per row):
read as the array<double> rows are, refused with the same words, the same trees."""

from __future__ import annotations

import re

import numpy as np
import pyarrow as pa
import pytest
from pyspark.ml.linalg import Vectors, VectorUDT
from pyspark.sql import types as T

from spark_ps import _jvm
from spark_ps.data import read_partition
from spark_ps.ml import _job
from spark_ps.ml.classification import GBTClassifier
from spark_ps.ml.gbt import distributed
from spark_ps.ml.regression import GBTRegressor

pytestmark = pytest.mark.timeout(300)

needs_bridge = pytest.mark.skipif(
    not _jvm.bridge_jar().is_file(), reason="the JVM bridge jar is not built"
)


# --------------------------------------------------------------------------- the read


def _packed(rows: list, large: bool = False) -> pa.Array:
    """Rows (float lists or None) as the bridge packs them."""
    raw = [None if r is None else np.asarray(r, dtype="<f8").tobytes() for r in rows]
    return pa.array(raw, pa.large_binary() if large else pa.binary())


def _arrays(rows: list) -> pa.Array:
    return pa.array(rows, pa.list_(pa.float64()))


def _batches(make, rows: list, labels: list, cut: int) -> list[pa.RecordBatch]:
    table = pa.table({"f": make(rows), "y": pa.array(labels, pa.float64())})
    return [b for b in (table.slice(0, cut), table.slice(cut)) for b in b.to_batches()]


def _read(batches, **kw):
    return read_partition(batches, "f", label_col="y", dense_matrix=True, row_offset=5, **kw)


@pytest.mark.parametrize("large", [False, True], ids=["binary", "large_binary"])
def test_packed_rows_read_into_the_matrix_the_arrays_give(large):
    rng = np.random.default_rng(1)
    X = rng.normal(size=(37, 4))
    y = rng.integers(0, 2, 37).astype(float).tolist()
    rows = X.tolist()
    packed = _read(_batches(lambda r: _packed(r, large), rows, y, 11))  # sliced batches
    arrays = _read(_batches(_arrays, rows, y, 11))
    np.testing.assert_array_equal(packed.matrix, X)
    np.testing.assert_array_equal(packed.matrix, arrays.matrix)
    np.testing.assert_array_equal(packed.labels, arrays.labels)
    empty = _read([pa.record_batch({"f": _packed([]), "y": pa.array([], pa.float64())})])
    assert empty.matrix.shape == (0, 0) and empty.labels.shape == (0,)


@pytest.mark.parametrize(
    "bad, message",
    [
        (None, r"features column 'f': null array: null at row 8"),
        ([1.0, 2.0, 3.0], r"features column 'f': vector size 3 at row 8 differs from"),
        ([1.0, float("nan")], r"features column 'f': value nan at row 8 is not finite"),
        ([float("-inf"), 0.0], r"features column 'f': value -inf at row 8 is not finite"),
    ],
)
def test_bad_packed_rows_are_refused_with_the_arrays_words(bad, message):
    rows = [[0.5, 1.5]] * 3 + [bad] + [[2.0, 3.0]]
    y = [0.0] * len(rows)
    errors = []
    for make in (_packed, _arrays):
        with pytest.raises(ValueError, match=message) as e:
            _read(_batches(make, rows, y, 2))
        errors.append(str(e.value))
    assert errors[0] == errors[1]


def test_a_packed_row_of_partial_doubles_is_refused_by_row():
    col = pa.array([np.zeros(2).tobytes(), b"\0" * 12], pa.binary())
    with pytest.raises(ValueError, match=r"packed row of 12 bytes at row 6 is not a whole"):
        _read([pa.record_batch({"f": col, "y": pa.array([0.0, 1.0])})])


# --------------------------------------------------------------------------- the bridge


@needs_bridge
def test_the_bridge_packs_dense_sparse_and_null_vectors(spark):
    vectors = [
        Vectors.dense([1.0, -2.5, 3.0]),
        Vectors.sparse(3, [0, 2], [4.0, -1.0]),
        Vectors.sparse(3, [], []),
        None,
    ]
    schema = T.StructType([T.StructField("v w", VectorUDT())])
    df = spark.createDataFrame([(v,) for v in vectors], schema)
    out = _jvm.packed_rows(df, "`v w`", "p")
    assert out.schema["p"].dataType == T.BinaryType()
    got = [r.p for r in out.select("p").collect()]
    assert got[3] is None
    for raw, v in zip(got[:3], vectors[:3], strict=True):
        assert raw == v.toArray().astype("<f8").tobytes()


# --------------------------------------------------------------------------- GBT


def _sparse(x: np.ndarray):
    return Vectors.sparse(x.size, np.flatnonzero(x), x[x != 0])


@pytest.fixture(scope="module")
def data(spark):
    """Dense and sparse rows mixed, with weights and a validation indicator."""
    rng = np.random.default_rng(3)
    n, d = 1200, 5
    X = np.round(rng.normal(size=(n, d)), 1)
    X[X < -0.5] = 0.0
    y = (X[:, 0] + X[:, 1] * X[:, 2] + 0.3 * rng.normal(size=n) > 0).astype(float)
    w = rng.uniform(0.5, 2.0, n)
    rows = [
        (
            float(y[i]),
            float(w[i]),
            bool(i % 5 == 0),
            Vectors.dense(X[i])
            if i % 2
            else Vectors.sparse(d, np.flatnonzero(X[i]), X[i][X[i] != 0]),
        )
        for i in range(n)
    ]
    return spark.createDataFrame(rows, ["label", "w", "val", "features"]).cache()


def _fit(est, df, rows: str, monkeypatch):
    """``est`` fitted on ``df`` with the rows handed over ``rows``; counts bridge packings."""
    calls = []

    def counted(*args):
        calls.append(args)
        return pack(*args)

    pack = _jvm.packed_rows
    monkeypatch.setattr(distributed, "ROWS", rows)
    monkeypatch.setattr(_jvm, "packed_rows", counted)
    try:
        return est.fit(df), len(calls)
    finally:
        monkeypatch.setattr(_jvm, "packed_rows", pack)


def _predictions(model, df) -> np.ndarray:
    return np.array([r[0] for r in model.transform(df).select("prediction").collect()])


@needs_bridge
@pytest.mark.parametrize("cls", [GBTClassifier, GBTRegressor])
def test_packed_and_array_rows_grow_the_same_trees(spark_ps, data, cls, monkeypatch):
    est = cls(maxIter=4, maxDepth=3, seed=11, weightCol="w", validationIndicatorCol="val")
    packed, n_packed = _fit(est, data, "packed", monkeypatch)
    arrays, n_arrays = _fit(est, data, "arrays", monkeypatch)
    assert (n_packed, n_arrays) == (2, 0)  # training and validation rows; none for arrays
    assert packed.toDebugString.split("\n", 1)[1] == arrays.toDebugString.split("\n", 1)[1]
    np.testing.assert_array_equal(_predictions(packed, data), _predictions(arrays, data))


@needs_bridge
@pytest.mark.parametrize(
    "bad, message",
    [
        (None, r"null array: null at row \d+"),
        (Vectors.sparse(6, [5], [1.0]), r"vector size 6 at row \d+ differs from"),
        (Vectors.dense([0.0, 1.0, float("nan"), 0.0, 0.0]), r"value nan at row \d+ is not"),
    ],
)
def test_bad_rows_are_refused_alike_either_way(spark_ps, data, bad, message, monkeypatch):
    """Without the estimator's check job the workers' refusal is the error: the same words
    whichever way the rows came, and nothing is left on the PS."""
    schema = data.select("label", "features").schema
    extra = spark_ps[0].createDataFrame([(1.0, bad)], schema)
    df = data.select("label", "features").union(extra).repartition(2)
    est = GBTClassifier(maxIter=1, maxDepth=2)
    before = spark_ps[1].client.models()
    errors = []
    for rows in ("packed", "arrays"):
        monkeypatch.setattr(distributed, "ROWS", rows)
        with pytest.raises(ValueError, match=r"partition \d: features column 'features': ") as e:
            distributed.train_gbt(est._prepare(df), est._params_dict())
        errors.append(str(e.value))
    assert re.search(message, errors[0])
    assert errors[0] == errors[1]
    assert spark_ps[1].client.models() == before


def test_without_the_bridge_the_rows_come_as_arrays(spark_ps, data, monkeypatch):
    def missing(spark):
        raise RuntimeError("the spark-ps JVM bridge is not built")

    monkeypatch.setattr(_jvm, "ensure_bridge", missing)
    est = GBTClassifier(maxIter=2, maxDepth=2, seed=1)
    prepared = est._prepare(data.select("label", "features"))
    assert dict(distributed._dense_rows(prepared).dtypes)["features"] == "array<double>"
    monkeypatch.setattr(distributed, "ROWS", "packed")
    with pytest.raises(RuntimeError, match="bridge is not built"):
        distributed._dense_rows(prepared)
    monkeypatch.setattr(distributed, "ROWS", "auto")
    assert est.fit(data).getNumTrees == 2


# --------------------------------------------------------------------------- the Arrow byte cap


def test_the_arrow_byte_cap_is_lifted_for_the_job_only(spark_ps, data):
    spark = spark_ps[0]
    conf = spark.conf
    assert conf.get(_job._ARROW_BYTES, None) is None
    seen = []
    unset = _job._recap_arrow_bytes

    def recap(c):
        running = len(spark.sparkContext.statusTracker().getActiveJobsIds()) > 0
        seen.append((c.get(_job._ARROW_BYTES, None), running))
        unset(c)

    try:
        _job._recap_arrow_bytes = recap
        GBTClassifier(maxIter=1, maxDepth=2).fit(data)
    finally:
        _job._recap_arrow_bytes = unset
    # restored once, while the worker job still ran: the session's other queries do not run
    # uncapped for the rest of the fit
    assert seen == [(_job._UNCAPPED, True)]
    assert conf.get(_job._ARROW_BYTES, None) is None
    conf.set(_job._ARROW_BYTES, "32MB")  # the user's own value is kept
    try:
        assert not _job._uncap_arrow_bytes(conf)
        assert conf.get(_job._ARROW_BYTES) == "32MB"
    finally:
        conf.unset(_job._ARROW_BYTES)
    conf.set(_job._ARROW_ROWS, "-1")  # no row cap either: keep the byte cap
    try:
        assert not _job._uncap_arrow_bytes(conf)
    finally:
        conf.unset(_job._ARROW_ROWS)


# --------------------------------------------------------------------------- LR's dense rows


@needs_bridge
def test_lr_dense_rows_travel_packed_and_fit_as_arrays_do(spark_ps, monkeypatch):
    from spark_ps.ml.base import prepare_fit_data
    from spark_ps.ml.classification import LogisticRegression

    rng = np.random.default_rng(5)
    X = rng.normal(size=(400, 6))
    y = (X @ rng.normal(size=6) + 0.5 * rng.normal(size=400) > 0).astype(float)
    rows = [(float(y[i]), Vectors.dense(X[i])) for i in range(400)]
    df = spark_ps[0].createDataFrame(rows, ["label", "features"])
    prepared = prepare_fit_data(df, features_col="features", label_col="label", densify_max=16)
    assert prepared.features_kind == "dense"
    assert dict(prepared.df.dtypes)["features"] == "binary"
    lr = LogisticRegression(maxIter=8, regParam=0.01)
    packed = lr.fit(df)

    def missing(spark):
        raise RuntimeError("the spark-ps JVM bridge is not built")

    monkeypatch.setattr(_jvm, "ensure_bridge", missing)
    prepared = prepare_fit_data(df, features_col="features", label_col="label", densify_max=16)
    assert dict(prepared.df.dtypes)["features"] == "array<double>"
    arrays = lr.fit(df)
    np.testing.assert_array_equal(packed.coefficients.toArray(), arrays.coefficients.toArray())
    assert packed.intercept == arrays.intercept
    assert packed.summary.objectiveHistory == arrays.summary.objectiveHistory


def test_packed_rows_read_into_csr_as_the_arrays_do():
    """Readers that build CSR batches (every trainer without dense_matrix) take them too."""
    from spark_ps.data import arrow_to_csr

    rows = [[0.0, 1.5, -2.0], [3.0, 0.0, 0.25]]
    y = [1.0, 0.0]
    packed = arrow_to_csr(_batches(_packed, rows, y, 2)[0], "f", label_col="y")
    arrays = arrow_to_csr(_batches(_arrays, rows, y, 2)[0], "f", label_col="y")
    for name in ("indptr", "indices", "values", "labels"):
        np.testing.assert_array_equal(getattr(packed, name), getattr(arrays, name))
    assert packed.num_features == arrays.num_features == 3
    keys = pa.record_batch({"f": pa.array([[0, 2]]), "v": _packed([[1.0, 2.0]])})
    with pytest.raises(TypeError, match=r"column .v. must be array<float\|double>, got binary"):
        arrow_to_csr(keys, "f", values_col="v")
