"""Drop-in replacements for `pyspark.ml.regression`, trained on the parameter server."""

from spark_ps.ml.fm.estimator import FMRegressor
from spark_ps.ml.fm.model import FMRegressionModel
from spark_ps.ml.gbt import distributed as _gbt  # noqa: F401 - registers the GBT trainer
from spark_ps.ml.gbt.estimator import GBTRegressor
from spark_ps.ml.gbt.model import GBTRegressionModel
from spark_ps.ml.linear.regression import (
    LinearRegression,
    LinearRegressionModel,
    LinearRegressionSummary,
    LinearRegressionTrainingSummary,
)

__all__ = [
    "FMRegressor",
    "FMRegressionModel",
    "GBTRegressor",
    "GBTRegressionModel",
    "LinearRegression",
    "LinearRegressionModel",
    "LinearRegressionSummary",
    "LinearRegressionTrainingSummary",
]
