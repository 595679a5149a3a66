"""The ``lbfgs`` trainer of LogisticRegression: the binomial fit
(:mod:`spark_ps.ml.lr.distributed`) or the multinomial one (:mod:`spark_ps.ml.lr.multinomial`),
registered with :func:`~spark_ps.ml.lr.estimator.register_trainer` on import."""

from __future__ import annotations

import time

import numpy as np

from spark_ps.context import PSContext
from spark_ps.ml._job import PSJob, best_effort
from spark_ps.ml.base import PreparedData
from spark_ps.ml.lr.distributed import _Phases, lr_job, read_dims, train_lbfgs_binomial
from spark_ps.ml.lr.estimator import LabelRules, TrainResult, register_trainer
from spark_ps.ml.lr.multinomial import train_lbfgs_multinomial
from spark_ps.ml.lr.rounds import DIMS_LABELS

__all__ = ["train_lbfgs"]


def train_lbfgs(
    prepared: PreparedData, params: dict, labels: LabelRules | None = None
) -> TrainResult:
    """Fit MLlib's objective on the PS: multinomial when ``params["multinomial"]``. The
    binomial fit takes validation rows (``prepared.validation_col``): it trains on the
    others and reports the validation AUC of each iteration.

    With `labels` the family is decided here instead: the workers count the labels as they
    read the rows (the ``dims`` round, before any PS model exists), and the binomial or
    multinomial fit goes on in the same worker job. Only when a worker's read refused a row
    does the estimator's Spark job run, to word MLlib's error."""
    if labels is None and params.get("multinomial") and prepared.validation_col is not None:
        raise ValueError(
            "validationIndicatorCol is supported by the binomial L-BFGS fit, not by a "
            f"multinomial one ({params.get('numClasses')} classes)"
        )
    phases = _Phases(time.perf_counter())
    ps = PSContext.getOrCreate(prepared.df.sparkSession)
    with lr_job(ps, prepared, params, refuse=labels is not None) as job:
        dims = None
        if labels is not None:
            dims = _read_rows(job, prepared, labels, phases)
            num_classes, multinomial = labels.decide(_label_counts(dims, prepared))
            params = dict(params, numClasses=num_classes, multinomial=multinomial)
        fit = train_lbfgs_multinomial if params.get("multinomial") else train_lbfgs_binomial
        return fit(prepared, params, job, dims, phases)


def _read_rows(job: PSJob, prepared: PreparedData, labels: LabelRules, phases) -> np.ndarray:
    """The ``dims`` round; if a worker's read refused a row (or the job ended before it
    answered: an empty input), the job stops and the estimator's check job words MLlib's
    error (else the workers' reason is the error)."""
    try:
        dims = read_dims(job, phases)
        refused = _refused(job, prepared, dims)
        if refused:
            raise ValueError(refused)
    except Exception:
        # it holds the task slots the check job needs (a PS gone must not hide the error)
        best_effort(f"{job.name}: stopping the worker job", lambda: job.stop(False))
        labels.check_rows()  # MLlib's error for the first bad row, if there is one
        raise
    return dims


def _refused(job: PSJob, prepared: PreparedData, dims: np.ndarray) -> str:
    """Why the rows cannot train as read ('' if they can): a partition's read refused a
    row, or vector sizes differ across partitions."""
    refused = np.flatnonzero(dims[:, DIMS_LABELS] > 0)
    if refused.size:
        return job.refusal(int(refused[0]))
    sizes = sorted({int(v) for v in dims[:, 0] if v > 0})
    if len(sizes) > 1 and prepared.features_kind != "keys":
        return f"feature vectors have inconsistent sizes across partitions: {sizes}"
    return ""


def _label_counts(dims: np.ndarray, prepared: PreparedData) -> dict:
    """The partitions' label summaries (`rounds.label_summary`) as :class:`LabelRules`
    counts."""
    n, top, vtop, bad = dims[:, DIMS_LABELS + 1 : DIMS_LABELS + 5].T
    has_val = prepared.validation_col is not None and vtop.max() >= 0
    return {
        "n": int(n.sum()),
        "bad": int(bad.sum()),
        "max": float(top.max()),
        "vmax": float(vtop.max()) if has_val else None,
    }


train_lbfgs.takes_validation = True  # type: ignore[attr-defined]  # see LogisticRegression._fit


register_trainer("lbfgs", train_lbfgs)
