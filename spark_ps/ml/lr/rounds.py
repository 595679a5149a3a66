"""The LogisticRegression workers' rounds: what each Spark task does when a driver calls
``dims``, ``keys``, ``stats``, ``grad`` (full batch, :mod:`spark_ps.ml.lr.distributed`),
``softmax_grad`` (multinomial, :mod:`spark_ps.ml.lr.multinomial`) or ``epoch``
(mini-batch, :mod:`spark_ps.ml.lr.minibatch`).

Kept apart from the drivers so a worker's import chain holds no ``pyspark.ml``: a fresh
Python worker paid ~1 s importing it (and pandas) on every cold fit, for code it never runs.
"""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from spark_ps.data import CSRBatch, id_dtype, iter_minibatches, read_flags, read_partition
from spark_ps.ml import parse_cache
from spark_ps.ml._job import PSJob, WorkerContext, best_effort
from spark_ps.ml.binned_metrics import score_histograms
from spark_ps.ml.lr.objective import feature_stats, loss_and_grad, margins
from spark_ps.ml.lr.softmax import class_weights, softmax_loss_and_grad

if TYPE_CHECKING:  # a driver-side type: importing it pulls in pyspark.ml
    from spark_ps.ml.base import PreparedData

ASP = -1  #: the ``staleness`` value that means asynchronous (no clock waits)
CLOCK_TIMEOUT = 3600.0  #: seconds a worker waits for the slowest one before failing
DIMS_COLUMNS = 13  #: numbers each partition reports in the ``dims`` round (see `_dims`)
#: where the ``dims`` round's label summary starts: refused, training rows, largest training
#: label, largest validation label (-1: no such rows), negative or non-integer labels
DIMS_LABELS = 8


def _executor_id() -> str:
    """This executor's id as the JVM bridge's plugin wrote it, or "" without the plugin."""
    for d in os.environ.get("SPARK_LOCAL_DIRS", "").split(","):
        path = os.path.join(d, "spark-ps-executor.properties")
        if d and os.path.exists(path):
            with open(path) as f:
                for line in f:
                    if line.startswith("executor.id="):
                        return line.split("=", 1)[1].strip()
    return ""


class _Clock:
    """This worker's SSP clock for one epoch: one tick per mini-batch pushed, and with
    BSP (staleness 0) one more as it has pulled, so that every worker reads step c's
    weights before any pushes its step-c update: each step then sees exactly the
    previous steps' updates, whatever the workers' speeds (a worker released at clock c
    could otherwise pull after a faster one already pushed step c+1).

    The group is per (fit, epoch, launch of the barrier job), so a relaunch starts a
    fresh table; the worker id carries the executor id when known, so a lost executor's
    workers are removed by the JVM listener and stop holding the others back.
    """

    def __init__(self, ctx: WorkerContext, round_: int, cmd: dict):
        if "ssp_attempt" not in ctx.state:  # fresh in every launch of the barrier job
            from pyspark import BarrierTaskContext

            tc = BarrierTaskContext.get()  # the tasks agree on an id of this launch
            ctx.state["ssp_attempt"] = min(map(int, tc.allGather(str(tc.taskAttemptId()))))
        attempt = ctx.state["ssp_attempt"]
        self.client, self.staleness = ctx.client, int(cmd["staleness"])
        self.num_workers, self.timeout = int(cmd["num_workers"]), float(cmd["clock_timeout"])
        self.group = f"{ctx.topic}/ssp/{round_}/{attempt}"
        executor = _executor_id()
        self.worker = (f"executor:{executor}/" if executor else "") + f"{ctx.topic}/p{ctx.part}"
        self.tick(0)  # join: returns once every worker of the epoch is running

    def tick(self, clock: int) -> None:
        self.client.clock(
            self.group,
            self.worker,
            clock,
            staleness=self.staleness,
            num_workers=self.num_workers,
            timeout=self.timeout,
        )

    def leave(self) -> None:
        self.client.remove_worker(self.group, self.worker)


