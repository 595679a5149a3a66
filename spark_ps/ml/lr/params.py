"""Params of spark-ps LogisticRegression: MLlib 4.3's, unchanged, plus the PS additions.

MLlib's Params are inherited from pyspark's own ``_LogisticRegressionParams`` (not re-declared),
so every name, doc, type converter and default is MLlib's by construction; a test checks it.
The additions only add knobs that MLlib has no notion of (solver choice, PS layout, consistency).
"""

from __future__ import annotations

import math
from typing import Any

from pyspark.ml.classification import _LogisticRegressionParams as _MLlibLogisticRegressionParams
from pyspark.ml.param import Param, Params, TypeConverters
from pyspark.ml.param.shared import HasCheckpointInterval, HasStepSize

__all__ = ["SOLVERS", "MINI_BATCH_SOLVERS", "_LogisticRegressionParams"]

#: Solvers accepted by the ``solver`` Param; ``lbfgs`` reaches MLlib's optimum.
SOLVERS = ("lbfgs", "sgd", "adam", "ftrl")
#: Solvers that stream mini-batches and so may run with ``staleness`` != 0 (SSP, ASP).
MINI_BATCH_SOLVERS = ("sgd", "adam", "ftrl")
_FAMILIES = ("auto", "binomial", "multinomial")
_BOUND_PARAMS = (
    "lowerBoundsOnCoefficients",
    "upperBoundsOnCoefficients",
    "lowerBoundsOnIntercepts",
    "upperBoundsOnIntercepts",
)


