"""Metrics from score histograms, mergeable across tasks: a binned AUC and the sums one
task's predictions contribute to it and to a logloss.

Kept apart from :mod:`spark_ps.ml.online.metrics` (which builds Spark columns) so worker
code (GBT's and LR's validation AUC, FTRL's progressive metrics) imports numpy only. Scores fall in
``NUM_BINS`` equal bins of P(y=1) on [0, 1]; pairs within one bin count as ties (an AUC
error below one bin's share of pairs).
"""

from __future__ import annotations

import numpy as np

__all__ = ["NUM_BINS", "binned_auc", "partition_stats", "score_histograms"]

NUM_BINS = 1000


def score_histograms(margin: np.ndarray, labels: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """float64 [2 * NUM_BINS]: the weighted histograms of P(y=1) = sigmoid(``margin``) of
    the rows labelled 1 then of those labelled 0; summed over tasks, they give
    :func:`binned_auc` (``binned_auc(h[:NUM_BINS], h[NUM_BINS:])``)."""
    margin = np.asarray(margin, dtype=np.float64)
    with np.errstate(over="ignore"):
        prob = 1.0 / (1.0 + np.exp(-margin))
    bins = np.minimum((prob * NUM_BINS).astype(np.int64), NUM_BINS - 1)
    pos = np.bincount(bins, weights=weights * (labels == 1.0), minlength=NUM_BINS)
    neg = np.bincount(bins, weights=weights * (labels == 0.0), minlength=NUM_BINS)
    return np.concatenate([pos, neg]).astype(np.float64, copy=False)


def partition_stats(margin: np.ndarray, labels: np.ndarray, weights: np.ndarray) -> dict:
    """Sums and histograms of one task's progressive predictions (``margin`` = x.w + b)."""
    margin = np.asarray(margin, dtype=np.float64)
    hist = score_histograms(margin, labels, weights)
    loss = float(np.dot(weights, np.logaddexp(0.0, margin) - labels * margin))
    weight = float(weights.sum())
    return {"loss": loss, "weight": weight, "pos": hist[:NUM_BINS], "neg": hist[NUM_BINS:]}


def binned_auc(pos: np.ndarray, neg: np.ndarray) -> float:
    """Area under ROC from score histograms (NaN when one class is absent)."""
    pos, neg = np.asarray(pos, dtype=np.float64), np.asarray(neg, dtype=np.float64)
    p_tot, n_tot = pos.sum(), neg.sum()
    if p_tot <= 0 or n_tot <= 0:
        return float("nan")
    above = np.cumsum(pos[::-1])[::-1] - pos  # positives in strictly higher bins
    return float(np.dot(neg, above + 0.5 * pos) / (p_tot * n_tot))
