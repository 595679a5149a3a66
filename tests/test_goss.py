"""GOSS (gradient-based one-side sampling): which rows a tree grows from, and their weights."""

from __future__ import annotations

import numpy as np
import pytest

from spark_ps.ml.tree import goss, local


def _rows(n: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    t = rng.normal(size=n) * rng.choice([0.1, 1.0, 3.0], size=n)
    w = rng.uniform(0.5, 2.0, n)
    ids = rng.integers(0, 2**62, n)
    return t, w, ids


def test_draw_keeps_the_largest_rows_and_weights_the_rest_up():
    t, w, ids = _rows(20000)
    bound = float(w.max() * np.abs(t).max())
    bins = goss.bins_of(t, w, bound)
    s = goss.draw(bins, goss.counts(bins), w, ids, 0.2, 0.1, seed=3)
    size = np.abs(w * t)
    top = s.in_sample & (s.weights == w)
    # the top: at least 20% of the rows, and every row larger than any row left out
    assert 0.2 <= top.mean() < 0.2 + 0.01
    assert size[top].min() >= size[~s.in_sample].max()
    drawn = s.in_sample & ~top
    rest = (~top).sum()
    assert s.amplification == pytest.approx(rest / (0.1 * t.size))
    np.testing.assert_array_equal(s.weights[drawn], w[drawn] * s.amplification)
    # ~10% of all rows drawn from the rest (a binomial draw: 2000 +- 4 sigma)
    assert abs(drawn.sum() - 2000) < 4 * np.sqrt(2000)
    # the drawn rows stand for the rest's total weight (to the draw's noise)
    assert s.weights[drawn].sum() == pytest.approx(w[~top].sum(), rel=0.05)


def test_draw_is_the_same_for_any_partitioning():
    """Counts summed over partitions and hashed row ids: each partition draws exactly the
    rows (and weights) the whole data would."""
    t, w, ids = _rows(9000, seed=1)
    bound = float(w.max() * np.abs(t).max())
    whole_bins = goss.bins_of(t, w, bound)
    whole = goss.draw(whole_bins, goss.counts(whole_bins), w, ids, 0.3, 0.2, seed=5)
    cuts = np.split(np.random.default_rng(2).permutation(9000), [1000, 4000, 4001])
    total = sum(goss.counts(goss.bins_of(t[c], w[c], bound)) for c in cuts)
    for c in cuts:
        part = goss.draw(goss.bins_of(t[c], w[c], bound), total, w[c], ids[c], 0.3, 0.2, seed=5)
        np.testing.assert_array_equal(part.in_sample, whole.in_sample[c])
        np.testing.assert_array_equal(part.weights, whole.weights[c])


def test_rates_that_cover_every_row_draw_them_all_unweighted():
    t, w, ids = _rows(5000, seed=3)
    bins = goss.bins_of(t, w, float(w.max() * np.abs(t).max()))
    s = goss.draw(bins, goss.counts(bins), w, ids, 0.3, 0.7, seed=1)
    assert s.in_sample.all() and s.amplification == 1.0 and s.weights is w
    same = np.zeros(5000, dtype=np.int64)  # every row in one bin (e.g. all targets equal)
    s = goss.draw(same, goss.counts(same), w, ids, 0.2, 0.1, seed=1)
    assert s.in_sample.all() and s.amplification == 1.0
    assert goss.bins_of(np.zeros(3), np.ones(3), 0.0).tolist() == [0, 0, 0]


def test_goss_starts_after_one_over_step_size_trees():
    assert [goss.active(0.2, 0.1, m) for m in (0, 9, 10)] == [False, False, True]
    assert [goss.active(0.2, 1.0, m) for m in (0, 1)] == [False, True]  # never the first
    assert not goss.active(0.0, 0.5, 5)
    assert goss.weight_bound(0.2, 0.1) == pytest.approx(8.0)
    assert goss.weight_bound(0.5, 0.5) == 1.0


def _data(n=4000, seed=4):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 5))
    y = (X[:, 0] + X[:, 1] * X[:, 2] + rng.normal(size=n) > 0).astype(float)
    return X, y


def test_local_trainer_with_goss():
    """Rates that keep every row give the plain trees; the default rates grow other trees
    from fewer rows that still fit the data."""
    X, y = _data()
    base = {"lossType": "logistic", "maxIter": 6, "maxDepth": 4, "stepSize": 0.5, "seed": 3}
    plain, _, _ = local.fit_gbt_local(X, y, None, base)
    every, _, _ = local.fit_gbt_local(
        X, y, None, {**base, "gossTopRate": 0.4, "gossOtherRate": 0.6}
    )
    assert every == plain
    sampled, _, h_goss = local.fit_gbt_local(X, y, None, {**base, "gossTopRate": 0.2})
    assert sampled[:2] == plain[:2]  # the first 1/stepSize trees use every row
    assert all(a != b for a, b in zip(sampled[2:], plain[2:], strict=True))
    assert sampled[2].raw_count[0] < 0.35 * len(y)  # the root saw ~30% of the rows
    assert h_goss["train_loss"][-1] < h_goss["train_loss"][1]  # still learning
    slow = {**base, "stepSize": 0.1, "maxIter": 20}  # GOSS from the 11th tree on
    _, _, h_plain = local.fit_gbt_local(X, y, None, slow)
    _, _, h_goss = local.fit_gbt_local(X, y, None, {**slow, "gossTopRate": 0.2})
    assert h_goss["train_loss"][-1] == pytest.approx(h_plain["train_loss"][-1], rel=0.02)


@pytest.mark.parametrize(
    "bad, match",
    [
        ({"gossTopRate": 1.0}, "gossTopRate must be in"),
        ({"gossTopRate": -0.1}, "gossTopRate must be in"),
        ({"gossTopRate": 0.2, "gossOtherRate": 0.0}, "gossOtherRate must be in"),
        ({"gossTopRate": 0.5, "gossOtherRate": 0.6}, "must be <= 1"),
        ({"gossTopRate": 0.2, "subsamplingRate": 0.5}, "replaces subsampling"),
    ],
)
def test_local_trainer_refuses_bad_goss_rates(bad, match):
    X, y = _data(200)
    with pytest.raises(ValueError, match=match):
        local.fit_gbt_local(X, y, None, {"lossType": "logistic", **bad})
