"""Histogram GBDT on the PS (Angel style): one barrier job, splits found on the shards.

Workers hold their rows binned, with each row's current prediction and tree node.
Per tree the driver grows a `TreeBuilder` layer by layer:

  ``targets``  workers compute the pseudo-residuals, report their min/max (for the
               fixed-point scale every worker then shares);
  ``hist``     workers move their rows one layer down, build fixed-point histograms of
               the smaller child of each split and push them (features are the keys, so
               each shard owns a feature range) as the exactly-once contribution of
               (tree, layer, partition); each shard sums them exactly, derives the
               sibling by subtraction and returns only its best split per node
               (``gbt_layer.splits``);
  ``finish``   workers route rows to the leaves, update predictions, report losses.

Before the first tree: ``meta`` (row counts, max weight), ``sketch`` (per-feature exact
value summaries of a partition-independent row sample, merged on the PS by key) and
``bin``. Row sampling uses a hash of each row's content, and every statistic that decides
a split is an integer sum, so the trees do not depend on how the rows are partitioned
or on whether a task was retried.
"""

from __future__ import annotations

import logging
import time

import numpy as np
from pyspark.sql import functions as F

from ps_server.functions.gbt import merge_best
from ps_server.functions.gbt_layer import decode_splits
from ps_server.keys import mix64
from spark_ps.context import PSContext
from spark_ps.data import read_partition
from spark_ps.ml._job import PSJob, WorkerContext
from spark_ps.ml._progress import Progress
from spark_ps.ml._recovery import FitRecovery
from spark_ps.ml.base import PreparedData
from spark_ps.ml.gbt.estimator import register_trainer
from spark_ps.ml.tree.binning import (
    QuantileSketch,
    _reduce,
    bin_matrix,
    row_uniform,
    sketch_fraction,
    split_thresholds,
    summarize,
)
from spark_ps.ml.tree.histogram import (
    FixedPointScale,
    build_histograms,
    choose_scale,
    quantize_rows,
    unit_weight,
    weight_exponent,
)
from spark_ps.ml.tree.local import TreeBuilder, features_per_node, resolve_params, route_rows
from spark_ps.ml.tree.loss import get_loss, remap_labels
from spark_ps.ml.tree.tree import TreeArrays
from spark_ps.models import PSMatrix

__all__ = ["train_gbt"]

log = logging.getLogger("spark_ps.ml.gbt")

_VAL = "__spark_ps_validation"
_KEY_MASK = np.uint64((1 << 63) - 1)


# ----------------------------------------------------------------------------- workers


def _row_ids(X: np.ndarray, y: np.ndarray, w: np.ndarray) -> np.ndarray:
    """A partition-independent id per row: a hash of its content."""
    h = mix64(np.ascontiguousarray(y).view(np.int64))
    for col in (*X.T, w):
        h = mix64((h ^ np.ascontiguousarray(col).view(np.uint64)).view(np.int64))
    return h.view(np.int64)


def _setup(prepared: PreparedData):
    features, label, weight = prepared.features_col, prepared.label_col, prepared.weight_col

    def setup(batches, ctx: WorkerContext) -> None:
        batches = list(batches)
        csr = read_partition(batches, features, label_col=label, weight_col=weight)
        flags = (
            np.concatenate(
                [
                    b.column(b.schema.get_field_index(_VAL)).to_numpy(zero_copy_only=False)
                    for b in batches
                ]
            )
            if batches
            else np.zeros(0, bool)
        )
        X = csr.to_dense() if csr.n_rows else np.zeros((0, csr.num_features))
        w = csr.weights if csr.weights is not None else np.ones(csr.n_rows)
        y = csr.labels if csr.labels is not None else np.zeros(0)
        tr = ~flags.astype(bool)
        ctx.state.update(
            rows=csr.n_rows,
            X=X[tr],
            y=y[tr],
            w=w[tr],
            Xv=X[~tr],
            yv=y[~tr],
            wv=w[~tr],
            ids=_row_ids(X[tr], y[tr], w[tr]),
            num_features=csr.num_features,
        )

    return setup


def _per_part(ctx: WorkerContext, round_: int, n_workers: int, values: list[float]) -> None:
    """Contribute `values` in this partition's own block (so the driver can take max/min)."""
    out = np.zeros((n_workers, len(values)))
    out[ctx.part] = values
    ctx.contribute(round_, out.ravel())


