"""Every private py4j/JVM access of spark_ps, in one place.

A Spark version bump or a move to Spark Connect then touches this file only. Public pyspark
APIs (DataFrame, pyspark.ml wrappers) are used directly elsewhere; what lives here reaches
into JVM classes that pyspark does not expose.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from py4j.java_gateway import JavaObject
    from pyspark.sql import DataFrame

__all__ = ["binary_lr_summary", "multiclass_lr_summary"]

_CLASSIFICATION = "org.apache.spark.ml.classification"


def _jvm_class(dataframe: DataFrame, name: str):
    """The JVM class ``name`` in the gateway of ``dataframe``'s session."""
    jvm = dataframe.sparkSession.sparkContext._jvm
    if jvm is None:
        raise RuntimeError("spark_ps needs a classic (JVM-backed) SparkSession, not Spark Connect")
    return getattr(getattr(jvm, _CLASSIFICATION), name)


def binary_lr_summary(
    predictions: DataFrame,
    probability_col: str,
    prediction_col: str,
    label_col: str,
    features_col: str,
    weight_col: str,
) -> JavaObject:
    """MLlib's own binary LR summary over ``predictions`` (JVM object, metrics computed lazily).

    Using MLlib's class makes every metric (BinaryClassificationMetrics with 100 bins,
    MulticlassMetrics) equal to MLlib's by construction and keeps all row work on the JVM.
    A ``weight_col`` absent from ``predictions`` means weight 1.0, as in MLlib.
    """
    impl = _jvm_class(predictions, "BinaryLogisticRegressionSummaryImpl")
    return impl(
        predictions._jdf, probability_col, prediction_col, label_col, features_col, weight_col
    )


def multiclass_lr_summary(
    predictions: DataFrame,
    probability_col: str,
    prediction_col: str,
    label_col: str,
    features_col: str,
    weight_col: str,
) -> JavaObject:
    """MLlib's multiclass LR summary over ``predictions``; see :func:`binary_lr_summary`."""
    impl = _jvm_class(predictions, "LogisticRegressionSummaryImpl")
    return impl(
        predictions._jdf, probability_col, prediction_col, label_col, features_col, weight_col
    )
