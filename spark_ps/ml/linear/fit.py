"""Full-batch L-BFGS / OWL-QN fits of MLlib's LinearRegression and LinearSVC on the PS.

The same machinery as :mod:`spark_ps.ml.lr.distributed`: one barrier Spark job holds the
data, the solver (:func:`~spark_ps.ml.lr.optim.minimize_lbfgs`) runs on the driver over
co-located PS vectors, and each evaluation is one worker round that pulls the coefficients
of the keys a partition touches and pushes its gradient exactly once. Only the loss differs
(:mod:`spark_ps.ml.linear.losses`), and with it the layout of the solver's vector:

* squared error: ``K`` coefficient slots (the intercept is MLlib's closed form
  ``yMean - coefficients . mean`` after the fit);
* hinge: ``K`` (+1 intercept slot);
* huber: ``K`` (+1 intercept slot) +1 scale slot holding ``log(sigma)``.

MLlib bounds huber's ``sigma`` below by 0 with L-BFGS-B; here the solver's coordinate is
``log(sigma)``, which keeps ``sigma > 0`` with the unconstrained solver. A stationary point
in ``log(sigma)`` is one in ``sigma``, so the optimum is MLlib's; the path differs.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field

import numpy as np

from spark_ps.context import PSContext
from spark_ps.ml._job import PSJob, best_effort
from spark_ps.ml._progress import Progress
from spark_ps.ml._recovery import FitRecovery
from spark_ps.ml.base import PreparedData
from spark_ps.ml.linear.rounds import HANDLERS, LABEL_STATS
from spark_ps.ml.lr.distributed import (
    Zeros,
    _key_space,
    _KeySpace,
    _release,
    _result,
    _resume_hooks,
    _Start,
    drop_start,
)
from spark_ps.ml.lr.objective import build_lr_vectors, finish_objective
from spark_ps.ml.lr.optim import WARM, minimize_lbfgs
from spark_ps.ml.lr.ps_space import PSVecSpace
from spark_ps.ml.lr.rounds import rows_job
from spark_ps.models import PSMatrix

__all__ = ["LinearProblem", "LinearFit", "train_linear"]

log = logging.getLogger("spark_ps.ml.linear")

LOSSES = ("squaredError", "huber", "hinge")


@dataclass
class LinearProblem:
    """What to fit: MLlib's Param values that shape the objective."""

    loss: str
    fit_intercept: bool
    reg_param: float
    elastic_net: float
    standardization: bool
    max_iter: int
    tol: float
    epsilon: float = 1.35
    solver: str = "l-bfgs"  # LinearRegression's: "auto" | "normal" | "l-bfgs"


#: MLlib's WeightedLeastSquares.MAX_NUM_FEATURES: "auto" solves the normal equations up to this.
NORMAL_MAX_FEATURES = 4096


def _normal_equations(p: LinearProblem, num_features: int) -> bool:
    """Would MLlib solve this in closed form (WeightedLeastSquares, Cholesky)? Then maxIter
    and tol do not apply and the objective history is ``[0.0]``."""
    if p.loss != "squaredError" or (p.elastic_net != 0.0 and p.reg_param != 0.0):
        return False
    return p.solver == "normal" or (p.solver == "auto" and num_features <= NORMAL_MAX_FEATURES)


@dataclass
class LinearFit:
    """A fitted linear model: coefficients (dense, or values at ``keys``), intercept,
    huber scale (1.0 otherwise), MLlib's objective history and iteration count."""

    coefficients: np.ndarray
    intercept: float
    scale: float
    objective_history: list[float]
    total_iterations: int
    keys: np.ndarray | None
    num_features: int
    #: MLlib's ``diagInvAtWA`` (normal equations: the diagonal of ``(A^T W A)^-1``, from which
    #: its summary derives standard errors, t- and p-values); ``[0.0]``: not available.
    diag_inv_atwa: list[float] = field(default_factory=lambda: [0.0])


@dataclass
class _Labels:
    n_rows: int
    weight_sum: float
    weight_sq_sum: float
    mean: float
    std: float  # MLlib's weighted unbiased std; exactly 0 when every label is equal
    n_bad: int  # labels outside {0, 1}
    label_sum: float = 0.0  # sum w*y
    m2: float = 0.0  # sum w*(y - mean)**2


