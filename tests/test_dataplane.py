"""The data plane's compiled key passes against plain numpy references.

Each path (combine + route, dedup + route, route only, the shard's hash index, scatter-add,
gather) must give exactly what ``np.unique`` + ``np.add.at`` give, on random keys with
duplicates, empty arrays, one key, keys at the int64 edges, and every value dtype the PS
serves; and the client's pull keeps the request's order while its unique fast paths agree
with the combining ones.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from ps_server import keys_jit
from ps_server.keys import (
    combine_by_shard,
    dedup_by_shard,
    group_by_shard,
    hash_shard,
    range_bounds,
    range_shard,
)
from ps_server.shard.storage import HashIndex, SparseStore
from ps_server.shard.tensors import VALUE_DTYPES

#: exact sums in input order and first-occurrence order are the compiled passes' promise
needs_jit = pytest.mark.skipif(not keys_jit.available(), reason="numba absent or disabled")

I64 = np.iinfo(np.int64)
EDGE_KEYS = np.array([I64.max, 0, I64.min, -1, I64.max, 1, I64.min, 2**40, -1], dtype=np.int64)


def _keysets():
    rng = np.random.default_rng(7)
    return {
        "empty": np.zeros(0, np.int64),
        "one": np.array([12345], np.int64),
        "dups": rng.integers(0, 500, size=3000).astype(np.int64),
        "wide": rng.integers(0, 2**62, size=2000).astype(np.int64),
        "edges": EDGE_KEYS,
        "sorted": np.arange(100, dtype=np.int64) * 3,
        "bucketed": rng.integers(0, 9000, size=20000).astype(np.int64),  # radix buckets
    }


def _values(n: int, cols: int, dtype: str, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if dtype == "int64":
        return rng.integers(-(2**40), 2**40, size=(n, cols)).astype(np.int64)
    return rng.normal(size=(n, cols)).astype(dtype)


def _reference(keys, values):
    """np.unique + np.add.at: sorted unique keys and their sums (in input order)."""
    uniq, inv = np.unique(keys, return_inverse=True)
    sums = np.zeros((uniq.size, values.shape[1]), dtype=values.dtype)
    np.add.at(sums, inv.reshape(-1), values)
    return uniq, sums


def _route(keys, shards, bounds):
    if shards == 1:
        return np.zeros(keys.size, np.int64)
    return hash_shard(keys, shards) if bounds is None else range_shard(keys, bounds)


def _check_grouped(keys, offsets, shards, bounds):
    """Offsets cover the keys and every key sits in its own shard's group."""
    assert offsets[0] == 0 and offsets[-1] == keys.size and np.all(np.diff(offsets) >= 0)
    owner = np.repeat(np.arange(shards), np.diff(offsets))
    np.testing.assert_array_equal(_route(keys, shards, bounds), owner)


@needs_jit
@pytest.mark.parametrize("dtype", VALUE_DTYPES)
@pytest.mark.parametrize("name", list(_keysets()))
@pytest.mark.parametrize("shards", [1, 3])
def test_combine_by_shard_equals_unique_and_add_at(name, dtype, shards):
    keys = _keysets()[name]
    values = _values(keys.size, 2, dtype)
    got_k, got_v, offsets = combine_by_shard(keys, values, shards)
    _check_grouped(got_k, offsets, shards, None)
    assert got_v.dtype == values.dtype and got_v.shape == (got_k.size, 2)
    order = np.argsort(got_k, kind="stable")
    ref_k, ref_v = _reference(keys, values)
    np.testing.assert_array_equal(got_k[order], ref_k)
    np.testing.assert_array_equal(got_v[order], ref_v)  # same order of addition: exact


@needs_jit
def test_combine_keeps_first_occurrence_order_within_a_shard():
    keys = np.array([9, 4, 9, 7, 4, 1], np.int64)
    got_k, got_v, offsets = combine_by_shard(keys, np.arange(6.0).reshape(-1, 1), 1)
    np.testing.assert_array_equal(got_k, [9, 4, 7, 1])
    np.testing.assert_array_equal(got_v[:, 0], [0 + 2, 1 + 4, 3, 5])
    np.testing.assert_array_equal(offsets, [0, 4])


