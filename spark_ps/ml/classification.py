"""Drop-in replacements for `pyspark.ml.classification`, trained on the parameter server.

Change ``from pyspark.ml.classification import LogisticRegression`` to
``from spark_ps.ml.classification import LogisticRegression``; nothing else changes.
"""

from spark_ps.ml.fm.estimator import FMClassifier
from spark_ps.ml.fm.model import FMClassificationModel
from spark_ps.ml.gbt import distributed as _gbt  # noqa: F401 - registers the GBT trainer
from spark_ps.ml.gbt.estimator import GBTClassifier
from spark_ps.ml.gbt.model import GBTClassificationModel
from spark_ps.ml.linear.svc import (
    LinearSVC,
    LinearSVCModel,
    LinearSVCSummary,
    LinearSVCTrainingSummary,
)
from spark_ps.ml.lr import lbfgs as _lbfgs  # noqa: F401 - registers the lbfgs trainer
from spark_ps.ml.lr import minibatch as _minibatch  # noqa: F401 - registers sgd/adam/ftrl
from spark_ps.ml.lr.estimator import LogisticRegression
from spark_ps.ml.lr.model import LogisticRegressionModel
from spark_ps.ml.lr.ps_model import PSLogisticRegressionModel
from spark_ps.ml.lr.summary import (
    BinaryLogisticRegressionSummary,
    BinaryLogisticRegressionTrainingSummary,
)

__all__ = [
    "FMClassifier",
    "FMClassificationModel",
    "GBTClassifier",
    "GBTClassificationModel",
    "LogisticRegression",
    "LogisticRegressionModel",
    "PSLogisticRegressionModel",
    "BinaryLogisticRegressionSummary",
    "BinaryLogisticRegressionTrainingSummary",
    "LinearSVC",
    "LinearSVCModel",
    "LinearSVCSummary",
    "LinearSVCTrainingSummary",
]
