"""A request the primary accepts is never too big, or too slow, for its backup.

The primary forwards each mutation wrapped in a ReplicateRequest: a few bytes more than
the client's request. A request just under the shard's limit must not push its forward
over the backup's limit (which would drop the backup). Real replicated shard processes."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from ps_server.coordinator.service import Service
from ps_server.proto import ps_pb2 as pb
from ps_server.shard.replica import REQUEST_ID_KEY
from ps_server.wire import TOKEN_KEY, to_array
from spark_ps.client import PSClient
from spark_ps.client.spec import TensorSpec

pytestmark = pytest.mark.timeout(120)
TOKEN = "replica-limit-token"


def test_a_request_just_under_the_limit_is_forwarded_and_keeps_the_backup():
    svc = Service(num_shards=1, token=TOKEN, replicas=2, max_request_mb=1)
    svc.start()
    supervisor = threading.Thread(target=svc.supervise, daemon=True)
    supervisor.start()
    c = PSClient(svc.address, TOKEN)
    try:
        limit = 1 << 20
        n = (limit - 200) // 16  # keys and float64 values: just under 1 MB

        def push(name: str) -> pb.PushRequest:
            keys, values = to_array(np.arange(n, dtype=np.int64)), to_array(np.ones(n))
            return pb.PushRequest(model=name, keys=keys, values=values, op=pb.ADD)

        pad = limit - 2 - push("edge_w").ByteSize()
        while push("edge_w" + "x" * pad).ByteSize() > limit - 2:  # the name's length varint
            pad -= 1
        name = "edge_w" + "x" * pad
        req = push(name)
        assert limit - 4 <= req.ByteSize() <= limit - 2  # under the limit by a few bytes
        spec = TensorSpec(name=name, kind="dense", dim=1 << 17, cols=1, num_shards=1)
        c.create(spec)
        md = ((TOKEN_KEY, TOKEN), (REQUEST_ID_KEY, "edge-1"))
        assert c.shards[0].Push(req, metadata=md, timeout=30).value == n
        ((primary, backup),) = c.replica_digests()
        assert backup is not None and primary.digest == backup.digest
        assert svc.coordinator.counters["backup_lost"] == 0
        np.testing.assert_array_equal(c.pull(spec, np.arange(3)), np.ones(3))
    finally:
        c.close()
        svc.stop_event.set()
        supervisor.join(30)


def test_answers_are_remembered_for_the_retry_horizon_not_a_fixed_count():
    """A retry is answered from memory however many requests came after it, as long as it
    comes within the horizon (it was 4,096 answers); past the horizon the answer goes."""
    from ps_server.shard.replica import Replica
    from ps_server.shard.server import ShardServicer

    rep = Replica(ShardServicer(0), "primary")
    applied: list[int] = []

    def push(i: int) -> pb.Ack:
        applied.append(i)
        return pb.Ack(value=i)

    for i in range(10_000):
        rep.apply("Push", pb.PushRequest(), f"rid-{i}", lambda i=i: push(i))
    assert rep.apply("Push", pb.PushRequest(), "rid-0", lambda: push(-1)).value == 0
    assert len(applied) == 10_000  # the retry of the first was not applied again
    rep.horizon = 0.0  # every answer is now past the horizon: the next one sweeps them
    rep.apply("Push", pb.PushRequest(), "rid-new", lambda: push(10_000))
    assert list(rep.answers) == ["rid-new"] and len(rep._stamps) == 1


@pytest.mark.slow
def test_seeding_a_large_backup_does_not_freeze_writes_and_loses_none():
    """A 200 MB shard loses its backup; while the new one is seeded, a writer keeps
    pushing. Pushes go on during the seed (it used to hold the lock for all of it, so none
    completed until the seed was over), and every push made during it reaches the new
    backup: the replicas end identical. Measured against the seed itself, not a clock: a
    busy machine stretches every latency, but a lock held for the seed leaves a gap with no
    push done that spans most of it."""
    import os
    import signal
    import time

    svc = Service(num_shards=1, token=TOKEN, replicas=2)
    svc.start()
    supervisor = threading.Thread(target=svc.supervise, daemon=True)
    supervisor.start()
    c = PSClient(svc.address, TOKEN)
    try:
        big = TensorSpec(name="seed_big", kind="dense", dim=25_000_000, cols=1, num_shards=1)
        small = TensorSpec(name="seed_small", kind="dense", dim=10, cols=1, num_shards=1)
        c.create(big)
        c.create(small)
        c.push(big, np.arange(0, 25_000_000, 1000), np.ones(25_000), "set")
        lost = svc.coordinator.counters["resync"]
        latencies, done, stop = [], [], threading.Event()
        seed: list[float] = []  # when the supervisor's seeding call began, and when it ended
        configure = svc._configure

        def seeding_configure(address, backup, *args, **kwargs):
            if not backup:
                return configure(address, backup, *args, **kwargs)
            seed.append(time.monotonic())
            try:
                return configure(address, backup, *args, **kwargs)
            finally:
                seed.append(time.monotonic())

        svc._configure = seeding_configure  # the supervisor's call that seeds the backup
        os.kill(svc.backups[0].pid, signal.SIGKILL)

        def write() -> None:
            while not stop.is_set():
                t = time.monotonic()
                c.push(small, np.arange(10), np.ones(10))
                done.append(time.monotonic())
                latencies.append(done[-1] - t)

        writer = threading.Thread(target=write)
        writer.start()
        deadline = time.monotonic() + 90
        while svc.coordinator.counters["resync"] == lost and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.3)
        stop.set()
        writer.join(30)
        assert svc.coordinator.counters["resync"] == lost + 1
        assert len(seed) == 2, seed  # one seed
        inside = [t for t in done if seed[0] < t < seed[1]]
        gap = float(np.max(np.diff([seed[0], *inside, seed[1]])))
        assert len(inside) >= 5 and gap < 0.5 * (seed[1] - seed[0]), (gap, seed, len(inside))
        ((primary, backup),) = c.replica_digests()
        assert backup is not None and primary.digest == backup.digest
        np.testing.assert_array_equal(c.pull(small, np.arange(10)), np.full(10, len(latencies)))
    finally:
        c.close()
        svc.stop_event.set()
        supervisor.join(30)


def test_a_seeds_catch_up_is_replayed_in_order_in_groups_below_the_limit():
    """The mutations logged while a seed streamed go to the new backup many per call, in
    their order, each call below the request limit; one bigger than it goes alone."""
    from ps_server.shard.replica import replay_groups

    log = [
        pb.ReplicateRequest(method="Push", request=b"x" * size, request_id=f"r{i}", seq=i)
        for i, size in enumerate([100, 100, 100, 5000, 100, 0, 100])
    ]
    groups = list(replay_groups(log, limit=400))
    assert [r.seq for g in groups for r in g] == list(range(7))  # all, in order
    assert [len(g) for g in groups] == [3, 1, 3]
    for g in groups:
        assert len(g) == 1 or pb.ReplicateRequests(requests=g).ByteSize() <= 400
    assert list(replay_groups([], 400)) == []