def _meta(ctx: WorkerContext, round_: int, cmd: dict) -> None:
    s = ctx.state
    max_w = float(s["w"].max()) if s["w"].size else 0.0
    _per_part(ctx, round_, cmd["n_workers"], [s["y"].size, s["yv"].size, max_w, s["num_features"]])


def _sketch(ctx: WorkerContext, round_: int, cmd: dict) -> None:
    """Push this partition's exact value summary; equal (feature, value) keys add up."""
    s = ctx.state
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
        ctx.tensor(cmd["counts"]).increment(keys, np.stack([sk.weights, sk.counts], axis=1))
        ctx.tensor(cmd["values"]).update(
            keys, np.stack([feat.astype(np.float64), sk.values], axis=1)
        )
    ctx.contribute(round_, [keys.size])


def _sketch_keys(feat: np.ndarray, values: np.ndarray) -> np.ndarray:
    bits = np.ascontiguousarray(values, dtype=np.float64).view(np.int64)
    h = mix64(mix64(feat.astype(np.int64)).view(np.int64) ^ bits)
    return (h & _KEY_MASK).astype(np.int64)


def _apply_bins(s: dict, thresholds: list, loss_type: str) -> None:
    thresholds = [np.asarray(t, dtype=np.float64) for t in thresholds]
    s["bins"] = np.asfortranarray(bin_matrix(s["X"], thresholds))
    s["vbins"] = bin_matrix(s["Xv"], thresholds) if s["Xv"].size else None
    s["pred"], s["vpred"] = np.zeros(s["y"].size), np.zeros(s["yv"].size)
    loss = get_loss(loss_type)
    s["loss"] = loss
    s["labels"] = remap_labels(s["y"]) if loss.is_classification else s["y"]
    s["vlabels"] = remap_labels(s["yv"]) if loss.is_classification else s["yv"]


def _bin(ctx: WorkerContext, round_: int, cmd: dict) -> None:
    s = ctx.state
    _apply_bins(s, cmd["thresholds"], cmd["loss"])
    q = int(np.rint(np.ldexp(s["w"], cmd["weight_exp"])).astype(np.int64).sum())
    ctx.contribute(round_, [q >> 31, q & ((1 << 31) - 1)])  # exact in float64 halves


def _compute_targets(s: dict, tree: int) -> np.ndarray:
    t = s["labels"] if tree == 0 else -s["loss"].gradient(s["pred"], s["labels"])
    s["targets"] = t
    return t


def _targets(ctx: WorkerContext, round_: int, cmd: dict) -> None:
    s = ctx.state
    t = _compute_targets(s, cmd["tree"])
    lo, hi = (float(t.min()), float(t.max())) if t.size else (np.inf, -np.inf)  # -lo: -inf
    _per_part(ctx, round_, cmd["n_workers"], [-lo, hi])


def _start_tree(s: dict, scale: list, seed: int, rate: float) -> None:
    n = s["y"].size
    scale = FixedPointScale(*scale)
    s["row_stats"] = quantize_rows(s["targets"], s["w"], scale)
    s["unit"] = unit_weight(s["w"], scale)
    s["in_sample"] = row_uniform(s["ids"], seed) < rate if rate < 1.0 else np.ones(n, bool)
    s["node"] = np.zeros(n, dtype=np.int32)
    s["vnode"] = np.zeros(s["yv"].size, dtype=np.int32)


def _recover(ctx: WorkerContext, state: dict) -> None:
    """A retried task rebuilds what earlier rounds left in memory from the posted state:
    bins, predictions of finished trees, and the rows' nodes in the current tree."""
    s = ctx.state
    if "thresholds" not in state:
        return
    _apply_bins(s, state["thresholds"], state["loss"])
    for tree, tw in zip(state["trees"], state["weights"], strict=True):
        t = TreeArrays.from_dict(tree)
        s["pred"] = s["pred"] + t.predict(s["X"]) * tw
        if s["yv"].size:
            s["vpred"] = s["vpred"] + t.predict(s["Xv"]) * tw
    cur = state.get("current")
    if cur is not None:
        _compute_targets(s, cur["tree"])
        if cur.get("scale") is not None:
            _start_tree(s, cur["scale"], cur["seed"], cur["rate"])
            for routing in cur["routings"]:
                _route(s, routing)


