"""Resource limits of a real PS: request size and memory budgets refuse cleanly, change nothing.

A PS of its own (one shard, 1 MB request limit, 4 MB shard budget) so the limits are small
enough to hit with small arrays.
"""

from __future__ import annotations

import grpc
import numpy as np
import pytest

from ps_server.proto import ps_pb2 as pb
from ps_server.proto import ps_pb2_grpc as pb_grpc
from ps_server.wire import TOKEN_KEY, to_array
from spark_ps import PSContext, PSEmbedding, PSError, PSVector

pytestmark = pytest.mark.timeout(120)

MB = 1 << 20


@pytest.fixture(scope="module")
def small():
    ctx = PSContext.start(numShards=1, maxRequestMB=1, shardMemoryMB=4)
    yield ctx
    ctx.stop()


@pytest.fixture(scope="module")
def raw(small):
    address = small.client._coord("GetShardMap", pb.Empty()).addresses[0]
    ch = grpc.insecure_channel(address, options=[("grpc.max_send_message_length", -1)])
    yield pb_grpc.ShardStub(ch), ((TOKEN_KEY, small.token),)
    ch.close()


def _health(ctx):
    return ctx.client.health()[0].nbytes


def test_request_over_the_limit_is_refused_before_parsing(small, raw):
    w = PSVector.dense(1000, name="limit-w", context=small)
    w.update(np.arange(1000), np.arange(1000.0))
    stub, md = raw
    n = 100_000  # 1.6 MB of keys + values: over 1 MB, under gRPC's own cut-off
    req = pb.PushRequest(
        model="limit-w", keys=to_array(np.zeros(n, np.int64)), values=to_array(np.ones(n))
    )
    with pytest.raises(grpc.RpcError) as e:
        stub.Push(req, metadata=md, timeout=10)
    assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    size = req.ByteSize()
    assert (
        f"shard 0: Push: request of {size} bytes (1.5 MB) exceeds the limit of 1048576 bytes "
        "(1 MB); raise it with spark-ps-server --max-request-mb" in e.value.details()
    )
    big = pb.PushRequest(model="limit-w", keys=to_array(np.zeros(400_000, np.int64)))
    with pytest.raises(grpc.RpcError) as e:  # beyond 2x the limit: gRPC cuts it off itself
        stub.Push(big, metadata=md, timeout=10)
    assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    np.testing.assert_array_equal(w.pull(), np.arange(1000.0))


def test_client_chunks_below_the_servers_limit(small):
    client = small.client
    assert client.max_message_bytes == 4 * MB and client.max_request_bytes == MB
    assert client.chunk_bytes < MB
    w = PSVector.dense(300_000, name="limit-big", context=small)  # 2.4 MB of float64
    keys = np.arange(300_000)
    w.increment(keys, keys * 0.5)  # 4.8 MB of keys + values, sent in chunks below 1 MB
    np.testing.assert_array_equal(w.pull(), keys * 0.5)
    w.drop()


def test_unchunked_call_over_the_limit_is_refused_client_side(small):
    w = PSVector.dense(10, name="limit-call", context=small)
    with pytest.raises(PSError, match=r"Call to shard 0: request of about 1600000 bytes") as e:
        small.client.call("no_such.fn", [w.spec], arrays=[[np.zeros(200_000)]])
    assert e.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "exceeds the PS's limit of 1048576 bytes (1 MB)" in str(e.value)
    # never sent: the shard would have answered NOT_FOUND for the unknown function
    with pytest.raises(PSError, match="no server function module 'no_such'"):
        small.client.call("no_such.fn", [w.spec], arrays=[[np.zeros(10)]])


def test_model_budget_refuses_growth_before_inserting(small):
    s = PSVector.sparse(2**40, name="budget-s", budget_bytes=64 << 10, context=small)
    s.increment(np.arange(100) * 7919, np.ones(100))
    keys, values = s.pull()
    used = _health(small)
    with pytest.raises(PSError) as e:
        s.increment(np.arange(100, 10_100) * 7919, np.ones(10_000))
    assert e.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    msg = str(e.value)
    assert "shard 0: push to model 'budget-s' would grow it from" in msg
    assert "past its budget of 65536 bytes; nothing was changed" in msg
    k2, v2 = s.pull()
    np.testing.assert_array_equal(k2, keys)
    np.testing.assert_array_equal(v2, values)
    assert _health(small) == used
    s.increment(np.arange(100) * 7919, np.ones(100))  # old keys: no growth, still fine
    np.testing.assert_array_equal(s.pull()[1], values + 1)


