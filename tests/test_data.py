"""spark_ps.data: Arrow -> CSR conversion, validation messages and CSRBatch math.

Validation and math run on pyarrow batches directly (fast); the Spark tests push
real DataFrames through ``df.mapInArrow`` and compare with ``df.collect()``.
"""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pyspark.ml.linalg import DenseVector, SparseVector, Vectors, VectorUDT
from pyspark.sql.types import ArrayType, DoubleType, LongType, StructField, StructType

from spark_ps.data import (
    CSRBatch,
    arrow_to_csr,
    check_binary_labels,
    features_kind,
    id_dtype,
    iter_minibatches,
    read_partition,
)

VECTOR_TYPE = pa.struct(
    [
        ("type", pa.int8()),
        ("size", pa.int32()),
        ("indices", pa.list_(pa.int32())),
        ("values", pa.list_(pa.float64())),
    ]
)
BIG = 2**40


# --------------------------------------------------------------------------- helpers


def vec_struct(v):
    """VectorUDT's own Arrow layout of one pyspark vector (None stays a null row)."""
    if v is None:
        return None
    if isinstance(v, SparseVector):
        return {
            "type": 0,
            "size": v.size,
            "indices": [int(i) for i in v.indices],
            "values": [float(x) for x in v.values],
        }
    return {"type": 1, "size": None, "indices": None, "values": [float(x) for x in v]}


def raw_sparse(size, indices, values):
    """A sparse VectorUDT struct that pyspark's SparseVector would refuse to build."""
    return {"type": 0, "size": size, "indices": indices, "values": values}


def vec_batch(vectors, **columns) -> pa.RecordBatch:
    """A batch whose ``features`` column holds pyspark vectors or raw struct dicts."""
    rows = [v if isinstance(v, dict) else vec_struct(v) for v in vectors]
    arrays = {"features": pa.array(rows, type=VECTOR_TYPE)}
    arrays.update({k: pa.array(v) for k, v in columns.items()})
    return pa.RecordBatch.from_pydict(arrays)


def dense_ref(vectors) -> np.ndarray:
    return np.array([v.toArray() for v in vectors], dtype=np.float64)


def keys_ref(keys_rows, vals_rows=None) -> list[dict[int, float]]:
    out = []
    for i, ks in enumerate(keys_rows):
        row: dict[int, float] = {}
        for j, k in enumerate(ks):
            row[k] = row.get(k, 0.0) + (1.0 if vals_rows is None else vals_rows[i][j])
        out.append(row)
    return out


def csr_as_dicts(csr: CSRBatch) -> list[dict[int, float]]:
    out = []
    for i in range(csr.n_rows):
        row: dict[int, float] = {}
        lo, hi = csr.indptr[i], csr.indptr[i + 1]
        for k, v in zip(csr.indices[lo:hi].tolist(), csr.values[lo:hi].tolist(), strict=True):
            row[k] = row.get(k, 0.0) + v
        out.append(row)
    return out


MIXED = [
    Vectors.sparse(5, [1, 3], [1.5, -2.0]),
    Vectors.dense([1.0, 0.0, 2.0, 3.0, 4.0]),
    Vectors.sparse(5, [], []),
    Vectors.dense([0.5, 0.5, 0.5, 0.5, 0.5]),
    Vectors.sparse(5, [0, 4], [7.0, 8.0]),
]


def random_csr(rng, n, d, density=0.3, labels=True) -> CSRBatch:
    dense = rng.normal(size=(n, d)) * (rng.random((n, d)) < density)
    rows, cols = np.nonzero(dense)
    indptr = np.concatenate([[0], np.cumsum(np.bincount(rows, minlength=n))])
    return CSRBatch(
        indptr,
        cols,
        dense[rows, cols],
        d,
        rng.integers(0, 2, n).astype(float) if labels else None,
        rng.random(n) if labels else None,
    )


# --------------------------------------------------------------------------- conversion


