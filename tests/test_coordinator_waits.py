"""The coordinator's waits against a real `spark-ps-server` on loopback: a crowd of
waiting workers does not keep it from answering, a barrier counts only live arrivals,
and a dropped model's name is free again."""

from __future__ import annotations

import asyncio
import socket
import threading
import time

import grpc
import numpy as np
import pytest

from ps_server.coordinator.service import Service
from ps_server.proto import ps_pb2 as pb
from ps_server.proto import ps_pb2_grpc as pb_grpc
from ps_server.wire import TOKEN_KEY
from spark_ps import PSContext
from spark_ps.client import PSError
from spark_ps.models import PSMatrix, PSVector

pytestmark = pytest.mark.timeout(120)

#: Concurrent Wait calls: far above the 128 threads that once served the coordinator.
CROWD = 1500
#: How long a Post / GetShardMap may take with the crowd waiting (the bench shows ~ms).
ANSWER_SECONDS = 2.0


@pytest.fixture(scope="module")
def own_ps():
    ps = PSContext.start(numShards=1)
    yield ps
    ps.stop()


async def _timed(call, *args, **kw) -> float:
    t = time.perf_counter()
    await call(*args, **kw)
    return time.perf_counter() - t


async def _parked(stub: pb_grpc.CoordinatorStub, md, n: int, limit: float) -> int:
    """Calls waiting at the coordinator, once they are `n` or after `limit` seconds."""
    deadline = time.monotonic() + limit
    while True:
        waiting = (await stub.GetMetrics(pb.Empty(), metadata=md, timeout=5)).waiting
        if waiting >= n or time.monotonic() > deadline:
            return waiting
        await asyncio.sleep(0.05)


async def _crowd_then_post(address: str, token: str, topic: str) -> dict:
    """Park CROWD Wait calls on `topic`, then Post it and read the shard map, timed."""
    md = ((TOKEN_KEY, token),)
    # a few connections, as many workers would have (one stream each would need 1,500)
    channels = [
        grpc.aio.insecure_channel(address, options=[("grpc.use_local_subchannel_pool", 1)])
        for _ in range(4)
    ]
    try:
        stubs = [pb_grpc.CoordinatorStub(ch) for ch in channels]
        waits = [
            stubs[i % len(stubs)].Wait(
                pb.WaitRequest(topic=topic, min_round=1, timeout=30), metadata=md, timeout=35
            )
            for i in range(CROWD)
        ]
        driver = pb_grpc.CoordinatorStub(channels[0])
        out = {}
        try:
            out["parked"] = await _parked(driver, md, CROWD, 20)
            early = [w for w in waits if w.done()]
            out["early"] = len(early)
            if early:
                out["first_early"] = f"{await early[0].code()}: {await early[0].details()}"
            out["post"] = await _timed(
                driver.Post,
                pb.PostRequest(topic=topic, round=1, payload="{}"),
                metadata=md,
                timeout=5,
            )
            out["map"] = await _timed(driver.GetShardMap, pb.Empty(), metadata=md, timeout=5)
        except grpc.aio.AioRpcError as e:
            out["error"] = f"{e.code().name}: {e.details()}"  # GetMetrics, Post or map
            return out
        got = await asyncio.wait_for(asyncio.gather(*waits, return_exceptions=True), 30)
        out["released"] = sum(isinstance(r, pb.PostRequest) and r.round == 1 for r in got)
        return out
    finally:
        for ch in channels:
            await ch.close()


def test_a_post_is_answered_and_every_waiter_released_with_1500_waiting(own_ps):
    out = asyncio.run(_crowd_then_post(own_ps.address, own_ps.token, "crowd"))
    assert "error" not in out, f"with {CROWD} waiters: {out}"
    assert out["parked"] == CROWD and out["early"] == 0, out  # all waited for the Post
    assert out["post"] < ANSWER_SECONDS and out["map"] < ANSWER_SECONDS, out
    assert out["released"] == CROWD, out


def _arrive(client, worker: str, done: dict) -> threading.Thread:
    def run() -> None:
        try:
            client.barrier("b3", worker, count=3, timeout=30)
            done[worker] = time.monotonic()
        except PSError as e:
            done[worker] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def test_a_removed_arrival_does_not_stand_in_for_a_missing_worker(own_ps):
    client, done = own_ps.client, {}
    a = _arrive(client, "A", done)
    time.sleep(0.5)
    client.remove_worker("b3", "A")  # A arrived, then was lost: 2 live workers make it
    b = _arrive(client, "B", done)
    b.join(1.5)
    assert b.is_alive() and not done, f"released before C arrived: {done}"
    c = _arrive(client, "C", done)
    for t in (a, b, c):
        t.join(20)
    assert all(isinstance(done.get(w), float) for w in "ABC"), done


