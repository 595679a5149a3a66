"""MLlib's GBT losses, vectorized: LogLoss (classification), SquaredError, AbsoluteError.

MLlib boosts regression trees on pseudo-residuals ``-gradient(prediction, label)``. For
classification labels {0, 1} are first mapped to {-1, +1}; the margin ``F`` then gives
``P(y=1) = 1 / (1 + exp(-2F))`` and ``rawPrediction = [-F, F]``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from spark_ps.ml.tree.portable_exp import exp as portable_exp

__all__ = [
    "AbsoluteError",
    "LOSSES",
    "LogLoss",
    "Loss",
    "SquaredError",
    "get_loss",
    "log1p_exp",
    "margin_to_probability",
    "margin_to_raw_prediction",
    "remap_labels",
]


def log1p_exp(x: np.ndarray) -> np.ndarray:
    """``log(1 + exp(x))`` without overflow, with MLlib's branch (``MLUtils.log1pExp``)."""
    x = np.asarray(x, dtype=np.float64)
    # x > 0: x + log1p(exp(-x)); else 0.0 + log1p(exp(x)): the same bits, one exp and log1p
    return np.maximum(x, 0.0) + np.log1p(np.exp(-np.abs(x)))


@dataclass(frozen=True)
class Loss:
    """A boosting loss: ``gradient`` w.r.t. the prediction and the per-row ``error``."""

    name: str
    is_classification: bool

    def gradient(self, prediction: np.ndarray, label: np.ndarray) -> np.ndarray:
        """d loss / d prediction, per row."""
        raise NotImplementedError

    def error(self, prediction: np.ndarray, label: np.ndarray) -> np.ndarray:
        """Loss value per row (MLlib's ``computeError``)."""
        raise NotImplementedError

    def target_bounds(self, tree: int) -> tuple[float, float] | None:
        """Bounds every target of tree `tree` lies within whatever the data, or None.

        Known bounds fix the tree's fixed-point scale without looking at the rows, so the
        workers need not agree on their targets' min and max first (one round a tree)."""
        return None


class _LogLoss(Loss):
    """Twice the binomial negative log likelihood: ``2 log(1 + exp(-2 y F))``, y in {-1, 1}."""

    def gradient(self, prediction: np.ndarray, label: np.ndarray) -> np.ndarray:
        # the trees grow from these: one exp, the same bits on every CPU
        return -4.0 * label / (1.0 + portable_exp(2.0 * label * prediction))

    def error(self, prediction: np.ndarray, label: np.ndarray) -> np.ndarray:
        return 2.0 * log1p_exp(-2.0 * label * prediction)

    def target_bounds(self, tree: int) -> tuple[float, float] | None:
        # tree 0 fits the labels -1/+1; later ones |4 / (1 + exp(2 y F))| <= 4
        return (-1.0, 1.0) if tree == 0 else (-4.0, 4.0)


class _SquaredError(Loss):
    """``(y - F)**2``; gradient ``-2 (y - F)``."""

    def gradient(self, prediction: np.ndarray, label: np.ndarray) -> np.ndarray:
        return -2.0 * (label - prediction)

    def error(self, prediction: np.ndarray, label: np.ndarray) -> np.ndarray:
        err = label - prediction
        return err * err


class _AbsoluteError(Loss):
    """``|y - F|``; gradient ``sign(F - y)`` with MLlib's choice of -1 at ``y == F``."""

    def gradient(self, prediction: np.ndarray, label: np.ndarray) -> np.ndarray:
        return np.where(label - prediction < 0, 1.0, -1.0)

    def error(self, prediction: np.ndarray, label: np.ndarray) -> np.ndarray:
        return np.abs(label - prediction)

    def target_bounds(self, tree: int) -> tuple[float, float] | None:
        return None if tree == 0 else (-1.0, 1.0)  # tree 0 fits the labels themselves


LogLoss: Loss = _LogLoss("logistic", True)
SquaredError: Loss = _SquaredError("squared", False)
AbsoluteError: Loss = _AbsoluteError("absolute", False)
LOSSES: dict[str, Loss] = {loss.name: loss for loss in (LogLoss, SquaredError, AbsoluteError)}


def get_loss(loss_type: str) -> Loss:
    """The loss for MLlib's ``lossType`` ("logistic", "squared" or "absolute", any case)."""
    key = str(loss_type).lower()
    if key not in LOSSES:
        raise ValueError(f"lossType {loss_type!r} is not supported; use one of {sorted(LOSSES)}")
    return LOSSES[key]


def remap_labels(labels: np.ndarray) -> np.ndarray:
    """Classification labels {0, 1} -> {-1, +1} (``2y - 1``), rejecting anything else."""
    y = np.asarray(labels, dtype=np.float64)
    bad = ~((y == 0.0) | (y == 1.0))
    if bad.any():
        i = int(np.argmax(bad))
        raise ValueError(f"GBT classification needs labels 0 or 1; row {i} has label {float(y[i])}")
    return y * 2.0 - 1.0


def margin_to_raw_prediction(margin: np.ndarray) -> np.ndarray:
    """``rawPrediction`` rows ``[-F, F]``."""
    m = np.asarray(margin, dtype=np.float64)
    return np.stack([-m, m], axis=-1)


def margin_to_probability(margin: np.ndarray) -> np.ndarray:
    """``probability`` rows as MLlib computes them: ``p0 = 1/(1+exp(2F))``, ``p1 = 1 - p0``."""
    m = np.asarray(margin, dtype=np.float64)
    with np.errstate(over="ignore"):
        p0 = 1.0 / (1.0 + np.exp(-2.0 * -m))
    return np.stack([p0, 1.0 - p0], axis=-1)
