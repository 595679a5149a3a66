"""LinearRegression on the parameter server: a drop-in for ``pyspark.ml.regression``'s.

MLlib's Params (inherited from pyspark's ``_LinearRegressionParams``, so names, docs and
defaults are MLlib's by construction), MLlib's objective and optimum for ``squaredError``
(features and label standardized, ``regParam / yStd``, elastic net by OWL-QN) and ``huber``
(MLlib's concomitant scale, ``model.scale``), MLlib's summary classes over our predictions.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

import numpy as np
from pyspark import keyword_only
from pyspark.ml import regression as _mllib
from pyspark.ml.base import Predictor
from pyspark.ml.util import HasTrainingSummary
from pyspark.sql import DataFrame

from spark_ps import _jvm
from spark_ps.ml._plot import PlotsHistory
from spark_ps.ml.base import ArraysReadable, ArraysWritable, ArrowRegressionScoring
from spark_ps.ml.linear.common import (
    LinearCoefficients,
    check_common_params,
    check_input,
    fit_linear,
    mllib_params,
)
from spark_ps.ml.linear.fit import LinearProblem

__all__ = [
    "LinearRegression",
    "LinearRegressionModel",
    "LinearRegressionSummary",
    "LinearRegressionTrainingSummary",
]

_SOLVERS = ("auto", "normal", "l-bfgs")
_LOSSES = ("squaredError", "huber")


class LinearRegressionSummary(_mllib.LinearRegressionSummary):
    """Linear regression results on a dataset: MLlib's summary over our predictions."""


class LinearRegressionTrainingSummary(
    PlotsHistory, LinearRegressionSummary, _mllib.LinearRegressionTrainingSummary
):
    """Linear regression training results (MLlib's metrics, objective history, iterations)."""


class _LinearRegressionParams(_mllib._LinearRegressionParams):
    """MLlib's LinearRegression Params, unchanged."""

    def _validate_params(self) -> None:
        check_common_params(self)
        if not 0 <= self.getElasticNetParam() <= 1:
            raise ValueError(
                f"{self.uid} parameter elasticNetParam given invalid value "
                f"{self.getElasticNetParam()!r}: must be in [0, 1]."
            )
        if self.getSolver() not in _SOLVERS:
            raise ValueError(
                f"{self.uid} parameter solver given invalid value {self.getSolver()!r}: "
                f"must be one of {', '.join(_SOLVERS)}."
            )
        if self.getLoss() not in _LOSSES:
            raise ValueError(
                f"{self.uid} parameter loss given invalid value {self.getLoss()!r}: must be "
                f"one of {', '.join(_LOSSES)}."
            )
        if not self.getEpsilon() > 1.0:
            raise ValueError(
                f"{self.uid} parameter epsilon given invalid value {self.getEpsilon()!r}: "
                "must be > 1.0."
            )
        if self.getLoss() == "huber":
            if self.getSolver() == "normal":
                raise ValueError(
                    "LinearRegression with huber loss doesn't support normal solver, please "
                    "change solver to auto or l-bfgs."
                )
            if self.getElasticNetParam() != 0.0:
                raise ValueError(
                    "LinearRegression with huber loss only supports L2 regularization, but got "
                    f"elasticNetParam = {self.getElasticNetParam()}."
                )


