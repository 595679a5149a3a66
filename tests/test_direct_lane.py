"""The shards' direct lane (ps_server.shard.direct): pulls, pushes and read-only calls on a
plain socket.

Real shard processes, real sockets. The lane must answer exactly as gRPC's ``Call`` would,
refuse what it may not serve, survive garbage, and leave no trace of a refused frame.
"""

from __future__ import annotations

import json
import socket
import struct
import threading
import time
import uuid

import numpy as np
import pytest

from ps_server.proto import ps_pb2 as pb
from ps_server.shard.direct import MAGIC, TYPED, DirectError, DirectLink
from ps_server.wire import TOKEN_KEY, from_array, to_array
from spark_ps.client import PSError, get_client
from spark_ps.client.client import LANES_PER_SHARD, PSClient
from spark_ps.models import PSVector


@pytest.fixture()
def client(ps):
    return get_client(ps.address, ps.token)


def _port(client, shard: int = 0) -> tuple[str, int]:
    port = client.health()[shard].direct_port
    assert port > 0, "a plaintext shard opens a direct lane"
    return client.addresses[shard].rsplit(":", 1)[0], port


def _gather(topic: str, step: int, part: int, n_parts: int, wait: float = 10.0) -> dict:
    return {"topic": topic, "step": step, "part": part, "n_parts": n_parts, "wait": wait}


def _request(function: str, args: dict, arrays=(), models=()) -> pb.CallRequest:
    return pb.CallRequest(
        function=function,
        models=list(models),
        args=json.dumps(args),
        arrays=[to_array(a) for a in arrays],
    )


def test_lane_answers_as_grpc_does(client):
    topic = f"lane-{uuid.uuid4().hex[:8]}"
    value = [np.array([1.5, -2.0, 3.25])]
    lane = client.call(
        "rendezvous.gather", [], _gather(topic, 0, 0, 1), [value], shards=[0], direct=True
    )
    grpc = client.call("rendezvous.gather", [], _gather(topic, 1, 0, 1), [value], shards=[0])
    assert lane[0][0] == grpc[0][0] == {"pending": False}
    np.testing.assert_array_equal(lane[0][1][0], grpc[0][1][0])
    np.testing.assert_array_equal(lane[0][1][0], [value[0]])
    assert client._links.links, "the direct call went through this thread's lane"


def test_lane_errors_read_as_grpc_errors(client):
    bad = _gather(f"lane-{uuid.uuid4().hex[:8]}", 0, 0, 1)
    errors = []
    for direct in (True, False):
        with pytest.raises(PSError) as e:
            client.call(
                "rendezvous.gather", [], bad, [[np.zeros((2, 2))]], shards=[0], direct=direct
            )
        errors.append((e.value.code, str(e.value)))
    assert errors[0] == errors[1]
    assert "takes one 1-D array" in errors[0][1]


def test_bad_token_is_refused_and_joins_nothing(client):
    host, port = _port(client)
    topic = f"lane-{uuid.uuid4().hex[:8]}"
    intruder = DirectLink(host, port, "not-the-token", timeout=10)
    try:
        intruder.send(_request("rendezvous.gather", _gather(topic, 0, 0, 2), [np.ones(2)]))
        with pytest.raises(DirectError) as e:
            intruder.receive()
        assert e.value.code == "UNAUTHENTICATED"
    finally:
        intruder.close()
    # had part 0 joined, part 1 would complete the step; it waits alone instead
    (meta, _), = client.call(
        "rendezvous.gather", [], _gather(topic, 0, 1, 2, wait=0.3), [[np.ones(2)]], shards=[0],
        direct=True,
    )  # fmt: skip
    assert meta == {"pending": True}


def test_near_miss_tokens_are_refused_on_the_direct_lane(client, ps):
    """The lane compares the whole token, as gRPC's interceptor does."""
    from tests.test_bad_input import _near_misses

    host, port = _port(client)
    for bad in _near_misses(ps.token):
        link = DirectLink(host, port, bad, timeout=10)
        try:
            link.send(
                _request("rendezvous.gather", _gather("near", 0, 0, 2, wait=0.1), [np.ones(2)])
            )
            with pytest.raises(DirectError) as e:
                link.receive()
            assert e.value.code == "UNAUTHENTICATED", bad
        finally:
            link.close()


