"""Genuine MLlib models from spark-ps parameters, built on the JVM by the bridge jar.

The bridge (``jvm_bridge/``, built by ``scripts/build_jar.sh`` into
``spark_ps/jars/spark-ps-bridge.jar``) calls MLlib's own model constructors, so the result is
a real ``pyspark.ml`` model: it transforms, ``save()``s and loads with stock MLlib in any
Spark application, Scala included, without spark-ps.

The jar must be on the driver's classpath. Start the session with it::

    SparkSession.builder.config("spark.jars", str(spark_ps.ml.export.bridge_jar()))

In a session started without it, :func:`spark_ps._jvm.ensure_bridge` adds the jar to the driver's
class loader when Spark's launcher made that loader extensible (pyspark's default), and
otherwise raises an error that says how to add it. Arrays cross to the JVM as one raw
little-endian buffer each (``bytes`` through py4j, or a temporary file when large), never
element by element.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from spark_ps._jvm import bridge_jar, call_bridge, ensure_bridge, wrap_java_model

if TYPE_CHECKING:
    from pyspark.ml.classification import (
        GBTClassificationModel,
        LinearSVCModel,
        LogisticRegressionModel,
    )
    from pyspark.ml.regression import (
        DecisionTreeRegressionModel,
        GBTRegressionModel,
        LinearRegressionModel,
    )
    from pyspark.sql import SparkSession

__all__ = [
    "bridge_jar",
    "ensure_bridge",
    "lr_to_mllib",
    "gbt_to_mllib",
    "linear_regression_to_mllib",
    "linear_svc_to_mllib",
    "tree_to_mllib",
    "TREE_FIELDS",
]

#: The arrays of the shared tree contract, with the dtype each crosses to the JVM in.
TREE_FIELDS: tuple[tuple[str, str], ...] = (
    ("feature", "<i4"),
    ("threshold", "<f8"),
    ("left", "<i4"),
    ("right", "<i4"),
    ("value", "<f8"),
    ("impurity", "<f8"),
    ("gain", "<f8"),
    ("count", "<f8"),
)


def _le(a: np.ndarray, dtype: str, what: str) -> bytes:
    arr = np.asarray(a)
    if arr.dtype.kind not in "iufb":
        raise TypeError(f"{what}: expected a numeric array, got dtype {arr.dtype}")
    return np.ascontiguousarray(arr, dtype=dtype).tobytes()


def _finite(a: np.ndarray, what: str) -> np.ndarray:
    a = np.asarray(a, dtype=np.float64)
    bad = np.flatnonzero(~np.isfinite(a))
    if bad.size:
        raise ValueError(f"{what}: non-finite value {a.flat[bad[0]]} at position {bad[0]}")
    return a


def lr_to_mllib(
    spark: SparkSession,
    uid: str,
    coefficients: np.ndarray | tuple[np.ndarray, np.ndarray, int],
    intercept: float | np.ndarray,
    *,
    params: Mapping[str, Any] | None = None,
) -> LogisticRegressionModel:
    """A genuine ``pyspark.ml.classification.LogisticRegressionModel``.

    Parameters
    ----------
    coefficients
        Binomial: float64 ``[num_features]``, or a sparse ``(indices, values, size)`` triple
        (indices int64, strictly increasing) kept sparse on the JVM. Multinomial: float64
        ``[num_classes, num_features]`` (``intercept`` then has ``num_classes`` entries).
    intercept
        The intercept (binomial) or intercept vector (multinomial).
    params
        Model Params to set (``threshold``, ``featuresCol``, ...), by name.
    """
    from pyspark.ml.classification import LogisticRegressionModel

    export = ensure_bridge(spark).MLlibExport
    if isinstance(coefficients, tuple):
        if len(coefficients) != 3:
            raise ValueError(
                "sparse coefficients must be (indices, values, size), "
                f"got {len(coefficients)} items"
            )
        indices, values, size = coefficients
        if not 0 < int(size) < 2**31:
            raise ValueError(f"sparse coefficients: size {size} is not in [1, 2**31)")
        values = _finite(values, "LR coefficient values")
        jm = call_bridge(
            export.logisticRegressionSparse,
            uid,
            int(size),
            _le(indices, "<i8", "LR coefficient indices"),
            _le(values, "<f8", "LR coefficient values"),
            float(_finite(np.asarray(intercept).reshape(-1), "LR intercept")[0]),
        )
        return wrap_java_model(LogisticRegressionModel, jm, params)
    w = _finite(coefficients, "LR coefficients")
    if w.ndim == 1:
        b = _finite(np.asarray(intercept).reshape(-1), "LR intercept")
        if b.size != 1:
            raise ValueError(f"binomial LR takes one intercept, got {b.size}")
        jm = call_bridge(
            export.logisticRegression, uid, _le(w, "<f8", "LR coefficients"), float(b[0])
        )
    elif w.ndim == 2:
        b = _finite(intercept, "LR intercepts").reshape(-1)
        if b.size != w.shape[0]:
            raise ValueError(
                f"multinomial LR: {w.shape[0]} coefficient rows but {b.size} intercepts"
            )
        jm = call_bridge(
            export.multinomialLogisticRegression,
            uid,
            int(w.shape[0]),
            _le(w, "<f8", "LR coefficients"),
            _le(b, "<f8", "intercepts"),
        )
    else:
        raise ValueError(f"LR coefficients must be 1-D or 2-D, got shape {w.shape}")
    return wrap_java_model(LogisticRegressionModel, jm, params)


def _tree_field(tree: Any, name: str, index: int) -> np.ndarray:
    value = tree.get(name) if isinstance(tree, Mapping) else getattr(tree, name, None)
    if value is None:
        raise ValueError(f"tree {index} has no {name!r} array (see the tree contract)")
    a = np.asarray(value)
    if a.ndim != 1:
        raise ValueError(f"tree {index}: {name!r} must be 1-D, got shape {a.shape}")
    return a


def _pack_trees(trees: Sequence[Any]) -> tuple[bytes, list[bytes]]:
    """Concatenate every tree's contract arrays: (int32 sizes, one buffer per field)."""
    if len(trees) == 0:
        raise ValueError("gbt_to_mllib: no trees")
    columns: dict[str, list[np.ndarray]] = {name: [] for name, _ in TREE_FIELDS}
    sizes = np.zeros(len(trees), dtype="<i4")
    for t, tree in enumerate(trees):
        arrays = {name: _tree_field(tree, name, t) for name, _ in TREE_FIELDS}
        n = arrays["feature"].size
        for name, a in arrays.items():
            if a.size != n:
                raise ValueError(f"tree {t}: {name!r} has {a.size} nodes, 'feature' has {n}")
        for name in ("threshold", "value", "impurity", "gain", "count"):
            _finite(arrays[name], f"tree {t} {name!r}")
        sizes[t] = n
        for name, a in arrays.items():
            columns[name].append(a)
    buffers = [
        _le(np.concatenate(columns[name]), dtype, f"tree {name!r}") for name, dtype in TREE_FIELDS
    ]
    return sizes.tobytes(), buffers


