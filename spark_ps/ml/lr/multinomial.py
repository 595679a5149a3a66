"""Multinomial (softmax) logistic regression with the model on the PS: L-BFGS / OWL-QN.

The same barrier job, key numbering and solver as the binomial fit
(:mod:`spark_ps.ml.lr.distributed`); what changes is the model's shape. Every solver
vector is a ``[keys (+1 intercept row), K]`` PS matrix stored row by row (MLlib's
training layout, index ``j*K + k``): shards hold whole feature rows, so a worker's one
pull of its keys brings all K coefficients of each, and its gradient goes back as one
push of the same rows. The driver runs the solver over the flat values; the centering's
per-class sums are one ``linalg.col_dots`` and one ``linalg.col_axpy`` request per
evaluation. The objective, start point and post-processing are MLlib's (see
:mod:`spark_ps.ml.lr.softmax`). With bounds (``lower/upperBoundsOnCoefficients`` as a
``[K, numFeatures]`` matrix, ``lower/upperBoundsOnIntercepts`` of K entries) the solver is
the binomial fit's L-BFGS-B (:mod:`spark_ps.ml.lr.bounded`) over the flat values.
"""

from __future__ import annotations

import logging

import numpy as np

from spark_ps.context import PSContext
from spark_ps.ml._job import PSJob, best_effort
from spark_ps.ml._progress import Progress
from spark_ps.ml._recovery import FitRecovery
from spark_ps.ml.base import PreparedData
from spark_ps.ml.lr.bounded import BOUND_PARAMS, box_of
from spark_ps.ml.lr.distributed import (
    Zeros,
    _key_space,
    _KeySpace,
    _Phases,
    _resume_hooks,
    _timed,
    run_attempts,
    solve,
)
from spark_ps.ml.lr.estimator import TrainResult
from spark_ps.ml.lr.objective import build_lr_vectors, finish_objective
from spark_ps.ml.lr.optim import WARM
from spark_ps.ml.lr.ps_space import PSVecSpace
from spark_ps.ml.lr.softmax import constant_label_model, finish_multinomial, initial_intercepts
from spark_ps.models import PSMatrix, PSVector

__all__ = ["train_lbfgs_multinomial"]

log = logging.getLogger("spark_ps.ml.lr")


