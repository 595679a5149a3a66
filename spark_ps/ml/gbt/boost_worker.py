"""The workers' boosting loop: every worker grows the whole ensemble, the driver only reads.

One ``boost`` command starts it. Per tree, every worker

1. computes its rows' pseudo-residuals and all-gathers (``rendezvous.gather`` on shard 0)
   their bounds together with its weighted losses of the trees so far — one step that both
   fixes the tree's fixed-point scale and reports the previous tree's losses (and decides
   early stopping, the same way on every worker); a classifier with a validation split
   adds its validation rows' score histograms, which give the validation AUC. Where the
   loss bounds its targets itself (``Loss.target_bounds``) and neither validation nor GOSS
   needs the gathered values before the tree, the gather rides on the root's split call;
2. per layer, builds the fixed-point histograms of the smaller child of each split and sends
   each shard its features' share in ONE blocking call (``gbt_layer.splits``): the shard
   keeps it as the exactly-once contribution of (tree, layer, partition) and answers with
   the best splits once every partition's share is in;
3. applies the splits to its own :class:`TreeBuilder` (all workers see the same answers, so
   they build the same tree), routes its rows, and goes on.

Partition 0 posts each finished tree with its losses on the round board
(``<topic>/tree/<m>``, from a background thread); the driver reads them for the model, the
progress line and the resume state. A retried task rebuilds its predictions from the trees
in that state and replays the rest: a step the shards already answered is answered again
from their cache.
"""

from __future__ import annotations

import functools
import time
from collections import defaultdict
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager

import numpy as np

from ps_server.functions.gbt import merge_best
from ps_server.functions.gbt_layer import decode_splits
from ps_server.keys import range_bounds
from spark_ps.ml._job import WorkerContext
from spark_ps.ml.binned_metrics import NUM_BINS, binned_auc
from spark_ps.ml.tree import goss, kernels
from spark_ps.ml.tree.binning import row_uniform
from spark_ps.ml.tree.histogram import (
    FixedPointScale,
    build_node_histograms,
    quantize_rows,
    unit_weight,
)
from spark_ps.ml.tree.local import TreeBuilder, features_per_node, route_rows, tree_scale
from spark_ps.ml.tree.loss import LogLoss

__all__ = [
    "boost",
    "compute_targets",
    "early_stop",
    "goss_sample",
    "targets_and_losses",
    "CELLS_PER_SHARD",
    "layer_shards",
    "route",
    "start_tree",
    "tree_topic",
]

CELLS_PER_SHARD = 4096  # (feature, bin) cells of split search worth one more shard call
_WAIT = 10.0  # seconds a shard holds a rendezvous call before answering "pending"


def tree_topic(topic: str, m: int) -> str:
    """Board topic on which partition 0 posts finished tree `m`."""
    return f"{topic}/tree/{m}"


def early_stop(val_losses: list[float], tol: float) -> tuple[bool, int]:
    """MLlib's validation rule replayed over the losses so far: (stop now?, best #trees).

    Stop when the error improves by less than ``tol * max(error, 0.01)`` on the best one.
    """
    best_err, best_m = 0.0, 1
    for m, err in enumerate(val_losses):  # loop over trees (a few hundred at most)
        if m == 0:
            best_err = err
        elif best_err - err < tol * max(err, 0.01):
            return True, best_m
        elif err < best_err:
            best_err, best_m = err, m + 1
    return False, best_m


def compute_targets(s: dict, tree: int) -> np.ndarray:
    """Pseudo-residuals of tree `tree` (the labels for tree 0, as MLlib does)."""
    t = s["labels"] if tree == 0 else -s["loss"].gradient(s["pred"], s["labels"])
    s["targets"] = t
    return t


def start_tree(
    s: dict, scale, seed: int, rate: float, sample: goss.GossSample | None = None
) -> None:
    """Quantize this tree's row statistics and put every row in the root; `sample`: the
    rows and weights GOSS drew (instead of subsampling at `rate`)."""
    n = s["y"].size
    scale = FixedPointScale(*scale)
    w = s["w"] if sample is None else sample.weights
    s["row_stats"] = quantize_rows(s["targets"], w, scale)
    s["unit"] = unit_weight(w, scale)
    if sample is not None:
        s["in_sample"] = sample.in_sample
    else:
        s["in_sample"] = row_uniform(s["ids"], seed) < rate if rate < 1.0 else np.ones(n, bool)
    s["node"] = np.zeros(n, dtype=np.int32)
    s["vnode"] = np.zeros(s["yv"].size, dtype=np.int32)