@needs_jit
@pytest.mark.parametrize("shards", [1, 2, 4])
def test_range_routing_matches_searchsorted(shards):
    rng = np.random.default_rng(3)
    dim = 1000
    bounds = range_bounds(dim, shards)
    keys = rng.integers(0, dim, size=5000).astype(np.int64)
    values = rng.normal(size=(keys.size, 1))
    got_k, got_v, offsets = combine_by_shard(keys, values, shards, bounds)
    _check_grouped(got_k, offsets, shards, bounds)
    ref_k, ref_v = _reference(keys, values)
    order = np.argsort(got_k)
    np.testing.assert_array_equal(got_k[order], ref_k)
    np.testing.assert_array_equal(got_v[order], ref_v)
    order2, off2 = group_by_shard(keys, shards, bounds)
    routed = keys if order2 is None else keys[order2]
    _check_grouped(routed, off2, shards, bounds)


@pytest.mark.parametrize("name", list(_keysets()))
@pytest.mark.parametrize("shards", [1, 2, 5])
def test_dedup_by_shard_inverse_restores_the_request(name, shards):
    keys = _keysets()[name]
    uniq, offsets, inverse = dedup_by_shard(keys, shards)
    _check_grouped(uniq, offsets, shards, None)
    np.testing.assert_array_equal(np.sort(uniq), np.unique(keys))
    restored = uniq if inverse is None else uniq[inverse]
    np.testing.assert_array_equal(restored, keys)
    if inverse is None:  # only when nothing moved
        assert np.unique(keys).size == keys.size


@pytest.mark.parametrize("name", list(_keysets()))
@pytest.mark.parametrize("shards", [1, 2, 5])
def test_group_by_shard_is_a_stable_grouping(name, shards):
    keys = _keysets()[name]
    order, offsets = group_by_shard(keys, shards)
    order = np.arange(keys.size) if order is None else order
    np.testing.assert_array_equal(np.sort(order), np.arange(keys.size))
    _check_grouped(keys[order], offsets, shards, None)
    for s in range(shards):  # stable: positions ascend within each shard
        part = order[offsets[s] : offsets[s + 1]]
        assert np.all(np.diff(part) > 0)


@needs_jit
def test_the_numpy_fallback_gives_the_same_sums(monkeypatch):
    rng = np.random.default_rng(11)
    keys = rng.integers(0, 300, size=2000).astype(np.int64)
    values = rng.normal(size=(keys.size, 3))
    jit = combine_by_shard(keys, values, 3)
    monkeypatch.setattr(keys_jit, "available", lambda: False)
    plain = combine_by_shard(keys, values, 3)
    for k, off in ((jit[0], jit[2]), (plain[0], plain[2])):
        _check_grouped(k, off, 3, None)
    a, b = np.argsort(jit[0]), np.argsort(plain[0])
    np.testing.assert_array_equal(jit[0][a], plain[0][b])
    np.testing.assert_allclose(jit[1][a], plain[1][b], rtol=1e-12, atol=1e-12)
    uniq, off, inv = dedup_by_shard(keys, 3)
    np.testing.assert_array_equal(uniq[inv], keys)


def test_hash_index_matches_a_dict_across_growth():
    rng = np.random.default_rng(5)
    index, ref = HashIndex(), {}
    for _ in range(6):  # grows from 16 slots past 8k keys, duplicates within each batch
        batch = rng.integers(0, 6000, size=3000).astype(np.int64)
        batch[:2] = [I64.max, 0]
        rows, created = index.get_or_insert(batch)
        before = len(ref)
        for k in batch.tolist():
            ref.setdefault(k, len(ref))
        assert created == len(ref) - before
        np.testing.assert_array_equal(rows, [ref[k] for k in batch.tolist()])
        assert 2 * len(index) <= index.capacity
    probe = np.array([*ref, 10**12, I64.max - 1], np.int64)
    np.testing.assert_array_equal(index.lookup(probe), [*ref.values(), -1, -1])
    np.testing.assert_array_equal(index.keys(), list(ref))


