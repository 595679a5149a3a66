"""The GBT workers' rounds: what each Spark task does when the driver calls ``meta``,
``sketch`` or ``recover``, and the binning that starts ``boost`` (whose loop is
:mod:`spark_ps.ml.gbt.boost_worker`).

Kept apart from the driver's trainer (:mod:`spark_ps.ml.gbt.distributed`) so a worker's
import chain holds no ``pyspark.ml``: a fresh Python worker paid ~1 s importing it (and
pandas through ``pyspark.ml.functions``) on every cold fit, for code it never runs.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from ps_server.keys import mix64
from spark_ps.data import VALIDATION_FLAG, read_flags, read_partition
from spark_ps.ml import parse_cache, threads
from spark_ps.ml._job import WorkerContext, _latest
from spark_ps.ml.gbt.boost_worker import boost, tree_topic
from spark_ps.ml.tree import kernels
from spark_ps.ml.tree.binning import bin_matrix, row_uniform, summarize
from spark_ps.ml.tree.kernels import warm_up
from spark_ps.ml.tree.loss import get_loss, remap_labels
from spark_ps.ml.tree.tree import TreeArrays

if TYPE_CHECKING:  # a driver-side type: importing it pulls in pyspark.ml
    from spark_ps.ml.base import PreparedData

VAL = VALIDATION_FLAG  # the column flagging validation rows in the job's input
_KEY_MASK = np.uint64((1 << 63) - 1)


def _row_ids(X: np.ndarray, y: np.ndarray, w: np.ndarray) -> np.ndarray:
    """A partition-independent id per row: a hash of its content."""
    if kernels.HAVE_JIT:
        return kernels.row_ids_pass(X, y, w)
    h = mix64(np.ascontiguousarray(y).view(np.int64))
    for col in (*X.T, w):
        h = mix64((h ^ np.ascontiguousarray(col).view(np.uint64)).view(np.int64))
    return h.view(np.int64)


#: what a worker keeps of its read, and saves with a parse
_PARSED = ("rows", "num_features", "X", "y", "w", "Xv", "yv", "wv", "ids")


def setup_rows(prepared: PreparedData, parse: parse_cache.ParsePlan | None = None) -> Callable:
    """The job's set-up: each task reads its rows into dense numpy arrays. With `parse` it
    saves them (:mod:`spark_ps.ml.parse_cache`), or reads them back when the job's input is
    the plan's marker column."""
    features, label, weight = prepared.features_col, prepared.label_col, prepared.weight_col
    submitted = time.time()
    # _dense_rows hands vectors over packed (or as array<double>): read them into a matrix
    dense = {"dense_matrix": True} if prepared.features_kind in ("vector", "dense") else {}

    def setup(batches, ctx: WorkerContext) -> None:
        prof = ctx.state["_prof"] = defaultdict(float)
        prof["launch"] = time.time() - submitted  # job submitted -> this task reads its rows
        prof["threads"] = threads.count()  # the task's CPUs: every pass uses them
        warm_up()  # loads the compiled tree kernels while the JVM sends the rows
        t0 = time.perf_counter()
        batches = list(batches)
        t1 = time.perf_counter()
        if batches and parse_cache.is_marker(batches[0].schema):
            rows_in = parse_cache.count_rows(batches)
            ctx.state.update(parse_cache.load(parse, ctx.part, rows_in), parse_saved=True)
            prof["arrow"] = time.perf_counter() - t0
            return
        try:
            csr = read_partition(batches, features, label_col=label, weight_col=weight, **dense)
        except (ValueError, TypeError) as e:  # reported at `meta`: the driver names the rows
            ctx.state.update(refused=f"partition {ctx.part}: {e}", rows=0, num_features=0)
            ctx.state.update({k: np.zeros(0) for k in ("y", "w", "yv", "wv")})
            return
        t2 = time.perf_counter()
        flags = read_flags(batches, VAL)
        if dense:  # packed or array<double> rows: one matrix, no index arrays
            X = csr.matrix
        else:
            X = csr.to_dense() if csr.n_rows else np.zeros((0, csr.num_features))
        w = csr.weights if csr.weights is not None else np.ones(csr.n_rows)
        y = csr.labels if csr.labels is not None else np.zeros(0)
        val = flags.astype(bool)
        tr = slice(None) if not val.any() else ~val  # no copies without validation rows
        ctx.state.update(
            rows=csr.n_rows,
            X=X[tr],
            y=y[tr],
            w=w[tr],
            Xv=X[val],
            yv=y[val],
            wv=w[val],
            num_features=csr.num_features,
        )
        ctx.state["ids"] = _row_ids(ctx.state["X"], ctx.state["y"], ctx.state["w"])
        if parse is not None:
            parsed = {k: ctx.state[k] for k in _PARSED}
            ctx.state["parse_saved"] = parse_cache.save(parse, ctx.part, parsed, csr.n_rows)
        prof["arrow"], prof["csr"] = t1 - t0, t2 - t1
        prof["dense"] = time.perf_counter() - t2

    return setup