@pytest.mark.parametrize(
    "vectors",
    [
        [Vectors.sparse(4, [0, 2], [1.0, 2.0]), Vectors.sparse(4, [3], [-1.0])],
        [Vectors.dense([1.0, 2.0, 3.0]), Vectors.dense([4.0, 5.0, 6.0])],
        MIXED,
    ],
    ids=["sparse", "dense", "mixed"],
)
def test_vector_column_matches_dense_reference(vectors):
    labels = [float(i % 2) for i in range(len(vectors))]
    csr = arrow_to_csr(vec_batch(vectors, label=labels), "features", label_col="label")
    assert csr.indptr.dtype == np.int64 and csr.indices.dtype == np.int64
    assert csr.values.dtype == np.float64 and csr.labels.dtype == np.float64
    assert csr.num_features == vectors[0].size
    np.testing.assert_array_equal(csr.to_dense(), dense_ref(vectors))
    np.testing.assert_array_equal(csr.labels, labels)
    # Sparse rows keep exactly their stored entries; dense rows store every position.
    expected_nnz = [len(v.indices) if isinstance(v, SparseVector) else v.size for v in vectors]
    np.testing.assert_array_equal(np.diff(csr.indptr), expected_nnz)


def test_mixed_vector_indices_layout():
    csr = arrow_to_csr(vec_batch(MIXED), "features")
    np.testing.assert_array_equal(
        csr.indices, [1, 3, 0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 0, 4]
    )  # row 2 is empty


def test_all_sparse_values_are_zero_copy():
    batch = vec_batch([Vectors.sparse(3, [0, 2], [1.0, 2.0])] * 4)
    csr = arrow_to_csr(batch, "features")
    buf = batch.column(0).field("values").values.buffers()[1]
    assert csr.values.__array_interface__["data"][0] == buf.address


@pytest.mark.parametrize("offset,length", [(1, 3), (2, 3), (4, 1), (5, 0)])
def test_sliced_vector_batch(offset, length):
    labels = [10.0, 11.0, 12.0, 13.0, 14.0]
    batch = vec_batch(MIXED, label=labels, w=[1.0, 2.0, 3.0, 4.0, 5.0]).slice(offset, length)
    csr = arrow_to_csr(batch, "features", label_col="label", weight_col="w", num_features=5)
    sub = MIXED[offset : offset + length]
    np.testing.assert_array_equal(csr.to_dense(), dense_ref(sub).reshape(length, 5))
    np.testing.assert_array_equal(csr.labels, labels[offset : offset + length])
    np.testing.assert_array_equal(csr.weights, np.arange(offset, offset + length) + 1.0)


def test_sliced_keys_and_dense_arrays():
    keys = [[1, BIG], [5], [], [BIG + 3, 2, 2]]
    vals = [[0.5, 1.5], [2.0], [], [3.0, 4.0, 5.0]]
    dense = [[1.0, 2.0], [3.0, 4.0], [5.0, 6.0], [7.0, 8.0]]
    batch = pa.RecordBatch.from_pydict(
        {
            "k": pa.array(keys, pa.list_(pa.int64())),
            "v": pa.array(vals, pa.list_(pa.float64())),
            "d": pa.array(dense, pa.list_(pa.float32())),
        }
    ).slice(1, 3)
    csr = arrow_to_csr(batch, "k", values_col="v")
    assert csr_as_dicts(csr) == keys_ref(keys[1:], vals[1:])
    assert csr.num_features == BIG + 4
    d = arrow_to_csr(batch, "d")
    np.testing.assert_array_equal(d.to_dense(), np.array(dense[1:]))


def test_keys_beyond_int32_with_and_without_values():
    keys = [[3, BIG + 7, 2**31], [0], []]
    vals = [[1.0, -2.5, 4.0], [9.0], []]
    batch = pa.RecordBatch.from_pydict(
        {"k": pa.array(keys, pa.list_(pa.int64())), "v": pa.array(vals, pa.list_(pa.float32()))}
    )
    csr = arrow_to_csr(batch, "k", values_col="v", num_features=2**50)
    assert csr.num_features == 2**50
    assert csr.indices.tolist() == [3, BIG + 7, 2**31, 0]
    assert csr.values.tolist() == [1.0, -2.5, 4.0, 9.0]
    ones = arrow_to_csr(batch, "k")
    assert ones.values.tolist() == [1.0] * 4 and ones.num_features == BIG + 8
    ints = pa.RecordBatch.from_pydict({"k": pa.array([[4, 1], [2]], pa.list_(pa.int32()))})
    assert arrow_to_csr(ints, "k").indices.tolist() == [4, 1, 2]


