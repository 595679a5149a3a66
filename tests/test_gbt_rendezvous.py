"""The shards as the rendezvous of worker-driven loops: real shard processes, threads as
partitions. Exactly-once per (step, partition), one answer for every caller and retry."""

from __future__ import annotations

import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from ps_server.functions.gbt import best_splits
from ps_server.functions.gbt_layer import decode_splits
from spark_ps.client import PSError

pytestmark = pytest.mark.timeout(60)


def _topic() -> str:
    return f"test-{uuid.uuid4().hex[:8]}"


def _in_threads(fn, n: int) -> list:
    out: list = [None] * n
    errors: list = []

    def run(i):
        try:
            out[i] = fn(i)
        except Exception as e:  # noqa: BLE001 - re-raised below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    if errors:
        raise errors[0]
    return out


def _gather(ps, topic, step, part, n, values, wait=10.0):
    args = {"topic": topic, "step": step, "part": part, "n_parts": n, "wait": wait}
    ((meta, arrays),) = ps.client.call(
        "rendezvous.gather", [], args, [[np.asarray(values, float)]], shards=[0]
    )
    return meta, arrays


def test_gather_answers_every_part_once_complete_and_retries_from_cache(ps):
    topic = _topic()
    res = _in_threads(lambda i: _gather(ps, topic, 3, i, 3, [i, 10.0 * i]), 3)
    want = np.array([[0.0, 0.0], [1.0, 10.0], [2.0, 20.0]])
    for meta, arrays in res:
        assert meta == {"pending": False}
        np.testing.assert_array_equal(arrays[0], want)
    # a retried task of a finished step gets the same answer, whatever it sends now
    meta, arrays = _gather(ps, topic, 3, 1, 3, [99.0, 99.0])
    np.testing.assert_array_equal(arrays[0], want)
    ps.client.call("rendezvous.drop", [], {"topic": topic})


def test_incomplete_step_is_pending_and_a_retry_replaces_its_part(ps):
    topic = _topic()
    meta, arrays = _gather(ps, topic, 0, 0, 2, [5.0], wait=0.2)
    assert meta == {"pending": True} and arrays == []
    _gather(ps, topic, 0, 0, 2, [7.0], wait=0.2)  # part 0 again: replaces, never adds
    meta, arrays = _gather(ps, topic, 0, 1, 2, [1.0])
    np.testing.assert_array_equal(arrays[0], [[7.0], [1.0]])
    ps.client.call("rendezvous.drop", [], {"topic": topic})


def _hist(rng, n_slots, f, n_bins):
    h = np.zeros((n_slots, f, n_bins, 4), np.int64)
    h[..., 0] = rng.integers(0, 20, size=h.shape[:3])
    h[..., 1] = h[..., 0] << 10
    h[..., 2] = rng.integers(-(1 << 12), 1 << 12, size=h.shape[:3])
    h[..., 3] = np.abs(h[..., 2])
    return h


