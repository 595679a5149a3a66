"""Gradient-boosted trees with MLlib's API: estimators, models, Params and the trainer registry.

The training itself (distributed histogram GBDT on the PS) plugs in through
:func:`register_trainer`; see :mod:`spark_ps.ml.gbt.estimator` for the contract.
"""

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