def route(s: dict, routing) -> None:
    """Move the training and validation rows one layer down (``TreeBuilder.routing()``)."""
    arrays = [np.asarray(a, dtype=np.int32) for a in routing[:4]]
    now = np.asarray(routing[4], dtype=bool)
    s["node"] = route_rows(s["bins"], s["node"], *arrays, now)
    if s["vbins"] is not None:
        s["vnode"] = route_rows(s["vbins"], s["vnode"], *arrays, now)


@contextmanager
def _timed(s: dict, phase: str):
    """Add this block's wall seconds to the worker's per-phase profile."""
    t0 = time.perf_counter()
    try:
        yield
    finally:
        s["_prof"][phase] += time.perf_counter() - t0


def _gather(
    ctx: WorkerContext, cmd: dict, m: int, values: list[float], what: str = "start"
) -> np.ndarray:
    """Every partition's `values` for tree `m`'s start (`what`: ``"goss"`` for its GOSS
    counts), stacked in partition order."""
    args = {"topic": f"{cmd['topic']}/{what}", "step": m, "n_parts": cmd["n_parts"]}
    args["wait"] = _WAIT
    with _timed(ctx.state, "gather"):
        (out,) = ctx.rendezvous("rendezvous.gather", args, [[np.asarray(values)]], shards=[0])
    ctx.state["_prof"]["gathers"] += 1  # rounds of their own (the profile counts them)
    return out[0]


