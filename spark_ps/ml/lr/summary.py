"""Summaries of spark-ps LogisticRegression: MLlib's summary classes over our predictions.

Each summary *is* a pyspark.ml summary (``isinstance`` checks keep working) backed by MLlib's
JVM summary implementation built over our ``transform`` output, so areaUnderROC, roc, pr,
accuracy and the by-label/weighted metrics are MLlib's numbers, computed on the JVM with no
per-row Python. Only the optimizer trace (objectiveHistory, totalIterations) comes from our
trainer.
"""

from __future__ import annotations

from collections.abc import Sequence

from pyspark.ml import classification as _mllib
from pyspark.sql import DataFrame

from spark_ps import _jvm
from spark_ps.ml._plot import PlotsHistory

__all__ = [
    "LogisticRegressionSummary",
    "LogisticRegressionTrainingSummary",
    "BinaryLogisticRegressionSummary",
    "BinaryLogisticRegressionTrainingSummary",
    "make_summary",
]


class LogisticRegressionSummary(_mllib.LogisticRegressionSummary):
    """Multiclass LR results on a dataset (MLlib's attributes and numbers)."""


class BinaryLogisticRegressionSummary(_mllib.BinaryLogisticRegressionSummary):
    """Binary LR results on a dataset: MLlib's attributes, e.g. ``areaUnderROC``, ``roc``."""


class _TrainingTrace(PlotsHistory):
    """Objective history and iteration count reported by our trainer, not by the JVM."""

    _objective_history: list[float]
    _total_iterations: int

    @property
    def objectiveHistory(self) -> list[float]:
        """Objective (scaled loss + regularization) at each iteration, initial state first."""
        return list(self._objective_history)

    @property
    def totalIterations(self) -> int:
        """Number of training iterations until termination."""
        return self._total_iterations

    @property
    def iterationTimestamps(self) -> list[float]:
        """Seconds since the fit started at each `objectiveHistory` entry (spark-ps only)."""
        return list(getattr(self, "_iteration_timestamps", []))


class LogisticRegressionTrainingSummary(
    _TrainingTrace, LogisticRegressionSummary, _mllib.LogisticRegressionTrainingSummary
):
    """Multiclass LR training results: MLlib's metrics plus our optimizer trace."""


class BinaryLogisticRegressionTrainingSummary(
    _TrainingTrace, BinaryLogisticRegressionSummary, _mllib.BinaryLogisticRegressionTrainingSummary
):
    """Binary LR training results: MLlib's metrics plus our optimizer trace. Its dataset is
    the training rows (without those ``validationIndicatorCol`` holds out)."""

    @property
    def validationAucHistory(self) -> list[float]:
        """Area under ROC of the validation rows (``validationIndicatorCol`` true) after each
        iteration, one value per iteration (aligned with ``objectiveHistory[1:]``; NaN when
        the validation rows hold one label only); empty without ``validationIndicatorCol``
        (spark-ps only).

        Computed by the workers from score histograms of P(y=1) in 1000 equal bins on
        [0, 1] (``spark_ps.ml.binned_metrics``): rows of different labels in one bin count
        as ties (counted half), so it differs from the exact AUC by at most half the share
        of positive/negative pairs that fall in a common bin.
        """
        return list(getattr(self, "_validation_auc", []))


def make_summary(
    predictions: DataFrame,
    *,
    num_classes: int,
    probability_col: str,
    prediction_col: str,
    label_col: str,
    features_col: str,
    weight_col: str,
    objective_history: Sequence[float] | None = None,
    total_iterations: int | None = None,
) -> LogisticRegressionSummary:
    """Build the summary MLlib would build for these predictions.

    Parameters
    ----------
    predictions
        The model's ``transform`` output; it must hold ``probability_col`` and
        ``prediction_col`` (the model generates them when its own Params are empty).
    weight_col
        MLlib passes ``"weightCol"`` when the Param is undefined; a name absent from
        ``predictions`` means unit weights.
    objective_history, total_iterations
        Given for a training summary, None for ``evaluate``.
    """
    binary = num_classes <= 2
    build = _jvm.binary_lr_summary if binary else _jvm.multiclass_lr_summary
    java = build(predictions, probability_col, prediction_col, label_col, features_col, weight_col)
    if objective_history is None:
        cls = BinaryLogisticRegressionSummary if binary else LogisticRegressionSummary
        return cls(java)
    cls = BinaryLogisticRegressionTrainingSummary if binary else LogisticRegressionTrainingSummary
    summary = cls(java)
    summary._objective_history = [float(v) for v in objective_history]
    summary._total_iterations = (
        int(total_iterations)
        if total_iterations is not None
        else len(summary._objective_history) - 1
    )
    return summary
