"""GBDT split finding, run inside a PS shard on the histograms of the features it owns.

Imports only numpy (and numba lazily, through :mod:`ps_server.functions.gbt_jit`): this
module is loaded by shard processes.

Histogram layout (produced by ``spark_ps.ml.tree.histogram``): int64
``[n_nodes, n_features_local, n_bins, 4]``; the last axis is ``[raw count, sum w, sum w*u,
sum w*u*u]`` in fixed point, where ``u = (y - center) * 2**-target_exp`` and the weighted
sums are scaled by ``2**weight_exp``; ``scale = (center, target_exp, weight_exp)``. Bin ``b``
holds ``thresholds[b-1] < x <= thresholds[b]``; a split at bin ``b`` sends bins ``<= b`` left.

Gain is MLlib's Variance information gain,
``impurity - wL/w * impurityL - wR/w * impurityR`` on weighted counts, computed in the
algebraically equal form ``(wL/w) * (wR/w) * (meanL - meanR)**2``, which needs no sum of
squares and cannot cancel catastrophically; a mean difference within 4 ulps (what rounding
int64 sums to float can produce for equal means) counts as no gain. Ties go to the lowest
global feature index, then the lowest bin, so the choice is deterministic and independent of
how features are sharded.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ps_server.functions import gbt_jit

__all__ = ["SPLIT_DTYPE", "best_splits", "derive_children", "merge_best", "warm_up"]

SPLIT_DTYPE = np.dtype(
    [
        ("gain", "f8"),  # -inf when the node has no valid split here
        ("feature", "i4"),  # global feature index, -1 when invalid
        ("bin", "i4"),  # bins <= this go left, -1 when invalid
        ("total", "i8", (4,)),  # node totals (same in every shard)
        ("left", "i8", (4,)),
        ("right", "i8", (4,)),
    ]
)

_NOISE_ULPS = 4 * np.finfo(np.float64).eps
_CHUNK_CELLS = 1 << 22  # bound on nodes * features * bins processed at once (memory)


def _chunk_gains(
    cum: np.ndarray,
    min_count: int,
    min_weight_q: float,
    min_info_gain: float,
    target_exp: int,
    mask: np.ndarray | None,
) -> np.ndarray:
    """Gain of every candidate split, -inf where MLlib would call the split invalid. A
    node's totals are its first feature's: every feature's bins hold each of its rows once."""
    total = cum[:, :1, -1:, :]
    right = total - cum
    lw = cum[..., 1].astype(np.float64)
    rw = right[..., 1].astype(np.float64)
    w = total[..., 1].astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        mean_l, mean_r = cum[..., 2] / lw, right[..., 2] / rw
        diff = mean_l - mean_r
        # equal means (e.g. a pure node) may differ by a few ulps after int->float rounding;
        # that is no gain, so such splits are not taken (MLlib: gain <= 0 makes a leaf)
        noise = _NOISE_ULPS * np.maximum(np.abs(mean_l), np.abs(mean_r))
        diff = np.where(np.abs(diff) <= noise, 0.0, diff)
        gain = np.ldexp((lw / w) * (rw / w) * diff * diff, 2 * target_exp)
    gain = np.where((lw > 0) & (rw > 0), gain, 0.0)
    valid = (
        (cum[..., 0] >= min_count)
        & (right[..., 0] >= min_count)
        & (lw >= min_weight_q)
        & (rw >= min_weight_q)
        & (gain >= min_info_gain)
    )
    if mask is not None:
        valid &= mask[:, :, None]
    return np.where(valid, gain, -np.inf)