def test_dense_array_columns():
    rows = [[1.0, -2.0, 0.0], [0.25, 4.0, 1e300]]
    batch = pa.RecordBatch.from_pydict({"x": pa.array(rows, pa.list_(pa.float64()))})
    csr = arrow_to_csr(batch, "x")
    assert csr.num_features == 3 and csr.indices.tolist() == [0, 1, 2, 0, 1, 2]
    np.testing.assert_array_equal(csr.to_dense(), np.array(rows))
    f32 = np.array([[1.5, -2.0], [0.1, 3.0]], dtype=np.float32)
    batch = pa.RecordBatch.from_pydict({"x": pa.array(f32.tolist(), pa.list_(pa.float32()))})
    csr = arrow_to_csr(batch, "x", num_features=2)
    assert csr.values.dtype == np.float64
    np.testing.assert_array_equal(csr.to_dense(), f32.astype(np.float64))


def test_label_and_weight_types_convert_to_float64():
    batch = vec_batch(MIXED[:2], label=pa.array([1, 0], pa.int32()), w=pa.array([2, 3], pa.int64()))
    csr = arrow_to_csr(batch, "features", label_col="label", weight_col="w")
    assert csr.labels.dtype == np.float64 and csr.labels.tolist() == [1.0, 0.0]
    assert csr.weights.dtype == np.float64 and csr.weights.tolist() == [2.0, 3.0]


def test_features_kind():
    assert features_kind(VECTOR_TYPE) == "vector"
    assert features_kind(pa.list_(pa.int64())) == "keys"
    assert features_kind(pa.large_list(pa.int32())) == "keys"
    assert features_kind(pa.list_(pa.float32())) == "dense"


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.lists(st.floats(-1e6, 1e6), min_size=6, max_size=6).map(DenseVector),
            st.dictionaries(st.integers(0, 5), st.floats(-1e6, 1e6), max_size=6).map(
                lambda d: Vectors.sparse(6, d)
            ),
        ),
        min_size=1,
        max_size=12,
    ),
    st.data(),
)
def test_random_mixed_slices_match_reference(vectors, data):
    start = data.draw(st.integers(0, len(vectors)))
    stop = data.draw(st.integers(start, len(vectors)))
    batch = vec_batch(vectors).slice(start, stop - start)
    csr = arrow_to_csr(batch, "features", num_features=6)
    ref = dense_ref(vectors[start:stop]).reshape(stop - start, 6)
    np.testing.assert_array_equal(csr.to_dense(), ref)


# --------------------------------------------------------------------------- validation


def _keys_batch(keys, vals=None):
    cols = {"k": pa.array(keys, pa.list_(pa.int64()))}
    if vals is not None:
        cols["v"] = pa.array(vals, pa.list_(pa.float64()))
    return pa.RecordBatch.from_pydict(cols)


