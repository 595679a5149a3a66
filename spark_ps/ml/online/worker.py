"""The executor side of online FTRL: score a micro-batch partition, then learn from it.

One call of :func:`learn_partition` per Spark task (it is the ``mapInArrow`` body of the
learning stream). The task reads its Arrow batches into one CSR batch, pulls the FTRL state
``(z, n)`` of the keys it touches (one pull), scores every row with those weights
(progressive validation: the batch is scored before anything learns from it), then runs
FTRL-proximal over its rows in mini-batches of ``batch_size`` on a local copy of the state
and pushes the increments ``(dz, dn)`` as its exactly-once contribution to round = batch id,
part = partition id (Angel's streaming FTRL pushes the same increments). Nothing changes on
the PS until the driver commits the batch.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
from pyspark import TaskContext

from ps_server.shard.optim import ftrl_accumulate, ftrl_weights
from spark_ps.data import CSRBatch, check_binary_labels, iter_minibatches, read_partition
from spark_ps.ml.binned_metrics import partition_stats
from spark_ps.models import PSMatrix

__all__ = [
    "FTRLConfig",
    "learn_partition",
    "weights",
    "BATCH_PROPERTY",
    "FAULT_PROPERTY",
    "STATS_SCHEMA",
]

BATCH_PROPERTY = "spark_ps.online.batchId"  # local property the driver sets per micro-batch
FAULT_PROPERTY = "spark_ps.online.taskFault"  # tests: "batch:part:marker", see inject_crash
STATS_SCHEMA = (
    "part int, rows long, weight double, loss double, pos array<double>, neg array<double>"
)


@dataclass(frozen=True)
class FTRLConfig:
    """Everything a task needs (small and picklable: the state is a PS handle)."""

    state: PSMatrix  # sparse, cols 2: (z, n); key num_features is the intercept
    num_features: int
    alpha: float
    beta: float
    l1: float
    l2: float
    fit_intercept: bool
    batch_size: int
    features_col: str
    label_col: str
    weight_col: str | None
    values_col: str | None

    @property
    def intercept_key(self) -> int:
        return self.num_features


def weights(cfg: FTRLConfig, z: np.ndarray, n: np.ndarray, has_intercept: bool) -> np.ndarray:
    """Weights from state; the last entry is the (unregularized) intercept if present."""
    w = ftrl_weights(z, n, cfg.alpha, cfg.beta, cfg.l1, cfg.l2)
    if has_intercept:
        w[-1] = ftrl_weights(z[-1:], n[-1:], cfg.alpha, cfg.beta, 0.0, 0.0)[0]
    return w


def pull_weights(cfg: FTRLConfig, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(state [k(+1), 2], weights) for sorted unique ``keys`` (+ the intercept key)."""
    pull_keys = np.append(keys, cfg.intercept_key) if cfg.fit_intercept else keys
    zn = np.array(cfg.state.pull(pull_keys, unique=True), dtype=np.float64).reshape(-1, 2)
    return zn, weights(cfg, zn[:, 0], zn[:, 1], cfg.fit_intercept)


def margins(cfg: FTRLConfig, local: CSRBatch, w: np.ndarray) -> np.ndarray:
    """x . w + b for a batch localized to the pulled keys."""
    coef, b = (w[:-1], w[-1]) if cfg.fit_intercept else (w, 0.0)
    return local.matvec(coef) + b


def read_checked(cfg: FTRLConfig, batches: Iterator[pa.RecordBatch], part: int) -> CSRBatch:
    """The partition as CSR, refusing bad labels, weights, NaN features or keys clearly."""
    try:
        csr = read_partition(
            batches,
            cfg.features_col,
            label_col=cfg.label_col,
            weight_col=cfg.weight_col,
            values_col=cfg.values_col,
            num_features=cfg.num_features,
        )
        check_binary_labels(csr.labels, cfg.label_col)
    except (ValueError, TypeError) as err:
        raise ValueError(f"{err} (partition {part} of this micro-batch)") from err
    return csr


def _learn(cfg: FTRLConfig, local: CSRBatch, zn: np.ndarray) -> np.ndarray:
    """FTRL over the rows in stream order, mini-batch by mini-batch, on a local state copy;
    returns the increments (dz, dn) of every pulled key."""
    z, n = zn[:, 0].copy(), zn[:, 1].copy()
    last = z.size - 1
    for mb in iter_minibatches(local, cfg.batch_size):
        keys, loc = mb.localize()
        rows = np.append(keys, last) if cfg.fit_intercept else keys
        w = weights(cfg, z[rows], n[rows], cfg.fit_intercept)
        resid = (1.0 / (1.0 + np.exp(-margins(cfg, loc, w))) - mb.labels) * _weights_of(mb)
        wsum = float(_weights_of(mb).sum())
        if wsum <= 0:
            continue
        g = loc.rmatvec(resid, keys.size) / wsum
        if cfg.fit_intercept:
            g = np.append(g, resid.sum() / wsum)
        z[rows], n[rows] = ftrl_accumulate(w, z[rows], n[rows], g, cfg.alpha)
    return np.column_stack([z - zn[:, 0], n - zn[:, 1]])


def _weights_of(csr: CSRBatch) -> np.ndarray:
    return csr.weights if csr.weights is not None else np.ones(csr.n_rows)


def _maybe_fail(ctx: TaskContext, batch_id: str, part: int) -> None:
    """Chaos hook: the task named by FAULT_PROPERTY dies once, after its push."""
    fault = ctx.getLocalProperty(FAULT_PROPERTY)
    if not fault:
        return
    b, p, marker = fault.split(":", 2)
    if (b, int(p)) == (batch_id, part) and not os.path.exists(marker):
        open(marker, "w").close()
        raise RuntimeError(f"injected failure of task {part} of batch {batch_id} after its push")


def learn_partition(cfg: FTRLConfig, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """``mapInArrow`` body: one stats row per task (also for empty partitions)."""
    ctx = TaskContext.get()
    part = ctx.partitionId()
    batch_id = ctx.getLocalProperty(BATCH_PROPERTY)
    if batch_id is None:
        raise RuntimeError(
            f"no {BATCH_PROPERTY} local property: the learning stream must be run by "
            "OnlineLogisticRegression.trainOn (its foreachBatch sets the batch id)"
        )
    csr = read_checked(cfg, batches, part)
    stats = partition_stats(np.zeros(0), np.zeros(0), np.zeros(0))
    if csr.n_rows:
        keys, local = csr.localize()
        zn, w = pull_weights(cfg, keys)
        stats = partition_stats(margins(cfg, local, w), csr.labels, _weights_of(csr))
        delta = _learn(cfg, local, zn)
        pull_keys = np.append(keys, cfg.intercept_key) if cfg.fit_intercept else keys
        cfg.state.aggregate(pull_keys, delta, round=int(batch_id), part=part, unique=True)
    _maybe_fail(ctx, batch_id, part)
    yield pa.RecordBatch.from_pydict(
        {
            "part": pa.array([part], pa.int32()),
            "rows": pa.array([csr.n_rows], pa.int64()),
            "weight": pa.array([stats["weight"]], pa.float64()),
            "loss": pa.array([stats["loss"]], pa.float64()),
            "pos": pa.array([stats["pos"]], pa.list_(pa.float64())),
            "neg": pa.array([stats["neg"]], pa.list_(pa.float64())),
        }
    )
