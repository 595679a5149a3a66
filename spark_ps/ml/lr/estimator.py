"""LogisticRegression estimator: Params, data plumbing and an injectable trainer.

``_fit`` validates the Params, prepares the data (needed columns, one partition per
worker), then hands the data to the trainer registered for the ``solver`` Param. Trainers
(distributed L-BFGS on the PS, mini-batch solvers, or a local one in tests) register
themselves with :func:`register_trainer`. A trainer whose workers count the labels as they
read them takes :class:`LabelRules` and saves the Spark job that checks them; the others get
rows checked, and the classes counted, by that job first.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from pyspark import keyword_only
from pyspark.ml.classification import ProbabilisticClassifier
from pyspark.ml.linalg import Matrix, Vector
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from spark_ps.data import DENSE_MAX_FEATURES
from spark_ps.ml.base import (
    ArraysReadable,
    ArraysWritable,
    PreparedData,
    check_features,
    check_weights,
    feature_checks,
    no_validation_rows,
    prepare_fit_data,
    split_validation,
    training_flag,
    validation_indicator,
    weight_checks,
)
from spark_ps.ml.lr.model import LogisticRegressionModel
from spark_ps.ml.lr.params import SOLVERS, _LogisticRegressionParams

__all__ = [
    "LogisticRegression",
    "TrainResult",
    "Trainer",
    "register_trainer",
    "unregister_trainer",
    "get_trainer",
    "check_label_counts",
]


@dataclass
class TrainResult:
    """What a trainer returns.

    Attributes
    ----------
    coefficients : float64 [num_features] dense, or the values at ``keys`` when sparse;
        multinomial: float64 [num_features, K] (a row per feature), or the rows of ``keys``.
    intercept : the fitted intercept (0.0 when fitIntercept is False); multinomial: float64 [K].
    objective_history : objective at each iteration, the initial state first (MLlib's).
    total_iterations : iterations run.
    keys : sorted unique int64 feature ids for a sparse model, else None.
    num_features : dimension / key space; required with ``keys``, else len(coefficients).
    """

    coefficients: np.ndarray
    intercept: float
    objective_history: Sequence[float]
    total_iterations: int
    keys: np.ndarray | None = None
    num_features: int | None = None
    iteration_timestamps: Sequence[float] | None = None  # seconds since the fit started
    phases: dict[str, float] | None = None  # seconds per set-up phase (trainers that time them)
    num_classes: int | None = None  # K for a multinomial result, None for a binomial one
    validation_auc: Sequence[float] | None = None  # binned AUC of the validation rows per
    # iteration (objectiveHistory[1:]), for a fit with validationIndicatorCol


@dataclass
class LabelRules:
    """`fit`'s label rules (MLlib's) for a trainer that counts the labels as its workers
    read the rows (``trainer(prepared, params, labels=rules)``): clean rows then cost no
    Spark job of their own.

    Attributes
    ----------
    decide : ``decide(counts) -> (numClasses, multinomial)`` from the training rows'
        counts ``n`` (rows), ``bad`` (negative or non-integer labels, validation rows
        included), ``max`` (largest training label) and ``vmax`` (largest validation label,
        None without such rows); raises MLlib's error for labels, family or thresholds.
    check_rows : the Spark job that raises MLlib's error for the rows; to call when the
        workers' read refused a row (a null or NaN label or weight, a bad vector), so that
        the user reads MLlib's message. It returns if it finds nothing to refuse.
    """

    decide: Callable[[dict], tuple[int, bool]]
    check_rows: Callable[[], object]


Trainer = Callable[[PreparedData, dict[str, Any]], TrainResult]
_TRAINERS: dict[str, Trainer] = {}


def _takes_labels(trainer: Trainer) -> bool:
    """Whether `trainer` takes ``labels`` (:class:`LabelRules`): it counts labels itself."""
    try:
        return "labels" in inspect.signature(trainer).parameters
    except (TypeError, ValueError):  # a callable without a signature
        return False


def register_trainer(solver: str, trainer: Trainer | None) -> Trainer | None:
    """Make ``trainer(prepared, params) -> TrainResult`` fit ``solver``; returns the previous.

    ``params`` maps every defined Param name to its value, plus ``numClasses`` (K, from
    the label column) and ``multinomial`` (the family MLlib's rules pick). A trainer that
    cannot fit a multinomial model raises NotImplementedError. A trainer that honours
    ``validationIndicatorCol`` (trains on the rows ``prepared.validation_col`` does not flag
    and fills ``TrainResult.validation_auc``) says so with an attribute
    ``takes_validation = True``; ``fit`` refuses the Param with any other. A trainer with a
    ``labels`` keyword gets :class:`LabelRules` instead of ``numClasses`` and
    ``multinomial``, and decides them from its own count of the labels. Passing None
    unregisters.
    """
    if solver not in SOLVERS:
        raise ValueError(f"solver {solver!r} is not one of {', '.join(SOLVERS)}")
    previous = _TRAINERS.get(solver)
    if trainer is None:
        _TRAINERS.pop(solver, None)
    else:
        _TRAINERS[solver] = trainer
    return previous


def unregister_trainer(solver: str) -> Trainer | None:
    """Remove the trainer of ``solver``; returns it (or None)."""
    return _TRAINERS.pop(solver, None)


def get_trainer(solver: str) -> Trainer:
    """The trainer registered for ``solver``; NotImplementedError naming what exists."""
    try:
        return _TRAINERS[solver]
    except KeyError:
        raise NotImplementedError(
            f"no trainer is registered for solver={solver!r} (registered: "
            f"{sorted(_TRAINERS) or 'none'}); import the module that registers it"
        ) from None


class LogisticRegression(
    _LogisticRegressionParams,
    ProbabilisticClassifier,
    ArraysWritable,
    ArraysReadable["LogisticRegression"],
):
    """Logistic regression (binomial or multinomial) trained on the parameter server; a
    drop-in for MLlib's. ``family`` follows MLlib: "auto" fits a multinomial model when the
    label column has more than two classes (from its nominal metadata, else max label + 1).

    Accepts MLlib's Params with MLlib's defaults plus ``solver``, ``batchSize``,
    ``stepSize``, ``numShards``, ``staleness``, ``numWorkers``, ``featureValuesCol`` and
    ``compressBits`` / ``compressPrune`` / ``compressPruneFraction`` (a compressed model,
    see :py:meth:`LogisticRegressionModel.compress`) and ``validationIndicatorCol`` (MLlib's
    GBT Param: rows where that boolean column is true are held out of the fit and scored at
    each iteration; binomial ``lbfgs`` fits only).

    Examples
    --------
    >>> lr = LogisticRegression(maxIter=10, regParam=0.01)
    >>> lr.getSolver(), lr.getMaxIter()
    ('lbfgs', 10)
    """

    _input_kwargs: dict[str, Any]

    @keyword_only
    def __init__(
        self,
        *,
        featuresCol: str = "features",
        labelCol: str = "label",
        predictionCol: str = "prediction",
        maxIter: int = 100,
        regParam: float = 0.0,
        elasticNetParam: float = 0.0,
        tol: float = 1e-6,
        fitIntercept: bool = True,
        threshold: float = 0.5,
        thresholds: list[float] | None = None,
        probabilityCol: str = "probability",
        rawPredictionCol: str = "rawPrediction",
        standardization: bool = True,
        weightCol: str | None = None,
        aggregationDepth: int = 2,
        family: str = "auto",
        lowerBoundsOnCoefficients: Matrix | None = None,
        upperBoundsOnCoefficients: Matrix | None = None,
        lowerBoundsOnIntercepts: Vector | None = None,
        upperBoundsOnIntercepts: Vector | None = None,
        maxBlockSizeInMB: float = 0.0,
        solver: str = "lbfgs",
        batchSize: int = 4096,
        stepSize: float = 0.1,
        numShards: int = 0,
        staleness: int = 0,
        numWorkers: int = 0,
        featureValuesCol: str | None = None,
        checkpointInterval: int = 10,
        compressBits: int = 0,
        compressPrune: float = 0.0,
        compressPruneFraction: float = 0.0,
        validationIndicatorCol: str | None = None,
    ):
        """If the threshold and thresholds Params are both set, they must be equivalent."""
        super().__init__()
        self.setParams(**self._input_kwargs)

    @keyword_only
    def setParams(
        self,
        *,
        featuresCol: str = "features",
        labelCol: str = "label",
        predictionCol: str = "prediction",
        maxIter: int = 100,
        regParam: float = 0.0,
        elasticNetParam: float = 0.0,
        tol: float = 1e-6,
        fitIntercept: bool = True,
        threshold: float = 0.5,
        thresholds: list[float] | None = None,
        probabilityCol: str = "probability",
        rawPredictionCol: str = "rawPrediction",
        standardization: bool = True,
        weightCol: str | None = None,
        aggregationDepth: int = 2,
        family: str = "auto",
        lowerBoundsOnCoefficients: Matrix | None = None,
        upperBoundsOnCoefficients: Matrix | None = None,
        lowerBoundsOnIntercepts: Vector | None = None,
        upperBoundsOnIntercepts: Vector | None = None,
        maxBlockSizeInMB: float = 0.0,
        solver: str = "lbfgs",
        batchSize: int = 4096,
        stepSize: float = 0.1,
        numShards: int = 0,
        staleness: int = 0,
        numWorkers: int = 0,
        featureValuesCol: str | None = None,
        checkpointInterval: int = 10,
        compressBits: int = 0,
        compressPrune: float = 0.0,
        compressPruneFraction: float = 0.0,
        validationIndicatorCol: str | None = None,
    ) -> LogisticRegression:
        """Sets Params by keyword; threshold and thresholds, if both given, must agree."""
        self._set(**self._input_kwargs)
        self._checkThresholdConsistency()
        return self

    # MLlib's setters ------------------------------------------------------------------

    def setFamily(self, value: str) -> LogisticRegression:
        """Sets the value of :py:attr:`family`."""
        return self._set(family=value)

    def setLowerBoundsOnCoefficients(self, value: Matrix) -> LogisticRegression:
        """Sets the value of :py:attr:`lowerBoundsOnCoefficients`."""
        return self._set(lowerBoundsOnCoefficients=value)

    def setUpperBoundsOnCoefficients(self, value: Matrix) -> LogisticRegression:
        """Sets the value of :py:attr:`upperBoundsOnCoefficients`."""
        return self._set(upperBoundsOnCoefficients=value)

    def setLowerBoundsOnIntercepts(self, value: Vector) -> LogisticRegression:
        """Sets the value of :py:attr:`lowerBoundsOnIntercepts`."""
        return self._set(lowerBoundsOnIntercepts=value)

    def setUpperBoundsOnIntercepts(self, value: Vector) -> LogisticRegression:
        """Sets the value of :py:attr:`upperBoundsOnIntercepts`."""
        return self._set(upperBoundsOnIntercepts=value)

    def setMaxIter(self, value: int) -> LogisticRegression:
        """Sets the value of :py:attr:`maxIter`."""
        return self._set(maxIter=value)

    def setRegParam(self, value: float) -> LogisticRegression:
        """Sets the value of :py:attr:`regParam`."""
        return self._set(regParam=value)

    def setTol(self, value: float) -> LogisticRegression:
        """Sets the value of :py:attr:`tol`."""
        return self._set(tol=value)

    def setElasticNetParam(self, value: float) -> LogisticRegression:
        """Sets the value of :py:attr:`elasticNetParam`."""
        return self._set(elasticNetParam=value)

    def setFitIntercept(self, value: bool) -> LogisticRegression:
        """Sets the value of :py:attr:`fitIntercept`."""
        return self._set(fitIntercept=value)

    def setStandardization(self, value: bool) -> LogisticRegression:
        """Sets the value of :py:attr:`standardization`."""
        return self._set(standardization=value)

    def setWeightCol(self, value: str) -> LogisticRegression:
        """Sets the value of :py:attr:`weightCol`."""
        return self._set(weightCol=value)

    def setAggregationDepth(self, value: int) -> LogisticRegression:
        """Sets the value of :py:attr:`aggregationDepth` (kept for compatibility)."""
        return self._set(aggregationDepth=value)

    def setMaxBlockSizeInMB(self, value: float) -> LogisticRegression:
        """Sets the value of :py:attr:`maxBlockSizeInMB`."""
        return self._set(maxBlockSizeInMB=value)

    # additions ---------------------------------------------------------------------------

    def setSolver(self, value: str) -> LogisticRegression:
        """Sets the value of :py:attr:`solver`."""
        return self._set(solver=value)

    def setBatchSize(self, value: int) -> LogisticRegression:
        """Sets the value of :py:attr:`batchSize`."""
        return self._set(batchSize=value)

    def setStepSize(self, value: float) -> LogisticRegression:
        """Sets the value of :py:attr:`stepSize`."""
        return self._set(stepSize=value)

    def setNumShards(self, value: int) -> LogisticRegression:
        """Sets the value of :py:attr:`numShards`."""
        return self._set(numShards=value)

    def setStaleness(self, value: int) -> LogisticRegression:
        """Sets the value of :py:attr:`staleness`."""
        return self._set(staleness=value)

    def setNumWorkers(self, value: int) -> LogisticRegression:
        """Sets the value of :py:attr:`numWorkers`."""
        return self._set(numWorkers=value)

    def setCheckpointInterval(self, value: int) -> LogisticRegression:
        """Sets the value of :py:attr:`checkpointInterval`."""
        return self._set(checkpointInterval=value)

    def setFeatureValuesCol(self, value: str) -> LogisticRegression:
        """Sets the value of :py:attr:`featureValuesCol`."""
        return self._set(featureValuesCol=value)

    def setCompressBits(self, value: int) -> LogisticRegression:
        """Sets the value of :py:attr:`compressBits`."""
        return self._set(compressBits=value)

    def setCompressPrune(self, value: float) -> LogisticRegression:
        """Sets the value of :py:attr:`compressPrune`."""
        return self._set(compressPrune=value)

    def setCompressPruneFraction(self, value: float) -> LogisticRegression:
        """Sets the value of :py:attr:`compressPruneFraction`."""
        return self._set(compressPruneFraction=value)

    def setValidationIndicatorCol(self, value: str) -> LogisticRegression:
        """Sets the value of :py:attr:`validationIndicatorCol`."""
        return self._set(validationIndicatorCol=value)

    # fit ---------------------------------------------------------------------------------

    def _fit(self, dataset: DataFrame) -> LogisticRegressionModel:
        self._validate_params()
        self._check_supported()
        val_col = validation_indicator(self, dataset)
        if val_col is not None and self.getSolver() != "lbfgs":
            raise self._no_validation(val_col, f"solver={self.getSolver()!r}")
        prepared = prepare_fit_data(
            dataset,
            features_col=self.getFeaturesCol(),
            label_col=self.getLabelCol(),
            weight_col=self._weight_col(),
            values_col=self._feature_values_col(),
            num_workers=self.getNumWorkers(),
            densify_max=DENSE_MAX_FEATURES if self.getSolver() == "lbfgs" else 0,
            validation_col=val_col,
        )
        trainer = get_trainer(self.getSolver())
        if val_col is not None and not getattr(trainer, "takes_validation", False):
            name = getattr(trainer, "__qualname__", repr(trainer))
            raise self._no_validation(val_col, f"the registered lbfgs trainer {name}")
        params = {p.name: self.getOrDefault(p) for p in self.params if self.isDefined(p)}
        n_vals = _nominal_classes(dataset, self.getLabelCol())
        decide = functools.partial(self._decide, n_vals=n_vals, val_col=val_col)
        if _takes_labels(trainer):
            check = functools.partial(self._check_labels, dataset, val_col)
            result = trainer(prepared, params, labels=LabelRules(decide, check))
        else:
            num_classes, multinomial = decide(self._check_labels(dataset, val_col))
            params.update(numClasses=num_classes, multinomial=multinomial)
            result = trainer(prepared, params)
        model = LogisticRegressionModel()
        if result.num_classes is None:
            model._set_coefficients(
                result.coefficients,
                result.intercept,
                keys=result.keys,
                num_features=result.num_features,
                copy=False,  # the fit's own arrays
            )
        else:
            model._set_matrix(
                result.coefficients,
                result.intercept,
                keys=result.keys,
                num_features=result.num_features,
            )
        model._resetUid(self.uid)
        self._copyValues(model)
        if self.getCompressBits():
            model = model.compress(
                self.getCompressBits(), self.getCompressPrune(), self.getCompressPruneFraction()
            )
        training = dataset if val_col is None else split_validation(dataset, val_col)[0]
        model._set_training_summary(training, result.objective_history, result.total_iterations)
        model._timestamps = list(result.iteration_timestamps or [])
        model._validation_auc = list(result.validation_auc or [])
        model._fit_phases = dict(result.phases or {})
        return model

    def _no_validation(self, column: str, what: str) -> ValueError:
        return ValueError(
            f"{self.uid} parameter validationIndicatorCol={column!r}: validationIndicatorCol "
            f"is supported by the binomial L-BFGS fit (solver='lbfgs', two classes), not by "
            f"{what}; unset it, or fit on the training rows alone."
        )

    def _check_family(self, num_classes: int) -> bool:
        """MLlib's ``checkMultinomial``, and its thresholds-length rule: True for multinomial."""
        family = self.getFamily().lower()
        if family == "binomial" and num_classes > 2:
            raise ValueError(
                f"Binomial family only supports 1 or 2 outcome classes but found {num_classes} "
                f"(column {self.getLabelCol()!r}, labelCol); use family 'multinomial' or 'auto'"
            )
        multinomial = family == "multinomial" or (family == "auto" and num_classes > 2)
        if self.isDefined(self.thresholds) and len(self.getThresholds()) != num_classes:
            raise ValueError(
                f"LogisticRegression.train() called with non-matching numClasses and "
                f"thresholds.length. numClasses={num_classes}, but thresholds has length "
                f"{len(self.getThresholds())}"
            )
        if multinomial and self.getSolver() != "lbfgs":
            raise NotImplementedError(
                f"{self.uid}: solver={self.getSolver()!r} fits binomial models only; "
                f"a multinomial fit ({num_classes} classes) needs solver='lbfgs'"
            )
        return multinomial

    def _decide(self, counts, n_vals: int, val_col: str | None) -> tuple[int, bool]:
        """(numClasses, multinomial) from the label counts (:class:`LabelRules`), or the
        error MLlib raises for them, the family or the thresholds."""
        label_name = self.getLabelCol()
        self._check_counts(counts)
        top = int(counts["max"])
        if n_vals and top >= n_vals:
            raise ValueError(
                f"Classification labels should be in [0 to {n_vals - 1}]: the metadata of "
                f"column {label_name!r} (labelCol) gives {n_vals} classes but its max label "
                f"is {counts['max']}"
            )
        num_classes = n_vals if n_vals else top + 1
        vmax = counts["vmax"]
        if val_col is not None and vmax is not None and vmax >= num_classes:
            raise ValueError(
                f"Classification labels should be in [0 to {num_classes - 1}]: the training "
                f"rows give {num_classes} classes but a validation row (column {val_col!r}, "
                f"validationIndicatorCol, true) has label {vmax} in column "
                f"{label_name!r} (labelCol)"
            )
        multinomial = self._check_family(num_classes)
        if multinomial and self.getCompressBits():
            raise NotImplementedError(
                f"{self.uid} parameter compressBits={self.getCompressBits()}: only binomial "
                f"models can be compressed (this fit is multinomial, {num_classes} classes)"
            )
        if val_col is not None and multinomial:
            raise self._no_validation(val_col, f"a multinomial fit ({num_classes} classes)")
        if val_col is not None and vmax is None:  # else every validation AUC would be NaN
            raise ValueError(no_validation_rows(val_col))
        return num_classes, multinomial

    def _check_counts(self, counts) -> None:
        """MLlib's errors for no training row, null or NaN labels (``nulls``, counted by
        the Spark job; a worker's read refuses them) and negative or non-integer ones."""
        if counts["n"] == 0:
            raise ValueError(f"{self.uid}: the training dataset is empty")
        if counts.get("nulls"):
            raise ValueError(
                f"Labels MUST NOT be Null or NaN: column {self.getLabelCol()!r} (labelCol) "
                f"has {counts['nulls']} such rows"
            )
        check_label_counts(self.getLabelCol(), counts["bad"], False, "", self.uid)

    def _check_labels(self, dataset: DataFrame, val_col: str | None = None) -> dict:
        """One aggregation over label, weight and features: MLlib's errors for null, NaN
        labels, weights and features (see `feature_checks`); the label counts
        :meth:`_decide` takes (over the training rows; with validationIndicatorCol `val_col`
        the largest validation label too)."""
        label_name = self.getLabelCol()
        label = F.col(f"`{label_name}`").cast("double")
        training = F.lit(1) if val_col is None else training_flag(val_col)
        aggs = [
            F.count(training).alias("n"),
            F.max(F.when(training.isNotNull(), label)).alias("max"),
            F.sum((label.isNull() | F.isnan(label)).cast("long")).alias("nulls"),
            F.sum(((label < 0) | (label != F.floor(label))).cast("long")).alias("bad"),
        ]
        if val_col is not None:
            aggs.append(F.max(F.when(F.col(f"`{val_col}`"), label)).alias("vmax"))
        weight_name = self._weight_col()
        aggs += weight_checks(weight_name)
        aggs += feature_checks(dataset.schema, self.getFeaturesCol())
        row = dataset.agg(*aggs).first().asDict()
        self._check_counts(row)
        check_weights(row, weight_name)
        check_features(row, self.getFeaturesCol())
        vmax = row["vmax"] if val_col is not None else None
        return {"n": row["n"], "bad": row["bad"], "max": row["max"], "vmax": vmax}


def _nominal_classes(dataset: DataFrame, label_col: str) -> int:
    """The number of classes the label column's nominal metadata gives (0: none)."""
    attr = dataset.schema[label_col].metadata.get("ml_attr", {})
    return int(attr.get("num_vals", len(attr.get("vals", []))))


def check_label_counts(
    label_col: str, bad: int, multiclass: bool, why: str, uid: str = "LogisticRegression"
) -> None:
    """Raise MLlib's errors for ``bad`` negative/non-integer labels or (for a binomial fit)
    labels above 1."""
    if bad:
        raise ValueError(
            f"Labels MUST be in {{0, 1}} (binomial) or integers in [0, numClasses) "
            f"(multinomial): column {label_col!r} (labelCol) has {int(bad)} negative or "
            "non-integer labels"
        )
    if multiclass:
        raise _multiclass(uid, f"{why} in column {label_col!r}")


def _multiclass(uid: str, why: str) -> NotImplementedError:
    return NotImplementedError(
        f"{uid}: multiclass labels ({why}) are not supported by spark-ps LogisticRegression, "
        "which fits binomial models only (labels 0.0 and 1.0)."
    )
