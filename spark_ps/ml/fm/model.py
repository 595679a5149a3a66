"""FMClassificationModel and FMRegressionModel: MLlib's FM models, held sparse.

A model keeps the rows training touched: sorted feature ``keys`` with their factor rows,
the linear weights of the keys that have one, and the intercept. A feature the fit never
saw has the row the PS would have created for it: N(0, initStd) values derived from
(seed, key) (:func:`ps_server.shard.storage.init_values`), and linear weight 0. That is the dense
model MLlib would hold, so ``factors`` / ``linear`` (MLlib's dense attributes, built on
request) and :meth:`toMLlib` give exactly the predictions of ``transform``.

``transform`` is one Arrow pass (:mod:`spark_ps.ml.base`): numpy per batch, the factor rows
of the batch's keys looked up by binary search, never a dense table.
"""

from __future__ import annotations

import uuid
from typing import Any

import numpy as np
import scipy.sparse as sp
from pyspark.ml import classification as _mllib
from pyspark.ml.classification import _ProbabilisticClassifierParams
from pyspark.ml.linalg import DenseMatrix, DenseVector, SparseVector, Vector
from pyspark.sql import DataFrame

from ps_server.shard.storage import init_values
from spark_ps.data import CSRBatch
from spark_ps.ml._plot import PlotsHistory
from spark_ps.ml.base import ArraysReadable, ArraysWritable, ArrowRegressionScoring, ArrowScoring
from spark_ps.ml.fm.params import _FactorizationMachinesParams
from spark_ps.ml.fm.worker import fm_forward

__all__ = [
    "FMClassificationModel",
    "FMRegressionModel",
    "FMClassificationSummary",
    "FMClassificationTrainingSummary",
    "FMState",
    "DENSE_EXPORT_MAX",
]

#: Largest numFeatures * factorSize that ``factors`` / ``toMLlib`` build densely (2 GiB of
#: float64); MLlib's models hold the factors as one dense matrix.
DENSE_EXPORT_MAX = 2**28


class FMState:
    """The picklable scoring state: sparse rows plus what defines the unseen ones."""

    def __init__(self, num_features, keys, factors, linear_keys, linear, intercept, k, std, seed):
        self.num_features, self.k = int(num_features), int(k)
        self.keys = np.asarray(keys, dtype=np.int64)
        self.factors = np.asarray(factors, dtype=np.float64).reshape(self.keys.size, self.k)
        self.linear_keys = np.asarray(linear_keys, dtype=np.int64)
        self.linear = np.asarray(linear, dtype=np.float64).reshape(-1)
        self.intercept, self.std, self.seed = float(intercept), float(std), int(seed)

    def rows(self, keys: np.ndarray) -> np.ndarray:
        """Factor rows of sorted unique `keys`: the fitted row, else the initial one."""
        pos = np.searchsorted(self.keys, keys)
        hit = pos < self.keys.size
        hit[hit] = self.keys[pos[hit]] == keys[hit]
        out = np.empty((keys.size, self.k))
        out[hit] = self.factors[pos[hit]]
        missing = ~hit
        if missing.any():
            out[missing] = init_values(
                keys[missing], self.k, "normal", self.std, self.seed, np.dtype(np.float64)
            )
        return out

    def linear_at(self, keys: np.ndarray) -> np.ndarray:
        pos = np.searchsorted(self.linear_keys, keys)
        out = np.zeros(keys.size)
        ok = pos < self.linear_keys.size
        ok[ok] = self.linear_keys[pos[ok]] == keys[ok]
        out[ok] = self.linear[pos[ok]]
        return out

    def raw(self, csr: CSRBatch) -> np.ndarray:
        """The FM's raw prediction for every row of `csr` (global feature ids)."""
        keys, local = csr.localize()
        x = sp.csr_matrix((local.values, local.indices, local.indptr), (csr.n_rows, keys.size))
        raw, _ = fm_forward(x, self.rows(keys), self.linear_at(keys), self.intercept)
        return np.asarray(raw, dtype=np.float64).reshape(-1)

    def dense(self) -> tuple[np.ndarray, np.ndarray]:
        """(factors [numFeatures, k], linear [numFeatures]) as MLlib holds them."""
        n = self.num_features
        if n * self.k > DENSE_EXPORT_MAX:
            raise ValueError(
                f"a dense {n} x {self.k} factor matrix ({n * self.k * 8 >> 20} MiB) is past "
                f"the {DENSE_EXPORT_MAX * 8 >> 20} MiB limit of the dense MLlib form; use "
                "factorKeys / factorRows (the fitted rows) instead"
            )
        return self.rows(np.arange(n, dtype=np.int64)), self.linear_at(np.arange(n))


