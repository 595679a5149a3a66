"""Histogram GBDT on the PS (Angel style): one barrier job, splits found on the shards.

The driver (this module; the workers' side is ``rounds`` and ``boost_worker``) runs a few
set-up rounds, then starts the workers' boosting loop and only reads:

  ``meta``     row counts, max weight, number of features;
  ``sketch``   a partition-independent row sample -> MLlib's split thresholds (on the
               driver): the sampled rows themselves when they are few enough
               (``POOLED_SKETCH_VALUES``), else per-feature exact value summaries merged
               on the PS by key; the same round sums the exact total weight;
  ``boost``    the workers bin their rows, then grow every tree themselves, the shards
               finding the splits and acting as the rendezvous of each layer (see
               ``spark_ps.ml.gbt.boost_worker``);
               the driver reads each finished tree from the round board, shows progress and
               posts the trees read so far as the state a retried task resumes from.

Row sampling uses a hash of each row's content, and every statistic that decides a split is
an integer sum, so the trees do not depend on how the rows are partitioned or on whether a
task was retried.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import asdict

import numpy as np
from pyspark.sql import functions as F

from spark_ps.context import PSContext
from spark_ps.ml._job import PSJob, best_effort
from spark_ps.ml._progress import Progress
from spark_ps.ml._recovery import FitRecovery, redo_on_restart
from spark_ps.ml.base import PreparedData, densified, no_validation_rows
from spark_ps.ml.gbt import boost_worker
from spark_ps.ml.gbt.boost_worker import early_stop, tree_topic
from spark_ps.ml.gbt.estimator import register_trainer
from spark_ps.ml.gbt.rounds import HANDLERS, VAL, setup_rows
from spark_ps.ml.parse_cache import plan_parse
from spark_ps.ml.tree.binning import (
    QuantileSketch,
    _reduce,
    sketch_fraction,
    split_thresholds,
    summarize,
)
from spark_ps.ml.tree.histogram import weight_exponent
from spark_ps.ml.tree.local import resolve_params
from spark_ps.ml.tree.loss import LogLoss, get_loss
from spark_ps.ml.tree.tree import TreeArrays
from spark_ps.models import PSMatrix

__all__ = ["train_gbt"]

log = logging.getLogger("spark_ps.ml.gbt")


def _posted(state: dict, topic: str) -> dict:
    """The state a retried task reads, its trees by reference (their board topics, where
    partition 0 posted them): re-posting every tree after each new one was O(trees^2) JSON,
    4.1 s of driver CPU over 100 depth-6 trees (measured), taken from the workers' cores."""
    out = {k: v for k, v in state.items() if k != "trees"}
    out.update(tree_topic=topic, n_trees=len(state["trees"]))
    return out


def _snapshot(state: dict) -> dict:
    """A copy of the driver's state that later trees leave as it is, in O(trees): its lists
    only grow and their items (trees as read from the board, weights, losses) are never
    changed, so they are shared. A deep copy at every tree was O(trees^2): 2.8 s of driver
    CPU over 100 depth-6 trees (measured), on the cores the workers use."""
    return {k: list(v) if isinstance(v, list) else v for k, v in state.items()}


def _thresholds(
    job: PSJob, ps, n_rows: int, n_features: int, max_w: float, p, name: str = ""
) -> tuple[list, float]:
    """Merge every partition's value summary on the PS, then MLlib's split candidates (the
    summaries' tensors named under `name`, default the job's topic); and the total weight,
    which the same round sums (:func:`_total_weight`)."""
    max_bins = min(p.maxBins, n_rows)
    wexp = weight_exponent(max_w, n_rows)
    name = name or job.topic
    fraction = sketch_fraction(n_rows, max_bins)
    if min(n_rows, max(max_bins**2, 10_000)) * (n_features + 1) <= POOLED_SKETCH_VALUES:
        return _pooled_thresholds(job, ps, n_features, wexp, fraction, p, max_bins, name)
    counts = PSMatrix.sparse(2, name=f"{name}/sketch-counts", dtype="int64", context=ps)
    values = PSMatrix.sparse(2, name=f"{name}/sketch-values", context=ps)
    try:
        r, sums = job.call(
            "sketch",
            counts=counts.name,
            values=values.name,
            weight_exp=wexp,
            fraction=fraction,
            seed=p.seed,
        )
        counts.reduce(r)  # every partition's summary once, however often it was pushed
        keys, fv = values.pull()
        wc = counts.pull(keys)
    finally:
        best_effort(f"dropping {counts.name}", counts.drop)
        best_effort(f"dropping {values.name}", values.drop)
    feat = fv[:, 0].astype(np.int64)
    sketch: QuantileSketch = _reduce(feat, fv[:, 1], wc[:, 0], wc[:, 1], n_features, wexp)
    return split_thresholds(sketch, max_bins), _total_weight(sums, wexp)


