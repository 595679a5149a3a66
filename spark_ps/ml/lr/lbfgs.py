"""The ``lbfgs`` trainer of LogisticRegression: the binomial fit
(:mod:`spark_ps.ml.lr.distributed`) or the multinomial one (:mod:`spark_ps.ml.lr.multinomial`),
registered with :func:`~spark_ps.ml.lr.estimator.register_trainer` on import."""

from __future__ import annotations

from spark_ps.ml.base import PreparedData
from spark_ps.ml.lr.distributed import train_lbfgs_binomial
from spark_ps.ml.lr.estimator import TrainResult, register_trainer
from spark_ps.ml.lr.multinomial import train_lbfgs_multinomial

__all__ = ["train_lbfgs"]


def train_lbfgs(prepared: PreparedData, params: dict) -> TrainResult:
    """Fit MLlib's objective on the PS: multinomial when ``params["multinomial"]``. The
    binomial fit takes validation rows (``prepared.validation_col``): it trains on the
    others and reports the validation AUC of each iteration."""
    if params.get("multinomial"):
        if prepared.validation_col is not None:
            raise ValueError(
                "validationIndicatorCol is supported by the binomial L-BFGS fit, not by a "
                f"multinomial one ({params.get('numClasses')} classes)"
            )
        return train_lbfgs_multinomial(prepared, params)
    return train_lbfgs_binomial(prepared, params)


train_lbfgs.takes_validation = True  # type: ignore[attr-defined]  # see LogisticRegression._fit


register_trainer("lbfgs", train_lbfgs)
