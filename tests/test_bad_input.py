"""Every bad request is refused with a status naming what was wrong, and changes nothing."""

from __future__ import annotations

import threading
import time

import grpc
import numpy as np
import pytest

from ps_server.proto import ps_pb2 as pb
from ps_server.proto import ps_pb2_grpc as pb_grpc
from ps_server.wire import TOKEN_KEY, to_array
from spark_ps import PSError, PSMatrix, PSVector


@pytest.fixture(scope="module")
def model(ps):
    w = PSVector.dense(100, name="bad-input-w")
    w.update(np.arange(100), np.arange(100.0))
    return w


@pytest.fixture(scope="module")
def raw(ps):
    """A raw stub to shard 0, so we can send what the client never would."""
    ch = grpc.insecure_channel(_addr(ps, 0))
    yield pb_grpc.ShardStub(ch), ((TOKEN_KEY, ps.token),)
    ch.close()


def _addr(ps, i):
    return ps.client._coord("GetShardMap", pb.Empty()).addresses[i]


def _unchanged(model):
    np.testing.assert_array_equal(model.pull(), np.arange(100.0))


def _call(raw, rpc, req, md=None):
    stub, good = raw
    with pytest.raises(grpc.RpcError) as e:
        getattr(stub, rpc)(req, metadata=good if md is None else md, timeout=10)
    return e.value


def _push(keys, values, model="bad-input-w"):
    return pb.PushRequest(model=model, keys=keys, values=values, op=pb.ADD)


K = to_array(np.array([1, 2], dtype=np.int64))
V = to_array(np.array([1.0, 1.0]))


@pytest.mark.parametrize(
    "req, code, message",
    [
        (_push(K, V, model="nope"), "NOT_FOUND", "unknown model 'nope'"),
        (
            _push(K, to_array(np.array([1, 1], dtype=np.int64))),
            "INVALID_ARGUMENT",
            "values dtype int64",
        ),
        (_push(to_array(np.array([1.0, 2.0])), V), "INVALID_ARGUMENT", "keys must be a 1-D int64"),
        (
            _push(to_array(np.array([1, 99], dtype=np.int64)), V),
            "OUT_OF_RANGE",
            "key out of range 99 at position 1",
        ),
        (
            _push(to_array(np.array([-1, 2], dtype=np.int64)), V),
            "OUT_OF_RANGE",
            "negative key -1 at position 0",
        ),
        (
            _push(K, to_array(np.array([1.0, 2.0, 3.0]))),
            "INVALID_ARGUMENT",
            r"values of shape \(3, 1\) do not match 2 keys",
        ),
        (
            _push(pb.Array(data=b"\x01" * 12, dtype="int64", shape=[2]), V),
            "INVALID_ARGUMENT",
            "not a multiple of the 8-byte int64",
        ),
        (
            _push(pb.Array(data=b"\x01" * 8, dtype="int64", shape=[2]), V),
            "INVALID_ARGUMENT",
            "truncated payload",
        ),
        (
            _push(pb.Array(data=b"\x01" * 8, dtype="object", shape=[1]), V),
            "INVALID_ARGUMENT",
            "dtype 'object' is not allowed",
        ),
        (
            _push(K, to_array(np.array([1.0, np.nan]))),
            "INVALID_ARGUMENT",
            "non-finite value nan at row 1",
        ),
        (_push(K, to_array(np.array([np.inf, 1.0]))), "INVALID_ARGUMENT", "non-finite value inf"),
        (
            pb.PullRequest(model="bad-input-w", by_range=True, start=0, stop=10**6),
            "OUT_OF_RANGE",
            "pull range",
        ),
        (
            pb.VectorOpRequest(op="frobnicate", models=["bad-input-w"]),
            "INVALID_ARGUMENT",
            "unknown vector op 'frobnicate'",
        ),
        (
            pb.CallRequest(function="os.system", models=[]),
            "NOT_FOUND",
            "no server function module 'os'",
        ),
    ],
)
def test_bad_request_is_refused_and_state_unchanged(raw, model, req, code, message):
    rpc = type(req).__name__.replace("Request", "")
    err = _call(raw, rpc, req)
    assert err.code() == getattr(grpc.StatusCode, code)
    import re

    assert re.search(message, err.details()), err.details()
    _unchanged(model)


