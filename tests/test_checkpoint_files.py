"""Checkpoint files on disk: the newest K sealed versions stay, torn ones go, the weights
are owner-only, and a failed write leaves nothing behind. Real PS processes, real files."""

from __future__ import annotations

import os
import stat

import numpy as np
import pytest

from ps_server import checkpoint
from ps_server.shard import snapshot
from spark_ps import PSContext, PSVector


def _torn(root, version: int) -> None:
    """A version a crash left half written: a shard file, no manifest."""
    d = root / f"v{version:06d}"
    d.mkdir(parents=True)
    (d / "shard-0.npz").write_bytes(b"half")


def test_fifty_checkpoints_leave_the_newest_k(tmp_path):
    """spark.ps.checkpointKeep (default 2) sealed versions stay; a torn version older than
    the newest sealed one goes, a newer one (maybe still being written) stays; the newest
    restores the last state written."""
    uri = str(tmp_path / "ckpt")
    ctx = PSContext.start(numShards=2, checkpointDir=uri)
    try:
        w = PSVector.dense(64, name="keep_w", context=ctx)
        for i in range(50):
            w.update(np.arange(64), np.full(64, float(i)))
            ctx.checkpoint()
            if i == 10:
                _torn(tmp_path / "ckpt", 5)
                _torn(tmp_path / "ckpt", 999)
        assert checkpoint.sealed_versions(uri) == [49, 50]
        left = sorted(p.name for p in (tmp_path / "ckpt").iterdir())
        assert left == ["v000049", "v000050", "v000999"]
        models = snapshot.load_shard(uri, 50, 0)
        assert np.all(models["keep_w"].store.slot("w")[:32] == 49.0)
    finally:
        ctx.stop()


def test_checkpoint_keep_zero_keeps_all_and_bad_values_are_refused(tmp_path):
    uri = str(tmp_path / "all")
    ctx = PSContext.start(numShards=1, checkpointDir=uri, checkpointKeep=0)
    try:
        PSVector.dense(8, name="all_w", context=ctx)
        for _ in range(4):
            ctx.checkpoint()
        assert checkpoint.sealed_versions(uri) == [1, 2, 3, 4]
    finally:
        ctx.stop()
    with pytest.raises(ValueError, match="keep must be >= 0"):
        checkpoint.prune(uri, -1)


def test_service_start_removes_every_torn_version_and_restores_the_newest_sealed(tmp_path):
    uri = str(tmp_path / "ckpt")
    ctx = PSContext.start(numShards=1, checkpointDir=uri)
    try:
        w = PSVector.dense(4, name="start_w", context=ctx)
        w.update(np.arange(4), np.arange(4.0))
        ctx.checkpoint()
    finally:
        ctx.stop()
    _torn(tmp_path / "ckpt", 7)  # newer than the sealed v1: a crash mid-checkpoint
    ctx = PSContext.start(numShards=1, checkpointDir=uri)
    try:
        assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["v000001"]
        assert ctx.client.models() == ["start_w"]  # restored from v1, the newest sealed
    finally:
        ctx.stop()


def test_weights_are_owner_only_and_a_failed_write_leaves_no_temp_file(tmp_path):

    ctx = PSContext.start(numShards=1)
    try:
        PSVector.dense(16, name="perm_w", context=ctx)
        uri = str(tmp_path / "p")
        ctx.checkpoint(uri)
    finally:
        ctx.stop()
    vdir = tmp_path / "p" / "v000001"
    assert stat.S_IMODE(os.stat(vdir).st_mode) == 0o700
    for f in vdir.iterdir():
        assert stat.S_IMODE(os.stat(f).st_mode) == 0o600, f
    target = tmp_path / "taken"
    target.mkdir()  # a directory where the file should go: the rename fails
    (target / "x").write_text("keep me")
    fs, root = checkpoint._fs(str(tmp_path))
    with pytest.raises(OSError):
        checkpoint._write_atomic(fs, str(target), b"data")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p", "taken"]


def test_a_restarted_shard_restores_the_newest_of_several_versions(tmp_path):
    """Three sealed versions (1.0, 2.0, 3.0 everywhere): a SIGKILLed shard comes back with
    the newest, not an older one that is still on disk."""
    import signal
    import time

    uri = str(tmp_path / "ckpt")
    ctx = PSContext.start(numShards=2, checkpointDir=uri)
    try:
        w = PSVector.dense(100, name="newest_w", context=ctx)
        for value in (1.0, 2.0, 3.0):
            w.update(np.arange(100), np.full(100, value))
            ctx.checkpoint()
        assert checkpoint.sealed_versions(uri) == [2, 3]
        victim = ctx.client.health()[1].pid
        os.kill(victim, signal.SIGKILL)
        deadline = time.monotonic() + 60
        while victim in [h.pid for h in ctx.client.health()] and time.monotonic() < deadline:
            time.sleep(0.2)
        assert ctx.metrics()["restart"] == 1
        np.testing.assert_array_equal(w.pull(), np.full(100, 3.0))
    finally:
        ctx.stop()