def test_layer_splits_sum_parts_exactly_and_derive_siblings(ps):
    rng = np.random.default_rng(0)
    topic, f, n_bins = _topic(), 5, 8
    kw = {"min_instances_per_node": 1, "min_info_gain": 0.0, "min_weight_per_node": 0.0}
    kw["scale"] = [0.0, 0, 10]
    root = [_hist(rng, 1, f, n_bins) for _ in range(2)]
    child = [h // 3 for h in root]  # the smaller (left) child of the root's split

    def call(step, part, hist, extra):
        args = {"topic": topic, "step": step, "part": part, "n_parts": 2, "wait": 10.0}
        args.update(n_slots=hist.shape[0], n_bins=n_bins, split_kw=kw, **extra)
        ((meta, arrays),) = ps.client.call(
            "gbt_layer.splits", [], args, [[hist, np.array([0])]], shards=[0]
        )
        return decode_splits(arrays[0])

    got = _in_threads(lambda i: call(0, i, root[i], {}), 2)
    want = best_splits(root[0] + root[1], 0, **{**kw, "scale": (0.0, 0, 10)})
    assert got[0].tobytes() == got[1].tobytes() == want.tobytes()
    below = dict(parent_slots=[0], small_is_left=[True], pick=[0, 0], pick_left=[True, False])
    got = _in_threads(lambda i: call(1, i, child[i], below), 2)
    small = child[0] + child[1]
    full = np.concatenate([small, root[0] + root[1] - small])
    want = best_splits(full, 0, **{**kw, "scale": (0.0, 0, 10)})
    assert got[0].tobytes() == want.tobytes()
    ps.client.call("rendezvous.drop", [], {"topic": topic})


def test_a_root_answered_before_a_replay_still_parents_its_children(ps):
    """A shard that failed over may answer the old tasks' in-flight root call (a root needs
    no parent) before they notice the move; the relaunched tasks replay an earlier tree,
    then get that root from cache, and its children still find its histograms."""
    rng = np.random.default_rng(3)
    topic, kw = _topic(), {"min_instances_per_node": 1, "min_info_gain": 0.0}
    kw.update(min_weight_per_node=0.0, scale=[0.0, 0, 10])
    roots = [_hist(rng, 1, 3, 4) for _ in range(2)]
    below = dict(parent_slots=[0], small_is_left=[True], pick=[0, 0], pick_left=[True, False])

    def call(step, hist, extra):
        args = {"topic": topic, "step": step, "part": 0, "n_parts": 1, "n_slots": 1}
        args.update(n_bins=4, split_kw=kw, **extra)
        ((meta, arrays),) = ps.client.call(
            "gbt_layer.splits", [], args, [[hist, np.array([0])]], shards=[0]
        )
        return decode_splits(arrays[0])

    call(4, roots[1], {})  # tree 1's root, from a call of the old launch
    call(0, roots[0], {})  # the replay: tree 0, root and one layer
    call(1, roots[0] // 2, below)
    again = call(4, roots[1] * 7, {})  # tree 1's root again: from cache
    assert again.tobytes() == call(4, roots[1], {}).tobytes()
    child = call(5, roots[1] // 3, below)  # its child: derived from the kept root
    full = np.concatenate([roots[1] // 3, roots[1] - roots[1] // 3])
    assert child.tobytes() == best_splits(full, 0, **{**kw, "scale": (0.0, 0, 10)}).tobytes()
    ps.client.call("rendezvous.drop", [], {"topic": topic})


def test_a_gather_rides_on_a_layer_call_and_every_part_must_send_its_row(ps):
    """The root's call carries a worker's per-tree gather: every part gets the splits and
    every part's row in partition order, the same again on a retry; a part without a row
    (or of another size) refuses the step by name, and a row of another dtype is refused."""
    rng = np.random.default_rng(2)
    topic, f, n_bins = _topic(), 4, 8
    kw = {"min_instances_per_node": 1, "min_info_gain": 0.0, "min_weight_per_node": 0.0}
    kw["scale"] = [0.0, 0, 10]
    hists = [_hist(rng, 1, f, n_bins) for _ in range(2)]
    rows = [np.array([-1.0, 2.0, 3.5]), np.array([-0.5, 4.0, 1.25])]

    def call(step, part, arrays, wait=10.0):
        args = {"topic": topic, "step": step, "part": part, "n_parts": 2, "wait": wait}
        args.update(n_slots=1, n_bins=n_bins, split_kw=kw)
        ((meta, out),) = ps.client.call("gbt_layer.splits", [], args, [arrays], shards=[0])
        return meta, out

    got = _in_threads(lambda i: call(0, i, [hists[i], np.array([0]), rows[i]]), 2)
    want = best_splits(hists[0] + hists[1], 0, **{**kw, "scale": (0.0, 0, 10)})
    for meta, out in got:
        assert meta == {"pending": False} and decode_splits(out[0]).tobytes() == want.tobytes()
        np.testing.assert_array_equal(out[1], np.stack(rows))
    _, again = call(0, 1, [hists[1], np.array([0]), rows[0] * 9])  # a retried task
    np.testing.assert_array_equal(again[1], np.stack(rows))

    assert call(1, 0, [hists[0], np.array([0]), rows[0]], wait=0.1)[0] == {"pending": True}
    with pytest.raises(PSError, match="the size of the row to gather: parts"):
        call(1, 1, [hists[1], np.array([0])])
    with pytest.raises(PSError, match="row to gather must be 1-D float64, got int64"):
        call(2, 0, [hists[0], np.array([0]), np.arange(3)])
    ps.client.call("rendezvous.drop", [], {"topic": topic})


def test_bad_histograms_are_refused_by_name(ps):
    args = {"topic": _topic(), "step": 0, "part": 0, "n_parts": 1, "n_slots": 2, "n_bins": 4}
    bad = np.zeros((1, 3, 4, 4), np.int64)
    with pytest.raises(PSError, match=r"int64 \[2, features, 4, 4\], got int64 \[1, 3, 4, 4\]"):
        ps.client.call("gbt_layer.splits", [], args, [[bad, np.array([0])]], shards=[0])
    with pytest.raises(PSError, match="part 3 of n_parts 1"):
        ps.client.call("rendezvous.gather", [], {**args, "part": 3}, [[np.zeros(1)]], shards=[0])


def test_a_step_that_failed_is_tried_afresh_after_a_replay(ps):
    """A shard that lost the previous layer (restarted) refuses the step by name; once the
    retried tasks replay the tree from its root, the same step succeeds."""
    rng = np.random.default_rng(1)
    topic, kw = _topic(), {"min_instances_per_node": 1, "min_info_gain": 0.0}
    kw.update(min_weight_per_node=0.0, scale=[0.0, 0, 10])
    root = _hist(rng, 1, 3, 4)
    below = dict(parent_slots=[0], small_is_left=[True], pick=[0, 0], pick_left=[True, False])

    def call(step, hist, extra):
        args = {"topic": topic, "step": step, "part": 0, "n_parts": 1, "n_slots": 1}
        args.update(n_bins=4, split_kw=kw, **extra)
        return ps.client.call("gbt_layer.splits", [], args, [[hist, np.array([0])]], shards=[0])

    with pytest.raises(PSError, match=r"previous layer's histograms \(step 4\)"):
        call(5, root // 2, below)
    call(4, root, {})  # the replay: the root again
    ((meta, arrays),) = call(5, root // 2, below)
    assert meta == {"pending": False} and decode_splits(arrays[0]).size == 2
    ps.client.call("rendezvous.drop", [], {"topic": topic})


def test_a_part_with_another_n_parts_is_refused_and_the_set_still_completes(ps):
    """A mismatched count would complete the set too early (parts missing) or never."""
    topic = _topic()
    meta, _ = _gather(ps, topic, 0, 0, 2, [5.0], wait=0.1)
    assert meta == {"pending": True}
    with pytest.raises(PSError, match=r"part 1 says n_parts 3, but parts \[0\] said 2") as err:
        _gather(ps, topic, 0, 1, 3, [6.0])
    assert err.value.code.name == "INVALID_ARGUMENT"
    meta, arrays = _gather(ps, topic, 0, 1, 2, [7.0])
    np.testing.assert_array_equal(arrays[0], [[5.0], [7.0]])
    ps.client.call("rendezvous.drop", [], {"topic": topic})


def test_idle_topics_expire_after_the_ttl_but_busy_and_waiting_ones_stay(monkeypatch):
    """A driver that died before `rendezvous.drop` leaves its steps behind; a later call
    drops every topic idle for SPARK_PS_RENDEZVOUS_TTL seconds (here 2 s, its own PS)."""
    from spark_ps import PSContext

    monkeypatch.setenv("SPARK_PS_RENDEZVOUS_TTL", "2")
    ctx = PSContext.start(numShards=1)
    try:
        idle, busy, waiting = _topic(), _topic(), _topic()
        _gather(ctx, idle, 0, 0, 1, [1.0])  # a completed step
        assert _gather(ctx, idle, 1, 0, 2, [5.0], wait=0.1)[0] == {"pending": True}
        _gather(ctx, busy, 0, 0, 1, [2.0])
        with ThreadPoolExecutor(1) as pool:  # a caller waits 6 s, longer than the TTL
            first = pool.submit(_gather, ctx, waiting, 0, 0, 2, [3.0], 6.0)
            time.sleep(1.4)
            _, arrays = _gather(ctx, busy, 0, 0, 1, [9.0])  # a retry: cached, and a touch
            np.testing.assert_array_equal(arrays[0], [[2.0]])
            time.sleep(1.4)
            _gather(ctx, _topic(), 0, 0, 1, [0.0])  # any later call sweeps
            _, arrays = _gather(ctx, waiting, 0, 1, 2, [4.0])
            np.testing.assert_array_equal(arrays[0], [[3.0], [4.0]])
            np.testing.assert_array_equal(first.result(10)[1][0], [[3.0], [4.0]])

        def held(topic):
            ((meta, _),) = ctx.client.call("rendezvous.drop", [], {"topic": topic})
            return meta["dropped"]

        assert (held(idle), held(busy), held(waiting)) == (0, 1, 1)
    finally:
        ctx.stop()
