"""A shard's exactly-once reduce is atomic: no pull sees it half done, a refusal changes
nothing (ps_server.shard.tensors.Tensor, in process: the shard's RPCs call exactly these)."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from ps_server.proto import ps_pb2 as pb
from ps_server.shard.tensors import Tensor
from ps_server.wire import RequestError


def _tensor(kind: str, n: int, budget: int = 0) -> Tensor:
    spec = pb.ModelSpec(
        name="w", kind=kind, dim=n, cols=1, dtype="float64", length=n if kind == "dense" else 0
    )
    spec.budget_bytes = budget
    return Tensor.create(spec)


@pytest.mark.parametrize("kind", ["dense", "sparse"])
def test_pull_never_sees_a_zero_first_reduce_half_done(kind):
    """Every round sets the model to exactly 1.0 (zero first, then add the contributions
    1.0 and 0.0). A pull between the fill and the add would see 0.0: it must see 1.0
    always. (Before the reduce held its lock throughout, pulls saw 0.0 within a few
    rounds.)"""
    n = 200_000
    t = _tensor(kind, n)
    keys = np.arange(n, dtype=np.int64)
    t.push(keys, np.ones((n, 1)), pb.SET)
    stop = threading.Event()
    seen: list[float] = []

    def pull() -> None:
        probe = keys[:: n // 64]
        while not stop.is_set():
            seen.append(float(t.pull(probe, "").min()))

    reader = threading.Thread(target=pull)
    reader.start()
    try:
        for r in range(30):
            t.contribute(r, 0, 0, keys, np.ones((n, 1)))
            t.contribute(r, 1, 0, keys[::2], np.zeros((n // 2, 1)))
            assert t.reduce(r, pb.ADD, zero_first=True) == 2
    finally:
        stop.set()
        reader.join()
    assert len(seen) > 30 and min(seen) == 1.0
    assert t.pull(keys[:3], "").ravel().tolist() == [1.0, 1.0, 1.0]


def test_a_refused_reduce_leaves_model_and_round_as_they_were():
    """A zero-first reduce past the model's budget is refused before anything changes:
    the weights are not zeroed and the round's contributions are still there to reduce."""
    t = _tensor("sparse", 1 << 40, budget=40_000)
    t.push(np.arange(100, dtype=np.int64), np.full((100, 1), 7.0), pb.SET)
    big = np.arange(10_000, 12_000, dtype=np.int64)  # 2,000 new rows: past 40 kB
    t.contribute(3, 0, 0, big, np.ones((2000, 1)))  # 32 kB buffered: within the budget
    with pytest.raises(RequestError) as e:
        t.reduce(3, pb.ADD, zero_first=True)
    assert e.value.code == "RESOURCE_EXHAUSTED" and "nothing was changed" in str(e.value)
    assert t.pull(np.arange(100, dtype=np.int64), "").ravel().tolist() == [7.0] * 100
    assert t.contributions.parts(3) == {0}
    k, v = t.contributions.reduce(3)
    assert np.array_equal(k, big) and np.all(v == 1.0)


@pytest.mark.parametrize("dtype,cols", [("float64", 1), ("float32", 3)])
def test_a_zero_first_dense_sum_in_place_has_the_bits_of_combining_first(dtype, cols, monkeypatch):
    """A zero-first ADD reduce of a dense slice adds each contribution into the zeroed
    weights in (part, chunk) order: the same bits as summing them in a buffer first and
    adding that to zeros (the general path), duplicates, -0.0 and arrival order included."""
    n, off = 5000, 1000

    def run(general: bool) -> tuple[np.ndarray, np.ndarray]:
        spec = pb.ModelSpec(
            name="g", kind="dense", dim=n + off, cols=cols, dtype=dtype, offset=off, length=n
        )
        t = Tensor.create(spec)
        t.push(np.arange(off, off + n), np.full((n, cols), 3.0, dtype), pb.SET)
        if general:
            monkeypatch.setattr(Tensor, "_sum_in_place", lambda self, entries: False)
        r = np.random.default_rng(11)
        for part, chunk in [(1, 0), (0, 0), (1, 1), (0, 1)]:  # arrives out of order
            k = r.integers(off, off + n // 2, size=3000)  # duplicates; half the rows untouched
            scale = 10.0 ** r.integers(-8, 8, k.size)[:, None]  # sums that round
            v = (r.normal(size=(k.size, cols)) * scale).astype(dtype)  # as a push's, checked
            v[:5] = -0.0
            t.contribute(2, part, chunk, k, v)
        assert t.reduce(2, pb.ADD, zero_first=True) == 2
        monkeypatch.undo()
        assert t.contributions.rounds() == []
        return t.store.slot("w")[:n].copy(), t.pull(np.arange(off, off + n), "")

    fast, pulled = run(general=False)
    slow, _ = run(general=True)
    assert np.array_equal(fast.view(np.uint8), slow.view(np.uint8))  # bit for bit
    assert np.all(fast[n // 2 :] == 0) and np.array_equal(pulled, fast)
