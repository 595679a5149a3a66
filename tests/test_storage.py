"""HashIndex, DenseStore, SparseStore and Contributions against plain-Python references."""

from __future__ import annotations

import numpy as np
import pytest

from ps_server.keys import mix64
from ps_server.shard.storage import Contributions, DenseStore, HashIndex, SparseStore, Store

BIG = 2**63 - 1


def _random_keys(rng: np.random.Generator, n: int) -> np.ndarray:
    """Keys spread over the whole int64 range, near 2**63-1, small, and repeated."""
    parts = [
        rng.integers(0, BIG, n // 2, dtype=np.int64, endpoint=True),
        BIG - rng.integers(0, 50, n // 4),
        rng.integers(0, 100, n - n // 2 - n // 4),
    ]
    return rng.permutation(np.concatenate(parts)).astype(np.int64)


class DictIndex:
    """Reference: rows numbered by first insertion, via a Python dict."""

    def __init__(self):
        self.rows: dict[int, int] = {}

    def get_or_insert(self, keys):
        before = len(self.rows)
        out = [self.rows.setdefault(k, len(self.rows)) for k in keys.tolist()]
        return out, len(self.rows) - before


def _save_load(state: dict[str, np.ndarray], tmp_path) -> dict[str, np.ndarray]:
    path = tmp_path / "state.npz"
    np.savez(path, **state)
    with np.load(path, allow_pickle=False) as z:
        return {k: z[k] for k in z.files}


# ---------------------------------------------------------------- HashIndex
def test_hash_index_matches_dict_across_rehashes():
    rng = np.random.default_rng(10)
    index, ref = HashIndex(), DictIndex()
    caps = set()
    for batch in range(25):
        keys = _random_keys(rng, 40 * (batch + 1))
        if batch % 5 == 4:  # mix in keys seen before
            keys = np.concatenate([keys, np.array(list(ref.rows)[:30], dtype=np.int64)])
        rows, created = index.get_or_insert(keys)
        want, want_created = ref.get_or_insert(keys)
        assert rows.dtype == np.int64 and rows.tolist() == want
        assert created == want_created
        caps.add(index.capacity)
        assert 2 * len(index) <= index.capacity
    assert len(caps) >= 6  # grew (and rehashed) several times
    assert len(index) == len(ref.rows)
    assert index.keys().tolist() == list(ref.rows)
    absent = np.array(
        [k for k in range(100, 400) if k not in ref.rows] + [BIG - 60], dtype=np.int64
    )
    assert np.all(index.lookup(absent) == -1)
    present = np.array(list(ref.rows), dtype=np.int64)
    assert index.lookup(present).tolist() == list(range(len(present)))
    assert index.nbytes >= 16 * index.capacity


def test_hash_index_duplicates_and_collisions_in_one_batch():
    # keys that share a home slot in a 16-slot table, repeated and interleaved
    cands = np.arange(2000, dtype=np.int64)
    same_home = cands[(mix64(cands) & np.uint64(15)) == 3][:6]
    keys = np.concatenate([same_home, same_home[::-1], same_home[:2], [BIG, BIG, 0]])
    index = HashIndex(16)
    rows, created = index.get_or_insert(keys)
    want, want_created = DictIndex().get_or_insert(keys)
    assert rows.tolist() == want and created == want_created == 8
    assert index.capacity == 16  # no growth: the six really collided on one home slot
    rows2, created2 = index.get_or_insert(keys[::-1])
    assert created2 == 0 and rows2.tolist() == want[::-1]


def test_hash_index_is_deterministic():
    rng = np.random.default_rng(11)
    batches = [_random_keys(rng, 500) for _ in range(4)]
    a, b = HashIndex(), HashIndex()
    for keys in batches:
        ra, _ = a.get_or_insert(keys)
        rb, _ = b.get_or_insert(keys.copy())
        assert np.array_equal(ra, rb)
    assert np.array_equal(a._slot_keys, b._slot_keys)
    assert np.array_equal(a._slot_rows, b._slot_rows)


def test_hash_index_empty_and_negative_keys():
    index = HashIndex()
    rows, created = index.get_or_insert(np.empty(0, dtype=np.int64))
    assert rows.size == 0 and created == 0 and len(index) == 0
    assert index.lookup(np.empty(0, dtype=np.int64)).size == 0
    with pytest.raises(ValueError, match="key -5 at position 1 is negative"):
        index.get_or_insert(np.array([3, -5]))
    with pytest.raises(TypeError, match="integer array"):
        index.lookup(np.array([1.5]))
    assert len(index) == 0


def test_hash_index_large_batch():
    keys = np.random.default_rng(12).integers(0, BIG, 300_000, dtype=np.int64)
    index = HashIndex()
    rows, created = index.get_or_insert(keys)
    uniq, first = np.unique(keys, return_index=True)
    assert created == uniq.size
    assert np.array_equal(index.keys(), keys[np.sort(first)])
    assert np.array_equal(index.lookup(keys), rows)


# ---------------------------------------------------------------- DenseStore
def test_dense_store_ops_and_state(tmp_path):
    store = DenseStore(length=6, cols=2, offset=100, dtype="float64")
    assert store.num_rows == 6 and store.all_keys().tolist() == list(range(100, 106))
    keys = np.array([101, 105, 101])
    store.add(keys, np.array([[1.0, 2.0], [3.0, 4.0], [10.0, 20.0]]))
    assert store.gather(np.array([101, 105, 100])).tolist() == [[11, 22], [3, 4], [0, 0]]
    store.assign(np.array([100, 100]), np.array([[7.0, 7.0], [8.0, 9.0]]))  # last wins
    assert store.gather(np.array([100])).tolist() == [[8, 9]]
    assert store.locate(np.array([105, 100]), create=False).tolist() == [5, 0]
    store.add_slot("acc", fill=0.5)
    store.add(np.array([102]), np.array([[1.0, 1.0]]), slot="acc")
    restored = Store.from_state(_save_load(store.state(), tmp_path))
    assert isinstance(restored, DenseStore) and restored.offset == 100
    for name in ("w", "acc"):
        assert np.array_equal(restored.all_values(name), store.all_values(name))
    assert restored.all_values("acc")[2].tolist() == [1.5, 1.5]
    with pytest.raises(ValueError, match="state holds a DenseStore, not a SparseStore"):
        SparseStore.from_state(store.state())
    store.fill(2.5)
    assert np.all(store.all_values() == 2.5)
    assert not np.all(restored.all_values() == 2.5)  # a snapshot, not a view


def test_dense_store_rejects_out_of_range_keys():
    store = DenseStore(4, 1, 10, np.float32)
    with pytest.raises(ValueError, match=r"key 14 at position 1 is outside \[10, 14\)"):
        store.gather(np.array([10, 14]))
    with pytest.raises(ValueError, match=r"key 9 at position 0"):
        store.add(np.array([9]), np.array([1.0]))
    with pytest.raises(ValueError, match=r"values must have shape \(2, 1\), got \(3,\)"):
        store.add(np.array([10, 11]), np.zeros(3))
    with pytest.raises(KeyError, match="no slot 'm'"):
        store.slot("m")


# ---------------------------------------------------------------- SparseStore
def test_sparse_store_matches_dict_reference(tmp_path):
    rng = np.random.default_rng(13)
    store = SparseStore(cols=3, dtype=np.float64)
    store.add_slot("acc", fill=0.25)
    ref: dict[int, np.ndarray] = {}
    for step in range(30):  # grows from 16 rows through several doublings
        keys = _random_keys(rng, 12 + 4 * step)
        vals = rng.standard_normal((keys.size, 3))
        if step % 3 == 2:
            store.assign(keys, vals)
            for k, v in zip(keys.tolist(), vals, strict=True):
                ref[k] = v.copy()  # last wins
        else:
            store.add(keys, vals)
            for k, v in zip(keys.tolist(), vals, strict=True):
                ref[k] = ref.get(k, np.zeros(3)) + v
    assert store.num_rows == len(ref)
    keys = np.array(list(ref), dtype=np.int64)
    assert np.array_equal(store.all_keys(), keys)  # row order = first touch
    np.testing.assert_allclose(store.gather(keys), np.array(list(ref.values())), rtol=1e-12)
    assert np.array_equal(store.all_values(), store.gather(keys))
    assert np.all(store.all_values("acc") == 0.25)  # new rows of a state slot get its fill
    absent = np.array([101, 202, 303], dtype=np.int64)
    absent = absent[~np.isin(absent, keys)]
    assert np.all(store.gather(absent) == 0) and np.all(store.gather(absent, "acc") == 0.25)
    assert store.num_rows == len(ref)  # gather without create stores nothing
    assert np.all(store.locate(absent, create=False) == -1)

    restored = Store.from_state(_save_load(store.state(), tmp_path))
    assert isinstance(restored, SparseStore)
    assert np.array_equal(restored.all_keys(), store.all_keys())
    for name in ("w", "acc"):
        assert np.array_equal(restored.all_values(name), store.all_values(name))
    more = np.array([BIG, 5, BIG - 1000], dtype=np.int64)
    assert np.array_equal(restored.locate(more, True), store.locate(more, True))
    store.fill(-1.0)
    assert np.all(store.all_values() == -1.0)
    assert np.all(store.all_values("acc") == 0.25)


def test_sparse_store_slots_stay_aligned_when_growing():
    store = SparseStore(cols=2, dtype=np.float32)
    store.add_slot("m")
    store.add_slot("t", dtype=np.float64, cols=1)
    first = np.arange(10, dtype=np.int64) * 7
    rows = store.locate(first, create=True)
    store.slot("m")[rows] = first[:, None]
    store.slot("t")[rows] = first[:, None] + 0.5
    store.locate(np.arange(1000, 5000, dtype=np.int64), create=True)  # forces reallocation
    rows = store.locate(first, create=False)
    assert np.array_equal(store.slot("m")[rows][:, 0], first.astype(np.float32))
    assert np.array_equal(store.slot("t")[rows][:, 0], first + 0.5)
    assert store.slot("t").shape == (store.slot("w").shape[0], 1)
    assert store.slot("w").dtype == np.float32 and store.nbytes > 4000 * 2 * 4


@pytest.mark.parametrize("init", ["normal", "uniform"])
def test_random_init_depends_only_on_seed_and_key(init):
    rng = np.random.default_rng(14)
    keys = np.unique(_random_keys(rng, 4000))
    a = SparseStore(4, np.float64, init=init, init_scale=0.1, seed=7)
    b = SparseStore(4, np.float64, init=init, init_scale=0.1, seed=7)
    a.locate(keys, create=True)
    for chunk in np.array_split(rng.permutation(keys), 5):  # other order, other batches
        b.locate(chunk, create=True)
    va = a.gather(keys)
    assert np.array_equal(va, b.gather(keys))
    assert not np.array_equal(a.all_values(), b.all_values())  # rows differ, values agree
    other = SparseStore(4, np.float64, init=init, init_scale=0.1, seed=8)
    assert not np.any(other.gather(keys, create=True) == va)
    assert np.all(a.gather(np.array([3]), create=False) == 0) or 3 in keys
    if init == "uniform":
        assert va.min() >= -0.1 and va.max() < 0.1
        assert abs(va.std() - 0.1 / np.sqrt(3)) < 0.005
    else:
        assert abs(va.mean()) < 0.005 and abs(va.std() - 0.1) < 0.005
    assert len({tuple(r) for r in va.tolist()}) == keys.size  # columns are not copies
    assert abs(np.corrcoef(va[:, 0], va[:, 1])[0, 1]) < 0.05


def test_sparse_random_init_pull_without_create_is_zero():
    store = SparseStore(2, np.float64, init="normal", init_scale=1.0, seed=1)
    assert np.all(store.gather(np.array([5, 6])) == 0) and store.num_rows == 0
    created = store.gather(np.array([5, 6]), create=True)
    assert np.all(created != 0) and store.num_rows == 2
    assert np.array_equal(store.gather(np.array([6, 5])), created[::-1])


def test_sparse_store_rejects_bad_arguments():
    with pytest.raises(ValueError, match="init must be one of .* got 'ones'"):
        SparseStore(2, np.float64, init="ones")
    with pytest.raises(ValueError, match="init_scale must be finite and >= 0, got -1.0"):
        SparseStore(2, np.float64, init="normal", init_scale=-1.0)
    with pytest.raises(ValueError, match="cols must be >= 1, got 0"):
        SparseStore(0, np.float64)
    with pytest.raises(TypeError, match="dtype must be floating or int64, got int32"):
        SparseStore(1, np.int32)
    with pytest.raises(ValueError, match="key -1 at position 0 is negative"):
        SparseStore(1, np.float64).add(np.array([-1]), np.array([1.0]))


# ---------------------------------------------------------------- Contributions
def _contributions(rng: np.random.Generator, n_parts: int = 6, chunks: int = 3):
    out = []
    for part in range(n_parts):
        for chunk in range(chunks):
            keys = rng.integers(0, 50, 40)
            out.append((part, chunk, keys, rng.standard_normal((40, 2))))
    return out


def test_contributions_reduce_is_bit_identical_under_shuffles_and_replays():
    rng = np.random.default_rng(15)
    items = _contributions(rng)
    ref = Contributions()
    for part, chunk, keys, vals in items:
        ref.put(1, part, chunk, keys, vals)
    rk, rv = ref.reduce(1)
    # reference: plain-Python sum per key in (part, chunk) order
    sums: dict[int, np.ndarray] = {}
    for _, _, keys, vals in sorted(items, key=lambda t: (t[0], t[1])):
        for k, v in zip(keys.tolist(), vals, strict=True):
            sums[k] = sums.get(k, np.zeros(2)) + v
    assert rk.tolist() == sorted(sums)
    np.testing.assert_allclose(rv, np.array([sums[k] for k in sorted(sums)]), rtol=1e-12)
    for trial in range(3):
        c = Contributions()
        order = np.random.default_rng(trial).permutation(len(items))
        order = sorted(order, key=lambda i: items[i][1] > 0)  # chunk 0s first, as clients send
        for i in order:
            part, chunk, keys, vals = items[i]
            c.put(1, part, chunk, keys, vals * 3.0)  # a failed first attempt ...
        for i in sorted(order[::-1], key=lambda i: items[i][1] > 0):
            part, chunk, keys, vals = items[i]
            c.put(1, part, chunk, keys, vals)  # ... replaced by its retry
        ck, cv = c.reduce(1)
        assert ck.tobytes() == rk.tobytes() and cv.tobytes() == rv.tobytes()
        assert c.parts(1) == set(range(6)) and c.nbytes == ref.nbytes


def test_a_parts_chunk_0_replaces_every_chunk_of_its_earlier_attempt():
    """A replay that splits into fewer chunks, or sends this shard nothing (an empty chunk
    0), leaves nothing of the first attempt; other parts are untouched."""
    c = Contributions()
    for chunk in range(3):  # first attempt of part 0: three chunks
        c.put(1, 0, chunk, np.array([chunk]), np.array([100.0]))
    c.put(1, 1, 0, np.array([7]), np.array([1.0]))
    c.put(1, 0, 0, np.array([0, 1, 2]), np.array([1.0, 2.0, 3.0]))  # the replay: one chunk
    k, v = c.reduce(1)
    assert k.tolist() == [0, 1, 2, 7] and v.tolist() == [1.0, 2.0, 3.0, 1.0]
    c.put(1, 0, 0, np.zeros(0, np.int64), np.zeros(0))  # a replay with no keys here
    k, v = c.reduce(1)
    assert k.tolist() == [7] and v.tolist() == [1.0] and c.parts(1) == {0, 1}


def test_contributions_rounds_and_drop():
    c = Contributions()
    c.put(3, 0, 0, np.array([1, 2]), np.array([1.0, 2.0]))
    c.put(3, 1, 0, np.array([2]), np.array([5.0]))
    c.put(4, 0, 0, np.array([9]), np.array([1.0]))
    c.put(5, 2, 0, np.array([9]), np.array([1.0]))
    k, v = c.reduce(3)
    assert k.tolist() == [1, 2] and v.tolist() == [1.0, 7.0]
    assert c.parts(3) == {0, 1} and c.parts(99) == set()
    c.drop(3)
    assert c.rounds() == [4, 5] and c.reduce(3)[0].size == 0
    c.drop_before(5)
    assert c.rounds() == [5] and c.parts(5) == {2}
    c.drop(42)  # absent: no error
    with pytest.raises(ValueError, match=r"values shape \(1, 3\) does not match part 2 chunk 0"):
        c.put(5, 0, 0, np.array([1]), np.zeros((1, 3)))
    with pytest.raises(ValueError, match=r"must be \[2\] or \[2, cols\], got \(3,\)"):
        c.put(5, 0, 0, np.array([1, 2]), np.zeros(3))


def test_contributions_copy_on_put():
    c = Contributions()
    keys, vals = np.array([1, 2]), np.array([1.0, 2.0])
    c.put(0, 0, 0, keys, vals)
    vals[:] = 100.0
    assert c.reduce(0)[1].tolist() == [1.0, 2.0]


def test_contributions_keep_read_only_arrays_and_copy_writable_ones():
    """A request's arrays are read-only views of its bytes: kept as they are. Writable
    arrays are copied, so that the caller changing them later changes no contribution."""
    c = Contributions()
    keys, values = np.arange(4), np.ones((4, 1))
    c.put(0, 0, 0, keys, values)
    keys[:], values[:] = 9, 5.0  # the caller reuses its arrays
    k, v = c.reduce(0)
    assert k.tolist() == [0, 1, 2, 3] and v.ravel().tolist() == [1.0] * 4
    frame = np.arange(4, dtype=np.int64).tobytes() + np.full(4, 2.0).tobytes()
    rk = np.frombuffer(frame, np.int64, 4)
    rv = np.frombuffer(frame, np.float64, 4, offset=32).reshape(4, 1)
    c.put(1, 0, 0, rk, rv)
    ((kept_k, kept_v),) = c.entries(1)
    assert np.shares_memory(kept_k, rk) and np.shares_memory(kept_v, rv)  # no copy
    assert c.reduce(1)[1].ravel().tolist() == [2.0] * 4
