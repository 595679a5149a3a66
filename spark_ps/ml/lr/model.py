"""LogisticRegressionModel: a drop-in for pyspark.ml's, scored on the JVM (bridge jar) or by
one Arrow pass in Python workers.

Coefficients are stored either dense (``values[i]`` is feature ``i``) or sparse as sorted
unique int64 ``keys`` with their ``values`` plus ``numFeatures``, so a model over a hashed
key space far beyond 2**31 costs memory only for the keys it learned.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

import numpy as np
from pyspark.ml.linalg import DenseMatrix, DenseVector, Matrix, SparseMatrix, SparseVector, Vector
from pyspark.ml.util import HasTrainingSummary
from pyspark.sql import DataFrame

from spark_ps.data import CSRBatch
from spark_ps.ml.base import ArraysReadable, ArraysWritable, ArrowScoring
from spark_ps.ml.lr.params import _LogisticRegressionParams
from spark_ps.ml.lr.scoring import ScoringCoefficients, jvm_scores
from spark_ps.ml.lr.summary import LogisticRegressionSummary, make_summary

__all__ = ["LogisticRegressionModel"]

_INT32_MAX = 2**31 - 1


class LogisticRegressionModel(
    _LogisticRegressionParams,
    ArrowScoring,
    ArraysWritable,
    ArraysReadable["LogisticRegressionModel"],
    HasTrainingSummary["LogisticRegressionSummary"],
):
    """Binomial logistic regression model fitted by spark-ps ``LogisticRegression``.

    Same attributes, output columns, thresholds semantics and summaries as
    ``pyspark.ml.classification.LogisticRegressionModel``; additionally
    :py:attr:`coefficientKeys` / :py:attr:`coefficientValues` expose sparse models.

    Examples
    --------
    >>> from pyspark.ml.linalg import Vectors
    >>> model = LogisticRegressionModel.fromCoefficients(Vectors.dense([1.0, -2.0]), 0.5)
    >>> model.predict(Vectors.dense([1.0, 0.0]))
    1.0
    """

    def __init__(self) -> None:
        super().__init__()
        self._values = np.zeros(0, dtype=np.float64)
        self._keys: np.ndarray | None = None
        self._num_features = 0
        self._intercept = 0.0
        # (training dataset, objective history, iterations): the training summary is built on
        # first access, so a fit never pickles a large model into a plan nobody reads.
        self._training: tuple[DataFrame, Sequence[float], int] | None = None
        self._summary: LogisticRegressionSummary | None = None

    # ------------------------------------------------------------------ construction

    @classmethod
    def fromCoefficients(
        cls,
        coefficients: Vector | Sequence[float] | np.ndarray,
        intercept: float = 0.0,
        *,
        keys: Sequence[int] | np.ndarray | None = None,
        numFeatures: int | None = None,
    ) -> LogisticRegressionModel:
        """A model with the given numbers (e.g. copied from an MLlib model).

        ``coefficients`` is a Vector (a SparseVector gives sparse storage) or an array; with
        ``keys`` it holds the values of those feature ids and ``numFeatures`` is required.
        """
        if isinstance(coefficients, SparseVector):
            if keys is not None:
                raise ValueError("keys must not be given with a SparseVector of coefficients")
            keys, numFeatures = coefficients.indices, coefficients.size
            coefficients = coefficients.values
        elif isinstance(coefficients, Vector):
            coefficients = coefficients.toArray()
        model = cls()
        model._set_coefficients(coefficients, intercept, keys=keys, num_features=numFeatures)
        return model

    def _set_coefficients(
        self,
        values: Any,
        intercept: float,
        *,
        keys: Any = None,
        num_features: int | None = None,
    ) -> None:
        """Install coefficients, checking shapes, sortedness and key range."""
        values = np.array(values, dtype=np.float64).reshape(-1)
        if keys is None:
            if num_features is not None and num_features != values.shape[0]:
                raise ValueError(
                    f"numFeatures={num_features} but {values.shape[0]} dense coefficients given"
                )
            self._keys, self._num_features = None, values.shape[0]
        else:
            keys = np.array(keys, dtype=np.int64).reshape(-1)
            if num_features is None:
                raise ValueError("numFeatures is required with sparse coefficient keys")
            if keys.shape != values.shape:
                raise ValueError(f"{keys.shape[0]} keys but {values.shape[0]} coefficient values")
            if keys.size and (
                np.any(np.diff(keys) <= 0) or keys[0] < 0 or keys[-1] >= num_features
            ):
                raise ValueError(
                    f"coefficient keys must be sorted, unique and in [0, {num_features})"
                )
            self._keys, self._num_features = keys, int(num_features)
        self._values = values
        self._intercept = float(intercept)
        self._state: ScoringCoefficients | None = None  # rebuilt from these numbers on use
        self._jvm_scorer: tuple[str, Any] | None = None  # (application id, broadcast weights)

    # ------------------------------------------------------------------ MLlib attributes

    @property
    def numFeatures(self) -> int:
        """Number of features (vector size, or the key space of a sparse model)."""
        return self._num_features

    @property
    def numClasses(self) -> int:
        """Number of classes (always 2: spark-ps fits binomial models)."""
        return 2

    @property
    def coefficients(self) -> Vector:
        """Coefficients: a DenseVector, or a SparseVector for a sparse (key-space) model.

        pyspark.ml.linalg vectors index with int32: a model holding keys >= 2**31 raises
        ValueError here; read :py:attr:`coefficientKeys` / :py:attr:`coefficientValues`.
        """
        if self._keys is None:
            return DenseVector(self._values.copy())
        self._check_int32_keys("coefficients")
        return SparseVector(self._num_features, self._keys.copy(), self._values.copy())

    def _check_int32_keys(self, attr: str) -> None:
        if self._keys is not None and self._keys.size and self._keys[-1] > _INT32_MAX:
            raise ValueError(
                f"{attr}: key {int(self._keys[-1])} exceeds the int32 indices of "
                "pyspark.ml.linalg; use coefficientKeys and coefficientValues"
            )

    @property
    def intercept(self) -> float:
        """Model intercept."""
        return self._intercept

    @property
    def coefficientMatrix(self) -> Matrix:
        """Coefficients as a 1 x numFeatures row-major matrix, as MLlib's binomial model."""
        n = self._num_features
        if self._keys is None:
            return DenseMatrix(1, n, self._values.copy(), isTransposed=True)
        self._check_int32_keys("coefficientMatrix")
        col_ptrs = np.array([0, self._keys.shape[0]], dtype=np.int64)
        return SparseMatrix(1, n, col_ptrs, self._keys.copy(), self._values.copy(), True)

    @property
    def interceptVector(self) -> Vector:
        """Intercept as a length-1 vector."""
        return DenseVector([self._intercept])

    @property
    def coefficientKeys(self) -> np.ndarray:
        """int64 feature ids of the stored coefficients (``arange`` for a dense model)."""
        if self._keys is None:
            return np.arange(self._num_features, dtype=np.int64)
        return self._keys.copy()

    @property
    def coefficientValues(self) -> np.ndarray:
        """float64 coefficient values, parallel to :py:attr:`coefficientKeys`."""
        return self._values.copy()

    def setFeatureValuesCol(self, value: str) -> LogisticRegressionModel:
        """Sets the value of :py:attr:`featureValuesCol`."""
        return self._set(featureValuesCol=value)

    def __repr__(self) -> str:
        return (
            f"LogisticRegressionModel: uid={self.uid}, numClasses={self.numClasses}, "
            f"numFeatures={self.numFeatures}"
        )

    # ------------------------------------------------------------------ scoring hooks

    def _scoring_state(self) -> ScoringCoefficients:
        """The coefficients as shipped to executors (non-zeros only), built once per model."""
        if getattr(self, "_state", None) is None:
            self._state = ScoringCoefficients.of(self._keys, self._values, self._intercept)
        return self._state

    def _jvm_scores(self, dataset: DataFrame, spec: Any) -> DataFrame | None:
        """Score on the JVM with the weights broadcast once (see ``scoring.jvm_scores``)."""
        return jvm_scores(self, dataset, spec)

    @staticmethod
    def _margin(state: ScoringCoefficients, csr: CSRBatch) -> np.ndarray:
        """x . w + b per row, summed in each row's stored order as MLlib's sparse dot."""
        return state.margins(csr)

    @staticmethod
    def _margins(state: tuple, csr: CSRBatch) -> np.ndarray:
        m = LogisticRegressionModel._margin(state, csr)
        return np.column_stack([-m, m])

    @staticmethod
    def _raw_to_probability(state: tuple, raw: np.ndarray) -> np.ndarray:
        p0 = 1.0 / (1.0 + np.exp(-raw[:, 0]))  # MLlib's order: class 0 first, class 1 = 1 - p0
        return np.column_stack([p0, 1.0 - p0])

    def _prediction_rule(self) -> tuple[float, float]:
        """(probability threshold, margin threshold), MLlib's ``_binaryThresholds``."""
        t = self.getThreshold()
        if t == 0.0:
            return t, -np.inf
        if t == 1.0:
            return t, np.inf
        return t, float(np.log(t / (1.0 - t)))

    @staticmethod
    def _probability_to_prediction(state: Any, rule: tuple, prob: np.ndarray) -> np.ndarray:
        return (prob[:, 1] > rule[0]).astype(np.float64)

    @classmethod
    def _raw_to_prediction(cls, state: Any, rule: tuple, raw: np.ndarray) -> np.ndarray:
        return (raw[:, 1] > rule[1]).astype(np.float64)

    @classmethod
    def _features_to_prediction(cls, state: Any, rule: tuple, csr: CSRBatch) -> np.ndarray:
        score = 1.0 / (1.0 + np.exp(-cls._margin(state, csr)))
        return (score > rule[0]).astype(np.float64)

    # ------------------------------------------------------------------ summaries

    @property
    def hasSummary(self) -> bool:
        """Whether a training summary exists for this model instance."""
        return self._training is not None

    @property
    def summary(self) -> LogisticRegressionSummary:
        """Summary of the model on its training set; RuntimeError if there is none."""
        if self._training is None:
            raise RuntimeError(f"No training summary available for this {type(self).__name__}")
        if self._summary is None:
            self._summary = self._make_summary(*self._training)
            self._summary._iteration_timestamps = list(getattr(self, "_timestamps", []))
        return self._summary

    def _set_training_summary(
        self, dataset: DataFrame, objective_history: Sequence[float], total_iterations: int
    ) -> None:
        """Record what the training summary is built from (MLlib's ``setSummary``)."""
        self._training = (dataset, list(objective_history), int(total_iterations))
        self._summary = None

    def toMLlib(self):
        """This model as a genuine ``pyspark.ml.classification.LogisticRegressionModel``.

        Built on the JVM by the spark-ps bridge with the same coefficients, intercept, uid
        and Params; it ``save()``s to a path any Spark application (Scala included) can
        ``load()`` with stock MLlib.
        """
        from pyspark.ml.classification import LogisticRegression as MLlibLR
        from pyspark.sql import SparkSession

        from spark_ps.ml.export import lr_to_mllib

        ref = MLlibLR()
        params = {
            p.name: self.getOrDefault(p)
            for p in self.params
            if self.isDefined(p) and ref.hasParam(p.name)
        }
        coef = (
            self._values if self._keys is None else (self._keys, self._values, self._num_features)
        )
        return lr_to_mllib(SparkSession.active(), self.uid, coef, self.intercept, params=params)

    def evaluate(self, dataset: DataFrame) -> LogisticRegressionSummary:
        """Evaluates the model on a test dataset (MLlib's summary and metrics)."""
        if not isinstance(dataset, DataFrame):
            raise TypeError(f"dataset must be a DataFrame but got {type(dataset)}.")
        return self._make_summary(dataset)

    def _make_summary(
        self,
        dataset: DataFrame,
        objective_history: Sequence[float] | None = None,
        total_iterations: int | None = None,
    ) -> LogisticRegressionSummary:
        """MLlib's findSummaryModel + summary: generate missing output columns on a copy."""
        model = self
        for param, prefix in (
            (self.probabilityCol, "probability_"),
            (self.predictionCol, "prediction_"),
        ):
            if not model.getOrDefault(param):
                if model is self:
                    model = self.copy()
                model._set(**{param.name: prefix + _uuid()})
        weight_col = self.getWeightCol() if self.isDefined(self.weightCol) else "weightCol"
        return make_summary(
            model.transform(dataset),
            num_classes=self.numClasses,
            probability_col=model.getProbabilityCol(),
            prediction_col=model.getPredictionCol(),
            label_col=self.getLabelCol(),
            features_col=self.getFeaturesCol(),
            weight_col=weight_col,
            objective_history=objective_history,
            total_iterations=total_iterations,
        )

    # ------------------------------------------------------------------ save / load

    def _save_data(self) -> tuple[dict, dict[str, np.ndarray]]:
        extra = {
            "numClasses": self.numClasses,
            "numFeatures": self._num_features,
            "storage": "dense" if self._keys is None else "sparse",
        }
        arrays = {"values": self._values, "intercept": np.array([self._intercept])}
        if self._keys is not None:
            arrays["keys"] = self._keys
        return extra, arrays

    @classmethod
    def _from_saved(cls, metadata: dict, arrays: dict[str, np.ndarray]) -> LogisticRegressionModel:
        model = cls()
        model._set_coefficients(
            arrays["values"],
            float(arrays["intercept"][0]),
            keys=arrays.get("keys"),
            num_features=int(metadata["numFeatures"]),
        )
        return model


def _uuid() -> str:
    return str(uuid.uuid4())
