"""The linear models' worker rounds: ``dims`` and ``keys`` as LogisticRegression's, then
``linear_stats`` (feature and label statistics), ``linear_grad`` (one loss-and-gradient pass)
and ``linear_gram`` (the weighted Gram matrix of the normal equations' statistics).

No ``pyspark.ml`` in this import chain (see :mod:`spark_ps.ml.lr.rounds`).
"""

from __future__ import annotations

import math

import numpy as np

from spark_ps.ml._job import WorkerContext
from spark_ps.ml.linear import losses
from spark_ps.ml.lr.objective import _scipy_csr, feature_stats
from spark_ps.ml.lr.rounds import HANDLERS as _LR_HANDLERS
from spark_ps.ml.lr.rounds import compact

__all__ = ["HANDLERS", "LABEL_STATS"]

#: Columns of each partition's row of label statistics (rows summed across partitions).
LABEL_STATS = ("weight_sum", "label_sum", "label_m2", "label_min", "label_max", "n_bad")


def _label_row(y: np.ndarray, w: np.ndarray | None) -> list[float]:
    """Weight, weighted label sum, squared deviations from this partition's own weighted
    mean, min and max label over rows of positive weight (MLlib's summarizer skips weight 0),
    and the count of labels outside {0, 1}."""
    w = np.ones(y.size) if w is None else w
    pos = w > 0
    yp, wp = y[pos], w[pos]
    wsum = float(wp.sum())
    n_bad = float(np.count_nonzero((y != 0.0) & (y != 1.0)))
    if not yp.size or wsum <= 0:
        return [0.0, 0.0, 0.0, math.inf, -math.inf, n_bad]
    mean = float(np.dot(wp, yp)) / wsum
    dev = yp - mean
    return [wsum, float(np.dot(wp, yp)), float(np.dot(wp, dev * dev)), yp.min(), yp.max(), n_bad]


def _linear_stats(ctx: WorkerContext, round_: int, cmd: dict) -> None:
    """Per-key feature sums (with ``label_sums`` each key's ``sum w*y*x`` too) and extremes,
    as LogisticRegression's ``stats``, plus this partition's row of label statistics in a
    ``[num_workers, 6]`` block."""
    compact(ctx, cmd["keyset"])
    local = ctx.state["local"]
    with_labels = bool(cmd.get("label_sums"))  # the gradient at the start (fit._Solve.stats)
    p = feature_stats([local], with_labels=with_labels)
    gk = ctx.state["ids"][p.keys]
    columns = [p.count.astype(np.float64), p.s1, p.s2]
    sums = np.column_stack(columns + [p.label_sum] if with_labels else columns)
    ctx.tensor(cmd["sums"]).aggregate(gk, sums, round=round_, part=ctx.part)
    extremes = np.column_stack([p.vmax, -p.vmin])
    ctx.tensor(cmd["extremes"]).aggregate(gk, extremes, round=round_, part=ctx.part)
    labels = np.zeros((cmd["num_workers"], len(LABEL_STATS)))
    labels[ctx.part] = _label_row(local.labels, local.weights)
    head = [p.n_rows, p.weight_sum, p.weight_sq_sum]
    ctx.contribute(round_, np.concatenate([head, labels.ravel()]))


def _linear_grad(ctx: WorkerContext, round_: int, cmd: dict) -> None:
    """Loss and gradient of this partition at x for ``cmd["loss"]``; the gradient goes to g
    exactly once, with the multiplier sum at the intercept slot and the scale's derivative
    (times sigma: the solver's coordinate is log sigma) at the scale slot, when present."""
    keys, local = compact(ctx, cmd["keyset"])
    if ctx.state.get("linear_inv_std_name") != cmd["inv_std"]:
        ctx.state["linear_inv_std"] = ctx.tensor(cmd["inv_std"]).pull(keys)
        ctx.state["linear_inv_std_name"] = cmd["inv_std"]
    inv_std = ctx.state["linear_inv_std"]
    coef = ctx.tensor(cmd["x"]).pull(keys)
    loss, offset = cmd["loss"], cmd["offset"]
    extra_keys, extra = [], []
    if loss == "squaredError":
        scale = cmd["label_scale"]
        out = losses.squared_error(local, coef, inv_std, offset=offset, label_scale=scale)
    elif loss == "hinge":
        out = losses.hinge(local, coef, inv_std, offset=offset)
    else:
        sigma = cmd["sigma"]
        *out, dsigma = losses.huber(
            local, coef, inv_std, offset=offset, sigma=sigma, epsilon=cmd["epsilon"]
        )
        extra_keys.append(cmd["sigma_slot"])
        extra.append(dsigma * sigma)
    loss_sum, grad, grad_offset, wsum = out
    if cmd["intercept_slot"] >= 0:
        extra_keys.insert(0, cmd["intercept_slot"])
        extra.insert(0, grad_offset)
    if extra_keys:
        keys = np.append(keys, np.array(extra_keys, dtype=np.int64))
        grad = np.append(grad, extra)
    ctx.tensor(cmd["g"]).aggregate(keys, grad, round=round_, part=ctx.part)
    ctx.contribute(round_, [loss_sum, wsum, grad_offset])


def _linear_gram(ctx: WorkerContext, round_: int, cmd: dict) -> None:
    """This partition's weighted Gram matrix ``A^T W A`` of ``A = [X, 1, y]`` (features by
    compact id, then a column of ones, then the label) into the ``[k+2, k+2]`` PS matrix
    ``cmd["gram"]``, exactly once: the rows of this partition's keys and the last two."""
    ids, local = compact(ctx, cmd["keyset"])
    k = int(cmd["dim"])
    n = local.n_rows
    X = _scipy_csr(local, ids.size)
    w = np.ones(n) if local.weights is None else local.weights
    wx = X.multiply(w[:, None]).tocsr() if hasattr(X, "multiply") else X * w[:, None]
    xtwx = wx.T @ X
    xtwx = xtwx.toarray() if hasattr(xtwx, "toarray") else np.asarray(xtwx)
    y = local.labels
    tail = np.column_stack([np.asarray(wx.sum(axis=0)).reshape(-1), wx.T @ y])  # [m, 2]
    corner = np.array([[w.sum(), np.dot(w, y)], [np.dot(w, y), np.dot(w * y, y)]])
    cols = np.concatenate([ids, [k, k + 1]]).astype(np.int64)
    m = ids.size
    rows = np.zeros((m + 2, k + 2))
    rows[:m, cols[:m]] = xtwx
    rows[:m, k:] = tail
    rows[m:, cols[:m]] = tail.T
    rows[m:, k:] = corner
    ctx.tensor(cmd["gram"]).aggregate(cols, rows, round=round_, part=ctx.part)
    ctx.contribute(round_, [float(n)])


HANDLERS = {
    "dims": _LR_HANDLERS["dims"],
    "keys": _LR_HANDLERS["keys"],
    "linear_stats": _linear_stats,
    "linear_grad": _linear_grad,
    "linear_gram": _linear_gram,
}