def _per_part(ctx: WorkerContext, round_: int, n_workers: int, values: list[float]) -> None:
    """Contribute `values` in this partition's own block (so the driver can take max/min)."""
    out = np.zeros((n_workers, len(values)))
    out[ctx.part] = values
    ctx.contribute(round_, out.ravel())


def _refusal(ctx: WorkerContext, classification: bool) -> str:
    """Why this partition's rows cannot train ('' if they can): what reading refused, or
    (``remap_labels``'s check) a classification label outside {0, 1}."""
    s = ctx.state
    if s.get("refused"):
        return s["refused"]
    try:
        for labels in (s["y"], s["yv"]) if classification else ():
            remap_labels(labels)
    except ValueError as e:
        return f"partition {ctx.part}: {e}"
    return ""


def _meta(ctx: WorkerContext, round_: int, cmd: dict) -> None:
    """Row counts, max weight, features, and whether the rows were refused (then the
    reason is posted on ``<topic>/refused/<part>`` for the driver)."""
    s = ctx.state
    max_w = float(s["w"].max()) if s["w"].size else 0.0
    refused = _refusal(ctx, cmd["classification"])
    if refused:
        ctx.refuse(refused)
    values = [s["y"].size, s["yv"].size, max_w, s["num_features"], float(bool(refused))]
    _per_part(ctx, round_, cmd["n_workers"], values)


def _weight_sum(s: dict, weight_exp: int) -> list[int]:
    """This partition's fixed-point weight total in two 31-bit halves (exact as float64):
    summed over partitions they give the driver the exact total weight."""
    q = int(np.rint(np.ldexp(s["w"], weight_exp)).astype(np.int64).sum())
    return [q >> 31, q & ((1 << 31) - 1)]


def _sketch(ctx: WorkerContext, round_: int, cmd: dict) -> None:
    """Push this partition's exact value summary; equal (feature, value) keys add up. The
    counts are this partition's exactly-once contribution to the round: a task that pushed
    and died, and its relaunch (or a task of an aborted launch still running), count once.
    With ``rows`` in the command, contribute the sampled rows themselves instead. Either
    way the round's scalars are [values or rows pushed, fixed-point weight total (two
    halves)]."""
    s = ctx.state
    if "rows" in cmd:
        _sketch_rows(ctx, round_, cmd)
        return
    sk = summarize(
        s["X"],
        s["w"],
        weight_exp=cmd["weight_exp"],
        row_ids=s["ids"],
        fraction=cmd["fraction"],
        seed=cmd["seed"],
    )
    feat = np.repeat(np.arange(sk.num_features), np.diff(sk.indptr))
    keys = _sketch_keys(feat, sk.values)
    if keys.size:
        counts = np.stack([sk.weights, sk.counts], axis=1)
        ctx.tensor(cmd["counts"]).aggregate(keys, counts, round=round_, part=ctx.part)
        ctx.tensor(cmd["values"]).update(
            keys, np.stack([feat.astype(np.float64), sk.values], axis=1)
        )
    ctx.contribute(round_, [keys.size, *_weight_sum(s, cmd["weight_exp"])])


