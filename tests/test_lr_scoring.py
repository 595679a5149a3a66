"""LR scoring: the state shipped to Python workers (non-zeros, exact margins) and the JVM
scorer (bit for bit MLlib's numbers, broadcast once, bad rows refused with row and partition).
"""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from pyspark.ml.linalg import Vectors, VectorUDT
from pyspark.sql import types as T

from spark_ps.data import CSRBatch
from spark_ps.ml.export import lr_to_mllib
from spark_ps.ml.lr import scoring
from spark_ps.ml.lr.model import LogisticRegressionModel
from spark_ps.ml.lr.scoring import ScoringCoefficients, row_sums

pytestmark = pytest.mark.timeout(300)


def _batch(rng, n=500, d=5000, per_row=(0, 40)):
    lengths = rng.integers(*per_row, n)
    indptr = np.concatenate([[0], np.cumsum(lengths)])
    indices = rng.integers(0, d, indptr[-1])
    return CSRBatch(indptr, indices, rng.normal(size=indptr[-1]), d)


def _reference(csr: CSRBatch, dense_w: np.ndarray, b: float) -> np.ndarray:
    """Row by row, left to right: the order MLlib's sparse dot sums in."""
    out = np.zeros(csr.n_rows)
    for i in range(csr.n_rows):
        acc = 0.0
        for j in range(csr.indptr[i], csr.indptr[i + 1]):
            acc += csr.values[j] * dense_w[csr.indices[j]]
        out[i] = acc + b
    return out


def test_margins_are_exact_for_dense_compressed_and_sparse_models():
    rng = np.random.default_rng(0)
    csr = _batch(rng)
    w = np.zeros(csr.num_features)
    nz = rng.choice(csr.num_features, 300, replace=False)
    w[nz] = rng.normal(size=300)
    ref = _reference(csr, w, 0.25)
    compressed = ScoringCoefficients.of(None, w, 0.25)  # 6% non-zero: travels sparse
    assert compressed.dense_size == w.size and compressed.keys.size == 300
    full = ScoringCoefficients.of(None, rng.normal(size=csr.num_features), -1.0)
    assert full.keys is None and full.dense_size is None
    keys = np.sort(nz)
    sparse = ScoringCoefficients.of(keys, w[keys], 0.25)
    for state in (compressed, sparse):
        np.testing.assert_array_equal(state.margins(csr), ref)
    np.testing.assert_array_equal(full.margins(csr), _reference(csr, full.values, -1.0))


def test_the_rebuilt_dense_array_never_travels():
    w = np.zeros(1 << 20)
    w[[3, 70_000]] = [1.5, -2.0]
    state = ScoringCoefficients.of(None, w, 0.0)
    csr = CSRBatch(np.array([0, 2, 2]), np.array([3, 70_000]), np.array([2.0, 1.0]), 1 << 20)
    np.testing.assert_array_equal(state.margins(csr), [1.0, 0.0])  # an empty row scores b
    assert state._dense is not None
    wire = pickle.dumps(state)
    assert len(wire) < 4096  # 8 MiB dense, a few hundred bytes shipped
    back = pickle.loads(wire)
    assert back._dense is None
    np.testing.assert_array_equal(back.margins(csr), [1.0, 0.0])


def test_row_sums_handles_empty_rows_and_batches():
    np.testing.assert_array_equal(row_sums(np.array([0, 0, 0]), np.zeros(0)), [0.0, 0.0])
    sums = row_sums(np.array([0, 3, 3, 5]), np.array([1.0, 1e16, -1e16, 2.0, 3.0]))
    np.testing.assert_array_equal(sums, [0.0, 0.0, 5.0])  # (1 + 1e16) - 1e16: left to right


# --------------------------------------------------------------------------- JVM scoring


