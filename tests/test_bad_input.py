"""Every bad request is refused with a status naming what was wrong, and changes nothing."""

from __future__ import annotations

import grpc
import numpy as np
import pytest

from ps_server.proto import ps_pb2 as pb
from ps_server.proto import ps_pb2_grpc as pb_grpc
from ps_server.wire import TOKEN_KEY, to_array
from spark_ps import PSError, PSVector


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