def test_wrong_and_missing_token_refused(raw, model):
    req = pb.PullRequest(model="bad-input-w", keys=K)
    err = _call(raw, "Pull", req, md=((TOKEN_KEY, "not-the-token"),))
    assert err.code() == grpc.StatusCode.UNAUTHENTICATED
    assert "bad auth token" in err.details()
    err = _call(raw, "Push", _push(K, V), md=())
    assert err.code() == grpc.StatusCode.UNAUTHENTICATED
    assert "missing auth token" in err.details()
    _unchanged(model)


def _near_misses(token: str) -> list[str]:
    """Tokens a prefix or length check would let through: the last character changed, the
    first changed, a prefix, the token with a character added, and the empty token."""
    last = "A" if token[-1] != "A" else "B"
    first = "A" if token[0] != "A" else "B"
    return [token[:-1] + last, first + token[1:], token[:-1], token + "x", ""]


def test_near_miss_tokens_are_refused_by_shards_and_coordinator(ps, raw, model):
    """The whole token is compared: every near miss is UNAUTHENTICATED on a shard's data
    plane and on the coordinator, and changes nothing."""
    coord = pb_grpc.CoordinatorStub(grpc.insecure_channel(ps.address))
    for bad in _near_misses(ps.token):
        err = _call(raw, "Push", _push(K, V), md=((TOKEN_KEY, bad),))
        assert err.code() == grpc.StatusCode.UNAUTHENTICATED, bad
        with pytest.raises(grpc.RpcError) as e:
            coord.Post(
                pb.PostRequest(topic="near-miss", round=1, payload="{}"),
                metadata=((TOKEN_KEY, bad),),
                timeout=10,
            )
        assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED, bad
    _unchanged(model)
    stub, good = raw
    assert stub.Push(_push(K, to_array(np.zeros(2))), metadata=good, timeout=10).value == 2


@pytest.mark.parametrize("kind", ["dense", "sparse"])
def test_a_key_at_the_upper_bound_is_refused(ps, kind):
    """Keys live in [0, dim): `dim` itself (the dense shard's offset + length, the sparse
    space's bound) is refused by the shard with the range, and nothing changes."""
    dim = 64
    w = PSVector.dense(dim) if kind == "dense" else PSVector.sparse(dim=dim)
    w.update(np.array([dim - 1]), np.array([5.0]))
    ch = grpc.insecure_channel(_addr(ps, ps.num_shards - 1 if kind == "dense" else 0))
    try:
        stub = pb_grpc.ShardStub(ch)
        for op in (pb.ADD, pb.SET):
            req = pb.PushRequest(
                model=w.name,
                keys=to_array(np.array([dim], dtype=np.int64)),
                values=to_array(np.array([1.0])),
                op=op,
            )
            with pytest.raises(grpc.RpcError) as e:
                stub.Push(req, metadata=((TOKEN_KEY, ps.token),), timeout=10)
            assert e.value.code() in (
                grpc.StatusCode.OUT_OF_RANGE,
                grpc.StatusCode.INVALID_ARGUMENT,
            ), e.value.details()
            assert str(dim) in e.value.details()
    finally:
        ch.close()
    with pytest.raises((PSError, ValueError)):
        w.increment(np.array([dim]), np.array([1.0]))
    assert w.pull(np.array([dim - 1]))[0] == 5.0
    w.drop()


def test_duplicate_model_with_other_shape_refused(ps, model):
    with pytest.raises(PSError, match="exists with kind=dense dim=100 cols=1") as e:
        PSVector.dense(200, name="bad-input-w")
    assert e.value.code == grpc.StatusCode.ALREADY_EXISTS
    _unchanged(model)


def test_client_side_checks_name_the_bad_key(model):
    with pytest.raises(ValueError, match="100"):
        model.increment(np.array([100]), np.array([1.0]))
    with pytest.raises(ValueError, match="3 keys but values of shape"):
        model.increment(np.array([1, 2, 3]), np.array([1.0]))
    _unchanged(model)


def test_vector_op_on_non_colocated_vectors_refused(ps, model):
    other = PSVector.dense(50)
    with pytest.raises(PSError, match="not co-located"):
        model.dot(other)
    _unchanged(model)