def _sparse_rows(rng, n, d, hot):
    """Rows of sparse vectors over ``hot`` feature ids (some empty), ids ``0..n-1``."""
    rows = []
    for i in range(n):
        k = int(rng.integers(0, 12))
        idx = np.sort(rng.choice(hot, size=k, replace=False)) if k else np.zeros(0, int)
        rows.append((i, Vectors.sparse(d, idx.tolist(), rng.normal(size=k).tolist())))
    return rows


def _plan(df) -> str:
    return str(df._jdf.queryExecution().executedPlan().toString())


def _by_id(df, cols):
    rows = sorted(df.select("id", *cols).collect(), key=lambda r: r["id"])
    return [np.array([np.asarray(r[c].toArray() if hasattr(r[c], "toArray") else r[c])
                      for r in rows]) for c in cols]  # fmt: skip


@pytest.mark.parametrize("log2", [20, 26])  # a dense lookup array, then a hash table
def test_jvm_scores_equal_mllib_bit_for_bit(spark, log2):
    d = 1 << log2
    rng = np.random.default_rng(log2)
    hot = rng.choice(d, 400, replace=False)
    df = spark.createDataFrame(_sparse_rows(rng, 300, d, hot), ["id", "features"])
    keys = np.sort(rng.choice(hot, 250, replace=False))  # some row features lack a weight
    values = rng.normal(size=keys.size)
    ours = LogisticRegressionModel.fromCoefficients(values, 0.3, keys=keys, numFeatures=d)
    theirs = lr_to_mllib(spark, ours.uid, (keys, values, d), 0.3)
    cols = ["rawPrediction", "probability", "prediction"]
    for setup in ({}, {"threshold": 0.35}, {"thresholds": [0.6, 0.4]}):
        mine, ref = ours.copy(), theirs.copy()
        for name, value in setup.items():
            mine.set(mine.getParam(name), value)
            ref.set(ref.getParam(name), value)
        out = mine.transform(df)
        assert "MapInArrow" not in _plan(out) and "Python" not in _plan(out)
        assert [(f.name, f.dataType, f.metadata) for f in out.schema] == [
            (f.name, f.dataType, f.metadata) for f in ref.transform(df).schema
        ]
        for a, b in zip(_by_id(out, cols), _by_id(ref.transform(df), cols), strict=True):
            np.testing.assert_array_equal(a, b)
    assert 0 < _by_id(ours.transform(df), ["prediction"])[0].sum() < 300


def test_jvm_weights_broadcast_once_per_model(spark, monkeypatch):
    monkeypatch.setattr(scoring, "ENGINE", "jvm")
    df = spark.createDataFrame([(0, Vectors.sparse(8, [1], [2.0]))], ["id", "features"])
    model = LogisticRegressionModel.fromCoefficients(Vectors.sparse(8, [1], [0.5]), 0.25)
    first = _by_id(model.transform(df), ["rawPrediction"])[0]
    scorer = model._jvm_scorer
    assert scorer is not None and scorer[0] == spark.sparkContext.applicationId
    np.testing.assert_array_equal(_by_id(model.transform(df), ["rawPrediction"])[0], first)
    assert model._jvm_scorer is scorer  # reused, not re-broadcast
    np.testing.assert_array_equal(first, [[-1.25, 1.25]])
    model._set_coefficients(np.array([0.0, 1.0] + [0.0] * 6), 0.0)
    assert model._jvm_scorer is None
    np.testing.assert_array_equal(_by_id(model.transform(df), ["rawPrediction"])[0], [[-2, 2]])