SP = Vectors.sparse(3, [0], [1.0])
BAD_CASES = [
    # (batch builder, kwargs, exception, regex)
    (
        lambda: vec_batch([SP, None, SP]),
        {},
        ValueError,
        r"features column 'features': null vector: null at row 101",
    ),
    (
        lambda: vec_batch([SP, Vectors.sparse(4, [0], [1.0])]),
        {},
        ValueError,
        r"'features'.*vector size 4 at row 101 differs from the first row's size 3",
    ),
    (
        lambda: vec_batch([SP, Vectors.dense([1.0, 2.0])]),
        {"num_features": 3},
        ValueError,
        r"vector size 2 at row 101 differs from num_features=3",
    ),
    (
        lambda: vec_batch([SP, SP, raw_sparse(3, [5], [1.0])]),
        {},
        ValueError,
        r"'features': index 5 out of range \[0, 3\) at row 102",
    ),
    (
        lambda: vec_batch([SP, raw_sparse(3, [-1], [1.0])]),
        {},
        ValueError,
        r"index -1 out of range \[0, 3\) at row 101",
    ),
    (
        lambda: vec_batch([SP, Vectors.dense([1.0, math.nan, 0.0])]),
        {},
        ValueError,
        r"'features': value nan at row 101 is not finite",
    ),
    (
        lambda: vec_batch([SP, SP, Vectors.sparse(3, [1], [math.inf])]),
        {},
        ValueError,
        r"value inf at row 102 is not finite",
    ),
    (
        lambda: vec_batch([SP, raw_sparse(3, [0, 1], [1.0])]),
        {},
        ValueError,
        r"sparse vector at row 101 has 2 indices but 1 values",
    ),
    (
        lambda: vec_batch([SP, raw_sparse(None, [0], [1.0])]),
        {},
        ValueError,
        r"'features': sparse vector with null size at row 101",
    ),
    (
        lambda: vec_batch([SP, raw_sparse(3, None, [1.0])]),
        {},
        ValueError,
        r"'features': sparse vector with null indices at row 101",
    ),
    (
        lambda: vec_batch([SP, {"type": 2, "size": 3, "indices": [0], "values": [1.0]}]),
        {},
        ValueError,
        r"'features': unknown vector type code 2 at row 101",
    ),
    (
        lambda: _keys_batch([[1], [2, -3]]),
        {},
        ValueError,
        r"features column 'k': negative key -3 at row 101",
    ),
    (
        lambda: _keys_batch([[1], [2], [10]]),
        {"num_features": 10},
        ValueError,
        r"key 10 at row 102 outside \[0, num_features=10\)",
    ),
    (
        lambda: _keys_batch([[1], [2, 3]], [[1.0], [1.0]]),
        {"values_col": "v"},
        ValueError,
        r"row 101: 2 keys in 'k' but 1 values in 'v'",
    ),
    (
        lambda: _keys_batch([[1], [2, 3]], [[1.0], [1.0, math.nan]]),
        {"values_col": "v"},
        ValueError,
        r"values column 'v': value nan at row 101 is not finite",
    ),
    (
        lambda: _keys_batch([[1], None]),
        {},
        ValueError,
        r"'k': null keys array: null at row 101",
    ),
    (
        lambda: pa.RecordBatch.from_pydict({"d": pa.array([[1.0, 2.0], [1.0]])}),
        {},
        ValueError,
        r"features column 'd': vector size 1 at row 101 differs from the first row's size 2",
    ),
    (
        lambda: pa.RecordBatch.from_pydict({"d": pa.array([[1.0, 2.0], [1.0, None]])}),
        {},
        ValueError,
        r"features column 'd': null element at row 101",
    ),
    (
        lambda: vec_batch([SP, SP], label=[1.0, None]),
        {"label_col": "label"},
        ValueError,
        r"Labels MUST NOT be Null or NaN, got null in column 'label' at row 101",
    ),
    (
        lambda: vec_batch([SP, SP], label=[math.nan, 1.0]),
        {"label_col": "label"},
        ValueError,
        r"Labels MUST NOT be Null or NaN, got nan in column 'label' at row 100",
    ),
    (
        lambda: vec_batch([SP, SP], label=[1.0, -math.inf]),
        {"label_col": "label"},
        ValueError,
        r"Labels MUST NOT be Infinity, got -inf in column 'label' at row 101",
    ),
    (
        lambda: vec_batch([SP, SP], w=[1.0, None]),
        {"weight_col": "w"},
        ValueError,
        r"weights must not be null, got null in column 'w' at row 101",
    ),
    (
        lambda: vec_batch([SP, SP], w=[math.nan, 1.0]),
        {"weight_col": "w"},
        ValueError,
        r"weights must be finite, got nan in column 'w' at row 100",
    ),
    (
        lambda: vec_batch([SP] * 20, w=[1.0] * 17 + [-1.0, 1.0, -2.0]),
        {"weight_col": "w", "row_offset": 0},
        ValueError,
        r"weights must be non-negative, got -1\.0 at row 17 \(column 'w'\)",
    ),
    (
        lambda: pa.RecordBatch.from_pydict({"s": pa.array([["a"], ["b"]])}),
        {},
        TypeError,
        r"features column 's' has unsupported Arrow type list<item: string>; supported: "
        r"VectorUDT .*array<bigint>/array<int> keys, array<float>/array<double> dense",
    ),
    (
        lambda: pa.RecordBatch.from_pydict({"s": pa.array([1.0, 2.0])}),
        {},
        TypeError,
        r"features column 's' has unsupported Arrow type double",
    ),
    (
        lambda: vec_batch([SP], v=[[1.0]]),
        {"values_col": "v"},
        ValueError,
        r"values_col='v' needs an array<int>/array<bigint> keys features column",
    ),
    (
        lambda: vec_batch([SP]),
        {"label_col": "y"},
        ValueError,
        r"label column 'y' not found; columns are \['features'\]",
    ),
    (
        lambda: vec_batch([SP], label=["a"]),
        {"label_col": "label"},
        TypeError,
        r"label column 'label' must be numeric, got Arrow type string",
    ),
]


