"""Benchmark data generators and helpers: schema, determinism, ranges, learnability."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import auc, markdown_table, model_auc  # noqa: E402
from bench.datagen import (  # noqa: E402
    FLIGHTS_FIELDS,
    NYC_FEATURES,
    _sorted_rows,
    data_dir,
    dense_features,
    dense_gbt_arrays,
    flights_ctr,
    gbt_dataset,
    nycflights,
    nycflights_frame,
    synthetic_ctr,
)

pytestmark = pytest.mark.timeout(180)
needs_data = pytest.mark.skipif(
    not (data_dir() / "flights-3m.parquet").exists(), reason=f"no shared data in {data_dir()}"
)


def _csr(df, col: str = "features") -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(labels, offsets, indices, values) of a VectorUDT column, via Arrow (no Row objects)."""
    table = df.toArrow()
    feats = table.column(col).combine_chunks()
    ind = feats.field("indices")
    val = feats.field("values")
    offsets = ind.offsets.to_numpy()
    return (
        table.column("label").to_numpy(),
        offsets,
        ind.flatten().to_numpy(),
        val.flatten().to_numpy(),
    )


def test_sorted_rows_matches_per_row_unique():
    rng = np.random.default_rng(0)
    idx = rng.integers(0, 7, size=(50, 6))
    offsets, flat, values = _sorted_rows(idx)
    for r in range(50):  # plain per-row reference
        keys, counts = np.unique(idx[r], return_counts=True)
        np.testing.assert_array_equal(flat[offsets[r] : offsets[r + 1]], keys)
        np.testing.assert_array_equal(values[offsets[r] : offsets[r + 1]], counts)


def test_synthetic_schema_and_ranges(spark):
    df = synthetic_ctr(spark, 400, 10, nnz=8, seed=3, keys=True)
    assert [(f.name, f.dataType.simpleString()) for f in df.schema.fields] == [
        ("label", "double"),
        ("features", "vector"),
        ("keys", "array<bigint>"),
    ]
    label, offsets, ind, val = _csr(df)
    assert set(np.unique(label)) == {0.0, 1.0}
    assert ind.min() >= 0 and ind.max() < 2**10
    row = np.repeat(np.arange(400), np.diff(offsets))
    same_row = row[1:] == row[:-1]
    assert (ind[1:][same_row] > ind[:-1][same_row]).all()  # strictly increasing per row
    np.testing.assert_array_equal(np.add.reduceat(val, offsets[:-1]), np.full(400, 8.0))
    keys = df.toArrow().column("keys").combine_chunks()
    np.testing.assert_array_equal(np.diff(keys.offsets.to_numpy()), np.full(400, 8))
    # keys (duplicates kept) and the vector (duplicates summed) are the same rows
    k = keys.flatten().to_numpy().reshape(400, 8)
    o2, i2, v2 = _sorted_rows(k)
    np.testing.assert_array_equal(o2, offsets)
    np.testing.assert_array_equal(i2, ind)
    np.testing.assert_array_equal(v2, val)


def test_synthetic_deterministic_across_partitions(spark):
    a = _csr(synthetic_ctr(spark, 300, 16, nnz=5, seed=7, partitions=2))
    b = _csr(synthetic_ctr(spark, 300, 16, nnz=5, seed=7, partitions=3))
    c = _csr(synthetic_ctr(spark, 300, 16, nnz=5, seed=8, partitions=2))
    for x, y in zip(a, b, strict=True):
        np.testing.assert_array_equal(x, y)
    assert not np.array_equal(a[0], c[0])  # another seed: other labels


def test_synthetic_long_keys_only_beyond_vector_range(spark):
    df = synthetic_ctr(spark, 200, 36, nnz=6, seed=1)
    assert df.columns == ["label", "keys"]
    keys = df.toArrow().column("keys").combine_chunks().flatten().to_numpy()
    assert keys.min() >= 0 and keys.max() < 2**36 and keys.max() >= 2**31


def test_synthetic_rejects_bad_dims(spark):
    with pytest.raises(ValueError, match="log2_dim=63"):
        synthetic_ctr(spark, 10, 63)
    with pytest.raises(ValueError, match="rows=0"):
        synthetic_ctr(spark, 0, 10)


