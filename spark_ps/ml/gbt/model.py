"""GBTClassificationModel / GBTRegressionModel: MLlib's GBT models over ``TreeArrays``.

A model is a list of :class:`~spark_ps.ml.tree.tree.TreeArrays` plus ``treeWeights``; the margin
of a row is ``sum_t treeWeights[t] * tree_t(x)``, summed tree by tree in order as MLlib does.
Scoring runs in one ``mapInArrow`` pass (:mod:`spark_ps.ml.base`): each batch becomes a dense
matrix of only the features the trees split on, and every tree is walked level by level over
all rows at once. Everything MLlib prints or reports (``toDebugString``, ``featureImportances``,
``predictLeaf``/``leafCol``, ``evaluateEachIteration``) follows MLlib's definitions.
"""

from __future__ import annotations

import dataclasses
import functools
import secrets
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
from pyspark.ml.functions import array_to_vector, vector_to_array
from pyspark.ml.linalg import DenseVector, SparseVector, Vector
from pyspark.ml.regression import DecisionTreeRegressionModel as MLlibDecisionTreeRegressionModel
from pyspark.ml.util import MLWriter
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from spark_ps.data import CSRBatch, arrow_to_csr
from spark_ps.ml.base import (
    ArraysReadable,
    ArraysWritable,
    ArrowRegressionScoring,
    ArrowScoring,
    features_kind,
    vector_to_csr,
)
from spark_ps.ml.gbt.params import GBTClassifierParams, GBTRegressorParams
from spark_ps.ml.tree.loss import get_loss, margin_to_probability, margin_to_raw_prediction
from spark_ps.ml.tree.tree import TreeArrays, ensemble_debug_string

__all__ = ["DecisionTreeRegressionModel", "GBTClassificationModel", "GBTRegressionModel"]

_TREE_FIELDS = ("feature", "threshold", "left", "right", "value", "impurity", "gain", "count")


def _random_uid(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(6)}"


def feature_importances(
    trees: Sequence[TreeArrays], num_features: int, per_tree_normalization: bool
) -> SparseVector:
    """MLlib's ``TreeEnsembleModel.featureImportances``.

    Every split adds ``gain * count`` (weighted count) to its feature. A tree's sums are
    normalised to 1 when ``per_tree_normalization`` (a single tree: yes; a GBT ensemble: no, as
    MLlib calls it), summed over trees, then normalised to 1. Features that were split on keep
    an entry even when it is 0, as MLlib's map does. ``num_features=-1`` sizes the vector by the
    largest feature split on.
    """
    total: dict[int, float] = {}
    for tree in trees:
        inner = tree.feature >= 0
        feats = tree.feature[inner].astype(np.int64)
        if feats.size == 0:
            continue
        used, pos = np.unique(feats, return_inverse=True)
        sums = np.bincount(pos, weights=tree.gain[inner] * tree.count[inner], minlength=used.size)
        if per_tree_normalization:
            norm = float(sums.sum())
            if norm == 0.0:
                continue
            sums = sums / norm
        for f, s in zip(used.tolist(), sums.tolist(), strict=True):  # loop over split features
            total[f] = total.get(f, 0.0) + s
    grand = sum(total.values())
    if grand != 0.0:
        total = {f: v / grand for f, v in total.items()}
    if num_features == -1:
        num_features = max(int(t.feature.max()) for t in trees) + 1 if trees else 0
    keys = sorted(total)
    return SparseVector(num_features, keys, [total[k] for k in keys])


