"""Compressed LR models: block-quantized codes within their stated margin bound, >= 4x
smaller, saved and loaded, scored from the codes, exported to MLlib dequantized."""

from __future__ import annotations

import os

import numpy as np
import pytest
from pyspark.ml.linalg import Vectors

from spark_ps.data import CSRBatch
from spark_ps.ml.classification import LogisticRegression
from spark_ps.ml.lr.compress import BLOCK, QuantizedScoring, QuantizedWeights
from spark_ps.ml.lr.model import LogisticRegressionModel
from spark_ps.ml.lr.scoring import ScoringCoefficients

pytestmark = pytest.mark.timeout(300)

D24 = 1 << 24


def _sparse_model(rng, nnz=200_000, d=D24):
    keys = np.unique(rng.integers(0, d, nnz))
    values = rng.standard_t(3, size=keys.size) * 0.05  # heavy tails: blocks differ in scale
    return LogisticRegressionModel.fromCoefficients(values, -0.4, keys=keys, numFeatures=d)


def _batch(rng, keys, d, n=2000, per_row=30):
    """Rows drawing mostly model keys, some ids the model lacks."""
    lengths = rng.integers(0, per_row, n)
    indptr = np.concatenate([[0], np.cumsum(lengths)])
    idx = np.where(
        rng.uniform(size=indptr[-1]) < 0.8,
        keys[rng.integers(0, keys.size, indptr[-1])],
        rng.integers(0, d, indptr[-1]),
    )
    return CSRBatch(indptr, idx, rng.normal(size=indptr[-1]), d)


def _bound(full: LogisticRegressionModel, q: QuantizedWeights, csr: CSRBatch) -> np.ndarray:
    """sum_i |x_i| e_i: e_i = half the step of a stored id's block, prunedMax for the rest."""
    stored = ScoringCoefficients(q.keys(), q.half_steps(), 0.0)
    e = stored.weights_at(csr.indices)
    full_w = ScoringCoefficients.of(full._keys, full._values, 0.0).weights_at(csr.indices)
    e = np.where((e == 0.0) & (full_w != 0.0), q.pruned_max, e)
    return np.add.reduceat(np.abs(csr.values) * e, csr.indptr[:-1]) * (np.diff(csr.indptr) > 0)


@pytest.mark.parametrize(("bits", "prune"), [(8, 0.0), (16, 0.0), (8, 0.02), (16, 0.01)])
def test_margins_stay_within_the_stated_bound(bits, prune):
    rng = np.random.default_rng(bits)
    full = _sparse_model(rng)
    small = full.compress(bits=bits, prune=prune)
    q = small._quant
    csr = _batch(rng, full._keys, D24)
    exact = ScoringCoefficients.of(full._keys, full._values, full._intercept).margins(csr)
    approx = small._scoring_state().margins(csr)
    assert isinstance(small._scoring_state(), QuantizedScoring)
    err, bound = np.abs(approx - exact), _bound(full, q, csr)
    assert np.all(err <= bound * (1 + 1e-9) + 1e-12), (err - bound).max()
    assert err.max() > 0.0  # the codes are lossy: the bound is what is being tested
    step = q.scales.max() / 2
    assert bound.max() <= np.abs(csr.values).sum() * max(step, q.pruned_max)
    if prune:
        assert q.pruned_max < prune and q.size < full._keys.size


def test_dense_layout_and_key_decoding_round_trip():
    rng = np.random.default_rng(5)
    w = rng.normal(size=3 * BLOCK + 17)
    q = QuantizedWeights.quantize(None, w, w.size, 16)
    assert q.dense and q.size == w.size
    np.testing.assert_array_equal(q.keys(), np.arange(w.size))
    assert np.all(np.abs(q.values() - w) <= q.half_steps())
    keys = np.array([0, 1, 300, 70_000, 2**33, 2**62 + 7], dtype=np.int64)  # widths 1..8
    s = QuantizedWeights.quantize(keys, np.arange(1.0, 7.0), 2**63 - 1, 8)
    np.testing.assert_array_equal(s.keys(), keys)
    e = QuantizedWeights.quantize(np.zeros(0, np.int64), np.zeros(0), 10, 8)
    assert e.size == 0 and e.keys().size == 0


