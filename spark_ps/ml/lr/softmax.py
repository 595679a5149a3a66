"""MLlib's multinomial logistic regression objective, for local or PS matrices.

MLlib (``LogisticRegression.train`` with ``MultinomialLogisticBlockAggregator``) fits K
coefficient sets with no pivot class: the probability of class k is
``softmax(margin)_k`` with ``margin_k = x . beta_k + b_k``. As in the binary case
(:mod:`spark_ps.ml.lr.objective`) the fit runs in the standardized space (feature j
divided by its std, constant features dropped), virtually centered when an intercept is
fitted, and minimizes

    sum_i w_i * -log(softmax(margin_i)_{y_i}) / sum_i w_i
        + regParam * ((1 - alpha)/2 * sum_jk s2_j * b_jk**2 + alpha * sum_jk s1_j * |b_jk|)

with the intercepts unpenalized. The coefficients live as a ``[D (+1), K]`` matrix
stored row by row (MLlib's own training layout: index ``j*K + k``; the intercepts are the
last row), so the per-coordinate scaling and penalty vectors of the binary fit apply
unchanged once each feature's value is spread over its K columns, and the same L-BFGS /
OWL-QN solver runs on the flat values. Only the centering needs per-class sums
(``VecSpace.col_dots`` / ``col_axpy``).

MLlib's start point: zero coefficients, intercepts ``log1p(w_k) - mean_k log1p(w_k)`` from
the class weights ``w_k``. Its post-processing: intercepts centered (mean 0 over the
classes); without regularization the coefficients of each feature centered over the
classes too (the unregularized optimum is defined only up to such a shift).

``fit_multinomial_lr_local`` composes these pieces on one machine; the PS fit
(:mod:`spark_ps.ml.lr.multinomial`) composes them with PS matrices.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from spark_ps.data import CSRBatch, DenseBatch
from spark_ps.ml.lr.objective import (
    _as_batch,
    _check_params,
    _scipy_csr,
    build_lr_vectors,
    feature_stats,
    finalize_stats,
    finish_objective,
)
from spark_ps.ml.lr.optim import minimize_lbfgs
from spark_ps.ml.lr.vecspace import NumpyVecSpace

__all__ = [
    "class_weights",
    "softmax_loss_and_grad",
    "initial_intercepts",
    "finish_multinomial",
    "fit_multinomial_lr_local",
]


def class_weights(labels: np.ndarray, weights: np.ndarray | None, num_classes: int) -> np.ndarray:
    """MLlib's label histogram: the weight of each class 0..K-1 (labels already checked)."""
    y = labels.astype(np.int64)
    return np.bincount(y, weights=weights, minlength=num_classes).astype(np.float64)[:num_classes]


