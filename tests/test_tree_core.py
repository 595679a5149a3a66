"""Histogram GBDT core: binning, exact histograms, split finding, trees, and MLlib parity."""

from __future__ import annotations

import re

import numpy as np
import pytest

from ps_server.functions.gbt import SPLIT_DTYPE, best_splits, merge_best
from spark_ps.ml.tree import binning, histogram, local
from spark_ps.ml.tree.loss import (
    get_loss,
    log1p_exp,
    margin_to_probability,
    margin_to_raw_prediction,
    remap_labels,
)
from spark_ps.ml.tree.tree import TreeArrays, ensemble_debug_string, java_double_str

pytestmark = pytest.mark.timeout(120)


def _parts(n: int, k: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Random assignment of rows 0..n-1 to k partitions (sorted ids inside each)."""
    owner = rng.integers(0, k, n)
    return [np.flatnonzero(owner == p) for p in range(k)]


def _mixed_matrix(rng: np.random.Generator, n: int) -> np.ndarray:
    """Columns with few values, many values, zeros (sparse-like) and -0.0."""
    return np.column_stack(
        [
            rng.integers(0, 6, n).astype(float),
            np.round(rng.normal(size=n), 2),
            np.where(rng.random(n) < 0.6, 0.0, rng.exponential(size=n)),
            np.where(rng.random(n) < 0.5, -0.0, 1.5),
            rng.normal(size=n),
        ]
    )


# ---------------------------------------------------------------- binning


def test_sketch_is_exact_and_independent_of_partitioning_and_merge_order():
    rng = np.random.default_rng(0)
    n = 3000
    X = _mixed_matrix(rng, n)
    w = rng.uniform(0.1, 3.0, n)
    wexp = histogram.weight_exponent(float(w.max()), n)
    for fraction in (1.0, 0.3):
        ref = binning.summarize(X, w, weight_exp=wexp, fraction=fraction, seed=5)
        for k in (1, 3, 7):
            parts = _parts(n, k, rng)
            sketches = [
                binning.summarize(X[p], w[p], weight_exp=wexp, row_ids=p, fraction=fraction, seed=5)
                for p in parts
            ]
            order = rng.permutation(k)
            sequential = sketches[order[0]]
            for i in order[1:]:
                sequential = sequential.merge(sketches[i])
            for merged in (sequential, binning.merge_sketches([sketches[i] for i in order])):
                for name in ("indptr", "values", "weights", "counts"):
                    assert np.array_equal(getattr(merged, name), getattr(ref, name)), name
    # content: exactly the distinct values of each column with their counts and weights
    ref = binning.summarize(X, w, weight_exp=wexp)
    qw = np.rint(np.ldexp(w, wexp)).astype(np.int64)
    for j in range(X.shape[1]):
        vals, _, cnts = ref.feature(j)
        col = X[:, j] + 0.0
        uniq, inv, cnt = np.unique(col, return_inverse=True, return_counts=True)
        assert np.array_equal(vals, uniq) and np.array_equal(cnts, cnt)
        exact = np.array([int(qw[inv == i].sum()) for i in range(uniq.size)])
        assert np.array_equal(ref.weights[ref.indptr[j] : ref.indptr[j + 1]], exact)
    assert not np.signbit(ref.feature(3)[0]).any()  # -0.0 folded into 0.0
    # equal weights (none given, or all 2.0) take a value's weight as count x weight
    for equal, q in ((None, 1 << wexp), (np.full(n, 2.0), 2 << wexp)):
        same = binning.summarize(X, equal, weight_exp=wexp)
        for name in ("indptr", "values", "counts"):
            assert np.array_equal(getattr(same, name), getattr(ref, name)), name
        assert same.weights.dtype == np.int64 and np.array_equal(same.weights, ref.counts * q)
    for empty, f in ((binning.summarize(X[:0], None, weight_exp=wexp), X.shape[1]),
                     (binning.summarize(X[:, :0], w, weight_exp=wexp), 0)):  # fmt: skip
        assert np.array_equal(empty.indptr, np.zeros(f + 1)) and empty.values.size == 0
        dtypes = [a.dtype for a in (empty.indptr, empty.values, empty.weights, empty.counts)]
        assert dtypes == [np.int64, np.float64, np.int64, np.int64]
    sampled = binning.summarize(X, w, weight_exp=wexp, fraction=0.3, seed=5)
    assert 0.25 * n < sampled.counts[sampled.indptr[0] : sampled.indptr[1]].sum() < 0.35 * n


def test_csr_sketch_and_bins_equal_dense():
    rng = np.random.default_rng(7)
    n = 500
    X = _mixed_matrix(rng, n)
    X[3, 1] = 0.0
    w = rng.uniform(0.5, 2.0, n)
    nz = X != 0.0
    nz[10, 2] = True  # an explicit zero stored in the CSR rows
    indptr = np.r_[0, np.cumsum(nz.sum(1))]
    indices = np.nonzero(nz)[1]
    values = X[nz]
    for fraction in (1.0, 0.5):
        dense = binning.summarize(X, w, weight_exp=50, fraction=fraction, seed=2)
        sparse = binning.summarize_csr(
            indptr, indices, values, X.shape[1], w, weight_exp=50, fraction=fraction, seed=2
        )
        for name in ("indptr", "values", "weights", "counts"):
            assert np.array_equal(getattr(dense, name), getattr(sparse, name)), name
    thr = binning.split_thresholds(binning.summarize(X, w, weight_exp=50), 8)
    assert np.array_equal(binning.bin_csr(indptr, indices, values, thr), binning.bin_matrix(X, thr))


def _mllib_find_splits(col: np.ndarray, w: np.ndarray, num_splits: int) -> np.ndarray:
    """Literal port of MLlib's findSplitsForContinuousFeature (plain loops; reference only)."""
    value_weights: dict[float, float] = {}
    count = 0
    for v, wi in zip(col, w, strict=True):
        if v != 0.0:
            value_weights[v] = value_weights.get(v, 0.0) + wi
            count += 1
    if not value_weights:
        return np.empty(0)
    weighted_num = float(np.sum(w))
    part = sum(value_weights.values())
    if weighted_num - part > np.finfo(float).eps * count * 100:
        value_weights[0.0] = weighted_num - part
    vc = sorted(value_weights.items())
    possible = len(vc) - 1
    if possible == 0:
        return np.empty(0)
    if possible <= num_splits:
        return np.array([(vc[i - 1][0] + vc[i][0]) / 2.0 for i in range(1, len(vc))])
    stride = weighted_num / (num_splits + 1)
    splits, current, target = [], vc[0][1], stride
    for i in range(1, len(vc)):
        previous = current
        current += vc[i][1]
        if abs(previous - target) < abs(current - target):
            splits.append((vc[i - 1][0] + vc[i][0]) / 2.0)
            target += stride
    return np.array(splits)


@pytest.mark.parametrize("max_bins", [4, 32, 100])
def test_split_thresholds_follow_mllib_choice(max_bins):
    rng = np.random.default_rng(max_bins)
    n = 4000
    X = _mixed_matrix(rng, n)
    w = rng.integers(1, 9, n) * 0.25  # dyadic weights: float sums are exact, as ours are
    for weights in (np.ones(n), w):
        wexp = histogram.weight_exponent(float(weights.max()), n)
        thr = binning.split_thresholds(binning.summarize(X, weights, weight_exp=wexp), max_bins)
        for j in range(X.shape[1]):
            expected = _mllib_find_splits(X[:, j] + 0.0, weights, max_bins - 1)
            assert np.array_equal(thr[j], expected), (j, thr[j], expected)
            assert thr[j].size <= max_bins - 1 and np.all(np.diff(thr[j]) > 0)
    few = binning.split_thresholds(binning.summarize(X[:, :1], None, weight_exp=40), 32)[0]
    assert np.array_equal(few, [0.5, 1.5, 2.5, 3.5, 4.5])  # midpoints of distinct values
    with pytest.raises(ValueError, match="maxBins"):
        binning.split_thresholds(binning.summarize(X, None, weight_exp=40), 0)


@pytest.mark.parametrize("max_bins", [3, 32, 200])
def test_split_walk_on_skewed_weights_follows_mllib(max_bins):
    """Heavy values at the bottom, middle and top of a feature: MLlib's greedy walk skips
    targets, takes consecutive candidates, and runs out of candidates before its targets."""
    rng = np.random.default_rng(max_bins)
    n = 3000
    X = np.column_stack(
        [
            np.where(rng.random(n) < 0.6, -3.0, rng.normal(size=n)),  # heavy bottom
            np.where(rng.random(n) < 0.6, 9.0, rng.normal(size=n)),  # heavy top
            np.where(rng.random(n) < 0.4, 0.5, np.round(rng.normal(size=n), 1)),  # middle
            rng.integers(0, max_bins + 3, n).astype(float),  # just more values than bins
        ]
    )
    for weights in (np.ones(n), rng.integers(1, 9, n) * 0.25):
        wexp = histogram.weight_exponent(float(weights.max()), n)
        thr = binning.split_thresholds(binning.summarize(X, weights, weight_exp=wexp), max_bins)
        for j in range(X.shape[1]):
            expected = _mllib_find_splits(X[:, j], weights, max_bins - 1)
            assert np.array_equal(thr[j], expected), (j, thr[j], expected)


def test_bin_matrix_semantics_and_dtype():
    rng = np.random.default_rng(1)
    X = rng.normal(size=(300, 3))
    X[5, 1] = np.nan
    thresholds = [np.sort(rng.normal(size=k)) for k in (1, 7, 0)]
    thresholds[0][:] = X[0, 0]  # a value exactly on a threshold goes to the lower bin
    b = binning.bin_matrix(X, thresholds)
    assert b.dtype == np.uint8 and b.flags.f_contiguous
    for i in range(X.shape[0]):
        for j, thr in enumerate(thresholds):
            x = X[i, j]
            expected = thr.size if np.isnan(x) else int(np.sum(thr < x))
            assert b[i, j] == expected
            if 0 < expected < thr.size:
                assert thr[expected - 1] < x <= thr[expected]
    assert b[0, 0] == 0
    wide = binning.bin_matrix(X[:, :1], [np.linspace(-3, 3, 400)])
    assert wide.dtype == np.uint16 and np.array_equal(
        wide[:, 0], np.searchsorted(np.linspace(-3, 3, 400), X[:, 0])
    )
    with pytest.raises(ValueError, match="features"):
        binning.bin_matrix(X, thresholds[:2])


# ---------------------------------------------------------------- histograms


def test_choose_scale_keeps_every_sum_inside_int64():
    for n_rows in (1, 2, 1000, 10**8, 2**27):
        scale = histogram.choose_scale(-3.0, 5.0, 7.5, n_rows)
        k = (n_rows - 1).bit_length()
        y = np.array([-3.0, 5.0, 1.0, 4.999999])
        q = histogram.quantize_rows(y, np.full(4, 7.5), scale)
        assert np.abs(q).max() <= 2 ** (62 - k)  # so n_rows rows sum to at most 2**62
        assert (2**k) * int(np.abs(q).max()) <= 2**62
    scale = histogram.choose_scale(-1.0, 1.0, 1.0, 5000)
    assert scale.center == 0.0 and scale.target_exp == 0  # labels +-1 map to u = +-1
    q = histogram.quantize_rows(np.array([1.0, -1.0]), np.array([0.3, 0.7]), scale)
    assert np.array_equal(q[1], [q[0, 0], -q[0, 1]]) and np.array_equal(q[2], q[0])
    with pytest.raises(ValueError, match="outside"):
        histogram.quantize_rows(np.array([9.0]), np.ones(1), scale)
    with pytest.raises(ValueError, match="target_min"):
        histogram.choose_scale(2.0, 1.0, 1.0, 10)


def _dense_reference(bins, slots, q, n_slots, n_bins):
    out = np.zeros((n_slots, bins.shape[1], n_bins, 4), dtype=object)
    out[...] = 0
    for i in range(bins.shape[0]):
        if slots[i] < 0:
            continue
        for j in range(bins.shape[1]):
            cell = out[slots[i], j, bins[i, j]]
            cell[0] += 1
            for k in range(3):
                cell[k + 1] += int(q[k, i])
    return out.astype(np.int64)


def test_histograms_match_dense_loop_and_subtraction_is_exact():
    rng = np.random.default_rng(2)
    n, f, n_bins, n_slots = 400, 4, 6, 3
    bins = np.asfortranarray(rng.integers(0, n_bins, (n, f)).astype(np.uint8))
    slots = rng.integers(-1, n_slots, n)
    y, w = rng.normal(size=n) * 50, rng.uniform(0, 4, n)
    scale = histogram.choose_scale(y.min(), y.max(), w.max(), n)
    q = histogram.quantize_rows(y, w, scale)
    h = histogram.build_histograms(bins, slots, q, n_slots, n_bins)
    assert h.dtype == np.int64 and np.array_equal(
        h, _dense_reference(bins, slots, q, n_slots, n_bins)
    )
    ones = np.ones(n)
    q1 = histogram.quantize_rows(y, ones, scale)
    fast = histogram.build_histograms(
        bins, slots, q1, n_slots, n_bins, unit_weight=histogram.unit_weight(ones, scale)
    )
    assert np.array_equal(fast, histogram.build_histograms(bins, slots, q1, n_slots, n_bins))
    # parent (all rows of slot 0 and 1) split by feature 2 <= 2 into children
    parent_slot = np.where(slots >= 0, slots % 2, -1)
    parent = histogram.build_histograms(bins, parent_slot, q, 2, n_bins)
    go_left = bins[:, 2] <= 2
    left_direct = histogram.build_histograms(bins, np.where(go_left, parent_slot, -1), q, 2, n_bins)
    right_direct = histogram.build_histograms(
        bins, np.where(~go_left, parent_slot, -1), q, 2, n_bins
    )
    small_is_left = np.array([True, False])
    small = np.where(small_is_left[:, None, None, None], left_direct, right_direct)
    lh, rh = histogram.derive_children(parent, small, small_is_left)
    assert np.array_equal(lh, left_direct) and np.array_equal(rh, right_direct)
    count, weight, mean, var = histogram.stats_to_moments(histogram.node_totals(parent), scale)
    sel = parent_slot == 0
    assert count[0] == sel.sum()
    assert np.isclose(weight[0], w[sel].sum(), rtol=1e-12)
    ref_mean = np.average(y[sel], weights=w[sel])
    assert np.isclose(mean[0], ref_mean, rtol=1e-12)
    assert np.isclose(var[0], np.average((y[sel] - ref_mean) ** 2, weights=w[sel]), rtol=1e-9)


# ---------------------------------------------------------------- split finding


def _brute_force(hist, scale, min_inst, min_w, min_gain, mask=None):
    """MLlib's calculateImpurityStats literally, on float stats, looping over everything."""
    best = []
    for node in range(hist.shape[0]):
        choice = (-np.inf, -1, -1)
        for j in range(hist.shape[1]):
            if mask is not None and not mask[node, j]:
                continue
            for b in range(hist.shape[2]):
                left, right = hist[node, j, : b + 1].sum(0), hist[node, j, b + 1 :].sum(0)
                cnt, wt, _, var = histogram.stats_to_moments(
                    np.stack([left, right, left + right]), scale
                )
                if min(cnt[0], cnt[1]) < max(min_inst, 1) or min(wt[0], wt[1]) < min_w:
                    continue
                gain = var[2] - wt[0] / wt[2] * var[0] - wt[1] / wt[2] * var[1]
                if gain >= min_gain and gain > choice[0] + 1e-9 * abs(gain):
                    choice = (gain, j, b)
        best.append(choice)
    return best


@pytest.mark.parametrize(
    "min_inst,min_w,min_gain", [(1, 0.0, 0.0), (40, 0.0, 0.0), (1, 30.0, 0.0), (1, 0.0, 0.05)]
)
def test_best_splits_matches_brute_force(min_inst, min_w, min_gain):
    rng = np.random.default_rng(min_inst)
    n, f, n_bins, n_nodes = 600, 5, 7, 4
    bins = np.asfortranarray(rng.integers(0, n_bins, (n, f)).astype(np.uint8))
    y = bins[:, 1] * 0.3 - bins[:, 3] * 0.2 + rng.normal(size=n) + 10.0
    w = rng.uniform(0.5, 2.0, n)
    slots = rng.integers(0, n_nodes, n)
    scale = histogram.choose_scale(y.min(), y.max(), w.max(), n)
    hist = histogram.build_histograms(
        bins, slots, histogram.quantize_rows(y, w, scale), n_nodes, n_bins
    )
    mask = rng.random((n_nodes, f)) < 0.7
    for m in (None, mask):
        res = best_splits(
            hist,
            0,
            min_instances_per_node=min_inst,
            min_weight_per_node=min_w,
            min_info_gain=min_gain,
            feature_mask=m,
            scale=scale,
        )
        ref = _brute_force(hist, scale, min_inst, min_w, min_gain, m)
        assert res.dtype == SPLIT_DTYPE
        for node, (gain, j, b) in enumerate(ref):
            r = res[node]
            assert (r["feature"], r["bin"]) == (j, b)
            if j >= 0:
                assert np.isclose(r["gain"], gain, rtol=1e-9)
                assert np.array_equal(r["left"], hist[node, j, : b + 1].sum(0))
                assert np.array_equal(r["left"] + r["right"], r["total"])
            else:
                assert r["gain"] == -np.inf
    # shards own feature ranges; merging in any order gives the unsharded answer
    full = best_splits(hist, 0, scale=scale)
    cuts = [(0, 2), (2, 3), (3, 5)]
    shard_res = [best_splits(hist[:, a:b], a, scale=scale) for a, b in cuts]
    for order in ([0, 1, 2], [2, 0, 1]):
        assert merge_best([shard_res[i] for i in order]).tobytes() == full.tobytes()


def test_best_splits_tie_breaking_and_invalid_nodes():
    hist = np.zeros((2, 3, 3, 4), dtype=np.int64)  # plain units: [count, w, sum y, sum y^2]
    plus, minus = [1, 1, 1, 1], [1, 1, -1, 1]
    hist[0, 0] = [plus, plus, minus]  # best: bin 1, {+1,+1} | {-1}
    hist[0, 1] = hist[0, 2] = [minus, plus, plus]  # best: bin 0, {-1} | {+1,+1}: same gain
    hist[1, :, 1] = [3, 3, 3, 3]  # node 1: every row in one bin, so no valid split
    res = best_splits(hist, 10)
    assert res[0]["feature"] == 10 and res[0]["bin"] == 1  # exact tie: lowest feature wins
    assert np.isclose(res[0]["gain"], 8 / 9)
    res_no0 = best_splits(hist, 10, feature_mask=np.array([[False, True, True]] * 2))
    assert (
        res_no0[0]["feature"] == 11
        and res_no0[0]["bin"] == 0
        and res_no0[0]["gain"] == (res[0]["gain"])
    )
    assert res[1]["feature"] == -1 and res[1]["gain"] == -np.inf
    assert np.array_equal(res[1]["total"], [3, 3, 3, 3])
    pure = np.zeros((1, 1, 3, 4), dtype=np.int64)
    pure[0, 0] = [[3, 3 << 40, 3 * 123456789, 0], [5, 5 << 40, 5 * 123456789, 0], [0, 0, 0, 0]]
    assert best_splits(pure, 0)[0]["gain"] == 0.0  # equal means: no gain despite rounding
    with pytest.raises(ValueError, match="int64"):
        best_splits(hist.astype(float), 0)


# ---------------------------------------------------------------- trees


def _hand_tree() -> TreeArrays:
    return TreeArrays(
        feature=[3, -1, 0, -1, -1],
        threshold=[1.5, 0.0, 1e-4, 0.0, 0.0],
        left=[1, -1, 3, -1, -1],
        right=[2, -1, 4, -1, -1],
        value=[0.5, 0.25, 0.75, 12345678.0, -1.0],
        impurity=[1.0, 0.0, 0.5, 0.0, -1.0],
        gain=[0.3, -1.0, 0.2, -1.0, -1.0],
        count=[10.0, 4.0, 6.0, 3.0, 3.0],
        raw_count=[10, 4, 6, 3, 3],
    )


def test_tree_arrays_predict_debug_string_and_round_trip():
    t = _hand_tree()
    X = np.random.default_rng(3).normal(size=(50, 4)) * 2
    X[0] = [1e-4, 0, 0, 1.5]  # exactly on both thresholds: goes left both times
    for i in range(X.shape[0]):
        node = 0
        while t.feature[node] >= 0:
            node = t.left[node] if X[i, t.feature[node]] <= t.threshold[node] else t.right[node]
        assert t.predict_leaf(X)[i] == node and t.predict(X)[i] == t.value[node]
    assert t.predict_leaf(X)[0] == 1
    assert t.to_debug_string(2) == (
        "  If (feature 3 <= 1.5)\n"
        "   Predict: 0.25\n"
        "  Else (feature 3 > 1.5)\n"
        "   If (feature 0 <= 1.0E-4)\n"
        "    Predict: 1.2345678E7\n"
        "   Else (feature 0 > 1.0E-4)\n"
        "    Predict: -1.0\n"
    )
    assert ensemble_debug_string([t], [0.1], "M").startswith("M\n  Tree 0 (weight 0.1):\n    If (")
    assert TreeArrays.from_dict(t.to_dict()) == t
    assert t.depth == 2 and t.num_nodes == 5 and t.num_leaves == 3
    assert np.array_equal(t.leaf_index(), [-1, 0, -1, 1, 2])
    for x, s in [
        (0.001, "0.001"),
        (9999999.0, "9999999.0"),
        (1e7, "1.0E7"),
        (-2.5e-5, "-2.5E-5"),
        (100.0, "100.0"),
        (0.1 + 0.2, "0.30000000000000004"),
        (1.5e300, "1.5E300"),
    ]:
        assert java_double_str(x) == s
    with pytest.raises(ValueError, match="follow their parent"):
        TreeArrays([0, -1], [0, 0], [0, -1], [1, -1], [0, 0], [0, 0], [0, 0], [1, 1])
    with pytest.raises(ValueError, match="splits on feature 3"):
        t.predict(np.zeros((2, 2)))


def test_pruning_merges_equal_sibling_leaves_like_mllib():
    # depth-2 tree whose right subtree has two equal leaves -> becomes a leaf
    t = TreeArrays(
        feature=[0, -1, 1, -1, -1],
        threshold=[0.5, 0, 0.5, 0, 0],
        left=[1, -1, 3, -1, -1],
        right=[2, -1, 4, -1, -1],
        value=[0.0, -1.0, 1.0, 1.0, 1.0],
        impurity=[0.9, 0.0, 0.4, 0.0, 0.0],
        gain=[0.5, -1, 0.1, -1, -1],
        count=[4, 2, 2, 1, 1],
    )
    p = local._prune(t)
    assert p.num_nodes == 3 and p.feature.tolist() == [0, -1, -1]
    assert p.impurity[2] == 0.4 and p.gain[2] == -1.0 and p.value[2] == 1.0
    assert np.array_equal(p.predict(np.array([[0.0, 0.0], [1.0, 0.0], [1.0, 1.0]])), [-1, 1, 1])


def test_losses_match_mllib_formulas():
    pred = np.array([-3.0, -0.2, 0.0, 0.4, 800.0])
    lab = np.array([1.0, -1.0, 1.0, -1.0, -1.0])
    lg = get_loss("logistic")
    assert np.allclose(lg.gradient(pred, lab), -4 * lab / (1 + np.exp(2 * lab * pred)))
    assert np.allclose(lg.error(pred[:4], lab[:4]), 2 * np.log1p(np.exp(-2 * lab[:4] * pred[:4])))
    assert np.isfinite(lg.error(pred, lab)).all() and lg.error(pred, lab)[4] == 3200.0
    assert np.array_equal(get_loss("squared").gradient(pred, lab), -2 * (lab - pred))
    assert np.array_equal(
        get_loss("Absolute").gradient(np.array([1.0, 1.0]), np.array([1.0, 0.0])), [-1.0, 1.0]
    )
    assert np.allclose(log1p_exp(np.array([-50.0, 0.0, 50.0])), np.logaddexp(0, [-50.0, 0.0, 50.0]))
    prob = margin_to_probability(np.array([0.0, 1.0]))
    assert np.allclose(prob[:, 1], 1 / (1 + np.exp(-2 * np.array([0.0, 1.0]))))
    assert np.array_equal(margin_to_raw_prediction(np.array([2.0])), [[-2.0, 2.0]])
    assert np.array_equal(remap_labels(np.array([0.0, 1.0])), [-1.0, 1.0])
    with pytest.raises(ValueError, match="row 1 has label 2"):
        remap_labels(np.array([0.0, 2.0]))
    with pytest.raises(ValueError, match="lossType 'hinge'"):
        get_loss("hinge")


# ---------------------------------------------------------------- determinism across partitions


def _fit_partitioned(X, y, w, params, k, rng):
    """The distributed recipe with k partitions, summing partial results in shuffled order."""
    p = local.resolve_params(params)
    loss = get_loss(p.lossType)
    labels = remap_labels(y) if loss.is_classification else y
    n = X.shape[0]
    parts = _parts(n, k, rng)
    wexp = histogram.weight_exponent(float(max(w[q].max() for q in parts if q.size)), n)
    frac = binning.sketch_fraction(n, p.maxBins)
    sketches = [
        binning.summarize(X[q], w[q], weight_exp=wexp, row_ids=q, fraction=frac, seed=p.seed)
        for q in parts
    ]
    thresholds = binning.split_thresholds(
        binning.merge_sketches([sketches[i] for i in rng.permutation(k)]), p.maxBins
    )
    bins = [binning.bin_matrix(X[q], thresholds) for q in parts]
    n_bins = max(t.size for t in thresholds) + 1
    qtot = sum(int(np.rint(np.ldexp(w[q], wexp)).astype(np.int64).sum()) for q in parts)
    min_w = p.minWeightFractionPerNode * np.ldexp(float(qtot), -wexp)
    pred, trees = np.zeros(n), []
    for m in range(p.maxIter):
        targets = labels if m == 0 else -loss.gradient(pred, labels)
        lo = min(targets[q].min() for q in parts if q.size)
        hi = max(targets[q].max() for q in parts if q.size)
        scale = local.tree_scale(loss, m, lo, hi, float(w.max()), n)
        qs = [histogram.quantize_rows(targets[q], w[q], scale) for q in parts]
        in_sample = binning.row_uniform(np.arange(n), p.seed + m) < p.subsamplingRate
        b = local.TreeBuilder(
            thresholds,
            scale,
            max_depth=p.maxDepth,
            min_instances_per_node=p.minInstancesPerNode,
            min_weight_per_node=min_w,
            seed=p.seed + m,
            features_per_node=local.features_per_node(p.featureSubsetStrategy, X.shape[1]),
        )

        def hist_fn(slot, n_slots, qs=qs):
            partial = [
                histogram.build_histograms(bins[i], slot[q], qs[i], n_slots, n_bins)
                for i, q in enumerate(parts)
            ]
            total = np.zeros_like(partial[0])
            for i in rng.permutation(k):
                total += partial[i]
            return total

        full_bins = np.asfortranarray(np.vstack(bins)[np.argsort(np.concatenate(parts))])
        leaf = local.grow_tree(
            full_bins, np.zeros((3, n), np.int64), in_sample, b, n_bins, hist_fn=hist_fn
        )
        trees.append(b.finish())
        pred = pred + b.node_values()[leaf] * (1.0 if m == 0 else p.stepSize)
    return trees


def test_trees_identical_for_any_partitioning_and_summation_order():
    rng = np.random.default_rng(4)
    n = 3000
    X = _mixed_matrix(rng, n)
    y = (X[:, 1] + X[:, 2] * 0.5 + rng.normal(size=n) > 0.3).astype(float)
    w = rng.uniform(0.2, 3.0, n)  # non-dyadic: float sums would depend on order
    params = {
        "lossType": "logistic",
        "maxIter": 4,
        "maxDepth": 4,
        "maxBins": 16,
        "seed": 9,
        "subsamplingRate": 0.8,
        "featureSubsetStrategy": "0.8",
        "minWeightFractionPerNode": 0.01,
    }
    local_trees, _, _ = local.fit_gbt_local(X, y, w, params)
    for k in (1, 3, 7):
        trees = _fit_partitioned(X, y, w, params, k, rng)
        assert len(trees) == len(local_trees)
        for a, b in zip(trees, local_trees, strict=True):
            assert a == b  # every field bit-identical
    assert local_trees[0].num_nodes > 7


# ---------------------------------------------------------------- trainer behaviour


def test_early_stopping_follows_mllib_rule_and_params_are_validated():
    rng = np.random.default_rng(6)
    X = rng.normal(size=(600, 3))
    y = X[:, 0] + rng.normal(size=600) * 2
    Xv = rng.normal(size=(300, 3))
    yv = Xv[:, 0] + rng.normal(size=300) * 2
    params = {"maxIter": 30, "maxDepth": 4, "stepSize": 0.5, "validationTol": 0.001}
    trees, tw, hist = local.fit_gbt_local(X, y, None, params, validation=(Xv, yv, None))
    errs = hist["validation_loss"]
    best, best_m = errs[0], 1
    for m in range(1, len(errs)):
        if best - errs[m] < 0.001 * max(errs[m], 0.01):
            assert m == len(errs) - 1  # stopped right here
            break
        if errs[m] < best:
            best, best_m = errs[m], m + 1
    assert len(trees) == best_m < 30 and len(tw) == best_m
    ev = local.evaluate_each_iteration(trees, tw, Xv, yv, "squared")
    assert np.allclose(ev, errs[:best_m], rtol=1e-12)
    for bad, match in [
        ({"maxDepth": 31}, "maxDepth"),
        ({"stepSize": 0.0}, "stepSize"),
        ({"featureSubsetStrategy": "half"}, "featureSubsetStrategy"),
        ({"minWeightFractionPerNode": 0.5}, "minWeightFractionPerNode"),
        ({"maxbins": 3}, "maxbins"),
    ]:
        with pytest.raises(ValueError, match=match):
            local.fit_gbt_local(X, y, None, bad)
    with pytest.raises(ValueError, match="labels 0 or 1"):
        local.fit_gbt_local(X, y, None, {"lossType": "logistic"})
    bad_x = X.copy()
    bad_x[7, 2] = np.nan
    with pytest.raises(ValueError, match=r"features at index \(7, 2\)"):
        local.fit_gbt_local(bad_x, y, None, {})
    assert [
        local.features_per_node(s, 10)
        for s in ("auto", "sqrt", "log2", "onethird", "3", "0.25", "1.0")
    ] == [10, 4, 4, 4, 3, 3, 10]


def test_degenerate_inputs_give_mllib_leaves():
    rng = np.random.default_rng(8)
    X = rng.normal(size=(200, 3))
    y = X[:, 0] + rng.normal(size=200)
    trees, _, _ = local.fit_gbt_local(X[:1], y[:1], None, {"maxIter": 2})  # one row
    assert trees[0].num_nodes == 1 and trees[0].value[0] == y[0] and trees[0].impurity[0] == -1
    const = np.ones((200, 3))  # no candidate split at all: MLlib's invalid leaf, impurity -1
    trees, _, _ = local.fit_gbt_local(const, y, None, {"maxIter": 1})
    assert trees[0].num_nodes == 1 and trees[0].impurity[0] == -1.0
    assert np.isclose(trees[0].value[0], y.mean(), rtol=1e-12)
    trees, _, _ = local.fit_gbt_local(X, y, None, {"maxIter": 1, "maxDepth": 0})
    assert trees[0].num_nodes == 1 and np.isclose(trees[0].impurity[0], y.var(), rtol=1e-9)
    same = np.ones(200)  # one class only: pure root, gain 0, a valid leaf
    trees, _, _ = local.fit_gbt_local(X, same, None, {"maxIter": 2, "lossType": "logistic"})
    assert trees[0].num_nodes == 1 and trees[0].value[0] == 1.0 and trees[0].impurity[0] == 0.0
    w = np.where(np.arange(200) < 100, 0.0, 1.0)  # zero weights: rows count, weigh nothing
    trees, _, _ = local.fit_gbt_local(X, y, w, {"maxIter": 1, "maxDepth": 2})
    assert np.isclose(trees[0].value[0], y[100:].mean(), rtol=1e-12)
    assert trees[0].count[0] == 100.0 and trees[0].raw_count[0] == 200


# ---------------------------------------------------------------- MLlib parity


def _numbers(text: str) -> tuple[str, np.ndarray]:
    pattern = r"-?\d+\.\d+(?:E-?\d+)?"
    return re.sub(pattern, "#", text), np.array([float(v) for v in re.findall(pattern, text)])


def _assert_same_trees(mllib_model, trees, weights):
    ours = ensemble_debug_string(trees, weights, "")
    theirs = mllib_model.toDebugString.split("\n", 1)[1]
    (s1, v1), (s2, v2) = _numbers("\n" + ours.split("\n", 1)[1]), _numbers("\n" + theirs)
    assert s1 == s2  # same structure, features, and (below) thresholds/leaf values
    assert np.allclose(v1, v2, rtol=1e-9, atol=1e-12)


@pytest.fixture(scope="module")
def parity_data(spark):
    """2500 rows, 5 features: four with 10 distinct values, one continuous (< 10000 rows, so
    MLlib bins from all rows, as we do); labels for both tasks, weights, a validation flag."""
    from pyspark.ml.linalg import Vectors

    rng = np.random.default_rng(0)
    n, f = 2500, 5
    X = rng.integers(0, 10, (n, f)).astype(float)
    X[:, 4] = np.round(rng.normal(size=n), 2)
    z = 0.6 * X[:, 0] - 0.4 * X[:, 1] + 0.3 * X[:, 2] * (X[:, 3] > 4) + X[:, 4]
    y = (z + rng.normal(0, 1.5, n) > np.median(z)).astype(float)
    yr = z + rng.normal(0, 0.5, n)
    w = rng.integers(1, 5, n) * 0.5
    val = rng.random(n) < 0.25
    rows = [
        (Vectors.dense(X[i]), float(y[i]), float(yr[i]), float(w[i]), bool(val[i]))
        for i in range(n)
    ]
    df = spark.createDataFrame(rows, ["features", "label", "yr", "w", "val"]).coalesce(2).cache()
    return df, X, y, yr, w, val


@pytest.mark.timeout(300)
def test_matches_mllib_gbt_classifier(parity_data):
    from pyspark.ml.classification import GBTClassifier

    df, X, y, _, w, _ = parity_data
    clf = GBTClassifier(maxIter=5, maxDepth=3, seed=7, weightCol="w", leafCol="leaf").fit(df)
    out = clf.transform(df).select("probability", "rawPrediction", "leaf").collect()
    trees, tw, _ = local.fit_gbt_local(
        X, y, w, {"lossType": "logistic", "maxIter": 5, "maxDepth": 3, "seed": 7}
    )
    margin = local.predict_margin(trees, tw, X)
    assert (
        np.abs(
            np.array([r.probability.toArray() for r in out]) - margin_to_probability(margin)
        ).max()
        < 1e-9
    )
    assert (
        np.abs(
            np.array([r.rawPrediction.toArray() for r in out]) - margin_to_raw_prediction(margin)
        ).max()
        < 1e-9
    )
    assert np.array_equal(np.array([r.leaf.toArray() for r in out]), local.predict_leaf(trees, X))
    assert np.allclose(
        clf.featureImportances.toArray(), local.feature_importances(trees, 5), rtol=1e-9, atol=1e-12
    )
    assert np.array_equal(clf.treeWeights, tw)
    _assert_same_trees(clf, trees, tw)


@pytest.mark.timeout(300)
def test_matches_mllib_gbt_regressor_with_validation(parity_data):
    from pyspark.ml.regression import GBTRegressor

    df, X, _, yr, w, val = parity_data
    params = {
        "maxIter": 8,
        "maxDepth": 3,
        "seed": 3,
        "stepSize": 0.5,
        "validationTol": 0.1,
        "minInstancesPerNode": 5,
        "maxBins": 24,
    }
    reg = GBTRegressor(labelCol="yr", weightCol="w", validationIndicatorCol="val", **params)
    reg = reg.fit(df)
    tr = ~val
    trees, tw, hist = local.fit_gbt_local(
        X[tr], yr[tr], w[tr], params, validation=(X[val], yr[val], w[val])
    )
    assert reg.getNumTrees == len(trees) < len(hist["validation_loss"]) < 8  # stopped early
    pred = np.array([r.prediction for r in reg.transform(df).select("prediction").collect()])
    assert np.abs(pred - local.predict_margin(trees, tw, X)).max() < 1e-9
    assert np.allclose(
        reg.featureImportances.toArray(), local.feature_importances(trees, 5), rtol=1e-9, atol=1e-12
    )
    _assert_same_trees(reg, trees, tw)


@pytest.mark.parametrize("equal", [False, True])
@pytest.mark.parametrize("n_threads", [1, 2, 3])
@pytest.mark.parametrize("rows", [0, 1, 500])
def test_dense_summary_equals_the_pairwise_reduce(rows, n_threads, equal):
    """The dense summary sorts each column on its own (on `n_threads`, without the order
    when the weights are equal); it must hold exactly what one sort of every (feature,
    value) pair gives: -0.0 folded into 0.0, ties summed, weights exact."""
    rng = np.random.default_rng(rows)
    X = np.round(rng.normal(size=(rows, 5)), 1)
    X[: rows // 3, 2] = -0.0
    X[rows // 3 :, 4] = 0.0
    w = np.full(rows, 0.75) if equal else rng.random(rows) + 0.25
    got = binning.summarize(X, w, weight_exp=40, n_threads=n_threads)
    qw = np.rint(np.ldexp(w, 40)).astype(np.int64)
    feat = np.repeat(np.arange(5, dtype=np.int64), rows)
    want = binning._reduce(
        feat, X.T.ravel() + 0.0, np.tile(qw, 5), np.ones(5 * rows, np.int64), 5, 40
    )
    for name in ("indptr", "values", "weights", "counts"):
        a, b = getattr(got, name), getattr(want, name)
        assert a.dtype == b.dtype and np.array_equal(a.view(np.uint8), b.view(np.uint8)), name