def test_sizes_in_memory():
    """8 bits: >= 4x dense and sparse. 16 bits: >= 4x with pruning; without, a dense model
    gets 3.94x (2 bytes + a scale per 256 against 8 bytes) and a sparse one 200k keys in
    2^24 ~3.9x (2-byte codes + 2-byte gaps against 16 bytes)."""
    rng = np.random.default_rng(1)
    sparse = _sparse_model(rng)
    dense = LogisticRegressionModel.fromCoefficients(rng.normal(size=1 << 18), 0.1)
    ratios = {
        "sparse8": sparse.nbytes / sparse.compress(8).nbytes,
        "dense8": dense.nbytes / dense.compress(8).nbytes,
        "sparse16": sparse.nbytes / sparse.compress(16).nbytes,
        "sparse16p": sparse.nbytes / sparse.compress(16, pruneFraction=0.3).nbytes,
        "dense16p": dense.nbytes / dense.compress(16, pruneFraction=0.5).nbytes,
        "dense16": dense.nbytes / dense.compress(16).nbytes,
    }
    for name in ("sparse8", "dense8", "sparse16p", "dense16p"):
        assert ratios[name] >= 4.0, ratios
    assert 3.9 <= ratios["dense16"] < 4.0 and 3.5 <= ratios["sparse16"] < 4.0, ratios


def test_bad_arguments_are_refused_naming_them(spark):
    model = LogisticRegressionModel.fromCoefficients([1.0, -2.0], 0.5)
    with pytest.raises(ValueError, match=r"compress: bits must be 8 or 16, got 7"):
        model.compress(bits=7)
    with pytest.raises(ValueError, match=r"prune must be a finite threshold >= 0.*got -0.1"):
        model.compress(prune=-0.1)
    with pytest.raises(ValueError, match=r"prune must be .* got nan"):
        model.compress(prune=float("nan"))
    with pytest.raises(ValueError, match=r"pruneFraction must be in \[0, 1\), got 1.0"):
        model.compress(pruneFraction=1.0)
    with pytest.raises(ValueError, match="already compressed"):
        model.compress().compress()
    multi = LogisticRegressionModel.fromCoefficientMatrix(_matrix(), [0.0, 0.0, 0.0])
    with pytest.raises(NotImplementedError, match="only binomial models"):
        multi.compress()
    df = spark.createDataFrame([(0.0, Vectors.dense([1.0])), (1.0, Vectors.dense([2.0]))])
    with pytest.raises(ValueError, match="parameter compressBits given invalid value 7"):
        LogisticRegression(compressBits=7).fit(df.toDF("label", "features"))
    with pytest.raises(ValueError, match="parameter compressPrune given invalid value -1.0"):
        LogisticRegression(compressBits=8, compressPrune=-1.0).fit(df.toDF("label", "features"))


def _matrix():
    from pyspark.ml.linalg import DenseMatrix

    return DenseMatrix(3, 2, [1.0, 2.0, 3.0, 4.0, 5.0, 6.0])


def _rows_df(spark, rng, keys, d, n=400):
    csr = _batch(rng, keys, d, n=n, per_row=20)
    rows = []
    for i in range(n):
        s, e = csr.indptr[i], csr.indptr[i + 1]
        idx, pos = np.unique(csr.indices[s:e], return_index=True)
        rows.append((i, Vectors.sparse(d, idx.tolist(), csr.values[s:e][pos].tolist())))
    return spark.createDataFrame(rows, ["id", "features"])


def _by_id(df, col):
    rows = sorted(df.select("id", col).collect(), key=lambda r: r["id"])
    return np.array([np.asarray(r[col].toArray() if hasattr(r[col], "toArray") else r[col])
                     for r in rows])  # fmt: skip