class DecisionTreeRegressionModel(MLlibDecisionTreeRegressionModel):
    """One tree of a GBT ensemble: an instance of pyspark's ``DecisionTreeRegressionModel``.

    It subclasses pyspark's class so ``isinstance`` checks and helpers written for MLlib's
    ensemble trees keep working, but holds no JVM object: ``numNodes``, ``depth``,
    ``numFeatures``, ``toDebugString``, ``featureImportances``, ``predict``, ``predictLeaf``
    and ``transform`` are answered from ``tree`` (the underlying TreeArrays) in Python, with
    MLlib's definitions. ``toMLlib()`` builds the genuine JVM-backed model (same uid), which is
    also what ``write``/``save`` store, so ``pyspark.ml.regression.DecisionTreeRegressionModel
    .load`` reads a saved tree back.
    """

    def __init__(self, tree: TreeArrays, numFeatures: int, uid: str | None = None) -> None:
        super().__init__()
        self.tree = tree
        self._num_features = int(numFeatures)
        self._resetUid(uid or _random_uid("dtr"))

    @property
    def numFeatures(self) -> int:
        """Number of features the tree was trained on."""
        return self._num_features

    @property
    def numNodes(self) -> int:
        """Number of nodes, leaves included."""
        return self.tree.num_nodes

    @property
    def depth(self) -> int:
        """Depth of the tree (0 means a single leaf)."""
        return self.tree.depth

    @property
    def toDebugString(self) -> str:
        """Full description of the tree, as MLlib prints it."""
        return f"{self}\n{self.tree.to_debug_string(2)}"

    @property
    def featureImportances(self) -> SparseVector:
        """Importance of each feature in this tree alone (normalised to sum to 1)."""
        return feature_importances([self.tree], self._num_features, per_tree_normalization=True)

    def _node(self, value: Vector) -> int:
        state = _EnsembleState.build([self.tree], np.ones(1))
        return int(state.leaf_nodes(vector_to_csr(value, self._num_features))[0, 0])

    def predict(self, value: Vector) -> float:
        """Prediction of this tree for one feature vector."""
        return float(self.tree.value[self._node(value)])

    def predictLeaf(self, value: Vector) -> float:
        """Index of the leaf ``value`` falls into, leaves numbered in pre-order from 0."""
        return float(self.tree.leaf_index()[self._node(value)])

    def _transform(self, dataset: DataFrame) -> DataFrame:
        """prediction (and leafCol, varianceCol when set) in one Arrow scoring pass."""
        variance_col = self.getOrDefault("varianceCol") if self.isDefined("varianceCol") else ""
        leaf_col = self.getLeafCol()
        for col in (variance_col, leaf_col):
            if col and col in dataset.columns:
                raise ValueError(f"Output column {col} already exists.")
        hidden = f"__spark_ps_leaves_{self.uid}" if variance_col or leaf_col else ""
        one = GBTRegressionModel([self.tree], [1.0], self._num_features, self.uid)
        one._set(
            featuresCol=self.getFeaturesCol(), predictionCol=self.getPredictionCol(), leafCol=hidden
        )
        out = one._transform(dataset)
        if not hidden:
            return out
        # One tree's leaf is a double (MLlib), not the ensemble's vector of leaves.
        leaf = vector_to_array(F.col(f"`{hidden}`"))[0]
        extra = []
        if variance_col:
            # MLlib's variance of a regression tree's prediction is the impurity (label
            # variance) of the leaf the row falls into; leaves are looked up by their
            # pre-order index with a Spark expression, so no Python runs per row.
            leaves = np.flatnonzero(self.tree.feature < 0)
            by_leaf = np.empty(leaves.size)
            by_leaf[self.tree.leaf_index()[leaves].astype(np.int64)] = self.tree.impurity[leaves]
            table = F.array(*[F.lit(float(v)) for v in by_leaf])
            extra.append(F.element_at(table, leaf.cast("int") + 1).alias(variance_col))
        if leaf_col:
            meta = {"ml_attr": {"type": "nominal", "num_vals": self.tree.num_leaves}}
            extra.append(leaf.alias(leaf_col, metadata=meta))
        return out.select(*[F.col(f"`{c}`") for c in out.columns if c != hidden], *extra)

    def toMLlib(self) -> MLlibDecisionTreeRegressionModel:
        """This tree as a genuine MLlib ``DecisionTreeRegressionModel`` (same uid and Params)."""
        from pyspark.sql import SparkSession

        from spark_ps.ml.export import tree_to_mllib

        params = {p.name: self.getOrDefault(p) for p in self.params if self.isDefined(p)}
        return tree_to_mllib(
            SparkSession.active(), self.uid, self.tree, self._num_features, params=params
        )

    def write(self) -> MLWriter:
        """Writes the genuine MLlib tree (see ``toMLlib``), readable by pyspark's ``load``."""
        return self.toMLlib().write()

    def __repr__(self) -> str:
        return (
            f"DecisionTreeRegressionModel: uid={self.uid}, depth={self.depth}, "
            f"numNodes={self.numNodes}, numFeatures={self.numFeatures}"
        )


# --------------------------------------------------------------------------- scoring state


