"""Params of the online FTRL-proximal learner (pyspark.ml style, defaults in one place)."""

from __future__ import annotations

from typing import Any

from pyspark.ml.param import Param, Params, TypeConverters
from pyspark.ml.param.shared import HasFeaturesCol, HasFitIntercept, HasLabelCol, HasWeightCol

__all__ = ["_OnlineLogisticRegressionParams"]


def _param(name: str, doc: str, conv: Any) -> Param:
    return Param(Params._dummy(), name, doc, typeConverter=conv)


class _OnlineLogisticRegressionParams(HasFeaturesCol, HasLabelCol, HasWeightCol, HasFitIntercept):
    """FTRL-proximal (McMahan et al. 2013) hyper-parameters and the input columns."""

    alpha: Param[float] = _param("alpha", "FTRL learning rate alpha (> 0).", TypeConverters.toFloat)
    beta: Param[float] = _param(
        "beta", "FTRL smoothing beta of the per-coordinate rate (>= 0).", TypeConverters.toFloat
    )
    l1: Param[float] = _param(
        "l1", "L1 strength (>= 0); gives exact zeros.", TypeConverters.toFloat
    )
    l2: Param[float] = _param("l2", "L2 strength (>= 0).", TypeConverters.toFloat)
    numFeatures: Param[int] = _param(
        "numFeatures",
        "Feature key space [0, numFeatures) (e.g. the hash dimension, up to 2^62); PS memory "
        "grows with the keys seen, not with this.",
        TypeConverters.toInt,
    )
    batchSize: Param[int] = _param(
        "batchSize",
        "Rows per FTRL step inside each task of a micro-batch (> 0).",
        TypeConverters.toInt,
    )
    featureValuesCol: Param[str] = _param(
        "featureValuesCol",
        "Optional array<double> column with the values of the keys of an array<bigint> "
        "featuresCol; if unset or empty every listed key has value 1.0.",
        TypeConverters.toString,
    )
    modelName: Param[str] = _param(
        "modelName",
        "Name of the model's tensors on the PS; give the same name (with the same query "
        "checkpointLocation) to resume after a restart. Empty = derived from the uid.",
        TypeConverters.toString,
    )
    psCheckpointInterval: Param[int] = _param(
        "psCheckpointInterval",
        "Snapshot the PS every this many committed micro-batches when the PS has a "
        "checkpoint directory (spark.ps.checkpointDir); 0 = never.",
        TypeConverters.toInt,
    )

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self._setDefault(
            alpha=0.1,
            beta=1.0,
            l1=0.0,
            l2=0.0,
            numFeatures=2**40,
            batchSize=256,
            featureValuesCol="",
            modelName="",
            psCheckpointInterval=1,
            fitIntercept=True,
            featuresCol="features",
            labelCol="label",
        )

    def _invalid(self, name: str, requirement: str) -> ValueError:
        return ValueError(f"{name} must be {requirement}, got {self.getOrDefault(name)!r}")

    def _validate_params(self) -> None:
        """Refuse out-of-range Params before anything touches the PS."""
        get = self.getOrDefault
        if not get("alpha") > 0:
            raise self._invalid("alpha", "> 0")
        for name in ("beta", "l1", "l2"):
            if not get(name) >= 0:
                raise self._invalid(name, ">= 0")
        if not 0 < get("numFeatures") < 2**62:
            raise self._invalid("numFeatures", "in (0, 2^62)")
        if not get("batchSize") > 0:
            raise self._invalid("batchSize", "> 0")
        if not get("psCheckpointInterval") >= 0:
            raise self._invalid("psCheckpointInterval", ">= 0")

    def _optional(self, param: Param) -> str | None:
        return (self.getOrDefault(param) or None) if self.isDefined(param) else None
