"""Single-process GBT trainer with MLlib's semantics, built from the distributed pieces.

It is both the reference the distributed trainer must reproduce exactly and the "numpy
limit" for benchmarks. Roles map onto the PS design:

* :class:`TreeBuilder` is the driver's bookkeeping: which nodes are open, which child of
  each split gets a histogram pass (the smaller one), node statistics, leaf decisions.
* :func:`route_rows` and :func:`~spark_ps.ml.tree.histogram.build_histograms` are the
  workers' per-layer work over their rows.
* :func:`~ps_server.functions.gbt.best_splits` is the shards' split finding.

One tree, distributed (what :func:`grow_tree` does in one process):

1. workers compute their rows' targets; ``tree_scale`` fixes the tree's fixed-point scale
   (from the loss's target bounds, or the targets' min and max over all workers) and
   workers ``quantize_rows`` (once per tree);
2. per layer, the driver's ``histogram_plan()`` names the nodes whose rows are scanned;
   workers map ``slot_of_node[node_of_row]`` (-1 for rows left out by subsampling), run
   ``build_histograms`` and push them, keyed by partition, to the shards owning each
   feature range; sums are exact, so arrival order does not matter;
3. shards ``derive_children`` from the parents' histograms they kept and run
   ``best_splits`` with the driver's ``feature_mask`` columns for their range; the driver
   ``merge_best``-s the shard answers and calls ``apply``;
4. workers ``route_rows`` with ``builder.routing()``; after the last layer every row sits in
   a leaf and adds ``node_values()[leaf] * treeWeight`` to its prediction.

MLlib semantics mirrored (``GradientBoostedTrees.boost``, ``RandomForest``): classification
maps labels to {-1, +1}; tree 0 is fit to the labels with weight 1.0, tree m to
``-gradient`` with weight ``stepSize`` and seed ``seed + m``; trees are Variance regression
trees grown level-wise to ``maxDepth``; a child whose impurity is below machine epsilon is a
leaf; sibling leaves with equal predictions are pruned; with validation data, training stops
when the validation error improves by less than ``validationTol * max(error, 0.01)`` and the
best prefix of trees is returned. Row subsampling and per-node feature subsets use
partition-independent hashing/seeding instead of MLlib's per-partition RNG streams, so those
draws (only) differ from MLlib's.
"""

from __future__ import annotations

import math
import numbers
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from ps_server.functions.gbt import SPLIT_DTYPE, best_splits
from spark_ps.ml.tree import goss
from spark_ps.ml.tree.binning import (
    bin_matrix,
    row_uniform,
    sketch_fraction,
    split_thresholds,
    summarize,
)
from spark_ps.ml.tree.histogram import (
    FixedPointScale,
    build_node_histograms,
    choose_scale,
    derive_children,
    quantize_rows,
    stats_to_moments,
    unit_weight,
    weight_exponent,
)
from spark_ps.ml.tree.kernels import HAVE_JIT, route_pass
from spark_ps.ml.tree.loss import Loss, get_loss, remap_labels
from spark_ps.ml.tree.tree import TreeArrays

__all__ = [
    "GBTParams",
    "HistogramPlan",
    "TreeBuilder",
    "evaluate_each_iteration",
    "feature_importances",
    "features_per_node",
    "fit_gbt_local",
    "grow_tree",
    "predict_leaf",
    "predict_margin",
    "resolve_params",
    "route_rows",
    "tree_scale",
]

EPSILON = float(np.finfo(np.float64).eps)  # MLlib's Utils.EPSILON
_MASK64 = (1 << 64) - 1


@dataclass(frozen=True)
class GBTParams:
    """MLlib GBT Params that change the fitted model, with MLlib's defaults."""

    maxDepth: int = 5
    maxBins: int = 32
    minInstancesPerNode: int = 1
    minWeightFractionPerNode: float = 0.0
    minInfoGain: float = 0.0
    maxIter: int = 20
    stepSize: float = 0.1
    subsamplingRate: float = 1.0
    featureSubsetStrategy: str = "all"
    seed: int = 0
    lossType: str = "squared"
    validationTol: float = 0.01
    gossTopRate: float = 0.0  # spark-ps's GOSS option (see spark_ps.ml.tree.goss); 0: off
    gossOtherRate: float = 0.1