def _epoch(ctx: WorkerContext, round_: int, cmd: dict) -> None:
    """One pass over this partition in mini-batches; each pushes an optimizer step and,
    unless ASP, ticks this worker's clock (waiting while it is too far ahead)."""
    cids, clocal = compact(ctx, cmd["keyset"])
    model, last = ctx.tensor(cmd["model"]), cmd["dim"] - 1
    # rounds counted from the fit's attempt (`round_base`): a fit started over after a
    # shard restart shuffles as the clean fit did
    at = round_ - int(cmd.get("round_base", 0))
    seed = (cmd["seed"] * 1_000_003 + at * 7919 + ctx.part) & 0x7FFFFFFF
    clock = _Clock(ctx, round_, cmd) if cmd["staleness"] != ASP else None
    try:
        loss_sum, weight_sum = _walk(cmd, cids, clocal, model, last, seed, clock)
    except BaseException:  # e.g. a shard restarted: the others must not wait for this one
        if clock is not None:
            best_effort("leaving the epoch's clock table", clock.leave)
        raise
    if clock is not None:
        clock.leave()
    ctx.contribute(round_, [loss_sum, weight_sum])


def _walk(cmd, cids, clocal, model, last, seed, clock) -> tuple[float, float]:
    """The mini-batches of one epoch: (loss sum, weight sum)."""
    fit_intercept, l2 = cmd["fit_intercept"], cmd["l2"]
    loss_sum = weight_sum = 0.0
    bsp = clock is not None and clock.staleness == 0
    batches = iter_minibatches(clocal, cmd["batch_size"], shuffle=True, seed=seed)
    for c, mb in enumerate(batches, start=1):
        keys, loc = mb.localize()
        gk = cids[keys]
        pull_keys = np.append(gk, last) if fit_intercept else gk
        w = model.pull(pull_keys, unique=True)  # distinct ids (+ the intercept's)
        if bsp:  # every worker has read step c before any step-c update lands
            clock.tick(2 * c - 1)
        coef, b = (w[:-1], w[-1]) if fit_intercept else (w, 0.0)
        loss, grad, grad_b, ws = loss_and_grad(loc, coef, b, np.ones(coef.size), fit_intercept)
        if ws > 0:
            grad = grad / ws + l2 * coef
            step = np.append(grad, grad_b / ws) if fit_intercept else grad
            model.push(pull_keys, step, unique=True)
            loss_sum, weight_sum = loss_sum + loss, weight_sum + ws
        if clock is not None:
            clock.tick(2 * c if bsp else c)
    return loss_sum, weight_sum


def rows_job(
    ps,
    prepared: PreparedData,
    name: str,
    handlers: dict | None = None,
    *,
    dense_matrix: bool = False,
    refuse: bool = False,
) -> PSJob:
    """The barrier job of a fit whose workers read their rows with :func:`setup_rows` and
    serve `handlers` (default: `HANDLERS`); on a persisted input they save their parse, and
    a later fit on the same input reads it back instead of the rows
    (:mod:`spark_ps.ml.parse_cache`)."""
    dense = dense_matrix and prepared.features_kind == "dense"
    parse = parse_cache.plan_parse(prepared, f"rows|dense={dense}")
    setup = setup_rows(prepared, dense_matrix=dense_matrix, refuse=refuse, parse=parse)
    handlers = HANDLERS if handlers is None else handlers
    return PSJob(ps, prepared.df, prepared.num_workers, setup, handlers, name=name, parse=parse)


#: what a worker keeps of its read, and saves with a parse
_PARSED = ("rows", "num_features", "keys", "local", "vlocal", "train_top")


