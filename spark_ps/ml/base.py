"""Plumbing shared by spark-ps models (LR, GBT): data preparation, Arrow scoring, save/load.

Scoring contract for a model class (all numpy, whole batches, no per-row Python):

* ``_scoring_state(self)``: the small picklable object shipped to executors (coefficients,
  trees, or later PS handles); everything the static hooks below may read.
* ``_margins(state, csr) -> float64 (n, numClasses)``: raw predictions (classifiers).
* ``_raw_to_probability(state, raw) -> float64 (n, numClasses)``.
* ``_predict_values(state, csr) -> float64 (n,)``: predictions (regressors).
* ``_jvm_scores(self, dataset, spec)`` (classifiers, optional): the output columns computed
  on the JVM instead, or None to score in Python workers as above.

The hooks are static so the executor closure holds the class (by reference) and the state,
never the model with its Params and summary.
"""

from __future__ import annotations

import functools
import logging
import os
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import numpy as np
import pyarrow as pa
from pyspark import TaskContext
from pyspark.ml.base import PredictionModel
from pyspark.ml.classification import ProbabilisticClassificationModel
from pyspark.ml.functions import array_to_vector, vector_to_array
from pyspark.ml.linalg import (
    DenseMatrix,
    DenseVector,
    SparseMatrix,
    SparseVector,
    Vector,
    VectorUDT,
)
from pyspark.ml.param import Params
from pyspark.ml.util import (
    DefaultParamsReader,
    DefaultParamsWriter,
    MLReadable,
    MLReader,
    MLWritable,
    MLWriter,
)
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from spark_ps import _jvm
from spark_ps.data import VALIDATION_FLAG, CSRBatch, arrow_to_csr
from spark_ps.ml._job import num_partitions, task_slots
from spark_ps.ml.parse_cache import persisted_input_key

__all__ = [
    "feature_checks",
    "check_features",
    "PreparedData",
    "features_kind",
    "prepare_fit_data",
    "validation_indicator",
    "split_validation",
    "training_flag",
    "ArrowScoring",
    "ArrowRegressionScoring",
    "ArraysWritable",
    "ArraysReadable",
    "ArraysWriter",
    "ArraysReader",
    "vector_to_csr",
]

_log = logging.getLogger(__name__)
RL = TypeVar("RL")
_KEY_TYPES = (T.LongType, T.IntegerType, T.ShortType, T.ByteType)
_SUPPORTED = "VectorUDT, array<bigint>/array<int> (keys) or array<double>/array<float>"


# --------------------------------------------------------------------------- columns


def _quote(name: str) -> str:
    """A column reference that survives dots and backticks in ``name``."""
    return "`" + name.replace("`", "``") + "`"


def _field(schema: T.StructType, name: str, param: str) -> T.StructField:
    if name not in schema.fieldNames():
        raise ValueError(
            f"Column {name!r} ({param}) does not exist. Available: {schema.fieldNames()}"
        )
    return schema[name]


def validation_indicator(params: Params, dataset: DataFrame) -> str | None:
    """The ``validationIndicatorCol`` of `params` to split `dataset` on, checked as MLlib
    checks it (the column exists and is boolean); None when the Param is unset or empty."""
    if not isinstance(dataset, DataFrame):
        raise TypeError(f"dataset must be a DataFrame but got {type(dataset)}.")
    param = "validationIndicatorCol"
    name = params.getOrDefault(param) if params.isDefined(param) else ""
    if not name:
        return None
    dtype = _field(dataset.schema, name, param).dataType
    if not isinstance(dtype, T.BooleanType):
        raise TypeError(
            f"Column {name!r} ({param}) must be of type boolean but was actually "
            f"{dtype.simpleString()}."
        )
    return name


def split_validation(dataset: DataFrame, name: str) -> tuple[DataFrame, DataFrame]:
    """MLlib's split on validationIndicatorCol `name`: (rows where it is false, rows where
    it is true); a row whose flag is null is in neither."""
    flag = F.col(_quote(name))
    return dataset.where(~flag), dataset.where(flag)


def no_validation_rows(name: str | None) -> str:
    """The error for a validationIndicatorCol `name` that marks no row as validation (MLlib
    fails deep in its fit with "empty collection"); `name` None: a validation set given to a
    trainer directly, without the Param."""
    if name is None:
        return "the validation set holds no row: there is nothing to validate on"
    return (
        f"validationIndicatorCol {name!r} is true on no row: there is nothing to validate "
        "on; mark some rows true, or unset the Param"
    )


