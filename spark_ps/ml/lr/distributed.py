"""Full-batch L-BFGS / OWL-QN logistic regression with the model on the PS.

One barrier Spark job holds the data for the whole fit (see `spark_ps.ml._job`).
The driver runs the solver, but every vector it touches is a co-located PS vector
(`PSVecSpace`): the solver's algebra runs on the shards and only scalars come back.
Per function evaluation the workers pull the coefficients of the keys their
partition uses, compute the loss and gradient in numpy, and push the gradient as
their exactly-once contribution to that round.

Rounds (worker commands):
  ``dims``   each partition reports its feature dimension;
  ``stats``  per-key weighted sums for MLlib's standardization (sum and max reduces), and
             each key's ``sum w*y*x``, which gives the objective at MLlib's start point
             (`_Start`): the solver's first evaluation needs no pass over the rows;
  ``grad``   loss and gradient at a point x (pulls x, pushes into g).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import grpc
import numpy as np

from spark_ps.client import PSError
from spark_ps.context import PSContext
from spark_ps.ml._job import PSJob, best_effort
from spark_ps.ml._progress import Progress
from spark_ps.ml._recovery import FitRecovery
from spark_ps.ml.base import PreparedData
from spark_ps.ml.binned_metrics import NUM_BINS, binned_auc
from spark_ps.ml.lr.bounded import BOUND_PARAMS, box_of, minimize_lbfgsb
from spark_ps.ml.lr.estimator import TrainResult, check_label_counts
from spark_ps.ml.lr.objective import (
    build_lr_vectors,
    finish_objective,
    initial_point,
    original_space,
)
from spark_ps.ml.lr.optim import WARM, minimize_lbfgs, warm_state
from spark_ps.ml.lr.ps_space import PSVecSpace
from spark_ps.ml.lr.rounds import DIMS_COLUMNS, rows_job
from spark_ps.models import PSMatrix, PSVector

__all__ = ["train_lbfgs_binomial"]

log = logging.getLogger("spark_ps.ml.lr")

_DENSE_OUTPUT_LIMIT = 1 << 24  # vector input up to this size gets MLlib's dense coefficients
_IDENTITY_LIMIT = 1 << 16  # vector input up to this size: PS vector ids are the feature ids
# Vector input up to this size, and at most this many times the keys the partitions
# touch, numbers its keys in a dense PS vector (8 bytes a feature) instead of a hash index.
_DENSE_KEYSET_LIMIT = 1 << 25
_DENSE_KEYSET_PER_KEY = 64
# Up to this many keys the driver holds a copy of the iterate (8 bytes a key) to resume from
# after a shard restart; above, a restart starts the fit over unless PS checkpoints are on.
_HELD_LIMIT = 1 << 27
# Where the evaluations' time goes (driver wall seconds; worker means), kept with the phases.
_EVAL_PARTS = ("eval offset", "eval round", "eval reduce", "eval finish")
_WORKER_PARTS = ("worker pull", "worker compute", "worker push+contribute")


class _Fit:
    """Driver side of one fit: the PS vectors and the rounds that fill them."""

    def __init__(self, job: PSJob, space: PSVecSpace, fit_intercept: bool, ks, label_col: str):
        self.job, self.space, self.fit_intercept = job, space, fit_intercept
        self.dim, self.label_col = space.dim, label_col
        self.keyset = None if ks.keyset is None else ks.keyset.name
        self.spent: dict[str, float] = dict.fromkeys(_EVAL_PARTS + _WORKER_PARTS, 0.0)
        self.spent["evaluations"] = 0
        self.validation = False  # whether the workers hold validation rows to score
        #: the start point's objective from the statistics round (`stats`), until the
        #: solver's first evaluation takes it
        self.start: _Start | None = None
        #: the last evaluation's validation score histograms (see `rounds._grad`), or None
        self.histograms: np.ndarray | None = None

    def stats(self, start: bool = False):
        """(mean, std, label weights): one worker round that fills two [K, cols] matrices,
        then one server call that turns them into the mean and std vectors.

        With `start` the round also sums each key's ``w*y*x``, and the same server call
        derives the data gradient at MLlib's start point from it (see `_Start`): the
        solver's first evaluation then needs no pass over the rows."""
        name = f"{self.space.prefix}/stats"
        ctx = self.space.context
        sums = PSMatrix.dense(self.space.dim, 4 if start else 3, name=f"{name}/sums", context=ctx)
        extremes = PSMatrix.dense(self.space.dim, 2, name=f"{name}/extremes", context=ctx)
        try:
            r, out = self.job.call(
                "stats",
                keyset=self.keyset,
                sums=sums.name,
                extremes=extremes.name,
                **({"label_sums": True} if start else {}),
            )
            sums.reduce(r)
            extremes.reduce(r, how="max")
            n_rows, wsum, wsq, w0, w1, n_bad, n_neg, n_multi = out
            check_label_counts(self.label_col, n_neg, n_multi > 0, f"{int(n_multi)} labels above 1")
            if n_bad:
                raise ValueError(
                    f"Labels MUST be in {{0, 1}} for binary logistic regression; "
                    f"{int(n_bad)} rows have other labels"
                )
            if not wsum > 0:
                raise ValueError(f"the total instance weight is {wsum!r}; it must be positive")
            mean, std = self.space.new("mean"), self.space.new("std")
            models = [sums.spec, extremes.spec, mean.spec, std.spec]
            scalars = {"weight_sum": wsum, "weight_sq_sum": wsq, "n_rows": n_rows}
            both = w0 > 0 and w1 > 0  # else a one-label fit: MLlib's start is not finite
            if start and (both or not self.fit_intercept):
                b0 = math.log(w1 / w0) if self.fit_intercept else 0.0
                grad = self.space.new("start_grad")
                self.start = _Start.logistic(grad, b0, w0, w1, wsum, self.fit_intercept)
                models.append(self.start.grad.spec)
                scalars.update(self.start.scalars())
            ctx.client.call("stats.standardize", models, scalars)
        finally:  # clean-up must not hide the round's own error (see best_effort)
            best_effort("dropping the statistics sums", sums.drop)
            best_effort("dropping the statistics extremes", extremes.drop)
        return mean, std, np.array([w0, w1])

    def drop_start(self) -> None:
        """Forget the start point's objective (the solver starts from another point)."""
        start, self.start = self.start, None
        drop_start(self.space, start)

    def coef_mask(self):
        mask = self.space.new("coef_mask")
        mask.fill(1.0)
        if self.fit_intercept:
            mask.update(np.array([self.dim - 1]), np.array([0.0]))
        return mask

    def objective(self, vecs):
        """evaluate(x, g) -> f: one distributed pass over all partitions (the first call,
        at MLlib's start, derives it from the statistics instead: `_Start`)."""
        last = self.dim - 1

        spent = self.spent
        nw = self.job.num_workers

        def evaluate(x, g) -> float:
            start, self.start = self.start, None
            if start is not None:  # MLlib's start point (`drop_start` if x is another)
                return start.objective(self.space, x, g, vecs, last if self.fit_intercept else -1)
            t0 = time.perf_counter()
            offset = 0.0
            if self.fit_intercept and vecs.scaled_mean is None:  # not centered (bounded)
                offset = float(x.pull(np.array([last]))[0])
            elif self.fit_intercept:  # x[last] - x . scaled_mean, in one request
                out = self.space.context.client.call(
                    "linalg.dots",
                    [x.spec, vecs.scaled_mean.spec],
                    {"pairs": [[0, 1]], "pick": [[0, last]]},
                )
                dot, x_last = np.sum([a[0] for _, a in out], axis=0)
                offset = float(x_last) - float(dot)
            t1 = time.perf_counter()
            extra = {"validation": True} if self.validation else {}
            r, out = self.job.call(
                "grad",
                x=x.name,
                g=g.name,
                inv_std=vecs.inv_std.name,
                offset=offset,
                fit_intercept=self.fit_intercept,
                dim=self.dim,
                keyset=self.keyset,
                **extra,
            )
            loss, wsum, grad_b, *worker = out[:6]
            if self.validation:
                self.histograms = out[6:]
            t2 = time.perf_counter()
            g.reduce(r)
            t3 = time.perf_counter()
            value = finish_objective(
                self.space, x, g, vecs, loss_sum=loss, weight_sum=wsum, grad_intercept=grad_b
            )
            parts = (t1 - t0, t2 - t1, t3 - t2, time.perf_counter() - t3)
            for name, sec in zip(_EVAL_PARTS, parts, strict=True):
                spent[name] += sec
            for name, sec in zip(_WORKER_PARTS, worker, strict=True):
                spent[name] += sec / nw  # mean over the workers
            spent["evaluations"] += 1
            return value

        return evaluate