class LinearRegression(
    _LinearRegressionParams,
    Predictor["LinearRegressionModel"],
    ArraysWritable,
    ArraysReadable["LinearRegression"],
):
    """Linear regression trained on the parameter server; a drop-in for MLlib's.

    Every solver (``auto``, ``normal``, ``l-bfgs``) runs MLlib's L-BFGS (OWL-QN with an L1
    part) over PS vectors. Where MLlib would solve the normal equations in closed form
    (``normal``, or ``auto`` up to 4096 features, squared error, no elastic-net mix) the
    solver iterates to convergence whatever ``maxIter``/``tol`` say (with MLlib's
    normal-equation ridge scaling, population variances), the summary's
    ``objectiveHistory`` is MLlib's ``[0.0]``, and the training summary has MLlib's
    ``coefficientStandardErrors``, ``tValues`` and ``pValues`` (from one more pass that
    sums the weighted Gram matrix on the PS; not for hashed key spaces, or when a feature
    is constant). ``aggregationDepth``
    and ``maxBlockSizeInMB`` are accepted and have no effect (no tree aggregation, no
    blocks: each partition's rows are one matrix in its worker).

    Examples
    --------
    >>> lr = LinearRegression(maxIter=5, regParam=0.1, loss="huber")
    >>> lr.getLoss(), lr.getEpsilon(), lr.getSolver()
    ('huber', 1.35, 'auto')
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
        standardization: bool = True,
        solver: str = "auto",
        weightCol: str | None = None,
        aggregationDepth: int = 2,
        loss: str = "squaredError",
        epsilon: float = 1.35,
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
        elasticNetParam: float = 0.0,
        tol: float = 1e-6,
        fitIntercept: bool = True,
        standardization: bool = True,
        solver: str = "auto",
        weightCol: str | None = None,
        aggregationDepth: int = 2,
        loss: str = "squaredError",
        epsilon: float = 1.35,
        maxBlockSizeInMB: float = 0.0,
    ) -> LinearRegression:
        """Sets Params by keyword."""
        return self._set(**self._input_kwargs)

    def setEpsilon(self, value: float) -> LinearRegression:
        """Sets the value of :py:attr:`epsilon`."""
        return self._set(epsilon=value)

    def setMaxIter(self, value: int) -> LinearRegression:
        """Sets the value of :py:attr:`maxIter`."""
        return self._set(maxIter=value)

    def setRegParam(self, value: float) -> LinearRegression:
        """Sets the value of :py:attr:`regParam`."""
        return self._set(regParam=value)

    def setTol(self, value: float) -> LinearRegression:
        """Sets the value of :py:attr:`tol`."""
        return self._set(tol=value)

    def setElasticNetParam(self, value: float) -> LinearRegression:
        """Sets the value of :py:attr:`elasticNetParam`."""
        return self._set(elasticNetParam=value)

    def setFitIntercept(self, value: bool) -> LinearRegression:
        """Sets the value of :py:attr:`fitIntercept`."""
        return self._set(fitIntercept=value)

    def setStandardization(self, value: bool) -> LinearRegression:
        """Sets the value of :py:attr:`standardization`."""
        return self._set(standardization=value)

    def setWeightCol(self, value: str) -> LinearRegression:
        """Sets the value of :py:attr:`weightCol`."""
        return self._set(weightCol=value)

    def setSolver(self, value: str) -> LinearRegression:
        """Sets the value of :py:attr:`solver`."""
        return self._set(solver=value)

    def setAggregationDepth(self, value: int) -> LinearRegression:
        """Sets the value of :py:attr:`aggregationDepth`."""
        return self._set(aggregationDepth=value)

    def setLoss(self, value: str) -> LinearRegression:
        """Sets the value of :py:attr:`loss`."""
        return self._set(loss=value)

    def setMaxBlockSizeInMB(self, value: float) -> LinearRegression:
        """Sets the value of :py:attr:`maxBlockSizeInMB`."""
        return self._set(maxBlockSizeInMB=value)

    def _fit(self, dataset: DataFrame) -> LinearRegressionModel:
        self._validate_params()
        check_input(self, dataset, binary_labels=False)
        problem = LinearProblem(
            loss=self.getLoss(),
            fit_intercept=self.getFitIntercept(),
            reg_param=self.getRegParam(),
            elastic_net=self.getElasticNetParam(),
            standardization=self.getStandardization(),
            max_iter=self.getMaxIter(),
            tol=self.getTol(),
            epsilon=self.getEpsilon(),
            solver=self.getSolver(),
        )
        fit = fit_linear(self, dataset, problem)
        model = LinearRegressionModel()
        model._set_coefficients(
            fit.coefficients, fit.intercept, keys=fit.keys, num_features=fit.num_features
        )
        model._scale = fit.scale
        model._resetUid(self.uid)
        self._copyValues(model)
        model._training = (dataset, fit.objective_history, fit.total_iterations)
        model._diag_inv_atwa = fit.diag_inv_atwa
        return model


class LinearRegressionModel(
    _LinearRegressionParams,
    LinearCoefficients,
    ArrowRegressionScoring,
    ArraysWritable,
    ArraysReadable["LinearRegressionModel"],
    HasTrainingSummary["LinearRegressionTrainingSummary"],
):
    """Model fitted by spark-ps :class:`LinearRegression`; MLlib's attributes and summary.

    Examples
    --------
    >>> from pyspark.ml.linalg import Vectors
    >>> model = LinearRegressionModel.fromCoefficients(Vectors.dense([2.0, -1.0]), 0.5)
    >>> model.predict(Vectors.dense([1.0, 3.0]))
    -0.5
    """

    def __init__(self) -> None:
        super().__init__()
        self._init_coefficients()
        self._scale = 1.0
        self._training: tuple[DataFrame, Sequence[float], int] | None = None
        self._summary: LinearRegressionTrainingSummary | None = None

    @classmethod
    def fromCoefficients(cls, coefficients, intercept: float = 0.0, scale: float = 1.0):
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
        model._scale = float(scale)
        return model

    @property
    def scale(self) -> float:
        """The value by which ``|y - X'w|`` is scaled down when loss is "huber", else 1.0."""
        return self._scale

    def __repr__(self) -> str:
        return f"LinearRegressionModel: uid={self.uid}, numFeatures={self.numFeatures}"

    @staticmethod
    def _predict_values(state, csr):
        return state.margins(csr)

    # ------------------------------------------------------------------ summaries

    @property
    def hasSummary(self) -> bool:
        """Whether a training summary exists for this model instance."""
        return getattr(self, "_training", None) is not None

    @property
    def summary(self) -> LinearRegressionTrainingSummary:
        """Summary (residuals, MSE, r2, ...) of the model on its training set."""
        if not self.hasSummary:
            raise RuntimeError(f"No training summary available for this {type(self).__name__}")
        if self._summary is None:
            dataset, history, _ = self._training
            self._summary = self._make_summary(dataset, history)
        return self._summary

    def evaluate(self, dataset: DataFrame) -> LinearRegressionSummary:
        """Evaluates the model on a test dataset (MLlib's summary and metrics)."""
        if not isinstance(dataset, DataFrame):
            raise TypeError(f"dataset must be a DataFrame but got {type(dataset)}.")
        return self._make_summary(dataset)

    def _make_summary(self, dataset: DataFrame, history: Sequence[float] | None = None):
        model = self
        if not self.getPredictionCol():
            model = self.copy()
            model._set(predictionCol=f"prediction_{uuid.uuid4()}")
        fit_intercept = self.getFitIntercept()
        estimates = self.coefficients.toArray() if self.numFeatures <= 1 << 24 else [0.0]
        if fit_intercept:
            estimates = np.append(estimates, self.intercept)
        # the normal equations' diagonal gives the training summary MLlib's standard errors,
        # t- and p-values; evaluate() has none, as MLlib's
        diag = getattr(self, "_diag_inv_atwa", None) if history is not None else None
        java = _jvm.linear_regression_summary(
            model.transform(dataset),
            model.getPredictionCol(),
            self.getLabelCol(),
            self.getFeaturesCol(),
            self.getWeightCol() if self.isDefined(self.weightCol) else "",
            self.numFeatures,
            fit_intercept,
            estimates,
            history,
            diag_inv_atwa=diag,
        )
        cls = LinearRegressionSummary if history is None else LinearRegressionTrainingSummary
        return cls(java)

    # ------------------------------------------------------------------ export, save / load

    def toMLlib(self) -> _mllib.LinearRegressionModel:
        """This model as a genuine ``pyspark.ml.regression.LinearRegressionModel`` (same
        coefficients, intercept, scale, uid and Params), built on the JVM by the bridge."""
        from pyspark.sql import SparkSession

        from spark_ps.ml.export import linear_regression_to_mllib

        n, keys, values = self._export_args()
        return linear_regression_to_mllib(
            SparkSession.active(),
            self.uid,
            n,
            keys,
            values,
            self.intercept,
            self.scale,
            params=mllib_params(self, _mllib.LinearRegression),
        )

    def _save_data(self):
        extra, arrays = self._coefficient_arrays()
        extra["scale"] = self._scale
        return extra, arrays

    @classmethod
    def _from_saved(cls, metadata: dict, arrays: dict) -> LinearRegressionModel:
        model = cls()
        model._load_coefficients(metadata, arrays)
        model._scale = float(metadata.get("scale", 1.0))
        return model