def training_flag(name: str) -> Any:
    """1 for a training row of validationIndicatorCol `name`, null for any other row (what
    ``F.count`` skips and ``F.when`` tests as false)."""
    return F.when(~F.col(_quote(name)), F.lit(1))


def features_kind(schema: T.StructType, name: str, param: str = "featuresCol") -> str:
    """``"vector"``, ``"keys"`` or ``"dense"`` for a features column, else TypeError."""
    dtype = _field(schema, name, param).dataType
    if isinstance(dtype, VectorUDT):
        return "vector"
    if isinstance(dtype, T.ArrayType) and isinstance(dtype.elementType, _KEY_TYPES):
        return "keys"
    if isinstance(dtype, T.ArrayType) and isinstance(dtype.elementType, T.FractionalType):
        return "dense"
    raise TypeError(
        f"Column {name!r} ({param}) must be of type {_SUPPORTED} but was actually "
        f"{dtype.simpleString()}."
    )


def feature_checks(schema: T.StructType, features_col: str) -> list[Any]:
    """Aggregations, to run in the same Spark job as the label checks, that find the rows
    MLlib refuses: null features, vectors of different sizes, NaN/inf feature values.

    Read the result with :func:`check_features`. Vectors are read through ``unwrap_udt``
    (their size field: a sparse vector is never expanded).
    """
    kind = features_kind(schema, features_col)
    col = F.col(_quote(features_col))
    aggs = [F.sum(col.isNull().cast("long")).alias("f_nulls")]
    if kind == "keys":
        return aggs
    if kind == "vector":
        struct = F.unwrap_udt(col)
        values = struct.getField("values")
        size = F.when(struct.getField("type") == 0, struct.getField("size")).otherwise(
            F.size(values)
        )
    else:
        values, size = col.cast("array<double>"), F.size(col)
    bad = F.exists(values, lambda v: F.isnan(v) | (F.abs(v) == float("inf")))
    size = F.when(col.isNotNull(), size)
    return aggs + [
        F.min(size).alias("f_min"),
        F.max(size).alias("f_max"),
        F.first(F.when(bad, col.cast("string")), ignorenulls=True).alias("f_bad"),
    ]


def check_features(row: Any, features_col: str) -> None:
    """Raise MLlib's errors for what :func:`feature_checks` found (a Row of its aliases,
    or that Row as a dict)."""
    found = row if isinstance(row, dict) else row.asDict()
    where = f"(featuresCol {features_col!r})"
    if found["f_nulls"]:
        raise ValueError(f"Vectors MUST NOT be Null: {found['f_nulls']} null rows {where}")
    if found.get("f_min") is not None and found["f_min"] != found["f_max"]:
        raise ValueError(
            f"Dimensions mismatch when adding new sample. Expecting {found['f_min']} but got "
            f"{found['f_max']} {where}"
        )
    if found.get("f_bad") is not None:
        raise ValueError(
            f"Vector values MUST NOT be NaN or Infinity, but got {found['f_bad']} {where}"
        )


def weight_checks(weight_col: str) -> list[Any]:
    """Aggregations that find the first weight MLlib refuses (null, NaN, negative, +inf);
    read with :func:`check_weights`. Empty when there is no weight column."""
    if not weight_col:
        return []
    w = F.col(_quote(weight_col)).cast("double")
    bad = w.isNull() | F.isnan(w) | (w < 0) | (w == float("inf"))
    return [
        F.first(F.when(bad, F.struct(w.alias("v"))), ignorenulls=True).alias("w_bad"),
        F.sum(bad.cast("long")).alias("w_bad_rows"),
    ]


def check_weights(row: Any, weight_col: str) -> None:
    """Raise MLlib's weight errors for what :func:`weight_checks` found (a Row of its aliases)."""
    if not weight_col or row["w_bad"] is None:
        return
    w = row["w_bad"]["v"]
    msg = (
        "Weights MUST NOT be Null or NaN"
        if w is None or w != w
        else f"Weights MUST NOT be Negative or Infinity, but got {'Infinity' if w > 0 else w}"
    )
    raise ValueError(f"{msg} (weightCol {weight_col!r}; {row['w_bad_rows']} such rows)")