def setup_rows(
    prepared: PreparedData,
    dense_matrix: bool = False,
    refuse: bool = False,
    parse: parse_cache.ParsePlan | None = None,
) -> Callable:
    """The worker's read: its partition as a CSRBatch (or, for dense arrays when
    ``dense_matrix``, a DenseBatch), localized to the keys it touches. With a validation
    column (``prepared.validation_col``) its flagged rows are kept apart as ``vlocal``,
    localized to the same keys, and ``local`` holds only the training rows. With `refuse`
    a row the read refuses does not fail the task: the partition reports it in the
    ``dims`` round (:meth:`WorkerContext.refuse`) and holds no rows. With `parse`, the
    parse is saved (`parse_cache.save`), or, when the job's input is the plan's marker
    column, read back (`parse_cache.load`)."""
    features, label, weight, values = (
        prepared.features_col,
        prepared.label_col,
        prepared.weight_col,
        prepared.values_col,
    )
    dense = dense_matrix and prepared.features_kind == "dense"
    flag_col = prepared.validation_col

    def setup(batches, ctx: WorkerContext) -> None:
        t0 = time.perf_counter()
        batches = iter(batches)
        first = next(batches, None)
        if first is not None and parse_cache.is_marker(first.schema):
            rows_in = first.num_rows + parse_cache.count_rows(batches)
            ctx.state.update(parse_cache.load(parse, ctx.part, rows_in), parse_saved=True)
            ctx.state["setup_s"] = [time.perf_counter() - t0, 0.0]
            return
        batches = itertools.chain([first] if first is not None else [], batches)
        if flag_col:
            batches = list(batches)  # read twice: the rows, then their flags
        try:
            csr = read_partition(
                batches,
                features,
                label_col=label,
                weight_col=weight,
                values_col=values,
                dense_matrix=dense,  # dense arrays: a matrix, no index arrays (BLAS products)
            )
        except (ValueError, TypeError) as e:
            if not refuse:
                raise
            ctx.refuse(f"partition {ctx.part}: {e}")
            csr = CSRBatch.empty(0, labels=True, weights=weight is not None)
            ctx.state["refused"] = True
            flag_col_read = False
        else:
            flag_col_read = bool(flag_col)
        t1 = time.perf_counter()
        keys, local = csr.localize()
        ctx.state.update(rows=csr.n_rows, num_features=csr.num_features, keys=keys, local=local)
        ctx.state["train_top"] = int(keys[-1]) if keys.size else -1
        if flag_col_read:
            _split_validation(ctx.state, read_flags(batches, flag_col))
        if parse is not None and not ctx.state.get("refused"):
            parsed = {k: ctx.state[k] for k in _PARSED if k in ctx.state}
            ctx.state["parse_saved"] = parse_cache.save(parse, ctx.part, parsed, csr.n_rows)
        ctx.state["setup_s"] = [t1 - t0, time.perf_counter() - t1]

    return setup


def _split_validation(s: dict, flags: np.ndarray) -> None:
    """Keep the validation rows of ``s["local"]`` apart as ``s["vlocal"]`` (same local key
    ids), and the largest key the training rows touch as ``s["train_top"]``."""
    local = s["local"]
    s["local"] = train = local.take(np.flatnonzero(~flags))
    s["vlocal"] = local.take(np.flatnonzero(flags))
    if isinstance(train, CSRBatch):
        s["train_top"] = int(s["keys"][train.indices.max()]) if train.nnz else -1


def _dims(ctx: WorkerContext, round_: int, cmd: dict) -> None:
    """This partition's feature dimension and largest key (as exact 31-bit halves), how
    long reading and localizing took, how many keys it touches, the largest key its
    training rows touch (halves again; the same key without validation rows), and from
    `DIMS_LABELS` on what the driver needs to count classes as MLlib does (see
    `label_summary`)."""
    s = ctx.state
    top = int(s["keys"][-1]) if s["keys"].size else -1
    train_top = s.get("train_top", top)
    out = np.zeros((cmd["num_workers"], DIMS_COLUMNS))
    out[ctx.part] = [
        s["num_features"],
        top >> 31,
        top & ((1 << 31) - 1),
        *s["setup_s"],
        s["keys"].size,
        train_top >> 31,
        train_top & ((1 << 31) - 1),
        float(bool(s.get("refused"))),
        *label_summary(s["local"].labels, None if s.get("vlocal") is None else s["vlocal"].labels),
    ]
    ctx.contribute(round_, out.ravel())


