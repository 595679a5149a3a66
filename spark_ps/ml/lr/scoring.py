"""What an LR model ships to executors for scoring, and its per-row margins.

A dense model over 2^24 features is 128 MB of float64 (MLlib serializes it into every
scoring task); its non-zeros are usually far fewer, and only they travel.

* On the JVM (:func:`jvm_scores`, the default when the bridge jar is built): the non-zeros
  are broadcast once per model (``io.sparkps.bridge.LRWeights``) and the bridge's UDFs
  compute the output columns; no Python worker, no Arrow conversion of the rows.
* In Python workers (``mapInArrow``, the fallback): :class:`ScoringCoefficients` is pickled
  with the task and rebuilds the dense array once per task, so the per-entry weight lookup
  stays one gather. Row sums run in scipy's CSR loop: each row summed in its stored order
  (as MLlib's sparse dot) without an nnz-sized row-id array.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import scipy.sparse as sp
from pyspark.sql import DataFrame, SparkSession

from spark_ps import _jvm
from spark_ps.data import CSRBatch
from spark_ps.ml.base import _quote, features_kind

__all__ = ["ScoringCoefficients", "SoftmaxCoefficients", "row_sums", "jvm_scores", "ENGINE"]

_log = logging.getLogger(__name__)


class ScoringCoefficients:
    """Coefficients of a binomial model for scoring: dense (by feature id) or sparse keys.

    ``keys`` None means ``values`` is dense; with ``dense_size`` the sparse ``(keys,
    values)`` stand for a dense array of that size, rebuilt lazily where it is used.
    """

    def __init__(
        self,
        keys: np.ndarray | None,
        values: np.ndarray,
        intercept: float,
        dense_size: int | None = None,
    ):
        self.keys, self.values, self.intercept = keys, values, float(intercept)
        self.dense_size = dense_size
        self._dense: np.ndarray | None = None

    @classmethod
    def of(cls, keys: np.ndarray | None, values: np.ndarray, intercept: float):
        """Ship a dense model as its non-zeros when fewer than half of it is non-zero."""
        if keys is None:
            nz = np.flatnonzero(values)
            if nz.size * 2 < values.size:
                return cls(nz, values[nz], intercept, dense_size=values.size)
        return cls(keys, values, intercept)

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_dense": None}  # the rebuilt dense array never travels

    def weights_at(self, indices: np.ndarray) -> np.ndarray:
        """The coefficient of each feature id in ``indices`` (0 for ids the model lacks)."""
        if self.dense_size is not None:
            if self._dense is None:
                self._dense = np.zeros(self.dense_size)
                self._dense[self.keys] = self.values
            return self._dense[indices]
        if self.keys is None:
            return self.values[indices]
        if self.keys.shape[0] == 0:
            return np.zeros(indices.shape[0])
        # each distinct id looked up once, in sorted order: a cache-friendly binary search
        ids, inverse = np.unique(indices, return_inverse=True)
        pos = np.minimum(np.searchsorted(self.keys, ids), self.keys.shape[0] - 1)
        return np.where(self.keys[pos] == ids, self.values[pos], 0.0)[inverse.reshape(-1)]

    def margins(self, csr: CSRBatch) -> np.ndarray:
        """``x . w + b`` per row."""
        return row_sums(csr.indptr, csr.values * self.weights_at(csr.indices)) + self.intercept


class SoftmaxCoefficients:
    """A multinomial model for scoring: ``matrix`` [rows, K] (a row per feature: every
    feature id when ``keys`` is None, else the sorted int64 ``keys``) and ``intercepts``."""

    def __init__(self, keys: np.ndarray | None, matrix: np.ndarray, intercepts: np.ndarray):
        self.keys, self.matrix = keys, np.asarray(matrix, dtype=np.float64)
        self.intercepts = np.asarray(intercepts, dtype=np.float64)

    @classmethod
    def of(cls, keys: np.ndarray | None, matrix: np.ndarray, intercepts: np.ndarray):
        """Ship a dense model as its non-zero rows when fewer than half of them are."""
        if keys is None:
            nz = np.flatnonzero(np.any(matrix != 0.0, axis=1))
            if nz.size * 2 < matrix.shape[0]:
                return cls(nz.astype(np.int64), matrix[nz], intercepts)
        return cls(keys, matrix, intercepts)

    def margins(self, csr: CSRBatch) -> np.ndarray:
        """``X W + b``: float64 [n, K], one sparse-dense product per batch."""
        W, cols = self.matrix, csr.indices
        if self.keys is not None:  # ids the model lacks point at an all-zero row
            n = self.keys.shape[0]
            pos = np.minimum(np.searchsorted(self.keys, cols), max(n - 1, 0))
            hit = self.keys[pos] == cols if n else np.zeros(cols.shape[0], dtype=bool)
            cols = np.where(hit, pos, n)
            W = np.vstack([W, np.zeros((1, W.shape[1]))])
        X = sp.csr_matrix((csr.values, cols, csr.indptr), shape=(csr.n_rows, W.shape[0]))
        return np.asarray(X @ W) + self.intercepts

    @staticmethod
    def probabilities(raw: np.ndarray) -> np.ndarray:
        """Softmax of each row, the largest margin taken out first (as MLlib's)."""
        e = np.exp(raw - raw.max(axis=1, keepdims=True))
        return e / e.sum(axis=1, keepdims=True)


def row_sums(indptr: np.ndarray, products: np.ndarray) -> np.ndarray:
    """Sum of ``products[indptr[i]:indptr[i+1]]`` for each row i, left to right from 0.0.

    scipy's CSR mat-vec against a one-column matrix of ones is exactly that loop.
    """
    n = indptr.shape[0] - 1
    if products.shape[0] == 0:
        return np.zeros(n)
    cols = np.zeros(products.shape[0], dtype=np.int32)
    return sp.csr_matrix((products, cols, indptr), shape=(n, 1)) @ np.ones(1)


#: Where ``transform`` scores: ``"auto"`` on the JVM when the bridge jar is built (no Python
#: worker at all), else in Python workers; ``"jvm"`` or ``"python"`` to force one (tests).
ENGINE = "auto"


def jvm_scores(model: Any, dataset: DataFrame, spec: Any) -> DataFrame | None:
    """``dataset`` with ``model``'s output columns computed by the bridge's ``LRScoring``.

    None (score in Python) for ``array<double>`` features, for models whose weights are not
    fixed numbers (the online learner's live model reads the PS per task), with
    ``ENGINE="python"``, or when the bridge is not available (Spark Connect, jar not built)
    and ``ENGINE="auto"``. The weights are broadcast once per model and SparkContext and
    reused by every transform.
    """
    if (
        ENGINE == "python"
        or not isinstance(model._scoring_state(), ScoringCoefficients)  # multinomial: Python
        or features_kind(dataset.schema, spec.features_col) == "dense"
    ):
        return None
    spark = dataset.sparkSession
    try:
        scorer = _cached_scorer(model, spark)
    except RuntimeError:
        if ENGINE == "jvm":
            raise
        _log.debug("LR scoring in Python workers: the JVM bridge is not available")
        return None
    threshold, raw_threshold = model._prediction_rule()
    predict_from = 0 if spec.raw_col else 1 if spec.prob_col else 2
    return _jvm.lr_score(
        dataset,
        scorer,
        features=_quote(spec.features_col),
        keys=features_kind(dataset.schema, spec.features_col) == "keys",
        values=_quote(spec.values_col) if spec.values_col else None,
        name=spec.features_col,
        cols=(spec.raw_col, spec.prob_col, spec.pred_col),
        predict_from=predict_from,
        threshold=threshold,
        raw_threshold=raw_threshold,
    )


def _cached_scorer(model: Any, spark: SparkSession) -> Any:
    """The model's broadcast weights in ``spark``'s context, made on first use."""
    app = spark.sparkContext.applicationId
    cached = getattr(model, "_jvm_scorer", None)
    if cached is not None and cached[0] == app:
        return cached[1]
    state = model._scoring_state()
    keys = state.keys if state.keys is not None else np.arange(state.values.size)
    scorer = _jvm.lr_scorer(
        spark,
        model.numFeatures,
        np.ascontiguousarray(keys, dtype="<i8").tobytes(),
        np.ascontiguousarray(state.values, dtype="<f8").tobytes(),
        state.intercept,
    )
    model._jvm_scorer = (app, scorer)
    return scorer