def _check_numeric(schema: T.StructType, name: str, param: str) -> None:
    dtype = _field(schema, name, param).dataType
    if not isinstance(dtype, T.NumericType | T.BooleanType):
        raise TypeError(
            f"Column {name!r} ({param}) must be of type numeric but was actually "
            f"{dtype.simpleString()}."
        )


def _check_values_col(schema: T.StructType, name: str, kind: str) -> None:
    if kind != "keys":
        raise ValueError(
            f"featureValuesCol={name!r} needs an array<bigint> keys featuresCol, "
            f"but the featuresCol holds {kind} features."
        )
    dtype = _field(schema, name, "featureValuesCol").dataType
    if not (isinstance(dtype, T.ArrayType) and isinstance(dtype.elementType, T.FractionalType)):
        raise TypeError(
            f"Column {name!r} (featureValuesCol) must be of type array<double> but was "
            f"actually {dtype.simpleString()}."
        )


# --------------------------------------------------------------------------- fit plumbing


@dataclass
class PreparedData:
    """What a trainer receives: the needed columns only, one partition per worker.

    ``label_col`` and ``weight_col`` are double columns of ``df`` under their Param names;
    ``weight_col`` / ``values_col`` are None when unused (weights 1.0, key values 1.0).
    ``features_kind`` is ``"vector"``, ``"keys"`` or ``"dense"`` (see ``spark_ps.data``).
    ``validation_col``, when set, flags the rows that validate rather than train.
    """

    df: DataFrame
    features_col: str
    label_col: str
    weight_col: str | None
    values_col: str | None
    features_kind: str
    num_workers: int
    #: the boolean column of ``df`` flagging validation rows (``VALIDATION_FLAG``), or None
    validation_col: str | None = None
    #: what identifies the rows of ``df`` when the input is persisted (its cached data's
    #: RDD, plan and the columns read), else None: see :mod:`spark_ps.ml.parse_cache`
    input_key: str | None = None


def prepare_fit_data(
    dataset: DataFrame,
    *,
    features_col: str,
    label_col: str,
    weight_col: str | None = None,
    values_col: str | None = None,
    num_workers: int = 0,
    densify_max: int = 0,
    validation_col: str | None = None,
) -> PreparedData:
    """Validate column types, keep only the needed columns and repartition to the workers.

    ``num_workers=0`` means one per task slot (:func:`~spark_ps.ml._job.task_slots`: the
    executors' cores over ``spark.task.cpus``). A RuntimeWarning is
    issued when there are fewer task slots than workers (barrier/SSP training needs every
    worker running at once). With ``densify_max``, a vector column whose first row is a
    dense vector of at most that size travels densified (kind ``"dense"``; read it with
    ``read_partition(..., dense_matrix=True)``): packed by the JVM bridge as one float64
    ``binary`` per row (see :func:`densified`), else as ``array<double>``. With
    ``validation_col`` (a checked validationIndicatorCol) the rows keep its value as the
    boolean column ``VALIDATION_FLAG``; rows where it is null are dropped (MLlib's split
    puts them in neither set).
    """
    if not isinstance(dataset, DataFrame):
        raise TypeError(f"dataset must be a DataFrame but got {type(dataset)}.")
    schema = dataset.schema
    kind = features_kind(schema, features_col)
    _check_numeric(schema, label_col, "labelCol")
    features = F.col(_quote(features_col))
    densify = (
        kind == "vector"
        and bool(densify_max)
        and _declared_size(schema, features_col) <= densify_max
        and _dense_first_row(dataset, features_col, densify_max)
    )
    cols = [features, F.col(_quote(label_col)).cast("double").alias(label_col)]
    if weight_col:
        _check_numeric(schema, weight_col, "weightCol")
        cols.append(F.col(_quote(weight_col)).cast("double").alias(weight_col))
    if values_col:
        _check_values_col(schema, values_col, kind)
        cols.append(F.col(_quote(values_col)))
    slots = task_slots(dataset.sparkSession.sparkContext)
    workers = int(num_workers) or slots
    if workers > slots:
        warnings.warn(
            f"numWorkers={workers} exceeds the {slots} task slots of this SparkContext; "
            "training needs every worker running at once and may stall.",
            RuntimeWarning,
            stacklevel=3,
        )
    source = dataset
    if validation_col:
        dataset = dataset.where(F.col(_quote(validation_col)).isNotNull())
        cols.append(F.col(_quote(validation_col)).alias(VALIDATION_FLAG))
    df = dataset.select(*cols)
    if densify:
        df, kind = densified(df, features_col), "dense"
    # projections and a filter keep the input's partitions; the input's own plan is planned
    # once per DataFrame object (a refit or a param grid plans none), the fresh projection
    # at every fit (17-30 ms of py4j, measured)
    repartitioned = num_partitions(source) != workers
    if repartitioned:
        df = df.repartition(workers)
    columns = (features_col, label_col, weight_col, values_col, validation_col, workers, kind)
    input_key = persisted_input_key(source, repartitioned, *columns)
    flag = VALIDATION_FLAG if validation_col else None
    return PreparedData(
        df,
        features_col,
        label_col,
        weight_col or None,
        values_col or None,
        kind,
        workers,
        flag,
        input_key,
    )


