"""Params of spark-ps's GBTClassifier / GBTRegressor and their models.

The Params are pyspark's own classes (``_GBTClassifierParams``, ``_GBTRegressorParams`` and the
shared ``HasX`` mixins), so names, docs, defaults and type converters are MLlib's by
construction; spark-ps only *adds* Params (``numWorkers``, the GOSS option). Value checks
live in one ``_validate_params()`` that runs first in ``fit`` and names the Param and the
value, because pyspark's Python Params do no range checking and the JVM that normally does
is not involved.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from pyspark.ml.base import _PredictorParams
from pyspark.ml.classification import _GBTClassifierParams as _MLlibGBTClassifierParams
from pyspark.ml.classification import _ProbabilisticClassifierParams
from pyspark.ml.param import Param, Params, TypeConverters
from pyspark.ml.regression import _GBTRegressorParams as _MLlibGBTRegressorParams
from pyspark.ml.tree import _TreeEnsembleParams

__all__ = [
    "HasGOSS",
    "HasNumWorkers",
    "GBTClassifierParams",
    "GBTRegressorParams",
    "NOT_APPLICABLE_PARAMS",
]

#: MLlib memory/caching hints that have no meaning here: histograms live on the PS shards and each
#: worker keeps its rows' node ids in memory, so there is no node-id RDD to cache and no
#: driver-side aggregation buffer to size. They are accepted (so MLlib code runs unchanged) and
#: ignored. ``checkpointInterval`` keeps MLlib's meaning for the PS: every that many trees the
#: fit checkpoints the PS (with its trees so far) when ``spark.ps.checkpointDir`` is set.
NOT_APPLICABLE_PARAMS: tuple[str, ...] = ("maxMemoryInMB", "cacheNodeIds")


class HasNumWorkers(Params):
    """Mixin for the spark-ps Param ``numWorkers`` (an addition; MLlib has no such Param)."""

    numWorkers: Param[int] = Param(
        Params._dummy(),
        "numWorkers",
        "Number of PS workers (Spark tasks) that stream the training data; 0 means one per "
        "task slot of the cluster (the executors' cores over spark.task.cpus; each worker's "
        "kernels use its spark.task.cpus threads). (>= 0)",
        typeConverter=TypeConverters.toInt,
    )

    def __init__(self) -> None:
        super().__init__()
        self._setDefault(numWorkers=0)

    def getNumWorkers(self) -> int:
        """Gets the value of numWorkers or its default value."""
        return self.getOrDefault(self.numWorkers)


class HasGOSS(Params):
    """Mixin for spark-ps's GOSS Params (additions; MLlib has no such Params): LightGBM's
    gradient-based one-side sampling, off by default (see :mod:`spark_ps.ml.tree.goss`)."""

    gossTopRate: Param[float] = Param(
        Params._dummy(),
        "gossTopRate",
        "Gradient-based one-side sampling (GOSS, as LightGBM's): each tree after the first "
        "1/stepSize grows from at least this fraction of the training rows with the largest "
        "|weight * pseudo-residual| plus a random gossOtherRate of all rows drawn from the "
        "rest, whose weights are scaled up to stand for it. Faster trees, at some accuracy; "
        "0 turns it off (the default: MLlib's trees). Not with subsamplingRate < 1. "
        "(>= 0, < 1)",
        typeConverter=TypeConverters.toFloat,
    )
    gossOtherRate: Param[float] = Param(
        Params._dummy(),
        "gossOtherRate",
        "With gossTopRate > 0: the fraction of all training rows drawn at random from those "
        "not in the top. (> 0, <= 1 - gossTopRate)",
        typeConverter=TypeConverters.toFloat,
    )

    def __init__(self) -> None:
        super().__init__()
        self._setDefault(gossTopRate=0.0, gossOtherRate=0.1)

    def getGossTopRate(self) -> float:
        """Gets the value of gossTopRate or its default value."""
        return self.getOrDefault(self.gossTopRate)

    def getGossOtherRate(self) -> float:
        """Gets the value of gossOtherRate or its default value."""
        return self.getOrDefault(self.gossOtherRate)


def _is_feature_subset_strategy(value: str) -> bool:
    """MLlib's rule: a named strategy, an integer n > 0, or a fraction in (0, 1]."""
    if value.lower() in _TreeEnsembleParams.supportedFeatureSubsetStrategies:
        return True
    try:
        return int(value) > 0
    except ValueError:
        pass
    try:
        return 0.0 < float(value) <= 1.0
    except ValueError:
        return False


def _thresholds_ok(t: list[float]) -> bool:
    return all(x >= 0 for x in t) and sum(1 for x in t if x == 0) <= 1


