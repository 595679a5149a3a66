"""The FM fit's driver: MLlib's mini-batch gradient descent with the model on the PS.

One barrier worker job runs the whole fit (:class:`spark_ps.ml._job.PSJob`). Each iteration
``i`` is one round: every worker samples its partition (``miniBatchFraction``), pulls the rows
of the keys its sample touches (unique keys, rows created on first pull), and pushes its
gradient sums as the exactly-once contribution of the round; then ``fm.step`` runs on every
shard (:mod:`ps_server.functions.fm`): the mean gradient, MLlib's ``gd`` or ``adamW`` update,
applied beside the rows. The driver sees a loss sum, a row count and three sums of squares
per iteration, never a parameter.

As MLlib's ``GradientDescent``: the objective history holds ``lossSum / miniBatchSize +
regVal`` (regVal = 0.5 regParam ||w||^2 before the step), an empty sample skips the
iteration, from the second step on the fit stops when ``||w_i - w_{i-1}|| <
tol * max(||w_i||, 1)``, and a fit that runs all maxIter steps ends with one pass that only
measures the objective (maxIter + 1 history values, as MLlib 4.3). The step is lazy:
rows a mini-batch does not touch stay as they are, and the norms run over the rows the PS
holds. With ``miniBatchFraction=1`` and every
feature present in the data this is MLlib's iteration exactly; otherwise features outside
a mini-batch keep their weights (MLlib decays them and moves them by the AdamW momentum).
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
from spark_ps.ml.fm.worker import HANDLERS, setup_rows
from spark_ps.models import PSEmbedding

__all__ = ["FMResult", "train_fm"]

log = logging.getLogger("spark_ps.ml.fm")


@dataclass
class FMResult:
    """A fitted FM, sparse: the rows of the keys training touched."""

    num_features: int
    keys: np.ndarray  # sorted int64 feature keys with a factor row
    factors: np.ndarray  # float64 [keys.size, factorSize]
    linear_keys: np.ndarray  # sorted int64 keys with a linear weight
    linear: np.ndarray  # float64 [linear_keys.size]
    intercept: float
    objective_history: list[float] = field(default_factory=list)
    iterations: int = 0
    rows_held: int = 0  # rows (factors + linear) on the PS at the end of the fit


def _tensors(ps, topic: str, nf: int, params: dict) -> tuple[PSEmbedding, PSEmbedding]:
    adamw = params["solver"] == "adamW"
    opt = {"lr": float(params["stepSize"]), "weight_decay": float(params["regParam"])}
    common = dict(dtype="float64", context=ps, optimizer="adamw" if adamw else None)
    factors = PSEmbedding.create(
        int(params["factorSize"]),
        init="normal",
        scale=float(params["initStd"]),
        seed=int(params["seed"]),
        num_ids=max(nf, 1),
        name=f"{topic}/factors",
        **common,
        **(opt if adamw else {}),
    )
    linear = PSEmbedding.create(  # linear weights, and the intercept at key nf
        1, init="zeros", num_ids=nf + 1, name=f"{topic}/linear", **common, **(opt if adamw else {})
    )
    return factors, linear


def _num_features(job: PSJob, num_workers: int) -> tuple[int, int]:
    """(feature dimension, rows) over all partitions."""
    _, out = job.call("dims", num_workers=num_workers)
    per = out.reshape(num_workers, 2)
    return int(per[:, 0].max()), int(per[:, 1].sum())


def train_fm(
    prepared: PreparedData,
    params: dict,
    loss: str,
    initial_factors: np.ndarray | None = None,
) -> FMResult:
    """Fit an FM (``loss`` = "logistic" or "squared") with MLlib's mini-batch GD on the PS.

    ``initial_factors`` (float64 [numFeatures, factorSize], optional) replaces the lazy
    N(0, initStd) rows as the starting point (e.g. an MLlib model's, to compare steps).
    """
    ps = PSContext.getOrCreate(prepared.df.sparkSession)
    workers = prepared.num_workers
    setup = setup_rows(prepared.features_col, prepared.label_col, prepared.values_col)
    name = f"FM({loss}, {params['solver']})"
    job = PSJob(ps, prepared.df, workers, setup, HANDLERS, name=name)
    with job:
        recovery = FitRecovery(job, 1, ps_state=True, what=name, checkpoints=False)
        built: list[PSEmbedding] = []

        def attempt(resume: dict | None) -> FMResult:
            for t in built:  # a rollback starts over: the restarted shard lost its rows
                best_effort("dropping the FM tensors of a rolled-back attempt", t.drop)
            built.clear()
            nf, _ = _num_features(job, workers)
            factors, linear = _tensors(ps, recovery.prefix, nf, params)
            built.extend((factors, linear))
            return _fit(job, ps, factors, linear, nf, params, loss, initial_factors)

        try:
            return recovery.run(attempt)
        finally:  # clean-up must not hide the fit's own error (see best_effort)
            for t in built:
                best_effort(f"dropping {t.name}", t.drop)


def _fit(job, ps, factors, linear, nf: int, params: dict, loss: str, initial_factors):
    """One attempt of the fit on freshly created tensors: iterate, then read the model."""
    if initial_factors is not None:
        v0 = np.asarray(initial_factors, dtype=np.float64)
        if v0.shape != (nf, int(params["factorSize"])):
            raise ValueError(
                f"initial factors of shape {v0.shape}, expected ({nf}, {params['factorSize']})"
            )
        factors.update(np.arange(nf, dtype=np.int64), v0)
    estimator = "FMClassifier" if loss == "logistic" else "FMRegressor"
    bar = Progress(f"spark-ps {estimator}", int(params["maxIter"]))
    try:
        history, iters = _iterate(job, ps, factors, linear, nf, params, loss, bar)
    finally:
        bar.close()
    keys, v = factors.pull()
    lkeys, w = linear.pull()
    lkeys, w = np.asarray(lkeys), np.asarray(w, dtype=np.float64).reshape(-1)
    at_b = lkeys == nf
    intercept = float(w[at_b][0]) if at_b.any() and params["fitIntercept"] else 0.0
    keep = ~at_b if params["fitLinear"] else np.zeros(lkeys.size, dtype=bool)
    return FMResult(
        nf,
        np.asarray(keys, dtype=np.int64),
        np.asarray(v, dtype=np.float64).reshape(len(keys), -1),
        lkeys[keep],
        w[keep],
        intercept,
        history,
        iters,
        int(len(keys) + lkeys.size),
    )


def _iterate(
    job, ps, factors, linear, nf: int, params: dict, loss: str, bar: Progress
) -> tuple[list, int]:
    """MLlib's GradientDescent loop; returns (objective history, iterations run).

    As MLlib 4.3's: a fit that runs all maxIter steps without converging ends with one
    more pass that only measures the objective at the final weights, so its history holds
    maxIter + 1 values (the first at the initial weights). `bar` gets each value past the
    first as it is measured: the objective after that many steps (as LR's progress).
    """
    history: list[float] = []

    def measured(value: float) -> None:
        history.append(value)
        if len(history) > 1:  # the first is the initial weights' objective
            bar.update(len(history) - 1, loss=value)

    stepped, converged = 0, False
    reg, tol, max_iter = float(params["regParam"]), float(params["tol"]), int(params["maxIter"])
    specs = [factors.spec, linear.spec]
    cmd = dict(
        factors=factors.name,
        linear=linear.name,
        num_features=nf,
        factor_size=int(params["factorSize"]),
        fit_linear=bool(params["fitLinear"]),
        fit_intercept=bool(params["fitIntercept"]),
        loss=loss,
        fraction=float(params["miniBatchFraction"]),
        seed=int(params["seed"]),
    )
    i = 0
    while not converged and i < max_iter + 1:
        i += 1
        last = i == max_iter + 1
        r, (loss_sum, count) = job.call("grad", iteration=i, loss_only=last, **cmd)
        if count <= 0:
            log.warning("FM iteration %d/%d: the sampled batch is empty", i, max_iter)
            ps.client.call("fm.discard", specs, {"round": r})
            continue
        if last:
            norm2 = sum(m["sumsq"] for m, _ in ps.client.call("fm.sumsq", specs, direct=False))
            measured(loss_sum / count + 0.5 * reg * norm2)
            break
        lr = float(params["stepSize"]) / (math.sqrt(i) if params["solver"] == "gd" else 1.0)
        args = {
            "round": r,
            "parts": job.num_workers,
            "scale": 1.0 / count,
            "solver": params["solver"],
            "lr": lr,
            "reg": reg,
        }
        res = [m for m, _ in ps.client.call("fm.step", specs, args)]
        before, after, diff = (sum(m[k] for m in res) for k in ("before", "after", "diff"))
        measured(loss_sum / count + 0.5 * reg * before)
        stepped += 1
        converged = stepped > 1 and math.sqrt(diff) < tol * max(math.sqrt(after), 1.0)
    return history, min(i, max_iter)
