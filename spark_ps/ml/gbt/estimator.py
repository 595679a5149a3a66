"""GBTClassifier / GBTRegressor: MLlib's estimators, with the training behind a registry.

``fit`` validates the Params, selects the needed columns
(:func:`spark_ps.ml.base.prepare_fit_data`), checks labels and weights in one Spark job with
MLlib's messages, then hands the data to the registered trainer (the distributed PS trainer in
production, a local one in tests) and wraps the trees it returns in a model that carries the
estimator's uid and Params, as MLlib's does.

Trainer contract (:func:`register_trainer`)::

    fn(data: PreparedData, params: dict[str, Any], *, validation: PreparedData | None = None)
        -> (trees: list[TreeArrays], treeWeights: Sequence[float], numFeatures: int,
            history: Sequence[float] | Mapping[str, Any])

``params`` maps every Param name (set or default) to its value, with ``lossType`` and
``impurity`` lower-cased and ``featureSubsetStrategy="auto"`` resolved to ``"all"`` (what MLlib
uses when it grows one tree per iteration). ``validation`` (rows whose
``validationIndicatorCol`` is true) is passed only when that Param is set; the training rows
are the others. ``history`` is the training loss per iteration, or a mapping whose
``"train_loss"`` holds it.

A trainer may also take ``check_rows: Callable[[], None]``: it then validates the rows as it
reads them (and refuses a ``validation`` set without rows) and calls ``check_rows()`` (a Spark
job that raises MLlib's error for the first bad row, or the empty validation set's) only when
it found something to refuse. Other trainers get rows checked before they start.
"""

from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from pyspark import keyword_only
from pyspark.ml.classification import ProbabilisticClassifier
from pyspark.ml.regression import Regressor
from pyspark.ml.util import DefaultParamsReadable, DefaultParamsWritable
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from spark_ps.ml.base import (
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
from spark_ps.ml.gbt.model import GBTClassificationModel, GBTRegressionModel
from spark_ps.ml.gbt.params import GBTClassifierParams, GBTRegressorParams

__all__ = ["GBTClassifier", "GBTRegressor", "register_trainer", "registered_trainer"]

TrainerFn = Callable[..., tuple]


@dataclass(frozen=True)
class _Trainer:
    fn: TrainerFn
    unsupported: frozenset[str]

    @property
    def checks_rows(self) -> bool:
        """Whether ``fn`` takes ``check_rows`` (it validates rows itself and calls that only
        when it found something to refuse); otherwise ``fit`` runs the check first."""
        return "check_rows" in inspect.signature(self.fn).parameters

    @property
    def name(self) -> str:
        return getattr(self.fn, "__qualname__", repr(self.fn))


_TRAINER: list[_Trainer] = []  # zero or one entry: the registered trainer


def register_trainer(fn: TrainerFn | None, *, unsupported: Iterable[str] = ()) -> TrainerFn | None:
    """Install ``fn`` as the trainer of both GBT estimators; return the previous one.

    ``unsupported`` names Params ``fn`` does not honour: ``fit`` then fails when one of them is
    set to a non-default value instead of silently ignoring it. A trainer without a
    ``validation`` keyword implicitly does not honour ``validationIndicatorCol``.
    ``fn=None`` removes the registered trainer.
    """
    previous = _TRAINER[0].fn if _TRAINER else None
    _TRAINER.clear()
    if fn is not None:
        names = set(unsupported)
        sig = inspect.signature(fn)
        takes_kw = any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values())
        if "validation" not in sig.parameters and not takes_kw:
            names.add("validationIndicatorCol")
        _TRAINER.append(_Trainer(fn, frozenset(names)))
    return previous


def registered_trainer() -> TrainerFn | None:
    """The trainer ``fit`` will call, or None."""
    return _TRAINER[0].fn if _TRAINER else None


def _current_trainer() -> _Trainer:
    if not _TRAINER:
        raise RuntimeError(
            "No GBT trainer is registered; call spark_ps.ml.gbt.register_trainer(fn) first."
        )
    return _TRAINER[0]