def test_shard_budget_refuses_a_big_model_and_sparse_growth(small):
    before = small.client.models()
    with pytest.raises(PSError, match=r"shard 0: creating model 'too-big' needs 8000000 more") as e:
        PSVector.dense(1_000_000, name="too-big", context=small)
    assert e.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "past its budget of 4194304 bytes (spark-ps-server --shard-memory-mb" in str(e.value)
    assert small.client.models() == before
    filler = PSVector.dense(375_000, name="filler", context=small)  # 3 MB of the 4 MB
    s = PSVector.sparse(2**40, name="budget-shard-s", context=small)
    s.increment(np.arange(10), np.ones(10))
    used = _health(small)
    with pytest.raises(PSError, match="push to model 'budget-shard-s' needs .* the shard would"):
        s.increment(np.arange(10, 40_010), np.ones(40_000))  # one request; ~2 MB of rows
    assert _health(small) == used
    np.testing.assert_array_equal(s.pull()[0], np.arange(10))
    filler.drop()
    s.drop()


def test_embedding_budget_refuses_a_pull_that_would_create_rows(small):
    emb = PSEmbedding.create(
        64, name="budget-emb", optimizer=None, budget_bytes=128 << 10, context=small
    )
    first = emb.pull(np.arange(200))
    used = _health(small)
    with pytest.raises(PSError, match="pull from model 'budget-emb' would grow it from") as e:
        emb.pull(np.arange(200, 1200))  # one request; 1000 new 256-byte rows
    assert e.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert _health(small) == used
    keys, values = emb.pull()
    np.testing.assert_array_equal(keys, np.arange(200))
    np.testing.assert_array_equal(values, first)


@pytest.mark.parametrize("lane", ["direct", "grpc"])
def test_a_client_that_ignores_the_limit_gets_a_clear_refusal(small, lane, monkeypatch):
    """A client that does not know the servers' limit (an older one): each too-big chunk
    is refused by the shard, naming the limit, on the direct lane and on gRPC; gRPC's own
    cut-off gets the same hint. (A call is atomic per request, not across chunks: here
    every chunk is too big.)"""
    from spark_ps.client import PSClient

    if lane == "grpc":
        monkeypatch.setenv("SPARK_PS_DIRECT", "0")
    w = PSVector.sparse(2**40, name=f"limit-old-client-{lane}", context=small)
    client = PSClient(small.address, small.token, max_message_bytes=3 * MB // 2)
    client.max_request_bytes = 0  # as if the shard map did not say
    keys = np.arange(4 * 98_304)  # 4 chunks of 1.5 MB
    with pytest.raises(PSError, match="exceeds the limit of 1048576 bytes") as e:
        client.push(w.spec, keys, np.ones(keys.size), "add")
    assert e.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "--max-request-mb" in str(e.value)
    client.max_message_bytes = 4 * MB  # chunks beyond twice the limit
    cut_off = r"larger than max .*--max-request-mb" if lane == "grpc" else "exceeds the limit"
    with pytest.raises(PSError, match=cut_off) as e:
        client.push(w.spec, keys, np.ones(keys.size), "add")
    assert e.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    if lane == "direct":
        # far beyond the sockets' buffers: the shard refuses the frame from its header and
        # closes, the send breaks, and the refusal waiting unread is the answer (not a
        # retry through gRPC, which would be cut off without naming the limit)
        client.max_message_bytes = 64 * MB
        big = np.arange(2_000_000)
        for _ in range(2):  # and again on new connections
            with pytest.raises(PSError, match="exceeds the limit of 1048576 bytes") as e:
                client.push(w.spec, big, np.ones(big.size), "add")
            assert e.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    client.close()
    assert w.pull()[0].size == 0  # no row was created
    w.drop()