class _SoftmaxFit:
    """Driver side of one multinomial fit: the PS matrices and the rounds that fill them."""

    def __init__(self, job: PSJob, space: PSVecSpace, ks: _KeySpace, params: dict):
        self.job, self.space = job, space
        self.K, self.rows = space.cols, space.dim
        self.fit_intercept = bool(params["fitIntercept"])
        self.label_col = params["labelCol"]
        self.keyset = None if ks.keyset is None else ks.keyset.name

    def stats(self):
        """(mean, std spread over the K columns, class weights): the binomial fit's
        statistics round, plus each partition's class histogram and invalid labels."""
        space, ctx, rows = self.space, self.space.context, self.rows
        name = f"{space.prefix}/stats"
        sums = PSMatrix.dense(rows, 3, name=f"{name}/sums", context=ctx)
        extremes = PSMatrix.dense(rows, 2, name=f"{name}/extremes", context=ctx)
        mean_v = PSVector.dense(rows, name=f"{name}/mean", context=ctx)
        std_v = PSVector.dense(rows, name=f"{name}/std", context=ctx)
        try:
            r, out = self.job.call(
                "stats",
                keyset=self.keyset,
                sums=sums.name,
                extremes=extremes.name,
                num_classes=self.K,
            )
            sums.reduce(r)
            extremes.reduce(r, how="max")
            n_rows, wsum, wsq = out[0], out[1], out[2]
            n_invalid, hist = int(out[8]), np.asarray(out[9 : 9 + self.K])
            if n_invalid:
                raise ValueError(
                    f"Classification labels should be in [0 to {self.K - 1}]. Found "
                    f"{n_invalid} invalid labels in column {self.label_col!r} (labelCol)"
                )
            if not wsum > 0:
                raise ValueError(f"the total instance weight is {wsum!r}; it must be positive")
            ctx.client.call(
                "stats.standardize",
                [sums.spec, extremes.spec, mean_v.spec, std_v.spec],
                {"weight_sum": wsum, "weight_sq_sum": wsq, "n_rows": n_rows},
            )
            mean, std = space.new("mean"), space.new("std")
            space.spread(mean, mean_v)
            space.spread(std, std_v)
        finally:  # clean-up must not hide the round's own error (see best_effort)
            for t, what in (
                (sums, "sums"),
                (extremes, "extremes"),
                (mean_v, "mean"),
                (std_v, "std"),
            ):
                best_effort(f"dropping the statistics {what}", t.drop)
        return mean, std, hist

    def coef_mask(self):
        mask = self.space.new("coef_mask")
        mask.fill(1.0)
        if self.fit_intercept:
            mask.update(np.array([self.rows - 1]), np.zeros((1, self.K)))
        return mask

    def offsets(self, x, vecs) -> np.ndarray:
        """Per-class margin offsets: intercept minus ``coef_k . scaled_mean`` (one request;
        the intercepts themselves when not centered)."""
        if not self.fit_intercept:
            return np.zeros(self.K)
        if vecs.scaled_mean is None:  # bounded intercepts: no virtual centering
            return np.asarray(x.pull(np.array([self.rows - 1])), dtype=np.float64).reshape(-1)
        out = self.space.col_dots([(x, vecs.scaled_mean)], rows=[(x, self.rows - 1)])
        return out[self.K :] - out[: self.K]

    def objective(self, vecs):
        """evaluate(x, g) -> f: one distributed pass over all partitions."""
        K, space = self.K, self.space

        def evaluate(x, g) -> float:
            offsets = self.offsets(x, vecs)
            r, out = self.job.call(
                "softmax_grad",
                x=x.name,
                g=g.name,
                inv_std=vecs.inv_std.name,
                offsets=[float(v) for v in offsets],
                fit_intercept=self.fit_intercept,
                dim=self.rows,
                keyset=self.keyset,
            )
            loss, wsum, grad_b = float(out[0]), float(out[1]), np.asarray(out[5 : 5 + K])
            g.reduce(r)
            if vecs.scaled_mean is not None:  # the centering correction, per class
                space.col_axpy(-grad_b, vecs.scaled_mean, g)
            return finish_objective(
                space, x, g, vecs, loss_sum=loss, weight_sum=wsum, grad_intercept=0.0
            )

        return evaluate


def train_lbfgs_multinomial(
    prepared: PreparedData, params: dict, job: PSJob, dims: np.ndarray | None, phases: _Phases
) -> TrainResult:
    """Fit MLlib's multinomial objective on the PS (``params["numClasses"]`` classes).

    Recovery as the binomial fit's (`spark_ps.ml.lr.distributed.train_lbfgs_binomial`): set-up
    inside the attempt, so a shard restart at any moment redoes what it lost, and a warm
    restart from the iterate the driver held (up to 2^27 coefficients, keys x classes).
    `job`, `dims`, `phases`: as the binomial fit's."""
    ps = PSContext.getOrCreate(prepared.df.sparkSession)
    stamps: list[float] = []  # iteration timestamps, over every attempt
    return run_attempts(
        job,
        params,
        lambda built, prefix: _set_up(built, job, ps, prepared, params, phases, prefix, dims),
        lambda built, recovery, resume: _solve(built, stamps, params, phases, recovery, resume),
    )


