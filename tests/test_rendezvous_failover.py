"""A worker whose rendezvous shard fails over mid-step fails its task (the driver then
relaunches the worker job) instead of waiting forever. Real replicated PS processes."""

from __future__ import annotations

import os
import signal
import threading
import time

import numpy as np
import pytest

from ps_server.coordinator.service import Service
from spark_ps.client import PSClient
from spark_ps.ml._job import WorkerContext

pytestmark = pytest.mark.timeout(120)
TOKEN = "rendezvous-failover-token"


def _step(ctx: WorkerContext, step: int) -> list:
    args = {"topic": "fit-x", "step": step, "n_parts": 2, "wait": 0.3}
    return ctx.rendezvous("rendezvous.gather", args, [[np.full(2, float(ctx.part))]], [0])


def test_a_straggler_whose_shard_failed_over_fails_instead_of_hanging():
    """Both parts complete step 1 on shard 0's primary, which then dies before part 1
    has its answer; part 1 asks again. The promoted backup never saw step 1 and part 0,
    which had its answer, moved on: part 1 used to ask forever. Now it fails at once,
    naming the shard that moved."""
    svc = Service(num_shards=1, token=TOKEN, replicas=2)
    svc.start()
    supervisor = threading.Thread(target=svc.supervise, daemon=True)
    supervisor.start()
    client = PSClient(svc.address, TOKEN)
    try:
        client.refresh()
        while not client.backups[0]:  # the backup is seeded and attached
            time.sleep(0.1)
            client.refresh()
        workers = [WorkerContext(svc.address, TOKEN, "fit-x", part, 0) for part in (0, 1)]
        done: list = []
        threads = [threading.Thread(target=lambda w=w: done.append(_step(w, 1))) for w in workers]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert len(done) == 2  # step 1 completed for both on the first primary
        primary = client.health()[0].pid
        os.kill(primary, signal.SIGKILL)
        deadline = time.monotonic() + 60
        while svc.coordinator.counters["promotion"] == 0 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert svc.coordinator.counters["promotion"] == 1
        outcome: list = []

        def ask_again() -> None:
            try:
                outcome.append(_step(workers[1], 1))
            except Exception as e:  # noqa: BLE001 - what the task would fail with
                outcome.append(e)

        straggler = threading.Thread(target=ask_again, daemon=True)
        straggler.start()
        straggler.join(20)
        assert outcome, "the straggler is still asking: the fit would hang"
        assert isinstance(outcome[0], RuntimeError), outcome[0]
        assert "PS shard 0 moved from" in str(outcome[0]) and "relaunched" in str(outcome[0])
    finally:
        client.close()
        svc.stop_event.set()
        supervisor.join(30)