def test_a_dropped_models_name_takes_a_new_shape(own_ps):
    first = PSVector.dense(100, name="m", context=own_ps)
    first.fill(1.0)
    first.drop()
    again = PSVector.dense(200, name="m", context=own_ps)
    np.testing.assert_array_equal(again.pull(), np.zeros(200))
    again.drop()
    again.drop()  # dropping twice is harmless
    table = PSMatrix.dense(50, 3, name="m", context=own_ps)
    assert own_ps.client.lookup("m").cols == 3
    np.testing.assert_array_equal(table.pull(), np.zeros((50, 3)))
    with pytest.raises(PSError, match="exists with kind=dense dim=50 cols=3"):
        PSVector.dense(7, name="m", context=own_ps)  # a live model's name stays taken


def _coordinator(address: str) -> tuple[grpc.Channel, pb_grpc.CoordinatorStub]:
    channel = grpc.insecure_channel(address)
    return channel, pb_grpc.CoordinatorStub(channel)


@pytest.mark.parametrize("token", [None, "wrong"], ids=["missing", "wrong"])
def test_the_coordinator_refuses_a_call_without_its_token(own_ps, token):
    channel, stub = _coordinator(own_ps.address)
    md = () if token is None else ((TOKEN_KEY, token),)
    with channel, pytest.raises(grpc.RpcError) as e:
        stub.Post(pb.PostRequest(topic=f"t-{token}", round=5), metadata=md, timeout=5)
    assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert "auth token" in e.value.details() and "Coordinator/Post" in e.value.details()
    with pytest.raises(PSError, match="timed out"):  # the refused Post posted nothing
        own_ps.client.wait(f"t-{token}", 0, timeout=0.2)


def test_a_bad_request_is_refused_with_its_reason(own_ps):
    with pytest.raises(PSError, match="barrier 'x': empty worker id") as e:
        own_ps.client.barrier("x", "", 2, timeout=1)
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(PSError, match="wait for 'never' round 1: timed out after 0.3s") as e:
        own_ps.client.wait("never", 1, timeout=0.3)
    assert e.value.code == grpc.StatusCode.DEADLINE_EXCEEDED


def test_the_coordinator_refuses_a_request_over_its_limit():
    svc = Service(num_shards=1, token="t", max_request_mb=0.25)
    svc.start()
    channel, stub = _coordinator(svc.address)
    try:
        with channel, pytest.raises(grpc.RpcError) as e:
            big = pb.PostRequest(topic="big", round=1, payload="x" * (300 << 10))
            stub.Post(big, metadata=((TOKEN_KEY, "t"),), timeout=10)
        assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "coordinator: Post: request of" in e.value.details()
        assert svc.coordinator.board.get("big") is None
    finally:
        svc.stop()


def test_a_waiting_get_task_gets_a_lease_that_lapses_meanwhile(own_ps):
    """Nothing notifies a lapsing lease: the waiter must wake at its expiry by itself."""
    client = own_ps.client
    client.add_tasks("lapse", ["only"], lease_seconds=0.5)
    assert client.get_task("lapse", "silent", timeout=1).task == "only"  # never heartbeats
    t = time.monotonic()
    lease = client.get_task("lapse", "next", timeout=20)
    assert (lease.task, lease.attempt) == ("only", 1)
    assert time.monotonic() - t < 5  # at the lease's expiry, not at the call's timeout


def test_a_coordinator_port_in_use_is_an_error_naming_it_and_leaves_no_thread():
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port, before = taken.getsockname()[1], _loop_threads()
    try:
        with pytest.raises(OSError, match=f"cannot bind coordinator to 127.0.0.1:{port}"):
            Service(port=port)
    finally:
        taken.close()
    assert _loop_threads() == before  # its event-loop thread ended too


def _loop_threads() -> int:
    return sum(t.name == "coordinator event loop" for t in threading.enumerate())


async def _abandon(address: str, token: str, n: int) -> tuple[int, int]:
    """Park `n` Waits whose callers give up after 3 s (the request asks for 30 s):
    calls waiting while parked, and once the callers left (within 5 s more)."""
    md = ((TOKEN_KEY, token),)
    async with grpc.aio.insecure_channel(address) as channel:
        stub = pb_grpc.CoordinatorStub(channel)
        request = pb.WaitRequest(topic="abandoned", min_round=1, timeout=30)
        calls = [stub.Wait(request, metadata=md, timeout=3) for _ in range(n)]
        parked = await _parked(stub, md, n, 2.5)
        await asyncio.gather(*calls, return_exceptions=True)
        deadline = time.monotonic() + 5
        while True:
            left = (await stub.GetMetrics(pb.Empty(), metadata=md, timeout=5)).waiting
            if not left or time.monotonic() > deadline:
                return parked, left
            await asyncio.sleep(0.1)


def test_a_caller_that_gives_up_leaves_no_waiter_behind(own_ps):
    parked, left = asyncio.run(_abandon(own_ps.address, own_ps.token, 200))
    assert parked == 200 and left == 0
