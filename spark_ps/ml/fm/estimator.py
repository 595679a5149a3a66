"""FMClassifier and FMRegressor: MLlib's factorization machines, trained on the PS.

``_fit`` validates the Params, checks the data with one Spark aggregation (MLlib's label and
feature rules), keeps the needed columns in one partition per worker, and runs
:func:`spark_ps.ml.fm.trainer.train_fm`: the factors live on the PS as an embedding table
whose rows are created on first pull, so a 2^24-feature model costs only the rows the data
touches. Nothing is on the PS when a check fails.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from pyspark import keyword_only
from pyspark.ml.classification import ProbabilisticClassifier
from pyspark.ml.regression import Regressor
from pyspark.ml.util import DefaultParamsReadable, DefaultParamsWritable
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from spark_ps.ml.base import check_features, feature_checks, prepare_fit_data
from spark_ps.ml.fm.model import FMClassificationModel, FMRegressionModel, FMState
from spark_ps.ml.fm.params import _FactorizationMachinesParams, validate_fm_params
from spark_ps.ml.fm.trainer import FMResult, train_fm

__all__ = ["FMClassifier", "FMRegressor"]

_COMMON = (
    "featuresCol", "labelCol", "predictionCol", "factorSize", "fitIntercept", "fitLinear",
    "regParam", "miniBatchFraction", "initStd", "maxIter", "stepSize", "tol", "solver",
    "seed", "numWorkers",
)  # fmt: skip


class _FMEstimator(_FactorizationMachinesParams):
    """The fit shared by both estimators; subclasses set ``_loss`` and ``_model_class``."""

    _loss = ""
    _model_class: type = object
    #: Starting factors instead of the lazy N(0, initStd) rows (float64 [numFeatures, k]);
    #: None in normal use. Set it to start from a known point, e.g. an MLlib model's.
    _initial_factors: np.ndarray | None = None

    def _fit(self, dataset: DataFrame):
        validate_fm_params(self)
        self._check_data(dataset)
        prepared = prepare_fit_data(
            dataset,
            features_col=self.getFeaturesCol(),
            label_col=self.getLabelCol(),
            num_workers=self.getNumWorkers(),
        )
        params = {p.name: self.getOrDefault(p) for p in self.params if self.isDefined(p)}
        result = train_fm(prepared, params, self._loss, self._initial_factors)
        model = self._make_model(result)
        if isinstance(model, FMClassificationModel):
            model._training = dataset  # the training summary is built on first use
        return model

    def _make_model(self, r: FMResult):
        model = self._model_class()
        state = FMState(
            r.num_features,
            r.keys,
            r.factors,
            r.linear_keys,
            r.linear,
            r.intercept,
            self.getFactorSize(),
            self.getInitStd(),
            self.getSeed(),
        )
        model._set_state(state, r.objective_history)
        model._resetUid(self.uid)
        self._copyValues(model)
        model._rows_held = r.rows_held
        return model

    def _label_checks(self, label) -> list[Any]:
        raise NotImplementedError

    def _check_labels(self, row, label_name: str) -> None:
        raise NotImplementedError

    def _check_data(self, dataset: DataFrame) -> None:
        """One aggregation: labels (MLlib's rule for the estimator), features (no nulls, NaN
        or inf, one size), not empty."""
        if not isinstance(dataset, DataFrame):
            raise TypeError(f"dataset must be a DataFrame but got {type(dataset)}.")
        label_name = self.getLabelCol()
        if label_name not in dataset.columns:
            raise ValueError(
                f"Column {label_name!r} (labelCol) does not exist. Available: {dataset.columns}"
            )
        label = F.col(f"`{label_name.replace('`', '``')}`").cast("double")
        aggs = [F.count(F.lit(1)).alias("n"), *self._label_checks(label)]
        aggs += feature_checks(dataset.schema, self.getFeaturesCol())
        row = dataset.agg(*aggs).first()
        if row["n"] == 0:
            raise ValueError(f"{self.uid}: the training dataset is empty")
        self._check_labels(row, label_name)
        check_features(row, self.getFeaturesCol())


class FMClassifier(
    _FMEstimator,
    ProbabilisticClassifier,
    DefaultParamsWritable,
    DefaultParamsReadable["FMClassifier"],
):
    """Factorization machines for binary classification (logistic loss), as MLlib's
    ``FMClassifier``, with the factors on the parameter server.

    Labels must be 0 or 1. ``solver`` is ``"adamW"`` (default) or ``"gd"``; each iteration
    samples ``miniBatchFraction`` of the rows. See :mod:`spark_ps.ml.fm.trainer` for how the
    iteration matches MLlib's.
    """

    _loss = "logistic"
    _model_class = FMClassificationModel

    @keyword_only
    def __init__(
        self,
        *,
        featuresCol: str = "features",
        labelCol: str = "label",
        predictionCol: str = "prediction",
        probabilityCol: str = "probability",
        rawPredictionCol: str = "rawPrediction",
        factorSize: int = 8,
        fitIntercept: bool = True,
        fitLinear: bool = True,
        regParam: float = 0.0,
        miniBatchFraction: float = 1.0,
        initStd: float = 0.01,
        maxIter: int = 100,
        stepSize: float = 1.0,
        tol: float = 1e-6,
        solver: str = "adamW",
        thresholds: list[float] | None = None,
        seed: int | None = None,
        numWorkers: int = 0,
    ) -> None:
        super().__init__()
        self.setParams(**self._input_kwargs)

    @keyword_only
    def setParams(
        self,
        *,
        featuresCol: str = "features",
        labelCol: str = "label",
        predictionCol: str = "prediction",
        probabilityCol: str = "probability",
        rawPredictionCol: str = "rawPrediction",
        factorSize: int = 8,
        fitIntercept: bool = True,
        fitLinear: bool = True,
        regParam: float = 0.0,
        miniBatchFraction: float = 1.0,
        initStd: float = 0.01,
        maxIter: int = 100,
        stepSize: float = 1.0,
        tol: float = 1e-6,
        solver: str = "adamW",
        thresholds: list[float] | None = None,
        seed: int | None = None,
        numWorkers: int = 0,
    ) -> FMClassifier:
        """Sets Params (keyword arguments only)."""
        return self._set(**self._input_kwargs)

    def _label_checks(self, label) -> list[Any]:
        bad = label.isNull() | F.isnan(label) | ~label.isin(0.0, 1.0)
        return [F.sum(bad.cast("long")).alias("bad")]

    def _check_labels(self, row, label_name: str) -> None:
        if row["bad"]:
            raise ValueError(
                f"Labels MUST be in {{0, 1}} for FMClassifier: column {label_name!r} "
                f"(labelCol) has {row['bad']} rows outside it (null, NaN or another value)"
            )


class FMRegressor(
    _FMEstimator,
    Regressor,
    DefaultParamsWritable,
    DefaultParamsReadable["FMRegressor"],
):
    """Factorization machines for regression (squared error), as MLlib's ``FMRegressor``,
    with the factors on the parameter server."""

    _loss = "squared"
    _model_class = FMRegressionModel

    @keyword_only
    def __init__(
        self,
        *,
        featuresCol: str = "features",
        labelCol: str = "label",
        predictionCol: str = "prediction",
        factorSize: int = 8,
        fitIntercept: bool = True,
        fitLinear: bool = True,
        regParam: float = 0.0,
        miniBatchFraction: float = 1.0,
        initStd: float = 0.01,
        maxIter: int = 100,
        stepSize: float = 1.0,
        tol: float = 1e-6,
        solver: str = "adamW",
        seed: int | None = None,
        numWorkers: int = 0,
    ) -> None:
        super().__init__()
        self.setParams(**self._input_kwargs)

    @keyword_only
    def setParams(
        self,
        *,
        featuresCol: str = "features",
        labelCol: str = "label",
        predictionCol: str = "prediction",
        factorSize: int = 8,
        fitIntercept: bool = True,
        fitLinear: bool = True,
        regParam: float = 0.0,
        miniBatchFraction: float = 1.0,
        initStd: float = 0.01,
        maxIter: int = 100,
        stepSize: float = 1.0,
        tol: float = 1e-6,
        solver: str = "adamW",
        seed: int | None = None,
        numWorkers: int = 0,
    ) -> FMRegressor:
        """Sets Params (keyword arguments only)."""
        return self._set(**self._input_kwargs)

    def _label_checks(self, label) -> list[Any]:
        bad = label.isNull() | F.isnan(label) | (F.abs(label) == float("inf"))
        return [F.sum(bad.cast("long")).alias("bad")]

    def _check_labels(self, row, label_name: str) -> None:
        if row["bad"]:
            raise ValueError(
                f"Labels MUST NOT be Null, NaN or Infinity: column {label_name!r} (labelCol) "
                f"has {row['bad']} such rows"
            )


def _add_setters(cls: type, names: tuple[str, ...]) -> None:
    """``setX(value)`` for every Param X in `names` (pyspark's setter convention)."""
    for name in names:

        def setter(self, value, _name=name):
            return self._set(**{_name: value})

        setter.__name__ = f"set{name[0].upper()}{name[1:]}"
        setter.__doc__ = f"Sets the value of :py:attr:`{name}`."
        if not hasattr(cls, setter.__name__):
            setattr(cls, setter.__name__, setter)


_add_setters(FMClassifier, (*_COMMON, "probabilityCol", "rawPredictionCol", "thresholds"))
_add_setters(FMRegressor, _COMMON)
_add_setters(FMClassificationModel, ("featuresCol", "predictionCol", "probabilityCol",
                                     "rawPredictionCol", "thresholds"))  # fmt: skip
_add_setters(FMRegressionModel, ("featuresCol", "predictionCol"))