@dataclass(frozen=True)
class _EnsembleState:
    """What executors need to score: trees re-indexed onto the features they use.

    ``used`` holds the sorted global ids of every feature split on; tree ``t`` in ``trees``
    splits on column ``j`` of the compact matrix, i.e. on global feature ``used[j]``, so a batch
    of width ``numFeatures`` (possibly millions) becomes an ``(n, len(used))`` dense matrix.
    """

    trees: tuple[TreeArrays, ...]
    weights: np.ndarray
    used: np.ndarray

    @staticmethod
    def build(trees: Sequence[TreeArrays], weights: np.ndarray) -> _EnsembleState:
        feats = [t.feature[t.feature >= 0] for t in trees]
        used = np.unique(np.concatenate(feats)).astype(np.int64) if feats else np.zeros(0, int)
        local = []
        for t in trees:
            inner = t.feature >= 0
            feat = t.feature.copy()
            feat[inner] = np.searchsorted(used, t.feature[inner])
            local.append(dataclasses.replace(t, feature=feat))
        return _EnsembleState(tuple(local), np.asarray(weights, dtype=np.float64), used)

    def compact(self, csr: CSRBatch) -> np.ndarray:
        """(n_rows, len(used)) dense matrix of the used features; absent entries are 0."""
        X = np.zeros((csr.n_rows, max(self.used.size, 1)), dtype=np.float64)
        if self.used.size and csr.nnz:
            pos = np.minimum(np.searchsorted(self.used, csr.indices), self.used.size - 1)
            hit = self.used[pos] == csr.indices
            np.add.at(X, (csr.row_ids()[hit], pos[hit]), csr.values[hit])
        return X

    def leaf_nodes(self, csr: CSRBatch) -> np.ndarray:
        """int32 (n_rows, numTrees): the node id of the leaf each row reaches in each tree."""
        X = self.compact(csr)
        out = np.empty((csr.n_rows, len(self.trees)), dtype=np.int32)
        for t, tree in enumerate(self.trees):
            out[:, t] = tree.predict_leaf(X)
        return out

    def tree_outputs(self, csr: CSRBatch) -> np.ndarray:
        """float64 (n_rows, numTrees): ``treeWeights[t] * tree_t(x)``."""
        nodes = self.leaf_nodes(csr)
        out = np.empty(nodes.shape, dtype=np.float64)
        for t, tree in enumerate(self.trees):
            out[:, t] = tree.value[nodes[:, t]] * self.weights[t]
        return out

    def margin(self, csr: CSRBatch) -> np.ndarray:
        """Sum of weighted tree predictions, accumulated tree by tree (MLlib's order)."""
        outputs = self.tree_outputs(csr)
        m = np.zeros(csr.n_rows, dtype=np.float64)
        for t in range(outputs.shape[1]):
            m = m + outputs[:, t]
        return m