@dataclass
class _Start:
    """The objective at a start point where each row's loss derivative is an affine
    function of its label (MLlib's LR start: coefficients 0, intercept b0, every margin
    b0), from the statistics round: the data gradient of a key is ``scale * (a * sum w*x +
    b * sum w*y*x) / std`` (``stats.standardize`` writes the bracket into `grad`), of the
    intercept `grad_intercept`, and the loss `loss_sum`. Equal to a pass over the rows up
    to the order of the float additions (`tests/test_lr_fit.py`), one pass fewer for every
    fit that starts there."""

    grad: PSVector  # a * sum w*x + b * sum w*y*x per key (0 in the intercept slot)
    a: float
    b: float
    loss_sum: float = 0.0
    weight_sum: float = 0.0
    grad_intercept: float = 0.0
    scale: float = 1.0

    @classmethod
    def logistic(cls, grad, b0: float, w0: float, w1: float, wsum: float, intercept: bool):
        """MLlib's LR start, margins all b0: ``a = sigmoid(b0)``, ``b = -1``."""
        with np.errstate(over="ignore"):  # |b0| > 709 (weights ~1e-308): p is 0 or 1
            p = float(1.0 / (1.0 + np.exp(-b0)))  # as the rows' pass computes it
        loss = w1 * float(np.logaddexp(0.0, -b0)) + w0 * float(np.logaddexp(0.0, b0))
        return cls(grad, p, -1.0, loss, wsum, p * wsum - w1 if intercept else 0.0)

    def scalars(self) -> dict:
        """``stats.standardize``'s arguments for `grad`."""
        return {"start_s1": self.a, "start_sy": self.b}

    def objective(self, space: PSVecSpace, x, g, vecs, slot: int) -> float:
        """evaluate(x, g) at the start point: g from the statistics in a few driver
        requests (`slot`: the intercept's, or -1)."""
        space.apply("multiply", g, self.grad, vecs.inv_std)  # 1/std is 0 at the intercept
        if self.scale != 1.0:
            space.scale(self.scale, g)
        if slot >= 0:
            g.update(np.array([slot]), np.array([self.grad_intercept]))
        space.release(self.grad)
        return finish_objective(
            space,
            x,
            g,
            vecs,
            loss_sum=self.loss_sum,
            weight_sum=self.weight_sum,
            grad_intercept=self.grad_intercept,
        )


