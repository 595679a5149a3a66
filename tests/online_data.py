"""Synthetic click-style data for the online-learning tests: hashed int64 keys, real files.

Each row lists ``nnz`` features drawn from a vocabulary whose ids are scattered over
``[0, 2**log2_dim)``; the label follows a logistic model with fixed true weights, so a
learner that learns shows a falling progressive logloss.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

VOCAB, NNZ = 3000, 12


def vocabulary(log2_dim: int, seed: int = 5) -> tuple[np.ndarray, np.ndarray]:
    """(sorted distinct int64 keys in [0, 2**log2_dim), true weight of each)."""
    rng = np.random.default_rng(seed)
    keys = rng.permutation(np.unique(rng.integers(0, 2**log2_dim, size=VOCAB * 2)))[:VOCAB]
    return keys.astype(np.int64), rng.normal(0.0, 1.0, size=VOCAB)


def rows(n: int, log2_dim: int, seed: int) -> pa.Table:
    """``n`` rows: label (double), keys (array<bigint>), weight (double)."""
    keys, true_w = vocabulary(log2_dim)
    rng = np.random.default_rng(seed)
    pick = rng.zipf(1.3, size=(n, NNZ)) % keys.size  # popular and rare features
    margin = true_w[pick].sum(axis=1) * 0.5 - 0.3
    label = (rng.random(n) < 1.0 / (1.0 + np.exp(-margin))).astype(np.float64)
    flat = pa.array(keys[pick].ravel())
    offsets = pa.array(np.arange(0, n * NNZ + 1, NNZ, dtype=np.int32))
    return pa.table(
        {
            "label": label,
            "keys": pa.ListArray.from_arrays(offsets, flat),
            "weight": np.ones(n),
        }
    )


def write_stream_files(directory: Path, files: int, per_file: int, log2_dim: int) -> list[Path]:
    """``files`` parquet files named in time order (one micro-batch each)."""
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(files):
        path = directory / f"part-{i:04d}.parquet"
        pq.write_table(rows(per_file, log2_dim, seed=100 + i), path)
        paths.append(path)
    return paths


def train_stream(spark, learner, src: Path, checkpoint: Path, schema) -> None:
    """Train `learner` on every file under `src`, one file per micro-batch, to the end."""
    stream = spark.readStream.schema(schema).option("maxFilesPerTrigger", 1).parquet(str(src))
    q = learner.trainOn(stream, str(checkpoint), trigger={"availableNow": True})
    q.awaitTermination(240)
    assert q.exception() is None


def learner_state(learner) -> tuple[np.ndarray, np.ndarray]:
    """The FTRL model's (keys, [z, n] rows), ordered by key: comparable across runs."""
    keys, zn = learner._cfg.state.pull()
    order = np.argsort(keys)
    return np.asarray(keys)[order], np.asarray(zn).reshape(-1, 2)[order]
