"""What each Spark task of an FM fit does: read its partition once, then answer ``dims`` and
``grad`` rounds (driver: :mod:`spark_ps.ml.fm.trainer`).

Kept apart from the driver so a worker's import chain holds no ``pyspark.ml``. All the math is
whole-batch numpy/scipy over the partition's CSR rows, localized to the keys they touch.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from spark_ps.data import CSRBatch, read_partition
from spark_ps.ml._job import WorkerContext

__all__ = ["HANDLERS", "setup_rows", "fm_forward", "fm_gradient", "sample_rows"]


def setup_rows(features_col: str, label_col: str, values_col: str | None):
    """The worker's read: its partition as a CSRBatch localized to the keys it touches."""

    def setup(batches, ctx: WorkerContext) -> None:
        csr = read_partition(batches, features_col, label_col=label_col, values_col=values_col)
        keys, local = csr.localize()
        ctx.state.update(rows=csr.n_rows, num_features=csr.num_features, keys=keys, local=local)

    return setup


def fm_forward(
    x: sp.csr_matrix, v: np.ndarray, w: np.ndarray | None, b: float
) -> tuple[np.ndarray, np.ndarray]:
    """(raw predictions [n], X @ V [n, k]) of an FM: ``b + X w + 1/2 sum_f ((XV)^2 - X^2 V^2)``."""
    xv = x @ v
    x2 = x.copy()
    x2.data = x2.data * x2.data
    raw = 0.5 * (np.einsum("ij,ij->i", xv, xv) - (x2 @ (v * v)).sum(axis=1))
    if w is not None:
        raw = raw + x @ w
    return raw + b, xv


def fm_gradient(
    x: sp.csr_matrix, v: np.ndarray, xv: np.ndarray, mult: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Sums over rows of ``mult * d raw / d theta``: (factors [m, k], linear [m]).

    d raw / d v_if = x_i (XV)_f - v_if x_i^2 and d raw / d w_i = x_i (MLlib's rawGradient).
    """
    xt = x.T.tocsr()
    x2t = xt.copy()
    x2t.data = x2t.data * x2t.data
    g_v = xt @ (mult[:, None] * xv) - v * (x2t @ mult)[:, None]
    return g_v, xt @ mult


def loss_and_multiplier(raw: np.ndarray, y: np.ndarray, loss: str) -> tuple[float, np.ndarray]:
    """Summed loss and d loss / d raw per row: logistic (labels 0/1) or squared error."""
    if loss == "logistic":
        e = np.exp(-np.abs(raw))
        p = np.where(raw >= 0, 1.0 / (1.0 + e), e / (1.0 + e))
        margin = np.where(y > 0, -raw, raw)  # MLlib: log1pExp(-raw) if y > 0 else log1pExp(raw)
        losses = np.logaddexp(0.0, margin)
        return float(losses.sum()), p - y
    r = raw - y
    return float(np.dot(r, r)), 2.0 * r


def sample_rows(n: int, fraction: float, seed: int, iteration: int, part: int) -> np.ndarray | None:
    """Rows of a partition in iteration `iteration`'s mini-batch (None: all of them).

    Bernoulli sampling without replacement, as MLlib's ``RDD.sample(false, fraction)``, from
    a generator seeded by (seed, iteration, partition): a retried task samples the same rows.
    """
    if fraction >= 1.0:
        return None
    rng = np.random.default_rng([seed & 0xFFFFFFFF, iteration, part])
    return np.flatnonzero(rng.random(n) < fraction)


def _batch(ctx: WorkerContext, cmd: dict) -> tuple[np.ndarray, CSRBatch]:
    """(global keys, batch localized to them) of this iteration's sampled rows."""
    keys, local = ctx.state["keys"], ctx.state["local"]
    take = sample_rows(local.n_rows, cmd["fraction"], cmd["seed"], cmd["iteration"], ctx.part)
    if take is None:
        return keys, local
    sub_ids, batch = local.take(take).localize()
    return keys[sub_ids], batch


def _grad(ctx: WorkerContext, round_: int, cmd: dict) -> None:
    """This partition's loss and gradient sums over its sampled rows, pushed to the factors
    and linear tensors as the exactly-once contribution (round, partition)."""
    gkeys, batch = _batch(ctx, cmd)
    n, m = batch.n_rows, gkeys.size
    if n == 0:
        ctx.contribute(round_, [0.0, 0.0])
        return
    nf, fit_linear, fit_intercept = cmd["num_features"], cmd["fit_linear"], cmd["fit_intercept"]
    factors, linear = ctx.tensor(cmd["factors"]), ctx.tensor(cmd["linear"])
    v = np.asarray(factors.pull(gkeys, unique=True), dtype=np.float64)
    v = v.reshape(m, cmd["factor_size"])
    lin_keys = np.append(gkeys, nf) if fit_linear else np.array([nf], dtype=np.int64)
    lin = np.asarray(linear.pull(lin_keys, unique=True), dtype=np.float64).reshape(-1)
    w = lin[:m] if fit_linear else None
    b = float(lin[-1]) if fit_intercept else 0.0
    x = sp.csr_matrix((batch.values, batch.indices, batch.indptr), shape=(n, m))
    raw, xv = fm_forward(x, v, w, b)
    loss, mult = loss_and_multiplier(raw, batch.labels, cmd["loss"])
    if cmd.get("loss_only"):
        ctx.contribute(round_, [loss, float(n)])
        return
    g_v, g_w = fm_gradient(x, v, xv, mult)
    factors.aggregate(gkeys, g_v, round=round_, part=ctx.part, unique=True)
    if fit_linear or fit_intercept:
        g_lin = np.append(g_w, mult.sum()) if fit_linear else np.array([mult.sum()])
        if not fit_intercept:
            lin_keys, g_lin = lin_keys[:-1], g_lin[:-1]
        linear.aggregate(lin_keys, g_lin, round=round_, part=ctx.part, unique=True)
    ctx.contribute(round_, [loss, float(n)])


def _dims(ctx: WorkerContext, round_: int, cmd: dict) -> None:
    """This partition's feature dimension and row count, at its own slot."""
    out = np.zeros((cmd["num_workers"], 2))
    out[ctx.part] = [ctx.state["num_features"], ctx.state["rows"]]
    ctx.contribute(round_, out.ravel())


HANDLERS = {"dims": _dims, "grad": _grad}