def _leaf_batches(spec: tuple, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """mapInArrow body: append MLlib's leaf indices (list<double>, one per tree)."""
    state, leaf_index, features_col, num_features, leaf_col = spec
    row_offset = 0
    for batch in batches:
        csr = arrow_to_csr(batch, features_col, num_features=num_features, row_offset=row_offset)
        row_offset += batch.num_rows
        nodes = state.leaf_nodes(csr)
        leaves = np.empty(nodes.shape, dtype=np.float64)
        for t, index in enumerate(leaf_index):
            leaves[:, t] = index[nodes[:, t]]
        n, k = leaves.shape
        offsets = pa.array(np.arange(0, n * k + 1, k, dtype=np.int32))
        col = pa.ListArray.from_arrays(offsets, pa.array(leaves.ravel()))
        yield pa.RecordBatch.from_arrays(
            [*batch.columns, col], names=[*batch.schema.names, leaf_col]
        )


def _error_batches(spec: tuple, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """mapInArrow body: per batch, weighted loss sums after each iteration and the weight sum."""
    state, loss_type, features_col, label_col, weight_col, num_features = spec
    loss = get_loss(loss_type)
    row_offset = 0
    for batch in batches:
        csr = arrow_to_csr(
            batch, features_col, label_col=label_col, weight_col=weight_col,
            num_features=num_features, row_offset=row_offset,
        )  # fmt: skip
        row_offset += batch.num_rows
        labels = csr.labels
        if loss.is_classification:
            labels = labels * 2.0 - 1.0
        weights = csr.weights if csr.weights is not None else np.ones(csr.n_rows)
        partial_sums = np.cumsum(state.tree_outputs(csr), axis=1)  # MLlib's scanLeft
        err = loss.error(partial_sums, labels[:, None]) * weights[:, None]
        yield pa.RecordBatch.from_arrays(
            [pa.array([err.sum(axis=0).tolist()], pa.list_(pa.float64())),
             pa.array([float(weights.sum())], pa.float64())],
            names=["err", "weight"],
        )  # fmt: skip


# --------------------------------------------------------------------------- shared ensemble


class _GBTModelMixin(ArraysWritable):
    """What both GBT models share: trees, MLlib's views of them, leafCol, save/load."""

    _toString_format: str

    def _init_ensemble(
        self,
        trees: Sequence[TreeArrays] | None,
        treeWeights: Sequence[float] | None,
        numFeatures: int,
        uid: str | None,
        treeUids: Sequence[str] | None,
        lossHistory: Sequence[float] | None,
    ) -> None:
        self._trees = list(trees or [])
        weights = [1.0] * len(self._trees) if treeWeights is None else list(treeWeights)
        if len(weights) != len(self._trees):
            raise ValueError(
                f"{type(self).__name__} given trees, treeWeights of non-matching lengths "
                f"({len(self._trees)}, {len(weights)}, respectively)."
            )
        self._tree_weights = np.asarray(weights, dtype=np.float64)
        self._num_features = int(numFeatures)
        self._tree_uids = list(treeUids) if treeUids else [_random_uid("dtr") for _ in weights]
        self._loss_history = [float(x) for x in (lossHistory or [])]
        self._state: _EnsembleState | None = None
        if uid is not None:
            self._resetUid(uid)

    # ----- MLlib's TreeEnsembleModel API

    @property
    def numFeatures(self) -> int:
        """Number of features the model was trained on."""
        return self._num_features

    @property
    def trees(self) -> list[DecisionTreeRegressionModel]:
        """Trees in this ensemble (their parents are None, as in MLlib). Each carries the
        ensemble's Params that a tree has too (featuresCol, predictionCol, leafCol, maxDepth,
        seed, ...), as MLlib's trees do, so ``tree.transform`` writes the same columns."""
        trees = []
        for t, uid in zip(self._trees, self._tree_uids, strict=True):
            tree = DecisionTreeRegressionModel(t, self._num_features, uid)
            shared = {
                p.name: self.getOrDefault(p)
                for p in self.params
                if self.isDefined(p) and tree.hasParam(p.name)
            }
            trees.append(tree._set(**shared))
        return trees

    def toMLlib(self):
        """This model as a genuine MLlib ``GBTClassificationModel`` / ``GBTRegressionModel``,
        built on the JVM by the spark-ps bridge (same trees, weights, uid and Params)."""
        from pyspark.ml.classification import GBTClassifier as MLlibGBTC
        from pyspark.ml.regression import GBTRegressor as MLlibGBTR
        from pyspark.sql import SparkSession

        from spark_ps.ml.export import gbt_to_mllib

        classifier = isinstance(self, GBTClassificationModel)
        ref = MLlibGBTC() if classifier else MLlibGBTR()
        params = {
            p.name: self.getOrDefault(p)
            for p in self.params
            if self.isDefined(p) and ref.hasParam(p.name)
        }
        return gbt_to_mllib(
            SparkSession.active(),
            self.uid,
            self._trees,
            np.asarray(self.treeWeights),
            self.numFeatures,
            classifier,
            params=params,
        )

    @property
    def treeArrays(self) -> list[TreeArrays]:
        """The trees as TreeArrays (spark-ps addition)."""
        return list(self._trees)

    @property
    def treeWeights(self) -> list[float]:
        """Weight of each tree."""
        return self._tree_weights.tolist()

    @property
    def getNumTrees(self) -> int:
        """Number of trees in the ensemble."""
        return len(self._trees)

    @property
    def totalNumNodes(self) -> int:
        """Total number of nodes, summed over all trees."""
        return int(sum(t.num_nodes for t in self._trees))

    @property
    def lossHistory(self) -> list[float]:
        """Training loss after each iteration, as the trainer reported it (spark-ps addition)."""
        return list(self._loss_history)

    @property
    def featureImportances(self) -> SparseVector:
        """Importance of each feature, MLlib's way (gain x weighted count, normalised to 1).

        As MLlib's GBT models, trees are *not* normalised individually before summing.
        """
        return feature_importances(self._trees, self._num_features, per_tree_normalization=False)

    def __repr__(self) -> str:
        return self._toString_format.format(uid=self.uid, n=self.getNumTrees, d=self._num_features)

    @property
    def toDebugString(self) -> str:
        """Full description of the model, as MLlib prints it."""
        return ensemble_debug_string(self._trees, self.treeWeights, repr(self))

    def predictLeaf(self, value: Vector) -> DenseVector:
        """Leaf index (pre-order, from 0) of ``value`` in each tree."""
        nodes = self._scoring_state().leaf_nodes(vector_to_csr(value, self._num_features))[0]
        return DenseVector(
            [float(t.leaf_index()[n]) for t, n in zip(self._trees, nodes, strict=True)]
        )

    # ----- scoring

    def _scoring_state(self) -> _EnsembleState:
        if self._state is None:
            if not self._trees:
                raise ValueError(f"{type(self).__name__} {self.uid} has no trees")
            self._state = _EnsembleState.build(self._trees, self._tree_weights)
        return self._state

    def _with_leaf_column(self, dataset: DataFrame) -> DataFrame:
        """Append leafCol (a vector of per-tree leaf indices, MLlib's metadata) when it is set.

        A second Arrow map over the same partitions (Spark pipelines both in one stage); only
        paid when leafCol is non-empty, as it is off by default.
        """
        leaf_col = self.getLeafCol()
        if not leaf_col:
            return dataset
        if leaf_col in dataset.columns:
            raise ValueError(f"Output column {leaf_col} already exists.")
        features_kind(dataset.schema, self.getFeaturesCol())
        index = [t.leaf_index() for t in self._trees]
        spec = (self._scoring_state(), index, self.getFeaturesCol(), self._num_features, leaf_col)
        arr = T.StructField(leaf_col, T.ArrayType(T.DoubleType(), containsNull=False))
        out = dataset.mapInArrow(
            functools.partial(_leaf_batches, spec), T.StructType([*dataset.schema.fields, arr])
        )
        attrs = [{"num_vals": t.num_leaves, "idx": i} for i, t in enumerate(self._trees)]
        meta = {"ml_attr": {"num_attrs": len(attrs), "attrs": {"nominal": attrs}}}
        vec = array_to_vector(F.col(f"`{leaf_col}`"))
        return out.withColumn(leaf_col, vec.alias(leaf_col, metadata=meta))

    def _evaluate(self, dataset: DataFrame, loss_type: str) -> list[float]:
        """Mean (weighted) loss after each iteration, MLlib's ``evaluateEachIteration``."""
        if not isinstance(dataset, DataFrame):
            raise TypeError(f"dataset must be a DataFrame but got {type(dataset)}.")
        get_loss(loss_type)
        feats, label = self.getFeaturesCol(), self.getLabelCol()
        weight = self.getWeightCol() if self.isDefined(self.weightCol) else ""
        features_kind(dataset.schema, feats)
        for name, param in ((label, "labelCol"), (weight, "weightCol")):
            if name and name not in dataset.columns:
                raise ValueError(f"Column {name!r} ({param}) does not exist in {dataset.columns}")
        cols = [F.col(f"`{feats}`"), F.col(f"`{label}`").cast("double").alias(label)]
        if weight:
            cols.append(F.col(f"`{weight}`").cast("double").alias(weight))
        spec = (self._scoring_state(), loss_type, feats, label, weight or None, self.numFeatures)
        schema = "err array<double>, weight double"
        rows = (
            dataset.select(*cols)
            .mapInArrow(functools.partial(_error_batches, spec), schema)
            .collect()
        )
        err = np.zeros(self.getNumTrees)
        weight_sum = 0.0
        for row in rows:  # one row per Arrow batch
            err += np.asarray(row["err"], dtype=np.float64)
            weight_sum += row["weight"]
        return (err / weight_sum).tolist()

    # ----- save / load (Params as pyspark metadata, trees as parquet arrays)

    def _save_data(self) -> tuple[dict, dict[str, np.ndarray]]:
        sizes = [t.num_nodes for t in self._trees]
        arrays = {
            name: np.concatenate([getattr(t, name) for t in self._trees]) for name in _TREE_FIELDS
        }
        if self._trees and all(t.raw_count is not None for t in self._trees):
            arrays["raw_count"] = np.concatenate([t.raw_count for t in self._trees])
        arrays["node_offsets"] = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        arrays["treeWeights"] = self._tree_weights
        extra = {
            "numFeatures": self._num_features,
            "numTrees": len(self._trees),
            "treeUids": self._tree_uids,
            "lossHistory": self._loss_history,
        }
        return extra, arrays

    @classmethod
    def _from_saved(cls, metadata: dict, arrays: dict[str, np.ndarray]) -> Any:
        offsets = arrays["node_offsets"]
        trees = []
        for i in range(int(metadata["numTrees"])):
            part = slice(int(offsets[i]), int(offsets[i + 1]))
            fields = {k: arrays[k][part] for k in _TREE_FIELDS}
            raw = arrays["raw_count"][part] if "raw_count" in arrays else None
            trees.append(TreeArrays(**fields, raw_count=raw))
        return cls(
            trees=trees,
            treeWeights=arrays["treeWeights"].tolist(),
            numFeatures=int(metadata["numFeatures"]),
            treeUids=metadata.get("treeUids"),
            lossHistory=metadata.get("lossHistory"),
        )


class GBTClassificationModel(
    _GBTModelMixin,
    ArrowScoring,
    GBTClassifierParams,
    ArraysReadable["GBTClassificationModel"],
):
    """Model fitted by :class:`~spark_ps.ml.gbt.estimator.GBTClassifier` (binary, logistic loss).

    ``rawPrediction`` is ``[-F, F]`` for the margin ``F``; ``probability`` is MLlib's LogLoss
    ``p0 = 1 / (1 + exp(2F))``, ``p1 = 1 - p0``; ``prediction`` is ``F > 0`` unless
    ``thresholds`` are set.
    """

    _toString_format = (
        "GBTClassificationModel: uid = {uid}, numTrees={n}, numClasses=2, numFeatures={d}"
    )

    def __init__(
        self,
        trees: Sequence[TreeArrays] | None = None,
        treeWeights: Sequence[float] | None = None,
        numFeatures: int = -1,
        uid: str | None = None,
        treeUids: Sequence[str] | None = None,
        lossHistory: Sequence[float] | None = None,
    ) -> None:
        super().__init__()
        self._init_ensemble(trees, treeWeights, numFeatures, uid, treeUids, lossHistory)

    @property
    def numClasses(self) -> int:
        """Number of classes (always 2: MLlib's GBT is binary)."""
        return 2

    @staticmethod
    def _margins(state: _EnsembleState, csr: CSRBatch) -> np.ndarray:
        return margin_to_raw_prediction(state.margin(csr))

    @staticmethod
    def _raw_to_probability(state: _EnsembleState, raw: np.ndarray) -> np.ndarray:
        return margin_to_probability(raw[:, 1])

    def _transform(self, dataset: DataFrame) -> DataFrame:
        return self._with_leaf_column(super()._transform(dataset))

    def evaluateEachIteration(self, dataset: DataFrame) -> list[float]:
        """Log loss (MLlib's: ``2 log(1 + exp(-2 y F))``) after each iteration on ``dataset``."""
        return self._evaluate(dataset, "logistic")


class GBTRegressionModel(
    _GBTModelMixin,
    ArrowRegressionScoring,
    GBTRegressorParams,
    ArraysReadable["GBTRegressionModel"],
):
    """Model fitted by :class:`~spark_ps.ml.gbt.estimator.GBTRegressor`; predicts the margin."""

    _toString_format = "GBTRegressionModel: uid={uid}, numTrees={n}, numFeatures={d}"

    def __init__(
        self,
        trees: Sequence[TreeArrays] | None = None,
        treeWeights: Sequence[float] | None = None,
        numFeatures: int = -1,
        uid: str | None = None,
        treeUids: Sequence[str] | None = None,
        lossHistory: Sequence[float] | None = None,
    ) -> None:
        super().__init__()
        self._init_ensemble(trees, treeWeights, numFeatures, uid, treeUids, lossHistory)

    @staticmethod
    def _predict_values(state: _EnsembleState, csr: CSRBatch) -> np.ndarray:
        return state.margin(csr)

    def _transform(self, dataset: DataFrame) -> DataFrame:
        return self._with_leaf_column(super()._transform(dataset))

    def evaluateEachIteration(self, dataset: DataFrame, loss: str) -> list[float]:
        """Loss ("squared" or "absolute") after each iteration on ``dataset``, as MLlib."""
        if str(loss).lower() not in ("squared", "absolute"):
            raise ValueError(
                f"evaluateEachIteration loss given invalid value {loss!r}: supported: "
                "squared, absolute."
            )
        return self._evaluate(dataset, str(loss).lower())