def _set_up(
    built: dict,
    job: PSJob,
    ps,
    prepared: PreparedData,
    params: dict,
    phases,
    prefix: str,
    dims: np.ndarray | None = None,
) -> None:
    """Key space, statistics, the solver's constant matrices and start point, named under
    `prefix`, into `built` as they are made; built["result"] when one class is seen."""
    fit_intercept, K = bool(params["fitIntercept"]), int(params["numClasses"])
    built["ks"] = ks = _key_space(
        job, ps, prepared, phases, identity=True, prefix=prefix, dims=dims
    )
    space = built["space"] = PSVecSpace(ps, ks.size + int(fit_intercept), prefix=prefix, cols=K)
    fit = built["fit"] = _SoftmaxFit(job, space, ks, params)
    mean, std, hist = fit.stats()
    phases.mark("statistics")
    box = built["box"] = None
    if any(params.get(name) is not None for name in BOUND_PARAMS):
        keys, ids = ks.touched()
        stds = np.asarray(std.pull(np.arange(ks.size))).reshape(ks.size, K)[:, 0]
        box = box_of(params, ks.num_features, keys, ids, stds, fit_intercept, num_sets=K)
        built["box"] = box
    if fit_intercept and np.count_nonzero(hist) == 1 and box is None:  # MLlib trains if bounded
        log.warning("all labels are %d and fitIntercept=true: coefficients are 0", hist.argmax())
        empty = np.zeros((0, K))
        model = constant_label_model(hist)
        built["result"] = _result(ks, np.zeros(0, np.int64), empty, model, [0.0], 0)
        return
    mask = fit.coef_mask()
    built["vecs"] = build_lr_vectors(
        space,
        mean,
        std,
        mask,
        reg_param=params["regParam"],
        elastic_net=params["elasticNetParam"],
        standardization=params["standardization"],
        fit_intercept=fit_intercept,
        center=box is None or box.center,
    )
    x = built["x"] = space.new("x")
    if fit_intercept:
        x.update(np.array([space.dim - 1]), initial_intercepts(hist)[None, :])
    phases.mark("solver vectors")


def _solve(
    built: dict,
    stamps: list[float],
    params: dict,
    phases: _Phases,
    recovery: FitRecovery,
    resume: dict | None,
) -> TrainResult:
    """Run the solver from `built`'s start point, or from `resume` (a rollback's state),
    then read the coefficients back."""
    ks, space, fit, vecs = built["ks"], built["space"], built["fit"], built["vecs"]
    K, fit_intercept, x = fit.K, fit.fit_intercept, built["x"]
    if resume is not None and WARM in resume:  # a warm restart: x0 is the held iterate
        x.update(np.arange(space.dim, dtype=np.int64), np.asarray(resume[WARM]))
    bar = Progress("spark-ps LogisticRegression (multinomial)", int(params["maxIter"]))
    timed_evaluate, progress = _timed(fit.objective(vecs), stamps, phases, bar)

    box = built.get("box")
    zeros = Zeros(ks.num_features, K) if ks.dense_output else None
    try:  # a failed attempt ends its curve too
        res = solve(space, timed_evaluate, x, box, params, vecs.l1_weight, progress,
                    lambda: _resume_hooks(recovery, space, stamps, resume), stamps)  # fmt: skip
    finally:
        bar.close()
    phases.mark("iterations")
    built["x"] = res.x  # the solver's working vectors were swapped: release the live one
    intercepts = fit.offsets(res.x, vecs)
    coef_h = space.new("coefficients")
    space.apply("multiply", coef_h, res.x, vecs.inv_std)
    keys, ids = ks.touched()
    coef = coef_h.pull(ids).reshape(-1, K) if keys.size else np.zeros((0, K))
    space.release(coef_h)
    coef, intercepts = finish_multinomial(
        coef,
        intercepts,
        reg_param=params["regParam"],
        fit_intercept=fit_intercept,
        bounded=box is not None,
    )
    history = list(res.objective_history)
    result = _result(ks, keys, coef, intercepts, history, res.n_iter, zeros)
    result.iteration_timestamps = list(stamps)
    phases.mark("coefficients")
    result.phases = dict(phases.seconds)
    return result


def _result(
    ks: _KeySpace, keys, coef, intercepts, history, iters, zeros: Zeros | None = None
) -> TrainResult:
    """Dense ``[numFeatures, K]`` rows for small vector input (MLlib's dense matrix), else
    the rows of the keys with a non-zero coefficient."""
    K = coef.shape[1]
    if ks.dense_output:
        shape = (ks.num_features, K)
        dense = zeros.take(*shape) if zeros is not None else np.zeros(shape)
        dense[keys] = coef
        return TrainResult(dense, intercepts, history, iters, num_classes=K)
    nz = np.any(coef != 0.0, axis=1)
    return TrainResult(
        coef[nz],
        intercepts,
        history,
        iters,
        keys=keys[nz],
        num_features=ks.num_features,
        num_classes=K,
    )