def best_splits(
    hist: np.ndarray,
    feature_offset: int,
    *,
    min_instances_per_node: int = 1,
    min_info_gain: float = 0.0,
    min_weight_per_node: float = 0.0,
    feature_mask: np.ndarray | None = None,
    scale: Sequence[float] | None = None,
) -> np.ndarray:
    """Best split per node over this shard's features, as a ``SPLIT_DTYPE`` array [n_nodes].

    Parameters
    ----------
    hist : int64 [n_nodes, n_features_local, n_bins, 4]
        Histograms summed over all partitions for features
        ``feature_offset .. feature_offset + n_features_local - 1``.
    min_instances_per_node : int
        A child needs at least this many (unweighted) rows; never fewer than 1.
    min_info_gain : float
        Splits with a smaller gain are invalid.
    min_weight_per_node : float
        A child needs at least this weighted count (MLlib: minWeightFractionPerNode times
        the total training weight).
    feature_mask : bool [n_nodes, n_features_local], optional
        Features each node may split on (featureSubsetStrategy); all when None.
    scale : (center, target_exp, weight_exp), optional
        The fixed-point scale of ``hist``; ``(0, 0, 0)`` (plain numbers) when None.
    """
    hist = np.asarray(hist)
    if hist.ndim != 4 or hist.shape[3] != 4 or hist.dtype != np.int64:
        raise ValueError(
            f"hist must be int64 [nodes, features, bins, 4], got {hist.dtype} {hist.shape}"
        )
    n_nodes, n_feat, n_bins, _ = hist.shape
    if feature_mask is not None:
        feature_mask = np.asarray(feature_mask, dtype=bool)
        if feature_mask.shape != (n_nodes, n_feat):
            raise ValueError(f"feature_mask shape {feature_mask.shape} != ({n_nodes}, {n_feat})")
    _, target_exp, weight_exp = (0.0, 0, 0) if scale is None else scale
    min_weight_q = float(np.ldexp(float(min_weight_per_node), int(weight_exp)))
    out = np.zeros(n_nodes, dtype=SPLIT_DTYPE)
    out["gain"], out["feature"], out["bin"] = -np.inf, -1, -1
    if n_feat == 0 or n_bins == 0:
        return out
    out["total"] = hist[:, 0].sum(axis=1)
    search = gbt_jit.kernel()
    if search is not None:  # the same gains and choices, without the temporaries
        mask = np.ones((n_nodes, n_feat), bool) if feature_mask is None else feature_mask
        gain, feat = np.empty(n_nodes), np.empty(n_nodes, np.int64)
        bins, sides = np.empty(n_nodes, np.int64), np.zeros((2, n_nodes, 4), np.int64)
        search(
            np.ascontiguousarray(hist),
            max(int(min_instances_per_node), 1),
            min_weight_q,
            float(min_info_gain),
            2 * int(target_exp),
            np.ascontiguousarray(mask),
            gain,
            feat,
            bins,
            sides[0],
            sides[1],
        )
        out["gain"], out["bin"], out["left"], out["right"] = gain, bins, sides[0], sides[1]
        out["feature"] = np.where(feat >= 0, feat + int(feature_offset), -1)
        return out
    step = max(1, _CHUNK_CELLS // (n_feat * n_bins))
    for lo in range(0, n_nodes, step):  # loop over node chunks, bounded memory
        sl = slice(lo, min(lo + step, n_nodes))
        cum = np.cumsum(hist[sl], axis=2)
        mask = None if feature_mask is None else feature_mask[sl]
        gains = _chunk_gains(
            cum,
            max(int(min_instances_per_node), 1),
            min_weight_q,
            float(min_info_gain),
            int(target_exp),
            mask,
        ).reshape(cum.shape[0], n_feat * n_bins)
        best = np.argmax(gains, axis=1)  # first maximum: lowest feature, then lowest bin
        rows = np.arange(cum.shape[0])
        gain = gains[rows, best]
        ok = gain > -np.inf
        f_loc, b = np.divmod(best, n_bins)
        left = cum[rows, f_loc, b]
        sub = out[sl]
        sub["gain"] = gain
        sub["feature"] = np.where(ok, f_loc + int(feature_offset), -1)
        sub["bin"] = np.where(ok, b, -1)
        sub["left"] = np.where(ok[:, None], left, 0)
        sub["right"] = np.where(ok[:, None], cum[rows, 0, -1] - left, 0)
        out[sl] = sub
    return out


def merge_best(per_shard_results: Sequence[np.ndarray]) -> np.ndarray:
    """Global best split per node from every shard's :func:`best_splits` result.

    Highest gain wins; ties go to the lowest global feature index (a shard already broke
    ties by bin). Any shard order gives the same answer.
    """
    results = [np.asarray(r) for r in per_shard_results]
    if not results:
        raise ValueError("merge_best needs at least one shard result")
    shape = results[0].shape
    for r in results:
        if r.dtype != SPLIT_DTYPE or r.shape != shape:
            raise ValueError(f"shard results must be SPLIT_DTYPE arrays of shape {shape}")
    stacked = np.stack(results, axis=1)  # [n_nodes, n_shards]
    big = np.iinfo(np.int64).max
    feat_key = np.where(stacked["feature"] < 0, big, stacked["feature"].astype(np.int64))
    order = np.lexsort((feat_key, -stacked["gain"]), axis=-1)
    return stacked[np.arange(shape[0]), order[:, 0]]


def derive_children(
    parent_hist: np.ndarray, small_hist: np.ndarray, small_is_left: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """(left, right) child histograms from the parents' and the smaller children's histograms.

    The sibling is parent minus child, exact in int64, so workers only scan the rows of the
    smaller child of each split; a shard keeps the parents' histograms of its features and
    derives the siblings itself.
    """
    parent_hist = np.asarray(parent_hist)
    small_hist = np.asarray(small_hist)
    if parent_hist.shape != small_hist.shape:
        raise ValueError(f"parent {parent_hist.shape} and child {small_hist.shape} shapes differ")
    small_is_left = np.asarray(small_is_left, dtype=bool)
    if small_is_left.shape != parent_hist.shape[:1]:
        raise ValueError(f"small_is_left needs shape ({parent_hist.shape[0]},)")
    big = parent_hist - small_hist
    pick = small_is_left[:, None, None, None]
    return np.where(pick, small_hist, big), np.where(pick, big, small_hist)


def warm_up() -> None:
    """Load the compiled split search from numba's cache (a process's first search took
    0.4 s, measured: paid by the first GBT fit's root layer), on an empty histogram."""
    best_splits(np.zeros((1, 1, 2, 4), np.int64), 0, scale=(0.0, 0, 10))
