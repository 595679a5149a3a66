"""Key routing helpers against plain-Python references."""

from __future__ import annotations

import bisect

import numpy as np
import pytest

from ps_server.keys import (
    combine,
    dedup,
    group_by,
    hash_shard,
    mix64,
    range_bounds,
    range_shard,
    validate_keys,
)

MASK64 = (1 << 64) - 1


def splitmix64_finalizer(x: int) -> int:
    """Reference: the splitmix64 output function on a Python int."""
    z = x & MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


EDGE_KEYS = [0, 1, 2, 7, 2**31, 2**32 + 5, 2**62, 2**63 - 2, 2**63 - 1, -1, -(2**63)]


def test_mix64_matches_reference():
    rng = np.random.default_rng(1)
    keys = np.concatenate(
        [np.array(EDGE_KEYS, dtype=np.int64), rng.integers(-(2**63), 2**63 - 1, 500)]
    )
    got = mix64(keys)
    assert got.dtype == np.uint64
    assert [int(x) for x in got] == [splitmix64_finalizer(int(k)) for k in keys]
    # int32 input is widened, not reinterpreted
    assert np.array_equal(mix64(np.arange(10, dtype=np.int32)), mix64(np.arange(10)))


def test_hash_shard_reference_and_balance():
    keys = np.arange(100_000, dtype=np.int64)
    shards = hash_shard(keys, 7)
    assert shards.dtype == np.int64
    assert [int(s) for s in shards[:300]] == [splitmix64_finalizer(k) % 7 for k in range(300)]
    counts = np.bincount(shards, minlength=7)
    assert counts.min() > 0.95 * keys.size / 7 and counts.max() < 1.05 * keys.size / 7
    big = np.array([2**63 - 1, 2**62], dtype=np.int64)
    assert [int(s) for s in hash_shard(big, 5)] == [splitmix64_finalizer(int(k)) % 5 for k in big]
    with pytest.raises(ValueError, match="num_shards must be >= 1, got 0"):
        hash_shard(keys, 0)


@pytest.mark.parametrize(
    "dim,n", [(10, 3), (9, 3), (1, 4), (0, 2), (100, 1), (2**40 + 3, 4), (2**63 - 1, 3)]
)
def test_range_bounds(dim, n):
    b = range_bounds(dim, n)
    assert b.dtype == np.int64 and b.shape == (n + 1,)
    assert b[0] == 0 and int(b[-1]) == dim
    sizes = [int(b[i + 1]) - int(b[i]) for i in range(n)]
    assert max(sizes) - min(sizes) <= 1
    assert sizes == sorted(sizes, reverse=True)  # the larger ranges come first
    assert np.array_equal(range_bounds(dim, n), b)  # same dim -> same bounds (co-location)


def test_range_bounds_rejects_bad_arguments():
    with pytest.raises(ValueError, match="num_shards must be >= 1, got 0"):
        range_bounds(10, 0)
    with pytest.raises(ValueError, match="dim must be >= 0, got -1"):
        range_bounds(-1, 2)


@pytest.mark.parametrize("dim,n", [(1000, 7), (3, 5), (2**50, 3)])
def test_range_shard_matches_bisect(dim, n):
    bounds = range_bounds(dim, n)
    rng = np.random.default_rng(2)
    keys = np.concatenate([rng.integers(0, dim, 300), [0, dim - 1], bounds[:-1][bounds[:-1] < dim]])
    got = range_shard(keys, bounds)
    blist = [int(x) for x in bounds]
    want = [bisect.bisect_right(blist, int(k)) - 1 for k in keys]
    assert [int(s) for s in got] == want
    # every key lands in a non-empty range that contains it
    assert np.all((bounds[got] <= keys) & (keys < bounds[got + 1]))


def test_group_by_is_stable_and_complete():
    rng = np.random.default_rng(3)
    ids = rng.integers(0, 5, 1000)
    order, offsets = group_by(ids, 6)  # group 5 stays empty
    assert offsets.shape == (7,) and offsets[0] == 0 and offsets[-1] == ids.size
    for s in range(6):
        want = [i for i, v in enumerate(ids) if v == s]
        assert order[offsets[s] : offsets[s + 1]].tolist() == want
    with pytest.raises(ValueError, match="group id 6 is outside"):
        group_by(np.array([0, 6]), 6)
    order, offsets = group_by(np.empty(0, dtype=np.int64), 3)
    assert order.size == 0 and offsets.tolist() == [0, 0, 0, 0]