# MLlib Params accepted but irrelevant to the fitted trees (memory, caching, column names).
_IGNORED = {
    "cacheNodeIds",
    "checkpointInterval",
    "maxMemoryInMB",
    "impurity",
    "featuresCol",
    "labelCol",
    "weightCol",
    "predictionCol",
    "probabilityCol",
    "rawPredictionCol",
    "leafCol",
    "validationIndicatorCol",
    "thresholds",
}

_RANGES = {  # name: (integer?, low, high, text)
    "maxDepth": (True, 0, 30, "an integer in [0, 30]"),
    "maxBins": (True, 2, None, "an integer >= 2"),
    "minInstancesPerNode": (True, 1, None, "an integer >= 1"),
    "maxIter": (True, 1, None, "an integer >= 1"),
    "seed": (True, None, None, "an integer"),
    "minInfoGain": (False, 0.0, None, ">= 0"),
    "validationTol": (False, 0.0, None, ">= 0"),
}


def _bad_number(v: Any, integer: bool, lo: float | None, hi: float | None) -> bool:
    kind = numbers.Integral if integer else numbers.Real
    if isinstance(v, bool) or not isinstance(v, kind) or not math.isfinite(v):
        return True
    return (lo is not None and v < lo) or (hi is not None and v > hi)


def resolve_params(params: dict[str, Any] | None) -> GBTParams:
    """Validate a dict of MLlib-named Params (camelCase) into :class:`GBTParams`."""
    params = dict(params or {})
    known = set(GBTParams.__dataclass_fields__)
    unknown = set(params) - known - _IGNORED
    if unknown:
        raise ValueError(f"unknown GBT params {sorted(unknown)}; supported: {sorted(known)}")
    p = GBTParams(**{k: v for k, v in params.items() if k in known})
    for name, (integer, lo, hi, text) in _RANGES.items():
        if _bad_number(getattr(p, name), integer, lo, hi):
            raise ValueError(f"param {name} must be {text}, got {getattr(p, name)!r}")
    for name in ("stepSize", "subsamplingRate"):
        v = getattr(p, name)
        if _bad_number(v, False, None, 1.0) or v <= 0:
            raise ValueError(f"param {name} must be in (0, 1], got {v!r}")
    if _bad_number(p.minWeightFractionPerNode, False, 0.0, None) or (
        p.minWeightFractionPerNode >= 0.5
    ):
        raise ValueError(
            f"param minWeightFractionPerNode must be in [0, 0.5), got {p.minWeightFractionPerNode}"
        )
    _check_goss(p)
    get_loss(p.lossType)
    features_per_node(p.featureSubsetStrategy, 1)
    return p


def _check_goss(p: GBTParams) -> None:
    top, other = p.gossTopRate, p.gossOtherRate
    if _bad_number(top, False, 0.0, None) or top >= 1.0:
        raise ValueError(f"param gossTopRate must be in [0, 1), got {top!r}")
    if _bad_number(other, False, None, 1.0) or other <= 0.0:
        raise ValueError(f"param gossOtherRate must be in (0, 1], got {other!r}")
    if top > 0.0 and top + other > 1.0:
        raise ValueError(f"gossTopRate + gossOtherRate must be <= 1, got {top} + {other}")
    if top > 0.0 and p.subsamplingRate < 1.0:
        raise ValueError(
            f"gossTopRate={top} (GOSS) replaces subsampling: leave subsamplingRate at 1.0, "
            f"got {p.subsamplingRate}"
        )


def features_per_node(strategy: str | int | float, num_features: int) -> int:
    """Features considered per node for MLlib's ``featureSubsetStrategy`` (GBT: one tree)."""
    s = str(strategy).strip().lower()
    if s in ("auto", "all"):  # "auto" is "all" when training a single tree at a time
        return num_features
    if s == "sqrt":
        return math.ceil(math.sqrt(num_features))
    if s == "log2":
        return max(1, math.ceil(math.log(num_features) / math.log(2))) if num_features else 1
    if s == "onethird":
        return math.ceil(num_features / 3.0)
    try:
        as_int = int(s)
    except ValueError:
        as_int = None
    if as_int is not None and as_int > 0:
        return min(as_int, num_features)
    try:
        frac = float(s)
    except ValueError:
        frac = float("nan")
    if 0 < frac <= 1.0:
        return math.ceil(frac * num_features)
    raise ValueError(
        f"featureSubsetStrategy {strategy!r} is not supported: use auto, all, onethird, sqrt, "
        "log2, a fraction in (0, 1] or an integer in [1, n]"
    )