def gbt_to_mllib(
    spark: SparkSession,
    uid: str,
    trees: Sequence[Any],
    tree_weights: np.ndarray,
    num_features: int,
    classifier: bool = True,
    *,
    params: Mapping[str, Any] | None = None,
) -> GBTClassificationModel | GBTRegressionModel:
    """A genuine MLlib ``GBTClassificationModel`` (binary, logistic loss) or ``GBTRegressionModel``.

    Parameters
    ----------
    trees
        Objects (e.g. ``TreeArrays``) or mappings with the tree-contract arrays ``feature``,
        ``threshold``, ``left``, ``right``, ``value``, ``impurity``, ``gain``, ``count``
        (node 0 the root, children after parents, ``x <= threshold`` goes left).
    tree_weights
        float64 ``[len(trees)]``; the margin is ``sum_t w_t * tree_t(x)`` as in MLlib.
    num_features
        The feature-vector size the model accepts.
    params
        Model Params to set, by name.
    """
    from pyspark.ml.classification import GBTClassificationModel
    from pyspark.ml.regression import GBTRegressionModel

    weights = _finite(tree_weights, "treeWeights").reshape(-1)
    if weights.size != len(trees):
        raise ValueError(f"gbt_to_mllib: {len(trees)} trees but {weights.size} treeWeights")
    if not 0 < int(num_features) < 2**31:
        raise ValueError(f"gbt_to_mllib: num_features {num_features} is not in [1, 2**31)")
    sizes, buffers = _pack_trees(trees)
    export = ensure_bridge(spark).MLlibExport
    build = export.gbtClassifier if classifier else export.gbtRegressor
    jm = call_bridge(
        build, uid, int(num_features), sizes, *buffers, _le(weights, "<f8", "treeWeights")
    )
    py_cls = GBTClassificationModel if classifier else GBTRegressionModel
    return wrap_java_model(py_cls, jm, params)