def _total_weight(sums: np.ndarray, weight_exp: int) -> float:
    """The total weight from a sketch round's scalars [pushed, high half, low half]: every
    partition's fixed-point total summed as an exact integer (each half's sum is exact in
    float64), then scaled to float64 once, as the local trainer does."""
    hi, lo = int(sums[1]), int(sums[2])
    return float(np.ldexp(float((hi << 31) + lo), -weight_exp))


#: The sketch's sampled rows go to the driver whole when they hold at most this many values
#: (rows x (features + 1); 128 MB): one small contribution per partition and one sort per
#: feature, instead of a (feature, value) key per sampled value pushed to, summed on and
#: pulled from the PS (0.67 -> ~0.2 s of a 200k x 80 fit's set-up). Both give the same sketch.
POOLED_SKETCH_VALUES = 1 << 24


def _pooled_thresholds(
    job: PSJob, ps, n_features: int, wexp: int, fraction: float, p, max_bins: int, name: str
) -> tuple[list, float]:
    """`_thresholds` from the sampled rows themselves: each partition contributes its rows
    (weight, then features) under keys unique to it, and the driver summarises them all.
    The summary is exact integer sums per (feature, value), so it is the one the merged
    per-partition summaries give."""
    rows = PSMatrix.sparse(n_features + 1, name=f"{name}/sketch-rows", context=ps)
    try:
        r, sums = job.call(
            "sketch", rows=rows.name, weight_exp=wexp, fraction=fraction, seed=p.seed
        )
        rows.reduce(r)  # every partition's rows once, however often they were pushed
        _, sampled = rows.pull()
    finally:
        best_effort(f"dropping {rows.name}", rows.drop)
    # the workers wait for the thresholds: the driver sorts on every core it has
    cores = os.cpu_count() or 1
    sketch = summarize(sampled[:, 1:], sampled[:, 0], weight_exp=wexp, n_threads=cores)
    return split_thresholds(sketch, max_bins), _total_weight(sums, wexp)


def _fit_params(params: dict) -> dict:
    keep = (
        "maxDepth",
        "maxBins",
        "minInstancesPerNode",
        "minWeightFractionPerNode",
        "minInfoGain",
        "maxIter",
        "stepSize",
        "subsamplingRate",
        "featureSubsetStrategy",
        "seed",
        "lossType",
        "validationTol",
        "gossTopRate",
        "gossOtherRate",
    )
    return {k: params[k] for k in keep if k in params}


class _RowsRefused(Exception):
    """The workers' read refused rows; the fit stops and the driver words the error."""


def _check_meta(job: PSJob, meta: np.ndarray, empty_validation: str | None = None) -> None:
    """Raise :class:`_RowsRefused` if the workers' read refused rows, partitions disagree on
    the number of features, no row trains, or the fit has a validation set
    (`empty_validation`: the error if it holds no row) and no row validates (see
    :func:`train_gbt`)."""
    has_rows = (meta[:, 0] + meta[:, 1]) > 0
    dims = set(meta[has_rows, 3].astype(np.int64).tolist())
    refused = np.flatnonzero(meta[:, 4] > 0)
    if refused.size:
        raise _RowsRefused(job.refusal(int(refused[0])))
    if len(dims) > 1:
        raise _RowsRefused(f"partitions disagree on the number of features: {sorted(dims)}")
    if meta[:, 0].sum() == 0:
        raise _RowsRefused(
            "DecisionTree requires size of input RDD > 0, but was given by empty one."
        )
    if empty_validation is not None and meta[:, 1].sum() == 0:
        raise _RowsRefused(empty_validation)


