"""LinearSVC on the parameter server: a drop-in for ``pyspark.ml.classification``'s.

MLlib's Params (pyspark's ``_LinearSVCParams``), MLlib's objective (the mean weighted hinge
loss plus ``regParam/2 * |w|^2`` in the standardized space, or on the original coefficients
without standardization) solved as MLlib does (OWL-QN with a zero L1 weight), MLlib's output
columns (``rawPrediction`` ``[-m, m]``, ``prediction`` = ``m > threshold``; no probability)
and MLlib's summary classes over our predictions.
"""

from __future__ import annotations

import functools
import uuid
from collections.abc import Sequence
from typing import Any

import numpy as np
from pyspark import keyword_only
from pyspark.ml import classification as _mllib
from pyspark.ml.classification import ClassificationModel, Classifier
from pyspark.ml.functions import array_to_vector
from pyspark.ml.linalg import DenseVector, Vector
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from spark_ps import _jvm
from spark_ps.ml._plot import PlotsHistory
from spark_ps.ml.base import (
    ArraysReadable,
    ArraysWritable,
    _ArrowTransform,
    _quote,
    _score_classifier,
    vector_to_csr,
)
from spark_ps.ml.linear.common import (
    LinearCoefficients,
    check_common_params,
    check_input,
    fit_linear,
    mllib_params,
)
from spark_ps.ml.linear.fit import LinearProblem

__all__ = ["LinearSVC", "LinearSVCModel", "LinearSVCSummary", "LinearSVCTrainingSummary"]


class LinearSVCSummary(_mllib.LinearSVCSummary):
    """LinearSVC results on a dataset: MLlib's binary classification metrics."""


class LinearSVCTrainingSummary(PlotsHistory, LinearSVCSummary, _mllib.LinearSVCTrainingSummary):
    """LinearSVC training results (MLlib's metrics, objective history, iterations)."""


class _LinearSVCParams(_mllib._LinearSVCParams):
    """MLlib's LinearSVC Params, unchanged."""

    def _validate_params(self) -> None:
        check_common_params(self)