def test_only_read_only_functions_on_models_whose_reads_create_nothing(client, ps):
    from spark_ps.models import PSEmbedding

    host, port = _port(client)
    v = PSVector.dense(8, context=ps)
    v.increment(np.arange(8), np.ones(8))
    table = PSEmbedding.create(2, context=ps)  # its pulls create rows: a write
    link = DirectLink(host, port, ps.token, timeout=10)
    try:
        # a read-only function on a model is served: what gRPC answers
        link.send(_request("keyspace.count", {}, (), [v.name]))
        grpc = client.call("keyspace.count", [v.spec], shards=[0])[0][0]
        assert json.loads(link.receive().result) == grpc
        for request, code in (
            (_request("keyspace.number", {}, [np.array([0])], [v.name]), "FAILED_PRECONDITION"),
            (_request("fm.sumsq", {}, [np.array([0])], [table.name]), "FAILED_PRECONDITION"),
            (_request("nosuch.thing", {}), "NOT_FOUND"),
        ):
            link.send(request)
            with pytest.raises(DirectError) as e:
                link.receive()
            assert e.value.code == code, e.value
        # an error answer keeps the connection: the next call is served on it
        link.send(_request("rendezvous.gather", _gather("lane-ok", 0, 0, 1), [np.ones(1)]))
        assert link.receive().result == json.dumps({"pending": False})
    finally:
        link.close()
    np.testing.assert_array_equal(v.pull(), np.ones(8))  # nothing was applied


def _raw(host: str, port: int, data: bytes) -> bytes:
    with socket.create_connection((host, port), timeout=10) as s:
        s.sendall(data)
        s.shutdown(socket.SHUT_WR)
        out = b""
        while chunk := s.recv(65536):
            out += chunk
    return out