@pytest.mark.slow  # two saves, two loads, five Spark jobs and an MLlib export
def test_transform_save_load_and_mllib_export_of_a_compressed_model(spark, tmp_path):
    rng = np.random.default_rng(3)
    d = 1 << 20
    full = _sparse_model(rng, nnz=60_000, d=d)
    small = full.compress(bits=8, prune=0.01)
    df = _rows_df(spark, rng, full._keys, d, n=200).cache()
    raw_full, raw_small = _by_id(full.transform(df), "rawPrediction"), None
    out = small.transform(df)
    assert "MapInArrow" in out._jdf.queryExecution().executedPlan().toString()
    out = out.cache()
    raw_small = _by_id(out, "rawPrediction")
    local = small._scoring_state()
    feats = sorted(df.collect(), key=lambda r: r["id"])
    one = np.array([local.margins(_csr_of(r["features"], d))[0] for r in feats])
    np.testing.assert_allclose(raw_small[:, 1], one, rtol=1e-12, atol=1e-12)
    assert 0 < np.abs(raw_small - raw_full).max() < 0.5

    # save / load: the same codes, the same numbers; the old layouts still load
    small.write().save(str(tmp_path / "small"))
    full.write().save(str(tmp_path / "full"))
    back = LogisticRegressionModel.load(str(tmp_path / "small"))
    assert back.isCompressed and back.uid == small.uid and back.numFeatures == d
    for name in ("codes", "scales", "bases", "widths", "gaps"):
        np.testing.assert_array_equal(getattr(back._quant, name), getattr(small._quant, name))
    assert back._quant.pruned_max == small._quant.pruned_max
    np.testing.assert_array_equal(_by_id(back.transform(df), "rawPrediction"), raw_small)
    reloaded_full = LogisticRegressionModel.load(str(tmp_path / "full"))
    assert not reloaded_full.isCompressed
    np.testing.assert_array_equal(reloaded_full.coefficientValues, full.coefficientValues)
    on_disk = _dir_bytes(tmp_path / "full" / "data") / _dir_bytes(tmp_path / "small" / "data")
    assert on_disk >= 4.0, on_disk
    assert full.nbytes / small.nbytes >= 4.0

    # MLlib export: the dequantized weights, the same predictions
    ref = small.toMLlib()
    np.testing.assert_array_equal(ref.coefficients.indices, small.coefficientKeys)
    np.testing.assert_array_equal(ref.coefficients.values, small.coefficientValues)
    mllib_out = ref.transform(df).select("id", "rawPrediction", "prediction").cache()
    mllib_raw = _by_id(mllib_out, "rawPrediction")
    np.testing.assert_allclose(mllib_raw, raw_small, rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(_by_id(mllib_out, "prediction"), _by_id(out, "prediction"))


def _csr_of(v, d):
    return CSRBatch(
        np.array([0, v.indices.size]), v.indices.astype(np.int64), v.values.astype(float), d
    )


def _dir_bytes(path) -> int:
    return sum(
        os.path.getsize(os.path.join(root, f))
        for root, _, files in os.walk(path)
        for f in files
        if not f.startswith(".")
    )


def _auc(labels, scores):
    order = np.argsort(scores, kind="stable")
    ranks = np.empty(scores.size)
    ranks[order] = np.arange(1, scores.size + 1)
    pos = labels == 1.0
    return (ranks[pos].sum() - pos.sum() * (pos.sum() + 1) / 2) / (pos.sum() * (~pos).sum())


def test_fit_time_param_gives_the_compressed_model_with_the_same_auc(spark_ps):
    spark, _ = spark_ps
    rng = np.random.default_rng(11)
    d, n = 400, 1500
    beta = rng.normal(size=d)
    rows = []
    for i in range(n):
        idx = np.sort(rng.choice(d, size=10, replace=False))
        val = rng.uniform(0.5, 2.0, 10)
        y = float(rng.uniform() < 1 / (1 + np.exp(-(beta[idx] @ val))))
        rows.append((i, y, Vectors.sparse(d, idx.tolist(), val.tolist())))
    df = spark.createDataFrame(rows, ["id", "label", "features"]).cache()
    params = dict(maxIter=10, regParam=0.01)
    full = LogisticRegression(**params).fit(df)
    small = LogisticRegression(compressBits=8, compressPrune=1e-3, **params).fit(df)
    assert small.isCompressed and not full.isCompressed and small.getCompressBits() == 8
    again = full.compress(8, prune=1e-3)
    np.testing.assert_array_equal(small.coefficientValues, again.coefficientValues)
    labels = _by_id(df, "label")
    auc_full = _auc(labels, _by_id(full.transform(df), "rawPrediction")[:, 1])
    auc_small = _auc(labels, _by_id(small.transform(df), "rawPrediction")[:, 1])
    assert abs(auc_full - auc_small) <= 1e-3, (auc_full, auc_small)