def test_jvm_long_keys_use_the_hash_table_beyond_int32(spark, monkeypatch):
    monkeypatch.setattr(scoring, "ENGINE", "jvm")
    big = 1 << 40
    keys = np.array([3, 70_000, (1 << 31) + 5, big - 1], dtype=np.int64)
    model = LogisticRegressionModel.fromCoefficients(
        [0.5, -1.25, 2.0, 0.75], -0.1, keys=keys, numFeatures=big
    )
    rows = [(0, [3, (1 << 31) + 5], [2.0, -1.0]), (1, [big - 1, 12, 70_000], [1.0, 4.0, 0.5])]
    df = spark.createDataFrame(rows, "id long, keys array<bigint>, vals array<float>")
    out = model.setFeaturesCol("keys").setFeatureValuesCol("vals").transform(df)
    assert "Python" not in _plan(out)
    (raw,) = _by_id(out, ["rawPrediction"])
    np.testing.assert_array_equal(raw[:, 1], [0.5 * 2.0 + 2.0 * -1.0 - 0.1, 0.75 - 0.625 - 0.1])
    ints = spark.createDataFrame([(0, [3, 70_000])], "id long, keys array<int>")
    ones = model.copy()
    ones.clear(ones.featureValuesCol)
    (raw,) = _by_id(ones.transform(ints), ["rawPrediction"])
    np.testing.assert_array_equal(raw[:, 1], [0.5 - 1.25 - 0.1])


_BAD_ROWS = [
    ("features", [(0, Vectors.sparse(4, [1], [1.0])), (1, None)],
     r"features column 'features': null vector: null at row 1 \(partition 0\)"),
    ("features", [(0, Vectors.dense([1.0, float("nan"), 0.0, 0.0]))],
     r"value nan at row 0 is not finite"),
    ("keys", [(0, [1, 2]), (1, [4])],
     r"features column 'keys': key 4 at row 1 outside \[0, num_features=4\)"),
    ("keys", [(0, [-1])], r"key -1 at row 0 outside"),
]  # fmt: skip


@pytest.mark.parametrize(("col", "rows", "message"), _BAD_ROWS)
def test_jvm_scoring_refuses_bad_rows_naming_row_and_partition(
    spark, monkeypatch, col, rows, message
):
    monkeypatch.setattr(scoring, "ENGINE", "jvm")
    kind = "vector" if col == "features" else "array<bigint>"
    schema = T.StructType(
        [T.StructField("id", T.LongType()),
         T.StructField(col, VectorUDT() if kind == "vector" else T.ArrayType(T.LongType()))]
    )  # fmt: skip
    df = spark.createDataFrame(rows, schema).coalesce(1)
    model = LogisticRegressionModel.fromCoefficients([1.0, 2.0, 3.0, 4.0]).setFeaturesCol(col)
    with pytest.raises(Exception, match=message):
        model.transform(df).collect()


def test_keys_and_values_of_different_lengths_are_refused_on_the_jvm(spark, monkeypatch):
    monkeypatch.setattr(scoring, "ENGINE", "jvm")
    df = spark.createDataFrame([(0, [1, 2], [1.0])], "id long, k array<bigint>, v array<double>")
    model = LogisticRegressionModel.fromCoefficients([1.0, 2.0, 3.0]).setFeaturesCol("k")
    with pytest.raises(Exception, match="'k': 2 keys but 1 values at row 0"):
        model.setFeatureValuesCol("v").transform(df).collect()
    nulls = spark.createDataFrame([(0, [1], [1.0]), (1, [2], None)], df.schema).coalesce(1)
    with pytest.raises(Exception, match="'k': null values array at row 1"):
        model.transform(nulls).collect()


def test_python_workers_score_when_the_bridge_is_missing(spark, monkeypatch):
    def missing(_spark):
        raise RuntimeError("the spark-ps JVM bridge is not built")

    monkeypatch.setattr(scoring._jvm, "ensure_bridge", missing)
    df = spark.createDataFrame([(0, Vectors.sparse(4, [1], [2.0]))], ["id", "features"])
    model = LogisticRegressionModel.fromCoefficients([0.0, 0.5, 0.0, 0.0], 0.25)
    out = model.transform(df)
    assert "MapInArrow" in _plan(out)
    np.testing.assert_array_equal(_by_id(out, ["rawPrediction"])[0], [[-1.25, 1.25]])
    monkeypatch.setattr(scoring, "ENGINE", "jvm")
    with pytest.raises(RuntimeError, match="bridge is not built"):
        model.transform(df)