def test_garbage_oversized_and_truncated_frames(client, ps):
    host, port = _port(client)
    token = ps.token.encode()
    prefix = MAGIC + struct.pack("<I", len(token)) + token
    # not a frame: an error answer, then the connection is closed
    out = _raw(host, port, b"GET / HTTP/1.1\r\n\r\n")
    assert out[0] == 1 and b"INVALID_ARGUMENT\nnot a direct-lane frame" in out
    # a length over the request limit is refused before the body is read
    out = _raw(host, port, prefix + struct.pack("<Q", 1 << 40))
    assert out[0] == 1 and b"RESOURCE_EXHAUSTED" in out and b"exceeds the limit" in out
    # a body that is not a CallRequest
    out = _raw(host, port, prefix + struct.pack("<Q", 4) + b"\xff\xff\xff\xff")
    assert out[0] == 1 and b"malformed CallRequest" in out
    # a pull/push frame with an unknown rpc code, or cut inside its header
    typed = TYPED + struct.pack("<I", len(token)) + token
    for body in (struct.pack("<BH", 9, 0), b"\x01"):
        out = _raw(host, port, typed + struct.pack("<Q", len(body)) + body)
        assert out[0] == 1 and b"INVALID_ARGUMENT\nmalformed typed frame" in out, out
    # raw arrays that do not fit the frame: a field a pull has not, one twice, one longer
    # than the frame, bytes after the last one; each refused, nothing applied
    v = PSVector.sparse(2**40, name=f"lane-raw-{uuid.uuid4().hex[:8]}", context=ps)
    meta = pb.PushRequest(model=v.spec.name, keys=to_array(np.zeros(0, np.int64)))
    meta.values.CopyFrom(pb.Array(dtype="float64", shape=[1]))
    meta.keys.CopyFrom(pb.Array(dtype="int64", shape=[1]))
    head = meta.SerializeToString()
    one, key = np.ones(1).tobytes(), np.array([3], np.int64).tobytes()

    def frame(rpc: int, raws: list[tuple[int, bytes]], tail: bytes = b"", cut: int = 0) -> bytes:
        body = struct.pack("<BH", rpc, 2) + b"r1" + struct.pack("<IB", len(head), len(raws)) + head
        for i, (field, data) in enumerate(raws):
            claimed = len(data) + (cut if i == len(raws) - 1 else 0)
            body += struct.pack("<BQ", field, claimed)
            body += bytes(-len(body) % 8) + data  # arrays start at 8-byte body offsets
        body += tail
        return typed + struct.pack("<Q", len(body)) + body

    for bad, why in [
        (frame(1, [(2, one)]), b"raw array field 2 not expected in a Pull"),
        (frame(2, [(1, key), (1, key)]), b"raw array field 1 not expected in a Push"),
        (frame(2, [(1, key), (2, one)], cut=8), b"shorter than its values"),
        (frame(2, [(1, key), (2, one)], tail=b"xx"), b"2 bytes after its arrays"),
    ]:
        out = _raw(host, port, bad)
        assert out[0] == 1 and b"malformed typed frame" in out and why in out, out
    out = _raw(host, port, frame(2, [(1, key), (2, one)]))  # the same frame, well formed
    assert out[0] == 0, out
    keys, values = v.pull()
    assert keys.tolist() == [3] and values.tolist() == [1.0]  # applied once: by the last
    v.drop()
    # a truncated frame: dropped without an answer, and it joined nothing
    topic = f"lane-{uuid.uuid4().hex[:8]}"
    body = _request("rendezvous.gather", _gather(topic, 0, 0, 2), [np.ones(2)]).SerializeToString()
    assert _raw(host, port, prefix + struct.pack("<Q", len(body)) + body[: len(body) // 2]) == b""
    (meta, _), = client.call(
        "rendezvous.gather", [], _gather(topic, 0, 1, 2, wait=0.3), [[np.ones(2)]], shards=[0],
        direct=True,
    )  # fmt: skip
    assert meta == {"pending": True}


def test_a_broken_lane_falls_back_to_grpc_and_reconnects(client):
    topic = f"lane-{uuid.uuid4().hex[:8]}"
    client.call(
        "rendezvous.gather", [], _gather(topic, 0, 0, 1), [[np.ones(1)]], shards=[1], direct=True
    )
    link = client._links.links[client.addresses[1]]
    link._sock.close()  # as if the connection broke under the client
    (meta, arrays), = client.call(
        "rendezvous.gather", [], _gather(topic, 1, 0, 1), [[np.full(1, 7.0)]], shards=[1],
        direct=True,
    )  # fmt: skip
    assert meta == {"pending": False} and arrays[0].tolist() == [[7.0]]
    assert client.addresses[1] not in client._links.links  # the broken link was dropped
    client.call(
        "rendezvous.gather", [], _gather(topic, 2, 0, 1), [[np.ones(1)]], shards=[1], direct=True
    )
    assert client._links.links[client.addresses[1]] is not link  # a fresh connection


@pytest.mark.parametrize("dtype,cols", [("float64", 1), ("float32", 3), ("int64", 2)])
def test_raw_arrays_on_the_lane_equal_grpc(client, monkeypatch, dtype, cols):
    """The same pushes and pulls (duplicates, one key, none, every dtype a model holds) on
    the lane, where the arrays travel raw, and on gRPC, inside the protobuf."""
    from spark_ps.client.spec import TensorSpec

    rng = np.random.default_rng(cols)
    keys = rng.integers(0, 2**40, 5_000)
    keys[:10] = keys[10:20]  # repeats
    values = rng.normal(size=(keys.size, cols)) * 100
    got = []
    for lane in ("1", "0"):
        monkeypatch.setenv("SPARK_PS_DIRECT", lane)
        t = TensorSpec(f"lane-raw-{lane}-{uuid.uuid4().hex[:6]}", "sparse", 2**40, cols,
                       client.num_shards, dtype=dtype)  # fmt: skip
        client.create(t)
        client.push(t, keys, values.astype(dtype))
        client.push(t, keys[:1], np.ones((1, cols), dtype))
        client.push(t, keys[:0], np.ones((0, cols), dtype))
        got.append(client.pull(t, np.concatenate([keys[::-1], keys[:1]])))
        client.drop(t)
    np.testing.assert_array_equal(got[0], got[1])


def test_lane_off_by_environment(client, monkeypatch):
    monkeypatch.setenv("SPARK_PS_DIRECT", "0")
    client._links.__dict__.pop("links", None)
    topic = f"lane-{uuid.uuid4().hex[:8]}"
    (meta, _), = client.call(
        "rendezvous.gather", [], _gather(topic, 0, 0, 1), [[np.ones(1)]], shards=[0], direct=True
    )  # fmt: skip
    assert meta == {"pending": False}
    assert not client._links.__dict__.get("links")


def _lane(handshake: float, max_pending: int):
    from ps_server.shard.direct import DirectServer

    def echo(request: pb.CallRequest) -> pb.CallResponse:
        return pb.CallResponse(result=request.args)

    return DirectServer("127.0.0.1", "sesame", echo, 1 << 20, "test lane", handshake, max_pending)


def test_stalled_unauthenticated_connections_are_bounded_and_closed():
    """Peers that connect and send nothing (or half a header) hold a pending slot for at
    most the handshake timeout, and past `max_pending` of them a new connection is closed
    at once: stalling costs the shard a bounded number of threads for a bounded time. Then
    a client is served, and once authenticated it may idle past the timeout."""
    server = _lane(handshake=1.0, max_pending=4)
    threads_before = threading.active_count()
    stalls = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(6)]
    try:
        stalls[0].sendall(MAGIC)  # half a header
        for s in stalls[4:]:  # over the bound: closed at once
            s.settimeout(0.5)
            assert s.recv(1) == b""
        assert threading.active_count() <= threads_before + 4
        t0 = time.monotonic()
        for s in stalls[:4]:
            s.settimeout(5)
            assert s.recv(1) == b""  # closed by the server once the handshake lapsed
        assert time.monotonic() - t0 < 3.0
        good = DirectLink("127.0.0.1", server.port, "sesame", timeout=10)
        good.send(_request("echo", {"n": 1}))
        assert json.loads(good.receive().result) == {"n": 1}
        time.sleep(1.5)  # idle past the handshake: an authenticated link stays open
        good.send(_request("echo", {"n": 2}))
        assert json.loads(good.receive().result) == {"n": 2}
        good.close()
    finally:
        for s in stalls:
            s.close()
        server.close()


def test_one_request_in_flight_per_connection(client, monkeypatch):
    """A call split into several requests per shard sends the next request on a shard's
    connection only after reading the previous answer: two in flight could fill both
    sockets' buffers (the shard writing an answer, the client writing a request) and hang.
    The requests alternate over the thread's two connections to each shard."""
    events: list[tuple[int, str]] = []
    send, receive = DirectLink.send, DirectLink.receive

    def sending(link, *args):
        events.append((id(link), "send"))
        return send(link, *args)

    def receiving(link, *args):
        events.append((id(link), "recv"))
        return receive(link, *args)

    monkeypatch.setattr(DirectLink, "send", sending)
    monkeypatch.setattr(DirectLink, "receive", receiving)
    from spark_ps.client import PSClient
    from spark_ps.client.spec import TensorSpec

    shared = client
    client = PSClient(shared.address, shared.token, max_message_bytes=64 << 10)  # 4096 rows

    t = TensorSpec(f"lane-chunks-{uuid.uuid4().hex[:8]}", "sparse", 2**40, 1, client.num_shards)
    client.create(t)
    keys = np.arange(0, 60_000 * 7, 7)
    client.push(t, keys, np.arange(keys.size, dtype=np.float64))
    np.testing.assert_array_equal(client.pull(t, keys), np.arange(keys.size, dtype=np.float64))
    per_link: dict[int, list[str]] = {}
    for link, what in events:
        per_link.setdefault(link, []).append(what)
    assert len(per_link) == LANES_PER_SHARD * client.num_shards
    for seq in per_link.values():
        assert len(seq) >= 2 * 2 * 3  # a push and a pull of >= 7 requests each, alternating
        assert seq == ["send", "recv"] * (len(seq) // 2), seq
    in_flight = np.cumsum([1 if what == "send" else -1 for _, what in events])
    assert in_flight.max() == LANES_PER_SHARD * client.num_shards  # both connections busy
    client.drop(t)
    client.close()


def test_an_answer_left_unread_by_an_error_is_never_read_as_another_s(client):
    """A call whose first shard answers an error raises at once; the other shard's answer
    is never read, so its connection is closed: the thread's next request to that shard
    must get its own answer, not the stale one."""
    from spark_ps.client.spec import TensorSpec

    name = f"lane-stale-{uuid.uuid4().hex[:8]}"
    t = TensorSpec(name, "sparse", 2**40, 1, client.num_shards)
    other = TensorSpec(name + "-other", "sparse", 2**40, 1, client.num_shards)
    client.create(t)
    client.create(other)
    keys = np.arange(64)
    owners = t.shard_of(keys)
    assert set(owners) == {0, 1}
    client.push(t, keys, np.full(keys.size, 5.0))
    client.push(other, keys, np.full(keys.size, 7.0))
    md = ((TOKEN_KEY, client.token),)
    client.shards[0].DropModel(pb.ModelRef(name=name), metadata=md, timeout=30)  # shard 0 only
    with pytest.raises(PSError, match="unknown model"):
        client.pull(t, keys)
    np.testing.assert_array_equal(client.pull(other, keys), np.full(keys.size, 7.0))
    client.drop(other)


@pytest.mark.parametrize("rid", ["", "r", "a-request-id-of-odd-length"])
def test_frame_arrays_are_aligned_views_and_rebuild_the_request(rid):
    """A pull or push frame's arrays start at 8-byte offsets of its body, so the shard reads
    them in place as aligned arrays; the request rebuilt for a backup is the one sent."""
    from ps_server.shard.direct import Payload, parse_typed, typed_body
    from ps_server.wire import from_array

    keys = np.array([5, 1, 2**40], np.int64)
    values = np.arange(6, dtype=np.float32).reshape(3, 2)
    sent = Payload(pb.PushRequest(model="m", op=pb.ADD, round=3), keys=keys, values=values)
    body = bytearray(b"".join(bytes(p) for p in typed_body(sent, "Push", rid)))
    base = np.frombuffer(body, np.uint8).ctypes.data
    rpc, got, got_rid = parse_typed(body)
    assert (rpc, got_rid, got.model, got.round) == ("Push", rid, "m", 3)
    for arr, want in ((from_array(got.keys, "k"), keys), (from_array(got.values, "v"), values)):
        np.testing.assert_array_equal(arr, want)
        assert arr.flags.aligned and (arr.ctypes.data - base) % 8 == 0
        assert not arr.flags.owndata  # a view of the frame: no copy
    assert got.SerializeToString() == sent.message().SerializeToString()


def test_a_broken_connection_leaves_the_other_one_and_applies_each_request_once(client):
    """A call's requests to a shard alternate over two connections. When one breaks, only
    it is dropped (its requests go through gRPC): the other's requests were applied and
    their answers are read there, not sent again (a solo shard would apply them twice)."""
    from spark_ps.client import PSClient
    from spark_ps.client.spec import TensorSpec

    c = PSClient(client.address, client.token, max_message_bytes=64 << 10)  # 4096 rows
    t = TensorSpec(f"lane-break-{uuid.uuid4().hex[:8]}", "sparse", 2**40, 1, c.num_shards)
    c.create(t)
    keys = np.arange(0, 40_000 * 3, 3)
    c.push(t, keys, np.ones(keys.size))  # both connections to every shard are open now
    address = c.addresses[0]
    broken, spare = c._links.links[address], c._links.spares[address]
    broken._sock.close()  # as if the first connection broke under the client
    c.push(t, keys, np.full(keys.size, 2.0))
    np.testing.assert_array_equal(c.pull(t, keys), np.full(keys.size, 3.0))  # each once
    assert c._links.spares[address] is spare  # the healthy connection was kept
    assert c._links.links[address] is not broken  # the broken one was replaced
    # a pull whose requests differ: a retry must not read another request's answer
    c.push(t, keys, np.arange(keys.size, dtype=np.float64))
    for kind in ("links", "spares"):  # either connection breaking
        getattr(c._links, kind)[address]._sock.close()
        np.testing.assert_array_equal(c.pull(t, keys), 3.0 + np.arange(keys.size))
    c.drop(t)
    c.close()


def test_call_arrays_travel_raw_as_aligned_views_and_rebuild_the_request():
    """A call's arrays (several, any allowed dtype and shape, empty and 0-d ones) travel
    after its message as raw bytes; the shard reads each in place, aligned, and the request
    rebuilt from the frame is the one gRPC would carry."""
    from ps_server.shard.direct import Payload, parse_typed, typed_body
    from ps_server.wire import from_array

    sent = [
        np.arange(24, dtype=np.int64).reshape(2, 3, 4),
        np.array([2.5], np.float32),
        np.zeros((0, 3), np.float64),
        np.array(7, np.int8),
        np.arange(5, dtype=np.uint8),
    ]
    request = pb.CallRequest(function="gbt_layer.splits", models=["m"], args='{"a": 1}')
    payload = Payload(request, arrays=sent)
    body = bytearray(b"".join(bytes(p) for p in typed_body(payload, "Call", "")))
    base = np.frombuffer(body, np.uint8).ctypes.data
    rpc, got, rid = parse_typed(body)
    assert (rpc, rid, got.function, list(got.models), got.args) == (
        "Call", "", "gbt_layer.splits", ["m"], '{"a": 1}'
    )  # fmt: skip
    assert len(got.arrays) == len(sent)
    for i, want in enumerate(sent):
        arr = from_array(got.arrays[i], f"array {i}")
        assert arr.dtype == want.dtype and arr.shape == want.shape
        np.testing.assert_array_equal(arr, want)
        assert arr.flags.aligned and (arr.ctypes.data - base) % 8 == 0
        assert arr.size == 0 or not arr.flags.owndata  # a view of the frame: no copy
    grpc = pb.CallRequest(
        function="gbt_layer.splits", models=["m"], args='{"a": 1}',
        arrays=[to_array(a) for a in sent],
    )  # fmt: skip
    assert got.SerializeToString() == grpc.SerializeToString()
    assert payload.message().SerializeToString() == grpc.SerializeToString()


def test_direct_calls_take_raw_frames_and_answer_as_grpc(client, monkeypatch):
    """A direct call with arrays goes as a raw-array frame (not a protobuf with the bytes
    inside) and gets gRPC's answer; one without arrays goes as a plain call frame."""
    import ps_server.shard.direct as direct

    kinds: list[str] = []
    real = direct.DirectLink.send

    def spy(self, request, rpc="Call", request_id=""):
        kinds.append(type(request).__name__)
        return real(self, request, rpc, request_id)

    monkeypatch.setattr(direct.DirectLink, "send", spy)
    topic = f"lane-{uuid.uuid4().hex[:8]}"
    values = [np.array([1.0, 2.0]), np.array([-3.5, 0.25])]
    out: list = [None, None]

    def part(i: int) -> None:  # two parts of one step: it completes when both are in
        out[i] = client.call(
            "rendezvous.gather", [], _gather(topic, 0, i, 2), [[values[i]]], shards=[0],
            direct=True,
        )  # fmt: skip

    threads = [threading.Thread(target=part, args=(i,)) for i in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert kinds == ["Payload", "Payload"], kinds
    grpc = client.call("rendezvous.gather", [], _gather(topic, 0, 0, 2), [[values[0]]], shards=[0])
    for ((meta, arrays),) in out:
        assert meta == grpc[0][0] == {"pending": False}
        np.testing.assert_array_equal(arrays[0], grpc[0][1][0])
        np.testing.assert_array_equal(arrays[0], np.stack(values))
    kinds.clear()
    client.call("rendezvous.drop", [], {"topic": topic}, shards=[0], direct=True)
    assert kinds == ["CallRequest"]


def test_malformed_raw_call_frames_are_refused_and_join_nothing(client, ps):
    """A raw-array call frame whose arrays do not match its message (more or fewer than it
    names, a pull's field) is refused by name; the step it would have joined stays empty."""
    host, port = _port(client)
    token = ps.token.encode()
    typed = TYPED + struct.pack("<I", len(token)) + token
    topic = f"lane-{uuid.uuid4().hex[:8]}"
    meta = pb.CallRequest(function="rendezvous.gather", args=json.dumps(_gather(topic, 0, 0, 2)))
    meta.arrays.add(dtype="float64", shape=[1])
    head = meta.SerializeToString()
    one = np.ones(1).tobytes()

    def frame(raws: list[tuple[int, bytes]]) -> bytes:
        body = struct.pack("<BH", 3, 0) + struct.pack("<IB", len(head), len(raws)) + head
        for field, data in raws:
            body += struct.pack("<BQ", field, len(data))
            body += bytes(-len(body) % 8) + data
        return typed + struct.pack("<Q", len(body)) + body

    for bad, why in [
        (frame([(3, one), (3, one)]), b"2 raw arrays for the 1 it names"),
        (frame([]), b"0 raw arrays for the 1 it names"),
        (frame([(1, one)]), b"raw array field 1 not expected in a CallRequest"),
    ]:
        out = _raw(host, port, bad)
        assert out[0] == 1 and b"malformed typed frame" in out and why in out, out
    (got, _), = client.call(
        "rendezvous.gather", [], _gather(topic, 0, 1, 2, wait=0.3), [[np.ones(1)]], shards=[0],
        direct=True,
    )  # fmt: skip
    assert got == {"pending": True}  # part 0 never joined
    out = _raw(host, port, frame([(3, one)]))  # the same frame, well formed: it completes
    assert out[0] == 0, out
    client.call("rendezvous.drop", [], {"topic": topic})


def test_a_calls_only_lane_serves_raw_calls_and_refuses_pulls():
    """A lane without a pull/push handler serves raw-array calls and refuses a pull frame
    by name."""
    from ps_server.shard.direct import Payload

    server = _lane(handshake=5.0, max_pending=4)
    link = DirectLink("127.0.0.1", server.port, "sesame", timeout=10)
    try:
        link.send(Payload(pb.CallRequest(function="echo", args='{"n": 3}'), arrays=[np.ones(2)]))
        assert json.loads(link.receive().result) == {"n": 3}
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
            from ps_server.shard.direct import typed_body

            pull = Payload(pb.PullRequest(model="m"), keys=np.arange(3))
            parts = typed_body(pull, "Pull", "r")
            body = b"".join(bytes(p) for p in parts)
            s.sendall(
                TYPED + struct.pack("<I", 6) + b"sesame" + struct.pack("<Q", len(body)) + body
            )
            s.shutdown(socket.SHUT_WR)
            out = b""
            while chunk := s.recv(65536):
                out += chunk
        assert out[0] == 1 and b"this lane serves no Pull" in out, out
    finally:
        link.close()
        server.close()


def test_a_bad_array_in_one_request_leaves_no_answer_for_the_next_call(client):
    """A direct call whose array to one shard cannot travel (an object array) is refused by
    name, as on gRPC, and the requests of the same call already sent to other shards are
    not read as the answers of the next call on those connections."""
    topic = f"lane-{uuid.uuid4().hex[:8]}"
    bad = np.array([1, "x"], dtype=object)
    with pytest.raises(PSError, match="dtype 'object' is not allowed"):
        client.call(
            "rendezvous.gather", [], _gather(topic, 0, 0, 1), [[np.array([1.0])], [bad]],
            shards=[0, 1], direct=True,
        )  # fmt: skip
    (meta, arrays), = client.call(
        "rendezvous.gather", [], _gather(topic, 1, 0, 1), [[np.array([5.0])]], shards=[0],
        direct=True,
    )  # fmt: skip
    assert meta == {"pending": False} and arrays[0].tolist() == [[5.0]]
    client.call("rendezvous.drop", [], {"topic": topic})


def test_a_lane_from_before_raw_calls_gets_them_through_grpc_then_plain(client, ps, monkeypatch):
    """A shard whose lane predates raw-array calls refuses their frame ("unknown rpc code");
    the call is answered through gRPC, and later calls to that shard use plain call frames."""
    import ps_server.shard.direct as direct

    seen: list[str] = []

    def handle(request):  # what the old lane would answer: a plain call, through the shard
        seen.append(type(request).__name__)
        (meta, arrays), = client.call(
            request.function, [], json.loads(request.args), [[from_array(request.arrays[0], "a")]],
            shards=[0],
        )  # fmt: skip
        return pb.CallResponse(result=json.dumps(meta), arrays=[to_array(a) for a in arrays])

    old_rpcs = {k: v for k, v in direct.RPCS.items() if v[0] != "Call"}
    monkeypatch.setattr(direct, "RPCS", old_rpcs)  # parse_typed: no code 3, as before
    old_lane = direct.DirectServer("127.0.0.1", ps.token, handle, 1 << 24, "old lane")
    other = PSClient(ps.address, ps.token)  # its own links (get_client's is shared)
    try:
        address = other.addresses[0]
        topic = f"lane-{uuid.uuid4().hex[:8]}"
        for step in (0, 1):
            other._direct_ports[address] = old_lane.port  # as the old shard's Health says
            (meta, arrays), = other.call(
                "rendezvous.gather", [], _gather(topic, step, 0, 1), [[np.full(2, step + 1.0)]],
                shards=[0], direct=True,
            )  # fmt: skip
            assert meta == {"pending": False} and arrays[0].tolist() == [[step + 1.0] * 2]
        assert address in other._plain_calls
        assert seen == ["CallRequest"]  # step 0 went through gRPC, step 1 as a plain frame
        other.call("rendezvous.drop", [], {"topic": topic})
    finally:
        old_lane.close()
        other.close()


def test_writes_take_the_lanes_and_answer_as_grpc(ps, monkeypatch):
    """Models made and dropped, vector ops, reduces and calls that write go on the lanes
    (typed frames with their request ids) and leave what the same writes through gRPC
    leave; with the lane off none of them touches it."""
    from ps_server.shard import direct

    sent: list[str] = []
    send = direct.DirectLink.send

    def spy(self, request, rpc="Call", request_id=""):
        sent.append(rpc if rpc != "Call" or request_id else "plain Call")
        return send(self, request, rpc, request_id)

    monkeypatch.setattr(direct.DirectLink, "send", spy)
    got = []
    for lane in ("1", "0"):
        monkeypatch.setenv("SPARK_PS_DIRECT", lane)
        sent.clear()
        client = ps.client
        x = PSVector.dense(1001, context=ps)
        y = PSVector.dense(1001, context=ps)
        x.push(np.arange(1001), np.arange(1001.0))
        y.fill(2.0)
        x.axpy(-0.5, y)
        client.push(y.spec, np.arange(1001), np.ones(1001), round=3, part=0)
        client.reduce(y.spec, 3, op="add")
        client.call("linalg.lincomb", [x.spec, x.spec, y.spec], {"coeffs": [2.0, 0.25]})
        got.append((x.pull(), y.pull(), x.nrm2()))
        x.drop()
        y.drop()
        if lane == "1":
            assert {"CreateModel", "VectorOp", "Reduce", "Call", "DropModel"} <= set(sent), sent
            assert "plain Call" not in sent
        else:
            assert sent == []
    np.testing.assert_array_equal(got[0][0], got[1][0])
    np.testing.assert_array_equal(got[0][1], np.full(1001, 3.0))
    np.testing.assert_array_equal(got[0][1], got[1][1])
    assert got[0][2] == got[1][2]


def test_a_lane_from_before_writes_gets_them_through_grpc(client, ps, monkeypatch):
    """A shard whose lane predates typed writes refuses them unapplied (a new rpc code, or
    a call that is not read-only): the client sends that write, and the shard's later
    ones, through gRPC; its read-only calls stay on the lane."""
    import ps_server.shard.direct as direct
    from ps_server.wire import RequestError

    seen: list[str] = []

    def handle(request):  # the old lane: read-only calls through the shard, writes refused
        seen.append(request.function)
        if request.function != "rendezvous.gather":
            raise RequestError(
                "FAILED_PRECONDITION",
                "shard 0: the direct lane serves only read-only functions on models whose "
                "reads create no rows; call it through gRPC",
            )
        (meta, arrays), = client.call(
            request.function, [], json.loads(request.args), [[from_array(request.arrays[0], "a")]],
            shards=[0],
        )  # fmt: skip
        return pb.CallResponse(result=json.dumps(meta), arrays=[to_array(a) for a in arrays])

    old_rpcs = {k: v for k, v in direct.RPCS.items() if k <= 3}
    monkeypatch.setattr(direct, "RPCS", old_rpcs)  # parse_typed: codes 1-3, as before
    old_lane = direct.DirectServer("127.0.0.1", ps.token, handle, 1 << 24, "old lane")
    clients = [PSClient(ps.address, ps.token) for _ in range(2)]  # their own links
    v = PSVector.dense(8, context=ps)
    try:
        address = clients[0].addresses[0]
        for c in clients:
            c._direct_ports[address] = old_lane.port  # as the old shard's Health says
        # a write call: refused by the old lane's handler, then applied once through gRPC
        clients[0].call("linalg.lincomb", [v.spec, v.spec], {"coeffs": [1.0]}, shards=[0])
        clients[0].vector_op("fill", [v.spec], alpha=2.0)  # straight to gRPC now
        assert address in clients[0]._read_lanes and seen == ["linalg.lincomb"]
        # a vector op first: an unknown rpc code to the old lane, then gRPC
        clients[1]._direct_ports[address] = old_lane.port
        clients[1].vector_op("scale", [v.spec], alpha=3.0)
        assert address in clients[1]._read_lanes and address not in clients[1]._plain_calls
        topic = f"lane-{uuid.uuid4().hex[:8]}"
        clients[1]._direct_ports[address] = old_lane.port  # (a refusal drops the port)
        (meta, _), = clients[1].call(
            "rendezvous.gather", [], _gather(topic, 0, 0, 1), [[np.ones(2)]], shards=[0],
            direct=True,
        )  # fmt: skip
        assert meta == {"pending": False} and seen[-1] == "rendezvous.gather"  # on the lane
        clients[1].call("rendezvous.drop", [], {"topic": topic})
        np.testing.assert_array_equal(v.pull(), np.full(8, 6.0))
    finally:
        old_lane.close()
        for c in clients:
            c.close()
        v.drop()
