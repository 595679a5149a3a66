"""Bad arguments to ``gbt_layer.splits`` are refused by name before they join the step: real
shard processes, threads as partitions. A refused call leaves nothing behind, so the step is
completed afterwards by correct calls with exactly the answer a clean run gives."""

from __future__ import annotations

import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from ps_server.functions.gbt import best_splits
from ps_server.functions.gbt_layer import decode_splits
from spark_ps.client import PSError

pytestmark = pytest.mark.timeout(60)

F, BINS = 4, 6
KW = {"min_instances_per_node": 1, "min_info_gain": 0.0, "min_weight_per_node": 0.0}
KW["scale"] = [0.0, 0, 10]
# step 1 below a root split into one split whose two children are both open
PLAN = {"parent_slots": [0], "small_is_left": [True], "pick": [0, 0], "pick_left": [True, False]}
_DROP = object()


def _hist(rng, n_slots, f=F):
    h = np.zeros((n_slots, f, BINS, 4), np.int64)
    h[..., 0] = rng.integers(1, 20, size=h.shape[:3])
    h[..., 1] = h[..., 0] << 10
    h[..., 2] = rng.integers(-(1 << 12), 1 << 12, size=h.shape[:3])
    h[..., 3] = np.abs(h[..., 2])
    return h


def _call(ps, topic, step, part, hist, extra=None, wait=10.0):
    args = {"topic": topic, "step": step, "part": part, "n_parts": 2, "wait": wait}
    args.update(n_slots=hist.shape[0], n_bins=hist.shape[2], split_kw=KW)
    args.update(extra or {})
    args = {k: v for k, v in args.items() if v is not _DROP}
    ((meta, arrays),) = ps.client.call(
        "gbt_layer.splits", [], args, [[hist, np.array([0])]], shards=[0]
    )
    return meta, (decode_splits(arrays[0]) if arrays else None)