def _linear_args(num_features: int, keys: np.ndarray | None, values: np.ndarray, what: str):
    if not 0 <= int(num_features) < 2**31:
        raise ValueError(f"{what}: numFeatures {num_features} is not in [0, 2**31)")
    v = _finite(values, f"{what} coefficients")
    idx = None if keys is None else _le(keys, "<i8", f"{what} coefficient indices")
    return int(num_features), idx, _le(v, "<f8", f"{what} coefficients")


def linear_regression_to_mllib(
    spark: SparkSession,
    uid: str,
    num_features: int,
    keys: np.ndarray | None,
    values: np.ndarray,
    intercept: float,
    scale: float = 1.0,
    *,
    params: Mapping[str, Any] | None = None,
) -> LinearRegressionModel:
    """A genuine ``pyspark.ml.regression.LinearRegressionModel``.

    ``keys`` None: ``values`` are dense (one per feature); else int64 strictly increasing
    feature ids of the non-zero ``values`` (kept sparse on the JVM). ``scale`` is huber's
    (1.0 for squared error).
    """
    from pyspark.ml.regression import LinearRegressionModel

    n, idx, vals = _linear_args(num_features, keys, values, "LinearRegression")
    b = float(_finite(np.array([intercept, scale]), "LinearRegression intercept/scale")[0])
    export = ensure_bridge(spark).MLlibExport
    jm = call_bridge(export.linearRegression, uid, n, idx, vals, b, float(scale))
    return wrap_java_model(LinearRegressionModel, jm, params)


def linear_svc_to_mllib(
    spark: SparkSession,
    uid: str,
    num_features: int,
    keys: np.ndarray | None,
    values: np.ndarray,
    intercept: float,
    *,
    params: Mapping[str, Any] | None = None,
) -> LinearSVCModel:
    """A genuine ``pyspark.ml.classification.LinearSVCModel`` (coefficients as in
    :func:`linear_regression_to_mllib`)."""
    from pyspark.ml.classification import LinearSVCModel

    n, idx, vals = _linear_args(num_features, keys, values, "LinearSVC")
    b = float(_finite(np.array([intercept]), "LinearSVC intercept")[0])
    export = ensure_bridge(spark).MLlibExport
    jm = call_bridge(export.linearSVC, uid, n, idx, vals, b)
    return wrap_java_model(LinearSVCModel, jm, params)


def tree_to_mllib(
    spark: SparkSession,
    uid: str,
    tree: Any,
    num_features: int,
    *,
    params: Mapping[str, Any] | None = None,
) -> DecisionTreeRegressionModel:
    """A genuine MLlib ``DecisionTreeRegressionModel`` with ``uid`` (one tree of an ensemble).

    ``tree`` holds the tree-contract arrays, as for :func:`gbt_to_mllib`.
    """
    from pyspark.ml.regression import DecisionTreeRegressionModel

    if not 0 < int(num_features) < 2**31:
        raise ValueError(f"tree_to_mllib: num_features {num_features} is not in [1, 2**31)")
    sizes, buffers = _pack_trees([tree])
    build = ensure_bridge(spark).MLlibExport.decisionTree
    jm = call_bridge(
        build, uid, int(num_features), sizes, *buffers, _le(np.ones(1), "<f8", "treeWeights")
    )
    return wrap_java_model(DecisionTreeRegressionModel, jm, params)