def _quote(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def _check_continuous(schema: T.StructType, features_col: str) -> None:
    """Reject categorical features (ML attribute metadata): spark-ps trees split continuously.

    Nominal features with at most 2 values (and binary ones) are allowed: a continuous split
    between 0 and 1 partitions them exactly as MLlib's categorical split would.
    """
    if features_col not in schema.fieldNames():
        return  # prepare_fit_data reports the missing column
    attrs = schema[features_col].metadata.get("ml_attr", {}).get("attrs", {})
    multi = [a for a in attrs.get("nominal", []) if a.get("num_vals", math.inf) > 2]
    if multi:
        shown = [(a.get("idx"), a.get("num_vals")) for a in multi[:5]]
        raise ValueError(
            f"Column {features_col!r} (featuresCol) has categorical features (index, values) "
            f"{shown}: spark-ps GBT supports continuous features only; one-hot encode them "
            "or drop the ML attribute metadata."
        )


class _GBTEstimator(DefaultParamsWritable):
    """The fit pipeline and setters shared by GBTClassifier and GBTRegressor."""

    _model_class: type
    _is_classifier: bool

    def _fit(self, dataset: DataFrame) -> Any:
        self._validate_params()
        self._check_fit_thresholds()
        trainer = _current_trainer()
        self._check_unsupported(trainer.unsupported, f"the registered trainer {trainer.name}")
        _check_continuous(dataset.schema, self.getFeaturesCol())
        train, validation = self._split(dataset)
        data = self._prepare(train)
        val_data = self._prepare(validation) if validation is not None else None
        kwargs: dict[str, Any] = {"validation": val_data} if val_data is not None else {}
        check = functools.partial(self._check_rows, dataset, training=validation is not None)
        if trainer.checks_rows:
            kwargs["check_rows"] = check  # the trainer calls it when its read refuses rows
        else:
            check()
        trees, weights, num_features, history = trainer.fn(data, self._params_dict(), **kwargs)
        if isinstance(history, Mapping):
            history = history.get("train_loss", [])
        model = self._model_class(
            trees=list(trees),
            treeWeights=[float(w) for w in weights],
            numFeatures=int(num_features),
            uid=self.uid,
            lossHistory=[float(x) for x in history],
        )
        return self._copyValues(model)

    def _check_fit_thresholds(self) -> None:
        if self._is_classifier and self.isDefined(self.thresholds):
            n = len(self.getThresholds())
            if n != 2:
                raise ValueError(
                    f"{type(self).__name__}.train() called with non-matching numClasses and "
                    f"thresholds.length. numClasses=2, but thresholds has length {n}"
                )

    def _weight_col(self) -> str:
        return self.getWeightCol() if self.isDefined(self.weightCol) else ""

    def _split(self, dataset: DataFrame) -> tuple[DataFrame, DataFrame | None]:
        """MLlib's split: rows with validationIndicatorCol true validate, the others train."""
        name = validation_indicator(self, dataset)
        return (dataset, None) if name is None else split_validation(dataset, name)

    def _training_flag(self) -> Any:
        """1 for a training row, null for a validation row (what ``F.count`` skips)."""
        return training_flag(self.getOrDefault("validationIndicatorCol"))

    def _prepare(self, dataset: DataFrame) -> PreparedData:
        return prepare_fit_data(
            dataset,
            features_col=self.getFeaturesCol(),
            label_col=self.getLabelCol(),
            weight_col=self._weight_col() or None,
            num_workers=self.getNumWorkers(),
        )

    def _check_rows(self, dataset: DataFrame, training: bool) -> None:
        """One Spark job over all rows: labels, weights and features are what MLlib accepts
        (see `feature_checks`), and some rows train (``training``: only those whose
        validationIndicatorCol is false count, and some others must validate)."""
        label_col, weight_col = self.getLabelCol(), self._weight_col()
        label = F.col(_quote(label_col)).cast("double")
        bad_label = label.isNull() | F.isnan(label)
        if self._is_classifier:
            bad_label = bad_label | ~label.isin(0.0, 1.0)
        else:
            bad_label = bad_label | (F.abs(label) == math.inf)
        aggs = [
            F.count(self._training_flag() if training else F.lit(1)).alias("n"),
            F.first(F.when(bad_label, F.struct(label.alias("v"))), ignorenulls=True).alias("bl"),
        ]
        if training:
            flag = F.col(_quote(self.getOrDefault("validationIndicatorCol")))
            aggs.append(F.count(F.when(flag, F.lit(1))).alias("nv"))
        aggs += weight_checks(weight_col)
        aggs += feature_checks(dataset.schema, self.getFeaturesCol())
        row = dataset.agg(*aggs).head()
        if row["n"] == 0:
            raise ValueError(
                "DecisionTree requires size of input RDD > 0, but was given by empty one."
            )
        if row["bl"] is not None:
            raise ValueError(self._label_message(row["bl"]["v"]) + f" (labelCol {label_col!r})")
        check_weights(row, weight_col)
        check_features(row, self.getFeaturesCol())
        if training and row["nv"] == 0:  # after the rows' own errors, which MLlib meets first
            raise ValueError(no_validation_rows(self.getOrDefault("validationIndicatorCol")))

    def _label_message(self, value: float | None) -> str:
        if value is None or math.isnan(value):
            return "Labels MUST NOT be Null or NaN"
        if self._is_classifier:
            return f"Labels MUST be in {{0, 1}}, but got {value}"
        return f"Labels MUST NOT be Infinity, but got {value}"

    def _params_dict(self) -> dict[str, Any]:
        out = {p.name: self.getOrDefault(p) for p in self.params if self.isDefined(p)}
        out["lossType"] = out["lossType"].lower()
        out["impurity"] = out["impurity"].lower()
        strategy = out["featureSubsetStrategy"].lower()
        out["featureSubsetStrategy"] = "all" if strategy == "auto" else strategy
        return out

    # ----- setters shared by both estimators (MLlib's, plus numWorkers and GOSS)

    def setMaxDepth(self, value: int) -> Any:
        """Sets the value of :py:attr:`maxDepth`."""
        return self._set(maxDepth=value)

    def setMaxBins(self, value: int) -> Any:
        """Sets the value of :py:attr:`maxBins`."""
        return self._set(maxBins=value)

    def setMinInstancesPerNode(self, value: int) -> Any:
        """Sets the value of :py:attr:`minInstancesPerNode`."""
        return self._set(minInstancesPerNode=value)

    def setMinInfoGain(self, value: float) -> Any:
        """Sets the value of :py:attr:`minInfoGain`."""
        return self._set(minInfoGain=value)

    def setMaxMemoryInMB(self, value: int) -> Any:
        """Sets the value of :py:attr:`maxMemoryInMB` (accepted, not applicable to the PS)."""
        return self._set(maxMemoryInMB=value)

    def setCacheNodeIds(self, value: bool) -> Any:
        """Sets the value of :py:attr:`cacheNodeIds` (accepted, not applicable to the PS)."""
        return self._set(cacheNodeIds=value)

    def setCheckpointInterval(self, value: int) -> Any:
        """Sets the value of :py:attr:`checkpointInterval` (PS checkpoint every N trees)."""
        return self._set(checkpointInterval=value)

    def setImpurity(self, value: str) -> Any:
        """Sets the value of :py:attr:`impurity`."""
        return self._set(impurity=value)

    def setLossType(self, value: str) -> Any:
        """Sets the value of :py:attr:`lossType`."""
        return self._set(lossType=value)

    def setSubsamplingRate(self, value: float) -> Any:
        """Sets the value of :py:attr:`subsamplingRate`."""
        return self._set(subsamplingRate=value)

    def setFeatureSubsetStrategy(self, value: str) -> Any:
        """Sets the value of :py:attr:`featureSubsetStrategy`."""
        return self._set(featureSubsetStrategy=value)

    def setValidationIndicatorCol(self, value: str) -> Any:
        """Sets the value of :py:attr:`validationIndicatorCol`."""
        return self._set(validationIndicatorCol=value)

    def setValidationTol(self, value: float) -> Any:
        """Sets the value of :py:attr:`validationTol`."""
        return self._set(validationTol=value)

    def setMaxIter(self, value: int) -> Any:
        """Sets the value of :py:attr:`maxIter`."""
        return self._set(maxIter=value)

    def setSeed(self, value: int) -> Any:
        """Sets the value of :py:attr:`seed`."""
        return self._set(seed=value)

    def setStepSize(self, value: float) -> Any:
        """Sets the value of :py:attr:`stepSize`."""
        return self._set(stepSize=value)

    def setWeightCol(self, value: str) -> Any:
        """Sets the value of :py:attr:`weightCol`."""
        return self._set(weightCol=value)

    def setMinWeightFractionPerNode(self, value: float) -> Any:
        """Sets the value of :py:attr:`minWeightFractionPerNode`."""
        return self._set(minWeightFractionPerNode=value)

    def setLeafCol(self, value: str) -> Any:
        """Sets the value of :py:attr:`leafCol`."""
        return self._set(leafCol=value)

    def setNumWorkers(self, value: int) -> Any:
        """Sets the value of :py:attr:`numWorkers` (spark-ps addition)."""
        return self._set(numWorkers=value)

    def setGossTopRate(self, value: float) -> Any:
        """Sets the value of :py:attr:`gossTopRate` (spark-ps addition: GOSS)."""
        return self._set(gossTopRate=value)

    def setGossOtherRate(self, value: float) -> Any:
        """Sets the value of :py:attr:`gossOtherRate` (spark-ps addition: GOSS)."""
        return self._set(gossOtherRate=value)


class GBTClassifier(
    _GBTEstimator,
    ProbabilisticClassifier,
    GBTClassifierParams,
    DefaultParamsReadable["GBTClassifier"],
):
    """Gradient-boosted trees for binary classification, trained on the parameter server.

    A drop-in for :class:`pyspark.ml.classification.GBTClassifier`: same Params, defaults,
    output columns and model API (labels must be 0 or 1; logistic loss). ``maxMemoryInMB`` and
    ``cacheNodeIds`` are accepted and ignored (not applicable: the PS holds the histograms and
    workers keep node ids); ``checkpointInterval`` checkpoints the PS every that many trees
    when ``spark.ps.checkpointDir`` is set. Categorical feature metadata with more than two
    values is rejected. ``numWorkers`` and the GOSS option (``gossTopRate``) are additions.

    Examples
    --------
    >>> gbt = GBTClassifier(maxIter=5, maxDepth=2, seed=42)  # doctest: +SKIP
    >>> model = gbt.fit(train_df)  # doctest: +SKIP
    >>> model.transform(test_df).select("probability", "prediction")  # doctest: +SKIP
    """

    _model_class = GBTClassificationModel
    _is_classifier = True

    @keyword_only
    def __init__(
        self,
        *,
        featuresCol: str = "features",
        labelCol: str = "label",
        predictionCol: str = "prediction",
        maxDepth: int = 5,
        maxBins: int = 32,
        minInstancesPerNode: int = 1,
        minInfoGain: float = 0.0,
        maxMemoryInMB: int = 256,
        cacheNodeIds: bool = False,
        checkpointInterval: int = 10,
        lossType: str = "logistic",
        maxIter: int = 20,
        stepSize: float = 0.1,
        seed: int | None = None,
        subsamplingRate: float = 1.0,
        impurity: str = "variance",
        featureSubsetStrategy: str = "all",
        validationTol: float = 0.01,
        validationIndicatorCol: str | None = None,
        leafCol: str = "",
        minWeightFractionPerNode: float = 0.0,
        weightCol: str | None = None,
        probabilityCol: str = "probability",
        rawPredictionCol: str = "rawPrediction",
        thresholds: list[float] | None = None,
        numWorkers: int = 0,
        gossTopRate: float = 0.0,
        gossOtherRate: float = 0.1,
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
        maxDepth: int = 5,
        maxBins: int = 32,
        minInstancesPerNode: int = 1,
        minInfoGain: float = 0.0,
        maxMemoryInMB: int = 256,
        cacheNodeIds: bool = False,
        checkpointInterval: int = 10,
        lossType: str = "logistic",
        maxIter: int = 20,
        stepSize: float = 0.1,
        seed: int | None = None,
        subsamplingRate: float = 1.0,
        impurity: str = "variance",
        featureSubsetStrategy: str = "all",
        validationTol: float = 0.01,
        validationIndicatorCol: str | None = None,
        leafCol: str = "",
        minWeightFractionPerNode: float = 0.0,
        weightCol: str | None = None,
        probabilityCol: str = "probability",
        rawPredictionCol: str = "rawPrediction",
        thresholds: list[float] | None = None,
        numWorkers: int = 0,
        gossTopRate: float = 0.0,
        gossOtherRate: float = 0.1,
    ) -> GBTClassifier:
        """Sets Params for gradient-boosted tree classification (keyword arguments only)."""
        return self._set(**self._input_kwargs)


class GBTRegressor(
    _GBTEstimator,
    Regressor,
    GBTRegressorParams,
    DefaultParamsReadable["GBTRegressor"],
):
    """Gradient-boosted trees for regression, trained on the parameter server.

    A drop-in for :class:`pyspark.ml.regression.GBTRegressor` (losses ``squared`` and
    ``absolute``); ``maxMemoryInMB`` and ``cacheNodeIds`` are accepted and ignored (not
    applicable to the PS); ``checkpointInterval`` checkpoints the PS every that many trees when
    ``spark.ps.checkpointDir`` is set. ``numWorkers`` and the GOSS option (``gossTopRate``) are
    additions.

    Examples
    --------
    >>> model = GBTRegressor(maxIter=10, maxDepth=3).fit(train_df)  # doctest: +SKIP
    >>> model.evaluateEachIteration(test_df, "squared")  # doctest: +SKIP
    """

    _model_class = GBTRegressionModel
    _is_classifier = False

    @keyword_only
    def __init__(
        self,
        *,
        featuresCol: str = "features",
        labelCol: str = "label",
        predictionCol: str = "prediction",
        maxDepth: int = 5,
        maxBins: int = 32,
        minInstancesPerNode: int = 1,
        minInfoGain: float = 0.0,
        maxMemoryInMB: int = 256,
        cacheNodeIds: bool = False,
        subsamplingRate: float = 1.0,
        checkpointInterval: int = 10,
        lossType: str = "squared",
        maxIter: int = 20,
        stepSize: float = 0.1,
        seed: int | None = None,
        impurity: str = "variance",
        featureSubsetStrategy: str = "all",
        validationTol: float = 0.01,
        validationIndicatorCol: str | None = None,
        leafCol: str = "",
        minWeightFractionPerNode: float = 0.0,
        weightCol: str | None = None,
        numWorkers: int = 0,
        gossTopRate: float = 0.0,
        gossOtherRate: float = 0.1,
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
        maxDepth: int = 5,
        maxBins: int = 32,
        minInstancesPerNode: int = 1,
        minInfoGain: float = 0.0,
        maxMemoryInMB: int = 256,
        cacheNodeIds: bool = False,
        subsamplingRate: float = 1.0,
        checkpointInterval: int = 10,
        lossType: str = "squared",
        maxIter: int = 20,
        stepSize: float = 0.1,
        seed: int | None = None,
        impurity: str = "variance",
        featureSubsetStrategy: str = "all",
        validationTol: float = 0.01,
        validationIndicatorCol: str | None = None,
        leafCol: str = "",
        minWeightFractionPerNode: float = 0.0,
        weightCol: str | None = None,
        numWorkers: int = 0,
        gossTopRate: float = 0.0,
        gossOtherRate: float = 0.1,
    ) -> GBTRegressor:
        """Sets Params for gradient-boosted tree regression (keyword arguments only)."""
        return self._set(**self._input_kwargs)