def drop_start(space: PSVecSpace, start: _Start | None) -> None:
    """Give back a start's vector the solver will not use (it starts from another point)."""
    if start is not None:
        space.release(start.grad)


class _Phases:
    """Wall-clock seconds of each set-up phase of a fit (logged, and kept on the result)."""

    def __init__(self, start: float):
        self.start = self.last = start
        self.seconds: dict[str, float] = {}

    def mark(self, name: str) -> None:
        now = time.perf_counter()
        self.seconds[name] = round(now - self.last, 4)
        self.last = now
        log.info("phase %s: %.3f s", name, self.seconds[name])


@dataclass
class _KeySpace:
    """The keys the data touches, numbered 0..K-1 on the PS (`keyset` maps key -> id)."""

    keyset: PSVector | None  # None: the ids are the keys (small vector input)
    size: int  # K
    num_features: int  # the model's dimension: vector size, or the largest key + 1
    dense_output: bool  # small vector input: return dense coefficients, as MLlib does
    keys: np.ndarray | None = None  # a dense keyset's touched keys, in id order

    def touched(self) -> tuple[np.ndarray, np.ndarray]:
        """(every touched key, its compact id)."""
        if self.keyset is None:
            keys = np.arange(self.num_features, dtype=np.int64)
            return keys, keys
        if self.keys is not None:
            return self.keys, np.arange(self.keys.size, dtype=np.int64)
        keys, ids = self.keyset.pull()
        return keys, ids.astype(np.int64)