def _sketch_rows(ctx: WorkerContext, round_: int, cmd: dict) -> None:
    """This partition's sampled rows as ``[weight, features...]``, its exactly-once
    contribution under keys of its own (row ids hash the content, so equal rows share one;
    they must not add up): partition << 40 | position."""
    s = ctx.state
    X, n = s["X"], s["X"].shape[0]
    keep = np.ones(n, dtype=bool)
    if cmd["fraction"] < 1.0:
        keep = row_uniform(s["ids"], cmd["seed"]) < cmd["fraction"]
    at = np.flatnonzero(keep)
    if at.size:
        ctx.tensor(cmd["rows"]).aggregate(
            (ctx.part << 40) | at, np.c_[s["w"][at], X[at]], round=round_, part=ctx.part,
            unique=True,
        )  # fmt: skip
    ctx.contribute(round_, [at.size, *_weight_sum(s, cmd["weight_exp"])])


def _sketch_keys(feat: np.ndarray, values: np.ndarray) -> np.ndarray:
    bits = np.ascontiguousarray(values, dtype=np.float64).view(np.int64)
    h = mix64(mix64(feat.astype(np.int64)).view(np.int64) ^ bits)
    return (h & _KEY_MASK).astype(np.int64)


def _apply_bins(s: dict, thresholds: list, loss_type: str) -> None:
    thresholds = [np.asarray(t, dtype=np.float64) for t in thresholds]
    # C order: the compiled histogram and routing passes read a row's bins together
    s["bins"] = bin_matrix(s["X"], thresholds, order="C")
    s["vbins"] = bin_matrix(s["Xv"], thresholds, order="C") if s["Xv"].size else None
    s["pred"], s["vpred"] = np.zeros(s["y"].size), np.zeros(s["yv"].size)
    loss = get_loss(loss_type)
    s["loss"] = loss
    s["labels"] = remap_labels(s["y"]) if loss.is_classification else s["y"]
    s["vlabels"] = remap_labels(s["yv"]) if loss.is_classification else s["yv"]
    s["n_trees"], s["val_losses"] = 0, []


def _boost(ctx: WorkerContext, round_: int, cmd: dict) -> None:
    """Bin the rows by the command's thresholds (unless a retried task's ``recover`` did),
    then boost: binning needs no round of its own, the driver having the total weight
    from the sketch round."""
    s = ctx.state
    if "bins" not in s:
        t0 = time.perf_counter()
        _apply_bins(s, cmd["thresholds"], cmd["params"]["lossType"])
        s.setdefault("_prof", defaultdict(float))["bin"] += time.perf_counter() - t0
    boost(ctx, round_, cmd)


def _recover(ctx: WorkerContext, state: dict) -> None:
    """A retried task rebuilds what earlier rounds left in memory from the posted state:
    bins and the predictions of the trees the driver has read (the boost loop replays the
    rest, the shards answering from their cache)."""
    s = ctx.state
    if "thresholds" not in state:
        return
    _apply_bins(s, state["thresholds"], state["loss"])
    trees = state.get("trees")
    if trees is None:  # posted by reference (see posted): read each from its board topic
        board = [
            _latest(ctx.client, tree_topic(state["tree_topic"], i)) for i in range(state["n_trees"])
        ]
        trees = [msg["tree"] for msg in board]
    for tree, tw in zip(trees, state["weights"], strict=True):
        t = TreeArrays.from_dict(tree)
        s["pred"] = s["pred"] + t.predict(s["X"]) * tw
        if s["yv"].size:
            s["vpred"] = s["vpred"] + t.predict(s["Xv"]) * tw
    s["n_trees"] = len(trees)
    s["val_losses"] = list(state["validation_loss"])


HANDLERS = {
    "recover": _recover,
    "meta": _meta,
    "sketch": _sketch,
    "boost": _boost,
}