def train_linear(prepared: PreparedData, problem: LinearProblem, name: str) -> LinearFit:
    """Fit ``problem`` on ``prepared`` with the model on the PS (see the module doc).

    A shard restart at any moment rolls the fit back as LogisticRegression's default mode
    does: the set-up is redone under fresh names and the solver goes on from the iterate
    the driver held every HOLD_INTERVAL iterations (or starts over). These fits write no
    PS checkpoints: their set-up (label statistics) is not restorable from tensors."""
    if problem.loss not in LOSSES:
        raise ValueError(f"loss {problem.loss!r} is not one of {', '.join(LOSSES)}")
    ps = PSContext.getOrCreate(prepared.df.sparkSession)
    job = rows_job(ps, prepared, name, HANDLERS, dense_matrix=True)
    with job:
        recovery = FitRecovery(job, HOLD_INTERVAL, ps_state=True, what=name, checkpoints=False)
        built: dict = {}
        stamps: list[float] = []

        def attempt(resume: dict | None) -> LinearFit:
            _release(built)  # every rollback redoes the set-up (no PS checkpoints)
            built["ks"] = ks = _key_space(job, ps, prepared, identity=True, prefix=recovery.prefix)
            extra = _extra_slots(problem)
            built["space"] = PSVecSpace(ps, ks.size + extra, prefix=recovery.prefix)
            hooks = _resume_hooks(recovery, built["space"], stamps, resume)
            return _Solve(job, built["space"], ks, problem).run(hooks, resume)

        try:
            return recovery.run(attempt)
        finally:  # clean-up must not hide the fit's own error (see best_effort)
            _release(built)


#: Iterations between the iterates the driver holds to resume from after a shard restart.
HOLD_INTERVAL = 10


def _extra_slots(problem: LinearProblem) -> int:
    """Slots after the K coefficients: intercept (hinge, huber), scale (huber)."""
    intercept = problem.fit_intercept and problem.loss != "squaredError"
    return int(intercept) + int(problem.loss == "huber")