def _prepare(job: PSJob, ps, p, attempt: int = 0, empty_validation: str | None = None) -> dict:
    """Set-up rounds: row counts, the merged sketch -> thresholds and the total weight; the
    boost command (the workers bin their rows as it starts).
    `attempt` > 0: redone after a shard restart (`redo_on_restart`), under fresh names;
    `empty_validation`: the error for an empty validation set, when the fit has one."""
    nw = job.num_workers
    t0 = time.perf_counter()
    classification = get_loss(p.lossType).is_classification
    # waits for the job to start and read its rows
    _, meta = job.call("meta", n_workers=nw, classification=classification)
    t1 = time.perf_counter()
    meta = meta.reshape(nw, 5)
    _check_meta(job, meta, empty_validation)
    n_rows, max_w = int(meta[:, 0].sum()), float(meta[:, 2].max())
    n_features = int(meta[:, 3].max())
    name = f"{job.topic}/redo{attempt}" if attempt else job.topic
    splits, total_w = _thresholds(job, ps, n_rows, n_features, max_w, p, name)
    thresholds = [t.tolist() for t in splits]  # the workers bin by them as boosting starts
    t2 = time.perf_counter()
    log.info("spark-ps GBT set-up: job start + read + meta %.3fs, sketch %.3fs", t1 - t0, t2 - t1)
    return {
        "topic": f"{job.topic}/gbt",
        "n_parts": nw,
        "params": asdict(p),
        "thresholds": thresholds,
        "n_bins": max(len(t) for t in thresholds) + 1,
        "n_rows": n_rows,
        "n_features": n_features,
        "max_w": max_w,
        "min_w": p.minWeightFractionPerNode * total_w,
        "cells_per_shard": boost_worker.CELLS_PER_SHARD,  # read now: tests lower it
    }


#: How vector rows reach the workers: ``"auto"`` packed by the bridge (``"packed"``) when its
#: jar is available, else ``"arrays"`` (array<double> columns); tests force either one.
ROWS = "auto"


def _dense_rows(data: PreparedData):
    """The rows with vectors as one float64 row each (:func:`spark_ps.ml.base.densified`):
    workers densify every row anyway, and Spark hands flat rows to Arrow 6-10x faster than
    VectorUDT structs (measured: 262k x 24 dense rows, ~2.5 s vs ~25 s per partition on a
    loaded 2-core machine)."""
    if data.features_kind != "vector":
        return data.df
    return densified(data.df, data.features_col, ROWS)


