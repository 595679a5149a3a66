"""The compiled histogram/routing passes agree bit for bit with the numpy reference."""

from __future__ import annotations

import numpy as np
import pytest

from spark_ps.ml import threads
from spark_ps.ml.tree import histogram as H
from spark_ps.ml.tree import kernels as K
from spark_ps.ml.tree.local import route_rows

pytestmark = pytest.mark.skipif(not K.HAVE_JIT, reason="numba not installed")


def _numpy_route(bins, node_of_row, feature, split_bin, left, right, now):
    node = node_of_row.copy()
    rows = np.flatnonzero(now[node])
    nodes = node[rows]
    go_left = bins[rows, feature[nodes]] <= split_bin[nodes]
    node[rows] = np.where(go_left, left[nodes], right[nodes])
    return node


@pytest.mark.parametrize("dtype,n_bins", [(np.uint8, 32), (np.uint16, 300)])
@pytest.mark.parametrize("order", ["C", "F"])
@pytest.mark.parametrize("n_slots", [1, 7])
def test_histograms_equal_numpy(dtype, n_bins, order, n_slots):
    rng = np.random.default_rng(n_slots + n_bins)
    n, f = 5000, 6
    bins = np.asarray(rng.integers(0, n_bins, (n, f)), dtype=dtype, order=order)
    slot = rng.integers(-1, n_slots, n).astype(np.int32)
    scale = H.choose_scale(-3.0, 2.0, 4.0, n)
    stats = H.quantize_rows(rng.uniform(-3, 2, n), rng.uniform(0, 4, n), scale)
    got = H.build_histograms(bins, slot, stats, n_slots, n_bins)
    want = H._numpy_histograms(bins, slot, stats, n_slots, n_bins, None)
    assert got.dtype == np.int64 and got.shape == (n_slots, f, n_bins, 4)
    np.testing.assert_array_equal(got, want)
    assert got[..., 0].sum() == f * np.count_nonzero(slot >= 0)  # every kept row, once


def test_histograms_unit_weight_and_empty():
    bins = np.zeros((0, 3), np.uint8)
    out = H.build_histograms(bins, np.zeros(0, np.int32), np.zeros((3, 0), np.int64), 2, 4)
    assert out.shape == (2, 3, 4, 4) and not out.any()
    rng = np.random.default_rng(1)
    bins = rng.integers(0, 4, (100, 3)).astype(np.uint8)
    w = np.ones(100)
    scale = H.choose_scale(-1.0, 1.0, 1.0, 100)
    stats = H.quantize_rows(rng.choice([-1.0, 1.0], 100), w, scale)
    unit = H.unit_weight(w, scale)
    slot = np.zeros(100, np.int32)
    got = H.build_histograms(bins, slot, stats, 1, 4, unit_weight=unit)
    np.testing.assert_array_equal(got[..., 1], got[..., 0] * unit)
    np.testing.assert_array_equal(got, H._numpy_histograms(bins, slot, stats, 1, 4, unit))


def test_histograms_of_any_layout_equal_and_name_a_bad_bin():
    """C-ordered, Fortran-ordered (read in place) and strided bins (copied) give the same
    sums; a bad bin is named by its feature whatever the layout."""
    rng = np.random.default_rng(3)
    wide = rng.integers(0, 16, (3000, 10)).astype(np.uint8)
    slot = rng.integers(-1, 3, 3000).astype(np.int32)
    stats = rng.integers(0, 1 << 20, (3, 3000))
    want = H.build_histograms(np.ascontiguousarray(wide[:, ::2]), slot, stats, 3, 16)
    for bins in (np.asfortranarray(wide[:, ::2]), wide[:, ::2]):
        np.testing.assert_array_equal(H.build_histograms(bins, slot, stats, 3, 16), want)
    bad = np.asfortranarray(wide[:, ::2])
    bad[np.flatnonzero(slot >= 0)[5], 3] = 200
    with pytest.raises(ValueError, match="feature 3 has bin 200 >= n_bins=16"):
        H.build_histograms(bad, slot, stats, 3, 16)