def densified(df: DataFrame, features_col: str, how: str = "auto") -> DataFrame:
    """``df`` with its vector column as one float64 row each, for a dense-matrix read.

    ``how="auto"``: packed by the bridge (``io.sparkps.bridge.PackedRows``) when its jar is
    available, else ``array<double>``; ``"packed"`` / ``"arrays"`` force one (tests). Packed,
    Spark's Arrow writer copies one byte array per row, not every double of an array
    (measured: 200k x 100 dense rows, JVM CPU 1.30 -> 0.98 s, worker wait 0.95 -> 0.64 s).
    As arrays, a dense vector's ``values`` field is taken by projection, about half the cost
    of ``vector_to_array`` (measured 1.1-1.7 s vs 2.3-3.4 s per 131k-row partition on a loaded
    machine); only sparse rows go through the UDF, and a null vector stays null (the read
    refuses it by row; ``vector_to_array`` fails on it in the JVM)."""
    if how != "arrays":
        try:
            return _jvm.packed_rows(df, _quote(features_col), features_col)
        except RuntimeError:
            if how == "packed":
                raise
            _log.debug("dense rows as array<double>: the JVM bridge is not available")
    vec = F.col(_quote(features_col))
    struct = F.unwrap_udt(vec)
    null = F.lit(None).cast("array<double>")
    dense = F.when(vec.isNull(), null).when(struct.getField("type") == 1, struct.getField("values"))
    return df.withColumn(features_col, dense.otherwise(vector_to_array(vec, "float64")))


def _declared_size(schema: T.StructType, features_col: str) -> int:
    """The vector size the column's ML attributes declare (``num_attrs``, which
    VectorAssembler, FeatureHasher and HashingTF write), else 0 (unknown).

    Why: a declared size above the densify bound rules dense rows out without
    :func:`_dense_first_row`'s Spark job, which runs the input's plan up to its first row
    (measured: 3.2 s as a session's first job on a generated input, 0.07-0.15 s on a
    cached one).
    """
    size = schema[features_col].metadata.get("ml_attr", {}).get("num_attrs")
    return int(size) if isinstance(size, int) and size > 0 else 0


def _dense_first_row(dataset: DataFrame, features_col: str, max_size: int) -> bool:
    """Whether the first row holds a DenseVector of at most ``max_size`` (one small job).

    Later sparse rows would be densified, which is exact (stored zeros change no sum)
    and bounded by ``max_size`` values per row.
    """
    row = dataset.select(F.col(_quote(features_col))).head()
    value = None if row is None else row[0]
    return isinstance(value, DenseVector) and value.size <= max_size


# --------------------------------------------------------------------------- scoring


def vector_to_csr(value: Vector, num_features: int) -> CSRBatch:
    """One pyspark.ml.linalg Vector as a 1-row CSRBatch, its size checked like MLlib's BLAS."""
    if not isinstance(value, Vector):
        raise TypeError(f"expected a pyspark.ml.linalg Vector, got {type(value)}")
    if value.size != num_features:
        raise ValueError(
            f"vector size {value.size} does not match the model's numFeatures={num_features}"
        )
    if isinstance(value, SparseVector):
        indices, values = value.indices.astype(np.int64), value.values
    else:
        values = value.toArray()
        indices = np.arange(values.shape[0], dtype=np.int64)
    indptr = np.array([0, values.shape[0]], dtype=np.int64)
    return CSRBatch(indptr=indptr, indices=indices, values=values, num_features=num_features)