class _Solve:
    """Driver side of one fit: statistics, MLlib's scaled objective, the solver, the result."""

    def __init__(self, job: PSJob, space: PSVecSpace, ks: _KeySpace, problem: LinearProblem):
        self.job, self.space, self.ks, self.p = job, space, ks, problem
        self.k = ks.size
        has_b = problem.fit_intercept and problem.loss != "squaredError"
        self.intercept_slot = self.k if has_b else -1
        self.sigma_slot = space.dim - 1 if problem.loss == "huber" else -1
        self.keyset = None if ks.keyset is None else ks.keyset.name
        self.start: _Start | None = None  # the start's objective, until the first evaluation

    # ------------------------------------------------------------------ statistics

    def stats(self, start: bool = False):
        """(mean, std) PS vectors of the features and the label statistics; with `start`
        also the start's gradient from each key's ``sum w*y*x`` (see `_start`)."""
        space, ctx = self.space, self.space.context
        base = f"{space.prefix}/stats"
        sums = PSMatrix.dense(space.dim, 4 if start else 3, name=f"{base}/sums", context=ctx)
        extremes = PSMatrix.dense(space.dim, 2, name=f"{base}/extremes", context=ctx)
        nw = self.job.num_workers
        try:
            r, out = self.job.call(
                "linear_stats",
                keyset=self.keyset,
                sums=sums.name,
                extremes=extremes.name,
                num_workers=nw,
                **({"label_sums": True} if start else {}),
            )
            sums.reduce(r)
            extremes.reduce(r, how="max")
            n_rows, wsum, wsq = out[:3]
            labels = _merge_labels(out[3:].reshape(nw, len(LABEL_STATS)), n_rows, wsum, wsq)
            if not wsum > 0:
                raise ValueError(f"the total instance weight is {wsum!r}; it must be positive")
            mean, std = space.new("mean"), space.new("std")
            models = [sums.spec, extremes.spec, mean.spec, std.spec]
            scalars = {"weight_sum": wsum, "weight_sq_sum": wsq, "n_rows": n_rows}
            if start:
                # at zero coefficients hinge's multiplier is -(2y - 1) w, squared error's
                # (mean - y) w / std_y (centered) or -y w / std_y: a*s1 + b*sum w*y*x
                hinge = self.p.loss == "hinge"
                a = 1.0 if hinge else (labels.mean if self.p.fit_intercept else 0.0)
                self.start = _Start(space.new("start_grad"), a, -2.0 if hinge else -1.0)
                models.append(self.start.grad.spec)
                scalars.update(self.start.scalars())
            ctx.client.call("stats.standardize", models, scalars)
        finally:
            best_effort("dropping the statistics sums", sums.drop)
            best_effort("dropping the statistics extremes", extremes.drop)
        return mean, std, labels

    def _start(self, labels: _Labels, y_std: float) -> None:
        """The rest of the start's objective (`stats` made its gradient vector), once the
        label's scale is known: the solver's first evaluation then needs no pass over the
        rows. MLlib's LinearSVC and L-BFGS LinearRegression start at zero coefficients."""
        st, W, sy = self.start, labels.weight_sum, labels.label_sum
        if st is None:
            return
        if self.p.loss == "hinge":  # every row of positive weight is active at margin 0
            st.loss_sum, st.grad_intercept = W, W - 2.0 * sy
        else:  # diff = (mean - y) / std_y with an intercept, else -y / std_y
            squares = labels.m2 if self.p.fit_intercept else labels.m2 + sy * sy / W
            st.loss_sum = 0.5 * squares / (y_std * y_std)
            st.scale = 1.0 / y_std
            st.grad_intercept = ((st.a * W) - sy) / y_std
        st.weight_sum = W

    # ------------------------------------------------------------------ the fit

    def run(self, hooks: dict, resume: dict | None) -> LinearFit:
        """The fit; `hooks` are minimize_lbfgs's checkpoint/resume hooks, `resume` the
        state a rollback returned (a held iterate) or None."""
        p, space = self.p, self.space
        # huber starts at ones; a resumed fit evaluates its own start on the workers
        mean, std, labels = self.stats(start=p.loss != "huber" and resume is None)
        if p.loss == "hinge" and labels.n_bad:
            raise ValueError(
                f"LinearSVC: labels must be 0 or 1; {labels.n_bad} rows have other labels"
            )
        y_mean, y_std = labels.mean, labels.std
        if p.loss == "squaredError" and y_std == 0.0:
            if p.fit_intercept or y_mean == 0.0:
                log.warning(
                    "the label's standard deviation is zero: coefficients are 0 and the "
                    "intercept is the label's mean, %s; no training is needed",
                    y_mean,
                )
                drop_start(space, self.start)
                return self._constant(y_mean)
            if p.reg_param != 0.0:
                raise ValueError(
                    "The standard deviation of the label is zero. Model cannot be regularized "
                    f"(regParam={p.reg_param}); set fitIntercept=true or regParam=0."
                )
            y_std = abs(y_mean)
        mask = space.new("coef_mask")
        mask.fill(1.0)
        extras = [s for s in (self.intercept_slot, self.sigma_slot) if s >= 0]
        if extras:
            mask.update(np.array(extras, dtype=np.int64), np.zeros(len(extras)))
        reg = p.reg_param / y_std if p.loss == "squaredError" else p.reg_param
        if _normal_equations(p, int(self.ks.num_features)) and labels.weight_sum > 0:
            # MLlib's normal equations scale the ridge term by population (biased) variances
            # where its L-BFGS uses unbiased ones: var_pop = c * var_unbiased, with MLlib's
            # weighted c = 1 - sum(w^2) / sum(w)^2, so the same optimum needs reg * sqrt(c)
            # (the features' variances and the label's std) or reg / sqrt(c) (the label's only)
            c = 1.0 - labels.weight_sq_sum / labels.weight_sum**2
            if c > 0:
                reg = reg * math.sqrt(c) if p.standardization else reg / math.sqrt(c)
        vecs = build_lr_vectors(
            space,
            mean,
            std,
            mask,
            reg_param=reg,
            elastic_net=p.elastic_net if p.loss == "squaredError" else 0.0,
            standardization=p.standardization,
            fit_intercept=self.intercept_slot >= 0,
        )
        centered = vecs.scaled_mean  # hinge/huber with an intercept: MLlib's virtual centering
        if p.loss == "squaredError" and p.fit_intercept:
            centered = space.new("scaled_mean")
            space.apply("lr_scaled_mean", centered, mean, vecs.inv_std)
        l1 = vecs.l1_weight
        if p.loss == "hinge":  # MLlib's LinearSVC runs OWL-QN with a zero L1 weight
            l1 = space.new("l1_zero")
        x = self._initial_point(centered)
        self._start(labels, y_std)
        if resume is not None and WARM in resume:  # a warm restart: x0 is the held iterate
            x.update(np.arange(space.dim, dtype=np.int64), np.asarray(resume[WARM]))
        evaluate = self._objective(vecs, centered, y_mean, y_std)
        zeros = Zeros(self.ks.num_features) if self.ks.dense_output else None
        if _normal_equations(p, int(self.ks.num_features)):
            # MLlib's closed form: the same optimum, reached here by iterating to convergence
            res = minimize_lbfgs(
                space, evaluate, x, max_iter=10_000, tol=1e-13, m=10, l1=l1, **hooks
            )
            fit = self._result(res, vecs, centered, mean, y_mean, y_std, zeros)
            fit.objective_history, fit.total_iterations = [0.0], 0
            fit.diag_inv_atwa = self._diag_inv_atwa()
            return fit
        # the bar, the status page's curve and TensorBoard: the loss after each iteration
        bar = Progress(f"spark-ps {self.job.name.split('(')[0]}", p.max_iter)
        try:
            res = minimize_lbfgs(
                space,
                evaluate,
                x,
                max_iter=p.max_iter,
                tol=p.tol,
                m=10,
                l1=l1,
                callback=lambda info: bar.update(info.iteration, loss=info.value),
                **hooks,
            )
        finally:
            bar.close()
        return self._result(res, vecs, centered, mean, y_mean, y_std, zeros)

    def _diag_inv_atwa(self) -> list[float]:
        """MLlib's ``diagInvAtWA`` of a normal-equations fit: the diagonal of the inverse of
        ``A^T W A`` (``A`` = the features, and a column of ones when an intercept is fitted)
        plus the L2 term ``wSum * regParam / std_y * D`` that MLlib's WeightedLeastSquares
        adds (``D`` = the features' variances, or 1 without standardization; population
        variances, weighted, as WeightedLeastSquares computes them), in the original space.
        ``[0.0]`` (MLlib's "not available") when the matrix is singular or the fit has more
        than MLlib's 4096 features or a hashed key space."""
        p, ks, space = self.p, self.ks, self.space
        k = ks.size
        if ks.keyset is not None or k > NORMAL_MAX_FEATURES:
            return [0.0]
        gram = PSMatrix.dense(k + 2, k + 2, name=f"{space.prefix}/gram", context=space.context)
        try:
            r, _ = self.job.call("linear_gram", keyset=None, gram=gram.name, dim=k)
            gram.reduce(r)
            G = np.asarray(gram.pull(np.arange(k + 2, dtype=np.int64)), dtype=np.float64)
        finally:
            best_effort("dropping the Gram matrix", gram.drop)
        wsum = G[k, k]
        mean = G[k, :k] / wsum
        var = np.diag(G)[:k] / wsum - mean * mean
        y_mean = G[k, k + 1] / wsum
        y_var = G[k + 1, k + 1] / wsum - y_mean * y_mean
        idx = np.arange(k + int(p.fit_intercept))
        A = G[np.ix_(idx, idx)].copy()
        if p.reg_param != 0.0 and y_var > 0.0:
            l2 = (1.0 - p.elastic_net) * p.reg_param / math.sqrt(y_var)
            scale = var if p.standardization else np.ones(k)
            A[np.arange(k), np.arange(k)] += wsum * l2 * scale
        if np.any(var <= 0.0):  # a constant feature: singular with an intercept
            return [0.0]
        try:
            inv_diag = np.diag(np.linalg.inv(A))
        except np.linalg.LinAlgError:
            return [0.0]
        if not np.all(np.isfinite(inv_diag)) or np.any(inv_diag <= 0.0):
            return [0.0]
        return [float(v) for v in inv_diag]

    def _initial_point(self, centered):
        """MLlib's start: zeros; huber starts every coefficient and the intercept at 1 (the
        intercept moved by the centering) and sigma at 1."""
        x = self.space.new("x")
        if self.p.loss != "huber":
            return x
        x.fill(1.0)
        slots = np.array([s for s in (self.intercept_slot, self.sigma_slot) if s >= 0])
        x.update(slots, np.zeros(slots.size))  # log(sigma) = 0; the intercept next
        if self.intercept_slot >= 0:
            adapt = self.space.dot(x, centered)
            x.update(np.array([self.intercept_slot]), np.array([1.0 + adapt]))
        return x

    def _scalars(self, x, centered) -> tuple[float, float, float]:
        """(x . centered, x[intercept], x[scale]) in one request (0 for absent ones)."""
        picks = [[0, s] for s in (self.intercept_slot, self.sigma_slot) if s >= 0]
        if centered is None and not picks:
            return 0.0, 0.0, 0.0
        models = [x.spec] + ([centered.spec] if centered is not None else [])
        args = {"pairs": [[0, 1]] if centered is not None else [], "pick": picks}
        out = self.space.context.client.call("linalg.dots", models, args)
        vals = np.sum([a[0] for _, a in out], axis=0)
        dot = float(vals[0]) if centered is not None else 0.0
        rest = list(vals[1:] if centered is not None else vals)
        b = float(rest.pop(0)) if self.intercept_slot >= 0 else 0.0
        t = float(rest.pop(0)) if self.sigma_slot >= 0 else 0.0
        return dot, b, t

    def _objective(self, vecs, centered, y_mean: float, y_std: float):
        p, space = self.p, self.space

        def evaluate(x, g) -> float:
            start, self.start = self.start, None
            if start is not None:  # the start point, from the statistics (see `_start`)
                value = start.objective(space, x, g, vecs, self.intercept_slot)
                if p.loss == "squaredError" and centered is not None:
                    space.axpy(-start.grad_intercept / start.weight_sum, centered, g)
                return value
            dot, b, t = self._scalars(x, centered)
            if p.loss == "squaredError":
                offset = y_mean / y_std - dot if p.fit_intercept else 0.0
            else:
                offset = b - dot if self.intercept_slot >= 0 else 0.0
            r, (loss, wsum, grad_offset) = self.job.call(
                "linear_grad",
                loss=p.loss,
                x=x.name,
                g=g.name,
                inv_std=vecs.inv_std.name,
                offset=offset,
                label_scale=1.0 / y_std if p.loss == "squaredError" else 1.0,
                sigma=math.exp(t),
                epsilon=p.epsilon,
                intercept_slot=self.intercept_slot,
                sigma_slot=self.sigma_slot,
                keyset=self.keyset,
            )
            g.reduce(r)
            value = finish_objective(
                space, x, g, vecs, loss_sum=loss, weight_sum=wsum, grad_intercept=grad_offset
            )
            if p.loss == "squaredError" and centered is not None:  # label-centered residuals
                space.axpy(-grad_offset / wsum, centered, g)
            return value

        return evaluate

    def _result(
        self, res, vecs, centered, mean, y_mean: float, y_std: float, zeros: Zeros | None
    ) -> LinearFit:
        p, space = self.p, self.space
        coef_h = space.new("coefficients")
        space.apply("multiply", coef_h, res.x, vecs.inv_std)  # standardized -> original
        dot, b, t = self._scalars(res.x, centered)
        scale = 1.0
        if p.loss == "squaredError":
            space.scale(y_std, coef_h)
            intercept = y_mean - y_std * dot if p.fit_intercept else 0.0
        else:
            intercept = b - dot if self.intercept_slot >= 0 else 0.0
            if p.loss == "huber":
                scale = math.exp(t)
        keys, ids = self.ks.touched()
        coef = coef_h.pull(ids) if keys.size else np.zeros(0)
        history = list(res.objective_history)
        tr = _result(self.ks, keys, coef, intercept, history, res.n_iter, zeros)
        return LinearFit(
            tr.coefficients,
            tr.intercept,
            scale,
            list(tr.objective_history),
            tr.total_iterations,
            tr.keys,
            int(self.ks.num_features),
        )

    def _constant(self, y_mean: float) -> LinearFit:
        """MLlib's constant-label model: zero coefficients, the label's mean as intercept."""
        empty = np.zeros(0, np.int64)
        tr = _result(self.ks, empty, np.zeros(0), y_mean, [0.0], 0)
        return LinearFit(tr.coefficients, y_mean, 1.0, [0.0], 0, tr.keys, int(self.ks.num_features))


def _merge_labels(rows: np.ndarray, n_rows: float, wsum: float, wsq: float) -> _Labels:
    """Combine the partitions' label rows (Chan et al.'s pairwise update) into MLlib's
    weighted mean and unbiased std; the std is exactly 0 when min == max."""
    W = rows[:, 0].sum()
    mean = rows[:, 1].sum() / W if W > 0 else 0.0
    m2 = 0.0
    for w_p, s_p, m2_p, *_ in rows:
        if w_p > 0:
            m2 += m2_p + w_p * (s_p / w_p - mean) ** 2
    lo, hi = rows[:, 3].min(), rows[:, 4].max()
    denom = wsum - wsq / wsum if wsum > 0 else 0.0
    std = math.sqrt(m2 / denom) if denom > 0 and lo != hi else 0.0
    n_bad = int(rows[:, 5].sum())
    sy = float(rows[:, 1].sum())
    return _Labels(int(n_rows), float(wsum), float(wsq), float(mean), std, n_bad, sy, float(m2))