def test_histograms_refuse_bin_out_of_range():
    bins = np.zeros((10, 3), np.uint8)
    bins[4, 2] = 9
    stats = np.ones((3, 10), np.int64)
    with pytest.raises(ValueError, match="feature 2 has bin 9 >= n_bins=4"):
        H.build_histograms(bins, np.zeros(10, np.int32), stats, 1, 4)
    with pytest.raises(ValueError, match="slot >= n_slots=1"):
        H.build_histograms(bins, np.ones(10, np.int32), stats, 1, 16)


@pytest.mark.parametrize("order", ["C", "F"])
def test_route_equals_numpy(order):
    rng = np.random.default_rng(7)
    n, f, n_nodes = 4000, 5, 9
    bins = np.asarray(rng.integers(0, 32, (n, f)), dtype=np.uint8, order=order)
    node = rng.integers(0, 3, n).astype(np.int32)
    feature = rng.integers(0, f, n_nodes).astype(np.int32)
    split_bin = rng.integers(0, 32, n_nodes).astype(np.int32)
    left = np.arange(n_nodes, dtype=np.int32) * 2 + 1
    right = left + 1
    now = np.zeros(n_nodes, bool)
    now[[0, 2]] = True
    args = (feature, split_bin, left, right, now)
    before = node.copy()
    got = route_rows(bins, node, *args)
    np.testing.assert_array_equal(node, before)  # the input is not modified in place
    np.testing.assert_array_equal(got, _numpy_route(bins, node, *args))
    assert got.dtype == np.int32 and set(np.unique(got[node == 1])) == {1}  # node 1 stays
    assert set(np.unique(got[node == 0])) == {1, 2}  # node 0's rows went to both children