@dataclass(frozen=True)
class _OutputSpec:
    """Which columns to append and how to read the features (shipped to executors)."""

    features_col: str
    values_col: str | None
    num_features: int
    raw_col: str = ""
    prob_col: str = ""
    pred_col: str = ""


def _list_array(matrix: np.ndarray) -> pa.Array:
    """(n, k) float64 -> Arrow list<double> with k items per row, by offsets (no row loop)."""
    n, k = matrix.shape
    offsets = pa.array(np.arange(0, n * k + 1, k, dtype=np.int32))
    return pa.ListArray.from_arrays(offsets, pa.array(np.ascontiguousarray(matrix).ravel()))


def _partition_csrs(spec: _OutputSpec, batches: Iterator[pa.RecordBatch]):
    """(batch, CSRBatch) pairs; errors name the row within the partition and the partition."""
    row_offset = 0
    for batch in batches:
        try:
            csr = arrow_to_csr(
                batch,
                spec.features_col,
                values_col=spec.values_col,
                num_features=spec.num_features,
                row_offset=row_offset,
            )
        except ValueError as err:
            ctx = TaskContext.get()
            where = f" (partition {ctx.partitionId()})" if ctx is not None else ""
            raise ValueError(f"{err}{where}") from err
        row_offset += batch.num_rows
        yield batch, csr


def _score_classifier(payload: tuple, batches: Iterator[pa.RecordBatch]):
    """mapInArrow body: append raw/probability (list<double>) and prediction columns."""
    cls, state, rule, spec = payload
    for batch, csr in _partition_csrs(spec, batches):
        arrays, names = list(batch.columns), list(batch.schema.names)
        raw = prob = None
        if spec.raw_col or spec.prob_col:
            raw = cls._margins(state, csr)
        if spec.prob_col:
            prob = cls._raw_to_probability(state, raw)
        if spec.raw_col:
            arrays.append(_list_array(raw))
            names.append(spec.raw_col)
        if spec.prob_col:
            arrays.append(_list_array(prob))
            names.append(spec.prob_col)
        if spec.pred_col:
            if spec.raw_col:  # MLlib's order of preference: raw, then probability, then features
                pred = cls._raw_to_prediction(state, rule, raw)
            elif spec.prob_col:
                pred = cls._probability_to_prediction(state, rule, prob)
            else:
                pred = cls._features_to_prediction(state, rule, csr)
            arrays.append(pa.array(np.asarray(pred, dtype=np.float64)))
            names.append(spec.pred_col)
        yield pa.RecordBatch.from_arrays(arrays, names=names)


def _score_regressor(payload: tuple, batches: Iterator[pa.RecordBatch]):
    """mapInArrow body: append the prediction column."""
    cls, state, spec = payload
    for batch, csr in _partition_csrs(spec, batches):
        pred = cls._predict_values(state, csr)
        arrays = [*batch.columns, pa.array(np.asarray(pred, dtype=np.float64))]
        yield pa.RecordBatch.from_arrays(arrays, names=[*batch.schema.names, spec.pred_col])


class _ArrowTransform:
    """Validation and the one ``mapInArrow`` pass shared by classifiers and regressors."""

    def _scoring_state(self) -> Any:
        """The small picklable object executors need (coefficients, trees, PS handles)."""
        raise NotImplementedError

    def _output_spec(self, dataset: DataFrame, **cols: str) -> _OutputSpec:
        schema = dataset.schema
        kind = features_kind(schema, self.getFeaturesCol())
        values_col = self._feature_values_col() if hasattr(self, "_feature_values_col") else None
        if values_col:
            _check_values_col(schema, values_col, kind)
        for name in cols.values():
            if name and name in schema.fieldNames():
                raise ValueError(f"Output column {name} already exists.")
        return _OutputSpec(self.getFeaturesCol(), values_col, self.numFeatures, **cols)

    @staticmethod
    def _append(dataset: DataFrame, body: Any, new_fields: list[T.StructField]) -> DataFrame:
        schema = T.StructType(list(dataset.schema.fields) + new_fields)
        return dataset.mapInArrow(body, schema)