def _hist(ctx: WorkerContext, round_: int, cmd: dict) -> None:
    s = ctx.state
    if cmd["layer"] == 0:
        _start_tree(s, cmd["scale"], cmd["seed"], cmd["subsampling_rate"])
    else:
        _route(s, cmd["routing"])
    slot_of_node = np.asarray(cmd["slot_of_node"], dtype=np.int32)
    slot = np.where(s["in_sample"], slot_of_node[s["node"]], -1)
    hist = build_histograms(
        s["bins"], slot, s["row_stats"], cmd["n_slots"], cmd["n_bins"], unit_weight=s["unit"]
    )
    f = hist.shape[1]
    rows = np.zeros((f, cmd["width"]), dtype=np.int64)
    rows[:, : hist.size // f] = hist.transpose(1, 0, 2, 3).reshape(f, -1)
    ctx.tensor(cmd["tensor"]).aggregate(np.arange(f), rows, round=round_, part=ctx.part)
    ctx.contribute(round_, [1.0])


def _route(s: dict, routing: list) -> None:
    arrays = [np.asarray(a, dtype=np.int32) for a in routing[:4]]
    now = np.asarray(routing[4], dtype=bool)
    s["node"] = route_rows(s["bins"], s["node"], *arrays, now)
    if s["vbins"] is not None:
        s["vnode"] = route_rows(s["vbins"], s["vnode"], *arrays, now)


def _finish(ctx: WorkerContext, round_: int, cmd: dict) -> None:
    """Rows to their leaves, predictions += weight * leaf value, weighted losses back."""
    s = ctx.state
    _route(s, cmd["routing"])
    values, tw = np.asarray(cmd["values"]), cmd["tree_weight"]
    s["pred"] = s["pred"] + values[s["node"]] * tw
    out = [float(np.dot(s["loss"].error(s["pred"], s["labels"]), s["w"])), float(s["w"].sum())]
    if s["vbins"] is not None:
        s["vpred"] = s["vpred"] + values[s["vnode"]] * tw
        out += [
            float(np.dot(s["loss"].error(s["vpred"], s["vlabels"]), s["wv"])),
            float(s["wv"].sum()),
        ]
    else:
        out += [0.0, 0.0]
    # the next tree's pseudo-residual bounds ride along (saves a round per tree)
    t = _compute_targets(s, cmd["tree"] + 1)
    bounds = np.zeros((cmd["n_workers"], 2))
    bounds[ctx.part] = (-float(t.min()), float(t.max())) if t.size else (-np.inf, -np.inf)
    ctx.contribute(round_, np.concatenate([out, bounds.ravel()]))


_HANDLERS = {
    "recover": _recover,
    "meta": _meta,
    "sketch": _sketch,
    "bin": _bin,
    "targets": _targets,
    "hist": _hist,
    "finish": _finish,
}


# ----------------------------------------------------------------------------- driver


def _thresholds(job: PSJob, ps, n_rows: int, n_features: int, max_w: float, p) -> list:
    """Merge every partition's value summary on the PS, then MLlib's split candidates."""
    max_bins = min(p.maxBins, n_rows)
    wexp = weight_exponent(max_w, n_rows)
    counts = PSMatrix.sparse(2, name=f"{job.topic}/sketch-counts", dtype="int64", context=ps)
    values = PSMatrix.sparse(2, name=f"{job.topic}/sketch-values", context=ps)
    try:
        job.call(
            "sketch",
            counts=counts.name,
            values=values.name,
            weight_exp=wexp,
            fraction=sketch_fraction(n_rows, max_bins),
            seed=p.seed,
        )
        keys, fv = values.pull()
        wc = counts.pull(keys)
    finally:
        counts.drop()
        values.drop()
    feat = fv[:, 0].astype(np.int64)
    sketch: QuantileSketch = _reduce(feat, fv[:, 1], wc[:, 0], wc[:, 1], n_features, wexp)
    return split_thresholds(sketch, max_bins)


class _HistPool:
    """The fit's histogram tensors, reused across layers and trees (no create/drop per
    layer): one for the pushed smaller-child histograms and two that take turns holding
    a layer's full histograms. A tensor is recreated only when a wider one is needed;
    layers use the leading columns of each row."""

    def __init__(self, ps, prefix: str, n_features: int):
        self.ps, self.prefix, self.n_features = ps, prefix, n_features
        self.tensors: dict[str, PSMatrix] = {}

    def get(self, role: str, width: int) -> PSMatrix:
        t = self.tensors.get(role)
        if t is None or t.spec.cols < width:
            if t is not None:
                t.drop()
            t = PSMatrix.dense(
                self.n_features,
                width,
                name=f"{self.prefix}/{role}/{width}",
                dtype="int64",
                context=self.ps,
            )
            self.tensors[role] = t
        return t

    def drop(self) -> None:
        for t in self.tensors.values():
            t.drop()
        self.tensors.clear()


def _grow(
    job: PSJob,
    pool: _HistPool,
    tree: int,
    thresholds,
    n_bins: int,
    scale,
    p,
    min_w: float,
    n_features: int,
    on_layer=None,
):
    """Grow one tree layer by layer; split finding runs on the shards."""
    builder = TreeBuilder(
        thresholds,
        scale,
        max_depth=p.maxDepth,
        min_instances_per_node=p.minInstancesPerNode,
        min_info_gain=p.minInfoGain,
        min_weight_per_node=min_w,
        features_per_node=features_per_node(p.featureSubsetStrategy, n_features),
        seed=p.seed + tree,
    )
    split_kw = dict(builder.split_kw, scale=list(scale))
    prev, n_prev, layer = None, 0, 0
    while not builder.done:
        plan = builder.histogram_plan()
        n_slots = 1 if plan is None else plan.n_slots
        slot_of_node = [0] if plan is None else plan.slot_of_node.tolist()
        n_open = len(builder.open)
        small = pool.get("small", n_slots * n_bins * 4)
        full = pool.get("full-b" if layer % 2 else "full-a", n_open * n_bins * 4)
        r = job.command(
            "hist",
            tree=tree,
            layer=layer,
            tensor=small.name,
            width=small.spec.cols,
            n_slots=n_slots,
            n_bins=n_bins,
            slot_of_node=slot_of_node,
            scale=list(scale),
            seed=p.seed + tree,
            subsampling_rate=p.subsamplingRate,
            routing=_routing(builder) if layer else None,
        )
        job.collect(r)
        if layer and on_layer is not None:
            on_layer(_routing(builder))
        args = {
            "round": r,
            "n_slots": n_slots,
            "n_bins": n_bins,
            "split_kw": split_kw,
            "n_open": n_open,
        }
        models = [small.spec, full.spec]
        if plan is not None:
            args.update(
                n_prev=n_prev,
                parent_slots=plan.parent_slots.tolist(),
                small_is_left=plan.small_is_left.tolist(),
                pick=plan.pick.tolist(),
                pick_left=plan.pick_left.tolist(),
            )
            models.append(prev.spec)
        mask = builder.feature_mask()
        if mask is not None:
            args["feature_mask"] = mask.astype(int).tolist()
        out = job.ps.client.call("gbt_layer.splits", models, args)
        builder.apply(merge_best([decode_splits(arrays[0]) for _, arrays in out]))
        prev, n_prev, layer = full, n_open, layer + 1
    return builder


def _routing(builder: TreeBuilder) -> list:
    return [a.tolist() for a in builder.routing()]


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
    )
    return {k: params[k] for k in keep if k in params}


