"""LogisticRegressionModel: a drop-in for pyspark.ml's, scored on the JVM (bridge jar) or by
one Arrow pass in Python workers.

Coefficients are stored either dense (``values[i]`` is feature ``i``) or sparse as sorted
unique int64 ``keys`` with their ``values`` plus ``numFeatures``, so a model over a hashed
key space far beyond 2**31 costs memory only for the keys it learned. A multinomial model
stores the same way with one row of K values per feature (``values`` is [rows, K]) and K
intercepts; it is scored in Python workers, one sparse-dense product per Arrow batch.
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
from spark_ps.ml.lr.compress import QuantizedScoring, QuantizedWeights, check_compression
from spark_ps.ml.lr.params import _LogisticRegressionParams
from spark_ps.ml.lr.scoring import ScoringCoefficients, SoftmaxCoefficients, jvm_scores
from spark_ps.ml.lr.summary import LogisticRegressionSummary, make_summary

__all__ = ["LogisticRegressionModel"]

_INT32_MAX = 2**31 - 1


#: ``LogisticRegressionModel -> PSLogisticRegressionModel``, set by
#: :mod:`spark_ps.ml.lr.ps_model` when it is imported: that module subclasses this model,
#: so the dependency runs from it to here, never back.
_TO_PS: Any = None


class LogisticRegressionModel(
    _LogisticRegressionParams,
    ArrowScoring,
    ArraysWritable,
    ArraysReadable["LogisticRegressionModel"],
    HasTrainingSummary["LogisticRegressionSummary"],
):
    """Logistic regression model (binomial or multinomial) fitted by spark-ps
    ``LogisticRegression``.

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

    #: Block-quantized coefficients of a compressed model (:py:meth:`compress`), else None.
    _quant: QuantizedWeights | None = None

    def __init__(self) -> None:
        super().__init__()
        self._values = np.zeros(0, dtype=np.float64)
        self._keys: np.ndarray | None = None
        self._num_features = 0
        self._intercept = 0.0
        self._intercepts: np.ndarray | None = None  # multinomial: K intercepts, else None
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
        copy: bool = True,
    ) -> None:
        """Install coefficients, checking shapes, sortedness and key range. ``copy=False``:
        the model takes `values` as they are when they are float64 already (a fit's own
        result: a 2^24-feature model's copy cost 0.1-0.25 s of the fit, measured)."""
        values = (np.array if copy else np.asarray)(values, dtype=np.float64).reshape(-1)
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
        self._quant = None
        self._intercept = float(intercept)
        self._intercepts = None
        self._state: ScoringCoefficients | SoftmaxCoefficients | None = (
            None  # rebuilt from these numbers on use
        )
        self._jvm_scorer: tuple[str, Any] | None = None  # (application id, broadcast weights)

    def _set_matrix(
        self,
        values: Any,
        intercepts: Any,
        *,
        keys: Any = None,
        num_features: int | None = None,
    ) -> None:
        """Install a multinomial model: ``values`` [rows, K] (a row per feature id, or per
        key of ``keys``) and K ``intercepts``; the same checks as `_set_coefficients`."""
        b = np.array(intercepts, dtype=np.float64).reshape(-1)
        if b.size < 1:
            raise ValueError("a multinomial model needs at least one intercept (one per class)")
        rows = np.array(values, dtype=np.float64).reshape(-1, b.size)
        self._set_coefficients(
            np.zeros(rows.shape[0]), 0.0, keys=keys, num_features=num_features
        )  # shape and key checks
        self._values, self._intercepts = rows, b

    @classmethod
    def fromCoefficientMatrix(
        cls, coefficientMatrix: Matrix, interceptVector: Vector | Sequence[float]
    ) -> LogisticRegressionModel:
        """A multinomial model from a K x numFeatures matrix and K intercepts (e.g. MLlib's)."""
        w = coefficientMatrix.toArray()
        b = (
            interceptVector.toArray()
            if isinstance(interceptVector, Vector)
            else np.asarray(interceptVector, dtype=np.float64)
        )
        if w.shape[0] != b.size:
            raise ValueError(f"{w.shape[0]} coefficient rows but {b.size} intercepts")
        model = cls()
        model._set_matrix(w.T, b)
        return model

    @property
    def _multinomial(self) -> bool:
        return self._intercepts is not None

    def _binomial_only(self, what: str, use: str) -> None:
        """MLlib's error for a binomial-only attribute of a multinomial model."""
        if self._multinomial:
            raise RuntimeError(
                f"Multinomial models contain a {what}, use {use} instead ({self.uid})."
            )

    # ------------------------------------------------------------------ storage

    @property
    def _values(self) -> np.ndarray:
        """float64 coefficients (dequantized on each read for a compressed model)."""
        if self._quant is not None:
            return self._quant.values()
        return self._plain_values

    @_values.setter
    def _values(self, values: np.ndarray) -> None:
        self._plain_values = values

    @property
    def _keys(self) -> np.ndarray | None:
        """Sorted int64 feature ids of a sparse model, None for a dense one."""
        if self._quant is not None:
            return None if self._quant.dense else self._quant.keys()
        return self._plain_keys

    @_keys.setter
    def _keys(self, keys: np.ndarray | None) -> None:
        self._plain_keys = keys

    @property
    def isCompressed(self) -> bool:
        """Whether the coefficients are held block-quantized (:py:meth:`compress`)."""
        return self._quant is not None

    @property
    def nbytes(self) -> int:
        """Bytes of the coefficient arrays this model holds in memory (keys, values or
        codes, scales and gap-coded keys when compressed; intercepts)."""
        held = self._quant.nbytes if self._quant is not None else self._plain_values.nbytes
        if self._quant is None and self._plain_keys is not None:
            held += self._plain_keys.nbytes
        return int(held + 8 + (self._intercepts.nbytes if self._multinomial else 0))

    def toPS(self, context: Any = None, name: str | None = None) -> Any:
        """This binomial model's non-zero coefficients in a new sparse PS vector, as a
        ``PSLogisticRegressionModel`` whose ``transform`` reads them there (see
        :mod:`spark_ps.ml.lr.ps_model`); ``context`` defaults to the active PSContext."""
        if _TO_PS is None:  # ps_model registers it on import (spark_ps.ml.classification)
            raise RuntimeError("toPS needs spark_ps.ml.lr.ps_model imported first")
        return _TO_PS(self, context, name)

    def compress(
        self, bits: int = 8, prune: float = 0.0, pruneFraction: float = 0.0
    ) -> LogisticRegressionModel:
        """A copy of this binomial model with block-quantized coefficients.

        Each block of 256 stored weights gets one float64 scale and ``bits``-bit integer
        codes (8 or 16, symmetric); weights with ``|w| < prune`` and the smallest
        ``pruneFraction`` of the non-zero ones are dropped. Keys of a sparse model are
        gap-coded in 1 to 8 bytes. ``transform`` dequantizes only the weights each batch
        touches; the coefficient attributes, ``save`` and :py:meth:`toMLlib` see the
        dequantized values.

        Sizes against float64 values (+ int64 keys when sparse): 8 bits ~7.9x dense, ~5-8x
        sparse; 16 bits ~3.97x dense without pruning (4x is the most 16-bit codes can give
        a dense model), above 4x with pruning; ~3.9x sparse (2-byte gaps at 200k keys in
        2^24), above 4x with pruning.

        Error bound: a row's margin is off by at most ``sum_i |x_i| * e_i``, ``e_i`` half
        the quantization step of feature i's block, or for a pruned feature its dropped
        ``|w_i|`` (see :mod:`spark_ps.ml.lr.compress`); the intercept is exact.

        Raises
        ------
        ValueError
            For bits other than 8/16, a negative or NaN ``prune``, ``pruneFraction`` outside
            [0, 1), or a model already compressed.
        NotImplementedError
            For a multinomial model.
        """
        check_compression(bits, prune, pruneFraction, f"{self.uid}.compress")
        if self._multinomial:
            raise NotImplementedError(
                f"{self.uid}.compress: only binomial models can be compressed "
                f"(this one has {self.numClasses} classes)"
            )
        if self._quant is not None:
            raise ValueError(
                f"{self.uid}.compress: the model is already compressed "
                f"(bits={self._quant.bits}); compress the full model instead"
            )
        quant = QuantizedWeights.quantize(
            self._keys, self._values, self._num_features, bits, prune, pruneFraction
        )
        model = self.copy()
        model._plain_values, model._plain_keys = np.zeros(0), None
        model._quant, model._state, model._jvm_scorer = quant, None, None
        return model

    # ------------------------------------------------------------------ MLlib attributes

    @property
    def numFeatures(self) -> int:
        """Number of features (vector size, or the key space of a sparse model)."""
        return self._num_features

    @property
    def numClasses(self) -> int:
        """Number of classes: K for a multinomial model, 2 for a binomial one."""
        return 2 if self._intercepts is None else int(self._intercepts.size)

    @property
    def coefficients(self) -> Vector:
        """Coefficients: a DenseVector, or a SparseVector for a sparse (key-space) model.

        pyspark.ml.linalg vectors index with int32: a model holding keys >= 2**31 raises
        ValueError here; read :py:attr:`coefficientKeys` / :py:attr:`coefficientValues`.
        A multinomial model raises RuntimeError (use :py:attr:`coefficientMatrix`), as MLlib.
        """
        self._binomial_only("matrix of coefficients", "coefficientMatrix")
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
        """Model intercept (binomial; a multinomial model raises RuntimeError, as MLlib)."""
        self._binomial_only("vector of intercepts", "interceptVector")
        return self._intercept

    @property
    def coefficientMatrix(self) -> Matrix:
        """Coefficients as a K x numFeatures row-major matrix (1 x numFeatures binomial), as
        MLlib's: dense for vector input, sparse (the learned keys) for a sparse model."""
        n = self._num_features
        if self._multinomial:
            return self._class_matrix()
        if self._keys is None:
            return DenseMatrix(1, n, self._values.copy(), isTransposed=True)
        self._check_int32_keys("coefficientMatrix")
        col_ptrs = np.array([0, self._keys.shape[0]], dtype=np.int64)
        return SparseMatrix(1, n, col_ptrs, self._keys.copy(), self._values.copy(), True)

    def _class_matrix(self) -> Matrix:
        rows = self._values.T  # [K, rows]
        K, n = rows.shape[0], self._num_features
        if self._keys is None:
            return compressed(rows)
        self._check_int32_keys("coefficientMatrix")
        nz = rows != 0.0
        ptrs = np.concatenate([[0], np.cumsum(nz.sum(axis=1))]).astype(np.int64)
        idx = np.concatenate([self._keys[nz[k]] for k in range(K)])
        return SparseMatrix(K, n, ptrs, idx, rows[nz], True)

    @property
    def interceptVector(self) -> Vector:
        """Intercepts: K of them (multinomial) or the one intercept as a length-1 vector."""
        if self._multinomial:  # MLlib's `compressed`: sparse when that is smaller
            b = self._intercepts
            nz = np.flatnonzero(b)
            if 1.5 * (nz.size + 1.0) < b.size:
                return SparseVector(b.size, nz, b[nz])
            return DenseVector(b.copy())
        return DenseVector([self._intercept])

    @property
    def coefficientKeys(self) -> np.ndarray:
        """int64 feature ids of the stored coefficients (``arange`` for a dense model)."""
        if self._keys is None:
            return np.arange(self._num_features, dtype=np.int64)
        return self._keys.copy()

    @property
    def coefficientValues(self) -> np.ndarray:
        """float64 coefficient values, parallel to :py:attr:`coefficientKeys` (multinomial:
        [len(keys), K], a row of class coefficients per key)."""
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
            if self._quant is not None:
                self._state = QuantizedScoring(self._quant, self._intercept)
            elif self._multinomial:
                self._state = SoftmaxCoefficients.of(self._keys, self._values, self._intercepts)
            else:
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
    def _margins(state: Any, csr: CSRBatch) -> np.ndarray:
        if isinstance(state, SoftmaxCoefficients):
            return state.margins(csr)
        m = LogisticRegressionModel._margin(state, csr)
        return np.column_stack([-m, m])

    @staticmethod
    def _raw_to_probability(state: Any, raw: np.ndarray) -> np.ndarray:
        if isinstance(state, SoftmaxCoefficients):
            return state.probabilities(raw)
        p0 = 1.0 / (1.0 + np.exp(-raw[:, 0]))  # MLlib's order: class 0 first, class 1 = 1 - p0
        return np.column_stack([p0, 1.0 - p0])

    def _prediction_rule(self) -> Any:
        """(probability threshold, margin threshold), MLlib's ``_binaryThresholds``; for a
        multinomial model MLlib's generic rule (``thresholds`` or None: argmax)."""
        if self._multinomial:
            return ArrowScoring._prediction_rule(self)
        t = self.getThreshold()
        if t == 0.0:
            return t, -np.inf
        if t == 1.0:
            return t, np.inf
        return t, float(np.log(t / (1.0 - t)))

    @staticmethod
    def _probability_to_prediction(state: Any, rule: Any, prob: np.ndarray) -> np.ndarray:
        if isinstance(state, SoftmaxCoefficients):
            return ArrowScoring._probability_to_prediction(state, rule, prob)
        return (prob[:, 1] > rule[0]).astype(np.float64)

    @classmethod
    def _raw_to_prediction(cls, state: Any, rule: Any, raw: np.ndarray) -> np.ndarray:
        if isinstance(state, SoftmaxCoefficients):
            return super()._raw_to_prediction(state, rule, raw)
        return (raw[:, 1] > rule[1]).astype(np.float64)

    @classmethod
    def _features_to_prediction(cls, state: Any, rule: Any, csr: CSRBatch) -> np.ndarray:
        if isinstance(state, SoftmaxCoefficients):
            return super()._features_to_prediction(state, rule, csr)
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
            self._summary._validation_auc = list(getattr(self, "_validation_auc", []))
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
        if "thresholds" in params:  # MLlib refuses both at once unless they agree (binary)
            params.pop("threshold", None)
        spark = SparkSession.active()
        if self._multinomial:
            matrix = self._class_matrix().toArray()  # dense [K, numFeatures], as MLlib trains
            return lr_to_mllib(spark, self.uid, matrix, self._intercepts, params=params)
        coef = (
            self._values if self._keys is None else (self._keys, self._values, self._num_features)
        )
        return lr_to_mllib(spark, self.uid, coef, self.intercept, params=params)

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
        if self._quant is not None:  # "storage" tells the layouts apart on load
            meta, arrays = self._quant.to_arrays()
            extra = {"numClasses": 2, "numFeatures": self._num_features, "storage": "quantized"}
            arrays["intercept"] = np.array([self._intercept])
            return {**extra, "compression": meta}, arrays
        extra = {
            "numClasses": self.numClasses,
            "numFeatures": self._num_features,
            "storage": "dense" if self._keys is None else "sparse",
        }
        arrays = {"values": self._values.reshape(-1), "intercept": np.array([self._intercept])}
        if self._multinomial:
            extra["multinomial"] = True
            arrays["intercepts"] = self._intercepts
        if self._keys is not None:
            arrays["keys"] = self._keys
        return extra, arrays

    @classmethod
    def _from_saved(cls, metadata: dict, arrays: dict[str, np.ndarray]) -> LogisticRegressionModel:
        model = cls()
        if metadata.get("storage") == "quantized":
            model._set_coefficients(np.zeros(0), float(arrays["intercept"][0]))
            n = int(metadata["numFeatures"])
            model._quant = QuantizedWeights.from_arrays(metadata["compression"], arrays, n)
            model._num_features = n
            return model
        if metadata.get("multinomial"):
            model._set_matrix(
                arrays["values"],
                arrays["intercepts"],
                keys=arrays.get("keys"),
                num_features=int(metadata["numFeatures"]),
            )
            return model
        model._set_coefficients(
            arrays["values"],
            float(arrays["intercept"][0]),
            keys=arrays.get("keys"),
            num_features=int(metadata["numFeatures"]),
        )
        return model