@dataclass(frozen=True)
class HistogramPlan:
    """Which histograms a layer needs: scan the smaller child of each split, subtract the other.

    ``slot_of_node[node]`` is the histogram slot of a node whose rows must be scanned (-1
    otherwise; ``n_slots`` slots); ``parent_slots`` (the parents' positions in the previous
    layer) and ``small_is_left`` feed :func:`derive_children`; then open node ``i`` of this
    layer takes ``left[pick[i]]`` if ``pick_left[i]`` else ``right[pick[i]]``.
    """

    slot_of_node: np.ndarray
    n_slots: int
    parent_slots: np.ndarray
    small_is_left: np.ndarray
    pick: np.ndarray
    pick_left: np.ndarray


class TreeBuilder:
    """Driver-side state of one tree grown level by level (nodes numbered in BFS order)."""

    def __init__(
        self,
        thresholds: list[np.ndarray],
        scale: FixedPointScale,
        *,
        max_depth: int,
        min_instances_per_node: int = 1,
        min_info_gain: float = 0.0,
        min_weight_per_node: float = 0.0,
        features_per_node: int | None = None,
        seed: int = 0,
    ) -> None:
        self.thresholds = thresholds
        self.scale = scale
        self.max_depth = int(max_depth)
        self.split_kw = {
            "min_instances_per_node": int(min_instances_per_node),
            "min_info_gain": float(min_info_gain),
            "min_weight_per_node": float(min_weight_per_node),
            "scale": scale,
        }
        n_feat = len(thresholds)
        self.features_per_node = n_feat if features_per_node is None else int(features_per_node)
        self.seed = int(seed) & _MASK64
        self.cols: dict[str, list] = {
            k: [] for k in ("feature", "bin", "left", "right", "gain", "level", "stats", "invalid")
        }
        self._add_node(np.zeros(4, np.int64), level=0)
        self.layer = 0
        self.open: list[int] = [0]
        self.split_now: list[int] = []
        self._prev_open: list[int] = []

    def _add_node(self, stats: np.ndarray, level: int) -> int:
        c = self.cols
        for k, v in (("feature", -1), ("bin", -1), ("left", -1), ("right", -1), ("gain", -1.0)):
            c[k].append(v)
        c["level"].append(level)
        c["stats"].append(np.asarray(stats, np.int64))
        c["invalid"].append(False)
        return len(c["level"]) - 1

    @property
    def done(self) -> bool:
        """True when no node is left to split."""
        return not self.open

    def feature_mask(self) -> np.ndarray | None:
        """Per open node, the features it may split on (None when all features are allowed)."""
        n_feat = len(self.thresholds)
        if self.features_per_node >= n_feat:
            return None
        mask = np.zeros((len(self.open), n_feat), dtype=bool)
        for i, node in enumerate(self.open):  # loop over nodes of one layer
            rng = np.random.default_rng([self.seed, node])
            mask[i, rng.choice(n_feat, self.features_per_node, replace=False)] = True
        return mask

    def histogram_plan(self) -> HistogramPlan | None:
        """How to get this layer's histograms (None at the root: scan every sampled row)."""
        if self.layer == 0:
            return None
        c = self.cols
        prev_slot = {node: i for i, node in enumerate(self._prev_open)}
        open_set = set(self.open)
        slot_of_node = np.full(len(c["level"]), -1, dtype=np.int32)
        parent_slots, small_is_left, pick, pick_left = [], [], [], []
        for p in self.split_now:  # loop over the nodes split in the last layer
            lc, rc = c["left"][p], c["right"][p]
            if lc not in open_set and rc not in open_set:
                continue
            k = len(parent_slots)
            left_small = c["stats"][lc][0] <= c["stats"][rc][0]
            slot_of_node[lc if left_small else rc] = k
            parent_slots.append(prev_slot[p])
            small_is_left.append(left_small)
            for child, is_left in ((lc, True), (rc, False)):
                if child in open_set:
                    pick.append(k)
                    pick_left.append(is_left)
        return HistogramPlan(
            slot_of_node,
            len(parent_slots),
            np.asarray(parent_slots, np.intp),
            np.asarray(small_is_left, bool),
            np.asarray(pick, np.intp),
            np.asarray(pick_left, bool),
        )

    def apply(self, results: np.ndarray) -> None:
        """Record the layer's best splits (``SPLIT_DTYPE``, one per open node) and open children."""
        if results.dtype != SPLIT_DTYPE or results.shape != (len(self.open),):
            raise ValueError(f"need {len(self.open)} SPLIT_DTYPE results, got {results.shape}")
        c = self.cols
        if self.layer == 0:
            c["stats"][0] = np.asarray(results[0]["total"], np.int64)
        new_open, split_now = [], []
        # children's variances in one vectorized call (the same bits as one node at a time)
        var_l = stats_to_moments(results["left"], self.scale)[3].tolist()
        var_r = stats_to_moments(results["right"], self.scale)[3].tolist()
        for i, (node, r) in enumerate(zip(self.open, results, strict=True)):  # one layer's nodes
            if r["feature"] < 0:
                c["invalid"][node] = True  # MLlib reports impurity -1 for such leaves
                continue
            level = c["level"][node]
            if r["gain"] <= 0 or level >= self.max_depth:
                continue
            c["feature"][node], c["bin"][node], c["gain"][node] = (
                int(r["feature"]),
                int(r["bin"]),
                float(r["gain"]),
            )
            for side, var in (("left", var_l[i]), ("right", var_r[i])):
                child = self._add_node(r[side], level + 1)
                c[side][node] = child
                if level + 1 < self.max_depth and abs(var) >= EPSILON:
                    new_open.append(child)
            split_now.append(node)
        self._prev_open, self.open, self.split_now = self.open, new_open, split_now
        self.layer += 1

    def routing(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(split feature, split bin, left, right, split-now mask) per node, for route_rows."""
        c = self.cols
        now = np.zeros(len(c["level"]), dtype=bool)
        now[self.split_now] = True
        as32 = [np.asarray(c[k], np.int32) for k in ("feature", "bin", "left", "right")]
        return as32[0], as32[1], as32[2], as32[3], now

    def node_values(self) -> np.ndarray:
        """Prediction (weighted mean target) of every node, indexed by builder node id."""
        return stats_to_moments(np.stack(self.cols["stats"]), self.scale)[2]

    def finish(self) -> TreeArrays:
        """The grown tree as TreeArrays, with MLlib's pruning of equal sibling leaves."""
        c = self.cols
        raw, weight, value, var = stats_to_moments(np.stack(c["stats"]), self.scale)
        feature = np.asarray(c["feature"], np.int32)
        thr = np.zeros(feature.size)
        for i in np.flatnonzero(feature >= 0):  # loop over split nodes
            thr[i] = self.thresholds[feature[i]][c["bin"][i]]
        impurity = np.where(np.asarray(c["invalid"]), -1.0, var)
        tree = TreeArrays(
            feature, thr, c["left"], c["right"], value, impurity, c["gain"], weight, raw
        )
        return _prune(tree)


def _prune(tree: TreeArrays) -> TreeArrays:
    """Merge sibling leaves with equal predictions into their parent, then renumber BFS."""
    t = TreeArrays.from_dict(tree.to_dict())
    for i in np.flatnonzero(t.feature >= 0)[::-1]:  # children before parents
        lc, rc = t.left[i], t.right[i]
        if t.feature[lc] < 0 and t.feature[rc] < 0 and t.value[lc] == t.value[rc]:
            t.value[i] = t.value[lc]
            t.feature[i], t.left[i], t.right[i], t.gain[i] = -1, -1, -1, -1.0
    order, new_id = [0], {0: 0}
    for i in order:  # BFS over kept nodes (grows while iterating)
        if t.feature[i] >= 0:
            for child in (int(t.left[i]), int(t.right[i])):
                new_id[child] = len(order)
                order.append(child)
    keep = np.asarray(order)
    remap = np.full(t.num_nodes, -1, np.int32)
    remap[keep] = np.arange(keep.size)
    inner = t.feature[keep] >= 0
    return TreeArrays(
        t.feature[keep],
        t.threshold[keep],
        np.where(inner, remap[t.left[keep]], -1),
        np.where(inner, remap[t.right[keep]], -1),
        t.value[keep],
        t.impurity[keep],
        t.gain[keep],
        t.count[keep],
        None if t.raw_count is None else t.raw_count[keep],
    )


def _cells(a: np.ndarray, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """``a[rows, cols]`` as a 1-D take on a contiguous matrix (3x faster than 2-D indexing)."""
    n, f = a.shape
    if a.flags.f_contiguous:
        return a.ravel(order="F")[cols.astype(np.intp) * n + rows]
    if a.flags.c_contiguous:
        return a.ravel()[rows.astype(np.intp) * f + cols]
    return a[rows, cols]


def route_rows(
    bins: np.ndarray,
    node_of_row: np.ndarray,
    split_feature: np.ndarray,
    split_bin: np.ndarray,
    left: np.ndarray,
    right: np.ndarray,
    split_now: np.ndarray,
) -> np.ndarray:
    """Move rows of nodes split this layer to their child (bin <= split bin goes left)."""
    if HAVE_JIT:  # the kernel does not bounds-check: refuse node ids the arrays do not cover
        node_of_row = np.asarray(node_of_row)
        if node_of_row.size and not 0 <= node_of_row.min() <= node_of_row.max() < split_now.size:
            raise ValueError(f"node_of_row holds a node outside [0, {split_now.size})")
        feats = np.asarray(split_feature)[np.asarray(split_now, bool)]
        if feats.size and not 0 <= feats.min() <= feats.max() < bins.shape[1]:
            raise ValueError(f"a split feature lies outside [0, {bins.shape[1]})")
        return route_pass(bins, node_of_row, split_feature, split_bin, left, right, split_now)
    node_of_row = np.array(node_of_row, dtype=np.int32, copy=True)
    rows = np.flatnonzero(split_now[node_of_row])
    nodes = node_of_row[rows]
    go_left = _cells(bins, rows, split_feature[nodes]) <= split_bin[nodes]
    node_of_row[rows] = np.where(go_left, left[nodes], right[nodes])
    return node_of_row


def grow_tree(
    bins: np.ndarray,
    row_stats: np.ndarray,
    in_sample: np.ndarray,
    builder: TreeBuilder,
    n_bins: int,
    *,
    unit: int | None = None,
    hist_fn: Any = None,
) -> np.ndarray:
    """Grow ``builder``'s tree over binned rows; returns each row's leaf (builder node id).

    ``hist_fn(slot_of_row, n_slots) -> hist`` replaces the local histogram pass (the
    distributed trainer sums partition histograms there); rows not ``in_sample`` never
    contribute but are still routed, so their leaf is known too.
    """
    node_of_row = np.zeros(bins.shape[0], dtype=np.int32)

    def layer_hist(slot_of_node: np.ndarray, n_slots: int) -> np.ndarray:
        if hist_fn is not None:
            return hist_fn(np.where(in_sample, slot_of_node[node_of_row], -1), n_slots)
        return build_node_histograms(
            bins, node_of_row, slot_of_node, in_sample, row_stats, n_slots, n_bins, unit_weight=unit
        )

    hist = np.zeros((0,), np.int64)
    while not builder.done:
        plan = builder.histogram_plan()
        if plan is None:
            hist = layer_hist(np.zeros(1, np.int32), 1)
        else:
            small = layer_hist(plan.slot_of_node, plan.n_slots)
            lh, rh = derive_children(hist[plan.parent_slots], small, plan.small_is_left)
            hist = np.where(plan.pick_left[:, None, None, None], lh[plan.pick], rh[plan.pick])
        results = best_splits(hist, 0, feature_mask=builder.feature_mask(), **builder.split_kw)
        builder.apply(results)
        node_of_row = route_rows(bins, node_of_row, *builder.routing())
    return node_of_row


def _check_inputs(
    X: np.ndarray, y: np.ndarray, w: np.ndarray | None, where: str
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    X = np.asarray(X, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    if X.ndim != 2 or y.shape != (X.shape[0],) or X.shape[0] == 0:
        raise ValueError(f"{where}: need X (n>0, f) and y (n,), got {X.shape} and {y.shape}")
    w = np.ones(X.shape[0]) if w is None else np.asarray(w, dtype=np.float64)
    if w.shape != y.shape:
        raise ValueError(f"{where}: weights have shape {w.shape}, expected {y.shape}")
    for name, arr in (("features", X), ("labels", y), ("weights", w)):
        bad = ~np.isfinite(arr)
        if bad.any():
            idx = np.argwhere(bad)[0]
            raise ValueError(f"{where}: {name} at index {tuple(int(i) for i in idx)} is not finite")
    if (w < 0).any():
        raise ValueError(f"{where}: weight of row {int(np.argmax(w < 0))} is negative")
    return X, y, w


def _weighted_error(loss: Loss, pred: np.ndarray, labels: np.ndarray, w: np.ndarray) -> float:
    return float(np.dot(loss.error(pred, labels), w) / w.sum())


@dataclass
class _Data:
    """One fit's prepared training data (binned) and fixed per-fit quantities."""

    bins: np.ndarray
    labels: np.ndarray
    weights: np.ndarray
    thresholds: list[np.ndarray]
    n_bins: int
    max_weight: float
    min_weight_per_node: float


def _prepare(X: np.ndarray, labels: np.ndarray, w: np.ndarray, p: GBTParams) -> _Data:
    n = X.shape[0]
    max_bins = min(p.maxBins, n)
    max_w = float(w.max())
    wexp = weight_exponent(max_w, n)
    sketch = summarize(X, w, weight_exp=wexp, fraction=sketch_fraction(n, max_bins), seed=p.seed)
    thresholds = split_thresholds(sketch, max_bins)
    bins = bin_matrix(X, thresholds)
    n_bins = max(t.size for t in thresholds) + 1
    # total weight from exact integer sums, so every partitioning agrees on it
    q_total = int(np.rint(np.ldexp(w, wexp)).astype(np.int64).sum())
    min_w = p.minWeightFractionPerNode * float(np.ldexp(float(q_total), -wexp))
    return _Data(bins, labels, w, thresholds, n_bins, max_w, min_w)


def tree_scale(
    loss: Loss, tree: int, target_min: float, target_max: float, max_weight: float, n_rows: int
) -> FixedPointScale:
    """Tree `tree`'s fixed-point scale: from the loss's own target bounds where it has them
    (``Loss.target_bounds``), else from the targets' min and max over every row."""
    lo, hi = loss.target_bounds(tree) or (target_min, target_max)
    return choose_scale(lo, hi, max_weight, n_rows)


def _fit_one_tree(d: _Data, targets: np.ndarray, p: GBTParams, m: int, loss: Loss) -> tuple:
    n, seed, weights = targets.shape[0], p.seed + m, d.weights
    lo, hi, max_w = float(targets.min()), float(targets.max()), d.max_weight
    if goss.active(p.gossTopRate, p.stepSize, m):
        rows = goss.bins_of(targets, weights, max_w * max(-lo, hi))
        top, other = p.gossTopRate, p.gossOtherRate
        sample = goss.draw(rows, goss.counts(rows), weights, np.arange(n), top, other, seed)
        in_sample, weights = sample.in_sample, sample.weights
        max_w *= goss.weight_bound(top, other)
    elif p.subsamplingRate < 1.0:
        in_sample = row_uniform(np.arange(n), seed) < p.subsamplingRate
    else:
        in_sample = np.ones(n, dtype=bool)
    scale = tree_scale(loss, m, lo, hi, max_w, n)
    builder = TreeBuilder(
        d.thresholds,
        scale,
        max_depth=p.maxDepth,
        min_instances_per_node=p.minInstancesPerNode,
        min_info_gain=p.minInfoGain,
        min_weight_per_node=d.min_weight_per_node,
        features_per_node=features_per_node(p.featureSubsetStrategy, len(d.thresholds)),
        seed=seed,
    )
    q = quantize_rows(targets, weights, scale)
    leaf = grow_tree(d.bins, q, in_sample, builder, d.n_bins, unit=unit_weight(weights, scale))
    return builder.finish(), builder.node_values()[leaf]


def fit_gbt_local(
    X: np.ndarray,
    y: np.ndarray,
    w: np.ndarray | None = None,
    params: dict[str, Any] | None = None,
    *,
    validation: tuple[np.ndarray, np.ndarray, np.ndarray | None] | None = None,
) -> tuple[list[TreeArrays], np.ndarray, dict[str, Any]]:
    """Fit MLlib-style GBT on dense in-memory data.

    Parameters
    ----------
    X, y, w : features (n, f), labels (0/1 for ``lossType="logistic"``), weights (default 1)
    params : MLlib Param names -> values (see :class:`GBTParams`); unknown names raise
    validation : (X_val, y_val, w_val), optional
        Enables MLlib's validation-based early stopping (``validationTol``).

    Returns
    -------
    trees, tree_weights, history
        ``history`` holds per-iteration ``train_loss`` (and ``validation_loss``), the
        ``thresholds`` used, and ``fit_seconds``.
    """
    start = time.perf_counter()
    p = resolve_params(params)
    loss = get_loss(p.lossType)
    X, y, w = _check_inputs(X, y, w, "training data")
    labels = remap_labels(y) if loss.is_classification else y
    d = _prepare(X, labels, w, p)
    val = None
    if validation is not None:
        Xv, yv, wv = _check_inputs(*validation, "validation data")
        val = (Xv, remap_labels(yv) if loss.is_classification else yv, wv, np.zeros(len(yv)))
    trees, weights, hist = [], [], {"train_loss": [], "validation_loss": []}
    pred, best_err, best_m = np.zeros(X.shape[0]), 0.0, 1
    for m in range(p.maxIter):  # boosting iterations
        targets = labels if m == 0 else -loss.gradient(pred, labels)
        tree, row_values = _fit_one_tree(d, targets, p, m, loss)
        tw = 1.0 if m == 0 else p.stepSize
        trees.append(tree)
        weights.append(tw)
        pred = pred + row_values * tw
        hist["train_loss"].append(_weighted_error(loss, pred, labels, w))
        if val is None:
            continue
        Xv, yv, wv, vpred = val
        vpred += tree.predict(Xv) * tw
        err = _weighted_error(loss, vpred, yv, wv)
        hist["validation_loss"].append(err)
        if m == 0:
            best_err = err
        elif best_err - err < p.validationTol * max(err, 0.01):
            break
        elif err < best_err:
            best_err, best_m = err, m + 1
    if val is not None:
        trees, weights = trees[:best_m], weights[:best_m]
    hist.update(thresholds=d.thresholds, fit_seconds=time.perf_counter() - start)
    return trees, np.asarray(weights, dtype=np.float64), hist


def predict_margin(trees: list[TreeArrays], weights: np.ndarray, X: np.ndarray) -> np.ndarray:
    """Ensemble margin ``sum_t weight_t * tree_t(X)``, accumulated tree by tree like MLlib."""
    X = np.asarray(X, dtype=np.float64)
    margin = np.zeros(X.shape[0])
    for tree, tw in zip(trees, np.asarray(weights, dtype=np.float64), strict=True):
        margin = margin + tree.predict(X) * tw
    return margin


def predict_leaf(trees: list[TreeArrays], X: np.ndarray) -> np.ndarray:
    """MLlib's ``leafCol``: per row and tree, the leaf's index (leaves numbered left to right)."""
    X = np.asarray(X, dtype=np.float64)
    out = np.empty((X.shape[0], len(trees)), dtype=np.float64)
    for t, tree in enumerate(trees):
        out[:, t] = tree.leaf_index()[tree.predict_leaf(X)]
    return out


def evaluate_each_iteration(
    trees: list[TreeArrays],
    weights: np.ndarray,
    X: np.ndarray,
    y: np.ndarray,
    loss_type: str,
    sample_weight: np.ndarray | None = None,
) -> np.ndarray:
    """Weighted mean loss of the first 1, 2, ... trees (MLlib's ``evaluateEachIteration``)."""
    loss = get_loss(loss_type)
    X, y, w = _check_inputs(X, y, sample_weight, "evaluation data")
    labels = remap_labels(y) if loss.is_classification else y
    margin, out = np.zeros(X.shape[0]), []
    for tree, tw in zip(trees, np.asarray(weights, dtype=np.float64), strict=True):
        margin = margin + tree.predict(X) * tw
        out.append(_weighted_error(loss, margin, labels, w))
    return np.asarray(out)


def feature_importances(
    trees: list[TreeArrays], num_features: int, *, per_tree_normalization: bool = False
) -> np.ndarray:
    """MLlib's tree-ensemble importances: sum of gain * weighted count per split feature.

    MLlib's GBT models call this with ``perTreeNormalization = false`` (the default here);
    random forests normalise each tree first. The result is normalised to sum to 1.
    """
    total = np.zeros(int(num_features))
    for tree in trees:
        inner = tree.feature >= 0
        imp = np.bincount(
            tree.feature[inner],
            weights=tree.gain[inner] * tree.count[inner],
            minlength=int(num_features),
        )
        norm = imp.sum() if per_tree_normalization else 1.0
        if norm != 0:
            total += imp / norm
    s = total.sum()
    return total / s if s != 0 else total