def label_summary(y: np.ndarray, yv: np.ndarray | None) -> list[float]:
    """[training rows, largest training label, largest validation label (-1: none),
    negative or non-integer labels among both]: the read already refused null and NaN."""
    top = float(y.max()) if y.size else -1.0
    vtop = float(yv.max()) if yv is not None and yv.size else -1.0
    bad = sum(int(np.count_nonzero((a < 0) | (a != np.floor(a)))) for a in (y, yv) if a is not None)
    return [float(y.size), top, vtop, float(bad)]


def _keys(ctx: WorkerContext, round_: int, cmd: dict) -> None:
    """Register the keys this partition touches (their compact ids come later)."""
    keys = ctx.state["keys"]
    if keys.size:
        ctx.tensor(cmd["keyset"]).update(keys, np.ones(keys.size))
    ctx.contribute(round_, [keys.size])


def compact(ctx: WorkerContext, keyset: str | None) -> tuple[np.ndarray, object]:
    """(sorted compact ids of this partition's keys, the batch re-indexed to match); the
    validation rows, if any, re-indexed alike as ``ctx.state["cvlocal"]``.

    Without a keyset the ids are the keys themselves (small vector input)."""
    s = ctx.state
    if keyset is None:
        s["ids"], s["cvlocal"] = s["keys"], s.get("vlocal")
        return s["keys"], s["local"]
    if s.get("keyset") != keyset:
        ids = ctx.tensor(keyset).pull(s["keys"]).astype(np.int64)
        s["ids"], s["keyset"] = ids, keyset  # compact id of each local key (local order)
        if ids.size < 2 or bool(np.all(ids[1:] > ids[:-1])):  # ids in key order already
            s["cids"], s["clocal"], s["cvlocal"] = ids, s["local"], s.get("vlocal")
            return ids, s["local"]
        order = np.argsort(ids, kind="stable")
        rank = np.empty(order.size, dtype=id_dtype(order.size))  # as `localize` numbers them
        rank[order] = np.arange(order.size)
        s["cids"] = ids[order]
        s["clocal"] = _reindexed(s["local"], rank)
        s["cvlocal"] = None if s.get("vlocal") is None else _reindexed(s["vlocal"], rank)
    return s["cids"], s["clocal"]


def _reindexed(local, rank: np.ndarray):
    """A localized CSR batch whose local key ``i`` becomes ``rank[i]``."""
    return type(local)(
        local.indptr, rank[local.indices], local.values, rank.size, local.labels, local.weights
    )


def _stats(ctx: WorkerContext, round_: int, cmd: dict) -> None:
    """Per-key sums (count, s1, s2, and with ``label_sums`` the labels' ``sum w*y*x``) and
    extremes (max x, max -x) of this partition, as one row per key of two PS matrices (two
    pushes, whatever the number of statistics)."""
    compact(ctx, cmd["keyset"])
    # the key-ordered batch keeps each row's keys sorted: no per-row sort needed
    with_labels = bool(cmd.get("label_sums"))  # the gradient at the start (see _Fit.stats)
    p = feature_stats([ctx.state["local"]], with_labels=with_labels)
    gk = ctx.state["ids"][p.keys]
    columns = [p.count.astype(np.float64), p.s1, p.s2]
    sums = np.column_stack(columns + [p.label_sum] if with_labels else columns)
    ctx.tensor(cmd["sums"]).aggregate(gk, sums, round=round_, part=ctx.part, unique=True)
    extremes = np.column_stack([p.vmax, -p.vmin])
    ctx.tensor(cmd["extremes"]).aggregate(gk, extremes, round=round_, part=ctx.part, unique=True)
    y = ctx.state["local"].labels
    n_neg = int(np.count_nonzero((y < 0) | (y != np.floor(y))))  # MLlib's label checks, folded
    n_multi = int(np.count_nonzero(y > 1)) - int(np.count_nonzero((y > 1) & (y != np.floor(y))))
    out = [p.n_rows, p.weight_sum, p.weight_sq_sum, *p.label_weight, p.n_bad_labels, n_neg, n_multi]
    k = cmd.get("num_classes")
    if k:  # multinomial: the weight of each class, and the rows labelled k or above
        valid = (y >= 0) & (y < k) & (y == np.floor(y))
        w = ctx.state["local"].weights
        hist = class_weights(y[valid], None if w is None else w[valid], k)
        out += [int(np.count_nonzero(~valid)), *hist]
    ctx.contribute(round_, out)


