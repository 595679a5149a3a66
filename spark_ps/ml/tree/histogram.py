"""Per-layer GBDT histograms in exact fixed-point integers.

Why integers: the distributed trainer sums per-partition histograms on the PS in whatever
order they arrive. Float sums depend on that order, so split choices (and every later tree)
could change with the number of partitions. Each row's statistics are therefore rounded
*once*, on the worker, to int64 multiples of a power of two fixed before the tree starts; all
later sums (within a partition, across partitions, parent minus child, cumulative sums over
bins) are exact integer arithmetic and hence independent of order and partitioning.

Fixed-point layout (see :class:`FixedPointScale`)
-------------------------------------------------
A target ``y`` is first centred and scaled by a power of two, ``u = (y - center) * 2**-target_exp``
with ``|u| <= 1``; scaling by a power of two is exact in floating point (and labels +-1
map to ``u = +-1`` exactly, so a pure node's variance is exactly 0). Each row then carries
``round(w * 2**E)``, ``round(w*u * 2**E)`` and ``round(w*u*u * 2**E)`` with ``E = weight_exp``.
``E`` is chosen so that ``max_weight * 2**E < 2**(62 - k)`` with ``k = ceil(log2(n_rows))``.
Since ``|u| <= 1``, every per-row value lies in ``[-2**(62-k), 2**(62-k)]``, so any sum over at
most ``n_rows <= 2**k`` rows lies in ``[-2**62, 2**62]`` and never overflows int64. That covers
every quantity we form: per-partition and global bin sums, cumulative sums over bins, and a
sibling derived as parent minus child (itself a sum over a subset of rows; int64 wrap-around
in the intermediate subtraction cannot even occur because both operands are within 2**62).
For 1e8 rows (k = 27) each row keeps 35 bits relative to the largest weight, i.e. a relative
rounding error below 3e-11; for 1e5 rows it keeps 45 bits (3e-14).

Statistics axis (last axis, length 4): ``[raw count, sum w, sum w*u, sum w*u*u]``.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ps_server.functions.gbt import derive_children  # numpy-only; shards subtract too
from spark_ps.ml.tree.kernels import (
    HAVE_JIT,
    node_histogram_pass,
    quantize_pass,
)

__all__ = [
    "FixedPointScale",
    "STAT_COUNT",
    "STAT_WEIGHT",
    "STAT_SUM",
    "STAT_SUM_SQ",
    "build_histograms",
    "build_node_histograms",
    "choose_scale",
    "derive_children",
    "node_totals",
    "quantize_rows",
    "stats_to_moments",
    "unit_weight",
    "weight_exponent",
]

STAT_COUNT, STAT_WEIGHT, STAT_SUM, STAT_SUM_SQ = 0, 1, 2, 3
_BUDGET_BITS = 62


class FixedPointScale(NamedTuple):
    """How one tree's row statistics are rounded to integers (a plain tuple: cheap to ship).

    ``u = (y - center) * 2**-target_exp`` and every per-row statistic is multiplied by
    ``2**weight_exp`` before rounding.
    """

    center: float
    target_exp: int
    weight_exp: int


def weight_exponent(max_weight: float, n_rows: int) -> int:
    """Largest E with ``max_weight * 2**E < 2**(62 - ceil(log2 n_rows))`` (see module docstring)."""
    if not np.isfinite(max_weight) or max_weight < 0:
        raise ValueError(f"max_weight must be finite and >= 0, got {float(max_weight)}")
    if int(n_rows) < 1:
        raise ValueError(f"n_rows must be >= 1, got {n_rows!r}")
    k = (int(n_rows) - 1).bit_length()
    if max_weight == 0:
        return _BUDGET_BITS - k
    return _BUDGET_BITS - k - int(np.frexp(max_weight)[1])


def choose_scale(
    target_min: float, target_max: float, max_weight: float, n_rows: int
) -> FixedPointScale:
    """Fixed-point scale for one tree from bounds every worker can agree on beforehand.

    ``target_min``/``target_max``/``max_weight`` are exact (min/max merge in any order) and
    ``n_rows`` is the global number of rows that may contribute to a histogram.
    """
    if not (np.isfinite(target_min) and np.isfinite(target_max)) or target_min > target_max:
        raise ValueError(f"need finite target_min <= target_max, got {target_min}, {target_max}")
    center = 0.5 * float(target_min) + 0.5 * float(target_max)
    half = max(float(target_max) - center, center - float(target_min))
    target_exp = 0
    if half > 0:  # smallest power of two >= half, so labels +-1 map to u = +-1 exactly
        mant, exp = np.frexp(half)
        target_exp = int(exp) - 1 if mant == 0.5 else int(exp)
    return FixedPointScale(center, target_exp, weight_exponent(max_weight, n_rows))


def quantize_rows(targets: np.ndarray, weights: np.ndarray, scale: FixedPointScale) -> np.ndarray:
    """Per-row fixed-point statistics, int64 of shape (3, n): ``w``, ``w*u``, ``w*u*u``.

    Raises if a row breaks the bounds the scale was chosen from (that would risk overflow).
    """
    targets = np.asarray(targets, dtype=np.float64)
    weights = np.asarray(weights, dtype=np.float64)
    if targets.shape != weights.shape or targets.ndim != 1:
        raise ValueError(f"targets {targets.shape} and weights {weights.shape} must be equal 1-D")
    center, target_exp, weight_exp = scale
    if HAVE_JIT:
        fast = quantize_pass(targets, weights, center, int(target_exp), int(weight_exp))
        if fast is not None:
            return fast
    u = np.ldexp(targets - center, -target_exp)
    if u.size and not np.all(np.abs(u) <= 1.0):
        bad = int(np.argmax(~(np.abs(u) <= 1.0)))
        raise ValueError(f"target {float(targets[bad])} (row {bad}) lies outside the scale's range")
    wu = weights * u
    stats = np.ldexp(np.stack([weights, wu, wu * u]), weight_exp)
    if stats.size and not (np.all(weights >= 0) and stats[0].max() <= 2.0**_BUDGET_BITS):
        raise ValueError("weights must be >= 0 and within the max_weight the scale was built for")
    return np.rint(stats).astype(np.int64)


def unit_weight(weights: np.ndarray, scale: FixedPointScale) -> int | None:
    """``2**weight_exp`` if every weight is exactly 1 (lets histograms skip one pass), else None."""
    w = np.asarray(weights)
    if w.size and np.all(w == 1.0) and 0 <= scale.weight_exp < 63:
        return 1 << scale.weight_exp
    return None


def build_histograms(
    bins: np.ndarray,
    slot_of_row: np.ndarray,
    row_stats: np.ndarray,
    n_slots: int,
    n_bins: int,
    *,
    unit_weight: int | None = None,
) -> np.ndarray:
    """Histograms int64 ``[n_slots, n_features, n_bins, 4]`` for the rows with a slot.

    Parameters
    ----------
    bins : uint8/uint16 (n, f)
        Binned features; C order is fastest (the compiled pass reads a row's bins together,
        the numpy fallback prefers Fortran order).
    slot_of_row : int (n,)
        Histogram slot of each row (its node's position in this layer), -1 to skip the row
        (already in a leaf, subsampled out, or in a sibling derived by subtraction).
    row_stats : int64 (3, n)
        From :func:`quantize_rows`.
    unit_weight : int, optional
        If every weight is 1, pass :func:`unit_weight`'s value: sum w is then count * unit
        (saves the numpy fallback a pass, and the compiled pass reading the weight column).
    """
    bins = np.asarray(bins)
    n, f = bins.shape
    slot_of_row = np.asarray(slot_of_row)
    if slot_of_row.shape != (n,) or row_stats.shape != (3, n):
        raise ValueError(
            f"bins {bins.shape}, slot_of_row {slot_of_row.shape} and row_stats "
            f"{row_stats.shape} disagree on the number of rows"
        )
    if n and slot_of_row.max() >= n_slots:
        raise ValueError(f"slot_of_row has a slot >= n_slots={n_slots}")
    if HAVE_JIT:  # the layer kernel: row r's node is its slot, and node n_slots has none
        node = np.where(slot_of_row < 0, n_slots, slot_of_row).astype(np.int32)
        slot_of_node = np.append(np.arange(n_slots, dtype=np.int32), np.int32(-1))
        stats = np.asarray(row_stats, np.int64)
        return node_histogram_pass(
            bins, node, slot_of_node, np.ones(n, bool), stats, n_slots, n_bins, unit_weight
        )
    return _numpy_histograms(bins, slot_of_row, row_stats, n_slots, n_bins, unit_weight)


def build_node_histograms(
    bins: np.ndarray,
    node_of_row: np.ndarray,
    slot_of_node: np.ndarray,
    in_sample: np.ndarray,
    row_stats: np.ndarray,
    n_slots: int,
    n_bins: int,
    *,
    unit_weight: int | None = None,
) -> np.ndarray:
    """:func:`build_histograms` of a layer, the slot of row ``r`` being
    ``slot_of_node[node_of_row[r]]`` if ``in_sample[r]`` else -1 (what the tree workers have).
    """
    bins = np.asarray(bins)
    n = bins.shape[0]
    node_of_row = np.asarray(node_of_row, dtype=np.int32)
    slot_of_node = np.asarray(slot_of_node, dtype=np.int32)
    in_sample = np.asarray(in_sample, dtype=bool)
    if node_of_row.shape != (n,) or in_sample.shape != (n,) or row_stats.shape != (3, n):
        raise ValueError(
            f"bins {bins.shape}, node_of_row {node_of_row.shape}, in_sample {in_sample.shape} "
            f"and row_stats {row_stats.shape} disagree on the number of rows"
        )
    if n and (node_of_row.min() < 0 or node_of_row.max() >= slot_of_node.size):
        raise ValueError(f"node_of_row holds a node outside [0, {slot_of_node.size})")
    if slot_of_node.size and slot_of_node.max() >= n_slots:
        raise ValueError(f"slot_of_node has a slot >= n_slots={n_slots}")
    if not HAVE_JIT:
        slot = np.where(in_sample, slot_of_node[node_of_row], -1)
        return build_histograms(bins, slot, row_stats, n_slots, n_bins, unit_weight=unit_weight)
    stats = np.asarray(row_stats, np.int64)
    return node_histogram_pass(
        bins, node_of_row, slot_of_node, in_sample, stats, n_slots, n_bins, unit_weight
    )


def _numpy_histograms(bins, slot_of_row, row_stats, n_slots, n_bins, unit_weight):
    """The same histograms without numba: one bincount / ``np.add.at`` per feature."""
    n, f = bins.shape
    rows = np.flatnonzero(slot_of_row >= 0)
    every_row = rows.size == n
    base = slot_of_row[rows].astype(np.intp) * n_bins if n_slots > 1 else None
    q = row_stats if every_row else row_stats[:, rows]
    size = n_slots * n_bins
    out = np.zeros((f, 4, size), dtype=np.int64)  # contiguous per (feature, stat)
    first = STAT_SUM if unit_weight is not None else STAT_WEIGHT
    for j in range(f):  # loop over features: whole-array numpy per column
        col = bins[:, j] if every_row else bins[:, j][rows]  # 1-D take: 2x faster
        if col.size and int(col.max()) >= n_bins:
            raise ValueError(f"feature {j} has bin {int(col.max())} >= n_bins={n_bins}")
        idx = col.astype(np.intp) if base is None else base + col
        out[j, STAT_COUNT] = np.bincount(idx, minlength=size)
        if unit_weight is not None:
            np.multiply(out[j, STAT_COUNT], unit_weight, out=out[j, STAT_WEIGHT])
        for k in range(first, 4):
            np.add.at(out[j, k], idx, q[k - 1])  # exact int64 (bincount is float-only)
    return out.reshape(f, 4, n_slots, n_bins).transpose(2, 0, 3, 1).copy()


def node_totals(hist: np.ndarray) -> np.ndarray:
    """Per-node totals int64 [n_nodes, 4]: every row lands in one bin of every feature."""
    if hist.ndim != 4 or hist.shape[1] == 0:
        raise ValueError(f"need a [nodes, features>0, bins, 4] histogram, got {hist.shape}")
    return hist[:, 0].sum(axis=1)


def stats_to_moments(
    stats: np.ndarray, scale: FixedPointScale
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(raw count, weighted count, weighted mean, weighted variance) in target units.

    Mean is 0 and variance 0 where the weighted count is 0, as MLlib's Variance impurity does.
    """
    center, target_exp, weight_exp = scale
    stats = np.asarray(stats, dtype=np.int64)
    qw = stats[..., STAT_WEIGHT].astype(np.float64)
    s1 = stats[..., STAT_SUM].astype(np.float64)
    s2 = stats[..., STAT_SUM_SQ].astype(np.float64)
    nonzero = qw != 0
    safe = np.where(nonzero, qw, 1.0)
    mean_u = s1 / safe
    var_u = s2 / safe - mean_u * mean_u
    mean = np.where(nonzero, center + np.ldexp(mean_u, target_exp), 0.0)
    var = np.where(nonzero, np.ldexp(var_u, 2 * target_exp), 0.0)
    return stats[..., STAT_COUNT], np.ldexp(qw, -weight_exp), mean, var
