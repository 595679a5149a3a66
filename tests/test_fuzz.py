"""Hostile input at every RPC of a live shard: it stays up and no model changes."""

from __future__ import annotations

import hashlib

import grpc
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ps_server.proto import ps_pb2 as pb
from ps_server.proto import ps_pb2_grpc as pb_grpc
from ps_server.wire import TOKEN_KEY
from spark_ps import PSVector

_RPCS = [
    "CreateModel",
    "DropModel",
    "ListModels",
    "Pull",
    "Push",
    "Reduce",
    "VectorOp",
    "Call",
    "Checkpoint",
    "Restore",
    "Health",
]


@pytest.fixture(scope="module")
def target(ps):
    w = PSVector.dense(64, name="fuzz-w")
    w.update(np.arange(64), np.linspace(-1, 1, 64))
    s = PSVector.sparse(2**40, name="fuzz-s")
    s.increment(np.array([5, 2**39]), np.array([1.5, -2.5]))
    address = ps.client._coord("GetShardMap", pb.Empty()).addresses[0]
    channel = grpc.insecure_channel(address)
    yield channel, ((TOKEN_KEY, ps.token),), (w, s)
    channel.close()


def _checksum(models) -> str:
    w, s = models
    h = hashlib.sha256(w.pull().tobytes())
    k, v = s.pull()
    return h.update(k.tobytes() + v.tobytes()) or h.hexdigest()


def _raw(channel, rpc: str):
    return channel.unary_unary(
        f"/spark_ps.Shard/{rpc}", request_serializer=None, response_deserializer=None
    )


_arrays = st.builds(
    lambda data, dtype, shape: pb.Array(data=data, dtype=dtype, shape=shape),
    st.binary(max_size=64),
    st.sampled_from(["int64", "float64", "float32", "int8", "bogus", ""]),
    st.lists(st.integers(-3, 20), max_size=3),
)
_names = st.sampled_from(["fuzz-w", "fuzz-s", "nope", "", "../../etc"])
_messages = st.one_of(
    st.builds(
        lambda m, k, v, op, agg: pb.PushRequest(
            model=m, keys=k, values=v, op=op % 4, aggregate=agg, round=7, part=1
        ),
        _names,
        _arrays,
        _arrays,
        st.integers(0, 5),
        st.booleans(),
    ),
    st.builds(
        lambda m, k, r, a, b: pb.PullRequest(model=m, keys=k, by_range=r, start=a, stop=b),
        _names,
        _arrays,
        st.booleans(),
        st.integers(-5, 100),
        st.integers(-5, 100),
    ),
    st.builds(
        lambda op, ms, a: pb.VectorOpRequest(op=op, models=ms, alpha=a),
        st.sampled_from(["dot", "nrm2", "frob", "kernel", "axpy"]),
        st.lists(_names, max_size=3),
        st.floats(allow_nan=True),
    ),
    st.builds(
        lambda f, ms, args: pb.CallRequest(function=f, models=ms, args=args),
        st.sampled_from(["gbt_layer.splits", "keyspace.number", "os.system", "x.y"]),
        st.lists(_names, max_size=2),
        st.text(max_size=20),
    ),
    st.builds(
        lambda m, r: pb.ReduceRequest(model=m, round=r, how="max"), _names, st.integers(-2, 3)
    ),
)


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(rpc=st.sampled_from(_RPCS), payload=st.binary(max_size=200))
def test_random_bytes_at_every_rpc(target, rpc, payload):
    channel, md, models = target
    before = _checksum(models)
    try:
        _raw(channel, rpc)(payload, metadata=md, timeout=10)
    except grpc.RpcError as e:
        assert e.code() != grpc.StatusCode.UNAVAILABLE, "the shard went down"
    assert _checksum(models) == before


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(msg=_messages)
def test_hostile_but_valid_messages(target, msg):
    channel, md, models = target
    stub = pb_grpc.ShardStub(channel)
    rpc = {
        pb.PushRequest: stub.Push,
        pb.PullRequest: stub.Pull,
        pb.VectorOpRequest: stub.VectorOp,
        pb.CallRequest: stub.Call,
        pb.ReduceRequest: stub.Reduce,
    }[type(msg)]
    before = _checksum(models)
    mutating = (
        isinstance(msg, pb.PushRequest) and msg.model.startswith("fuzz") and not msg.aggregate
    ) or (  # an accepted axpy/kernel changes its target: only dot, nrm2 and sum read
        isinstance(msg, pb.VectorOpRequest) and msg.op not in ("dot", "nrm2", "sum")
    )
    try:
        rpc(msg, metadata=md, timeout=10)
    except grpc.RpcError as e:
        assert e.code() not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.UNKNOWN), e
        assert _checksum(models) == before  # refused: nothing changed
        return
    if not mutating:
        assert _checksum(models) == before


def test_well_formed_push_still_works_after_fuzzing(target):
    _, _, (w, _) = target
    before = w.pull(np.array([63]))[0]
    w.increment(np.array([63]), np.array([0.25]))
    assert w.pull(np.array([63]))[0] == before + 0.25