def train_gbt(data: PreparedData, params: dict, *, validation: PreparedData | None = None):
    """The PS trainer of GBTClassifier/GBTRegressor (see spark_ps.ml.gbt.estimator)."""
    p = resolve_params(_fit_params(params))
    loss = get_loss(p.lossType)
    df = data.df.withColumn(_VAL, F.lit(False))
    if validation is not None:
        df = df.unionByName(validation.df.withColumn(_VAL, F.lit(True)))
    df = df.repartition(data.num_workers)
    ps = PSContext.getOrCreate(df.sparkSession)
    t0 = time.perf_counter()
    with PSJob(
        ps,
        df,
        data.num_workers,
        _setup(data),
        _HANDLERS,
        name=f"{type(loss).__name__[1:]} GBT(maxIter={p.maxIter})",
    ) as job:
        recovery = FitRecovery(
            job, params.get("checkpointInterval", -1), ps_state=False, what=job.name
        )
        nw = job.num_workers
        _, meta = job.call("meta", n_workers=nw)
        meta = meta.reshape(nw, 4)
        n_rows, max_w = int(meta[:, 0].sum()), float(meta[:, 2].max())
        n_features = int(meta[:, 3].max())
        if n_rows == 0:
            raise ValueError("the training dataset is empty")
        thresholds = _thresholds(job, ps, n_rows, n_features, max_w, p)
        n_bins = max(t.size for t in thresholds) + 1
        wexp = weight_exponent(max_w, n_rows)
        _, (hi, lo) = job.call(
            "bin", thresholds=[t.tolist() for t in thresholds], loss=p.lossType, weight_exp=wexp
        )
        total_w = float(np.ldexp(float((int(hi) << 31) + int(lo)), -wexp))  # exact int sum
        min_w = p.minWeightFractionPerNode * total_w
        state = {
            "thresholds": [t.tolist() for t in thresholds],
            "loss": p.lossType,
            "trees": [],
            "weights": [],
            "current": None,
        }
        trees, weights, hist = recovery.run(
            lambda resume: _boost(
                job,
                ps,
                p,
                thresholds,
                n_bins,
                n_rows,
                max_w,
                min_w,
                n_features,
                validation is not None,
                state if resume is None else resume,
                recovery,
            )
        )
    hist["fit_seconds"] = time.perf_counter() - t0
    return trees, weights, n_features, hist