def softmax_loss_and_grad(
    csr: CSRBatch,
    coef_local: np.ndarray,
    offsets: np.ndarray,
    inv_std_local: np.ndarray,
    fit_intercept: bool,
) -> tuple[float, np.ndarray, np.ndarray, float]:
    """Weighted softmax loss of a localized batch and its gradient, in the standardized space.

    Parameters
    ----------
    csr : CSRBatch
        Localized (``CSRBatch.localize``); labels integers in [0, K), weights >= 0.
    coef_local : float64 [k, K]
        Standardized coefficients of the batch's keys, one row per key.
    offsets : float64 [K]
        The margin offsets: intercepts minus ``coef . scaled_mean`` when centering.
        Ignored unless ``fit_intercept``.
    inv_std_local : float64 [k]
        ``1/std`` (0 for constant features) of the keys.

    Returns
    -------
    (loss_sum, grad_local [k, K], grad_intercepts [K], weight_sum)
        Sums over rows (not divided by the weight); the gradient is
        ``inv_std * X^T R`` with multipliers ``R = w * (softmax(margin) - onehot(y))``
        (without the centering correction); ``grad_intercepts = sum_i R_i`` (0 without
        an intercept).
    """
    coef_local = np.asarray(coef_local, dtype=np.float64)
    k, K = coef_local.shape
    inv_std_local = np.asarray(inv_std_local, dtype=np.float64).reshape(-1)
    if inv_std_local.shape != (k,):
        raise ValueError(
            f"softmax_loss_and_grad: inv_std_local {inv_std_local.shape} must have one entry "
            f"per coefficient row ({k})"
        )
    if csr.labels is None:
        raise ValueError("softmax_loss_and_grad: the batch has no labels")
    n = csr.n_rows
    if isinstance(csr, CSRBatch) and csr.nnz and int(csr.indices.max()) >= k:
        raise ValueError(
            f"softmax_loss_and_grad: batch indices reach {int(csr.indices.max())} but only "
            f"{k} coefficient rows were given (is the batch localized?)"
        )
    if isinstance(csr, DenseBatch) and csr.num_features != k:
        raise ValueError(
            f"softmax_loss_and_grad: the batch has {csr.num_features} columns but {k} "
            "coefficient rows were given"
        )
    w = np.ones(n) if csr.weights is None else csr.weights
    y = csr.labels.astype(np.int64)
    X = _scipy_csr(csr, k)
    margins = np.asarray(X @ (coef_local * inv_std_local[:, None])).reshape(n, K)
    if fit_intercept:
        margins += np.asarray(offsets, dtype=np.float64)
    top = margins.max(axis=1, keepdims=True) if n else np.zeros((0, 1))
    e = np.exp(margins - top)
    total = e.sum(axis=1, keepdims=True)
    rows = np.arange(n)
    # -log softmax_y = log(sum exp(m)) - m_y, with the max taken out as MLlib's softmax does
    losses = np.log(total[:, 0]) + top[:, 0] - margins[rows, y]
    loss_sum = float((w * losses).sum())
    mult = e / total
    mult[rows, y] -= 1.0
    mult *= w[:, None]
    grad = np.asarray(X.T @ mult).reshape(k, K) * inv_std_local[:, None]
    grad_b = mult.sum(axis=0) if fit_intercept else np.zeros(K)
    return loss_sum, grad, grad_b, float(w.sum())


def initial_intercepts(class_weight: np.ndarray) -> np.ndarray:
    """MLlib's start intercepts: ``log1p`` of each class weight, centered over the classes."""
    raw = np.log1p(np.asarray(class_weight, dtype=np.float64))
    return raw - raw.sum() / raw.size


