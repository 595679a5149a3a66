"""LR math: MLlib's binary objective, the VecSpace L-BFGS / OWL-QN solver, the PS kernels.

Plain-numpy and scipy references check the pieces; the end-to-end check fits MLlib
(``spark`` fixture) on the same data and compares coefficients, intercept and the
whole objective history. Run with ``-s`` to see the comparison table.
"""

from __future__ import annotations

import math
import warnings
import zlib

import numpy as np
import pytest
import scipy.optimize
import scipy.sparse

from ps_server.functions.vector import KERNELS
from spark_ps.data import CSRBatch
from spark_ps.ml.lr.objective import (
    build_lr_vectors,
    feature_stats,
    finalize_stats,
    fit_binary_lr_local,
    initial_point,
    local_objective,
    loss_and_grad,
    merge_stats,
)
from spark_ps.ml.lr.optim import minimize_lbfgs
from spark_ps.ml.lr.vecspace import NumpyVecSpace

N_ROWS, N_FEAT = 2000, 20
CONST_DENSE, ZERO_DENSE = 3, 7  # constant 2.5 / all-zero columns of the dense set
CONST_SPARSE, ABSENT_SPARSE = 9, 5  # stored 1.5 in every row / never stored (sparse set)


# --------------------------------------------------------------------------- data


def _labels(rng: np.random.Generator, margin: np.ndarray) -> np.ndarray:
    return (rng.uniform(size=margin.shape[0]) < 1 / (1 + np.exp(-margin))).astype(np.float64)


def _weights(rng: np.random.Generator, n: int) -> np.ndarray:
    w = rng.uniform(0.2, 3.0, size=n)
    w[rng.choice(n, 20, replace=False)] = 0.0  # MLlib ignores these rows in its statistics
    return w


