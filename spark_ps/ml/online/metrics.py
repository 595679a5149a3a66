"""Progressive validation metrics: logloss and a binned AUC, mergeable across tasks.

Every task scores its rows before learning from them and returns sums (weighted logloss,
weight, rows) plus two weighted histograms of the predicted probability (``NUM_BINS`` equal
bins on [0, 1]: positives and negatives). Sums and histograms add up across tasks and
micro-batches, so the same numbers give the per-batch metrics in the query's progress (an
``observe`` over the task rows) and the running metrics on the learner. AUC from the bins
counts pairs within one bin as ties (error below one bin's share of pairs).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from pyspark.sql import Column
from pyspark.sql import functions as F

from spark_ps.ml.binned_metrics import NUM_BINS, binned_auc, partition_stats

__all__ = ["NUM_BINS", "partition_stats", "binned_auc", "observed_metrics", "RunningMetrics"]


def _summed(col: str) -> Column:
    """Element-wise sum of the ``col`` histograms of all task rows (an aggregate)."""
    return F.expr(
        f"aggregate(collect_list({col}), array_repeat(0D, {NUM_BINS}), "
        "(acc, h) -> zip_with(acc, h, (a, b) -> a + b))"
    )


def observed_metrics() -> list[Column]:
    """``observe`` expressions over the task rows of one micro-batch: rows, logloss, auc.

    The AUC expression is :func:`binned_auc` in SQL (walk the bins from the top, counting
    the positives above each negative). Divisions are ``try_divide``: a batch whose job did
    not run (a skipped replay) or that lacks a class reports NULL instead of failing the
    query under ANSI mode.
    """
    pos, neg = _summed("pos"), _summed("neg")
    walk = F.aggregate(
        F.reverse(F.arrays_zip(pos.alias("p"), neg.alias("n"))),
        F.struct(F.lit(0.0).alias("above"), F.lit(0.0).alias("pairs"), F.lit(0.0).alias("negs")),
        lambda s, x: F.struct(
            (s["above"] + x["p"]).alias("above"),
            (s["pairs"] + x["n"] * (s["above"] + 0.5 * x["p"])).alias("pairs"),
            (s["negs"] + x["n"]).alias("negs"),
        ),
        lambda s: F.try_divide(s["pairs"], s["above"] * s["negs"]),  # NULL if one class
    )
    return [
        F.sum("rows").alias("rows"),
        F.try_divide(F.sum("loss"), F.sum("weight")).alias("logloss"),
        walk.alias("auc"),
    ]


@dataclass
class RunningMetrics:
    """Sums over every micro-batch this learner has seen (driver side, a few KB)."""

    rows: int = 0
    weight: float = 0.0
    loss: float = 0.0
    pos: np.ndarray = field(default_factory=lambda: np.zeros(NUM_BINS))
    neg: np.ndarray = field(default_factory=lambda: np.zeros(NUM_BINS))

    def add(self, task_rows: list) -> dict:
        """Fold in one batch's task rows; returns that batch's own metrics."""
        rows = sum(int(r["rows"]) for r in task_rows)
        weight = sum(float(r["weight"]) for r in task_rows)
        loss = sum(float(r["loss"]) for r in task_rows)
        pos = np.sum([np.asarray(r["pos"]) for r in task_rows], axis=0)
        neg = np.sum([np.asarray(r["neg"]) for r in task_rows], axis=0)
        self.rows, self.weight, self.loss = self.rows + rows, self.weight + weight, self.loss + loss
        self.pos, self.neg = self.pos + pos, self.neg + neg
        return {
            "rows": rows,
            "logloss": loss / weight if weight > 0 else float("nan"),
            "auc": binned_auc(pos, neg),
        }

    def summary(self) -> dict:
        return {
            "rows": self.rows,
            "logloss": self.loss / self.weight if self.weight > 0 else float("nan"),
            "auc": binned_auc(self.pos, self.neg),
        }