class _FMModel(ArraysWritable):
    """What both FM models share: state, MLlib's attributes, save/load, export."""

    _mllib_class = ""

    def _init_state(self) -> None:
        self._state = FMState(0, [], np.zeros((0, 1)), [], [], 0.0, 1, 0.01, 0)
        self._objective_history: list[float] = []

    def _set_state(self, state: FMState, history: list[float] | None = None) -> None:
        self._state = state
        self._objective_history = list(history or [])

    def _scoring_state(self) -> FMState:
        return self._state

    @property
    def numFeatures(self) -> int:
        """Size of the feature vectors the model takes."""
        return self._state.num_features

    @property
    def intercept(self) -> float:
        """The intercept (w0)."""
        return self._state.intercept

    @property
    def linear(self) -> Vector:
        """The linear weights (w): dense, one per feature, as MLlib's (empty sparse without
        fitLinear)."""
        s = self._state
        if not self.getFitLinear():
            return SparseVector(s.num_features, [], [])
        return DenseVector(s.linear_at(np.arange(s.num_features, dtype=np.int64)))

    @property
    def factors(self) -> DenseMatrix:
        """The factor matrix (numFeatures x factorSize), dense as MLlib's."""
        v, _ = self._state.dense()
        return DenseMatrix(v.shape[0], v.shape[1], v.ravel(), isTransposed=True)

    @property
    def factorKeys(self) -> np.ndarray:
        """Sorted feature keys whose factor rows the fit created or changed."""
        return self._state.keys.copy()

    @property
    def factorRows(self) -> np.ndarray:
        """The factor rows of :attr:`factorKeys` (float64 [n, factorSize])."""
        return self._state.factors.copy()

    @property
    def objectiveHistory(self) -> list[float]:
        """Objective (mean loss + 0.5 regParam ||w||^2) at each iteration, as MLlib's."""
        return list(self._objective_history)

    def toMLlib(self):
        """The genuine MLlib model (``pyspark.ml`` class, built on the JVM by the bridge)."""
        from pyspark.sql import SparkSession

        from spark_ps._jvm import call_bridge, ensure_bridge, wrap_java_model

        v, w = self._state.dense()
        export = ensure_bridge(SparkSession.active()).FMExport
        build = export.classifier if self._mllib_class == "classification" else export.regressor
        jm = call_bridge(
            build,
            self.uid,
            int(v.shape[0]),
            int(v.shape[1]),
            np.ascontiguousarray(v, dtype="<f8").tobytes(),
            np.ascontiguousarray(w, dtype="<f8").tobytes(),
            float(self.intercept),
            bool(self.getFitLinear()),
        )
        from pyspark.ml.classification import FMClassificationModel as MLlibClassifier
        from pyspark.ml.regression import FMRegressionModel as MLlibRegressor

        cls = MLlibClassifier if self._mllib_class == "classification" else MLlibRegressor
        names = [p.name for p in self.params if self.isDefined(p) and p.name != "numWorkers"]
        params = {n: self.getOrDefault(n) for n in names if n in _MLLIB_NAMES}
        return wrap_java_model(cls, jm, params)

    def _save_data(self) -> tuple[dict, dict[str, np.ndarray]]:
        s = self._state
        extra = {"numFeatures": s.num_features, "intercept": s.intercept}
        arrays = {
            "keys": s.keys,
            "factors": s.factors.ravel(),
            "linear_keys": s.linear_keys,
            "linear": s.linear,
            "history": np.asarray(self._objective_history, dtype=np.float64),
        }
        return extra, arrays

    @classmethod
    def _from_saved(cls, metadata: dict, arrays: dict[str, np.ndarray]):
        model = cls()
        p = {**metadata.get("defaultParamMap", {}), **metadata["paramMap"]}  # set values win
        k = int(p.get("factorSize", 8))
        state = FMState(
            metadata["numFeatures"],
            arrays.get("keys", np.zeros(0, np.int64)),
            arrays.get("factors", np.zeros(0)),
            arrays.get("linear_keys", np.zeros(0, np.int64)),
            arrays.get("linear", np.zeros(0)),
            metadata["intercept"],
            k,
            float(p.get("initStd", 0.01)),
            int(p["seed"]),
        )
        model._set_state(state, list(arrays.get("history", [])))
        return model


_MLLIB_NAMES = (
    "featuresCol", "labelCol", "predictionCol", "rawPredictionCol", "probabilityCol",
    "thresholds", "factorSize", "fitIntercept", "fitLinear", "regParam", "miniBatchFraction",
    "initStd", "maxIter", "stepSize", "tol", "solver", "seed", "weightCol",
)  # fmt: skip