def _combine_reference(keys, values):
    sums: dict[int, np.ndarray] = {}
    for k, v in zip(keys.tolist(), values, strict=True):
        sums[k] = sums[k] + v if k in sums else np.array(v, dtype=np.float64)
    ks = sorted(sums)
    return np.array(ks, dtype=np.int64), np.array([sums[k] for k in ks])


@pytest.mark.parametrize("cols", [None, 1, 4])
def test_combine_matches_dict_reference(cols):
    rng = np.random.default_rng(4)
    keys = rng.choice(np.array([5, 2**63 - 1, 0, 17, 2**40, 3]), 400)
    shape = (keys.size,) if cols is None else (keys.size, cols)
    values = rng.standard_normal(shape)
    uk, uv = combine(keys, values)
    rk, rv = _combine_reference(keys, values)
    assert np.array_equal(uk, rk)
    assert uv.shape == rv.shape
    np.testing.assert_allclose(uv, rv, rtol=1e-12, atol=1e-12)
    # deterministic: the same input gives bit-identical output
    uk2, uv2 = combine(keys.copy(), values.copy())
    assert uk2.tobytes() == uk.tobytes() and uv2.tobytes() == uv.tobytes()


def test_combine_exact_on_integers_and_keeps_dtype():
    keys = np.array([3, 1, 3, 3, 2, 1])
    values = np.array([[1, 2], [3, 4], [5, 6], [7, 8], [9, 10], [11, 12]], dtype=np.float32)
    uk, uv = combine(keys, values)
    assert uk.tolist() == [1, 2, 3]
    assert uv.dtype == np.float32
    assert uv.tolist() == [[14, 16], [9, 10], [13, 16]]
    # no duplicates: a permutation
    uk, uv = combine(np.array([9, 4]), np.array([1.0, 2.0]))
    assert uk.tolist() == [4, 9] and uv.tolist() == [2.0, 1.0]
    uk, uv = combine(np.empty(0, dtype=np.int64), np.empty((0, 3)))
    assert uk.size == 0 and uv.shape == (0, 3)


def test_combine_rejects_mismatched_shapes():
    with pytest.raises(ValueError, match=r"got keys \(3,\) and values \(2,\)"):
        combine(np.arange(3), np.zeros(2))


def test_dedup_restores_order():
    rng = np.random.default_rng(5)
    keys = rng.choice(np.array([2**63 - 1, 0, 99, 2**33]), 200)
    uniq, inverse = dedup(keys)
    assert uniq.tolist() == sorted(set(keys.tolist()))
    assert inverse.dtype == np.int64
    assert np.array_equal(uniq[inverse], keys)
    pulled = uniq * 2  # a value per unique key
    assert np.array_equal(pulled[inverse], keys * 2)
    uniq, inverse = dedup(np.empty(0, dtype=np.int64))
    assert uniq.size == 0 and inverse.size == 0


def test_validate_keys_messages():
    validate_keys(np.array([0, 9, 3]), 10, "pull from 'w'")
    validate_keys(np.empty(0, dtype=np.int32), 10, "x")
    with pytest.raises(
        ValueError, match=r"pull from 'w': key -3 at position 2 is outside \[0, 10\)"
    ):
        validate_keys(np.array([1, 2, -3, 11]), 10, "pull from 'w'")
    with pytest.raises(ValueError, match=r"push: key 10 at position 1 is outside \[0, 10\)"):
        validate_keys(np.array([1, 10, 12]), 10, "push")
    with pytest.raises(ValueError, match="key 18446744073709551615 at position 0"):
        validate_keys(np.array([2**64 - 1], dtype=np.uint64), 2**63 - 1, "push")
    with pytest.raises(TypeError, match="push: keys must be an integer array, got dtype float64"):
        validate_keys(np.array([1.0]), 10, "push")