def test_checkpoint_without_a_uri_is_refused(raw):
    err = _call(raw, "Checkpoint", pb.CheckpointRequest(uri="", version=0))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "checkpoint uri must not be empty" in err.details()


def test_clock_and_barrier_calls_from_unknown_workers_are_refused(ps):
    """A group of 2 live workers: a third id, an empty id, a removed worker and a bad count
    are refused; the clock table (and its log) holds only the two real workers' calls."""
    c, group = ps.client, "bad-clock"
    for w in ("a", "b"):
        threading.Thread(
            target=lambda w=w: c.clock(group, w, 1, staleness=0, num_workers=2, timeout=10)
        ).start()
    _wait_for(lambda: len(c.clock_log(group)) == 2)
    cases = [
        (
            dict(worker="intruder"),
            "FAILED_PRECONDITION",
            r"unknown worker 'intruder'; the group "
            r"already has its 2 live workers \(a, b\)",
        ),
        (dict(worker=""), "INVALID_ARGUMENT", "empty group 'bad-clock' or worker '' id"),
        (dict(worker="a", num_workers=0), "INVALID_ARGUMENT", "num_workers 0 must be >= 1"),
        (dict(worker="a", staleness=-3), "INVALID_ARGUMENT", "staleness -3 >= 0"),
    ]
    for kwargs, code, message in cases:
        args = dict(staleness=0, num_workers=2, timeout=5) | kwargs
        with pytest.raises(PSError, match=message) as e:
            c.clock(group, args.pop("worker"), 2, **args)
        assert e.value.code == getattr(grpc.StatusCode, code)
    c.remove_worker(group, "b")
    with pytest.raises(PSError, match="worker 'b' was removed from group 'bad-clock'") as e:
        c.clock(group, "b", 2, staleness=0, num_workers=2, timeout=5)
    assert e.value.code == grpc.StatusCode.FAILED_PRECONDITION
    with pytest.raises(PSError, match="barrier 'bad-barrier': empty worker id") as e:
        c.barrier("bad-barrier", "", 2, timeout=5)
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert sorted((e.worker, e.clock) for e in c.clock_log(group)) == [("a", 1), ("b", 1)]
    assert c.clock(group, "a", 2, staleness=0, num_workers=2, timeout=5) == 2  # a goes on


def _wait_for(predicate, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_a_nan_in_one_shards_slice_changes_no_shard(ps):
    """Each shard refuses its own slice: the client refuses the whole push first, so the
    other shard's part is not applied either (the model stays as it was)."""
    w = PSVector.dense(40, name="nan-split")
    assert w.spec.num_shards == 2
    w.increment(np.arange(40), np.ones(40))
    grads = np.full(40, 2.0)
    grads[30] = np.nan  # key 30 lives on the second shard only
    with pytest.raises(PSError, match=r"non-finite value nan at row 30 \(key 30\)") as e:
        w.increment(np.arange(40), grads)
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
    np.testing.assert_array_equal(w.pull(), np.ones(40))


def test_nan_policy_skip_drops_only_the_non_finite_rows(ps):
    w = PSVector.dense(6, name="nan-skip", nan_policy="skip")
    w.increment(np.array([1, 2, 4]), np.array([1.0, np.nan, 4.0]))
    w.increment(np.array([3, 5]), np.array([np.inf, -np.inf]))
    np.testing.assert_array_equal(w.pull(), [0.0, 1.0, 0.0, 0.0, 4.0, 0.0])
    m = PSMatrix.sparse(2, name="nan-skip-m", nan_policy="skip")
    m.increment(np.array([7, 9]), np.array([[1.0, np.nan], [2.0, 3.0]]))  # a row goes whole
    keys, values = m.pull()
    np.testing.assert_array_equal(keys, [9])
    np.testing.assert_array_equal(values, [[2.0, 3.0]])


def test_bad_nan_policy_and_budget_are_refused_at_creation(ps):
    with pytest.raises(PSError, match=r"nan_policy 'ignore' not in \('refuse', 'skip'\)") as e:
        PSVector.dense(4, name="nan-bad", nan_policy="ignore")
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(PSError, match="budget_bytes -1 < 0"):
        PSVector.sparse(name="budget-bad", budget_bytes=-1)
    assert not {"nan-bad", "budget-bad"} & set(ps.client.models())
