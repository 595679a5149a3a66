"""The replication protocol's steps, driven one at a time in one process (real gRPC on
loopback, no timing luck): a backup dropped before it is attached is never attached,
and a primary that cannot tell the coordinator it dropped its backup acknowledges
nothing until it can."""

from __future__ import annotations

import os
import socket

import pytest

from ps_server.coordinator.loop_server import LoopServer
from ps_server.coordinator.servicer import CoordinatorServicer
from ps_server.proto import ps_pb2 as pb
from ps_server.proto import ps_pb2_grpc as pb_grpc
from ps_server.shard.replica import Replica
from ps_server.shard.server import ShardServicer
from ps_server.wire import RequestError

pytestmark = pytest.mark.timeout(60)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_backup_dropped_between_its_seed_and_its_attach_is_never_attached():
    """Supervisor seeds B; a forward to B fails before the supervisor attaches it; the
    primary's DropReplica reaches the coordinator first. The attach must then fail (it
    used to attach B, which missed that update, as the promotable backup)."""
    c = CoordinatorServicer(1)
    c.addresses[0], c.pids[0], c.terms[0] = "primary:1", 11, 1
    c.joining[0] = ("backup:2", 22)  # registered, being seeded
    assert c.drop_backup(0, "backup:2") is False  # not attached yet: remembered
    assert c.attach_backup(0, "backup:2", 1, 0) is False
    assert c.backups[0] == "" and 0 not in c.joining
    assert c.attach_backup(0, "backup:3", 1, 0) is True  # a fresh backup attaches
    assert c.backups[0] == "backup:3"
    assert c.drop_backup(0, "backup:3") is True and c.backups[0] == ""
    assert c.counters["backup_lost"] == 1


def test_a_primary_acknowledges_nothing_until_the_coordinator_knows_its_backup_is_gone():
    port = _free_port()
    rep = Replica(ShardServicer(0), "primary", coordinator=f"127.0.0.1:{port}")
    dead_backup = f"127.0.0.1:{_free_port()}"
    rep._set_backup(dead_backup)  # the forward of the next mutation fails
    applied: list[int] = []

    def run() -> pb.Ack:
        applied.append(1)
        return pb.Ack(value=7)

    for _ in range(2):  # the first attempt, then its retry (same request id)
        with pytest.raises(RequestError) as e:
            rep.apply("Push", pb.PushRequest(), "rid-1", run)
        assert e.value.code == "UNAVAILABLE" and "acknowledging no update" in str(e.value)
    with pytest.raises(RequestError):  # nor any other update
        rep.apply("Push", pb.PushRequest(), "rid-2", run)
    assert applied == [1] and rep.backup == ""  # applied once here, forwards stopped

    servicer = CoordinatorServicer(1)
    servicer.addresses[0], servicer.backups[0] = "primary:1", dead_backup
    servicer.pids[0] = os.getpid()  # this process is the primary the coordinator knows
    server = LoopServer(
        lambda s: pb_grpc.add_CoordinatorServicer_to_server(servicer, s), f"127.0.0.1:{port}"
    )
    server.start()
    try:
        assert rep.apply("Push", pb.PushRequest(), "rid-1", run).value == 7  # from memory
        assert applied == [1] and servicer.backups[0] == ""  # never promotable now
        assert rep.apply("Push", pb.PushRequest(), "rid-2", run).value == 7
        assert applied == [1, 1]
    finally:
        server.stop(0)
        if rep._coord_channel is not None:
            rep._coord_channel.close()
