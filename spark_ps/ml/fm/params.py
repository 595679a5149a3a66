"""Params of spark-ps FMClassifier / FMRegressor: MLlib 4.3's, unchanged, plus ``numWorkers``.

MLlib's Params come from pyspark's own ``_FactorizationMachinesParams`` (not re-declared), so
every name, doc, type converter and default is MLlib's by construction; a test checks it.
"""

from __future__ import annotations

from typing import Any

from pyspark.ml.param import Param, Params, TypeConverters
from pyspark.ml.regression import (
    _FactorizationMachinesParams as _MLlibFactorizationMachinesParams,
)

__all__ = ["SOLVERS", "_FactorizationMachinesParams", "validate_fm_params"]

#: Solvers accepted by the ``solver`` Param (MLlib's).
SOLVERS = ("gd", "adamW")


class _FactorizationMachinesParams(_MLlibFactorizationMachinesParams):
    """MLlib's FM Params and ``numWorkers`` (how many Spark tasks stream the data)."""

    numWorkers: Param[int] = Param(
        Params._dummy(),
        "numWorkers",
        "Number of Spark tasks that stream the training data to the parameter server (>= 0); "
        "0 = one per task slot (the executors' cores over spark.task.cpus).",
        typeConverter=TypeConverters.toInt,
    )

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self._setDefault(numWorkers=0)

    def getNumWorkers(self) -> int:
        """Gets the value of :py:attr:`numWorkers` or its default value."""
        return self.getOrDefault(self.numWorkers)


def validate_fm_params(p: Params) -> None:
    """MLlib's Param validators, checked before any data is read; errors name the Param."""
    get = p.getOrDefault
    checks = [
        ("factorSize", get(p.factorSize) > 0, "must be > 0"),
        ("maxIter", get(p.maxIter) >= 0, "must be >= 0"),
        ("regParam", get(p.regParam) >= 0, "must be >= 0"),
        ("stepSize", get(p.stepSize) > 0, "must be > 0"),
        ("tol", get(p.tol) >= 0, "must be >= 0"),
        ("initStd", get(p.initStd) > 0, "must be > 0"),
        ("miniBatchFraction", 0 < get(p.miniBatchFraction) <= 1, "must be in (0, 1]"),
        ("solver", get(p.solver) in SOLVERS, f"must be one of {SOLVERS}"),
        ("numWorkers", get(p.numWorkers) >= 0, "must be >= 0"),
    ]
    for name, ok, rule in checks:
        if not ok:
            raise ValueError(f"{type(p).__name__}: Param {name}={get(p.getParam(name))!r} {rule}")