def read_dims(job: PSJob, phases: _Phases | None = None) -> np.ndarray:
    """The ``dims`` round, [workers, DIMS_COLUMNS] (see `rounds._dims`); the first round
    of a job: it waits for the job to start and the workers to read their rows."""
    _, out = job.call("dims", num_workers=job.num_workers)
    if phases is not None:
        phases.mark("job start + read")
    return out.reshape(job.num_workers, DIMS_COLUMNS)


def _key_space(
    job: PSJob,
    ps,
    prepared: PreparedData,
    phases: _Phases | None = None,
    identity: bool = False,
    prefix: str | None = None,
    dims: np.ndarray | None = None,
) -> _KeySpace:
    """Dimension and compact key numbering of the data (``identity``: skip the numbering
    for vector input up to ``_IDENTITY_LIMIT`` features; ``keyset`` is then None), the
    key set named under `prefix` (default: the job's topic); `dims`: the ``dims`` round's
    answer when the caller asked it already (:func:`read_dims`)."""
    phases = phases or _Phases(time.perf_counter())
    out = read_dims(job, phases) if dims is None else dims
    log.info("worker read %s s, localize %s s", out[:, 3].round(2), out[:, 4].round(2))
    sizes = sorted({int(v) for v in out[:, 0] if v > 0})
    if len(sizes) > 1 and prepared.features_kind != "keys":
        raise ValueError(f"feature vectors have inconsistent sizes across partitions: {sizes}")
    if not sizes:
        raise ValueError("the training dataset is empty")
    top = max((int(hi) << 31) + int(lo) for hi, lo in out[:, 1:3])
    # keys: the model's dimension is the training rows' (validation rows' keys are numbered
    # too, for scoring them, but no training row moves their coefficient off 0)
    train_top = max((int(hi) << 31) + int(lo) for hi, lo in out[:, 6:8])
    num_features = train_top + 1 if prepared.features_kind == "keys" else sizes[0]
    dense = prepared.features_kind != "keys" and num_features <= _DENSE_OUTPUT_LIMIT
    if identity and prepared.features_kind != "keys" and num_features <= _IDENTITY_LIMIT:
        return _KeySpace(None, num_features, num_features, dense)  # numbering saves nothing
    # A key space we may allocate is numbered in a dense vector: no hash index to build
    # and probe (vector input only; `keys` columns may reach 2**63).
    dense_ids = prepared.features_kind != "keys" and (
        num_features <= min(_DENSE_KEYSET_LIMIT, _DENSE_KEYSET_PER_KEY * int(out[:, 5].sum()))
    )
    name = f"{prefix or job.topic}/keyset"
    keyset = None
    if dense_ids:
        try:
            keyset = PSVector.dense(max(num_features, 1), name=name, context=ps)
        except PSError as e:  # e.g. over a shard memory budget: the hash index grows by keys
            if e.code != grpc.StatusCode.RESOURCE_EXHAUSTED:
                raise
            log.info("dense key numbering refused (%s); numbering in a hash index", e)
            dense_ids = False
    if keyset is None:
        keyset = PSVector.sparse(max(num_features, top + 1, 1), name=name, context=ps)
    try:
        job.call("keys", keyset=keyset.name)
        counts = [r["count"] for r, _ in ps.client.call("keyspace.count", [keyset.spec])]
        offsets = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
        res = ps.client.call(
            "keyspace.number", [keyset.spec], arrays=[[np.array([o])] for o in offsets]
        )
    except BaseException:  # e.g. a shard restarted: the fit starts over under new names
        best_effort("dropping the key set", keyset.drop)
        raise
    touched = np.concatenate([a[0] for _, a in res]).astype(np.int64) if dense_ids else None
    phases.mark("key numbering")
    return _KeySpace(keyset, int(sum(counts)), num_features, dense, touched)