@pytest.mark.parametrize("make,kwargs,exc,match", BAD_CASES)
def test_validation_messages(make, kwargs, exc, match):
    batch = make()
    features = batch.schema.names[0]
    kwargs = {"row_offset": 100, **kwargs}
    with pytest.raises(exc, match=match):
        arrow_to_csr(batch, features, **kwargs)


def test_validation_row_is_relative_to_slice():
    batch = vec_batch([raw_sparse(3, [9], [1.0]), SP, SP, raw_sparse(3, [7], [1.0])])
    with pytest.raises(ValueError, match=r"index 7 out of range \[0, 3\) at row 52"):
        arrow_to_csr(batch.slice(1), "features", row_offset=50)


def test_check_binary_labels():
    check_binary_labels(np.array([0.0, 1.0, 1.0]), "label")
    with pytest.raises(ValueError, match=r"Labels MUST be in \{0, 1\}, but got 2\.0 in column "):
        check_binary_labels(np.array([0.0, 1.0, 2.0, 3.0]), "label")
    with pytest.raises(ValueError, match=r"got -1\.0 in column 'y' at row 11"):
        check_binary_labels(np.array([1.0, -1.0]), "y", row_offset=10)


# --------------------------------------------------------------------------- read_partition


def test_read_partition_concatenates_and_counts_rows():
    vecs = MIXED * 3
    batch = vec_batch(vecs, label=[float(i) for i in range(15)])
    parts = [batch.slice(0, 4), batch.slice(4, 0), batch.slice(4, 6), batch.slice(10)]
    csr = read_partition(iter(parts), "features", label_col="label")
    np.testing.assert_array_equal(csr.to_dense(), dense_ref(vecs))
    np.testing.assert_array_equal(csr.labels, np.arange(15.0))
    bad = vec_batch([SP] * 5 + [Vectors.sparse(3, [0], [math.nan])])
    with pytest.raises(ValueError, match=r"value nan at row 5 is not finite"):
        read_partition([bad.slice(0, 4), bad.slice(4)], "features")


def test_read_partition_pins_vector_size_across_batches():
    first, second = vec_batch([SP, SP]), vec_batch([Vectors.sparse(4, [0], [1.0])])
    with pytest.raises(ValueError, match=r"vector size 4 at row 2 differs from num_features=3"):
        read_partition([first, second], "features")
    # Key columns are not pinned: the key space is the largest seen.
    k = read_partition([_keys_batch([[1]]), _keys_batch([[BIG]])], "k")
    assert k.num_features == BIG + 1 and k.indices.tolist() == [1, BIG]


def test_read_partition_empty():
    empty = read_partition(iter([]), "features", num_features=7, label_col="label")
    assert empty.n_rows == 0 and empty.num_features == 7 and empty.labels.shape == (0,)
    assert empty.weights is None
    assert empty.matvec(np.zeros(7)).shape == (0,)
    assert read_partition([], "k").num_features == 0
    only_empty = read_partition([vec_batch([SP]).slice(1)], "features")
    assert only_empty.n_rows == 0


# --------------------------------------------------------------------------- CSRBatch math


def test_matvec_rmatvec_to_dense_against_numpy():
    rng = np.random.default_rng(3)
    csr = random_csr(rng, 40, 12)
    dense = csr.to_dense()
    w, r = rng.normal(size=12), rng.normal(size=40)
    np.testing.assert_allclose(csr.matvec(w), dense @ w, rtol=1e-12)
    np.testing.assert_allclose(csr.rmatvec(r, 15), np.r_[dense.T @ r, 0, 0, 0], rtol=1e-12)
    assert csr.rmatvec(r, 12).dtype == np.float64
    with pytest.raises(ValueError, match=r"w has shape \(11,\), needs 1-D of length >= "):
        csr.matvec(w[:11])
    with pytest.raises(ValueError, match=r"dim=5 is below num_features=12"):
        csr.rmatvec(r, 5)


def test_duplicate_indices_sum_consistently():
    csr = CSRBatch([0, 3, 3], [2, 2, 0], [1.0, 2.0, 5.0], 3)
    np.testing.assert_array_equal(csr.to_dense(), [[5.0, 0.0, 3.0], [0.0, 0.0, 0.0]])
    np.testing.assert_array_equal(csr.matvec(np.array([1.0, 0.0, 10.0])), [35.0, 0.0])
    np.testing.assert_array_equal(csr.rmatvec(np.array([2.0, 1.0]), 3), [10.0, 0.0, 6.0])
    assert csr.row_ids().tolist() == [0, 0, 0]