def _boost(
    job, ps, p, thresholds, n_bins, n_rows, max_w, min_w, n_features, has_val, state, recovery
):
    """Boosting iterations; `state` (posted before each step) lets retried tasks resume,
    and a state from `recovery` (trees so far) resumes the fit after a shard restart."""
    nw = job.num_workers
    trees, weights, hist, (best_err, best_m), m0 = _resume_point(job, state)
    pool = _HistPool(ps, f"{job.topic}/hist", n_features)
    bar = Progress("spark-ps GBT", p.maxIter, unit="tree")
    state["current"] = {"tree": m0, "scale": None}
    job.post_state(state)
    _, bounds = job.call("targets", tree=m0, n_workers=nw)
    try:
        for m in range(m0, p.maxIter):
            recovery.boundary(m, lambda: {**state, "hist": hist, "best": [best_err, best_m]})  # noqa: B023 - called now
            bounds = bounds.reshape(nw, 2)
            scale = choose_scale(
                -float(bounds[:, 0].max()), float(bounds[:, 1].max()), max_w, n_rows
            )
            cur = state["current"] = {
                "tree": m,
                "scale": list(scale),
                "seed": p.seed + m,
                "rate": p.subsamplingRate,
                "routings": [],
            }
            job.post_state(state)

            def on_layer(routing, cur=cur):
                cur["routings"].append(routing)
                job.post_state(state)

            builder = _grow(job, pool, m, thresholds, n_bins, scale, p, min_w, n_features, on_layer)
            tw = 1.0 if m == 0 else p.stepSize
            _, out = job.call(
                "finish",
                routing=_routing(builder),
                tree=m,
                n_workers=nw,
                values=builder.node_values().tolist(),
                tree_weight=tw,
            )
            (err, wsum, verr, vwsum), bounds = out[:4], out[4:]
            trees.append(builder.finish())
            weights.append(tw)
            state["trees"].append(trees[-1].to_dict())
            state["weights"].append(tw)
            state["current"] = {"tree": m + 1, "scale": None}
            job.post_state(state)
            hist["train_loss"].append(err / wsum)
            losses = {"train loss": err / wsum}
            if has_val:
                losses["validation loss"] = verr / vwsum
            bar.update(m + 1, **losses)
            if not has_val:
                continue
            verr = verr / vwsum
            hist["validation_loss"].append(verr)
            if m == 0:
                best_err = verr
            elif best_err - verr < p.validationTol * max(verr, 0.01):
                break
            elif verr < best_err:
                best_err, best_m = verr, m + 1
    finally:
        pool.drop()
        bar.close()
    if has_val:
        trees, weights = trees[:best_m], weights[:best_m]
    return trees, np.asarray(weights), hist


def _resume_point(job: PSJob, state: dict):
    """(trees, weights, loss history, (best validation error, its tree count), first tree)
    of a fresh fit, or of a state a rollback returned (workers rebuild from it first)."""
    if "hist" not in state:
        return [], [], {"train_loss": [], "validation_loss": []}, (0.0, 1), 0
    job.rewind(state)
    trees = [TreeArrays.from_dict(t) for t in state["trees"]]
    best_err, best_m = state["best"]
    return trees, list(state["weights"]), state["hist"], (best_err, int(best_m)), len(trees)


register_trainer(train_gbt)
