"""Full-batch L-BFGS / OWL-QN logistic regression with the model on the PS.

One barrier Spark job holds the data for the whole fit (see `spark_ps.ml._job`).
The driver runs the solver, but every vector it touches is a co-located PS vector
(`PSVecSpace`): the solver's algebra runs on the shards and only scalars come back.
Per function evaluation the workers pull the coefficients of the keys their
partition uses, compute the loss and gradient in numpy, and push the gradient as
their exactly-once contribution to that round.

Rounds (worker commands):
  ``dims``   each partition reports its feature dimension;
  ``stats``  per-key weighted sums for MLlib's standardization (sum and max reduces);
  ``grad``   loss and gradient at a point x (pulls x, pushes into g).
"""

from __future__ import annotations

import logging
import math
import time

import numpy as np

from spark_ps.context import PSContext
from spark_ps.data import read_partition
from spark_ps.ml._job import PSJob, WorkerContext
from spark_ps.ml.base import PreparedData
from spark_ps.ml.lr.estimator import TrainResult, register_trainer
from spark_ps.ml.lr.objective import (
    build_lr_vectors,
    feature_stats,
    finish_objective,
    initial_point,
    loss_and_grad,
    original_space,
)
from spark_ps.ml.lr.optim import minimize_lbfgs
from spark_ps.ml.lr.ps_space import PSVecSpace

__all__ = ["train_lbfgs"]

log = logging.getLogger("spark_ps.ml.lr")

_STATS = ("count", "s1", "s2")
_EXTREMES = ("vmax", "neg_vmin")


# ----------------------------------------------------------------------------- workers


def _setup(prepared: PreparedData):
    features, label, weight, values = (
        prepared.features_col,
        prepared.label_col,
        prepared.weight_col,
        prepared.values_col,
    )

    def setup(batches, ctx: WorkerContext) -> None:
        csr = read_partition(
            batches, features, label_col=label, weight_col=weight, values_col=values
        )
        keys, local = csr.localize()
        ctx.state.update(rows=csr.n_rows, num_features=csr.num_features, keys=keys, local=local)

    return setup


def _dims(ctx: WorkerContext, round_: int, cmd: dict) -> None:
    out = np.zeros(cmd["num_workers"])
    out[ctx.part] = ctx.state["num_features"]
    ctx.contribute(round_, out)


def _stats(ctx: WorkerContext, round_: int, cmd: dict) -> None:
    """Per-key sums (count, s1, s2) and extremes (max x, max -x) of this partition."""
    keys, local = ctx.state["keys"], ctx.state["local"]
    p = feature_stats([local])
    gk = keys[p.keys]
    for name in _STATS:
        ctx.tensor(cmd[name]).aggregate(
            gk, getattr(p, name).astype(np.float64), round=round_, part=ctx.part
        )
    ctx.tensor(cmd["vmax"]).aggregate(gk, p.vmax, round=round_, part=ctx.part)
    ctx.tensor(cmd["neg_vmin"]).aggregate(gk, -p.vmin, round=round_, part=ctx.part)
    ctx.contribute(
        round_, [p.n_rows, p.weight_sum, p.weight_sq_sum, *p.label_weight, p.n_bad_labels]
    )


def _grad(ctx: WorkerContext, round_: int, cmd: dict) -> None:
    """Loss and gradient of this partition at x; the gradient goes to g exactly once."""
    keys, local = ctx.state["keys"], ctx.state["local"]
    fit_intercept, dim = cmd["fit_intercept"], cmd["dim"]
    if ctx.state.get("inv_std_name") != cmd["inv_std"]:
        ctx.state["inv_std"] = ctx.tensor(cmd["inv_std"]).pull(keys)
        ctx.state["inv_std_name"] = cmd["inv_std"]
    coef = ctx.tensor(cmd["x"]).pull(keys)
    loss, grad, grad_b, wsum = loss_and_grad(
        local, coef, cmd["offset"], ctx.state["inv_std"], fit_intercept
    )
    g = ctx.tensor(cmd["g"])
    if fit_intercept:
        g.aggregate(np.append(keys, dim - 1), np.append(grad, grad_b), round=round_, part=ctx.part)
    else:
        g.aggregate(keys, grad, round=round_, part=ctx.part)
    ctx.contribute(round_, [loss, wsum, grad_b])


_HANDLERS = {"dims": _dims, "stats": _stats, "grad": _grad}


# ----------------------------------------------------------------------------- driver