def train_lbfgs_binomial(
    prepared: PreparedData, params: dict, job: PSJob, dims: np.ndarray | None, phases: _Phases
) -> TrainResult:
    """Fit MLlib's binomial objective on the PS (the `lbfgs` trainer of LogisticRegression,
    ``spark_ps.ml.lr.lbfgs``, for a binomial fit).

    The solver runs over the K keys the data touches (an untouched feature has zero
    gradient and zero std, so MLlib gives it coefficient 0): vectors have K (+1) entries
    however large the key space, and the driver holds none of them (but, to survive a
    shard restart without PS checkpoints, a copy of the iterate every
    ``checkpointInterval`` iterations: see `spark_ps.ml._recovery`). `job`: the running
    worker job (:func:`lr_job`; its owner stops it), whose ``dims`` round answered `dims`
    if it was asked already.
    """
    ps = PSContext.getOrCreate(prepared.df.sparkSession)
    stamps: list[float] = []  # iteration timestamps, over every attempt
    aucs: list[float] = []  # validation AUC per iteration, over every attempt
    return run_attempts(
        job,
        params,
        lambda built, prefix: _set_up(built, job, ps, prepared, params, phases, prefix, dims),
        lambda built, recovery, resume: _solve(
            built, stamps, params, phases, recovery, resume, aucs
        ),
    )


def run_attempts(job: PSJob, params: dict, set_up: Callable, solve: Callable) -> TrainResult:
    """An L-BFGS fit's attempts under `FitRecovery`: ``set_up(built, prefix)`` fills
    `built` (the set-up: kept when a rollback restores its tensors, made again otherwise),
    ``solve(built, recovery, resume)`` runs the solver, unless the set-up decided the
    result (``built["result"]``); what the set-up made is released at the end."""
    recovery = FitRecovery(job, params.get("checkpointInterval", -1), ps_state=True, what=job.name)
    built: dict = {}

    def attempt(resume: dict | None) -> TrainResult:
        if resume is None or not recovery.from_checkpoint:  # (again) from the set-up
            _release(built)
            set_up(built, recovery.prefix)
        if "result" in built:
            return built["result"]
        return solve(built, recovery, resume)

    try:
        return recovery.run(attempt)
    finally:  # clean-up must not hide the fit's own error (see best_effort)
        _release(built)


def lr_job(ps, prepared: PreparedData, params: dict, refuse: bool = False) -> PSJob:
    """The barrier job of an L-BFGS fit (binomial or multinomial: the same rows and rounds);
    `refuse`: see `rounds.setup_rows`."""
    name = f"LogisticRegression(maxIter={params['maxIter']})"
    return rows_job(ps, prepared, name, dense_matrix=True, refuse=refuse)


def _release(built: dict) -> None:
    """Drop a set-up's PS vectors and key set (best effort: a shard may have restarted)."""
    if "space" in built:
        best_effort("releasing the solver's PS vectors", built["space"].release_all)
    ks = built.get("ks")
    if ks is not None and ks.keyset is not None:
        best_effort("dropping the key set", ks.keyset.drop)
    built.clear()


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
    """Key space, statistics and the solver's constant vectors and start point, named under
    `prefix`, into `built` as they are made (so a failure half-way releases what exists);
    built["result"] when the labels decide the model (one class only)."""
    fit_intercept = bool(params["fitIntercept"])
    built["ks"] = _key_space(job, ps, prepared, phases, identity=True, prefix=prefix, dims=dims)
    ks = built["ks"]
    space = built["space"] = PSVecSpace(ps, ks.size + int(fit_intercept), prefix=prefix)
    fit = built["fit"] = _Fit(job, space, fit_intercept, ks, prepared.label_col)
    fit.validation = prepared.validation_col is not None
    bounded = any(params.get(name) is not None for name in BOUND_PARAMS)
    # the start's objective from the statistics, unless the start is clipped into a box or
    # the first evaluation must also score the validation rows
    mean, std, label_weight = fit.stats(start=not (bounded or fit.validation))
    phases.mark("statistics")
    box = built["box"] = None
    if bounded:
        keys, ids = ks.touched()
        stds = std.pull(np.arange(ks.size))
        box = built["box"] = box_of(params, ks.num_features, keys, ids, stds, fit_intercept)
    start = None  # the start intercept when one label only meets a finite intercept bound
    if fit_intercept and np.count_nonzero(label_weight) == 1:
        b = math.inf if label_weight[1] > 0 else -math.inf
        if box is not None:  # MLlib trains from its start clipped into the box
            start = float(np.clip(b, box.lower[-1], box.upper[-1]))
        if start is None or math.isinf(start):  # zero loss and gradient there: nothing to do
            log.warning(
                "all labels are %s and fitIntercept=true: coefficients are 0",
                int(label_weight[1] > 0),
            )
            built["result"] = _result(ks, np.zeros(0, np.int64), np.zeros(0), b, [0.0], 0)
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
    initial_point(space, x, mask, label_weight, fit_intercept, intercept=start)
    phases.mark("solver vectors")


