"""Mini-batch solvers for LogisticRegression (``solver`` = sgd, adam or ftrl).

For data where a full-batch optimum is not the point: each worker walks its cached
partition in shuffled mini-batches of ``batchSize`` rows, pulls the weights of the keys a
batch touches and pushes the batch's mean gradient; the optimizer step (SGD, Adam or
FTRL-proximal, with ``stepSize`` as its rate) runs on the PS shards, beside its state.

Consistency within an epoch is the ``staleness`` Param; each mini-batch is one clock of
the coordinator's clock table:

* ``staleness=0`` (the default) is BSP: a worker starts mini-batch c+1 only when every
  worker has pushed mini-batch c.
* ``staleness=s > 0`` is SSP(s): a worker may run at most s mini-batches ahead of the
  slowest live worker.
* ``staleness=-1`` is ASP: workers never wait for each other within an epoch.

A worker that has walked its whole partition leaves the epoch's clock table, and so does
one whose executor is lost (the JVM bridge's listener removes ``executor:<id>/...``
workers), so nobody waits for it. Epochs are always synchronized through the round board.
Pushes are at-least-once (a replayed push after a retry is applied again). A PS shard
that restarts during the fit makes it start over (set-up and epochs; the optimizer's
state lives only on the PS). Features are
not standardized. L2 (``regParam * (1 - elasticNetParam)``) enters
the gradient of the touched weights; FTRL also takes the L1 part in its proximal step.
"""

from __future__ import annotations

import logging
import time

import numpy as np

from spark_ps.context import PSContext
from spark_ps.ml._job import best_effort, task_slots
from spark_ps.ml._progress import Progress
from spark_ps.ml._recovery import FitRecovery
from spark_ps.ml.base import PreparedData
from spark_ps.ml.lr import distributed as full_batch
from spark_ps.ml.lr.estimator import TrainResult, register_trainer
from spark_ps.ml.lr.rounds import ASP, CLOCK_TIMEOUT, rows_job
from spark_ps.models import PSVector

__all__ = ["train_minibatch"]

log = logging.getLogger("spark_ps.ml.lr")


def _optimizer(params: dict) -> tuple[str, dict]:
    solver, rate = params["solver"], float(params["stepSize"])
    reg, enet = float(params["regParam"]), float(params["elasticNetParam"])
    if solver == "ftrl":
        return "ftrl", {"alpha": rate, "beta": 1.0, "l1": reg * enet, "l2": reg * (1 - enet)}
    return solver, {"lr": rate}


def _check_slots(prepared: PreparedData, staleness: int) -> None:
    """BSP/SSP workers wait for each other: all of them must run at once."""
    slots = task_slots(prepared.df.sparkSession.sparkContext)
    if staleness != ASP and prepared.num_workers > slots:
        raise ValueError(
            f"staleness={staleness} ({'BSP' if staleness == 0 else 'SSP'}) needs every worker "
            f"running at once, but numWorkers={prepared.num_workers} exceeds the {slots} task "
            f"slots; lower numWorkers or use staleness={ASP} (ASP)"
        )


def train_minibatch(prepared: PreparedData, params: dict) -> TrainResult:
    """The sgd/adam/ftrl trainer: maxIter epochs, stopping early when the epoch loss
    improves by less than ``tol`` (relative)."""
    _check_slots(prepared, int(params.get("staleness", 0)))
    ps = PSContext.getOrCreate(prepared.df.sparkSession)
    solver, opt = _optimizer(params)
    l2 = 0.0 if solver == "ftrl" else float(params["regParam"]) * (1 - params["elasticNetParam"])
    name = f"LogisticRegression(solver={solver}, maxIter={params['maxIter']})"
    job = rows_job(ps, prepared, name)
    with job:
        # a shard restart starts the fit over (set-up and epochs) under fresh names: the
        # optimizer's state lives only on the PS (see spark_ps.ml._recovery)
        recovery = FitRecovery(job, -1, ps_state=True, what=job.name)
        return recovery.run(
            lambda _resume: _epochs(job, ps, prepared, params, recovery.prefix, solver, opt, l2)
        )


def _epochs(job, ps, prepared, params, prefix: str, solver: str, opt: dict, l2: float):
    """Set-up and every epoch of one attempt of the fit, its tensors named under `prefix`."""
    t_start, base = time.perf_counter(), job.round  # rounds before this attempt
    staleness = int(params.get("staleness", 0))
    fit_intercept = bool(params["fitIntercept"])
    ks = full_batch._key_space(job, ps, prepared, prefix=prefix)
    try:
        dim = ks.size + int(fit_intercept)
        model = PSVector.dense(
            max(dim, 1), name=f"{prefix}/model", optimizer=solver, context=ps, **opt
        )
    except BaseException:
        best_effort("dropping the key set", ks.keyset.drop)
        raise
    try:
        history, stamps = [], []
        bar = Progress(
            f"spark-ps LogisticRegression ({solver})", int(params["maxIter"]), unit="epoch"
        )
        try:  # a failed attempt ends its curve too
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
                    staleness=staleness,
                    num_workers=prepared.num_workers,
                    clock_timeout=CLOCK_TIMEOUT,
                    round_base=base,
                )
                history.append(loss / wsum)
                stamps.append(time.perf_counter() - t_start)
                bar.update(epoch + 1, loss=history[-1])
                if len(history) > 1 and abs(history[-2] - history[-1]) <= params["tol"] * abs(
                    history[-2]
                ):
                    break
        finally:
            bar.close()
        keys, ids = ks.touched()
        w = model.pull()
        intercept = float(w[ks.size]) if fit_intercept else 0.0
        coef = w[ids] if keys.size else np.zeros(0)
        result = full_batch._result(ks, keys, coef, intercept, history, len(history))
        result.iteration_timestamps = stamps
        return result
    finally:  # clean-up must not hide the fit's own error (see best_effort)
        best_effort("dropping the model", model.drop)
        best_effort("dropping the key set", ks.keyset.drop)


for _solver in ("sgd", "adam", "ftrl"):
    register_trainer(_solver, train_minibatch)