def train_gbt(
    data: PreparedData,
    params: dict,
    *,
    validation: PreparedData | None = None,
    check_rows: Callable[[], None] | None = None,
):
    """The PS trainer of GBTClassifier/GBTRegressor (see spark_ps.ml.gbt.estimator).

    The workers' read validates every row (labels, weights, feature values, vector sizes);
    only when it refused something, partitions disagree on the number of features, no row
    trains or a `validation` set holds no row does the driver, once the job has ended (it
    holds every task slot), run
    ``check_rows``: the estimator's Spark job that finds the offending row and raises
    MLlib's error. Clean data thus costs no extra Spark job (~1.1-1.7 s per fit, measured
    on nycflights under load)."""
    p = resolve_params(_fit_params(params))
    loss = get_loss(p.lossType)
    df = _dense_rows(data).withColumn(VAL, F.lit(False))
    if validation is not None:
        df = df.unionByName(_dense_rows(validation).withColumn(VAL, F.lit(True)))
    if validation is not None:  # (prepare_data already gave the training rows num_workers)
        df = df.repartition(data.num_workers)
    ps = PSContext.getOrCreate(df.sparkSession)
    t0 = time.perf_counter()
    # the training rows alone may come from a saved parse (a validation set is another input)
    parse = None if validation is not None else plan_parse(data, f"gbt|{ROWS}")
    with PSJob(
        ps,
        df,
        data.num_workers,
        setup_rows(data, parse),
        HANDLERS,
        name=f"{type(loss).__name__[1:]} GBT(maxIter={p.maxIter})",
        parse=parse,
    ) as job:
        interval = params.get("checkpointInterval", -1)
        recovery = FitRecovery(
            job, interval, ps_state=False, what=job.name, watch=False, snapshot=_snapshot
        )
        ps.fit_started(recovery)
        try:
            try:  # a shard restart during the set-up rounds: they are redone
                empty = None  # the error for an empty validation set, when there is one
                if validation is not None:
                    empty = no_validation_rows(params.get("validationIndicatorCol"))
                cmd = redo_on_restart(job, job.name, lambda n: _prepare(job, ps, p, n, empty))
            except Exception as e:  # bad rows (or an empty input) may have ended the job
                job.stop(raise_errors=False)  # it holds the task slots check_rows needs
                if check_rows is not None:
                    check_rows()  # MLlib's error for the first bad row, if there is one
                if isinstance(e, _RowsRefused):
                    raise ValueError(str(e)) from None
                raise
            t_setup = time.perf_counter() - t0
            cmd["validation"] = validation is not None  # every worker decides alike
            cmd["validation_auc"] = validation is not None and loss is LogLoss
            trees, weights, hist = _read_trees(job, cmd, p, validation is not None, recovery)
        finally:
            ps.fit_ended(recovery)
            best_effort(
                f"{job.name}: dropping the rendezvous steps of {job.topic}",
                lambda: ps.client.call("rendezvous.drop", [], {"topic": job.topic}),
            )
    hist["setup_seconds"] = t_setup
    hist["fit_seconds"] = time.perf_counter() - t0
    log.info(
        "spark-ps GBT: %.3fs (set-up %.3fs, trees %.3fs); worker 0 seconds: %s",
        hist["fit_seconds"],
        t_setup,
        hist["fit_seconds"] - t_setup,
        ", ".join(f"{k} {v:.3f}" for k, v in hist["worker_seconds"].items()),
    )
    return trees, weights, cmd["n_features"], hist


def _read_trees(job: PSJob, cmd: dict, p, has_val: bool, recovery: FitRecovery):
    """Start the workers' boosting loop, then read each finished tree from the board;
    the trees read so far are posted as the state a retried task resumes from, and go
    into a PS checkpoint every `checkpointInterval` trees (or when one is asked for)."""
    state = {
        "thresholds": cmd["thresholds"],
        "loss": p.lossType,
        "trees": [],
        "weights": [],
        "validation_loss": [],
    }
    job.post_state(_posted(state, cmd["topic"]))
    job.command("boost", **cmd)
    hist = {"train_loss": [], "validation_loss": state["validation_loss"]}
    bar = Progress("spark-ps GBT", p.maxIter, unit="tree")
    try:
        for m in range(p.maxIter):
            msg = job.wait_posted(tree_topic(cmd["topic"], m))
            state["trees"].append(msg["tree"])
            state["weights"].append(msg["weight"])
            hist["train_loss"].append(msg["train_loss"])
            losses = {"train loss": msg["train_loss"]}
            if has_val:
                state["validation_loss"].append(msg["validation_loss"])
                losses["validation loss"] = msg["validation_loss"]
            if msg.get("validation_auc") is not None:
                losses["validation auc"] = msg["validation_auc"]
            job.post_state(_posted(state, cmd["topic"]))
            recovery.boundary(m + 1, lambda: state)  # noqa: B023 - called now
            bar.update(m + 1, **losses)
            if msg["last"]:
                break
    finally:
        bar.close()
    hist["worker_seconds"] = msg["worker_seconds"]
    n = early_stop(state["validation_loss"], p.validationTol)[1] if has_val else len(state["trees"])
    trees = [TreeArrays.from_dict(t) for t in state["trees"][:n]]
    return trees, np.asarray(state["weights"][:n]), hist


register_trainer(train_gbt)
