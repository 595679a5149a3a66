"""A shard that cannot start does not spin: restarts back off, and an unreadable newest
checkpoint falls back to the previous sealed version. Real processes, real files."""

from __future__ import annotations

import os
import signal
import threading
import time

import numpy as np
import pytest

from ps_server.coordinator.service import Service
from ps_server.shard import snapshot
from spark_ps.client import PSClient
from spark_ps.client.spec import TensorSpec

TOKEN = "restart-loop-token"


def _sealed_pair(tmp_path) -> tuple[str, TensorSpec]:
    """Two sealed versions of a 2-shard PS: 1.0 everywhere in v1, 2.0 in v2."""
    uri = str(tmp_path / "ckpt")
    svc = Service(num_shards=2, token=TOKEN)
    svc.start()
    c = PSClient(svc.address, TOKEN)
    try:
        spec = TensorSpec(name="loop_w", kind="dense", dim=10, cols=1, num_shards=2)
        c.create(spec)
        for version, value in ((1, 1.0), (2, 2.0)):
            c.push(spec, np.arange(10), np.full(10, value), "set")
            c.checkpoint(uri, version)
    finally:
        c.close()
        svc.stop()
    return uri, spec


def test_an_unreadable_newest_version_falls_back_to_the_previous_one(tmp_path):
    uri, _ = _sealed_pair(tmp_path)
    (tmp_path / "ckpt" / "v000002" / "shard-1.npz").write_bytes(b"not an npz")
    models, version = snapshot.restore_latest(uri, 1)
    assert version == 1
    assert np.all(models["loop_w"].store.slot("w")[:5] == 1.0)
    models, version = snapshot.restore_latest(uri, 0)  # shard 0's file is fine
    assert version == 2
    (tmp_path / "ckpt" / "v000001" / "shard-1.npz").unlink()
    with pytest.raises(RuntimeError, match=r"no sealed checkpoint version .* loads: v2: .*; v1"):
        snapshot.restore_latest(uri, 1)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_shard_that_cannot_start_is_restarted_with_back_off(tmp_path):
    """Every version of shard 1's file is unreadable: each restart dies at once. Over 10 s
    it is started a handful of times (0.4, 0.8, 1.6, 3.2 s apart), not every 0.2 s."""
    uri, _ = _sealed_pair(tmp_path)
    svc = Service(num_shards=2, token=TOKEN, checkpoint_dir=uri)
    svc.start()
    supervisor = threading.Thread(target=svc.supervise, daemon=True)
    supervisor.start()
    try:
        for version in (1, 2):
            (tmp_path / "ckpt" / f"v{version:06d}" / "shard-1.npz").write_bytes(b"broken")
        os.kill(svc.procs[1].pid, signal.SIGKILL)
        time.sleep(10)
        assert 2 <= svc.restarts <= 6, svc.restarts
        assert svc.procs[0].poll() is None  # the other shard serves on
    finally:
        svc.stop_event.set()
        supervisor.join(30)


@pytest.mark.timeout(120)
def test_a_shard_that_started_is_restarted_at_once_however_soon_it_is_killed(caplog):
    """A shard that registered had started: SIGKILLs a second apart (a chaos run, a test
    killing the same shard at every phase of a fit) are each answered by a restart without
    back-off, and none is logged as a crash loop."""
    svc = Service(num_shards=2, token=TOKEN)
    svc.start()
    supervisor = threading.Thread(target=svc.supervise, daemon=True)
    supervisor.start()
    c = PSClient(svc.address, TOKEN)
    try:
        caplog.set_level("INFO", logger="ps_server.coordinator.service")
        for kill in range(4):
            pid = svc.procs[1].pid
            os.kill(pid, signal.SIGKILL)
            deadline = time.monotonic() + 60
            while c.health()[1].pid == pid:  # health() retries until shard 1 answers
                assert time.monotonic() < deadline, f"kill {kill}: shard 1 not back"
                time.sleep(0.05)
        assert svc.restarts == 4
        loops = [r.getMessage() for r in caplog.records if "times in a row" in r.getMessage()]
        assert loops == []
    finally:
        c.close()
        svc.stop_event.set()
        supervisor.join(30)