def test_localize_on_big_keys():
    csr = CSRBatch([0, 2, 3, 5], [BIG, 7, BIG, 2**33, 7], [1.0, 2.0, 3.0, 4.0, 5.0], BIG + 1)
    keys, local = csr.localize()
    assert keys.tolist() == [7, 2**33, BIG]
    assert local.indices.tolist() == [2, 0, 2, 1, 0] and local.num_features == 3
    w_global = {7: 0.5, 2**33: -1.0, BIG: 2.0}
    w_local = np.array([w_global[k] for k in keys.tolist()])
    np.testing.assert_array_equal(local.matvec(w_local), [1.0 * 2 + 2.0 * 0.5, 6.0, -4.0 + 2.5])


@pytest.mark.parametrize("dim", [50, 10**12], ids=["mask-path", "unique-path"])
def test_localize_matches_np_unique(dim):
    rng = np.random.default_rng(4)
    csr = CSRBatch(np.arange(0, 121, 6), rng.integers(0, 50, 120) * (dim // 50), np.ones(120), dim)
    keys, local = csr.localize()
    ref_keys, ref_inv = np.unique(csr.indices, return_inverse=True)
    np.testing.assert_array_equal(keys, ref_keys)
    np.testing.assert_array_equal(local.indices, ref_inv)
    assert local.num_features == keys.shape[0] and keys.dtype == np.int64
    assert local.indices.dtype == np.int32  # compact ids: half the bytes, no scipy copy
    np.testing.assert_array_equal(keys[local.indices], csr.indices)
    if dim == 50:  # the same products as on the global keys, bit for bit
        w = rng.normal(size=keys.size)
        w_global = np.zeros(dim)
        w_global[keys] = w
        np.testing.assert_array_equal(local.matvec(w), csr.matvec(w_global))


def test_csr_indices_are_int64_unless_given_as_int32_ids():
    """int32 stays int32 (a localized batch); anything else becomes int64, as before."""
    for other in ([0, 2, 1], np.array([0, 2, 1], np.int16), np.array([0.0, 2.0, 1.0])):
        assert CSRBatch([0, 2, 3], other, np.ones(3), 3).indices.dtype == np.int64
    ids = np.array([0, 2, 1], np.int32)
    batch = CSRBatch([0, 2, 3], ids, np.ones(3), 3)
    assert batch.indices.dtype == np.int32 and np.shares_memory(batch.indices, ids)
    both = CSRBatch.concat([batch, CSRBatch([0, 1], [2**40], [1.0], 2**41)])
    assert both.indices.dtype == np.int64 and both.indices.tolist() == [0, 2, 1, 2**40]
    assert id_dtype(2**31 - 1) is np.int32 and id_dtype(2**31) is np.int64
    # a localized batch localized again (a mini-batch, a sample): int64 keys, int32 ids
    sub = CSRBatch([0, 1], np.array([2], np.int32), [1.0], 10**9)  # the sort path
    keys, again = sub.localize()
    assert keys.dtype == np.int64 and keys.tolist() == [2]
    assert again.indices.dtype == np.int32 and again.indices.tolist() == [0]


def test_slice_take_concat_row_ids():
    rng = np.random.default_rng(5)
    csr = random_csr(rng, 30, 8)
    dense = csr.to_dense()
    part = csr.slice(7, 19)
    np.testing.assert_array_equal(part.to_dense(), dense[7:19])
    np.testing.assert_array_equal(part.labels, csr.labels[7:19])
    assert np.shares_memory(part.values, csr.values) or part.nnz == 0
    np.testing.assert_array_equal(csr.slice(25, 99).to_dense(), dense[25:])
    with pytest.raises(ValueError, match=r"0 <= start <= stop, got \[5, 2\)"):
        csr.slice(5, 2)
    rows = np.array([29, 0, 7, 7, 13])
    taken = csr.take(rows)
    np.testing.assert_array_equal(taken.to_dense(), dense[rows])
    np.testing.assert_array_equal(taken.weights, csr.weights[rows])
    with pytest.raises(ValueError, match=r"row positions must be in \[0, 30\)"):
        csr.take(np.array([30]))
    joined = CSRBatch.concat([csr.slice(0, 10), csr.slice(10, 10), csr.slice(10, 30)])
    np.testing.assert_array_equal(joined.to_dense(), dense)
    np.testing.assert_array_equal(joined.indptr, csr.indptr)
    ref_rows = np.repeat(np.arange(30), np.count_nonzero(dense, axis=1))
    np.testing.assert_array_equal(csr.row_ids(), ref_rows)
    with pytest.raises(ValueError, match="disagree on having labels"):
        CSRBatch.concat([csr, CSRBatch(csr.indptr, csr.indices, csr.values, 8)])


def test_csrbatch_rejects_inconsistent_arrays():
    with pytest.raises(ValueError, match=r"indptr\[-1\]=3 but indices has shape \(2,\)"):
        CSRBatch([0, 3], [0, 1], [1.0, 2.0], 4)
    with pytest.raises(ValueError, match=r"labels has shape \(2,\), expected \(1,\)"):
        CSRBatch([0, 1], [0], [1.0], 4, labels=[0.0, 1.0])


def test_iter_minibatches():
    rng = np.random.default_rng(9)
    csr = random_csr(rng, 23, 6)
    dense = csr.to_dense()
    plain = list(iter_minibatches(csr, 5))
    assert [b.n_rows for b in plain] == [5, 5, 5, 5, 3]
    np.testing.assert_array_equal(np.vstack([b.to_dense() for b in plain]), dense)
    shuffled = list(iter_minibatches(csr, 5, shuffle=True, seed=1))
    order = np.random.default_rng(1).permutation(23)
    np.testing.assert_array_equal(np.vstack([b.to_dense() for b in shuffled]), dense[order])
    np.testing.assert_array_equal(np.concatenate([b.labels for b in shuffled]), csr.labels[order])
    other = np.concatenate([b.weights for b in iter_minibatches(csr, 5, shuffle=True, seed=2)])
    assert not np.array_equal(other, csr.weights[order])
    assert sorted(other.tolist()) == sorted(csr.weights.tolist())
    assert list(iter_minibatches(CSRBatch.empty(3), 4)) == []
    with pytest.raises(ValueError, match="batch_size must be a positive integer, got 0"):
        next(iter_minibatches(csr, 0))


# --------------------------------------------------------------------------- through Spark


def _csr_job(specs):
    """A mapInArrow function reading each (name, features_col, kwargs) of ``specs``.

    Nested so cloudpickle ships it by value (the test module is not importable
    on the Python workers). One output row per partition, columns per spec.
    """

    def fn(batches):
        import pyarrow as pa

        from spark_ps.data import read_partition

        batches = list(batches)
        ids = [b.column("id") for b in batches]
        cols = {"ids": [pa.concat_arrays(ids).to_pylist() if ids else []]}
        for name, col, kw in specs:
            csr = read_partition(iter(batches), col, **kw)
            cols[f"{name}_indptr"] = [csr.indptr.tolist()]
            cols[f"{name}_indices"] = [csr.indices.tolist()]
            cols[f"{name}_values"] = [csr.values.tolist()]
            cols[f"{name}_nf"] = [csr.num_features]
            cols[f"{name}_labels"] = [[] if csr.labels is None else csr.labels.tolist()]
        yield pa.RecordBatch.from_pydict(cols, schema=_schema(specs))

    def _schema(specs):
        fields = [pa.field("ids", pa.list_(pa.int64()))]
        for name, _, _ in specs:
            fields += [
                pa.field(f"{name}_indptr", pa.list_(pa.int64())),
                pa.field(f"{name}_indices", pa.list_(pa.int64())),
                pa.field(f"{name}_values", pa.list_(pa.float64())),
                pa.field(f"{name}_nf", pa.int64()),
                pa.field(f"{name}_labels", pa.list_(pa.float64())),
            ]
        return pa.schema(fields)

    ddl = ", ".join(
        ["ids array<long>"]
        + [
            f"{n}_indptr array<long>, {n}_indices array<long>, {n}_values array<double>, "
            f"{n}_nf long, {n}_labels array<double>"
            for n, _, _ in specs
        ]
    )
    return fn, ddl


def _unpack(out_rows, name):
    """Per-partition CSRBatches from the job's rows, keyed by row id."""
    by_id = {}
    for row in out_rows:
        csr = CSRBatch(
            row[f"{name}_indptr"], row[f"{name}_indices"], row[f"{name}_values"], row[f"{name}_nf"]
        )
        labels = row[f"{name}_labels"]
        for i, rid in enumerate(row["ids"]):
            lo, hi = csr.indptr[i], csr.indptr[i + 1]
            by_id[rid] = (
                csr.indices[lo:hi].tolist(),
                csr.values[lo:hi].tolist(),
                csr.num_features,
                labels[i] if labels else None,
            )
    return by_id


def _schema(*fields):
    """A Spark schema: ``id long`` then the given (name, type) fields."""
    return StructType([StructField("id", LongType())] + [StructField(n, t) for n, t in fields])


def _spark_rows(n):
    rng = np.random.default_rng(11)
    rows = []
    for i in range(n):
        if i % 3 == 0:
            vec = Vectors.dense(np.round(rng.normal(size=6), 3).tolist())
        else:
            idx = sorted(rng.choice(6, size=int(rng.integers(0, 4)), replace=False).tolist())
            vec = Vectors.sparse(6, idx, np.round(rng.normal(size=len(idx)), 3).tolist())
        keys = [int(k) for k in rng.integers(0, 2**45, size=int(rng.integers(0, 4)))]
        vals = np.round(rng.normal(size=len(keys)), 3).tolist()
        dense = np.round(rng.normal(size=4), 3).tolist()
        rows.append((i, vec, keys, vals, dense, float(i % 2)))
    return rows


def test_spark_map_in_arrow_all_kinds(spark):
    schema = _schema(
        ("f", VectorUDT()),
        ("k", ArrayType(LongType())),
        ("kv", ArrayType(DoubleType())),
        ("d", ArrayType(DoubleType())),
        ("label", DoubleType()),
    )
    df = spark.createDataFrame(_spark_rows(60), schema).repartition(3)
    specs = [
        ("v", "f", {"label_col": "label"}),
        ("k", "k", {"values_col": "kv", "num_features": 2**45}),
        ("d", "d", {}),
    ]
    fn, ddl = _csr_job(specs)
    out = df.mapInArrow(fn, ddl).collect()
    ref = {r["id"]: r for r in df.collect()}
    assert len(out) == 3 and sorted(i for r in out for i in r["ids"]) == list(range(60))

    vec = _unpack(out, "v")
    for rid, (idx, vals, nf, label) in vec.items():
        v = ref[rid]["f"]
        dense = np.zeros(nf)
        dense[idx] = vals
        assert nf == 6 and label == ref[rid]["label"]
        np.testing.assert_array_equal(dense, v.toArray())
        want = v.indices.tolist() if isinstance(v, SparseVector) else list(range(6))
        assert idx == want
    keys = _unpack(out, "k")
    for rid, (idx, vals, nf, _) in keys.items():
        assert (idx, vals, nf) == (ref[rid]["k"], ref[rid]["kv"], 2**45)
    assert max(max(r["k"], default=0) for r in ref.values()) > 2**31
    dense = _unpack(out, "d")
    for rid, (idx, vals, nf, _) in dense.items():
        assert (idx, vals, nf) == ([0, 1, 2, 3], ref[rid]["d"], 4)


def test_spark_empty_partitions(spark):
    df = spark.createDataFrame(
        [(0, Vectors.sparse(3, [1], [2.0])), (1, Vectors.dense([1.0, 2.0, 3.0]))],
        _schema(("f", VectorUDT())),
    ).repartition(4)
    fn, ddl = _csr_job([("v", "f", {"num_features": 3})])
    out = df.mapInArrow(fn, ddl).collect()
    assert len(out) == 4
    sizes = sorted(len(r["ids"]) for r in out)
    assert sum(sizes) == 2 and sizes[:2] == [0, 0]
    assert all(r["v_nf"] == 3 and len(r["v_indptr"]) == len(r["ids"]) + 1 for r in out)
    got = _unpack(out, "v")
    assert got[0][:2] == ([1], [2.0]) and got[1][:2] == ([0, 1, 2], [1.0, 2.0, 3.0])


def test_spark_error_surfaces_from_task(spark):
    from pyspark.errors import PythonException

    rows = [(i, Vectors.dense([1.0, float(i)])) for i in range(8)]
    rows[5] = (5, Vectors.dense([1.0, math.nan]))
    df = spark.createDataFrame(rows, _schema(("f", VectorUDT()))).coalesce(1)
    fn, ddl = _csr_job([("v", "f", {})])
    with pytest.raises(PythonException, match=r"'f': value nan at row 5 is not finite"):
        df.mapInArrow(fn, ddl).collect()
