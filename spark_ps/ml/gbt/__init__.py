"""Gradient-boosted trees with MLlib's API: estimators, models, Params and the trainer registry.

The training itself (distributed histogram GBDT on the PS) plugs in through
:func:`register_trainer`; see :mod:`spark_ps.ml.gbt.estimator` for the contract.

The names below load on first use (PEP 562): Spark's Python workers import this package
for the boosting rounds only, and the estimators would bring ``pyspark.ml`` (and pandas)
with them, ~1 s of every cold worker's start.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_WHERE = {
    "GBTClassifier": "estimator",
    "GBTRegressor": "estimator",
    "register_trainer": "estimator",
    "registered_trainer": "estimator",
    "DecisionTreeRegressionModel": "model",
    "GBTClassificationModel": "model",
    "GBTRegressionModel": "model",
    "GBTClassifierParams": "params",
    "GBTRegressorParams": "params",
}

__all__ = [
    "DecisionTreeRegressionModel",
    "GBTClassificationModel",
    "GBTClassifier",
    "GBTClassifierParams",
    "GBTRegressionModel",
    "GBTRegressor",
    "GBTRegressorParams",
    "register_trainer",
    "registered_trainer",
]

if TYPE_CHECKING:
    from spark_ps.ml.gbt.estimator import (
        GBTClassifier,
        GBTRegressor,
        register_trainer,
        registered_trainer,
    )
    from spark_ps.ml.gbt.model import (
        DecisionTreeRegressionModel,
        GBTClassificationModel,
        GBTRegressionModel,
    )
    from spark_ps.ml.gbt.params import GBTClassifierParams, GBTRegressorParams


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_WHERE))