@pytest.fixture
def layer(ps):
    """A topic whose root (step 0) is done; the two partitions' step-1 histograms and the
    answer a clean step 1 gives."""
    rng = np.random.default_rng(7)
    topic = f"test-{uuid.uuid4().hex[:8]}"
    root = [_hist(rng, 1) for _ in range(2)]
    with ThreadPoolExecutor(2) as pool:
        list(pool.map(lambda i: _call(ps, topic, 0, i, root[i]), range(2)))
    child = [h // 3 for h in root]
    small = child[0] + child[1]
    full = np.concatenate([small, root[0] + root[1] - small])
    want = best_splits(full, 0, **{**KW, "scale": tuple(KW["scale"])})
    yield topic, child, want
    ps.client.call("rendezvous.drop", [], {"topic": topic})


def _complete_afresh(ps, topic, child, want):
    """Part 0 alone stays pending (the refused call left no part 1); part 1 completes."""
    meta, _ = _call(ps, topic, 1, 0, child[0], PLAN, wait=0.2)
    assert meta == {"pending": True}
    meta, got = _call(ps, topic, 1, 1, child[1], PLAN)
    assert meta == {"pending": False} and got.tobytes() == want.tobytes()


BAD = [
    ({"parent_slots": [1]}, r"parent_slots \[1\] are not among the 1 histograms kept from step 0"),
    ({"parent_slots": ["0"]}, r"parent_slots must be a list of ints"),
    ({"parent_slots": [0.5]}, r"parent_slots must be a list of ints"),
    ({"parent_slots": 0}, r"parent_slots must be a list of ints"),
    ({"parent_slots": [-1]}, r"parent_slots must be distinct ints >= 0, got \[-1\]"),
    ({"small_is_left": [1]}, r"small_is_left must be a list of bools"),
    ({"small_is_left": [True, False]}, r"len\(small_is_left\) 2 != len\(parent_slots\) 1"),
    ({"pick": [0, 1]}, r"pick must be in 0\.\.0 \(the splits\), got \[0, 1\]"),
    ({"pick_left": [True]}, r"pick \(2\) and pick_left \(1\) need one entry per open node"),
    ({"pick": _DROP}, r"below the root needs all of"),
    ({"feature_mask": [[1] * F]}, r"feature_mask must be 0/1 \[2 open nodes, >= 4 features\]"),
    ({"feature_mask": [[1] * (F - 1)] * 2}, r"feature_mask .* got \[2, 3\]"),
    ({"feature_mask": [[1, 0], [1]]}, r"feature_mask must be 0/1"),
    ({"feature_mask": [[2] * F] * 2}, r"feature_mask must hold only 0 and 1"),
    ({"split_kw": {**KW, "extra": 1}}, r"split_kw must have exactly the keys"),
    ({"split_kw": {k: KW[k] for k in list(KW)[1:]}}, r"split_kw must have exactly the keys"),
    ({"split_kw": "x"}, r"split_kw must have exactly the keys"),
    ({"split_kw": {**KW, "min_instances_per_node": 0}}, r"min_instances_per_node must be an int"),
    ({"split_kw": {**KW, "min_instances_per_node": 1.5}}, r"min_instances_per_node must"),
    ({"split_kw": {**KW, "min_info_gain": -1.0}}, r"split_kw\.min_info_gain must be a finite"),
    ({"split_kw": {**KW, "min_info_gain": float("nan")}}, r"split_kw\.min_info_gain must"),
    ({"split_kw": {**KW, "min_weight_per_node": "0"}}, r"split_kw\.min_weight_per_node must"),
    ({"split_kw": {**KW, "scale": [0.0, 0]}}, r"split_kw\.scale must be \[center, target_exp"),
    ({"split_kw": {**KW, "scale": [0.0, 0.5, 10]}}, r"split_kw\.scale must be"),
    ({"split_kw": {**KW, "scale": [0.0, 0, 5000]}}, r"split_kw\.scale must be"),
    ({"n_bins": "6"}, r"n_bins must be an int >= 1, got '6'"),
]


@pytest.mark.parametrize(("extra", "message"), BAD, ids=[m for _, m in BAD])
def test_a_bad_argument_is_refused_by_name_and_leaves_the_step_as_it_was(ps, layer, extra, message):
    topic, child, want = layer
    with pytest.raises(PSError, match=f"gbt_layer.splits step 1 of '{topic}': .*{message}") as e:
        _call(ps, topic, 1, 1, child[1], {**PLAN, **extra})
    assert e.value.code.name == "INVALID_ARGUMENT"
    _complete_afresh(ps, topic, child, want)


def test_n_slots_must_match_parent_slots_below_the_root(ps, layer):
    topic, child, want = layer
    two = np.concatenate([child[1], child[1]])  # histograms for n_slots=2, one parent
    with pytest.raises(PSError, match=r"step 1 of .*n_slots 2 != len\(parent_slots\) 1"):
        _call(ps, topic, 1, 1, two, PLAN)
    _complete_afresh(ps, topic, child, want)


def test_histograms_of_other_features_than_the_parents_are_refused(ps, layer):
    topic, child, want = layer
    narrow = np.ascontiguousarray(child[1][:, : F - 1])
    with pytest.raises(PSError, match=r"\[\.\., 3 features, 6 bins, 4\] do not match step 0's"):
        _call(ps, topic, 1, 1, narrow, PLAN)
    _complete_afresh(ps, topic, child, want)


def test_parts_that_disagree_fail_every_waiting_caller_and_the_step_starts_afresh(ps, layer):
    """Each call is valid alone, but the answer would be computed from one part's plan:
    both callers get the error, then correct calls complete the step with the clean answer."""
    topic, child, want = layer
    other = {**PLAN, "pick": [0], "pick_left": [True]}  # one open child instead of two
    with ThreadPoolExecutor(1) as pool:
        first = pool.submit(_call, ps, topic, 1, 0, child[0], PLAN)
        time.sleep(0.5)  # part 0 is in and waiting
        with pytest.raises(
            PSError, match=r"step 1 of .*the parts disagree .*parts \[\[0\], \[1\]\]"
        ):
            _call(ps, topic, 1, 1, child[1], other)
        with pytest.raises(PSError, match="the parts disagree"):
            first.result(30)
    _complete_afresh(ps, topic, child, want)
