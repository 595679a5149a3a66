"""The coordinator forgets what nobody used for its ttl: a long-running service holds the
state of its recent fits, not of every fit it ever served. In-process coordinator served
over loopback gRPC, driven by the project's client."""

from __future__ import annotations

import time

import numpy as np
import pytest

from ps_server.coordinator.idle import LastUse
from ps_server.coordinator.loop_server import LoopServer
from ps_server.coordinator.servicer import CoordinatorServicer
from ps_server.proto import ps_pb2_grpc as pb_grpc
from spark_ps.client import PSClient, PSError

pytestmark = pytest.mark.timeout(60)


@pytest.fixture()
def coordinator():
    servicer = CoordinatorServicer(1, idle_seconds=0.5)
    server = LoopServer(
        lambda s: pb_grpc.add_CoordinatorServicer_to_server(servicer, s), "127.0.0.1:0"
    )
    server.start()
    client = PSClient(f"127.0.0.1:{server.port}")
    yield servicer, client
    client.close()
    server.stop(0)


def test_idle_entries_of_every_kind_are_forgotten_and_live_ones_kept(coordinator):
    servicer, c = coordinator
    for fit in range(20):  # twenty finished fits' leftovers
        c.post(f"job-{fit}/cmd", 1, {"op": "stop"})
        c.contribute(f"job-{fit}/out", 1, 0, np.ones(3))
        c.heartbeat(f"job-{fit}/q", "w0")
        c.barrier(f"job-{fit}/start", "w0", 1, timeout=5)
        c.clock(f"job-{fit}/ssp", "w0", 1, staleness=0, num_workers=1, timeout=5)
        c.add_tasks(f"job-{fit}/q", ["a"])
    c.remove_worker("*", "executor:7")
    assert len(servicer.board) == 20 and len(servicer.queues) == 20
    t0 = time.monotonic()
    while time.monotonic() - t0 < 1.2:  # a live fit keeps using its entries meanwhile
        c.post("job-live/cmd", 2, {"op": "grad"})
        time.sleep(0.1)
    assert list(servicer.board) == ["job-live/cmd"]
    assert not servicer.parts and not servicer.heartbeats and not servicer.queues
    assert not servicer.barriers and not servicer.clocks and not servicer.removed
    assert not servicer.removed_executors
    assert c.wait("job-live/cmd", 2, timeout=1) == (2, {"op": "grad"})
    with pytest.raises(PSError, match="unknown task queue 'job-3/q'"):
        c.get_task("job-3/q", "w1", timeout=0)


def test_last_use_refuses_a_bad_ttl_and_sweeps_at_most_once_a_period():
    with pytest.raises(ValueError, match="ttl must be > 0"):
        LastUse(0)
    used = LastUse(0.2)
    used.touch("board", "a")
    assert used.expired() == []  # within the first sweep period
    time.sleep(0.3)
    assert used.expired() == [("board", "a")] and len(used) == 0
