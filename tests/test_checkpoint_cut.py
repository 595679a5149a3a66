"""A shard checkpoint is a consistent cut: no mutation lands between two of its models.

An online commit adds a micro-batch to the FTRL state and records the batch in the ledger,
two models, in one call. A checkpoint that saved the ledger before such a commit and the
state after it would, once restored, apply that batch twice (the ledger says it is not
there). Real shard process, real files."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from ps_server import checkpoint
from ps_server.shard import snapshot
from spark_ps import PSContext, PSVector

pytestmark = pytest.mark.timeout(240)


def test_every_checkpoint_holds_the_state_of_exactly_the_batches_in_its_ledger(tmp_path):
    ctx = PSContext.start(numShards=1, checkpointKeep=0)
    uri = str(tmp_path / "cut")
    try:
        # saved in name order: the ledger first, padding, then the state (a wide window)
        ledger = PSVector.sparse(name="a_ledger", dtype="int64", context=ctx)
        pads = [PSVector.dense(200_000, name=f"m_pad{i:02d}", context=ctx) for i in range(20)]
        state = PSVector.sparse(name="z_state", context=ctx)
        stop = threading.Event()
        committed: list[int] = []

        def commit_batches() -> None:
            b = 0
            while not stop.is_set():
                b += 1
                state.aggregate(np.array([0]), np.array([1.0]), round=b, part=0)
                ctx.client.call(
                    "online.commit", [state.spec, ledger.spec], {"round": b, "parts": 1}
                )
                committed.append(b)

        writer = threading.Thread(target=commit_batches)
        writer.start()
        try:
            for version in range(1, 9):
                ctx.client.checkpoint(uri, version)
        finally:
            stop.set()
            writer.join(60)
        assert len(committed) > 8  # commits ran while the checkpoints were taken
        for version in checkpoint.sealed_versions(uri):
            models = snapshot.load_shard(uri, version, 0)
            batches = models["a_ledger"].store.num_rows
            z = models["z_state"]
            total = float(z.store.gather(np.array([0]))[0, 0]) if z.store.num_rows else 0.0
            assert total == batches, f"v{version}: state holds {total} batches, ledger {batches}"
        assert len(pads) == 20
    finally:
        ctx.stop()