class FMClassificationSummary(_mllib.FMClassificationSummary):
    """FM classifier results on a dataset: MLlib's binary metrics (``areaUnderROC``, ``roc``,
    ``accuracy``, ...) computed on the JVM by MLlib's own summary over our predictions."""


class FMClassificationTrainingSummary(
    PlotsHistory, FMClassificationSummary, _mllib.FMClassificationTrainingSummary
):
    """FM classifier training results: MLlib's metrics plus our optimizer trace."""

    _objective_history: list[float]

    @property
    def objectiveHistory(self) -> list[float]:
        """Objective (mean loss + 0.5 regParam ||w||^2) at each iteration, initial first."""
        return list(self._objective_history)

    @property
    def totalIterations(self) -> int:
        """Number of training iterations (MLlib's count: len(objectiveHistory) - 1)."""
        return max(len(self._objective_history) - 1, 0)


class FMClassificationModel(
    _FMModel,
    ArrowScoring,
    _FactorizationMachinesParams,
    _ProbabilisticClassifierParams,
    ArraysReadable["FMClassificationModel"],
):
    """Model fitted by :class:`spark_ps.ml.classification.FMClassifier`.

    rawPrediction is ``[-raw, raw]``, probability ``[1 - sigmoid(raw), sigmoid(raw)]``, as
    MLlib's; prediction the argmax (with ``thresholds`` when set).
    """

    _mllib_class = "classification"

    def __init__(self) -> None:
        super().__init__()
        self._init_state()

    @property
    def numClasses(self) -> int:
        return 2

    @property
    def hasSummary(self) -> bool:
        """Whether a training summary exists for this model instance."""
        return getattr(self, "_training", None) is not None

    def summary(self) -> FMClassificationTrainingSummary:
        """Summary of the model on its training set (a method, as pyspark's FM model)."""
        if not self.hasSummary:
            raise RuntimeError(f"No training summary available for this {type(self).__name__}")
        return self._make_summary(self._training, self._objective_history)

    def evaluate(self, dataset: DataFrame) -> FMClassificationSummary:
        """Evaluates the model on a test dataset (MLlib's metrics)."""
        if not isinstance(dataset, DataFrame):
            raise TypeError(f"dataset must be a DataFrame but got {type(dataset)}.")
        return self._make_summary(dataset, None)

    def _make_summary(self, dataset: DataFrame, history: list[float] | None):
        from spark_ps import _jvm

        model = self
        for param, prefix in (
            (self.probabilityCol, "probability_"),
            (self.predictionCol, "prediction_"),
        ):
            if not model.getOrDefault(param):  # MLlib's findSummaryModel
                model = model.copy() if model is self else model
                model._set(**{param.name: prefix + uuid.uuid4().hex[:12]})
        weight_col = self.getWeightCol() if self.isDefined(self.weightCol) else "weightCol"
        java = _jvm.binary_lr_summary(
            model.transform(dataset),
            model.getProbabilityCol(),
            model.getPredictionCol(),
            self.getLabelCol(),
            self.getFeaturesCol(),
            weight_col,
        )
        if history is None:
            return FMClassificationSummary(java)
        summary = FMClassificationTrainingSummary(java)
        summary._objective_history = [float(v) for v in history]
        return summary

    @staticmethod
    def _margins(state: FMState, csr: CSRBatch) -> np.ndarray:
        raw = state.raw(csr)
        return np.column_stack([-raw, raw])

    @staticmethod
    def _raw_to_probability(state: Any, raw: np.ndarray) -> np.ndarray:
        p1 = 1.0 / (1.0 + np.exp(-raw[:, 1]))
        return np.column_stack([1.0 - p1, p1])

    def __repr__(self) -> str:
        return (
            f"FMClassificationModel: uid={self.uid}, numClasses=2, "
            f"numFeatures={self.numFeatures}, factorSize={self.getFactorSize()}, "
            f"fitLinear={self.getFitLinear()}, fitIntercept={self.getFitIntercept()}"
        )


class FMRegressionModel(
    _FMModel,
    ArrowRegressionScoring,
    _FactorizationMachinesParams,
    ArraysReadable["FMRegressionModel"],
):
    """Model fitted by :class:`spark_ps.ml.regression.FMRegressor`."""

    _mllib_class = "regression"

    def __init__(self) -> None:
        super().__init__()
        self._init_state()

    @staticmethod
    def _predict_values(state: FMState, csr: CSRBatch) -> np.ndarray:
        return state.raw(csr)

    def __repr__(self) -> str:
        return (
            f"FMRegressionModel: uid={self.uid}, numFeatures={self.numFeatures}, "
            f"factorSize={self.getFactorSize()}, fitLinear={self.getFitLinear()}, "
            f"fitIntercept={self.getFitIntercept()}"
        )