def test_hash_index_lookup_of_many_keys_in_any_order():
    rng = np.random.default_rng(8)
    keys = rng.choice(2**62, size=70_000, replace=False).astype(np.int64)
    index = HashIndex.from_keys(keys)
    asked = np.concatenate([keys[::-1], rng.integers(2**62, I64.max, size=1000), keys[:5]])
    got = index.lookup(asked)
    want = np.concatenate([np.arange(keys.size)[::-1], np.full(1000, -1), np.arange(5)])
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("dtype", VALUE_DTYPES)
def test_store_add_and_gather_equal_add_at(dtype):
    rng = np.random.default_rng(2)
    store = SparseStore(2, dtype)
    ref: dict[int, np.ndarray] = {}
    for seed in range(3):
        keys = rng.integers(0, 400, size=1500).astype(np.int64)
        values = _values(keys.size, 2, dtype, seed)
        store.add(keys, values)
        for k, v in zip(keys.tolist(), values, strict=True):
            ref[k] = ref.get(k, np.zeros(2, dtype)) + v
    asked = np.array([5, 399, 1000, 5, 0], np.int64)
    got = store.gather(asked)
    want = np.array([ref.get(k, np.zeros(2, dtype)) for k in asked.tolist()])
    assert got.dtype == np.dtype(dtype)
    if dtype == "int64":
        np.testing.assert_array_equal(got, want)
    else:  # python's + per key in the reference adds in the same order as the store
        np.testing.assert_array_equal(got, want.astype(dtype))


# --------------------------------------------------------------- through real shards
@pytest.fixture
def small_chunks(ps):
    """Requests of ~4 KB, so a call spreads over several chunks per shard."""
    client = ps.client
    saved = client.max_message_bytes
    client.max_message_bytes = 4096
    yield client
    client.max_message_bytes = saved


@pytest.mark.parametrize("dtype", VALUE_DTYPES)
@pytest.mark.parametrize("kind", ["sparse", "dense"])
def test_push_and_pull_through_shards_equal_add_at(ps, small_chunks, kind, dtype):
    from spark_ps import PSMatrix

    rng = np.random.default_rng(1)
    dim = 5000 if kind == "dense" else 2**62
    m = (
        PSMatrix.dense(dim, 2, dtype=dtype)
        if kind == "dense"
        else PSMatrix.sparse(2, dim, dtype=dtype)
    )
    keys = rng.integers(0, min(dim, 2**62), size=1200).astype(np.int64)
    keys[rng.integers(0, keys.size, 300)] = keys[:300]  # plenty of duplicates
    keys[:2] = [dim - 1, 0]
    values = _values(keys.size, 2, dtype, 4)
    m.increment(keys, values)
    asked = np.concatenate([keys[::-1], keys[:50]])  # duplicates, in no order
    ref_k, ref_v = _reference(keys, values)
    want = ref_v[np.searchsorted(ref_k, asked)]
    got = m.pull(asked)
    assert got.dtype == np.dtype(dtype) and got.shape == (asked.size, 2)
    if dtype == "int64" or (dtype == "float64" and keys_jit.available()):
        np.testing.assert_array_equal(got, want)  # summed in input order, as np.add.at
    else:  # float32 sums round per add; numpy's fallback sums pairwise (np.add.reduceat)
        np.testing.assert_allclose(got, want, rtol=1e-5 if dtype == "float32" else 1e-12)
    m.drop()


