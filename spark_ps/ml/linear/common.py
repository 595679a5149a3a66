"""What LinearRegression and LinearSVC share: Param checks, the input check, the fit call,
and coefficient storage (dense, or sorted int64 keys for a hashed key space) with
save/load and Python-side scoring."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from pyspark.ml.linalg import DenseVector, SparseVector, Vector
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from spark_ps.data import DENSE_MAX_FEATURES, CSRBatch
from spark_ps.ml.base import (
    ArraysWriter,
    _quote,
    check_features,
    check_weights,
    feature_checks,
    prepare_fit_data,
    weight_checks,
)
from spark_ps.ml.linear.fit import LinearFit, LinearProblem, train_linear
from spark_ps.ml.lr.scoring import ScoringCoefficients

__all__ = ["check_common_params", "check_input", "fit_linear", "LinearCoefficients"]

_INT32_MAX = 2**31 - 1


def _invalid(est, name: str, requirement: str) -> ValueError:
    value = est.getOrDefault(est.getParam(name))
    return ValueError(f"{est.uid} parameter {name} given invalid value {value!r}: {requirement}.")


def check_common_params(est) -> None:
    """MLlib's ParamValidators for the Params both estimators have, naming the Param."""
    reg = est.getRegParam()
    if not (reg >= 0 and math.isfinite(reg)):
        raise _invalid(est, "regParam", "must be finite and >= 0")
    if est.getMaxIter() < 0:
        raise _invalid(est, "maxIter", "must be >= 0")
    if not est.getTol() >= 0:
        raise _invalid(est, "tol", "must be >= 0")
    if est.getAggregationDepth() < 2:
        raise _invalid(est, "aggregationDepth", "must be >= 2")
    if not est.getMaxBlockSizeInMB() >= 0:
        raise _invalid(est, "maxBlockSizeInMB", "must be >= 0")


def weight_col(est) -> str | None:
    """The weight column, or None (weights 1.0), as MLlib treats an unset or empty Param."""
    if est.isDefined(est.weightCol) and est.getWeightCol():
        return est.getWeightCol()
    return None


def check_input(est, dataset: DataFrame, *, binary_labels: bool) -> None:
    """One Spark aggregation over label, weight and features; MLlib's errors for what it finds.

    Labels must be finite (regression) or 0/1 (``binary_labels``: LinearSVC, which also needs
    label 1 present, as MLlib counts classes from the largest label). Runs before anything
    is created on the PS.
    """
    name = est.getLabelCol()
    if name not in dataset.columns:
        raise ValueError(f"{est.uid}: label column {name!r} (labelCol) does not exist")
    label = F.col(_quote(name)).cast("double")
    bad_value = label.isNull() | F.isnan(label) | (F.abs(label) == float("inf"))
    aggs = [
        F.count(F.lit(1)).alias("n"),
        F.sum(bad_value.cast("long")).alias("nulls"),
        F.first(F.when(bad_value, label.cast("string")), ignorenulls=True).alias("first_bad"),
        F.max(label).alias("max"),
    ]
    if binary_labels:
        aggs.append(F.sum(((label < 0) | (label != F.floor(label))).cast("long")).alias("bad"))
    wname = weight_col(est)
    aggs += weight_checks(wname)
    aggs += feature_checks(dataset.schema, est.getFeaturesCol())
    row = dataset.agg(*aggs).first()
    if row["n"] == 0:
        raise ValueError(f"{est.uid}: the training dataset is empty")
    if row["nulls"]:
        raise ValueError(
            f"Labels MUST NOT be Null or NaN or Infinity: column {name!r} (labelCol) has "
            f"{row['nulls']} such rows (first: {row['first_bad']})"
        )
    if binary_labels:
        if row["bad"]:
            raise ValueError(
                f"Classification labels should be in [0 to 1]: column {name!r} (labelCol) has "
                f"{row['bad']} negative or non-integer labels"
            )
        classes = int(row["max"]) + 1
        attr = dataset.schema[name].metadata.get("ml_attr", {})
        classes = max(classes, int(attr.get("num_vals", len(attr.get("vals", []))) or 0))
        if classes != 2:
            raise ValueError(
                f"LinearSVC only supports binary classification. {classes} classes detected "
                f"in {name!r} (labelCol)"
            )
    check_weights(row, wname)
    check_features(row, est.getFeaturesCol())


