"""Per-partition losses and gradients of MLlib's linear objectives, in the standardized space.

Each function takes a localized batch (indices into the pulled keys), the standardized
coefficients of those keys and ``1/std`` (0 for constant features), and returns sums over
the rows (not divided by the weight), as MLlib's block aggregators accumulate them:

* :func:`squared_error` -- ``LeastSquaresBlockAggregator``: the label scaled by ``1/yStd``,
  features and label virtually centered (the intercept follows in closed form).
* :func:`hinge` -- ``HingeBlockAggregator``: ``max(0, 1 - (2y - 1) * margin)``.
* :func:`huber` -- ``HuberBlockAggregator``: the concomitant-scale Huber loss with its
  derivative in the scale ``sigma``.

The ``grad_offset`` each returns is the sum of the per-row multipliers: the intercept's
gradient, and the factor of the centering correction ``-scaled_mean * grad_offset``.
Kept free of pyspark so a worker imports only numpy and scipy.
"""

from __future__ import annotations

import numpy as np

from spark_ps.data import CSRBatch, DenseBatch
from spark_ps.ml.lr.objective import _scipy_csr

__all__ = ["squared_error", "hinge", "huber"]


def _design(csr: CSRBatch, coef: np.ndarray, inv_std: np.ndarray, where: str):
    """(X, labels, weights or None, effective coefficients) after the shape checks."""
    coef = np.asarray(coef, dtype=np.float64)
    inv_std = np.asarray(inv_std, dtype=np.float64)
    k = coef.shape[0]
    if coef.ndim != 1 or inv_std.shape != coef.shape:
        raise ValueError(
            f"{where}: coefficients {coef.shape} and inverse stds {inv_std.shape} must be 1-D "
            "of the same length"
        )
    if csr.labels is None:
        raise ValueError(f"{where}: the batch has no labels")
    if isinstance(csr, DenseBatch):
        if csr.num_features != k:
            raise ValueError(
                f"{where}: the batch has {csr.num_features} columns but {k} coefficients"
            )
    elif csr.nnz and int(csr.indices.max()) >= k:
        raise ValueError(
            f"{where}: batch indices reach {int(csr.indices.max())} but only {k} coefficients "
            "were given (is the batch localized?)"
        )
    return _scipy_csr(csr, k), csr.labels, csr.weights, coef * inv_std


def _finish(X, mult: np.ndarray, inv_std: np.ndarray) -> tuple[np.ndarray, float]:
    return (X.T @ mult) * inv_std, float(mult.sum())


def squared_error(
    csr: CSRBatch,
    coef: np.ndarray,
    inv_std: np.ndarray,
    *,
    offset: float,
    label_scale: float,
) -> tuple[float, np.ndarray, float, float]:
    """``(sum w*diff**2/2, gradient, sum w*diff, sum w)`` with ``diff = x_s . b + offset -
    y * label_scale``; ``offset`` is ``yMean/yStd - b . scaled_mean`` with an intercept,
    else 0, and ``label_scale`` is ``1/yStd``."""
    X, y, w, eff = _design(csr, coef, inv_std, "squared_error")
    diff = X @ eff
    diff += offset
    diff -= label_scale * y
    mult = diff if w is None else w * diff
    loss = 0.5 * float(np.dot(mult, diff))
    grad, grad_offset = _finish(X, mult, inv_std)
    return loss, grad, grad_offset, float(csr.n_rows if w is None else w.sum())


def hinge(
    csr: CSRBatch, coef: np.ndarray, inv_std: np.ndarray, *, offset: float
) -> tuple[float, np.ndarray, float, float]:
    """``(sum w*max(0, 1 - s*margin), gradient, sum of multipliers, sum w)``, ``s = 2y - 1``,
    ``margin = x_s . b + offset`` (``offset``: intercept minus ``b . scaled_mean``, or 0)."""
    X, y, w, eff = _design(csr, coef, inv_std, "hinge")
    w = np.ones(csr.n_rows) if w is None else w
    margin = X @ eff
    margin += offset
    s = 2.0 * y - 1.0
    slack = w * (1.0 - s * margin)
    active = (slack > 0) & (w > 0)
    loss = float(slack[active].sum())
    mult = np.where(active, -s * w, 0.0)
    grad, grad_offset = _finish(X, mult, inv_std)
    return loss, grad, grad_offset, float(w.sum())


def huber(
    csr: CSRBatch,
    coef: np.ndarray,
    inv_std: np.ndarray,
    *,
    offset: float,
    sigma: float,
    epsilon: float,
) -> tuple[float, np.ndarray, float, float, float]:
    """``(loss sum, gradient, sum of multipliers, sum w, d loss / d sigma)`` of MLlib's huber
    loss: ``w/2 * (sigma + r**2/sigma)`` where ``|r| <= sigma*epsilon``, else ``w/2 * (sigma +
    2*epsilon*|r| - sigma*epsilon**2)``, with ``r = y - margin``."""
    X, y, w, eff = _design(csr, coef, inv_std, "huber")
    w = np.ones(csr.n_rows) if w is None else w
    margin = X @ eff
    margin += offset
    r = y - margin
    inside = np.abs(r) <= sigma * epsilon
    z = r / sigma
    loss_in = sigma + r * z
    loss_out = sigma + 2.0 * epsilon * np.abs(r) - sigma * epsilon * epsilon
    loss = 0.5 * float(np.dot(w, np.where(inside, loss_in, loss_out)))
    mult = np.where(inside, -w * z, np.where(r >= 0, -epsilon, epsilon) * w)
    dsigma = 0.5 * float(np.dot(w, np.where(inside, 1.0 - z * z, 1.0 - epsilon * epsilon)))
    grad, grad_offset = _finish(X, mult, inv_std)
    return loss, grad, grad_offset, float(w.sum()), dsigma