# (param name, predicate on the value, human description of the valid range); MLlib's validators.
_RULES: tuple[tuple[str, Any, str], ...] = (
    ("maxDepth", lambda v: 0 <= v <= 30, "must be in range [0, 30]"),
    ("maxBins", lambda v: v >= 2, "must be >= 2"),
    ("minInstancesPerNode", lambda v: v >= 1, "must be >= 1"),
    ("minInfoGain", lambda v: v >= 0.0, "must be >= 0"),
    ("minWeightFractionPerNode", lambda v: 0.0 <= v < 0.5, "must be in range [0, 0.5)"),
    ("maxMemoryInMB", lambda v: v >= 0, "must be >= 0"),
    ("checkpointInterval", lambda v: v == -1 or v >= 1, "must be -1 or >= 1"),
    ("maxIter", lambda v: v >= 1, "must be >= 1 (a GBT model needs at least one tree)"),
    ("stepSize", lambda v: 0.0 < v <= 1.0, "must be in range (0, 1]"),
    ("subsamplingRate", lambda v: 0.0 < v <= 1.0, "must be in range (0, 1]"),
    ("validationTol", lambda v: v >= 0.0, "must be >= 0"),
    (
        "featureSubsetStrategy",
        _is_feature_subset_strategy,
        "supported: auto, all, onethird, sqrt, log2, a fraction in (0, 1] or an integer n >= 1",
    ),
    ("impurity", lambda v: v.lower() == "variance", "supported: variance"),
    ("numWorkers", lambda v: v >= 0, "must be >= 0"),
    ("gossTopRate", lambda v: 0.0 <= v < 1.0, "must be in range [0, 1)"),
    ("gossOtherRate", lambda v: 0.0 < v <= 1.0, "must be in range (0, 1]"),
    ("thresholds", _thresholds_ok, "must be >= 0 with at most one 0"),
)


class _GBTValidation(Params):
    """One place for the range checks of every GBT Param (MLlib's ``ParamValidators``)."""

    supportedLossTypes: list[str]

    def _validate_params(self) -> None:
        """Raise ValueError naming the first Param whose value MLlib would reject.

        The wording follows MLlib's ``"<uid> parameter <name> given invalid value <value>."``
        and adds the valid range.
        """
        for name, ok, why in _RULES:
            if self.hasParam(name) and self.isDefined(name):
                value = self.getOrDefault(name)
                if not ok(value):
                    raise ValueError(
                        f"{self.uid} parameter {name} given invalid value {value!r}: {why}."
                    )
        self._validate_goss()
        loss = self.getOrDefault("lossType")
        if loss.lower() not in self.supportedLossTypes:
            raise ValueError(
                f"{self.uid} parameter lossType given invalid value {loss!r}: supported: "
                f"{', '.join(self.supportedLossTypes)} (case-insensitive)."
            )

    def _validate_goss(self) -> None:
        top = self.getOrDefault("gossTopRate")
        if top == 0.0:
            return
        other, rate = self.getOrDefault("gossOtherRate"), self.getOrDefault("subsamplingRate")
        if top + other > 1.0:
            raise ValueError(
                f"{self.uid} parameters gossTopRate + gossOtherRate given invalid values "
                f"{top!r} + {other!r}: their sum must be <= 1."
            )
        if rate < 1.0:
            raise ValueError(
                f"{self.uid} parameter subsamplingRate given invalid value {rate!r} with "
                f"gossTopRate={top!r}: GOSS replaces subsampling; leave it at 1.0."
            )

    def _check_unsupported(self, unsupported: Iterable[str], by: str) -> None:
        """Fail loudly when a Param the trainer does not honour is set away from its default."""
        for name in unsupported:
            if not self.hasParam(name) or not self.isSet(name):
                continue
            value = self.getOrDefault(name)
            default = self._defaultParamMap.get(self.getParam(name))
            if value != default:
                raise ValueError(
                    f"{self.uid} parameter {name}={value!r} is not supported by {by}; "
                    f"leave it at its default {default!r}."
                )


class GBTClassifierParams(
    _ProbabilisticClassifierParams,
    _MLlibGBTClassifierParams,
    HasNumWorkers,
    HasGOSS,
    _GBTValidation,
):
    """Params of :class:`GBTClassifier` and :class:`GBTClassificationModel`.

    Exactly MLlib's GBTClassifier Params (same names, docs, defaults and converters) plus
    ``numWorkers`` and the GOSS option (``gossTopRate``, ``gossOtherRate``; off by default).
    ``maxMemoryInMB`` and ``cacheNodeIds`` are accepted and ignored: the PS keeps the
    histograms and every worker keeps its rows' node ids, so there is nothing to size or
    cache. ``checkpointInterval``: the PS is checkpointed every that many trees (with the
    trees so far) when ``spark.ps.checkpointDir`` is set.
    """


class GBTRegressorParams(
    _PredictorParams, _MLlibGBTRegressorParams, HasNumWorkers, HasGOSS, _GBTValidation
):
    """Params of :class:`GBTRegressor` and :class:`GBTRegressionModel`.

    Exactly MLlib's GBTRegressor Params plus ``numWorkers`` and the GOSS option;
    ``maxMemoryInMB`` and ``cacheNodeIds`` are accepted and ignored, ``checkpointInterval``
    checkpoints the PS (see :class:`GBTClassifierParams`).
    """