def fit_linear(est, dataset: DataFrame, problem: LinearProblem) -> LinearFit:
    """Prepare the data (needed columns, one partition per worker) and fit on the PS."""
    prepared = prepare_fit_data(
        dataset,
        features_col=est.getFeaturesCol(),
        label_col=est.getLabelCol(),
        weight_col=weight_col(est),
        densify_max=DENSE_MAX_FEATURES,
    )
    name = f"{type(est).__name__}(loss={problem.loss}, maxIter={problem.max_iter})"
    return train_linear(prepared, problem, name)


class GeneralWriter(ArraysWriter):
    """Our writer, plus MLlib's ``format(source)``: ``"internal"`` (or ``"spark-ps"``) is
    spark-ps's own layout; any other format (``"pmml"``) is written by MLlib's own writer of
    the exported genuine model (``toMLlib()``)."""

    def format(self, source: str):
        if source in ("internal", "spark-ps"):
            return self
        return self.instance.toMLlib().write().format(source)


class LinearCoefficients:
    """Coefficients and intercept of a linear model: dense (``values[i]`` is feature ``i``) or
    sorted unique int64 ``keys`` with their ``values`` plus ``numFeatures``."""

    def write(self) -> GeneralWriter:
        """An MLWriter for this model; ``.format("pmml")`` writes MLlib's PMML."""
        return GeneralWriter(self)

    def _init_coefficients(self) -> None:
        self._values = np.zeros(0, dtype=np.float64)
        self._keys: np.ndarray | None = None
        self._num_features = 0
        self._intercept = 0.0
        self._state: ScoringCoefficients | None = None

    def _set_coefficients(
        self, values: Any, intercept: float, *, keys: Any = None, num_features: int | None = None
    ) -> None:
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
            unsorted = bool(np.any(np.diff(keys) <= 0))
            if keys.size and (unsorted or keys[0] < 0 or keys[-1] >= num_features):
                raise ValueError(
                    f"coefficient keys must be sorted, unique and in [0, {num_features})"
                )
            self._keys, self._num_features = keys, int(num_features)
        self._values = values
        self._intercept = float(intercept)
        self._state = None

    @property
    def numFeatures(self) -> int:
        """Number of features (vector size, or the key space of a sparse model)."""
        return self._num_features

    @property
    def coefficients(self) -> Vector:
        """Coefficients: a DenseVector, or a SparseVector for a sparse (key-space) model."""
        if self._keys is None:
            return DenseVector(self._values.copy())
        if self._keys.size and self._keys[-1] > _INT32_MAX:
            raise ValueError(
                f"coefficients: key {int(self._keys[-1])} exceeds the int32 indices of "
                "pyspark.ml.linalg; use coefficientKeys and coefficientValues"
            )
        return SparseVector(self._num_features, self._keys.copy(), self._values.copy())

    @property
    def intercept(self) -> float:
        """Model intercept."""
        return self._intercept

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

    def _scoring_state(self) -> ScoringCoefficients:
        if getattr(self, "_state", None) is None:
            self._state = ScoringCoefficients.of(self._keys, self._values, self._intercept)
        return self._state

    @staticmethod
    def _margin(state: ScoringCoefficients, csr: CSRBatch) -> np.ndarray:
        return state.margins(csr)

    def _export_args(self) -> tuple[int, np.ndarray | None, np.ndarray]:
        """(numFeatures, int64 keys or None, values) for the JVM bridge."""
        if self._num_features > _INT32_MAX:
            raise ValueError(
                f"numFeatures {self._num_features} exceeds what an MLlib model can hold (2**31-1)"
            )
        return self._num_features, self._keys, self._values

    def _coefficient_arrays(self) -> tuple[dict, dict[str, np.ndarray]]:
        extra = {
            "numFeatures": self._num_features,
            "storage": "dense" if self._keys is None else "sparse",
        }
        arrays = {"values": self._values, "intercept": np.array([self._intercept])}
        if self._keys is not None:
            arrays["keys"] = self._keys
        return extra, arrays

    def _load_coefficients(self, metadata: dict, arrays: dict[str, np.ndarray]) -> None:
        self._set_coefficients(
            arrays["values"],
            float(arrays["intercept"][0]),
            keys=arrays.get("keys"),
            num_features=int(metadata["numFeatures"]),
        )


def mllib_params(model, mllib_cls) -> dict:
    """The model's Params that the MLlib class also has, by name."""
    ref = mllib_cls()
    return {
        p.name: model.getOrDefault(p)
        for p in model.params
        if model.isDefined(p) and ref.hasParam(p.name)
    }