class _Fit:
    """Driver side of one fit: the PS vectors and the rounds that fill them."""

    def __init__(self, job: PSJob, space: PSVecSpace, fit_intercept: bool):
        self.job, self.space, self.fit_intercept = job, space, fit_intercept
        self.dim = space.dim

    def stats(self):
        vecs = {n: self.space.new(n) for n in _STATS + _EXTREMES}
        r, out = self.job.call("stats", **{n: v.name for n, v in vecs.items()})
        for n in _STATS:
            vecs[n].reduce(r)
        for n in _EXTREMES:
            vecs[n].reduce(r, how="max")
        n_rows, wsum, wsq, w0, w1, n_bad = out
        if n_bad:
            raise ValueError(
                f"Labels MUST be in {{0, 1}} for binary logistic regression; "
                f"{int(n_bad)} rows have other labels"
            )
        if not wsum > 0:
            raise ValueError(f"the total instance weight is {wsum!r}; it must be positive")
        mean = self.space.new("mean")
        mean.copy_from(vecs["s1"])
        mean.scale(1.0 / wsum)
        std = self.space.new("std")
        std.apply(
            "weighted_std",
            vecs["s1"],
            vecs["s2"],
            vecs["count"],
            vecs["vmax"],
            vecs["neg_vmin"],
            weight_sum=wsum,
            weight_sq_sum=wsq,
            n_rows=n_rows,
        )
        for v in vecs.values():
            self.space.release(v)
        return mean, std, np.array([w0, w1])

    def coef_mask(self):
        mask = self.space.new("coef_mask")
        mask.fill(1.0)
        if self.fit_intercept:
            mask.update(np.array([self.dim - 1]), np.array([0.0]))
        return mask

    def objective(self, vecs):
        """evaluate(x, g) -> f: one distributed pass over all partitions."""
        last = self.dim - 1

        def evaluate(x, g) -> float:
            offset = 0.0
            if self.fit_intercept:
                offset = float(x.pull(np.array([last]))[0]) - x.dot(vecs.scaled_mean)
            r, (loss, wsum, grad_b) = self.job.call(
                "grad",
                x=x.name,
                g=g.name,
                inv_std=vecs.inv_std.name,
                offset=offset,
                fit_intercept=self.fit_intercept,
                dim=self.dim,
            )
            g.reduce(r)
            return finish_objective(
                self.space, x, g, vecs, loss_sum=loss, weight_sum=wsum, grad_intercept=grad_b
            )

        return evaluate


def _num_features(job: PSJob) -> int:
    _, sizes = job.call("dims", num_workers=job.num_workers)
    seen = sorted({int(s) for s in sizes if s > 0})
    if len(seen) > 1:
        raise ValueError(f"feature vectors have inconsistent sizes across partitions: {seen}")
    if not seen:
        raise ValueError("the training dataset is empty")
    return seen[0]


def train_lbfgs(prepared: PreparedData, params: dict) -> TrainResult:
    """Fit MLlib's binomial objective on the PS; the `lbfgs` trainer of LogisticRegression."""
    spark = prepared.df.sparkSession
    ps = PSContext.getOrCreate(spark)
    fit_intercept = bool(params["fitIntercept"])
    job = PSJob(
        ps,
        prepared.df,
        prepared.num_workers,
        _setup(prepared),
        _HANDLERS,
        name=f"LogisticRegression(maxIter={params['maxIter']})",
    )
    space = None
    with job:
        d = _num_features(job)
        space = PSVecSpace(ps, d + int(fit_intercept), prefix=job.topic)
        try:
            return _solve(job, space, d, fit_intercept, params)
        finally:
            space.release_all()


def _solve(job: PSJob, space: PSVecSpace, d: int, fit_intercept: bool, params: dict) -> TrainResult:
    fit = _Fit(job, space, fit_intercept)
    mean, std, label_weight = fit.stats()
    if fit_intercept and np.count_nonzero(label_weight) == 1:
        log.warning(
            "all labels are %s and fitIntercept=true: coefficients are 0", int(label_weight[1] > 0)
        )
        b = math.inf if label_weight[1] > 0 else -math.inf
        return TrainResult(np.zeros(d), b, [0.0], 0)
    mask = fit.coef_mask()
    vecs = build_lr_vectors(
        space,
        mean,
        std,
        mask,
        reg_param=params["regParam"],
        elastic_net=params["elasticNetParam"],
        standardization=params["standardization"],
        fit_intercept=fit_intercept,
    )
    x = space.new("x")
    initial_point(space, x, mask, label_weight, fit_intercept)
    t0 = time.perf_counter()

    def progress(info) -> None:
        log.info(
            "LogisticRegression iteration %d: loss %.6g (%.1fs)",
            info.iteration,
            info.value,
            time.perf_counter() - t0,
        )

    res = minimize_lbfgs(
        space,
        fit.objective(vecs),
        x,
        max_iter=params["maxIter"],
        tol=params["tol"],
        m=10,
        l1=vecs.l1_weight,
        callback=progress,
    )
    b = float(res.x.pull(np.array([d]))[0]) if fit_intercept else 0.0
    coef_h, intercept = original_space(space, res.x, vecs, b)
    coef = coef_h.pull()[:d]
    return TrainResult(coef, intercept, list(res.objective_history), res.n_iter)


register_trainer("lbfgs", train_lbfgs)