@pytest.mark.parametrize("n", [0, 1, 2, 7, 3001])
@pytest.mark.parametrize("dtype", [np.uint8, np.uint16])
@pytest.mark.parametrize("f", [1, 3, 4, 5, 9, K.ROOT_MAX_FEATURES + 1])
def test_root_histograms_equal_numpy(n, dtype, f):
    """A root without subsampling takes the blocked pass (uint8 bins: four features a sweep,
    the last block short unless f is a multiple of 4), with repeated bins; uint16 bins and
    rows wider than ROOT_MAX_FEATURES take the row pass: both are exact, and a bad bin
    names its own feature, in any block."""
    rng = np.random.default_rng(n + 100 * f)
    bins = np.minimum(rng.geometric(0.3, (n, f)) - 1, 15).astype(dtype)  # few distinct bins
    stats = rng.integers(-(2**40), 2**40, (3, n))
    node, root = np.zeros(n, np.int32), np.zeros(1, np.int32)
    got = H.build_node_histograms(bins, node, root, np.ones(n, bool), stats, 1, 16)
    want = H._numpy_histograms(bins, np.zeros(n, np.int32), stats, 1, 16, None)
    np.testing.assert_array_equal(got, want)
    assert got[0, :, :, 0].sum() == f * n
    for j in sorted({f // 2, f - 1}) if n else ():
        bad = bins.copy()
        bad[n // 2, j] = 16 + j  # past the end, in the root pass too
        with pytest.raises(ValueError, match=f"feature {j} has bin {16 + j} >= n_bins=16"):
            H.build_node_histograms(bad, node, root, np.ones(n, bool), stats, 1, 16)


def test_node_histograms_equal_slot_histograms():
    rng = np.random.default_rng(3)
    n, f, n_nodes = 3000, 4, 6
    bins = rng.integers(0, 16, (n, f)).astype(np.uint8)
    node = rng.integers(0, n_nodes, n).astype(np.int32)
    slot_of_node = np.array([-1, 0, -1, 1, 2, -1], np.int32)
    in_sample = rng.random(n) < 0.7
    stats = rng.integers(-(2**40), 2**40, (3, n))
    got = H.build_node_histograms(bins, node, slot_of_node, in_sample, stats, 3, 16)
    slot = np.where(in_sample, slot_of_node[node], -1)
    np.testing.assert_array_equal(got, H._numpy_histograms(bins, slot, stats, 3, 16, None))
    with pytest.raises(ValueError, match=r"node outside \[0, 6\)"):
        H.build_node_histograms(bins, node + 1, slot_of_node, in_sample, stats, 3, 16)
    with pytest.raises(ValueError, match="slot >= n_slots=2"):
        H.build_node_histograms(bins, node, slot_of_node, in_sample, stats, 2, 16)


@pytest.mark.parametrize(
    "lo,hi,max_w,n", [(-1.0, 1.0, 1.0, 10), (-3e5, 7.5, 40.0, 10**7), (0.1, 0.1, 1e-3, 3)]
)
def test_quantize_equals_numpy(lo, hi, max_w, n, monkeypatch):
    rng = np.random.default_rng(5)
    t = np.concatenate([[lo, hi], rng.uniform(lo, hi, 997)])
    w = np.concatenate([[max_w, 0.0], rng.uniform(0, max_w, 997)])
    scale = H.choose_scale(lo, hi, max_w, n)
    got = H.quantize_rows(t, w, scale)
    monkeypatch.setattr(H, "HAVE_JIT", False)
    np.testing.assert_array_equal(got, H.quantize_rows(t, w, scale))
    # a bad row takes the numpy path, which names it
    t[500] = hi + 10 * (hi - lo + 1)
    monkeypatch.setattr(H, "HAVE_JIT", True)
    with pytest.raises(ValueError, match=r"\(row 500\) lies outside the scale's range"):
        H.quantize_rows(t, w, scale)


def test_route_refuses_unknown_nodes_and_features():
    bins = np.zeros((4, 2), np.uint8)
    args = [np.array(a, np.int32) for a in ([0], [0], [1], [2])]
    with pytest.raises(ValueError, match=r"node outside \[0, 1\)"):
        route_rows(bins, np.array([0, 1, 0, 0], np.int32), *args, np.array([True]))
    args[0][0] = 2
    with pytest.raises(ValueError, match=r"split feature lies outside \[0, 2\)"):
        route_rows(bins, np.zeros(4, np.int32), *args, np.array([True]))


def test_local_fit_grows_the_same_trees_without_numba(monkeypatch):
    """Weighted rows, subsampling and feature subsets: the compiled passes change no tree."""
    from spark_ps.ml.tree import local as L

    rng = np.random.default_rng(11)
    X = rng.normal(size=(3000, 6)).round(1)
    y = (X[:, 0] + X[:, 1] * X[:, 2] + rng.normal(size=3000) > 0) * 1.0
    w = rng.uniform(0.5, 2.0, 3000)
    params = {"maxIter": 4, "maxDepth": 4, "lossType": "logistic", "subsamplingRate": 0.8}
    params["featureSubsetStrategy"] = "onethird"
    jit_trees, _, _ = L.fit_gbt_local(X, y, w, params)
    monkeypatch.setattr(H, "HAVE_JIT", False)
    monkeypatch.setattr(L, "HAVE_JIT", False)
    np_trees, _, _ = L.fit_gbt_local(X, y, w, params)
    assert sum(t.num_nodes for t in jit_trees) > 4 * 7  # real trees, not stumps
    for a, b in zip(jit_trees, np_trees, strict=True):
        for k, v in a.to_dict().items():
            np.testing.assert_array_equal(np.asarray(v), np.asarray(b.to_dict()[k]), err_msg=k)


@pytest.mark.parametrize("n_thr,dtype", [((1, 31, 0, 5), np.uint8), ((300, 2, 1, 0), np.uint16)])
def test_bin_pass_equals_numpy_searchsorted(n_thr, dtype):
    rng = np.random.default_rng(sum(n_thr))
    X = rng.normal(size=(4000, len(n_thr)))
    thresholds = [np.sort(rng.normal(size=k)) for k in n_thr]
    X[:50, 0] = thresholds[0][0]  # exactly on a threshold: the lower bin (side="left")
    X[50:60] = np.nan  # after every threshold
    X[60:70] = np.inf
    X[70:80] = -np.inf
    X[80:90] = -0.0  # equal to 0.0, as numpy compares
    thresholds[1][np.argmin(np.abs(thresholds[1]))] = 0.0  # still sorted
    got = K.bin_pass(np.ascontiguousarray(X), thresholds, dtype)
    want = np.stack([np.searchsorted(t, X[:, j], side="left") for j, t in enumerate(thresholds)], 1)
    assert got.dtype == dtype and got.flags.c_contiguous
    np.testing.assert_array_equal(got, want)
    assert (got[50:60] == np.array(n_thr)).all()
    from spark_ps.ml.tree.binning import bin_matrix

    for order, flag in (("C", "c_contiguous"), ("F", "f_contiguous")):
        b = bin_matrix(X, thresholds, order=order)
        assert getattr(b.flags, flag) and b.dtype == dtype
        np.testing.assert_array_equal(b, want)


def test_bin_matrix_refuses_unsorted_thresholds():
    from spark_ps.ml.tree.binning import bin_matrix

    with pytest.raises(ValueError, match="thresholds of feature 1 are not in ascending order"):
        bin_matrix(np.zeros((3, 2)), [np.array([0.0, 1.0]), np.array([2.0, 1.0])])


def test_row_ids_pass_equals_the_numpy_hash(monkeypatch):
    """GBT's partition-independent row ids: the compiled pass hashes the same bits (NaN, -0.0
    and inf included) to the same ids as the column-by-column numpy chain."""
    from spark_ps.ml.gbt import rounds

    rng = np.random.default_rng(5)
    X = rng.normal(size=(3000, 7))
    X[::7, 2], X[::11, 3], X[::13, 4] = np.nan, -0.0, np.inf
    y = rng.integers(0, 2, 3000).astype(float)
    w = rng.uniform(0.5, 2.0, 3000)
    got = K.row_ids_pass(X, y, w)
    monkeypatch.setattr(K, "HAVE_JIT", False)
    want = rounds._row_ids(X, y, w)
    assert got.dtype == want.dtype == np.int64
    np.testing.assert_array_equal(got, want)
    assert np.unique(got).size == got.size
    for n in (64, 65, 5, 0):  # whole, partial and no blocks of rows hashed together
        np.testing.assert_array_equal(
            got[:n], K.row_ids_pass(X[:n].copy(), y[:n].copy(), w[:n].copy())
        )
    X[0, 3] = 0.0 if X[0, 3] != 0.0 else 1.0  # one feature of one row: another id
    assert K.row_ids_pass(X, y, w)[0] != got[0]


def test_logistic_pass_gives_targets_bounds_and_error_in_one_pass():
    """GBT's per-tree LogLoss pass: targets are -gradient bit for bit (trees do not change),
    min and max are the targets', and the weighted error is LogLoss.error's to rounding,
    at margins where exp overflows or underflows too."""
    from spark_ps.ml.tree.loss import LogLoss

    rng = np.random.default_rng(6)
    y = np.where(rng.random(5000) < 0.3, 1.0, -1.0)
    pred = rng.normal(0.0, 2.0, 5000)
    pred[:8] = [0.0, -0.0, 400.0, -400.0, 800.0, -800.0, 1e-300, 20.0]
    w = rng.uniform(0.0, 3.0, 5000)
    targets, lo, hi, err = K.logistic_pass(pred, y, w)
    want = -LogLoss.gradient(pred, y)
    np.testing.assert_array_equal(targets, want)
    assert (lo, hi) == (want.min(), want.max())
    want_err = float(np.dot(LogLoss.error(pred, y), w))
    assert np.isfinite(err) and err == pytest.approx(want_err, rel=1e-12)
    t0, lo0, hi0, err0 = K.logistic_pass(np.zeros(0), np.zeros(0), np.zeros(0))
    assert t0.shape == (0,) and (lo0, hi0, err0) == (np.inf, -np.inf, 0.0)


def _exp_inputs() -> np.ndarray:
    """Every range exp meets: the whole finite domain, the margins of fits, both overflow
    edges, subnormal results, signed zeros, infinities and NaN."""
    rng = np.random.default_rng(11)
    edges = [0.0, -0.0, np.inf, -np.inf, np.nan, 709.782712893384, 709.79, -708.4, -740.0]
    edges += [-745.13, -745.14, 1e-300, -1e-300, 2.0**-30, 0.5 * np.log(2.0), np.log(2.0)]
    # where 2**k leaves its table (k = -1021 / -1022 and 1023 / 1024)
    edges += [-707.7, -707.6, -708.1, 709.2, 709.5, 709.75]
    return np.concatenate(
        [rng.uniform(-750.0, 720.0, 20000), rng.normal(0.0, 4.0, 20000), np.array(edges)]
    )


def test_portable_exp_is_one_function_in_numpy_and_compiled_code():
    """GBT's trees must not depend on the CPU: the numpy exp and the compiled one perform
    the same IEEE operations, so they agree bit for bit (as does plain Python)."""
    from spark_ps.ml.tree import portable_exp as P

    x = _exp_inputs()
    got = P.exp(x)
    one_by_one = np.array([P.exp_scalar(float(v)) for v in x])
    np.testing.assert_array_equal(got, one_by_one)
    if K.HAVE_JIT:
        np.testing.assert_array_equal(got, np.array([K._exp(float(v)) for v in x]))


def test_portable_exp_is_within_one_ulp_of_the_true_value():
    """Accuracy: fdlibm's exp is below 1 ulp from the true value, so it is one of the two
    doubles around it, at most 1 ulp from the correctly rounded one. The reference is
    x87's 80-bit expl rounded to double (not np.exp, whose float64 SIMD versions differ by
    CPU); zeros, overflow to inf, underflow to 0 and NaN as the reference."""
    from spark_ps.ml.tree.portable_exp import exp

    x = _exp_inputs()
    got = exp(x)
    with np.errstate(over="ignore", under="ignore"):
        want = np.exp(x.astype(np.longdouble)).astype(np.float64)
    normal = np.isfinite(want) & (want >= np.finfo(np.float64).tiny)
    np.testing.assert_array_max_ulp(got[normal], want[normal], maxulp=1)
    sub = ~normal & (want > 0) & np.isfinite(want)  # subnormal results: 1 ulp is 2**-1074
    assert sub.any() and np.all(np.abs(got[sub] - want[sub]) <= 2.0**-1074)
    edge = ~normal & ~sub
    np.testing.assert_array_equal(got[edge], want[edge])  # 0, inf, NaN
    assert exp(np.array([0.0]))[0] == 1.0 and exp(np.array([-0.0]))[0] == 1.0


def test_add_leaf_values_is_numpys_update_in_place():
    rng = np.random.default_rng(7)
    pred = rng.normal(size=3000)
    node = rng.integers(0, 9, 3000).astype(np.int32)
    values = rng.normal(size=9)
    want = pred + values[node] * 0.1
    K.add_leaf_values(pred, node, values, 0.1)
    np.testing.assert_array_equal(pred, want)


def test_node_histograms_with_unit_weight_equal_full_sums():
    # with no weight column the compiled pass skips the weight add and fills it as
    # count * unit afterwards: the same integers as summing every row's weight
    rng = np.random.default_rng(4)
    n, f = 4000, 5
    bins = rng.integers(0, 16, (n, f)).astype(np.uint8)
    node = rng.integers(0, 4, n).astype(np.int32)
    slot_of_node = np.array([0, -1, 1, 2], np.int32)
    in_sample = rng.random(n) < 0.8
    w = np.ones(n)
    scale = H.choose_scale(-1.0, 1.0, 1.0, n)
    stats = H.quantize_rows(rng.uniform(-1, 1, n), w, scale)
    unit = H.unit_weight(w, scale)
    got = H.build_node_histograms(
        bins, node, slot_of_node, in_sample, stats, 3, 16, unit_weight=unit
    )
    slot = np.where(in_sample, slot_of_node[node], -1)
    np.testing.assert_array_equal(got, H._numpy_histograms(bins, slot, stats, 3, 16, None))
    assert got[..., 1].sum() == f * np.count_nonzero(slot >= 0) * unit


@pytest.fixture
def three_threads(monkeypatch):
    """Split every pass over 3 threads, down to tiny inputs (restored afterwards)."""
    monkeypatch.setattr(K, "_MIN_ROWS", 64)
    monkeypatch.setattr(K, "_MIN_CELLS", 64)
    previous = threads.set_threads(3)
    yield 3
    threads.set_threads(previous)


def _each_kernel(rng, n: int, f: int) -> dict:
    """Every threaded kernel's output on one random input."""
    bins = rng.integers(0, 32, (n, f)).astype(np.uint8)
    node = rng.integers(0, 5, n).astype(np.int32)
    slot_of_node = np.array([0, -1, 1, 2, 3], np.int32)
    in_sample = rng.random(n) < 0.9
    w = rng.uniform(0.5, 2.0, n)
    scale = H.choose_scale(-1.0, 1.0, 2.0, max(n, 1))
    stats = K.quantize_pass(rng.uniform(-1, 1, n), w, *scale)
    feature, split_bin = rng.integers(0, f, 5).astype(np.int32), rng.integers(0, 32, 5)
    left, right = np.arange(5, 10, dtype=np.int32), np.arange(10, 15, dtype=np.int32)
    now = np.array([True, False, True, True, True])
    pred, y = rng.normal(0, 2, n), np.where(rng.random(n) < 0.4, 1.0, -1.0)
    leaves = pred.copy()
    K.add_leaf_values(leaves, node, rng.normal(size=5), 0.1)
    X = rng.normal(size=(n, f))
    thresholds = [np.sort(rng.normal(size=31)) for _ in range(f)]
    return {
        "stats": stats,
        "root": K.node_histogram_pass(bins, node * 0, slot_of_node[:1], np.ones(n, bool),
                                      stats, 1, 32),
        "nodes": K.node_histogram_pass(bins, node, slot_of_node, in_sample, stats, 4, 32),
        "unit": K.node_histogram_pass(bins, node, slot_of_node, in_sample, stats, 4, 32, 7),
        "route": K.route_pass(bins, node, feature, split_bin.astype(np.int32), left, right, now),
        "logistic": K.logistic_pass(pred, y, w),
        "leaves": leaves,
        "bins": K.bin_pass(X, thresholds, np.uint8),
        "ids": K.row_ids_pass(X, y, w),
    }  # fmt: skip


@pytest.mark.parametrize("n,f", [(1000, 10), (999, 80), (130, 3), (5, 2), (0, 4)])
def test_threaded_passes_equal_one_thread(three_threads, n, f):
    """A task with several CPUs splits each pass (histograms by features, the rest by rows):
    every output is the one-thread pass's, bit for bit, except the loss pass's error (a sum
    of per-thread partial sums), which is equal to rounding."""
    seed = 100 + n + f
    split = _each_kernel(np.random.default_rng(seed), n, f)
    threads.set_threads(1)
    one = _each_kernel(np.random.default_rng(seed), n, f)
    for name in ("stats", "root", "nodes", "unit", "route", "leaves", "bins", "ids"):
        np.testing.assert_array_equal(split[name], one[name], err_msg=name)
    (t1, lo1, hi1, e1), (t2, lo2, hi2, e2) = split["logistic"], one["logistic"]
    np.testing.assert_array_equal(t1, t2)
    assert (lo1, hi1) == (lo2, hi2)
    assert e1 == pytest.approx(e2, rel=1e-12, abs=0.0)


def test_threaded_histograms_name_a_bad_bin_in_any_part(three_threads):
    rng = np.random.default_rng(12)
    bins = rng.integers(0, 8, (500, 12)).astype(np.uint8)
    bins[400, 10] = 9  # in the last thread's features
    stats = np.ones((3, 500), np.int64)
    i32 = np.zeros(500, np.int32)
    for slots in (np.zeros(1, np.int32), np.array([0, 1], np.int32)):
        with pytest.raises(ValueError, match="feature 10 has bin 9 >= n_bins=8"):
            K.node_histogram_pass(bins, i32, slots, np.ones(500, bool), stats, slots.size, 8)


def test_set_threads_returns_the_previous_count():
    previous = threads.set_threads(4)
    try:
        assert threads.set_threads(0) == 4  # at least one thread
        assert threads.set_threads(1) == 1
    finally:
        threads.set_threads(previous)
