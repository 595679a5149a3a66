"""Mini-batch solvers for LogisticRegression (``solver`` = sgd, adam or ftrl).

For data where a full-batch optimum is not the point: each worker walks its cached
partition in shuffled mini-batches of ``batchSize`` rows, pulls the weights of the keys a
batch touches and pushes the batch's mean gradient; the optimizer step (SGD, Adam or
FTRL-proximal, with ``stepSize`` as its rate) runs on the PS shards, beside its state.
Workers push without waiting for each other within an epoch (asynchronous, Hogwild-style:
a replayed push after a retry is applied again); epochs are synchronized through the round
board. Features are not standardized. L2 (``regParam * (1 - elasticNetParam)``) enters
the gradient of the touched weights; FTRL also takes the L1 part in its proximal step.
"""

from __future__ import annotations

import logging
import time

import numpy as np

from spark_ps.context import PSContext
from spark_ps.data import iter_minibatches
from spark_ps.ml._job import PSJob, WorkerContext
from spark_ps.ml._progress import Progress
from spark_ps.ml.base import PreparedData
from spark_ps.ml.lr import distributed as full_batch
from spark_ps.ml.lr.estimator import TrainResult, register_trainer
from spark_ps.ml.lr.objective import loss_and_grad
from spark_ps.models import PSVector

__all__ = ["train_minibatch"]

log = logging.getLogger("spark_ps.ml.lr")


def _epoch(ctx: WorkerContext, round_: int, cmd: dict) -> None:
    """One pass over this partition in mini-batches; each pushes an optimizer step."""
    cids, clocal = full_batch._compact(ctx, cmd["keyset"])
    model, last = ctx.tensor(cmd["model"]), cmd["dim"] - 1
    fit_intercept, l2 = cmd["fit_intercept"], cmd["l2"]
    loss_sum = weight_sum = 0.0
    seed = (cmd["seed"] * 1_000_003 + round_ * 7919 + ctx.part) & 0x7FFFFFFF
    for mb in iter_minibatches(clocal, cmd["batch_size"], shuffle=True, seed=seed):
        keys, loc = mb.localize()
        gk = cids[keys]
        pull_keys = np.append(gk, last) if fit_intercept else gk
        w = model.pull(pull_keys)
        coef, b = (w[:-1], w[-1]) if fit_intercept else (w, 0.0)
        loss, grad, grad_b, ws = loss_and_grad(loc, coef, b, np.ones(coef.size), fit_intercept)
        if ws <= 0:
            continue
        grad = grad / ws + l2 * coef
        step = np.append(grad, grad_b / ws) if fit_intercept else grad
        model.push(pull_keys, step)
        loss_sum, weight_sum = loss_sum + loss, weight_sum + ws
    ctx.contribute(round_, [loss_sum, weight_sum])


_HANDLERS = {**full_batch._HANDLERS, "epoch": _epoch}


def _optimizer(params: dict) -> tuple[str, dict]:
    solver, rate = params["solver"], float(params["stepSize"])
    reg, enet = float(params["regParam"]), float(params["elasticNetParam"])
    if solver == "ftrl":
        return "ftrl", {"alpha": rate, "beta": 1.0, "l1": reg * enet, "l2": reg * (1 - enet)}
    return solver, {"lr": rate}


def train_minibatch(prepared: PreparedData, params: dict) -> TrainResult:
    """The sgd/adam/ftrl trainer: maxIter epochs, stopping early when the epoch loss
    improves by less than ``tol`` (relative)."""
    t_start = time.perf_counter()
    if int(params.get("staleness", 0)) > 0:
        raise NotImplementedError(
            f"staleness={params['staleness']}: bounded-staleness (SSP) mini-batch training is "
            "not implemented; the mini-batch solvers push asynchronously within an epoch and "
            "synchronize between epochs (leave staleness at 0)"
        )
    ps = PSContext.getOrCreate(prepared.df.sparkSession)
    fit_intercept = bool(params["fitIntercept"])
    solver, opt = _optimizer(params)
    l2 = 0.0 if solver == "ftrl" else float(params["regParam"]) * (1 - params["elasticNetParam"])
    job = PSJob(
        ps,
        prepared.df,
        prepared.num_workers,
        full_batch._setup(prepared),
        _HANDLERS,
        name=f"LogisticRegression(solver={solver}, maxIter={params['maxIter']})",
    )
    with job:
        ks = full_batch._key_space(job, ps, prepared)
        dim = ks.size + int(fit_intercept)
        model = PSVector.dense(
            max(dim, 1), name=f"{job.topic}/model", optimizer=solver, context=ps, **opt
        )
        try:
            history, stamps = [], []
            bar = Progress(
                f"spark-ps LogisticRegression ({solver})", int(params["maxIter"]), unit="epoch"
            )
            for epoch in range(int(params["maxIter"])):
                _, (loss, wsum) = job.call(
                    "epoch",
                    keyset=ks.keyset.name,
                    model=model.name,
                    dim=dim,
                    fit_intercept=fit_intercept,
                    l2=l2,
                    batch_size=int(params["batchSize"]),
                    seed=int(epoch),
                )
                history.append(loss / wsum)
                stamps.append(time.perf_counter() - t_start)
                bar.update(epoch + 1, loss=history[-1])
                if len(history) > 1 and abs(history[-2] - history[-1]) <= params["tol"] * abs(
                    history[-2]
                ):
                    break
            bar.close()
            keys, ids = ks.keyset.pull()
            w = model.pull()
            intercept = float(w[ks.size]) if fit_intercept else 0.0
            coef = w[ids.astype(np.int64)] if keys.size else np.zeros(0)
            result = full_batch._result(ks, keys, coef, intercept, history, len(history))
            result.iteration_timestamps = stamps
            return result
        finally:
            model.drop()
            ks.keyset.drop()


for _solver in ("sgd", "adam", "ftrl"):
    register_trainer(_solver, train_minibatch)