def _solve(
    built: dict,
    stamps: list[float],
    params: dict,
    phases: _Phases,
    recovery: FitRecovery,
    resume: dict | None,
    aucs: list[float],
) -> TrainResult:
    """Run the solver from `built`'s start point, or from `resume` (a rollback's state),
    then read the coefficients back; with validation rows, their AUC at each iteration
    goes to `aucs` (which, like `stamps`, spans the fit's attempts)."""
    fit_intercept = bool(params["fitIntercept"])
    ks, space, fit, vecs = built["ks"], built["space"], built["fit"], built["vecs"]
    k = ks.size
    x = built["x"]
    if resume is not None:  # the solver starts elsewhere: no evaluation at MLlib's start
        fit.drop_start()
    if resume is not None and WARM in resume:  # a warm restart: x0 is the held iterate
        x.update(np.arange(space.dim, dtype=np.int64), np.asarray(resume[WARM]))

    bar = Progress("spark-ps LogisticRegression", int(params["maxIter"]))
    timed_evaluate, progress = _timed(fit.objective(vecs), stamps, phases, bar, fit, aucs)
    zeros = Zeros(ks.num_features) if ks.dense_output else None

    try:  # a failed attempt ends its curve too
        res = solve(space, timed_evaluate, x, built.get("box"), params, vecs.l1_weight, progress,
                    lambda: _resume_hooks(recovery, space, stamps, resume), stamps)  # fmt: skip
    finally:
        bar.close()
    phases.mark("iterations")
    log.info("evaluations: %s", {k: round(v, 3) for k, v in fit.spent.items()})
    built["x"] = res.x  # the solver's working vectors were swapped: release the live one
    b = float(res.x.pull(np.array([k]))[0]) if fit_intercept else 0.0
    coef_h, intercept = original_space(space, res.x, vecs, b)
    keys, ids = ks.touched()
    coef = coef_h.pull(ids) if keys.size else np.zeros(0)
    history = list(res.objective_history)
    result = _result(ks, keys, coef, intercept, history, res.n_iter, zeros)
    result.iteration_timestamps = list(stamps)
    if fit.validation:
        result.validation_auc = list(aucs)
    phases.mark("coefficients")
    result.phases = {**phases.seconds, **{k: round(float(v), 4) for k, v in fit.spent.items()}}
    return result


