"""PS channels reconnect promptly to a port that a dead process held and a live one reuses.

Shards restart on fresh ephemeral ports, and the kernel hands out recently freed ones again.
With gRPC's defaults a process shares one back-off state per target across all its channels,
so a new channel to the reused port failed fast with the dead process's "Connection refused"
for up to two minutes (a CI flake in test_replication). Real servers over loopback here.
"""

from __future__ import annotations

import time

import grpc
import pytest

from ps_server.coordinator.loop_server import LoopServer
from ps_server.coordinator.servicer import CoordinatorServicer
from ps_server.proto import ps_pb2 as pb
from ps_server.proto import ps_pb2_grpc as pb_grpc
from ps_server.tls import open_channel

pytestmark = pytest.mark.timeout(60)


def _serve(port: int) -> LoopServer:
    servicer = CoordinatorServicer(1)
    server = LoopServer(
        lambda s: pb_grpc.add_CoordinatorServicer_to_server(servicer, s), f"127.0.0.1:{port}"
    )
    assert server.port, f"port {port} could not be bound again"
    server.start()
    return server


def _seconds_until_answer(channel: grpc.Channel, limit: float) -> float:
    """Call until the server answers; the seconds it took (or `limit` + 1 if it never did)."""
    stub, t0 = pb_grpc.CoordinatorStub(channel), time.monotonic()
    while time.monotonic() - t0 < limit:
        try:
            stub.GetShardMap(pb.Empty(), timeout=2)
            return time.monotonic() - t0
        except grpc.RpcError as e:
            assert e.code() == grpc.StatusCode.UNAVAILABLE, e
            time.sleep(0.05)
    return limit + 1


def test_a_reused_port_is_reached_at_once_after_its_old_process_died():
    first = _serve(0)
    port = first.port
    old = open_channel(f"127.0.0.1:{port}", None)
    assert _seconds_until_answer(old, 5) < 5
    first.stop(0)
    stub, t0 = pb_grpc.CoordinatorStub(old), time.monotonic()
    while time.monotonic() - t0 < 6:  # a client keeps failing against the dead address
        with pytest.raises(grpc.RpcError):
            stub.GetShardMap(pb.Empty(), timeout=2)
        time.sleep(0.05)
    second = _serve(port)
    try:
        with pytest.raises(grpc.RpcError):  # the old channel is still backing off ...
            stub.GetShardMap(pb.Empty(), timeout=2)
        new = open_channel(f"127.0.0.1:{port}", None)
        # ... but a new one connects on its first call (with a shared pool it failed fast)
        assert pb_grpc.CoordinatorStub(new).GetShardMap(pb.Empty(), timeout=10).epoch >= 0
        assert _seconds_until_answer(old, 10) < 10
        new.close()
    finally:
        old.close()
        second.stop(0)


def test_a_client_closes_its_channels_to_restarted_shards():
    """Every restart moves a shard to a new port. A long-lived client keeps one channel per
    live address: channels to the old ones are closed once calls on them have passed their
    deadline (the client's timeout), and the client keeps working on the new ones."""
    import os
    import signal

    from spark_ps import PSContext
    from spark_ps.client import PSClient

    ctx = PSContext.start(numShards=2)
    client = PSClient(ctx.address, ctx.token, timeout=1.0)
    try:
        old: list[grpc.Channel] = []
        for _ in range(3):
            victim = client.health()[1].pid
            old.append(client._channels[client.addresses[1]])
            os.kill(victim, signal.SIGKILL)
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                client.refresh()
                if victim not in [h.pid for h in client.health()]:
                    break
                time.sleep(0.2)
        assert len(client._channels) == 3  # the coordinator and two live shards
        assert old[-1] in [ch for _, ch in client._retired]  # not closed under a call yet
        time.sleep(2.1)  # past the 1 s timeout (+1 s) of any call started on them
        client.refresh()
        assert client._retired == [] and len(client._channels) == 3
        for ch in old:
            with pytest.raises(ValueError, match="closed channel"):
                pb_grpc.ShardStub(ch).Health(pb.Empty(), timeout=1)
        assert len(client.health()) == 2  # served over the live channels
    finally:
        client.close()
        ctx.stop()