def dense_dataset(seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(X, y, w): scaled/shifted normal features, one constant and one zero column."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(N_ROWS, N_FEAT)) * rng.uniform(0.3, 4, N_FEAT) + rng.normal(0, 2, N_FEAT)
    X[:, CONST_DENSE], X[:, ZERO_DENSE] = 2.5, 0.0
    beta = rng.normal(size=N_FEAT) * 0.4
    y = _labels(rng, (X - X.mean(0)) @ beta + 0.3)
    w = _weights(rng, N_ROWS)
    X[w == 0, CONST_DENSE] = 7.0  # breaks constancy only in rows of weight 0
    return X, y, w


def sparse_dataset(seed: int = 1) -> tuple[scipy.sparse.csr_matrix, np.ndarray, np.ndarray]:
    """(X csr, y, w): ~25% dense, a feature never stored, one stored 1.5 in every row."""
    rng = np.random.default_rng(seed)
    mask = rng.uniform(size=(N_ROWS, N_FEAT)) < 0.25
    vals = rng.normal(1.0, 2.0, size=(N_ROWS, N_FEAT)) * rng.uniform(0.5, 3, N_FEAT)
    mask[:, ABSENT_SPARSE], mask[:, CONST_SPARSE] = False, True
    vals[:, CONST_SPARSE] = 1.5
    X = scipy.sparse.csr_matrix(np.where(mask, vals, 0.0))
    y = _labels(rng, X @ (rng.normal(size=N_FEAT) * 0.5) - 0.2)
    return X, y, _weights(rng, N_ROWS)


def batch_of(X, y, w) -> CSRBatch:
    m = scipy.sparse.csr_matrix(X)
    return CSRBatch(m.indptr, m.indices, m.data, m.shape[1], y, w)


def random_batch(rng: np.random.Generator, n: int, d: int, density: float = 0.3) -> CSRBatch:
    X = scipy.sparse.random(n, d, density=density, random_state=rng, format="csr")
    X.data = rng.normal(size=X.data.shape[0]) * 3
    return batch_of(X, rng.integers(0, 2, n).astype(float), rng.uniform(0.1, 2, n))


def mllib_std(X: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Weighted unbiased std over rows of positive weight (MLlib's Summarizer)."""
    pos = w > 0
    X, w = X[pos], w[pos]
    W = w.sum()
    mu = w @ X / W
    var = (w @ (X - mu) ** 2) / (W - (w @ w) / W)
    var[np.ptp(X, axis=0) == 0] = 0.0
    return np.sqrt(var)


# --------------------------------------------------------------------------- data term


def test_loss_and_grad_matches_finite_differences() -> None:
    rng = np.random.default_rng(3)
    keys, local = random_batch(rng, 300, 2000, 0.01).localize()
    k = keys.shape[0]
    coef, inv_std = rng.normal(size=k) * 0.5, rng.uniform(0.2, 2, k)
    inv_std[::7] = 0.0  # constant features: no signal, zero gradient
    b = 0.3
    loss, grad, gi, wsum = loss_and_grad(local, coef, b, inv_std, True)
    assert wsum == pytest.approx(local.weights.sum(), rel=1e-15)
    assert np.all(grad[::7] == 0.0)
    h = 1e-6
    for j in rng.choice(k, 25, replace=False):
        e = np.zeros(k)
        e[j] = h
        fd = (loss_and_grad(local, coef + e, b, inv_std, True)[0]
              - loss_and_grad(local, coef - e, b, inv_std, True)[0]) / (2 * h)  # fmt: skip
        assert grad[j] == pytest.approx(fd, rel=1e-6, abs=1e-7)
    fd_b = (loss_and_grad(local, coef, b + h, inv_std, True)[0]
            - loss_and_grad(local, coef, b - h, inv_std, True)[0]) / (2 * h)  # fmt: skip
    assert gi == pytest.approx(fd_b, rel=1e-7)
    # without an intercept the offset is ignored and its gradient is 0
    no_b = loss_and_grad(local, coef, 5.0, inv_std, False)
    assert no_b[2] == 0.0
    assert no_b[0] == pytest.approx(loss_and_grad(local, coef, 0.0, inv_std, True)[0], rel=1e-15)


def test_loss_and_grad_matches_dense_formula_and_is_stable() -> None:
    rng = np.random.default_rng(4)
    batch = random_batch(rng, 200, 30, 0.5)
    keys, local = batch.localize()
    coef = rng.normal(size=keys.shape[0]) * 400  # margins in the hundreds
    inv = np.ones(keys.shape[0])
    Xd, y, w = batch.to_dense()[:, keys], batch.labels, batch.weights
    m = Xd @ coef - 1.0
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no overflow warnings
        loss, grad, gi, _ = loss_and_grad(local, coef, -1.0, inv, True)
    ref = np.sum(w * np.where(y > 0, np.logaddexp(0, -m), np.logaddexp(0, m)))
    p = 0.5 * (1 + np.tanh(m / 2))
    assert np.isfinite(loss) and loss == pytest.approx(ref, rel=1e-12)
    np.testing.assert_allclose(grad, Xd.T @ (w * (p - y)), rtol=1e-10, atol=1e-9)
    assert gi == pytest.approx(np.sum(w * (p - y)), rel=1e-10, abs=1e-9)


@pytest.mark.parametrize("dense", [False, True])
@pytest.mark.parametrize("weighted", [False, True])
def test_loss_and_grad_on_threads_sums_its_row_blocks(monkeypatch, dense, weighted) -> None:
    """A task with several CPUs splits the batch into row blocks, one a thread (views of
    its arrays, no copies): the same loss and gradient to rounding (the blocks' sums add
    up in row order), and the same numbers on a second call."""
    from spark_ps.data import DenseBatch
    from spark_ps.ml import threads
    from spark_ps.ml.lr import objective, row_blocks

    if not dense and row_blocks.kernels() is None:
        pytest.skip("without numba a CSR batch's products run on one thread")

    rng = np.random.default_rng(9)
    batch = random_batch(rng, 1001, 40, 0.2)
    if not weighted:
        batch.weights = None
    keys, local = batch.localize()
    if dense:
        local = DenseBatch(matrix=local.to_dense(), labels=local.labels, weights=local.weights)
    coef, inv = rng.normal(size=keys.size), rng.uniform(0.5, 2.0, keys.size)
    one = loss_and_grad(local, coef, 0.2, inv, True)
    monkeypatch.setattr(objective, "THREAD_MIN_ROWS", 100)
    previous = threads.set_threads(3)
    try:
        split = [loss_and_grad(local, coef, 0.2, inv, True) for _ in range(2)]
    finally:
        threads.set_threads(previous)
    blocks = objective._row_blocks(local, keys.size, 3)
    assert [b[:2] for b in blocks] == [(0, 333), (333, 667), (667, 1001)]
    for loss, grad, gi, wsum in split:
        assert loss == pytest.approx(one[0], rel=1e-13)
        np.testing.assert_allclose(grad, one[1], rtol=1e-12, atol=1e-12)
        assert gi == pytest.approx(one[2], rel=1e-12, abs=1e-12)
        assert wsum == one[3]
    assert split[0][0] == split[1][0] and np.array_equal(split[0][1], split[1][1])
    for a, b, X in blocks:  # each reads the batch's own arrays: no copies
        if dense:
            assert np.shares_memory(X, local.matrix)
            continue
        whole = objective._scipy_csr(local, keys.size)  # built once, kept on the batch
        assert X.X is whole and np.shares_memory(X.X.data, local.values)
        # the products scipy computes for the same rows, bit for bit
        rows = whole[a:b]
        v, r = rng.normal(size=keys.size), rng.normal(size=b - a)
        assert np.array_equal(X.matvec(v), rows @ v)
        assert np.array_equal(X.rmatvec(r), rows.T @ r)


@pytest.mark.parametrize("parts", [1, 3])
def test_unit_rows_take_the_products_that_skip_their_values_bit_for_bit(monkeypatch, parts):
    """Rows whose values are all 1.0 (hashed one-hot features) run compiled products that
    never read those values, on one thread too; a few rows with other values (two hashed
    fields colliding) still read theirs. The margins, gradient and loss are scipy's, bit
    for bit. A batch without such rows keeps scipy's products on one thread."""
    from spark_ps.ml import threads
    from spark_ps.ml.lr import objective, row_blocks

    if row_blocks.kernels() is None:
        pytest.skip("without numba every CSR product runs in scipy")
    rng = np.random.default_rng(12)
    X = scipy.sparse.random(2000, 300, density=0.05, random_state=rng, format="csr")
    X.data[:] = 1.0
    X.data[X.indptr[7]] = 2.0  # row 7 holds a 2.0 (and row 9, 0.5)
    X.data[X.indptr[9] + 1] = 0.5
    keys, local = batch_of(X, rng.integers(0, 2, 2000).astype(float), None).localize()
    k = keys.size
    coef, inv = rng.normal(size=k), rng.uniform(0.5, 2.0, k)
    monkeypatch.setattr(objective, "THREAD_MIN_ROWS", 100)
    previous = threads.set_threads(parts)
    try:
        got = loss_and_grad(local, coef, 0.3, inv, True)
        blocks = objective._row_blocks(local, k, parts)
        units = objective._unit_rows(local)
        local._unit_rows = None  # the same batch through the products that read values
        want = loss_and_grad(local, coef, 0.3, inv, True)
        other = objective._row_blocks(local, k, parts)
    finally:
        threads.set_threads(previous)
    assert np.flatnonzero(~units).tolist() == [7, 9] and units.size == 2000
    assert len(blocks) == parts
    assert all(R._matvec is row_blocks.kernels(units=True)[0] for _, _, R in blocks)
    if parts == 1:
        assert len(other) == 1 and other[0][2] is objective._scipy_csr(local, k)
    else:
        assert all(R._matvec is row_blocks.kernels()[0] for _, _, R in other)
    assert got[0] == want[0] and got[2:] == want[2:]
    np.testing.assert_array_equal(got[1], want[1])
    whole = objective._scipy_csr(local, k)
    for a, b, R in blocks:  # each block against scipy on its rows
        v, r = rng.normal(size=k), rng.normal(size=b - a)
        assert np.array_equal(R.matvec(v), whole[a:b] @ v)
        assert np.array_equal(R.rmatvec(r), whole[a:b].T @ r)

    valued = random_batch(rng, 50, 20).localize()[1]  # no row of ones
    assert objective._unit_rows(valued) is None


def test_unit_rows_flags_rows_whose_values_are_all_one() -> None:
    from spark_ps.ml.lr.row_blocks import unit_rows

    indptr = np.array([0, 2, 2, 3, 5, 5])  # empty rows 1 and 4 (the last) count as ones
    values = np.array([1.0, 1.0, 3.0, 1.0, -1.0])
    assert unit_rows(indptr, values).tolist() == [True, True, False, False, True]


def test_loss_and_grad_rejects_a_batch_that_is_not_localized() -> None:
    batch = random_batch(np.random.default_rng(5), 10, 50)
    with pytest.raises(ValueError, match="is the batch localized"):
        loss_and_grad(batch, np.zeros(3), 0.0, np.ones(3), True)
    with pytest.raises(ValueError, match="same length"):
        loss_and_grad(batch, np.zeros(50), 0.0, np.ones(49), True)


# --------------------------------------------------------------------------- statistics


def test_feature_stats_merge_any_split_matches_numpy() -> None:
    X, y, w = dense_dataset()
    batch = batch_of(X, y, w)
    whole = finalize_stats(feature_stats([batch]))
    parts = [feature_stats([batch.slice(0, 700)]), feature_stats([]),
             feature_stats([batch.slice(700, 1500), batch.slice(1500, 2000)])]  # fmt: skip
    merged = finalize_stats(merge_stats(merge_stats(parts[2], parts[0]), parts[1]))
    pos = w > 0
    np.testing.assert_allclose(whole.dense("mean"), w @ X / w.sum(), rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(whole.dense("std"), mllib_std(X, w), rtol=1e-10)
    np.testing.assert_allclose(merged.dense("std"), whole.dense("std"), rtol=1e-12)
    np.testing.assert_allclose(merged.dense("mean"), whole.dense("mean"), rtol=1e-12)
    assert whole.dense("std")[[CONST_DENSE, ZERO_DENSE]].tolist() == [0.0, 0.0]
    assert merged.dense("std")[[CONST_DENSE, ZERO_DENSE]].tolist() == [0.0, 0.0]
    assert whole.n_rows == merged.n_rows == int(pos.sum())
    np.testing.assert_allclose(whole.label_weight, [w[y == 0].sum(), w[y == 1].sum()])


def test_feature_stats_sparse_keys_duplicates_and_constants() -> None:
    # keys far beyond 2**31; a row stores key 7 twice (the entries add up)
    big = 2**40
    indptr = np.array([0, 3, 4, 7, 8])
    indices = np.array([big, 7, 7, 7, big, 3, 7, 7])
    values = np.array([2.0, 1.0, 0.5, 1.5, 2.0, 4.0, 1.5, 1.5])
    batch = CSRBatch(indptr, indices, values, big + 1, np.array([0.0, 1, 1, 0]), None)
    st = finalize_stats(feature_stats([batch]))
    assert st.keys.tolist() == [3, 7, big]
    # key 7 is 1.5 in every row: std exactly 0; key big is 2.0 twice and implicitly 0 twice
    x_big = np.array([2.0, 0, 2.0, 0])
    assert st.std[1] == 0.0 and st.mean[1] == pytest.approx(1.5)
    assert st.std[2] == pytest.approx(np.std(x_big, ddof=1), rel=1e-14)
    assert st.count.tolist() == [1, 4, 2]


@pytest.mark.parametrize("seed", range(6))
def test_row_entries_finds_in_row_duplicates_only(seed: int) -> None:
    """Keys that drop at a row start (also after empty rows) are fine; a key repeated or
    dropping inside a row is summed with its row's other entries of that key."""
    from spark_ps.ml.lr.objective import _row_entries

    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(60):
        k = int(rng.integers(0, 6))  # empty rows too
        keys = np.sort(rng.choice(50, size=k, replace=False))
        if k and seed % 2 and rng.random() < 0.2:  # odd seeds: some rows repeat a key
            keys = np.sort(np.append(keys, keys[int(rng.integers(0, k))]))
        rows.append(keys)
    indptr = np.concatenate([[0], np.cumsum([r.size for r in rows])])
    indices = np.concatenate(rows).astype(np.int64)
    values = rng.normal(size=indices.size)
    batch = CSRBatch(indptr, indices, values, 50, np.zeros(len(rows)), None)
    got_rows, got_idx, got_vals = _row_entries(batch)
    want = {}
    for r in range(len(rows)):
        for p in range(indptr[r], indptr[r + 1]):
            want[(r, int(indices[p]))] = want.get((r, int(indices[p])), 0.0) + values[p]
    has_dup = len(want) < indices.size
    assert (got_rows is None) == (not has_dup)
    if got_rows is None:
        got_rows = batch.row_ids()
    got = {(int(r), int(k)): v for r, k, v in zip(got_rows, got_idx, got_vals, strict=True)}
    assert got.keys() == want.keys()
    np.testing.assert_allclose([got[k] for k in want], list(want.values()), rtol=1e-12)


@pytest.mark.parametrize("weighted", [False, True])
def test_feature_stats_of_one_hot_data_with_a_few_other_values(weighted: bool) -> None:
    """Mostly 1.0 (hashed one-hot), a few other values: the count-based sums and extremes
    equal the plain definitions; a column of 1.0s in every row keeps std exactly 0, and
    a column that is 1.0 everywhere but in one row does not."""
    rng = np.random.default_rng(8)
    n, d = 3000, 40
    X = (rng.uniform(size=(n, d)) < 0.2).astype(float)
    X[:, 0] = 1.0  # constant
    X[:, 1] = 1.0
    X[7, 1] = 1.5  # almost constant
    odd = rng.uniform(size=(n, d)) < 0.002
    X[odd & (X != 0)] = rng.choice([2.0, -3.0, 0.25], size=int((odd & (X != 0)).sum()))
    X[:, 0] = 1.0
    y = (rng.uniform(size=n) < 0.3).astype(float)
    w = _weights(rng, n) if weighted else np.ones(n)
    st = finalize_stats(feature_stats([batch_of(X, y, w if weighted else None)]))
    pos = w > 0
    np.testing.assert_allclose(st.dense("mean"), w @ X / w.sum(), rtol=1e-13)
    np.testing.assert_allclose(st.dense("std"), mllib_std(X, w), rtol=1e-10)
    assert st.dense("std")[0] == 0.0 and st.dense("std")[1] > 0.0
    np.testing.assert_array_equal(st.dense("count"), (X[pos] != 0).sum(0))


def test_feature_stats_rejects_bad_input() -> None:
    X, y, w = dense_dataset()
    bad_w = w.copy()
    bad_w[17] = -1.0
    with pytest.raises(ValueError, match=r"weight -1.0 at row 17"):
        feature_stats([batch_of(X, y, bad_w)])
    bad_y = y.copy()
    bad_y[5] = 2.0
    with pytest.raises(ValueError, match=r"Labels MUST be in \{0, 1\}.*2.0"):
        finalize_stats(feature_stats([batch_of(X, bad_y, w)]))
    with pytest.raises(ValueError, match="total instance weight"):
        finalize_stats(feature_stats([batch_of(X, y, np.zeros_like(w))]))


# --------------------------------------------------------------------------- kernels


def _kernel_args(rng: np.random.Generator, name: str, n: int) -> tuple[list, dict]:
    """Random inputs with exact zeros and sign changes (the OWL-QN corner cases)."""

    def vec(zero_frac: float = 0.3) -> np.ndarray:
        v = rng.normal(size=n)
        v[rng.uniform(size=n) < zero_frac] = 0.0
        return v

    l1 = np.abs(vec()) * (rng.uniform(size=n) < 0.8)
    std, mask = np.abs(vec()), (rng.uniform(size=n) < 0.9).astype(float)
    table = {
        "l2_penalty": ([vec(), vec(), np.abs(vec())], {"reg": 0.7}),
        "lr_finish": (
            [vec(), vec(), vec(), np.abs(vec())],
            {"inv_weight": 0.3, "intercept_step": -0.2, "reg": 0.7},
        ),
        "l1_value": ([vec(), l1], {}),
        "owlqn_pseudo_gradient": ([vec(), vec(), vec(), l1], {}),
        "owlqn_directional_derivative": ([vec(), vec(), vec(), l1], {}),
        "owlqn_constrain_direction": ([vec(), vec()], {}),
        "owlqn_step_project": ([vec(), vec(), vec(), vec()], {"step": 0.8}),
        "lr_inverse_std": ([vec(), std], {}),
        "lr_scaled_mean": ([vec(), vec(), vec()], {}),
        "lr_l2_scale": ([vec(), std, mask], {"standardization": float(rng.integers(2))}),
        "lr_l1_weight": (
            [vec(), std, mask],
            {"reg_l1": 0.3, "standardization": float(rng.integers(2))},
        ),
        "multiply": ([vec(), vec(), vec()], {}),
    }
    return table[name]


@pytest.mark.parametrize("name", sorted(KERNELS))
def test_kernels_give_the_same_result_on_any_slice_split(name: str) -> None:
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    n = 1000
    for _ in range(5):
        arrays, scalars = _kernel_args(rng, name, n)
        whole = [a.copy() for a in arrays]
        total = KERNELS[name](*whole, **scalars)
        cuts = np.sort(rng.choice(np.arange(1, n), rng.integers(1, 8), replace=False))
        bounds = [0, *cuts.tolist(), n]
        split = [a.copy() for a in arrays]
        partial = sum(
            KERNELS[name](*(a[lo:hi] for a in split), **scalars)
            for lo, hi in zip(bounds[:-1], bounds[1:], strict=True)
        )
        for a, b in zip(whole, split, strict=True):
            np.testing.assert_array_equal(a, b)
        assert partial == pytest.approx(total, rel=1e-12, abs=1e-12)


def test_lr_finish_is_scale_axpy_and_l2_penalty_bit_for_bit() -> None:
    rng = np.random.default_rng(4)
    g, x, mean, scale = (rng.normal(size=500) for _ in range(4))
    space = NumpyVecSpace(500)
    g1, g2 = space.from_array("g1", g), space.from_array("g2", g)
    xs, ms, ss = (space.from_array(n, a) for n, a in (("x", x), ("m", mean), ("s", np.abs(scale))))
    space.scale(1.0 / 7.0, g1)
    space.axpy(-0.4 / 7.0, ms, g1)
    want = space.apply("l2_penalty", g1, xs, ss, reg=0.3)
    got = space.apply(
        "lr_finish", g2, xs, ms, ss, inv_weight=1.0 / 7.0, intercept_step=-0.4 / 7.0, reg=0.3
    )
    assert got == want
    np.testing.assert_array_equal(space.to_numpy(g2), space.to_numpy(g1))


def test_pseudo_gradient_and_orthant_rules() -> None:
    # x:        >0    <0    0     0     0     0 (l1 = 0)
    x = np.array([2.0, -1.0, 0.0, 0.0, 0.0, 0.0])
    g = np.array([0.5, 0.5, 3.0, -3.0, 0.5, 0.5])
    l1 = np.array([1.0, 1.0, 1.0, 1.0, 1.0, 0.0])
    pg = np.zeros(6)
    value = KERNELS["owlqn_pseudo_gradient"](pg, x, g, l1)
    assert value == 3.0
    assert pg.tolist() == [1.5, -0.5, 2.0, -2.0, 0.0, 0.5]
    d = np.array([-1.0, 1.0, -1.0, 1.0, 1.0, -1.0])
    KERNELS["owlqn_constrain_direction"](d, pg)
    assert d.tolist() == [-1.0, 1.0, -1.0, 1.0, 0.0, -1.0]
    out = np.zeros(6)
    zeroed = KERNELS["owlqn_step_project"](out, x, d, pg, step=3.0)
    # 2-3 < 0 crosses zero -> 0; -1+3 > 0 crosses -> 0; zeros move along -pg's sign
    assert out.tolist() == [0.0, 0.0, -3.0, 3.0, 0.0, -3.0]
    assert zeroed == 2.0


# --------------------------------------------------------------------------- solver


def _smooth_problem(seed: int = 7):
    """A convex, badly scaled smooth function: logistic loss + log-cosh + quadratic."""
    rng = np.random.default_rng(seed)
    n, d = 300, 12
    A = rng.normal(size=(n, d)) * np.geomspace(0.2, 5, d)
    y = rng.integers(0, 2, n).astype(float)
    c = rng.normal(size=d)

    def f(x: np.ndarray) -> tuple[float, np.ndarray]:
        m = A @ x
        val = np.mean(np.logaddexp(0, m) - y * m) + np.sum(np.log(np.cosh(x - c))) * 0.01
        grad = A.T @ (1 / (1 + np.exp(-m)) - y) / n + 0.01 * np.tanh(x - c)
        return val + 0.005 * x @ x, grad + 0.01 * x

    return f, d


def _run(f, d, *, l1=None, shards=1, m=10, max_iter=500, tol=1e-12):
    space = NumpyVecSpace(d, shards=shards)
    seen: list[bytes] = []

    def evaluate(x, g):
        seen.append(x.tobytes())
        val, grad = f(x)
        g[...] = grad
        return val

    l1h = None if l1 is None else space.from_array("l1", l1)
    res = minimize_lbfgs(space, evaluate, space.new("x0"), max_iter=max_iter, tol=tol, m=m, l1=l1h)
    return res, space, seen


def test_lbfgs_reaches_the_scipy_optimum_without_redundant_evaluations() -> None:
    f, d = _smooth_problem()
    ref = scipy.optimize.minimize(
        f, np.zeros(d), jac=True, method="L-BFGS-B", options={"ftol": 1e-16, "gtol": 1e-12}
    )
    res, space, seen = _run(f, d, m=5)
    x = space.to_numpy(res.x)
    assert res.value <= ref.fun + 1e-12
    np.testing.assert_allclose(x, ref.x, rtol=1e-5, atol=1e-6)
    assert res.n_evals == len(seen) == len(set(seen))  # every evaluation at a new point
    assert res.objective_history[0] == pytest.approx(f(np.zeros(d))[0])
    assert len(res.objective_history) == res.n_iter + 1
    assert all(
        b <= a for a, b in zip(res.objective_history[:-1], res.objective_history[1:], strict=True)
    )
    assert space.peak_live <= 2 * 5 + 2 + 5  # history, spare pair, x, g, trial x/g, direction
    assert space.live == 1  # only the solution is left


def test_owlqn_reaches_the_scipy_split_variable_optimum() -> None:
    f, d = _smooth_problem(8)
    l1 = np.full(d, 0.02)
    l1[0] = 0.0  # an unpenalized coordinate, like the intercept

    def split(z):  # x = u - v with u, v >= 0 turns the L1 term linear
        u, v = z[:d], z[d:]
        val, g = f(u - v)
        return val + l1 @ (u + v), np.concatenate([g + l1, -g + l1])

    ref = scipy.optimize.minimize(
        split, np.zeros(2 * d), jac=True, method="L-BFGS-B", bounds=[(0, None)] * (2 * d),
        options={"ftol": 1e-16, "gtol": 1e-12, "maxiter": 10000},
    )  # fmt: skip
    res, space, seen = _run(f, d, l1=l1, m=6)
    x = space.to_numpy(res.x)
    x_ref = ref.x[:d] - ref.x[d:]
    assert res.value == pytest.approx(ref.fun, rel=1e-9)
    np.testing.assert_allclose(x, x_ref, atol=2e-5)
    assert np.all((x == 0) == (np.abs(x_ref) < 1e-6))  # the same exact zeros
    assert res.n_evals == len(seen) == len(set(seen))
    assert space.peak_live <= 2 * 6 + 2 + 6 + 1  # + pseudo-gradient, + caller's l1


def test_failed_steps_reset_the_history_once_then_stop_as_breeze() -> None:
    # a gradient of the wrong sign: no step along -g satisfies the Wolfe conditions
    res, space, seen = _run(lambda x: (float(x @ x) + 1.0, -2 * x - 1.0), 4)
    assert res.reason == "line search failed!"
    assert res.n_iter == 0 and res.n_evals == len(seen) > 1
    assert not space.to_numpy(res.x).any()  # no step was taken
    assert res.objective_history == [1.0, 1.0, 1.0]  # breeze re-emits the state each time
    with pytest.raises(ValueError, match="m must be a positive integer"):
        minimize_lbfgs(space, lambda x, g: 0.0, res.x, max_iter=5, tol=1e-6, m=0)
    with pytest.raises(ValueError, match="max_iter"):
        minimize_lbfgs(space, lambda x, g: 0.0, res.x, max_iter=-1, tol=1e-6)


def test_solver_result_does_not_depend_on_the_shard_split() -> None:
    X, y, w = sparse_dataset()
    kw = dict(reg_param=0.01, elastic_net=0.5, standardization=False, max_iter=200, tol=1e-10)
    c1, b1, h1 = fit_binary_lr_local(X, y, w, shards=1, **kw)
    c5, b5, h5 = fit_binary_lr_local(X, y, w, shards=5, **kw)
    assert len(h1) == len(h5)
    np.testing.assert_allclose(h5, h1, rtol=1e-12)
    np.testing.assert_allclose(c5, c1, rtol=1e-9, atol=1e-12)
    assert b5 == pytest.approx(b1, rel=1e-9)


def test_max_iter_zero_returns_the_start_point() -> None:
    X, y, w = dense_dataset()
    coef, b, hist = fit_binary_lr_local(X, y, w, max_iter=0)
    p1 = w @ y / w.sum()
    assert not coef.any() and b == pytest.approx(math.log(p1 / (1 - p1)), rel=1e-12)
    ref = -np.sum(w * (y * np.log(p1) + (1 - y) * np.log(1 - p1))) / w.sum()
    assert hist == [pytest.approx(ref, rel=1e-12)]


# --------------------------------------------------------------------------- composed objective


def _composed(X, y, w, *, standardization: bool, fit_intercept: bool, reg=0.05, en=0.0):
    batch = batch_of(X, y, w)
    stats = finalize_stats(feature_stats([batch]))
    D, pad = X.shape[1], [0.0] * fit_intercept
    space = NumpyVecSpace(D + fit_intercept)
    mean = space.from_array("mean", np.concatenate([stats.dense("mean"), pad]))
    std = space.from_array("std", np.concatenate([stats.dense("std"), pad]))
    mask = space.from_array("mask", np.concatenate([np.ones(D), pad]))
    vecs = build_lr_vectors(
        space, mean, std, mask, reg_param=reg, elastic_net=en,
        standardization=standardization, fit_intercept=fit_intercept,
    )  # fmt: skip
    return space, vecs, local_objective(space, batch, vecs), stats, mask


def _value_at(space: NumpyVecSpace, evaluate, values: np.ndarray) -> float:
    x, g = space.from_array("probe", values), space.new("probe_grad")
    val = evaluate(x, g)
    space.release(x)
    space.release(g)
    return val


@pytest.mark.parametrize("standardization", [True, False])
def test_composed_objective_is_mllib_objective_and_its_gradient(standardization: bool) -> None:
    X, y, w = dense_dataset(11)
    X, y, w = X[:400], y[:400], w[:400]
    space, vecs, evaluate, stats, mask = _composed(
        X, y, w, standardization=standardization, fit_intercept=True
    )
    std, mean = stats.dense("std"), stats.dense("mean")
    inv = np.divide(1.0, std, out=np.zeros_like(std), where=std > 0)
    rng = np.random.default_rng(2)
    x = space.from_array("x", rng.normal(size=space.dim) * 0.3 * np.concatenate([std > 0, [1]]))
    g = space.new("g")
    val = evaluate(x, g)
    # the same objective written directly in the original space (no centering, no scaling)
    beta, b0 = x[:-1] * inv, x[-1] - np.dot(x[:-1], mean * inv)
    m = X @ beta + b0
    data = np.sum(w * np.logaddexp(0, np.where(y > 0, -m, m))) / w.sum()
    pen = beta**2 if standardization is False else (beta * std) ** 2
    assert val == pytest.approx(data + 0.5 * 0.05 * np.sum(pen), rel=1e-12)
    for j in [0, 1, 5, CONST_DENSE, space.dim - 1]:
        e = np.zeros(space.dim)
        e[j] = 1e-6
        fd = (_value_at(space, evaluate, x + e) - _value_at(space, evaluate, x - e)) / 2e-6
        assert g[j] == pytest.approx(fd, rel=1e-6, abs=1e-9)
    assert g[CONST_DENSE] == 0.0  # a constant feature carries no gradient
    b_start = initial_point(space, x, mask, stats.label_weight, True)
    assert x[-1] == b_start and not x[:-1].any()
    with pytest.raises(ValueError, match="with one label only"):
        initial_point(space, x, mask, np.array([0.0, 3.0]), True)


# --------------------------------------------------------------------------- MLlib


MLLIB_CASES = [
    # (data, regParam, elasticNetParam, standardization, fitIntercept)
    ("dense", 0.0, 0.0, True, True),
    ("dense", 0.01, 0.0, False, True),
    ("dense", 0.05, 1.0, True, True),
    ("dense", 0.01, 0.5, False, True),
    ("sparse", 0.0, 0.0, False, True),
    ("sparse", 0.01, 0.0, True, False),
    ("sparse", 0.01, 0.5, True, True),
    ("sparse", 0.01, 0.5, False, False),
]


def _frame(spark, X, y, w):
    """DataFrame(label, weight, features) through Arrow and VectorAssembler (no per-row Python)."""
    import pandas as pd
    from pyspark.ml.feature import VectorAssembler

    dense = np.asarray(X.todense()) if scipy.sparse.issparse(X) else X
    cols = [f"x{j}" for j in range(dense.shape[1])]
    pdf = pd.DataFrame(dense, columns=cols).assign(label=y, weight=w)
    df = VectorAssembler(inputCols=cols, outputCol="features").transform(spark.createDataFrame(pdf))
    return df.select("label", "weight", "features").cache()


@pytest.fixture(scope="module")
def mllib_data(spark):
    out = {"dense": dense_dataset(), "sparse": sparse_dataset()}
    out = {k: (*v, _frame(spark, *v)) for k, v in out.items()}
    for *_, df in out.values():
        df.count()
    yield out
    for *_, df in out.values():
        df.unpersist()


def test_feature_stats_match_mllib_summarizer(mllib_data) -> None:
    from pyspark.ml.stat import Summarizer
    from pyspark.sql import functions as F

    for kind in ("dense", "sparse"):
        X, y, w, df = mllib_data[kind]
        row = df.select(
            Summarizer.metrics("mean", "std").summary(F.col("features"), F.col("weight"))
        ).first()
        ours = finalize_stats(feature_stats([batch_of(X, y, w)]))
        std, mean = row[0]["std"].toArray(), row[0]["mean"].toArray()
        np.testing.assert_allclose(ours.dense("std"), std, rtol=1e-11)
        np.testing.assert_allclose(ours.dense("mean"), mean, rtol=1e-11, atol=1e-15)
        assert np.array_equal(ours.dense("std") == 0, std == 0)  # same constant features


@pytest.mark.parametrize("case", MLLIB_CASES, ids=lambda c: "-".join(map(str, c)))
def test_same_optimum_and_path_as_mllib(spark, mllib_data, case) -> None:
    from pyspark.ml.classification import LogisticRegression

    kind, reg, en, stdz, fi = case
    X, y, w, df = mllib_data[kind]
    model = LogisticRegression(
        regParam=reg, elasticNetParam=en, standardization=stdz, fitIntercept=fi,
        maxIter=200, tol=1e-10, weightCol="weight",
    ).fit(df)  # fmt: skip
    coef, b, hist = fit_binary_lr_local(
        X, y, w, reg_param=reg, elastic_net=en, standardization=stdz, fit_intercept=fi,
        max_iter=200, tol=1e-10,
    )  # fmt: skip
    ref, ref_hist = model.coefficients.toArray(), model.summary.objectiveHistory
    rel = np.linalg.norm(coef - ref) / np.linalg.norm(ref)
    print(
        f"\n{kind:6s} reg={reg:<5} en={en:<4} std={stdz!s:5} fi={fi!s:5} | coef rel "
        f"{rel:.1e} | intercept {abs(b - model.intercept):.1e} | objective "
        f"{abs(hist[-1] - ref_hist[-1]) / ref_hist[-1]:.1e} | iters {len(hist) - 1}/"
        f"{len(ref_hist) - 1}"
    )
    assert rel < 1e-3
    assert b == pytest.approx(model.intercept, rel=1e-3, abs=1e-4)
    assert hist[-1] == pytest.approx(ref_hist[-1], rel=1e-9)
    assert np.array_equal(coef == 0, ref == 0)  # the same exact zeros (L1, constant columns)
    # the faithful breeze port walks MLlib's path: same iterations, same values
    assert len(hist) == len(ref_hist)
    np.testing.assert_allclose(hist, ref_hist, rtol=1e-7)


def test_all_one_label_matches_mllib(spark, mllib_data) -> None:
    from pyspark.ml.classification import LogisticRegression
    from pyspark.sql import functions as F

    X, y, w, df = mllib_data["dense"]
    for label, inf in ((1.0, math.inf), (0.0, -math.inf)):
        model = LogisticRegression(weightCol="weight").fit(df.withColumn("label", F.lit(label)))
        coef, b, hist = fit_binary_lr_local(X, np.full_like(y, label), w)
        assert model.intercept == b == inf
        assert not coef.any() and not model.coefficients.toArray().any()
        assert hist == list(model.summary.objectiveHistory) == [0.0]


class _CountingSpace(NumpyVecSpace):
    """Counts the requests a PS space would make (each op the solver calls is one round
    trip there; ops an op runs inside are not) and the dot products asked for."""

    _OPS = ("dots", "lincombs_dots", "lincomb", "dot", "nrm2", "apply", "axpy", "copy", "scale")

    def __init__(self, dim: int) -> None:
        super().__init__(dim)
        self.requests: dict[str, int] = {}
        self.dots_asked = 0
        self._depth = 0

    def __getattribute__(self, name):
        attr = super().__getattribute__(name)
        if name not in _CountingSpace._OPS:
            return attr

        def counted(*args, **kw):
            if self._depth == 0 and not (name == "dots" and not args[0]):  # [] sends nothing
                self.requests[name] = self.requests.get(name, 0) + 1
                if name in ("dots", "lincombs_dots"):
                    self.dots_asked += len(args[-1])
            self._depth += 1
            try:
                return attr(*args, **kw)
            finally:
                self._depth -= 1

        return counted


@pytest.mark.parametrize("l1", [False, True])
def test_solver_requests_per_iteration(l1: bool) -> None:
    # L-BFGS: two requests per iteration besides the evaluation (the direction with the
    # trial point; the trial's history pair with every dot product the next direction
    # needs); OWL-QN: history dot products are asked once, not again every iteration
    f, d = _smooth_problem(3)
    space = _CountingSpace(d)

    def evaluate(x, g):
        val, grad = f(x)
        g[...] = grad
        return val

    l1h = space.from_array("l1", np.full(d, 0.01)) if l1 else None
    m, iters = 4, 12
    res = minimize_lbfgs(space, evaluate, space.new("x0"), max_iter=iters, tol=0.0, m=m, l1=l1h)
    assert res.n_iter == iters
    if not l1:
        extra = res.n_evals - 1 - res.n_iter  # trials the line searches rejected
        assert space.requests.get("lincombs_dots", 0) == 2 * res.n_iter + extra
        assert space.requests.get("lincomb", 0) == extra  # a later trial's point
        assert space.requests.get("nrm2", 0) == 1  # |g| of the starting point
        assert set(space.requests) <= {"lincombs_dots", "lincomb", "nrm2"}
    else:
        # per iteration at most: s, y and the pseudo-gradient against a basis of 2m + 1
        assert space.dots_asked <= res.n_iter * (3 * (2 * m + 1) + 3)


def test_dense_coefficients_come_from_zeros_made_on_a_thread() -> None:
    """A dense-output fit's coefficients: the touched keys' values in zeros made while the
    solver ran, of the shape asked for (a fresh array if the shapes differ); once."""
    from spark_ps.ml.lr.distributed import Zeros, _KeySpace, _result

    ks = _KeySpace(keyset=None, size=3, num_features=10, dense_output=True)
    zeros = Zeros(10)
    out = _result(ks, np.array([1, 4, 9]), np.array([0.5, -2.0, 3.0]), 0.25, [1.0], 1, zeros)
    expected = np.zeros(10)
    expected[[1, 4, 9]] = [0.5, -2.0, 3.0]
    assert np.array_equal(out.coefficients, expected) and out.intercept == 0.25
    assert np.array_equal(Zeros(2, 3).take(2, 3), np.zeros((2, 3)))
    other = Zeros(4)
    assert other.take(5).shape == (5,) and not other.take(4).any()  # taken once: made anew


@pytest.mark.parametrize("parts", [1, 3])
@pytest.mark.parametrize("kind", ["sparse", "units", "dense"])
def test_label_sums_are_the_gradient_at_a_constant_margin(monkeypatch, parts, kind) -> None:
    """``sigmoid(b0) * s1 - label_sums`` is the data gradient where every margin is b0 (the
    statistics round's start point): on scipy's, the unit rows' and BLAS's products, on one
    thread and on several; a batch without labels is refused."""
    from spark_ps.data import DenseBatch
    from spark_ps.ml import threads
    from spark_ps.ml.lr import objective

    rng = np.random.default_rng(21)
    X = scipy.sparse.random(1200, 90, density=0.1, random_state=rng, format="csr")
    if kind == "units":
        X.data[:] = 1.0
    y, w = rng.integers(0, 2, 1200).astype(float), rng.uniform(0.1, 3.0, 1200)
    keys, local = batch_of(X, y, w).localize()
    if kind == "dense":
        local = DenseBatch(matrix=local.to_dense(), labels=local.labels, weights=local.weights)
    k, b0 = keys.size, -0.4
    monkeypatch.setattr(objective, "THREAD_MIN_ROWS", 100)
    previous = threads.set_threads(parts)
    try:
        sy = objective.label_sums(local, k)
        loss, grad, gi, wsum = loss_and_grad(local, np.zeros(k), b0, np.ones(k), True)
    finally:
        threads.set_threads(previous)
    s1 = objective.feature_stats([local]).s1 if kind != "dense" else w @ local.matrix
    p = 1.0 / (1.0 + math.exp(-b0))
    np.testing.assert_allclose(p * s1 - sy, grad, rtol=1e-12, atol=1e-12)
    assert p * wsum - np.dot(w, y) == pytest.approx(gi, rel=1e-12)
    w1, w0 = np.dot(w, y), np.dot(w, 1 - y)
    start_loss = w1 * np.logaddexp(0.0, -b0) + w0 * np.logaddexp(0.0, b0)
    assert start_loss == pytest.approx(loss, rel=1e-13)
    if kind != "dense":
        with pytest.raises(ValueError, match="no labels"):
            objective.label_sums(CSRBatch(local.indptr, local.indices, local.values, k), k)


@pytest.mark.parametrize("weighted", [False, True])
def test_compiled_statistics_pass_equals_the_numpy_path(monkeypatch, weighted) -> None:
    """One compiled pass over the entries (rows of ones apart) gives the numpy path's
    statistics and label sums: rows of ones and of other values sharing keys, stored
    zeros, negative values, empty rows and rows of weight 0. A row whose keys do not
    increase (a duplicate to merge) leaves the batch to the numpy path."""
    from spark_ps.ml.lr import objective, stats_pass

    rng = np.random.default_rng(31)
    n, d = 1500, 120
    dense = (rng.uniform(size=(n, d)) < 0.08).astype(float)
    dense[9:11] = 0.0  # rows 9 and 10 empty
    X = scipy.sparse.csr_matrix(dense)  # keys increase in every row
    some = rng.choice(n, 200, replace=False)  # rows holding other values
    for r in some:
        lo, hi = X.indptr[r], X.indptr[r + 1]
        X.data[lo:hi] = rng.choice([0.0, -2.5, 0.5, 3.0], size=hi - lo)
    X.data[X.indptr[3] : X.indptr[4]] = 0.0  # a row of stored zeros only
    y = rng.integers(0, 2, n).astype(float)
    w = _weights(rng, n) if weighted else None
    batch = CSRBatch(X.indptr, X.indices, X.data, d, y, w)
    if stats_pass.key_sums(batch.indptr, batch.indices, batch.values, None, w, y, d) is None:
        pytest.skip("without numba the statistics take the numpy path")
    fast = objective.feature_stats([batch], with_labels=True)
    monkeypatch.setattr(objective, "_compiled_stats", lambda *a: None)
    slow = objective.feature_stats([batch], with_labels=True)
    assert fast.keys.tolist() == slow.keys.tolist() and fast.count.tolist() == slow.count.tolist()
    for name in ("s1", "s2", "label_sum"):
        np.testing.assert_allclose(getattr(fast, name), getattr(slow, name), rtol=1e-13)
    for name in ("vmin", "vmax"):
        assert np.array_equal(getattr(fast, name), getattr(slow, name)), name
    assert (fast.n_rows, fast.weight_sum) == (slow.n_rows, slow.weight_sum)
    dense = X.toarray()  # with the values set above
    ww = np.ones(n) if w is None else w
    np.testing.assert_allclose(fast.label_sum, ((ww * y) @ dense)[fast.keys], rtol=1e-12)
    # a row repeating a key: the compiled pass declines, the numpy path merges the pair
    idx = batch.indices.copy()
    r = int(np.flatnonzero(np.diff(batch.indptr) >= 2)[0])
    idx[batch.indptr[r] + 1] = idx[batch.indptr[r]]
    dup = CSRBatch(batch.indptr, idx, batch.values, d, y, w)
    assert stats_pass.key_sums(dup.indptr, idx, dup.values, None, w, y, d) is None
    merged = objective.feature_stats([dup], with_labels=True)
    m = scipy.sparse.csr_matrix((dup.values, idx, dup.indptr), shape=(n, d))  # adds the pair
    np.testing.assert_allclose(merged.label_sum, ((ww * y) @ m.toarray())[merged.keys], rtol=1e-12)