def _timed(
    evaluate, stamps: list, phases: _Phases, bar: Progress, fit=None, aucs: list | None = None
):
    """The solver's `evaluate` and iteration callback, stamping each iteration's time
    (the initial point's evaluation first: objectiveHistory[0]) and moving `bar`; when
    `fit` (a `_Fit`) scores validation rows, each iteration's validation AUC goes to `aucs`
    and `bar` too."""
    aucs = [] if aucs is None else aucs
    accepted: list = []  # the histograms of the iterate the solver stands on

    def histograms():
        return None if fit is None else fit.histograms

    def timed_evaluate(x, g) -> float:
        value = evaluate(x, g)
        if not accepted:  # this attempt's start point
            accepted.append(histograms())
            # the iterations a restart redoes (`stamps` is trimmed to its resume point)
            del aucs[max(len(stamps) - 1, 0) :]
        if not stamps:  # the initial point: objectiveHistory[0]
            stamps.append(time.perf_counter() - phases.start)
            phases.mark("first objective")
        return value

    def progress(info) -> None:
        stamps.append(time.perf_counter() - phases.start)
        metrics = {"loss": info.value}
        if histograms() is not None:
            # the iterate is the last point evaluated, unless the line search failed (step
            # 0.0, minimize_lbfgs): then it has not moved
            if info.step != 0.0:
                accepted[0] = histograms()
            h = accepted[0]
            aucs.append(binned_auc(h[:NUM_BINS], h[NUM_BINS:]))
            metrics["validation auc"] = aucs[-1]
        bar.update(info.iteration, **metrics)

    return timed_evaluate, progress


def solve(space, evaluate, x, box, params: dict, l1, callback, hooks, stamps: list):
    """MLlib's solver for a binomial or multinomial fit: L-BFGS-B within `box` (bound
    constraints; after a restart it starts over from set-up, so its timestamps restart),
    else L-BFGS (OWL-QN with `l1`) with the recovery `hooks()` (see `_resume_hooks`)."""
    common = dict(max_iter=params["maxIter"], tol=params["tol"], m=10, callback=callback)
    if box is not None:
        del stamps[:]
        return minimize_lbfgsb(space, evaluate, x, box, **common)
    return minimize_lbfgs(space, evaluate, x, l1=l1, **common, **hooks())


def _resume_hooks(recovery: FitRecovery, space: PSVecSpace, stamps: list, resume) -> dict:
    """minimize_lbfgs's checkpoint hook, and its resume point after a shard restart
    (iteration timestamps past that point are dropped: those iterations are redone)."""
    del stamps[len(resume["history"]) if resume is not None else 0 :]

    def checkpoint(boundary: int, snapshot) -> None:
        recovery.boundary(boundary, lambda: snapshot(lambda v: v.name))
        if space.dim * space.cols <= _HELD_LIMIT:
            recovery.hold(boundary, lambda: warm_state(snapshot, lambda v: v.pull()))

    return {
        "checkpoint": checkpoint,
        "resume": None if resume is None else (resume, space.handle),
    }


class Zeros:
    """A zero array for MLlib's dense coefficients, made while the solver runs.

    The driver faults a fresh array's pages in as it first writes them: at 2^24 features
    128 MB, which took 0.23-0.37 s of each fit's coefficients phase on this project's test
    machine (a VM), where the same touch takes 0.06-0.15 s in a fresh process. Allocated
    and touched on a thread while the driver waits on the evaluations, the phase took
    0.02-0.05 s (measured, 2^24 LR on 1M rows). The LR (binomial and multinomial),
    LinearRegression and LinearSVC fits with dense coefficients use it."""

    def __init__(self, *shape: int) -> None:
        self._out: np.ndarray | None = None
        self._thread = threading.Thread(
            target=self._fill, args=(shape,), name="spark-ps-zeros", daemon=True
        )
        self._thread.start()

    def _fill(self, shape: tuple[int, ...]) -> None:
        out = np.zeros(shape)
        out.reshape(-1)[::512] = 0.0  # one write per 4 KB page: every page is in now
        self._out = out

    def take(self, *shape: int) -> np.ndarray:
        """The zero array (made now if the thread failed); once."""
        self._thread.join()
        out, self._out = self._out, None
        return out if out is not None and out.shape == shape else np.zeros(shape)


def _result(
    ks: _KeySpace, keys, coef, intercept, history, iters, zeros: Zeros | None = None
) -> TrainResult:
    if ks.dense_output:
        dense = zeros.take(ks.num_features) if zeros is not None else np.zeros(ks.num_features)
        dense[keys] = coef
        return TrainResult(dense, intercept, history, iters)
    nz = coef != 0.0
    return TrainResult(
        coef[nz], intercept, history, iters, keys=keys[nz], num_features=ks.num_features
    )