def test_dense_features_schema_and_determinism(spark):
    df = dense_features(spark, 100, n_features=7, seed=2)
    assert df.schema.simpleString() == "struct<label:double,features:vector>"
    t1 = df.toArrow()
    t2 = dense_features(spark, 100, n_features=7, seed=2, partitions=3).toArrow()
    assert t1.equals(t2)
    vals = t1.column("features").combine_chunks().field("values")
    x = vals.flatten().to_numpy().reshape(100, 7)
    assert np.isfinite(x).all() and abs(x.std() - 1.0) < 0.2
    assert set(np.unique(t1.column("label").to_numpy())) <= {0.0, 1.0}


def test_synthetic_is_learnable_by_mllib(spark):
    from pyspark.ml.classification import LogisticRegression

    train = synthetic_ctr(spark, 20_000, 18, seed=0).cache()
    test = synthetic_ctr(spark, 5_000, 18, seed=0, start=20_000).cache()
    lr = LogisticRegression(maxIter=10, regParam=0.01, standardization=False)
    model = lr.fit(train)
    score = model_auc(model, test)
    train.unpersist()
    test.unpersist()
    assert score > 0.6, score


def test_auc_matches_pairwise_definition_with_ties():
    rng = np.random.default_rng(1)
    y = rng.integers(0, 2, 300).astype(float)
    s = rng.integers(0, 5, 300).astype(float)  # many ties
    pos, neg = s[y == 1], s[y == 0]
    diff = pos[:, None] - neg[None, :]
    expected = ((diff > 0).sum() + 0.5 * (diff == 0).sum()) / diff.size
    assert auc(y, s) == pytest.approx(expected, abs=1e-12)
    assert auc([0, 1], [0.2, 0.9]) == 1.0
    with pytest.raises(ValueError, match="both classes"):
        auc([1, 1], [0.1, 0.2])


def test_time_to_loss_and_configs():
    from types import SimpleNamespace

    from bench.gbt import parse_configs
    from bench.lr import _time_to_loss

    s = SimpleNamespace(objectiveHistory=[0.69, 0.5, 0.41, 0.40], iterationTimestamps=[0, 1, 2, 3])
    assert _time_to_loss(s, 0.41, 0.0) == 2.0
    assert _time_to_loss(s, 0.3, 0.0) == float("inf")
    assert _time_to_loss(SimpleNamespace(objectiveHistory=[0.5]), 0.5, 0.0) is None
    assert parse_configs("20x5, 100X6") == [(20, 5), (100, 6)]
    with pytest.raises(ValueError, match="'20-5'"):
        parse_configs("20-5")


def test_gbt_repeat_takes_the_median_of_interleaved_runs(monkeypatch):
    from types import SimpleNamespace

    import bench.gbt as gbt

    times = {"a": iter([2.0, 3.0, 10.0]), "b": iter([5.0])}
    order = []

    def fake_run_one(impl, data, trees, depth, args):  # the bench's own loop, not Spark
        order.append(impl)
        if impl == "b" and len(order) > 2:
            return {"impl": impl, "status": "failed: boom"}
        return {"impl": impl, "status": "ok", "fit s": next(times[impl]), "test AUC": 0.5}

    monkeypatch.setattr(gbt, "run_one", fake_run_one)
    rows = gbt.run_config(["a", "b"], {}, 20, 5, SimpleNamespace(repeat=3))
    assert order == ["a", "b", "a", "b", "a"]  # interleaved; a failed impl is not retried
    a, b = rows
    assert a["fit s"] == 3.0 and a[gbt.RUNS] == "2 / 3 / 10"  # median: not first, last or mean
    assert b["status"] == "failed: boom" and "fit s" not in b
    times["a"] = iter([4.0])
    single = gbt.run_config(["a"], {}, 20, 5, SimpleNamespace(repeat=1))
    assert single[0]["fit s"] == 4.0 and gbt.RUNS not in single[0]


def test_markdown_table_shape():
    text = markdown_table([{"a": 1.0, "b": "x"}, {"a": None}], ["a", "b"])
    lines = text.splitlines()
    assert lines[0].split("|")[1].strip() == "a" and len(lines) == 4
    assert "n/a" in lines[3]