class ArrowScoring(_ArrowTransform, ProbabilisticClassificationModel):
    """Base of probabilistic classification models scored by one Arrow pass.

    ``transform`` appends rawPredictionCol, probabilityCol and predictionCol, each only when
    its Param is non-empty, exactly as MLlib's ProbabilisticClassificationModel, keeping all
    input columns. Vectors are built on the JVM (``array_to_vector``) from ``array<double>``.
    Subclasses implement ``_scoring_state``, ``_margins`` and ``_raw_to_probability``, and may
    override the prediction rules (defaults: MLlib's argmax with ``thresholds``).
    """

    @staticmethod
    def _margins(state: Any, csr: CSRBatch) -> np.ndarray:
        raise NotImplementedError

    @staticmethod
    def _raw_to_probability(state: Any, raw: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def _prediction_rule(self) -> Any:
        """Driver-side, picklable: what turns scores into labels (default: thresholds)."""
        if self.isDefined(self.thresholds):
            return np.asarray(self.getOrDefault(self.thresholds), dtype=np.float64)
        return None

    @staticmethod
    def _probability_to_prediction(state: Any, rule: Any, prob: np.ndarray) -> np.ndarray:
        """MLlib: argmax of probability / threshold (a 0 threshold wins outright)."""
        if rule is None:
            return np.argmax(prob, axis=1).astype(np.float64)
        with np.errstate(divide="ignore", invalid="ignore"):
            scaled = np.where(rule == 0.0, np.inf, prob / np.where(rule == 0.0, 1.0, rule))
        return np.argmax(scaled, axis=1).astype(np.float64)

    @classmethod
    def _raw_to_prediction(cls, state: Any, rule: Any, raw: np.ndarray) -> np.ndarray:
        if rule is None:
            return np.argmax(raw, axis=1).astype(np.float64)
        return cls._probability_to_prediction(state, rule, cls._raw_to_probability(state, raw))

    @classmethod
    def _features_to_prediction(cls, state: Any, rule: Any, csr: CSRBatch) -> np.ndarray:
        return cls._raw_to_prediction(state, rule, cls._margins(state, csr))

    def _check_thresholds_length(self) -> None:
        if self.isDefined(self.thresholds):
            ts = self.getOrDefault(self.thresholds)
            if len(ts) != self.numClasses:
                raise ValueError(
                    f"{type(self).__name__}.transform() called with non-matching numClasses "
                    f"and thresholds.length. numClasses={self.numClasses}, but thresholds has "
                    f"length {len(ts)}"
                )

    def _transform(self, dataset: DataFrame) -> DataFrame:
        self._check_thresholds_length()
        spec = self._output_spec(
            dataset,
            raw_col=self.getRawPredictionCol(),
            prob_col=self.getProbabilityCol(),
            pred_col=self.getPredictionCol(),
        )
        if not (spec.raw_col or spec.prob_col or spec.pred_col):
            _log.warning(
                "%s: transform() was called as NOOP since no output columns were set.", self.uid
            )
            return dataset
        out = self._jvm_scores(dataset, spec)
        to_vector = out is None
        if to_vector:
            payload = (type(self), self._scoring_state(), self._prediction_rule(), spec)
            arr = T.ArrayType(T.DoubleType(), containsNull=False)
            fields = [T.StructField(c, arr) for c in (spec.raw_col, spec.prob_col) if c]
            if spec.pred_col:
                fields.append(T.StructField(spec.pred_col, T.DoubleType(), nullable=False))
            out = self._append(dataset, functools.partial(_score_classifier, payload), fields)
        k = self.numClasses
        vec_meta = {"ml_attr": {"num_attrs": k}}
        replace = {
            c: (array_to_vector(F.col(_quote(c))) if to_vector else F.col(_quote(c))).alias(
                c, metadata=vec_meta
            )
            for c in (spec.raw_col, spec.prob_col)
            if c
        }
        if spec.pred_col:
            pred_meta = {"ml_attr": {"num_vals": k, "type": "nominal"}}
            replace[spec.pred_col] = F.col(_quote(spec.pred_col)).alias(
                spec.pred_col, metadata=pred_meta
            )
        return out.withColumns(replace)

    def _jvm_scores(self, dataset: DataFrame, spec: _OutputSpec) -> DataFrame | None:
        """``dataset`` with the output columns (vectors, no metadata) computed on the JVM,
        or None to score in Python workers through ``mapInArrow``."""
        return None

    def _single_row_raw(self, value: Vector) -> np.ndarray:
        return type(self)._margins(self._scoring_state(), vector_to_csr(value, self.numFeatures))

    def predictRaw(self, value: Vector) -> DenseVector:
        """Raw prediction for each possible label, for one feature vector."""
        return DenseVector(self._single_row_raw(value)[0])

    def predictProbability(self, value: Vector) -> DenseVector:
        """Probability of each class, for one feature vector."""
        raw = self._single_row_raw(value)
        return DenseVector(type(self)._raw_to_probability(self._scoring_state(), raw)[0])

    def predict(self, value: Vector) -> float:
        """Predicted label for one feature vector (thresholds honoured, as MLlib)."""
        self._check_thresholds_length()
        csr = vector_to_csr(value, self.numFeatures)
        cls = type(self)
        return float(
            cls._features_to_prediction(self._scoring_state(), self._prediction_rule(), csr)[0]
        )


class ArrowRegressionScoring(_ArrowTransform, PredictionModel):
    """Base of regression models scored by one Arrow pass (``_predict_values`` -> predictionCol)."""

    @staticmethod
    def _predict_values(state: Any, csr: CSRBatch) -> np.ndarray:
        raise NotImplementedError

    def _transform(self, dataset: DataFrame) -> DataFrame:
        spec = self._output_spec(dataset, pred_col=self.getPredictionCol())
        if not spec.pred_col:
            _log.warning(
                "%s: transform() was called as NOOP since no output columns were set.", self.uid
            )
            return dataset
        payload = (type(self), self._scoring_state(), spec)
        field = T.StructField(spec.pred_col, T.DoubleType(), nullable=False)
        return self._append(dataset, functools.partial(_score_regressor, payload), [field])

    def predict(self, value: Vector) -> float:
        """Prediction for one feature vector."""
        csr = vector_to_csr(value, self.numFeatures)
        return float(type(self)._predict_values(self._scoring_state(), csr)[0])


# --------------------------------------------------------------------------- save / load

_CHUNK_BYTES = 16 << 20


def _encode_param(value: Any) -> Any:
    """JSON form of a Param value; vectors and matrices as MLlib's JSON converters write them."""
    if isinstance(value, DenseVector):
        return {"type": 1, "values": value.toArray().tolist()}
    if isinstance(value, SparseVector):
        return {
            "type": 0,
            "size": value.size,
            "indices": value.indices.tolist(),
            "values": value.values.tolist(),
        }
    if isinstance(value, DenseMatrix):
        return {
            "class": "matrix", "type": 1, "numRows": value.numRows, "numCols": value.numCols,
            "values": value.values.tolist(), "isTransposed": bool(value.isTransposed),
        }  # fmt: skip
    if isinstance(value, SparseMatrix):
        return {
            "class": "matrix", "type": 0, "numRows": value.numRows, "numCols": value.numCols,
            "colPtrs": value.colPtrs.tolist(), "rowIndices": value.rowIndices.tolist(),
            "values": value.values.tolist(), "isTransposed": bool(value.isTransposed),
        }  # fmt: skip
    return value


def _decode_param(value: Any) -> Any:
    """Inverse of :func:`_encode_param`."""
    if not isinstance(value, dict) or "type" not in value:
        return value
    if value.get("class") == "matrix":
        if value["type"] == 1:
            return DenseMatrix(
                value["numRows"], value["numCols"], value["values"], value["isTransposed"]
            )
        return SparseMatrix(
            value["numRows"], value["numCols"], value["colPtrs"], value["rowIndices"],
            value["values"], value["isTransposed"],
        )  # fmt: skip
    if value["type"] == 1:
        return DenseVector(value["values"])
    return SparseVector(value["size"], value["indices"], value["values"])


def _save_arrays(spark: SparkSession, path: str, arrays: dict[str, np.ndarray]) -> None:
    """Named 1-D arrays as (name, chunk, dtype, bytes) rows of one parquet file; exact."""
    rows: dict[str, list] = {"name": [], "chunk": [], "dtype": [], "data": []}
    for name, arr in arrays.items():
        raw = np.ascontiguousarray(arr).reshape(-1)
        dtype = raw.dtype.newbyteorder("<")
        buf = raw.astype(dtype, copy=False).tobytes()
        step = max(_CHUNK_BYTES // max(dtype.itemsize, 1) * dtype.itemsize, dtype.itemsize)
        for i, start in enumerate(range(0, max(len(buf), 1), step)):
            rows["name"].append(name)
            rows["chunk"].append(i)
            rows["dtype"].append(dtype.str)
            rows["data"].append(buf[start : start + step])
    table = pa.table(
        {
            "name": pa.array(rows["name"], pa.string()),
            "chunk": pa.array(rows["chunk"], pa.int32()),
            "dtype": pa.array(rows["dtype"], pa.string()),
            "data": pa.array(rows["data"], pa.binary()),
        }
    )
    spark.createDataFrame(table).coalesce(1).write.parquet(path)


def _load_arrays(spark: SparkSession, path: str) -> dict[str, np.ndarray]:
    """Inverse of :func:`_save_arrays`."""
    table = spark.read.parquet(path).toArrow()
    names = table.column("name").to_pylist()
    chunks = table.column("chunk").to_pylist()
    dtypes = table.column("dtype").to_pylist()
    data = table.column("data").to_pylist()
    order = sorted(range(len(names)), key=lambda i: (names[i], chunks[i]))  # chunks, not rows
    parts: dict[str, list[bytes]] = {}
    kinds: dict[str, str] = {}
    for i in order:
        parts.setdefault(names[i], []).append(data[i])
        kinds[names[i]] = dtypes[i]
    return {
        n: np.frombuffer(b"".join(p), dtype=np.dtype(kinds[n])).copy() for n, p in parts.items()
    }


class ArraysWriter(MLWriter):
    """Saves Params metadata (pyspark's DefaultParams layout) plus the instance's arrays.

    The instance provides ``_save_data() -> (extra_metadata: dict, arrays: dict)``; arrays
    go to ``path/data`` as parquet, written through Spark so any Hadoop filesystem works.
    """

    def __init__(self, instance: Params):
        super().__init__()
        self.instance = instance

    def saveImpl(self, path: str) -> None:
        extra, arrays = self.instance._save_data()
        params = {p.name: _encode_param(v) for p, v in self.instance._paramMap.items()}
        extra = dict(extra, hasData=bool(arrays))
        DefaultParamsWriter.saveMetadata(
            self.instance, path, self.sparkSession, extraMetadata=extra, paramMap=params
        )
        if arrays:
            _save_arrays(self.sparkSession, os.path.join(path, "data"), arrays)


class ArraysReader(MLReader[RL]):
    """Loads what :class:`ArraysWriter` saved, checking the class name."""

    def __init__(self, cls: type):
        super().__init__()
        self.cls = cls

    def load(self, path: str) -> RL:
        metadata = DefaultParamsReader.loadMetadata(path, self.sparkSession)
        expected = f"{self.cls.__module__}.{self.cls.__name__}"
        if metadata["class"] != expected:
            raise ValueError(
                f"Error loading metadata at {path!r}: expected class {expected} but found "
                f"{metadata['class']}"
            )
        arrays = {}
        if metadata.get("hasData"):
            arrays = _load_arrays(self.sparkSession, os.path.join(path, "data"))
        instance = self.cls._from_saved(metadata, arrays)
        instance._resetUid(metadata["uid"])
        for name, value in metadata.get("defaultParamMap", {}).items():
            if instance.hasParam(name):
                instance._setDefault(**{name: _decode_param(value)})
        for name, value in metadata["paramMap"].items():
            if not instance.hasParam(name):
                raise ValueError(f"Error loading {path!r}: unknown Param {name!r} for {expected}")
            instance.set(instance.getParam(name), _decode_param(value))
        return instance


class ArraysWritable(MLWritable):
    """``write()`` / ``save()`` through :class:`ArraysWriter`; override ``_save_data``."""

    def write(self) -> MLWriter:
        """An MLWriter for this instance (``.overwrite().save(path)`` works)."""
        return ArraysWriter(self)

    def _save_data(self) -> tuple[dict, dict[str, np.ndarray]]:
        return {}, {}


class ArraysReadable(MLReadable[RL], Generic[RL]):
    """``read()`` / ``load()`` through :class:`ArraysReader`; override ``_from_saved``."""

    @classmethod
    def read(cls) -> ArraysReader[RL]:
        """An MLReader for this class."""
        return ArraysReader(cls)

    @classmethod
    def _from_saved(cls, metadata: dict, arrays: dict[str, np.ndarray]) -> RL:
        return cls()