def finish_multinomial(
    coef: np.ndarray,
    intercepts: np.ndarray,
    *,
    reg_param: float,
    fit_intercept: bool,
    bounded: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """MLlib's post-processing of a multinomial solution in the original space.

    ``coef`` is ``[rows, K]`` (a row per feature). Without regularization each feature's
    coefficients are centered over the classes; the intercepts are centered when fitted.
    A bound-constrained solution is left as it is (centering could leave the box).
    """
    coef = np.array(coef, dtype=np.float64)
    b = np.array(intercepts, dtype=np.float64).reshape(-1)
    K = b.size
    if bounded:
        return coef, b
    if reg_param == 0.0 and coef.size:
        coef -= coef.sum(axis=1, keepdims=True) / K
    if fit_intercept:
        b -= b.sum() / K
    return coef, b


def constant_label_model(class_weight: np.ndarray) -> np.ndarray:
    """MLlib's intercepts when every weight sits on one class (fitIntercept, no training):
    +inf for that class, 0 for the others; the coefficients are all 0."""
    b = np.zeros(class_weight.size)
    b[int(np.argmax(class_weight))] = math.inf
    return b


# --------------------------------------------------------------------------- reference fit


def _local_objective(space: NumpyVecSpace, batch: CSRBatch, vecs: Any) -> Callable:
    """``evaluate(x, g) -> f`` over one in-memory batch, as the PS workers and driver do."""
    K, D = space.cols, space.dim - int(vecs.fit_intercept)
    keys, local = batch.localize()
    inv_std = space.to_numpy(vecs.inv_std).reshape(-1, K)[keys, 0]

    def evaluate(x: np.ndarray, g: np.ndarray) -> float:
        offsets = np.zeros(K)
        if vecs.fit_intercept:
            out = space.col_dots([(x, vecs.scaled_mean)], rows=[(x, D)])
            offsets = out[K:] - out[:K]
        coef = x.reshape(-1, K)[keys]
        loss, grad, gb, wsum = softmax_loss_and_grad(
            local, coef, offsets, inv_std, vecs.fit_intercept
        )
        space.fill(g, 0.0)
        g2 = g.reshape(-1, K)
        g2[keys] = grad
        if vecs.fit_intercept:
            g2[D] = gb
            space.col_axpy(-gb, vecs.scaled_mean, g)
        return finish_objective(
            space, x, g, vecs, loss_sum=loss, weight_sum=wsum, grad_intercept=0.0
        )

    return evaluate


def fit_multinomial_lr_local(
    X: Any,
    y: Any,
    num_classes: int,
    w: Any = None,
    *,
    reg_param: float = 0.0,
    elastic_net: float = 0.0,
    standardization: bool = True,
    fit_intercept: bool = True,
    max_iter: int = 100,
    tol: float = 1e-6,
    shards: int = 1,
) -> tuple[np.ndarray, np.ndarray, list[float]]:
    """MLlib's multinomial LogisticRegression on one machine: (coefficientMatrix [K, D],
    interceptVector [K], objective history). Defaults are MLlib's; labels in [0, K)."""
    batch = _as_batch(X, np.asarray(y, dtype=np.float64), w)
    _check_params(reg_param, elastic_net)
    K = int(num_classes)
    labels = batch.labels
    if np.any((labels < 0) | (labels >= K) | (labels != np.floor(labels))):
        raise ValueError(f"labels must be integers in [0, {K})")
    hist = class_weights(labels, batch.weights, K)
    binary_labels = CSRBatch(
        batch.indptr, batch.indices, batch.values, batch.num_features, np.zeros(batch.n_rows),
        batch.weights,
    )  # fmt: skip
    stats = finalize_stats(feature_stats([binary_labels]))  # the features' statistics only
    D = stats.num_features
    if fit_intercept and np.count_nonzero(hist) == 1:
        return np.zeros((K, D)), constant_label_model(hist), [0.0]
    rows = D + int(fit_intercept)
    space = NumpyVecSpace(rows, shards=shards, cols=K)
    pad = [0.0] if fit_intercept else []

    def spread(name: str, values: np.ndarray) -> np.ndarray:
        return space.from_array(name, np.repeat(np.concatenate([values, pad]), K))

    mean, std = spread("mean", stats.dense("mean")), spread("std", stats.dense("std"))
    mask = spread("coef_mask", np.ones(D))
    vecs = build_lr_vectors(
        space,
        mean,
        std,
        mask,
        reg_param=reg_param,
        elastic_net=elastic_net,
        standardization=standardization,
        fit_intercept=fit_intercept,
    )
    x = space.new("x")
    if fit_intercept:
        x.reshape(-1, K)[D] = initial_intercepts(hist)
    evaluate = _local_objective(space, batch, vecs)
    res = minimize_lbfgs(space, evaluate, x, max_iter=max_iter, tol=tol, m=10, l1=vecs.l1_weight)
    sol = res.x.reshape(-1, K)
    inv_std = space.to_numpy(vecs.inv_std).reshape(-1, K)
    coef = sol[:D] * inv_std[:D]
    b = np.zeros(K)
    if fit_intercept:
        b = sol[D] - space.col_dots([(res.x, vecs.scaled_mean)])
    coef, b = finish_multinomial(coef, b, reg_param=reg_param, fit_intercept=fit_intercept)
    return coef.T.copy(), b, res.objective_history