def layer_shards(
    n_features: int, n_bins: int, num_shards: int, cells_per_shard: int | None = None
) -> int:
    """How many shards find a layer's splits: one per `cells_per_shard` (feature, bin) cells
    (default :data:`CELLS_PER_SHARD`), at most `num_shards`.

    Why not always all: every shard adds a call per worker and layer (~1.5 ms on loopback)
    and the slowest answer gates the layer, while a shard's split search over 24 features x 32
    bins takes ~1 ms. Measured on nycflights (24 features, 100 trees x depth 6): 2 shards
    6.8 s of split calls per worker, 1 shard 4.7 s. Wide data still spreads over every shard.
    """
    per = int(cells_per_shard or CELLS_PER_SHARD)
    return max(1, min(int(num_shards), -(-int(n_features) * int(n_bins) // per)))


def goss_sample(ctx: WorkerContext, cmd: dict, m: int, bound: float) -> goss.GossSample:
    """Tree `m`'s GOSS rows of this partition: its counts of ``|w t|`` (bins on ``[0,
    bound]``) summed with every other partition's in one gather, then the same draw as
    every worker makes (:mod:`spark_ps.ml.tree.goss`)."""
    s, p = ctx.state, cmd["params"]
    with _timed(s, "goss"):
        rows = goss.bins_of(s["targets"], s["w"], bound)
        part_counts = goss.counts(rows)
    total = _gather(ctx, cmd, m, part_counts, what="goss").sum(axis=0)
    with _timed(s, "goss"):
        top, other = p["gossTopRate"], p["gossOtherRate"]
        return goss.draw(rows, total, s["w"], s["ids"], top, other, p["seed"] + m)


def _losses(s: dict) -> list[float]:
    """Weighted loss sums and weights of the current predictions (train, validation)."""
    err = float(np.dot(s["loss"].error(s["pred"], s["labels"]), s["w"]))
    out = [err, float(s["w"].sum()), 0.0, 0.0]
    if s["vbins"] is not None:
        verr = float(np.dot(s["loss"].error(s["vpred"], s["vlabels"]), s["wv"]))
        out[2:] = [verr, float(s["wv"].sum())]
    return out


def validation_histograms(s: dict) -> np.ndarray:
    """The validation rows' weighted histograms of P(y=1) (``NUM_BINS`` equal bins on [0, 1],
    positives then negatives): summed over partitions, they give the validation AUC
    (:func:`~spark_ps.ml.binned_metrics.binned_auc`). Empty on a partition without such rows."""
    with np.errstate(over="ignore"):  # P(y=1) as the model's probability column has it
        p1 = 1.0 - 1.0 / (1.0 + np.exp(2.0 * s["vpred"]))
    bins = (p1 * NUM_BINS).astype(np.int64)
    np.minimum(bins, NUM_BINS - 1, out=bins)
    bins[s["vlabels"] < 0] += NUM_BINS  # negatives in the second half
    return np.bincount(bins, weights=s["wv"], minlength=2 * NUM_BINS).astype(np.float64)


def targets_and_losses(s: dict, tree: int) -> tuple[float, float, list[float]]:
    """Tree `tree`'s targets (:func:`compute_targets`), their min and max, and the losses
    of the trees so far (:func:`_losses`); LogLoss in one compiled pass when it can."""
    if tree > 0 and s["loss"] is LogLoss and kernels.HAVE_JIT:
        s["targets"], lo, hi, err = kernels.logistic_pass(s["pred"], s["labels"], s["w"])
        losses = [err, float(s["w"].sum()), 0.0, 0.0]
        if s["vbins"] is not None:
            verr = kernels.logistic_pass(s["vpred"], s["vlabels"], s["wv"])[3]
            losses[2:] = [verr, float(s["wv"].sum())]
        return lo, hi, losses
    t = compute_targets(s, tree)
    lo, hi = (float(t.min()), float(t.max())) if t.size else (np.inf, -np.inf)
    return lo, hi, _losses(s)


def _layer_splits(ctx, cmd, step: int, hist: np.ndarray, builder: TreeBuilder, plan, kw, gather):
    """Send every shard its features' histograms; the merged best split per open node, and
    with `gather` (this partition's row) every partition's row, as :func:`_gather` gives
    them: the first shard answers both in one call."""
    n_shards = layer_shards(
        hist.shape[1], hist.shape[2], ctx.client.num_shards, cmd.get("cells_per_shard")
    )
    bounds = range_bounds(hist.shape[1], n_shards)
    shards = [i for i in range(bounds.size - 1) if bounds[i + 1] > bounds[i]]
    ctx.state["_prof"]["shards"] = len(shards)  # the profile says how many shards answered
    args = {"topic": f"{cmd['topic']}/layer", "step": step, "n_parts": cmd["n_parts"]}
    args.update(wait=_WAIT, n_slots=hist.shape[0], n_bins=hist.shape[2], split_kw=kw)
    if plan is not None:
        args.update(
            parent_slots=plan.parent_slots.tolist(),
            small_is_left=plan.small_is_left.tolist(),
            pick=plan.pick.tolist(),
            pick_left=plan.pick_left.tolist(),
        )
    mask = builder.feature_mask()
    if mask is not None:
        args["feature_mask"] = mask.astype(int).tolist()
    parts = [
        [np.ascontiguousarray(hist[:, bounds[i] : bounds[i + 1]]), np.array([bounds[i]])]
        for i in shards
    ]
    if gather is not None:
        parts[0].append(np.asarray(gather, dtype=np.float64))
    with _timed(ctx.state, "splits"):
        out = ctx.rendezvous("gbt_layer.splits", args, parts, shards)
    splits = merge_best([decode_splits(arrays[0]) for arrays in out])
    return splits, (out[0][1] if gather is not None else None)


def grow_tree(
    ctx: WorkerContext,
    cmd: dict,
    m: int,
    scale,
    before_wait: Callable | None = None,
    sample: goss.GossSample | None = None,
    gather: np.ndarray | None = None,
    on_gathered: Callable[[np.ndarray], None] | None = None,
) -> TreeBuilder:
    """Grow tree `m` layer by layer with the shards; rows end in the builder's leaves.
    `before_wait()` runs once a layer's histograms are built, before waiting for its
    splits; `sample`: the rows GOSS drew (:func:`goss_sample`); `gather`: this partition's
    row of a gather that rides on the root's call, whose answer (every partition's row)
    goes to `on_gathered` as soon as the root's splits are in."""
    s, p = ctx.state, cmd["params"]
    builder = TreeBuilder(
        cmd["thresholds"],
        scale,
        max_depth=p["maxDepth"],
        min_instances_per_node=p["minInstancesPerNode"],
        min_info_gain=p["minInfoGain"],
        min_weight_per_node=cmd["min_w"],
        features_per_node=features_per_node(p["featureSubsetStrategy"], cmd["n_features"]),
        seed=p["seed"] + m,
    )
    kw = dict(builder.split_kw, scale=list(scale))
    with _timed(s, "quantize"):
        start_tree(s, scale, p["seed"] + m, p["subsamplingRate"], sample)
    layer = 0
    while not builder.done:
        plan = builder.histogram_plan()
        if layer:
            with _timed(s, "route"):
                route(s, builder.routing())
        with _timed(s, "histograms"):
            n_slots = 1 if plan is None else plan.n_slots
            slot_of_node = np.zeros(1, np.int32) if plan is None else plan.slot_of_node
            hist = build_node_histograms(
                s["bins"],
                s["node"],
                slot_of_node,
                s["in_sample"],
                s["row_stats"],
                n_slots,
                cmd["n_bins"],
                unit_weight=s["unit"],
            )
        ctx.fault_point("hist")  # tests kill a task here: its histograms may be in or not
        step = m * (p["maxDepth"] + 1) + layer
        if before_wait is not None:
            before_wait()
        splits, gathered = _layer_splits(ctx, cmd, step, hist, builder, plan, kw, gather)
        builder.apply(splits)
        if gathered is not None and on_gathered is not None:
            on_gathered(gathered)
        layer, gather = layer + 1, None
    return builder


def _post_tree(client, topic: str, m: int, builder, tw: float, sums, has_val: bool, last, prof):
    """Tell the driver about finished tree `m` and its losses (see :class:`_TreePoster`)."""
    payload = {
        "tree": builder.finish().to_dict(),
        "weight": tw,
        "train_loss": sums[0] / sums[1],
        "validation_loss": sums[2] / sums[3] if has_val else None,
        "validation_auc": (
            binned_auc(sums[4 : 4 + NUM_BINS], sums[4 + NUM_BINS :]) if sums.size > 4 else None
        ),
        "last": last,
        "worker_seconds": prof,
    }
    client.post(tree_topic(topic, m), 1, payload)


class _TreePoster:
    """Partition 0 posts the finished trees from one background thread.

    A tree is handed over with its losses (at the next tree's gather, or with its root's
    splits when the gather rides on them), and sent once partition 0 next waits for a
    layer's splits (:meth:`send`): its JSON encoding
    then holds the GIL while the main thread blocks on a socket. Sent at once, it made the
    next tree's quantize wait for the GIL (3.2 against 1.1 ms a tree on 100k rows,
    measured), and every worker waited for partition 0 at the root. A post that failed
    raises at the next post or at :meth:`close`."""

    def __init__(self, ctx: WorkerContext, cmd: dict) -> None:
        self._ctx, self._topic = ctx, cmd["topic"]
        self._validation = _has_validation(ctx.state, cmd)
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="spark-ps-tree-post")
        self._posts: list[Future] = []
        self._pending: tuple | None = None

    def post(self, m: int, builder: TreeBuilder, tw: float, sums, last: bool) -> None:
        """Hand over tree `m`; it goes out at the next :meth:`send` (or :meth:`close`).
        One still held (handed over at a root's splits, at maxDepth 0 no later layer waited)
        goes now rather than being replaced."""
        self.send()
        while self._posts and self._posts[0].done():
            self._posts.pop(0).result()  # raises a failed post's error
        s = self._ctx.state
        s["_prof"]["trees"] = m + 1
        args = (self._topic, m, builder, tw, sums, self._validation, last)
        self._pending = (*args, dict(s["_prof"]))

    def send(self) -> None:
        """Start posting the tree handed over, if any."""
        if self._pending is not None:
            args, self._pending = self._pending, None
            self._posts.append(self._pool.submit(_post_tree, self._ctx.client, *args))

    def close(self, wait: bool = True) -> None:
        """Send and wait for every post (raising a failed one's error); without `wait`,
        drop them."""
        try:
            if wait:
                self.send()
            for job in self._posts if wait else ():
                job.result()
        finally:
            self._pool.shutdown(wait=wait, cancel_futures=not wait)


def _tree_done(ctx, cmd, m: int, built, g: np.ndarray, *, poster: _TreePoster | None) -> bool:
    """Tree `m - 1` is in every prediction: record its losses, post it, decide on stopping
    (every worker sees the same gathered sums, so every worker decides the same)."""
    s, p = ctx.state, cmd["params"]
    sums = g[:, 2:].sum(axis=0)  # partition order: the same on every worker
    has_val = _has_validation(s, cmd)
    if has_val:
        s["val_losses"].append(sums[2] / sums[3])
    last = m >= p["maxIter"] or (has_val and early_stop(s["val_losses"], p["validationTol"])[0])
    if poster is not None:
        poster.post(m - 1, *built, sums, last)
    return last


def _has_validation(s: dict, cmd: dict) -> bool:
    """Does the fit hold validation rows (on any partition: every worker must decide alike)?"""
    return bool(cmd.get("validation", s["vbins"] is not None))


def _finish_tree(s: dict, builder: TreeBuilder, tw: float) -> None:
    """Rows to their leaves; predictions += tree weight * leaf value."""
    route(s, builder.routing())
    values = builder.node_values()
    if kernels.HAVE_JIT:  # in place (routing left every row in one of the tree's nodes)
        kernels.add_leaf_values(s["pred"], s["node"], values, tw)
        if s["vbins"] is not None:
            kernels.add_leaf_values(s["vpred"], s["vnode"], values, tw)
        return
    s["pred"] = s["pred"] + values[s["node"]] * tw
    if s["vbins"] is not None:
        s["vpred"] = s["vpred"] + values[s["vnode"]] * tw


def boost(ctx: WorkerContext, round_: int, cmd: dict) -> None:
    """The ``boost`` command: grow trees until maxIter or early stopping (see module doc)."""
    s, p = ctx.state, cmd["params"]
    s.setdefault("_prof", defaultdict(float))
    if s["n_trees"] >= p["maxIter"] or early_stop(s["val_losses"], p["validationTol"])[0]:
        return  # a retried task of a fit that has already ended
    poster = _TreePoster(ctx, cmd) if ctx.part == 0 else None
    try:
        _boost_trees(ctx, cmd, poster)
    except BaseException:
        if poster is not None:
            poster.close(wait=False)
        raise
    if poster is not None:
        poster.close()


def _boost_trees(ctx: WorkerContext, cmd: dict, poster: _TreePoster | None) -> None:
    s, p = ctx.state, cmd["params"]
    m, built = s["n_trees"], None
    while True:
        with _timed(s, "targets"):
            lo, hi, losses = targets_and_losses(s, m)
        values = [-lo, hi, *losses]
        if cmd.get("validation_auc") and m > 0:  # the same length on every partition
            values = np.concatenate([values, validation_histograms(s)])
        goss_on = goss.active(p.get("gossTopRate", 0.0), p["stepSize"], m)
        # with known target bounds, no validation (its losses decide on stopping before
        # the tree) and no GOSS (it bins the targets on their max), the gather rides on
        # the root's split call
        ride = (
            m < p["maxIter"]
            and not goss_on
            and not _has_validation(s, cmd)
            and s["loss"].target_bounds(m) is not None
        )
        if not ride:
            g = _gather(ctx, cmd, m, values)
            if built is not None and _tree_done(ctx, cmd, m, built, g, poster=poster):
                return
            lo, hi = -float(g[:, 0].max()), float(g[:, 1].max())
        max_w, sample = cmd["max_w"], None
        if goss_on:
            sample = goss_sample(ctx, cmd, m, max_w * max(-lo, hi))
            max_w *= goss.weight_bound(p["gossTopRate"], p["gossOtherRate"])
        scale = tree_scale(s["loss"], m, lo, hi, max_w, cmd["n_rows"])
        post = poster.send if poster is not None else None
        done = None
        if ride and built is not None:  # tree m - 1's losses come with the root's splits;
            # never the last tree (m < maxIter): posted at once, sent at the next layer's wait
            done = functools.partial(_tree_done, ctx, cmd, m, built, poster=poster)
        builder = grow_tree(ctx, cmd, m, scale, post, sample, values if ride else None, done)
        tw = 1.0 if m == 0 else p["stepSize"]
        with _timed(s, "finish"):
            _finish_tree(s, builder, tw)
        built, m = (builder, tw), m + 1
        s["n_trees"] = m