class _LogisticRegressionParams(_MLlibLogisticRegressionParams, HasStepSize, HasCheckpointInterval):
    """Params for spark-ps ``LogisticRegression`` and ``LogisticRegressionModel``.

    MLlib's Params (and their threshold/thresholds consistency rules) come from pyspark; the
    additions below are ours and never change the meaning of an MLlib Param.
    ``checkpointInterval`` is the shared pyspark Param (as on MLlib's tree ensembles): the
    lbfgs solver checkpoints the PS every that many iterations when
    ``spark.ps.checkpointDir`` is set, and otherwise keeps a copy of its iterate on the
    driver that often (-1: never; a shard restart then starts the fit over). Either way a
    fit survives a shard restart (``spark_ps.ml._recovery``). ``validationIndicatorCol`` is
    MLlib's GBT Param (same name and meaning: rows where the boolean column is true validate,
    the others train), here for the binomial ``lbfgs`` fit: see
    ``BinaryLogisticRegressionTrainingSummary.validationAucHistory``.
    """

    solver: Param[str] = Param(
        Params._dummy(),
        "solver",
        "The optimization algorithm. Supported options: lbfgs (full-batch L-BFGS/OWL-QN with "
        "its state on the parameter server; same optimum as MLlib), sgd, adam, ftrl "
        "(mini-batch, optimizer steps run on the parameter server).",
        typeConverter=TypeConverters.toString,
    )
    batchSize: Param[int] = Param(
        Params._dummy(),
        "batchSize",
        "Rows per mini-batch for the sgd, adam and ftrl solvers (> 0).",
        typeConverter=TypeConverters.toInt,
    )
    numShards: Param[int] = Param(
        Params._dummy(),
        "numShards",
        "Number of parameter-server shards holding the model (>= 0); 0 = the PS's default.",
        typeConverter=TypeConverters.toInt,
    )
    staleness: Param[int] = Param(
        Params._dummy(),
        "staleness",
        "Consistency of the mini-batch solvers (one clock per mini-batch): 0 = BSP (every "
        "worker waits for all others at each mini-batch), s > 0 = SSP (a worker may run at "
        "most s mini-batches ahead of the slowest), -1 = ASP (no waiting). lbfgs is "
        "synchronous and takes 0 only.",
        typeConverter=TypeConverters.toInt,
    )
    numWorkers: Param[int] = Param(
        Params._dummy(),
        "numWorkers",
        "Number of Spark tasks that stream the training data to the parameter server (>= 0); "
        "0 = one per task slot (the executors' cores over spark.task.cpus).",
        typeConverter=TypeConverters.toInt,
    )
    featureValuesCol: Param[str] = Param(
        Params._dummy(),
        "featureValuesCol",
        "Optional array<double> column holding the values of the keys listed in an "
        "array<bigint> featuresCol; if unset or empty every listed key has value 1.0.",
        typeConverter=TypeConverters.toString,
    )

    compressBits: Param[int] = Param(
        Params._dummy(),
        "compressBits",
        "Compress the fitted binomial model to block-quantized coefficients of this many bits "
        "(8 or 16; 0 = keep float64). See LogisticRegressionModel.compress.",
        typeConverter=TypeConverters.toInt,
    )
    compressPrune: Param[float] = Param(
        Params._dummy(),
        "compressPrune",
        "With compressBits: drop coefficients whose |w| is below this threshold (>= 0).",
        typeConverter=TypeConverters.toFloat,
    )
    compressPruneFraction: Param[float] = Param(
        Params._dummy(),
        "compressPruneFraction",
        "With compressBits: drop this fraction of the coefficients, smallest |w| first "
        "(in [0, 1)).",
        typeConverter=TypeConverters.toFloat,
    )

    validationIndicatorCol: Param[str] = Param(
        Params._dummy(),
        "validationIndicatorCol",
        "name of the column that indicates whether each row is for training or for "
        "validation. False indicates training; true indicates validation. Validation rows "
        "are held out of the fit (statistics, loss and gradient) and scored at each "
        "iteration: their binned AUC goes to summary.validationAucHistory and to the fit's "
        "progress (status page, TensorBoard). Binomial fits with solver lbfgs only.",
        typeConverter=TypeConverters.toString,
    )

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self._setDefault(
            compressBits=0,
            compressPrune=0.0,
            compressPruneFraction=0.0,
            solver="lbfgs",
            batchSize=4096,
            stepSize=0.1,
            numShards=0,
            staleness=0,
            numWorkers=0,
            checkpointInterval=10,
        )

    def getSolver(self) -> str:
        """Gets the value of :py:attr:`solver` or its default value."""
        return self.getOrDefault(self.solver)

    def getBatchSize(self) -> int:
        """Gets the value of :py:attr:`batchSize` or its default value."""
        return self.getOrDefault(self.batchSize)

    def getNumShards(self) -> int:
        """Gets the value of :py:attr:`numShards` or its default value."""
        return self.getOrDefault(self.numShards)

    def getStaleness(self) -> int:
        """Gets the value of :py:attr:`staleness` or its default value."""
        return self.getOrDefault(self.staleness)

    def getNumWorkers(self) -> int:
        """Gets the value of :py:attr:`numWorkers` or its default value."""
        return self.getOrDefault(self.numWorkers)

    def getCompressBits(self) -> int:
        """Gets the value of :py:attr:`compressBits` or its default value."""
        return self.getOrDefault(self.compressBits)

    def getCompressPrune(self) -> float:
        """Gets the value of :py:attr:`compressPrune` or its default value."""
        return self.getOrDefault(self.compressPrune)

    def getCompressPruneFraction(self) -> float:
        """Gets the value of :py:attr:`compressPruneFraction` or its default value."""
        return self.getOrDefault(self.compressPruneFraction)

    def getValidationIndicatorCol(self) -> str:
        """Gets the value of :py:attr:`validationIndicatorCol` or its default value."""
        return self.getOrDefault(self.validationIndicatorCol)

    def getFeatureValuesCol(self) -> str:
        """Gets the value of :py:attr:`featureValuesCol` or its default value."""
        return self.getOrDefault(self.featureValuesCol)

    def _feature_values_col(self) -> str | None:
        """The values column to read, or None when keys stand alone (value 1.0)."""
        if self.isDefined(self.featureValuesCol) and self.getFeatureValuesCol():
            return self.getFeatureValuesCol()
        return None

    def _weight_col(self) -> str | None:
        """The weight column to read, or None (every weight 1.0), as MLlib treats ``""``."""
        if self.isDefined(self.weightCol) and self.getWeightCol():
            return self.getWeightCol()
        return None

    def _invalid(self, name: str, requirement: str) -> ValueError:
        value = self.getOrDefault(self.getParam(name))
        return ValueError(
            f"{self.uid} parameter {name} given invalid value {value!r}: must be {requirement}."
        )

    def _validate_params(self) -> None:
        """Check every Param value and cross-Param rule, as MLlib does at ``set`` time.

        Raises
        ------
        ValueError
            Naming the Param and its value (MLlib's "parameter X given invalid value" wording).
        """
        lower_bounded = {
            "maxIter": 0,
            "regParam": 0.0,
            "tol": 0.0,
            "aggregationDepth": 2,
            "maxBlockSizeInMB": 0.0,
            "batchSize": 1,
            "numShards": 0,
            "staleness": -1,
            "numWorkers": 0,
            "compressPrune": 0.0,
        }
        for name, low in lower_bounded.items():
            if not self.getOrDefault(self.getParam(name)) >= low:  # also rejects NaN
                raise self._invalid(name, f">= {low}")
        for name in ("elasticNetParam", "threshold"):
            if self.isDefined(self.getParam(name)):
                if not 0.0 <= self.getOrDefault(self.getParam(name)) <= 1.0:
                    raise self._invalid(name, "in [0, 1]")
        interval = self.getCheckpointInterval()
        if not (interval == -1 or interval >= 1):
            raise self._invalid("checkpointInterval", "-1 or >= 1")
        if not self.getStepSize() > 0.0 or math.isinf(self.getStepSize()):
            raise self._invalid("stepSize", "a finite value > 0")
        if self.getCompressBits() not in (0, 8, 16):
            raise self._invalid("compressBits", "0 (no compression), 8 or 16")
        if not 0.0 <= self.getCompressPruneFraction() < 1.0:
            raise self._invalid("compressPruneFraction", "in [0, 1)")
        if self.getFamily().lower() not in _FAMILIES:
            raise self._invalid("family", f"one of {', '.join(_FAMILIES)}")
        if self.getSolver() not in SOLVERS:
            raise self._invalid("solver", f"one of {', '.join(SOLVERS)}")
        if self.getStaleness() != 0 and self.getSolver() not in MINI_BATCH_SOLVERS:
            raise self._invalid(
                "staleness", f"0 with solver={self.getSolver()!r} (which is synchronous)"
            )
        self._validate_thresholds()

    def _validate_thresholds(self) -> None:
        """MLlib's thresholds rule (all >= 0, at most one 0) and threshold/thresholds agreement."""
        if self.isDefined(self.thresholds):
            ts = self.getOrDefault(self.thresholds)
            if not all(t >= 0.0 for t in ts) or sum(t == 0.0 for t in ts) > 1:
                raise self._invalid("thresholds", "an array of values >= 0 with at most one 0")
        self._checkThresholdConsistency()

    def _check_supported(self) -> None:
        """Reject, at fit, bounds with a solver other than L-BFGS-B's (MLlib's rule too)."""
        for name in _BOUND_PARAMS:
            if self.isSet(self.getParam(name)) and self.getSolver() != "lbfgs":
                raise ValueError(
                    f"{self.uid}: bound-constrained optimization ({name} is set) runs "
                    f"L-BFGS-B, as MLlib does: use solver='lbfgs', not {self.getSolver()!r}."
                )