def compressed(rows: np.ndarray) -> Matrix:
    """A dense row-major ``[K, n]`` matrix in MLlib's ``Matrix.compressed`` form: dense, or
    sparse by columns or by rows, whichever MLlib counts as fewest bytes (ties: dense, then
    by columns), so that printing and type checks see what MLlib returns."""
    K, n = rows.shape
    nz = rows != 0.0
    nnz = int(nz.sum())
    dense_bytes = 8 * K * n + 12
    csc_bytes = 12 * nnz + 4 * (n + 1) + 36
    csr_bytes = 12 * nnz + 4 * (K + 1) + 36
    if dense_bytes <= min(csc_bytes, csr_bytes):
        return DenseMatrix(K, n, np.ascontiguousarray(rows).reshape(-1), isTransposed=True)
    if csc_bytes <= csr_bytes:
        cols = nz.T
        ptrs = np.concatenate([[0], np.cumsum(cols.sum(axis=1))]).astype(np.int64)
        idx = np.concatenate([np.flatnonzero(c) for c in cols]).astype(np.int64)
        return SparseMatrix(K, n, ptrs, idx, rows.T[cols], False)
    ptrs = np.concatenate([[0], np.cumsum(nz.sum(axis=1))]).astype(np.int64)
    idx = np.concatenate([np.flatnonzero(r) for r in nz]).astype(np.int64)
    return SparseMatrix(K, n, ptrs, idx, rows[nz], True)


def _uuid() -> str:
    return str(uuid.uuid4())
