"""MLlib's binary logistic regression objective, piece by piece, for local or PS vectors.

MLlib (``LogisticRegression.train`` with ``BinaryLogisticBlockAggregator``) fits
in a standardized space: feature ``j`` is divided by its weighted unbiased
standard deviation ``std_j`` (constant features, ``std_j == 0``, are dropped and
keep coefficient 0) and, when an intercept is fitted, virtually centered by its
mean. It minimizes

    sum_i w_i * logloss(y_i, margin_i) / sum_i w_i
        + regParam * ((1 - alpha)/2 * sum_j s2_j * b_j**2 + alpha * sum_j s1_j * |b_j|)

over the standardized coefficients ``b`` and the unpenalized intercept, where
``s2_j = s1_j = 1`` with ``standardization=True`` and ``1/std_j**2`` resp.
``1/std_j`` otherwise (the same penalty on the original coefficients
``b_j / std_j``). Centering only moves the intercept (``b0' = b0 + sum_j
b_j * mean_j / std_j``), so the optimum is MLlib's; we center too so the solver
also walks MLlib's path.

How a distributed fit uses this module (``fit_binary_lr_local`` is the
reference on one machine):

1. ``feature_stats`` per partition, ``merge_stats`` to combine, ``finalize_stats``.
2. Vectors of dimension ``D (+1 intercept slot at index D)``: ``mean``, ``std``
   (0 at the intercept slot) and ``coef_mask`` (1, 0 at the intercept) ->
   ``build_lr_vectors``; ``initial_point`` fills the start point.
3. ``evaluate(x, g)``: ``offset = dot(x, scaled_mean)``; each worker pulls its
   keys' ``x`` and ``inv_std`` plus ``x[D]``, calls ``loss_and_grad`` with
   intercept ``x[D] - offset``, pushes ``grad_local`` into ``g`` for its keys and
   the intercept sum into ``g[D]``; the driver sums the scalars and calls
   ``finish_objective``.
4. ``minimize_lbfgs(space, evaluate, x, l1=vecs.l1_weight)``, then
   ``original_space`` for MLlib's coefficients and intercept.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import numpy as np

from spark_ps.data import DENSE_MAX_FEATURES, CSRBatch, DenseBatch
from spark_ps.ml import threads
from spark_ps.ml.lr import row_blocks, stats_pass
from spark_ps.ml.lr.optim import minimize_lbfgs
from spark_ps.ml.lr.vecspace import NumpyVecSpace, VecSpace

__all__ = [
    "StatsPartial",
    "FeatureStats",
    "feature_stats",
    "merge_stats",
    "finalize_stats",
    "label_sums",
    "loss_and_grad",
    "margins",
    "LRVectors",
    "build_lr_vectors",
    "initial_point",
    "finish_objective",
    "original_space",
    "local_objective",
    "fit_binary_lr_local",
]

log = logging.getLogger(__name__)
V = TypeVar("V")


# --------------------------------------------------------------------------- statistics


@dataclass
class StatsPartial:
    """Mergeable partial statistics of a set of rows, sparse in the feature keys.

    Per key (sorted unique ``keys``) over rows of positive weight: ``count`` of rows
    with a stored entry, ``s1 = sum w*x``, ``s2 = sum w*x**2`` (all combine by
    addition) and ``vmin``/``vmax`` of the stored values (combine by min/max).
    Keys never stored have all-zero columns. Scalars: ``n_rows`` (positive
    weight), ``weight_sum``, ``weight_sq_sum``, ``label_weight`` (weight of labels
    0 and 1), and the number / an example of labels that are neither. ``label_sum``
    (``sum w*y*x`` per key, adds up too) when :func:`feature_stats` is asked for it.
    """

    keys: np.ndarray
    count: np.ndarray
    s1: np.ndarray
    s2: np.ndarray
    vmin: np.ndarray
    vmax: np.ndarray
    num_features: int
    n_rows: int
    weight_sum: float
    weight_sq_sum: float
    label_weight: np.ndarray
    n_bad_labels: int = 0
    bad_label: float = math.nan
    label_sum: np.ndarray | None = None


@dataclass
class FeatureStats:
    """Final statistics as MLlib's summarizer reports them (weighted, unbiased std).

    ``mean``/``std``/``count`` are given for ``keys``; every other feature has mean
    and std 0. ``label_weight`` is MLlib's label histogram ``[w(y=0), w(y=1)]``.
    """

    keys: np.ndarray
    mean: np.ndarray
    std: np.ndarray
    count: np.ndarray
    num_features: int
    n_rows: int
    weight_sum: float
    weight_sq_sum: float
    label_weight: np.ndarray

    def dense(self, name: str) -> np.ndarray:
        """``mean``, ``std`` or ``count`` as a dense float64 array of ``num_features``."""
        out = np.zeros(self.num_features, dtype=np.float64)
        out[self.keys] = getattr(self, name)
        return out

    @property
    def constant_label(self) -> bool:
        """True when all the weight sits on one label (MLlib's ``isConstantLabel``)."""
        return int(np.count_nonzero(self.label_weight)) == 1


def _row_entries(batch: CSRBatch) -> tuple[np.ndarray | None, np.ndarray, np.ndarray]:
    """(row, key, value) of stored entries with duplicate keys of a row summed.

    Rows whose keys are strictly increasing (VectorUDT always) cost one check, and their
    row array is None (``batch.row_ids()`` gives it when a caller needs it).
    """
    idx, vals = batch.indices, batch.values
    if idx.size < 2:
        return None, idx, vals
    # a key not above its predecessor is a duplicate unless it starts a row; both position
    # lists are sorted, so a binary search tells (np.isin hashed them: 0.22 s of 0.42 s on
    # 500k rows x 30 keys, measured)
    down = np.flatnonzero(idx[1:] <= idx[:-1]) + 1
    if not down.size:
        return None, idx, vals
    starts = batch.indptr[1:-1]
    at = np.searchsorted(starts, down)  # sorted, as down is
    if at[-1] < starts.size and np.array_equal(starts[at], down):
        return None, idx, vals
    rows = batch.row_ids()
    order = np.lexsort((idx, rows))
    rows, idx, vals = rows[order], idx[order], vals[order]
    first = np.ones(idx.size, dtype=bool)
    first[1:] = (rows[1:] != rows[:-1]) | (idx[1:] != idx[:-1])
    starts = np.flatnonzero(first)
    return rows[starts], idx[starts], np.add.reduceat(vals, starts)


def _batch_weights(batch: CSRBatch) -> np.ndarray:
    if batch.weights is None:
        return np.ones(batch.n_rows, dtype=np.float64)
    w = batch.weights
    bad = ~np.isfinite(w) | (w < 0)
    if bad.any():
        i = int(np.argmax(bad))
        raise ValueError(
            f"instance weight {float(w[i])!r} at row {i} of the batch must be finite and >= 0"
        )
    return w


def _batch_stats(batch: CSRBatch, with_labels: bool = False) -> StatsPartial:
    """Partial statistics of one batch (`with_labels`: and its ``label_sum``): column
    reductions for dense rows, else one compiled pass over the entries (:mod:`stats_pass`),
    else one sort by key and segment reductions."""
    if batch.labels is None:
        raise ValueError("feature_stats: the batch has no labels")
    w = _batch_weights(batch)
    y = batch.labels
    pos = w > 0
    dense, wd, yd = (_dense_rows(batch, batch.num_features), w, y) if pos.all() else (None, w, y)
    if isinstance(batch, DenseBatch) and not pos.all():  # zero-weight rows do not count
        dense, wd, yd = batch.matrix[pos], w[pos], y[pos]
    if dense is not None:  # every row stores every column: column reductions, no scatter
        n, d = dense.shape
        sums = dict(
            keys=np.arange(d, dtype=np.int64),
            count=np.full(d, n, dtype=np.int64),
            s1=wd @ dense,
            s2=_weighted_square_sums(dense, wd),
            vmin=dense.min(axis=0) if n else np.full(d, np.inf),
            vmax=dense.max(axis=0) if n else np.full(d, -np.inf),
        )
        return _partial(batch, w, sums, (wd * yd) @ dense if with_labels else None)
    compiled = _compiled_stats(batch, w, with_labels)
    if compiled is not None:
        return compiled
    rows, idx, vals = _row_entries(batch)
    if not pos.all() or batch.weights is not None:
        rows = batch.row_ids() if rows is None else rows
    if not pos.all():  # zero-weight rows do not count
        keep = pos[rows]
        idx, vals, wr = idx[keep], vals[keep], w[rows[keep]]
    else:
        wr = None if batch.weights is None else w[rows]  # None: every weight is 1
    if idx.size and int(idx.min()) >= 0 and int(idx.max()) < 4 * idx.size + 1024:
        sums = _dense_key_sums(idx, vals, wr)
    else:
        sums = _sorted_key_sums(idx, vals, np.ones(idx.size) if wr is None else wr)
    by_key = None
    if with_labels:  # over the batch's own entries: a row's duplicate keys add up
        top = int(batch.indices.max()) + 1 if batch.nnz else 0
        by_key = label_sums(batch, top)[sums["keys"]]
    return _partial(batch, w, sums, by_key)


def _partial(batch: CSRBatch, w: np.ndarray, sums: dict, label_sum=None) -> StatsPartial:
    """A batch's StatsPartial from its per-key `sums` (its weights `w`, checked)."""
    y, pos = batch.labels, w > 0
    bad = (y != 0.0) & (y != 1.0)
    n_bad = int(np.count_nonzero(bad))
    return StatsPartial(
        **sums,
        num_features=batch.num_features,
        n_rows=int(np.count_nonzero(pos)),
        weight_sum=float(w.sum()),
        weight_sq_sum=float(np.dot(w, w)),
        label_weight=np.array([w[y == 0.0].sum(), w[y == 1.0].sum()], dtype=np.float64),
        n_bad_labels=n_bad,
        bad_label=float(y[np.argmax(bad)]) if n_bad else math.nan,
        label_sum=label_sum,
    )


def _compiled_stats(batch: CSRBatch, w: np.ndarray, with_labels: bool) -> StatsPartial | None:
    """:func:`_batch_stats` of a CSR batch with small key ids in one compiled pass, or None
    (no numba, a row whose keys do not increase, or ids too spread for a per-id table)."""
    if isinstance(batch, DenseBatch) or not stats_pass.available():
        return None
    idx = batch.indices
    top = int(idx.max()) if idx.size else -1
    if top < 0 or top >= 4 * idx.size + 1024 or int(idx.min()) < 0:
        return None
    units = row_blocks.unit_rows(batch.indptr, batch.values)
    table = stats_pass.key_sums(
        batch.indptr, idx, batch.values, units, batch.weights, batch.labels, top + 1
    )
    if table is None:
        return None
    batch._unit_rows = units if units.any() else None  # kept for the products (`_unit_rows`)
    keys = np.flatnonzero(table[:, 0])
    t = table[keys].T  # one gather: [6, K]
    sums = dict(keys=keys.astype(np.int64), count=t[0].astype(np.int64), s1=t[1], s2=t[2])
    sums.update(vmin=t[4], vmax=t[5])
    return _partial(batch, w, sums, t[3] if with_labels else None)


def _weighted_square_sums(dense: np.ndarray, w: np.ndarray, block: int = 8192) -> np.ndarray:
    """``sum_i w_i * x_ij**2`` per column, in row blocks (BLAS, a bounded temporary)."""
    out = np.zeros(dense.shape[1])
    for start in range(0, dense.shape[0], block):
        x = dense[start : start + block]
        out += w[start : start + block] @ (x * x)
    return out


def _sorted_key_sums(idx: np.ndarray, vals: np.ndarray, wr: np.ndarray) -> dict:
    """Per-key statistics by one sort and segment reductions (any key range)."""
    order = np.argsort(idx)
    idx, vals, wr = idx[order], vals[order], wr[order]
    starts = np.flatnonzero(np.concatenate([[True], idx[1:] != idx[:-1]])) if idx.size else idx
    wv = wr * vals
    return dict(
        keys=idx[starts],
        count=np.diff(np.append(starts, idx.size)).astype(np.int64),
        s1=_segment(np.add, wv, starts),
        s2=_segment(np.add, wv * vals, starts),
        vmin=_segment(np.minimum, vals, starts),
        vmax=_segment(np.maximum, vals, starts),
    )


def _dense_key_sums(idx: np.ndarray, vals: np.ndarray, wr: np.ndarray | None) -> dict:
    """Per-key statistics by counting, for localized (small, dense) key ids: no sort.

    ``wr`` None means unit weights. Hashed categorical data stores one value ``c`` (1.0)
    in almost every entry: when one value fills most entries, the sums follow from
    per-key (weighted) counts times ``c`` plus a correction over the other entries, and
    so do the min/max, so only those few entries are visited one by one.
    """
    count = np.bincount(idx)
    keys = np.flatnonzero(count)
    n = count.size
    c = float(vals[0]) if vals.size else 1.0
    odd = np.flatnonzero(vals != c)
    if 2 * odd.size > vals.size:  # no dominant value: plain sums (no cancellation risk)
        wv = vals if wr is None else wr * vals
        vmin, vmax = np.full(n, np.inf), np.full(n, -np.inf)
        np.minimum.at(vmin, idx, vals)
        np.maximum.at(vmax, idx, vals)
        s1 = np.bincount(idx, weights=wv, minlength=n)
        s2 = np.bincount(idx, weights=wv * vals, minlength=n)
        return _key_dict(keys, count, s1, s2, vmin, vmax)
    oi, ov = idx[odd], vals[odd]
    wsum = count.astype(np.float64) if wr is None else np.bincount(idx, wr, minlength=n)
    ow = ov - c if wr is None else wr[odd] * (ov - c)
    ow2 = ov * ov - c * c if wr is None else wr[odd] * (ov * ov - c * c)
    s1 = wsum * c + np.bincount(oi, ow, minlength=n)
    s2 = wsum * (c * c) + np.bincount(oi, ow2, minlength=n)
    has_c = (count - np.bincount(oi, minlength=n)) > 0  # some entry of the key stores c
    vmin = np.where(has_c, c, np.inf)
    vmax = np.where(has_c, c, -np.inf)
    np.minimum.at(vmin, oi, ov)
    np.maximum.at(vmax, oi, ov)
    return _key_dict(keys, count, s1, s2, vmin, vmax)


def _key_dict(keys, count, s1, s2, vmin, vmax) -> dict:
    """The StatsPartial fields of the touched ``keys`` from dense per-id arrays."""
    return dict(
        keys=keys.astype(np.int64),
        count=count[keys].astype(np.int64),
        s1=s1[keys],
        s2=s2[keys],
        vmin=vmin[keys],
        vmax=vmax[keys],
    )


def _segment(op: np.ufunc, values: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """``op`` reduced over the segments of ``values`` beginning at ``starts``."""
    if values.size == 0:
        return np.zeros(0, dtype=np.float64)
    return op.reduceat(values, starts)


def merge_stats(a: StatsPartial, b: StatsPartial) -> StatsPartial:
    """Combine two partials (associative and commutative up to float rounding)."""
    keys = np.union1d(a.keys, b.keys)
    ia, ib = np.searchsorted(keys, a.keys), np.searchsorted(keys, b.keys)
    label = (a.label_sum, b.label_sum)
    if (label[0] is None) != (label[1] is None):
        raise ValueError("merge_stats: one partial has label sums and the other not")

    def comb(fa: np.ndarray, fb: np.ndarray, empty: float, op: np.ufunc) -> np.ndarray:
        out = np.full(keys.shape[0], empty, dtype=fa.dtype)
        out[ia] = fa
        out[ib] = op(out[ib], fb)
        return out

    return StatsPartial(
        keys=keys,
        count=comb(a.count, b.count, 0, np.add),
        s1=comb(a.s1, b.s1, 0.0, np.add),
        s2=comb(a.s2, b.s2, 0.0, np.add),
        vmin=comb(a.vmin, b.vmin, np.inf, np.minimum),
        vmax=comb(a.vmax, b.vmax, -np.inf, np.maximum),
        num_features=max(a.num_features, b.num_features),
        n_rows=a.n_rows + b.n_rows,
        weight_sum=a.weight_sum + b.weight_sum,
        weight_sq_sum=a.weight_sq_sum + b.weight_sq_sum,
        label_weight=a.label_weight + b.label_weight,
        n_bad_labels=a.n_bad_labels + b.n_bad_labels,
        bad_label=a.bad_label if a.n_bad_labels else b.bad_label,
        label_sum=None if label[0] is None else comb(*label, 0.0, np.add),
    )


def feature_stats(batches: Iterable[CSRBatch], with_labels: bool = False) -> StatsPartial:
    """Partial statistics of a partition's batches (labels required, weights optional);
    `with_labels`: each key's ``sum w*y*x`` too (``StatsPartial.label_sum``)."""
    out: StatsPartial | None = None
    num_features = 0
    for batch in batches:
        num_features = max(num_features, batch.num_features)
        part = _batch_stats(batch, with_labels)
        out = part if out is None else merge_stats(out, part)
    if out is None:  # an empty partition
        empty = np.zeros(0)
        out = StatsPartial(
            keys=np.zeros(0, np.int64),
            count=np.zeros(0, np.int64),
            s1=empty,
            s2=empty,
            vmin=empty,
            vmax=empty,
            num_features=num_features,
            n_rows=0,
            weight_sum=0.0,
            weight_sq_sum=0.0,
            label_weight=np.zeros(2),
            label_sum=empty if with_labels else None,
        )
    return out


def finalize_stats(p: StatsPartial) -> FeatureStats:
    """Means and weighted unbiased stds exactly as MLlib's Summarizer defines them.

    ``var = sum w (x - mean)**2 / (W - sum w**2 / W)`` (0 when that denominator is
    not positive). A feature whose values (implicit zeros included) are all equal
    gets std exactly 0, as MLlib's online update gives, whatever the rounding of
    the sums. The sums lose relative precision ``~1e-16 * mean**2 / var``.
    """
    if p.n_bad_labels:
        raise ValueError(
            f"Labels MUST be in {{0, 1}} for binary logistic regression, but got "
            f"{p.bad_label!r} ({p.n_bad_labels} rows)"
        )
    if not p.weight_sum > 0:
        raise ValueError(f"the total instance weight is {p.weight_sum!r}; it must be positive")
    W = p.weight_sum
    mean = p.s1 / W
    denom = W - p.weight_sq_sum / W
    var = np.maximum((p.s2 - mean * p.s1) / denom, 0.0) if denom > 0 else np.zeros_like(mean)
    has_zero = p.count < p.n_rows
    lo = np.where(has_zero, np.minimum(p.vmin, 0.0), p.vmin)
    hi = np.where(has_zero, np.maximum(p.vmax, 0.0), p.vmax)
    var = np.where(lo == hi, 0.0, var)
    return FeatureStats(
        keys=p.keys,
        mean=mean,
        std=np.sqrt(var),
        count=p.count,
        num_features=p.num_features,
        n_rows=p.n_rows,
        weight_sum=W,
        weight_sq_sum=p.weight_sq_sum,
        label_weight=p.label_weight.copy(),
    )


# --------------------------------------------------------------------------- data term


def _scipy_csr(csr: CSRBatch, k: int):
    """The batch as a matrix for ``X @ w`` / ``X.T @ r`` (built once, cached on the batch).

    Rows that are all dense (every row holds the same k columns) become a dense float64
    array, so the products run in BLAS; otherwise a scipy CSR matrix, whose C matvec loops
    avoid the nnz-sized temporaries of a numpy gather/bincount (~3x faster on 15M nnz).
    """
    import scipy.sparse as sp

    cached = getattr(csr, "_scipy", None)
    if cached is None or cached.shape[1] != k:
        cached = _dense_rows(csr, k)
        if cached is None:
            cached = sp.csr_matrix((csr.values, csr.indices, csr.indptr), shape=(csr.n_rows, k))
        csr._scipy = cached
    return cached


def _dense_rows(csr: CSRBatch | DenseBatch, k: int) -> np.ndarray | None:
    """``[n, k]`` dense rows when every row stores the same k columns, else None."""
    if isinstance(csr, DenseBatch):
        return csr.matrix if csr.num_features == k else None
    n = csr.n_rows
    if n == 0 or k == 0 or csr.nnz != n * k or k > DENSE_MAX_FEATURES:
        return None
    cols = csr.indices.reshape(n, k)
    if not (
        np.all(np.diff(csr.indptr) == k)
        and np.array_equal(cols, np.broadcast_to(cols[0], cols.shape))
        and np.unique(cols[0]).size == k
    ):
        return None
    if np.array_equal(cols[0], np.arange(k)):
        return csr.values.reshape(n, k)  # already in column order: a view, no copy
    out = np.empty((n, k))
    out[:, cols[0]] = csr.values.reshape(n, k)
    return out


def margins(
    csr: CSRBatch | DenseBatch,
    coef_local: np.ndarray,
    intercept: float,
    inv_std_local: np.ndarray,
    fit_intercept: bool,
) -> np.ndarray:
    """float64 [n_rows]: ``X @ (coef * inv_std)`` plus ``intercept`` when ``fit_intercept``,
    the margins of a localized batch in the standardized space (see :func:`loss_and_grad`,
    which computes its loss from them)."""
    X = _scipy_csr(csr, coef_local.shape[0])
    margin = X @ (coef_local * inv_std_local)
    if fit_intercept:
        margin += intercept
    return margin


def loss_and_grad(
    csr: CSRBatch,
    coef_local: np.ndarray,
    intercept: float,
    inv_std_local: np.ndarray,
    fit_intercept: bool,
    *,
    rows: np.ndarray | None = None,
) -> tuple[float, np.ndarray, float, float]:
    """Weighted log loss of a localized batch and its gradient, in the standardized space.

    Parameters
    ----------
    csr : CSRBatch
        Localized (``CSRBatch.localize``): indices point into the pulled keys.
        Labels in {0, 1}; weights (validated by ``feature_stats``) default to 1.
    coef_local, inv_std_local : float64 [k]
        Standardized coefficients and ``1/std`` (0 for constant features) of the keys.
    intercept : float
        The margin offset: the intercept, minus ``dot(coef, scaled_mean)`` when
        centering. Ignored unless ``fit_intercept``.
    rows : int64 [nnz], optional
        ``csr.row_ids()``, if the caller keeps it with a batch it passes over often.

    Returns
    -------
    (loss_sum, grad_local, grad_intercept, weight_sum)
        Sums over rows, not divided by the weight: ``sum w*logloss``, its gradient
        for the keys (``inv_std * X^T r``, ``r = w*(sigmoid(margin) - y)``, without
        the centering correction), ``sum r`` (0 without intercept) and ``sum w``.
    """
    coef_local = np.asarray(coef_local, dtype=np.float64)
    inv_std_local = np.asarray(inv_std_local, dtype=np.float64)
    k = coef_local.shape[0]
    if coef_local.ndim != 1 or inv_std_local.shape != coef_local.shape:
        raise ValueError(
            f"loss_and_grad: coef_local {coef_local.shape} and inv_std_local "
            f"{inv_std_local.shape} must be 1-D of the same length"
        )
    if csr.labels is None:
        raise ValueError("loss_and_grad: the batch has no labels")
    y = csr.labels
    w = np.ones(csr.n_rows) if csr.weights is None else csr.weights
    if isinstance(csr, DenseBatch) and csr.num_features != k:
        raise ValueError(
            f"loss_and_grad: the batch has {csr.num_features} columns but {k} coefficients "
            "were given"
        )
    cached = getattr(csr, "_scipy", None)  # built (and checked) by an earlier call
    fresh = cached is None or cached.shape[1] != k
    if fresh and isinstance(csr, CSRBatch) and csr.nnz and int(csr.indices.max()) >= k:
        raise ValueError(
            f"loss_and_grad: batch indices reach {int(csr.indices.max())} but only {k} "
            "coefficients were given (is the batch localized?)"
        )
    # `rows` is no longer needed: scipy walks the CSR itself
    parts = min(threads.count(), max(1, csr.n_rows // THREAD_MIN_ROWS))
    coef_std = coef_local * inv_std_local
    weighted = csr.weights is not None

    def block(a: int, b: int, X) -> tuple[float, np.ndarray, float]:
        margin = X.matvec(coef_std) if isinstance(X, _RowRange) else X @ coef_std
        if fit_intercept:
            margin += intercept
        yb, wb = y[a:b], w[a:b]
        # log(1 + exp(-m)) for y = 1 and log(1 + exp(m)) for y = 0, as MLlib (label > 0).
        # A numpy sum, not a BLAS dot: an OpenBLAS call this size wakes helper threads that
        # then spin, taking a core from the partition beside this one.
        losses = np.logaddexp(0.0, np.where(yb > 0, -margin, margin))
        loss = float((wb * losses if weighted else losses).sum())
        with np.errstate(over="ignore"):
            r = wb * (1.0 / (1.0 + np.exp(-margin)) - yb)
        grad = X.rmatvec(r) if isinstance(X, _RowRange) else X.T @ r
        return loss, grad, float(r.sum())

    (loss_sum, grad, r_sum), *rest = threads.run(block, _row_blocks(csr, k, parts))
    for loss, g, rs in rest:  # in row order: the same sums for the same thread count
        loss_sum, grad, r_sum = loss_sum + loss, grad + g, r_sum + rs
    grad_intercept = r_sum if fit_intercept else 0.0
    return loss_sum, grad * inv_std_local, grad_intercept, float(w.sum())


#: Rows a thread takes at least when a task has several CPUs (``spark.task.cpus``): a
#: smaller batch's products run on one thread.
THREAD_MIN_ROWS = 32768


def label_sums(csr: CSRBatch, k: int) -> np.ndarray:
    """float64 [k]: ``X^T (w * y)``, each localized key's weighted sum of ``label * value``.

    With a key's ``s1 = sum w*x`` it gives the data gradient at MLlib's start point, where
    every margin is the start intercept b0: ``sum w*(sigmoid(b0) - y)*x = sigmoid(b0)*s1 -
    label_sums`` (see ``distributed._Fit.stats``), so no pass over the rows evaluates it."""
    if csr.labels is None:
        raise ValueError("label_sums: the batch has no labels")
    out = np.zeros(k)
    if not csr.n_rows or not k:
        return out
    wy = csr.labels if csr.weights is None else csr.weights * csr.labels
    parts = min(threads.count(), max(1, csr.n_rows // THREAD_MIN_ROWS))

    def block(a: int, b: int, X) -> np.ndarray:
        return X.rmatvec(wy[a:b]) if isinstance(X, _RowRange) else X.T @ wy[a:b]

    for part in threads.run(block, _row_blocks(csr, k, parts)):  # in row order
        out += part
    return out


def _row_blocks(csr: CSRBatch | DenseBatch, k: int, parts: int) -> list[tuple]:
    """``(first row, end row, matrix)`` of `parts` contiguous row blocks of the batch's
    product matrix (:func:`_scipy_csr`), for one thread each: row ranges of a dense matrix
    (numpy's products release the GIL) or of the CSR arrays (:mod:`row_blocks`' compiled
    products, which do too). No copies. A CSR batch with rows whose values are all 1.0
    takes the compiled products that skip reading them even on one thread (the same sums,
    faster); other batches take scipy's on one thread, as does everything without numba."""
    X = _scipy_csr(csr, k)
    if isinstance(X, np.ndarray):
        ranges = threads.ranges(csr.n_rows, parts) if parts > 1 else [(0, csr.n_rows)]
        return [(a, b, X[a:b]) for a, b in ranges]
    units = _unit_rows(csr)
    compiled = row_blocks.kernels(units is not None) if parts > 1 or units is not None else None
    if compiled is None:
        return [(0, csr.n_rows, X)]
    return [
        (a, b, _RowRange(X, k, a, b, compiled, units)) for a, b in threads.ranges(csr.n_rows, parts)
    ]


def _unit_rows(csr: CSRBatch) -> np.ndarray | None:
    """:func:`row_blocks.unit_rows` of the batch, or None when no row is all ones or numba
    is missing (worked out once, kept on the batch)."""
    if not hasattr(csr, "_unit_rows"):
        units = None
        if row_blocks.kernels() is not None and csr.nnz:
            units = row_blocks.unit_rows(csr.indptr, csr.values)
            units = units if units.any() else None
        csr._unit_rows = units
    return csr._unit_rows


class _RowRange:
    """Rows ``a <= r < b`` of a scipy CSR matrix, for :mod:`row_blocks`' products
    (`units`: the unit-row flags the products that take them need)."""

    def __init__(self, X, k: int, a: int, b: int, compiled, units=None) -> None:
        self.X, self.k, self.a, self.b = X, k, a, b
        self._matvec, self._rmatvec = compiled
        head = (X.indptr, X.indices, X.data)
        self._head = head if units is None else (*head, units)  # the arguments before v / x

    def matvec(self, v: np.ndarray) -> np.ndarray:
        out = np.empty(self.b - self.a)
        self._matvec(*self._head, v, self.a, self.b, out)
        return out

    def rmatvec(self, x: np.ndarray) -> np.ndarray:
        out = np.zeros(self.k)
        self._rmatvec(*self._head, np.ascontiguousarray(x), self.a, self.b, out)
        return out


# --------------------------------------------------------------------------- vectors


@dataclass
class LRVectors(Generic[V]):
    """Per-coordinate vectors of the standardized problem (dimension D [+1 intercept]).

    ``scaled_mean`` exists only with an intercept (virtual centering);
    ``l2_scale`` only when the L2 part is non-zero; ``l1_weight`` only when MLlib
    would run OWL-QN (``elasticNetParam != 0 and regParam != 0``).
    """

    fit_intercept: bool
    reg_l2: float
    inv_std: V
    scaled_mean: V | None
    l2_scale: V | None
    l1_weight: V | None

    def release(self, space: VecSpace) -> None:
        """Give every vector back to ``space``."""
        for v in (self.inv_std, self.scaled_mean, self.l2_scale, self.l1_weight):
            if v is not None:
                space.release(v)


def _check_params(reg_param: float, elastic_net: float) -> None:
    if not (reg_param >= 0 and math.isfinite(reg_param)):
        raise ValueError(f"regParam must be finite and >= 0, got {reg_param!r}")
    if not 0 <= elastic_net <= 1:
        raise ValueError(f"elasticNetParam must be in [0, 1], got {elastic_net!r}")


def build_lr_vectors(
    space: VecSpace,
    mean: Any,
    std: Any,
    coef_mask: Any,
    *,
    reg_param: float,
    elastic_net: float,
    standardization: bool,
    fit_intercept: bool,
    center: bool = True,
) -> LRVectors:
    """Derive MLlib's scaling, centering and penalty vectors with VecSpace kernels.

    ``mean``/``std`` hold the feature statistics (0 at the intercept slot) and
    ``coef_mask`` is 1 on coefficients, 0 on the intercept; the caller keeps them.
    ``center=False`` fits the intercept without virtual centering (MLlib does so when the
    intercept is bounded).
    """
    _check_params(reg_param, elastic_net)
    inv_std = space.new("lr.inv_std")
    space.apply("lr_inverse_std", inv_std, std)
    scaled_mean = None
    if fit_intercept and center:
        scaled_mean = space.new("lr.scaled_mean")
        space.apply("lr_scaled_mean", scaled_mean, mean, inv_std)
    reg_l2 = (1.0 - elastic_net) * reg_param
    reg_l1 = elastic_net * reg_param
    stdz = 1.0 if standardization else 0.0
    l2_scale = None
    if reg_l2 != 0.0:
        l2_scale = space.new("lr.l2_scale")
        space.apply("lr_l2_scale", l2_scale, std, coef_mask, standardization=stdz)
    l1_weight = None
    if elastic_net != 0.0 and reg_param != 0.0:
        l1_weight = space.new("lr.l1_weight")
        space.apply("lr_l1_weight", l1_weight, std, coef_mask, reg_l1=reg_l1, standardization=stdz)
    return LRVectors(fit_intercept, reg_l2, inv_std, scaled_mean, l2_scale, l1_weight)


def initial_point(
    space: VecSpace,
    x: Any,
    coef_mask: Any,
    label_weight: np.ndarray,
    fit_intercept: bool,
    intercept: float | None = None,
) -> float:
    """Fill ``x`` with MLlib's start: zero coefficients, intercept ``log(w1 / w0)`` (or
    `intercept`: a bounded fit's start, clipped into its box).

    With centering the start intercept would gain ``dot(0, scaled_mean) = 0``.
    Returns the start intercept (0 without one).
    """
    if not fit_intercept:
        space.fill(x, 0.0)
        return 0.0
    w0, w1 = float(label_weight[0]), float(label_weight[1])
    if intercept is not None:
        b0 = float(intercept)
    elif not (w0 > 0 and w1 > 0):
        raise ValueError(
            f"label weights {w0!r} (label 0) and {w1!r} (label 1): with one label only MLlib "
            "does not train (coefficients 0, intercept +-inf); check FeatureStats.constant_label"
        )
    else:
        b0 = math.log(w1 / w0)
    space.fill(x, b0)
    space.axpy(-b0, coef_mask, x)  # b0 - b0*1 == 0 exactly on coefficients
    return b0


def finish_objective(
    space: VecSpace,
    x: Any,
    g: Any,
    vecs: LRVectors,
    *,
    loss_sum: float,
    weight_sum: float,
    grad_intercept: float,
) -> float:
    """Turn the summed data term in ``g`` into MLlib's objective; return its value.

    On entry ``g`` holds the pushed sums (``grad_local`` per key, ``grad_intercept``
    in the intercept slot). Divides by the total weight, applies the centering
    correction ``-scaled_mean * grad_intercept / W`` and adds the L2 penalty.
    """
    if not weight_sum > 0:
        raise ValueError(f"the total instance weight of the pass is {weight_sum!r}")
    if vecs.scaled_mean is not None and vecs.l2_scale is not None:  # the usual case: one op
        return loss_sum / weight_sum + space.apply(
            "lr_finish",
            g,
            x,
            vecs.scaled_mean,
            vecs.l2_scale,
            inv_weight=1.0 / weight_sum,
            intercept_step=-grad_intercept / weight_sum,
            reg=vecs.reg_l2,
        )
    space.scale(1.0 / weight_sum, g)
    if vecs.scaled_mean is not None:
        space.axpy(-grad_intercept / weight_sum, vecs.scaled_mean, g)
    value = loss_sum / weight_sum
    if vecs.l2_scale is not None:
        value += space.apply("l2_penalty", g, x, vecs.l2_scale, reg=vecs.reg_l2)
    return value


def original_space(
    space: VecSpace, x: Any, vecs: LRVectors, intercept_value: float
) -> tuple[Any, float]:
    """(coefficients handle in the original feature space, intercept) of a solution.

    ``intercept_value`` is ``x[D]`` (0 without intercept). The returned handle has
    0 in the intercept slot; the caller releases it.
    """
    coef = space.new("lr.coefficients")
    space.apply("multiply", coef, x, vecs.inv_std)
    if not vecs.fit_intercept:
        return coef, 0.0
    if vecs.scaled_mean is None:  # fitted without centering
        return coef, intercept_value
    return coef, intercept_value - space.dot(x, vecs.scaled_mean)


# --------------------------------------------------------------------------- reference fit


def _as_batch(X: Any, y: Any, w: Any) -> CSRBatch:
    """A CSRBatch from a CSRBatch, a scipy.sparse matrix or a dense 2-D array."""
    if isinstance(X, CSRBatch):
        labels = X.labels if y is None else y
        weights = X.weights if w is None else w
        return CSRBatch(X.indptr, X.indices, X.values, X.num_features, labels, weights)
    if hasattr(X, "tocsr"):
        m = X.tocsr()
        return CSRBatch(m.indptr, m.indices, m.data, m.shape[1], y, w)
    a = np.asarray(X, dtype=np.float64)
    if a.ndim != 2:
        raise TypeError(
            f"X must be a CSRBatch, a scipy.sparse matrix or a 2-D array; got {a.shape}"
        )
    n, d = a.shape
    return CSRBatch(
        np.arange(n + 1, dtype=np.int64) * d,
        np.tile(np.arange(d, dtype=np.int64), n),
        a.ravel(),
        d,
        y,
        w,
    )


def _stat_vectors(space: NumpyVecSpace, stats: FeatureStats, fit_intercept: bool):
    D = stats.num_features
    pad = [0.0] if fit_intercept else []
    mean = space.from_array("lr.mean", np.concatenate([stats.dense("mean"), pad]))
    std = space.from_array("lr.std", np.concatenate([stats.dense("std"), pad]))
    mask = space.from_array("lr.coef_mask", np.concatenate([np.ones(D), pad]))
    return mean, std, mask


def local_objective(space: NumpyVecSpace, batch: CSRBatch, vecs: LRVectors) -> Callable:
    """``evaluate(x, g) -> f`` over one in-memory batch: what PS workers do, on one machine.

    The coefficient slots are ``0..D-1`` and the intercept (if any) is slot ``D``.
    """
    fit_intercept = vecs.fit_intercept
    D = space.dim - int(fit_intercept)
    keys, local = batch.localize()
    inv_std = space.to_numpy(vecs.inv_std)[keys]

    def evaluate(x: np.ndarray, g: np.ndarray) -> float:
        b = float(x[D]) - space.dot(x, vecs.scaled_mean) if fit_intercept else 0.0
        loss_sum, grad, gi, wsum = loss_and_grad(local, x[keys], b, inv_std, fit_intercept)
        space.fill(g, 0.0)
        g[keys] = grad
        if fit_intercept:
            g[D] = gi
        return finish_objective(
            space, x, g, vecs, loss_sum=loss_sum, weight_sum=wsum, grad_intercept=gi
        )

    return evaluate


def fit_binary_lr_local(
    X_csr: Any,
    y: Any,
    w: Any = None,
    *,
    reg_param: float = 0.0,
    elastic_net: float = 0.0,
    standardization: bool = True,
    fit_intercept: bool = True,
    max_iter: int = 100,
    tol: float = 1e-6,
    shards: int = 1,
) -> tuple[np.ndarray, float, list[float]]:
    """MLlib's binary LogisticRegression on one machine: (coefficients, intercept, history).

    Composes the pieces of this module with :class:`NumpyVecSpace` exactly as the
    PS version composes them with PS vectors; defaults are MLlib's. ``shards``
    splits the solver's vectors into that many slices, as PS shards would.
    """
    batch = _as_batch(X_csr, y, w)
    stats = finalize_stats(feature_stats([batch]))
    _check_params(reg_param, elastic_net)
    D = stats.num_features
    if fit_intercept and stats.constant_label:
        log.warning("all labels are the same value and fitIntercept=true: coefficients are 0")
        return np.zeros(D), math.inf if stats.label_weight[1] > 0 else -math.inf, [0.0]
    space = NumpyVecSpace(D + int(fit_intercept), shards=shards)
    mean, std, mask = _stat_vectors(space, stats, fit_intercept)
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
    x = space.new("lr.x")
    initial_point(space, x, mask, stats.label_weight, fit_intercept)
    for v in (mean, std, mask):
        space.release(v)
    evaluate = local_objective(space, batch, vecs)
    res = minimize_lbfgs(space, evaluate, x, max_iter=max_iter, tol=tol, m=10, l1=vecs.l1_weight)
    b = float(res.x[D]) if fit_intercept else 0.0
    coef_h, intercept = original_space(space, res.x, vecs, b)
    coef = space.to_numpy(coef_h)[:D]
    for v in (coef_h, res.x):
        space.release(v)
    vecs.release(space)
    return coef, intercept, res.objective_history
