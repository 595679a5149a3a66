"""The shards' compiled split search chooses exactly what the numpy search chooses."""

from __future__ import annotations

import numpy as np
import pytest

from ps_server.functions import gbt, gbt_jit

pytestmark = pytest.mark.skipif(gbt_jit.kernel() is None, reason="numba not installed")


def _numpy_search(monkeypatch, *args, **kwargs) -> np.ndarray:
    with monkeypatch.context() as m:
        m.setattr(gbt_jit, "_KERNEL", [None])
        return gbt.best_splits(*args, **kwargs)


def _tie_heavy(rng, nodes: int, feats: int, bins: int) -> np.ndarray:
    """Few rows per bin, zero-weight rows, features that are permutations of each other:
    equal gains across features and bins, empty sides, invalid splits."""
    cnt = rng.integers(0, 4, (nodes, 1, bins))
    w = cnt * rng.choice([0, 1, 3], size=cnt.shape) * (1 << 20)
    u = rng.integers(-1, 2, cnt.shape)
    first = np.stack([cnt, w, w * u, w * u * u], axis=-1).astype(np.int64)
    return np.concatenate([first[:, :, rng.permutation(bins)] for _ in range(feats)], axis=1)


@pytest.mark.parametrize("seed", range(6))
def test_compiled_search_equals_numpy_bit_for_bit(seed, monkeypatch):
    rng = np.random.default_rng(seed)
    for _ in range(40):
        hist = _tie_heavy(rng, *rng.integers([1, 1, 2], [9, 6, 9]))
        kw = dict(
            min_instances_per_node=int(rng.integers(1, 3)),
            min_info_gain=float(rng.choice([0.0, 1e-3])),
            min_weight_per_node=float(rng.choice([0.0, 2.0])),
            scale=(0.5, int(rng.integers(-3, 3)), 20),
            feature_mask=rng.random(hist.shape[:2]) < 0.7 if rng.random() < 0.5 else None,
        )
        got = gbt.best_splits(hist, 7, **kw)
        want = _numpy_search(monkeypatch, hist, 7, **kw)
        assert got.tobytes() == want.tobytes()
    wide = rng.integers(0, 2**40, size=(8, 24, 32, 4)).astype(np.int64)
    got = gbt.best_splits(wide, 0, scale=(0.0, 0, 20))
    assert got.tobytes() == _numpy_search(monkeypatch, wide, 0, scale=(0.0, 0, 20)).tobytes()
    assert (got["feature"] >= 0).all()  # real splits were compared, not just "none found"


def test_without_numba_the_numpy_search_is_used(monkeypatch):
    monkeypatch.setenv("SPARK_PS_NO_JIT", "1")
    assert gbt_jit._compile() is None


@pytest.mark.filterwarnings("ignore:overflow encountered in ldexp")  # 2**1200: inf gains
@pytest.mark.parametrize("target_exp", [-540, -530, -300, 511, 520, 600])
def test_extreme_scales_equal_numpy(target_exp, monkeypatch):
    # a gain is scaled by 2**(2 * target_exp): one multiplication while that power is a
    # float (down to the subnormal 2**-1060), ldexp beyond; the same bits either way
    rng = np.random.default_rng(target_exp + 1000)
    for _ in range(10):
        hist = _tie_heavy(rng, *rng.integers([1, 1, 2], [9, 6, 9]))
        kw = dict(min_instances_per_node=1, min_info_gain=0.0, scale=(0.5, target_exp, 20))
        got = gbt.best_splits(hist, 0, **kw)
        assert got.tobytes() == _numpy_search(monkeypatch, hist, 0, **kw).tobytes()
    wide = rng.integers(0, 2**40, size=(4, 8, 16, 4)).astype(np.int64)
    kw = dict(scale=(0.0, target_exp, 20))
    got = gbt.best_splits(wide, 0, **kw)
    assert got.tobytes() == _numpy_search(monkeypatch, wide, 0, **kw).tobytes()
