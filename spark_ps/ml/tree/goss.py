"""Gradient-based one-side sampling (LightGBM's GOSS), an option of spark-ps's GBT.

Each tree grows from the rows with the largest ``|weight * target|`` (at least ``top_rate``
of the training rows) and a random ``other_rate`` share of all rows drawn from the rest,
whose weights are multiplied by ``rest / drawn`` so that the rest still counts its full
weight. Fewer rows reach the histograms (with the default rates ~30%), at some loss of
accuracy; the first ``1 / stepSize`` trees use every row, as LightGBM does, while the
residuals still carry little signal.

The selection does not depend on the partitioning: the "largest" rows are those above a
threshold read from a histogram of ``|w t|`` over :data:`BINS` equal bins, summed over the
partitions (exact integer counts), so a tie at the threshold is kept whole; the random draw
hashes each row's id (:func:`~spark_ps.ml.tree.binning.row_uniform`). Every worker derives
the same threshold and rate from the same counts.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from spark_ps.ml.tree.binning import row_uniform

__all__ = ["BINS", "GossSample", "active", "bins_of", "counts", "draw", "weight_bound"]

#: Bins of ``|w t|`` on ``[0, bound]`` whose summed counts fix the threshold.
BINS = 1024
#: Offset of the random draw's seed from the tree's, so it is not subsampling's draw.
_SEED_OFFSET = 0x6055


@dataclass(frozen=True)
class GossSample:
    """One tree's rows: which grow it, and their (amplified) weights."""

    in_sample: np.ndarray  # bool per row
    weights: np.ndarray  # float64 per row: w, or w * amplification for the rows drawn
    amplification: float


def active(top_rate: float, step_size: float, tree: int) -> bool:
    """Whether tree `tree` (0-based) samples: GOSS is on and the first ``1 / step_size``
    trees are grown (at least the first: its targets are the labels, all of one size)."""
    return top_rate > 0.0 and tree >= max(1, int(1.0 / step_size))


def weight_bound(top_rate: float, other_rate: float) -> float:
    """The largest factor a row's weight is multiplied by (the fixed-point scale is sized for
    it before the counts are known)."""
    return max(1.0, (1.0 - top_rate) / other_rate)


def bins_of(targets: np.ndarray, weights: np.ndarray, bound: float) -> np.ndarray:
    """Each row's bin of ``|w t|`` on ``[0, bound]`` (`bound` >= every row's value on every
    partition, e.g. the largest weight times the largest ``|t|``)."""
    size = np.abs(np.asarray(weights) * np.asarray(targets))
    if not bound > 0.0:
        return np.zeros(size.shape[0], dtype=np.int64)
    at = (size * (BINS / bound)).astype(np.int64)
    return np.minimum(at, BINS - 1, out=at)


def counts(bins: np.ndarray) -> np.ndarray:
    """Rows per bin, float64 (exact; what a partition contributes to the sum)."""
    return np.bincount(bins, minlength=BINS).astype(np.float64)


def draw(
    bins: np.ndarray,
    total: np.ndarray,
    weights: np.ndarray,
    row_ids: np.ndarray,
    top_rate: float,
    other_rate: float,
    seed: int,
) -> GossSample:
    """This partition's rows of the tree, from the counts `total` summed over partitions.

    The top bins down to the first that brings the kept rows to ``top_rate`` of all are
    kept; of the other rows each is drawn with probability ``other_rate * n / rest`` and its
    weight multiplied by the inverse (no draw when that is 1 or more)."""
    n = float(total.sum())
    above = np.cumsum(total[::-1])[::-1]  # rows in bin k and above
    first = int(np.flatnonzero(above >= top_rate * n)[-1]) if n else 0
    rest = n - above[first]
    top = bins >= first
    p = min(1.0, other_rate * n / rest) if rest > 0 else 1.0
    if p >= 1.0:
        return GossSample(np.ones(bins.shape[0], dtype=bool), np.asarray(weights), 1.0)
    drawn = ~top & (row_uniform(row_ids, seed + _SEED_OFFSET) < p)
    amp = min(1.0 / p, weight_bound(top_rate, other_rate))  # (not above it by a rounding)
    return GossSample(top | drawn, np.where(drawn, weights * amp, weights), amp)