@pytest.mark.parametrize("kind", ["sparse", "dense"])
def test_unique_fast_paths_equal_the_combining_paths(ps, small_chunks, kind):
    from spark_ps import PSVector

    rng = np.random.default_rng(9)
    dim = 100_000 if kind == "dense" else 2**62
    keys = rng.choice(min(dim, 2**40), size=3000, replace=False).astype(np.int64)
    values = rng.normal(size=keys.size)
    a, b = getattr(PSVector, kind)(dim), getattr(PSVector, kind)(dim)
    a.increment(keys, values)
    b.increment(keys, values, unique=True)
    for vec in (a, b):
        np.testing.assert_array_equal(vec.pull(keys), values)
        np.testing.assert_array_equal(vec.pull(keys, unique=True), values)
    # a caller that wrongly says unique still gets the right sums: the shards add repeats
    dup = np.concatenate([keys[:10], keys[:10]])
    b.increment(dup, np.ones(dup.size), unique=True)
    np.testing.assert_array_equal(b.pull(keys[:10], unique=True), values[:10] + 1.0 + 1.0)
    np.testing.assert_array_equal(b.pull(dup, unique=True), np.tile(values[:10] + 1.0 + 1.0, 2))
    a.drop()
    b.drop()


@pytest.mark.parametrize("repeats", [0.002, 0.5])
def test_calls_with_few_repeats_skip_the_combine_and_still_equal_add_at(ps, repeats):
    """A large call whose keys barely repeat is sent as it is (the shards sum a push's
    repeats in order, a pull's are answered each); one with many is combined first. Both
    equal np.add.at, pulls in the request's order."""
    from spark_ps import PSVector
    from spark_ps.client.client import _few_repeats

    rng = np.random.default_rng(11)
    n = 100_000
    keys = rng.choice(2**40, size=n, replace=False).astype(np.int64)
    m = int(repeats * n)
    seen = np.linspace(0, n - 1, math.isqrt(20 * n)).astype(np.int64)  # what it samples
    free = np.setdiff1d(np.arange(n), seen) if repeats < 0.1 else np.arange(n)
    keys[rng.choice(free, m, replace=False)] = keys[rng.choice(free, m)]  # 200 or 50k repeats
    assert _few_repeats(keys) == (repeats < 0.1)
    values = rng.normal(size=(n, 1))
    v = PSVector.sparse(2**40)
    v.increment(keys, values[:, 0])
    v.increment(keys[:1000], values[:1000, 0])
    ref_k, ref_v = _reference(
        np.concatenate([keys, keys[:1000]]), np.concatenate([values, values[:1000]])
    )
    asked = keys[::-1]
    want = ref_v[np.searchsorted(ref_k, asked)].reshape(-1)
    if keys_jit.available():
        np.testing.assert_array_equal(v.pull(asked), want)
    else:
        np.testing.assert_allclose(v.pull(asked), want, rtol=1e-12, atol=1e-12)
    v.drop()


def test_exactly_once_contributions_with_the_unique_path(ps, small_chunks):
    from spark_ps import PSVector

    keys = np.array([2**50, 3, 2**33 + 1, 77], np.int64)
    x = PSVector.sparse(2**62)
    x.aggregate(keys, np.ones(4), round=1, part=0, unique=True)
    x.aggregate(keys, np.ones(4), round=1, part=0, unique=True)  # a retry replaces it
    x.aggregate(keys[:2], np.full(2, 5.0), round=1, part=1)
    x.reduce(1)
    np.testing.assert_array_equal(x.pull(keys), [6.0, 6.0, 1.0, 1.0])
    x.drop()


def test_the_ps_bench_runs_at_a_tiny_size():
    """bench/ps.py end to end on 2,000 keys, one shard: every op timed, with its stages."""
    from bench import ps as bench_ps

    rows = bench_ps.run(2000, [1], 1)
    by_name = {r[0]: r for r in rows}
    for name in ("sparse push", "sparse pull", "sparse push, unique=True", "dense push"):
        row = by_name[name]
        assert float(row[6]) > 0  # ms per call
        assert all(float(c) >= 0 for c in row[7:11])  # route, serialise, shard, wire ms
    assert by_name["limit: loopback socket"][4] == "1.00"