def _grad(ctx: WorkerContext, round_: int, cmd: dict) -> None:
    """Loss and gradient of this partition at x; the gradient goes to g exactly once."""
    keys, local = compact(ctx, cmd["keyset"])
    fit_intercept, dim = cmd["fit_intercept"], cmd["dim"]
    if ctx.state.get("inv_std_name") != cmd["inv_std"]:
        ctx.state["inv_std"] = ctx.tensor(cmd["inv_std"]).pull(keys)
        ctx.state["inv_std_name"] = cmd["inv_std"]
    t0 = time.perf_counter()
    coef = ctx.tensor(cmd["x"]).pull(keys, unique=True)
    t1 = time.perf_counter()
    loss, grad, grad_b, wsum = loss_and_grad(
        local, coef, cmd["offset"], ctx.state["inv_std"], fit_intercept
    )
    t2 = time.perf_counter()
    g = ctx.tensor(cmd["g"])
    if fit_intercept:
        keys, grad = np.append(keys, dim - 1), np.append(grad, grad_b)
    g.aggregate(keys, grad, round=round_, part=ctx.part, unique=True)
    out = [loss, wsum, grad_b, t1 - t0, t2 - t1, time.perf_counter() - t2]
    if cmd.get("validation"):  # the validation rows' score histograms at the same x
        out = np.concatenate([out, _validation_histograms(ctx.state, coef, cmd)])
    ctx.contribute(round_, out)


def _validation_histograms(s: dict, coef: np.ndarray, cmd: dict) -> np.ndarray:
    """[2 * NUM_BINS]: the validation rows' weighted P(y=1) histograms (positives, then
    negatives; see `score_histograms`) at the pulled coefficients `coef`, their margins in
    the training margins' standardized space; zeros on a partition without such rows."""
    val = s["cvlocal"]
    margin = margins(val, coef, cmd["offset"], s["inv_std"], cmd["fit_intercept"])
    w = np.ones(val.n_rows) if val.weights is None else val.weights
    return score_histograms(margin, val.labels, w)


def _softmax_grad(ctx: WorkerContext, round_: int, cmd: dict) -> None:
    """Multinomial loss and gradient of this partition at x ([rows, K] on the PS): one pull
    of this partition's feature rows; the [keys + intercept row, K] gradient goes to g."""
    keys, local = compact(ctx, cmd["keyset"])
    fit_intercept, dim = cmd["fit_intercept"], cmd["dim"]
    if ctx.state.get("inv_std_name") != cmd["inv_std"]:
        inv_std = ctx.tensor(cmd["inv_std"]).pull(keys)
        ctx.state["inv_std"] = inv_std[:, 0] if inv_std.ndim == 2 else inv_std
        ctx.state["inv_std_name"] = cmd["inv_std"]
    t0 = time.perf_counter()
    K = len(cmd["offsets"])
    coef = ctx.tensor(cmd["x"]).pull(keys, unique=True).reshape(-1, K)
    t1 = time.perf_counter()
    loss, grad, grad_b, wsum = softmax_loss_and_grad(
        local, coef, np.asarray(cmd["offsets"]), ctx.state["inv_std"], fit_intercept
    )
    t2 = time.perf_counter()
    g = ctx.tensor(cmd["g"])
    if fit_intercept:
        keys, grad = np.append(keys, dim - 1), np.vstack([grad, grad_b])
    g.aggregate(keys, grad, round=round_, part=ctx.part, unique=True)
    ctx.contribute(round_, [loss, wsum, t1 - t0, t2 - t1, time.perf_counter() - t2, *grad_b])


HANDLERS = {
    "dims": _dims,
    "keys": _keys,
    "stats": _stats,
    "grad": _grad,
    "softmax_grad": _softmax_grad,
    "epoch": _epoch,
}