@needs_data
def test_flights_ctr_schema_and_split(spark):
    train, test = flights_ctr(spark, log2_dim=12, fraction=0.002)
    assert train.schema.simpleString() == "struct<label:double,features:vector>"
    label, offsets, ind, val = _csr(train)
    assert set(np.unique(label)) == {0.0, 1.0}
    assert ind.min() >= 0 and ind.max() < 2**12
    sums = np.add.reduceat(val, offsets[:-1])
    np.testing.assert_array_equal(sums, np.full(label.size, float(len(FLIGHTS_FIELDS))))
    n_test = test.count()
    assert 0.75 < label.size / (label.size + n_test) < 0.85
    long_train, _ = flights_ctr(spark, log2_dim=36, fraction=0.001)
    assert long_train.columns == ["label", "keys"]
    keys = long_train.toArrow().column("keys").combine_chunks().flatten().to_numpy()
    assert keys.min() >= 0 and keys.max() < 2**36 and keys.max() >= 2**31


@needs_data
def test_nycflights_matrix_and_spark_rows_agree(spark):
    frame = nycflights_frame()
    assert list(frame.columns) == [*NYC_FEATURES, "label"]
    assert len(frame) == 327_346  # flights with an arr_delay
    assert not frame.isna().any().any()
    assert set(np.unique(frame["label"])) == {0.0, 1.0}
    train, test, arrays = nycflights(spark, max_rows=400)
    assert arrays["X_train"].shape == (400, len(NYC_FEATURES))
    from pyspark.ml.functions import vector_to_array

    got = test.select(vector_to_array("features").alias("f"), "label").toArrow()
    feats = got.column("f").combine_chunks().flatten().to_numpy()
    np.testing.assert_array_equal(feats.reshape(-1, len(NYC_FEATURES)), arrays["X_test"])
    np.testing.assert_array_equal(got.column("label").to_numpy(), arrays["y_test"])


def test_vector_struct_accepted_by_spark(spark):
    """The Arrow struct emitted by mapInArrow becomes a real SparseVector."""
    from pyspark.ml.linalg import SparseVector

    row = synthetic_ctr(spark, 1, 8, nnz=3, seed=0).first()
    assert isinstance(row.features, SparseVector) and row.features.size == 256
    assert row.features.values.sum() == 3.0 and (row.features.indices < 256).all()


@needs_data
@pytest.mark.parametrize(
    "name,n_features", [("nycflights", 24), ("nycflights-wide", 51), ("dense80", 80)]
)
def test_gbt_datasets_give_spark_the_rows_of_their_arrays(spark, name, n_features):
    """Every GBT bench dataset: complete dense matrices, binary labels, and Spark
    DataFrames holding exactly the arrays' rows (what LightGBM/XGBoost train on)."""
    train, test, arrays = gbt_dataset(spark, name, max_rows=300)
    assert (
        arrays["X_train"].shape == (300, n_features) and len(arrays["feature_names"]) == n_features
    )
    assert np.isfinite(arrays["X_train"]).all() and np.isfinite(arrays["X_test"]).all()
    assert set(np.unique(arrays["y_train"])) == {0.0, 1.0}
    from pyspark.ml.functions import vector_to_array

    for df, x, y in (
        (train, arrays["X_train"], arrays["y_train"]),
        (test, arrays["X_test"], arrays["y_test"]),
    ):
        got = df.select(vector_to_array("features").alias("f"), "label").toArrow()
        feats = got.column("f").combine_chunks().flatten().to_numpy()
        np.testing.assert_array_equal(feats.reshape(-1, n_features), x)
        np.testing.assert_array_equal(got.column("label").to_numpy(), y)


def test_dense_gbt_data_needs_trees():
    """The generated dense set is reproducible, and its label is not linear in the features:
    a least-squares score with pairwise products beats a linear one on held-out rows."""
    a, b = dense_gbt_arrays(6000, 16, seed=3), dense_gbt_arrays(6000, 16, seed=3)
    np.testing.assert_array_equal(a["X_train"], b["X_train"])
    assert 0.2 < a["y_train"].mean() < 0.6

    def design(x: np.ndarray, products: bool) -> np.ndarray:
        z = (x - a["X_train"].mean(0)) / a["X_train"].std(0)
        if products:
            z = np.c_[z, (z[:, :, None] * z[:, None, :]).reshape(len(z), -1)]
        return np.c_[np.ones(len(z)), z]

    scores = {}
    for products in (False, True):
        w = np.linalg.lstsq(design(a["X_train"], products), a["y_train"], rcond=None)[0]
        scores[products] = auc(a["y_test"], design(a["X_test"], products) @ w)
    assert scores[True] > scores[False] + 0.02, scores  # signal a linear score misses