class LinearSVC(
    _LinearSVCParams, Classifier["LinearSVCModel"], ArraysWritable, ArraysReadable["LinearSVC"]
):
    """Linear SVM (hinge loss, L2) trained on the parameter server; a drop-in for MLlib's.

    ``aggregationDepth`` and ``maxBlockSizeInMB`` are accepted and have no effect.

    Examples
    --------
    >>> svm = LinearSVC(maxIter=5, regParam=0.01)
    >>> svm.getThreshold(), svm.getRegParam()
    (0.0, 0.01)
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
        tol: float = 1e-6,
        rawPredictionCol: str = "rawPrediction",
        fitIntercept: bool = True,
        standardization: bool = True,
        threshold: float = 0.0,
        weightCol: str | None = None,
        aggregationDepth: int = 2,
        maxBlockSizeInMB: float = 0.0,
    ):
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
        tol: float = 1e-6,
        rawPredictionCol: str = "rawPrediction",
        fitIntercept: bool = True,
        standardization: bool = True,
        threshold: float = 0.0,
        weightCol: str | None = None,
        aggregationDepth: int = 2,
        maxBlockSizeInMB: float = 0.0,
    ) -> LinearSVC:
        """Sets Params by keyword."""
        return self._set(**self._input_kwargs)

    def setMaxIter(self, value: int) -> LinearSVC:
        """Sets the value of :py:attr:`maxIter`."""
        return self._set(maxIter=value)

    def setRegParam(self, value: float) -> LinearSVC:
        """Sets the value of :py:attr:`regParam`."""
        return self._set(regParam=value)

    def setTol(self, value: float) -> LinearSVC:
        """Sets the value of :py:attr:`tol`."""
        return self._set(tol=value)

    def setFitIntercept(self, value: bool) -> LinearSVC:
        """Sets the value of :py:attr:`fitIntercept`."""
        return self._set(fitIntercept=value)

    def setStandardization(self, value: bool) -> LinearSVC:
        """Sets the value of :py:attr:`standardization`."""
        return self._set(standardization=value)

    def setThreshold(self, value: float) -> LinearSVC:
        """Sets the value of :py:attr:`threshold`."""
        return self._set(threshold=value)

    def setWeightCol(self, value: str) -> LinearSVC:
        """Sets the value of :py:attr:`weightCol`."""
        return self._set(weightCol=value)

    def setAggregationDepth(self, value: int) -> LinearSVC:
        """Sets the value of :py:attr:`aggregationDepth`."""
        return self._set(aggregationDepth=value)

    def setMaxBlockSizeInMB(self, value: float) -> LinearSVC:
        """Sets the value of :py:attr:`maxBlockSizeInMB`."""
        return self._set(maxBlockSizeInMB=value)

    def _fit(self, dataset: DataFrame) -> LinearSVCModel:
        self._validate_params()
        check_input(self, dataset, binary_labels=True)
        problem = LinearProblem(
            loss="hinge",
            fit_intercept=self.getFitIntercept(),
            reg_param=self.getRegParam(),
            elastic_net=0.0,
            standardization=self.getStandardization(),
            max_iter=self.getMaxIter(),
            tol=self.getTol(),
        )
        fit = fit_linear(self, dataset, problem)
        model = LinearSVCModel()
        model._set_coefficients(
            fit.coefficients, fit.intercept, keys=fit.keys, num_features=fit.num_features
        )
        model._resetUid(self.uid)
        self._copyValues(model)
        model._training = (dataset, fit.objective_history, fit.total_iterations)
        return model


class LinearSVCModel(
    _LinearSVCParams,
    LinearCoefficients,
    _ArrowTransform,
    ClassificationModel,
    ArraysWritable,
    ArraysReadable["LinearSVCModel"],
):
    """Model fitted by spark-ps :class:`LinearSVC`; MLlib's attributes, columns and summary.

    As in pyspark, :py:meth:`summary` is a method: ``model.summary()``.

    Examples
    --------
    >>> from pyspark.ml.linalg import Vectors
    >>> model = LinearSVCModel.fromCoefficients(Vectors.dense([1.0, -2.0]), 0.5)
    >>> model.predictRaw(Vectors.dense([1.0, 1.0])), model.predict(Vectors.dense([1.0, 1.0]))
    (DenseVector([0.5, -0.5]), 0.0)
    """

    def __init__(self) -> None:
        super().__init__()
        self._init_coefficients()
        self._training: tuple[DataFrame, Sequence[float], int] | None = None
        self._summary: LinearSVCTrainingSummary | None = None

    @classmethod
    def fromCoefficients(cls, coefficients, intercept: float = 0.0) -> LinearSVCModel:
        """A model with the given numbers (a SparseVector gives sparse storage)."""
        from pyspark.ml.linalg import SparseVector

        model = cls()
        if isinstance(coefficients, SparseVector):
            model._set_coefficients(
                coefficients.values,
                intercept,
                keys=coefficients.indices,
                num_features=coefficients.size,
            )
        else:
            values = coefficients.toArray() if hasattr(coefficients, "toArray") else coefficients
            model._set_coefficients(values, intercept)
        return model

    @property
    def numClasses(self) -> int:
        """Number of classes: 2."""
        return 2

    def setThreshold(self, value: float) -> LinearSVCModel:
        """Sets the value of :py:attr:`threshold`."""
        return self._set(threshold=value)

    def __repr__(self) -> str:
        return (
            f"LinearSVCModel: uid={self.uid}, numClasses={self.numClasses}, "
            f"numFeatures={self.numFeatures}"
        )

    # ------------------------------------------------------------------ scoring

    @staticmethod
    def _margins(state, csr) -> np.ndarray:
        m = state.margins(csr)
        return np.column_stack([-m, m])

    @staticmethod
    def _raw_to_prediction(state, rule: float, raw: np.ndarray) -> np.ndarray:
        return (raw[:, 1] > rule).astype(np.float64)

    @staticmethod
    def _features_to_prediction(state, rule: float, csr) -> np.ndarray:
        return (state.margins(csr) > rule).astype(np.float64)

    def _transform(self, dataset: DataFrame) -> DataFrame:
        spec = self._output_spec(
            dataset, raw_col=self.getRawPredictionCol(), pred_col=self.getPredictionCol()
        )
        if not (spec.raw_col or spec.pred_col):
            return dataset
        payload = (type(self), self._scoring_state(), float(self.getThreshold()), spec)
        fields = []
        if spec.raw_col:
            arr = T.ArrayType(T.DoubleType(), containsNull=False)
            fields.append(T.StructField(spec.raw_col, arr))
        if spec.pred_col:
            fields.append(T.StructField(spec.pred_col, T.DoubleType(), nullable=False))
        out = self._append(dataset, functools.partial(_score_classifier, payload), fields)
        replace = {}
        if spec.raw_col:
            meta = {"ml_attr": {"num_attrs": 2}}
            replace[spec.raw_col] = array_to_vector(F.col(_quote(spec.raw_col))).alias(
                spec.raw_col, metadata=meta
            )
        if spec.pred_col:
            meta = {"ml_attr": {"num_vals": 2, "type": "nominal"}}
            replace[spec.pred_col] = F.col(_quote(spec.pred_col)).alias(
                spec.pred_col, metadata=meta
            )
        return out.withColumns(replace)

    def predictRaw(self, value: Vector) -> DenseVector:
        """``[-margin, margin]`` for one feature vector."""
        csr = vector_to_csr(value, self.numFeatures)
        return DenseVector(self._margins(self._scoring_state(), csr)[0])

    def predict(self, value: Vector) -> float:
        """1.0 when the margin exceeds :py:attr:`threshold`, else 0.0."""
        csr = vector_to_csr(value, self.numFeatures)
        rule = float(self.getThreshold())
        return float(self._features_to_prediction(self._scoring_state(), rule, csr)[0])

    # ------------------------------------------------------------------ summaries

    @property
    def hasSummary(self) -> bool:
        """Whether a training summary exists for this model instance."""
        return getattr(self, "_training", None) is not None

    def summary(self) -> LinearSVCTrainingSummary:
        """Summary (accuracy, ROC, objective history, ...) of the model on its training set."""
        if not self.hasSummary:
            raise RuntimeError(f"No training summary available for this {type(self).__name__}")
        if self._summary is None:
            dataset, history, _ = self._training
            self._summary = self._make_summary(dataset, history)
        return self._summary

    def evaluate(self, dataset: DataFrame) -> LinearSVCSummary:
        """Evaluates the model on a test dataset (MLlib's summary and metrics)."""
        if not isinstance(dataset, DataFrame):
            raise TypeError(f"dataset must be a DataFrame but got {type(dataset)}.")
        return self._make_summary(dataset)

    def _make_summary(self, dataset: DataFrame, history: Sequence[float] | None = None):
        model = self
        generated = ((self.rawPredictionCol, "rawPrediction_"), (self.predictionCol, "prediction_"))
        for param, prefix in generated:
            if not model.getOrDefault(param):
                model = model.copy() if model is self else model
                model._set(**{param.name: f"{prefix}{uuid.uuid4()}"})
        weight = self.getWeightCol() if self.isDefined(self.weightCol) else "weightCol"
        java = _jvm.linear_svc_summary(
            model.transform(dataset),
            model.getRawPredictionCol(),
            model.getPredictionCol(),
            self.getLabelCol(),
            weight,
            history,
        )
        cls = LinearSVCSummary if history is None else LinearSVCTrainingSummary
        return cls(java)

    # ------------------------------------------------------------------ export, save / load

    def toMLlib(self) -> _mllib.LinearSVCModel:
        """This model as a genuine ``pyspark.ml.classification.LinearSVCModel`` (same
        coefficients, intercept, uid and Params), built on the JVM by the bridge."""
        from pyspark.sql import SparkSession

        from spark_ps.ml.export import linear_svc_to_mllib

        n, keys, values = self._export_args()
        return linear_svc_to_mllib(
            SparkSession.active(),
            self.uid,
            n,
            keys,
            values,
            self.intercept,
            params=mllib_params(self, _mllib.LinearSVC),
        )

    def _save_data(self):
        return self._coefficient_arrays()

    @classmethod
    def _from_saved(cls, metadata: dict, arrays: dict) -> LinearSVCModel:
        model = cls()
        model._load_coefficients(metadata, arrays)
        return model
