"""Genuine MLlib models from spark-ps parameters, built on the JVM by the bridge jar.

The bridge (``jvm_bridge/``, built by ``scripts/build_jar.sh`` into
``spark_ps/jars/spark-ps-bridge.jar``) calls MLlib's own model constructors, so the result is
a real ``pyspark.ml`` model: it transforms, ``save()``s and loads with stock MLlib in any
Spark application, Scala included, without spark-ps.

The jar must be on the driver's classpath. Start the session with it::

    SparkSession.builder.config("spark.jars", str(spark_ps.ml.export.bridge_jar()))

In a session started without it, :func:`ensure_bridge` adds the jar to the driver's
class loader when Spark's launcher made that loader extensible (pyspark's default), and
otherwise raises an error that says how to add it. Arrays cross to the JVM as one raw
little-endian buffer each (``bytes`` through py4j, or a temporary file when large), never
element by element.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from pyspark.ml.classification import GBTClassificationModel, LogisticRegressionModel
    from pyspark.ml.regression import GBTRegressionModel
    from pyspark.sql import SparkSession

__all__ = ["bridge_jar", "ensure_bridge", "lr_to_mllib", "gbt_to_mllib", "TREE_FIELDS"]

_PACKAGE = "io.sparkps.bridge"
_JAR_NAME = "spark-ps-bridge.jar"

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


def bridge_jar() -> Path:
    """Path of the bridge jar shipped in the package (built by ``scripts/build_jar.sh``)."""
    return Path(__file__).resolve().parents[1] / "jars" / _JAR_NAME


def _jvm(spark: SparkSession):
    jvm = spark.sparkContext._jvm
    if jvm is None:
        raise RuntimeError("spark_ps export needs a classic (JVM-backed) SparkSession, not Connect")
    return jvm


def _loaded(jvm) -> bool:
    from py4j.java_gateway import JavaClass

    return isinstance(getattr(jvm, _PACKAGE).MLlibExport, JavaClass)


def _add_to_driver_loader(jvm, jar: Path) -> bool:
    """Add ``jar`` to the driver's context class loader if it takes URLs (spark-submit's
    MutableURLClassLoader and its child-first variant do)."""
    from py4j.protocol import Py4JError

    loader = jvm.java.lang.Thread.currentThread().getContextClassLoader()
    if loader is None:
        return False
    try:
        loader.addURL(jvm.java.io.File(str(jar)).toURI().toURL())
    except Py4JError:  # no public addURL on this loader
        return False
    return True


def ensure_bridge(spark: SparkSession) -> Any:
    """The bridge's JVM package (``io.sparkps.bridge``) in ``spark``'s driver.

    Raises
    ------
    RuntimeError
        If the classes cannot be loaded; the message says how to put the jar on the classpath.
    """
    jvm = _jvm(spark)
    if not _loaded(jvm):
        jar = bridge_jar()
        if not jar.is_file():
            raise RuntimeError(
                f"the spark-ps JVM bridge is not built: {jar} is missing. Run "
                "scripts/build_jar.sh (needs Gradle; it installs it with apt-get if missing)"
            )
        if not (_add_to_driver_loader(jvm, jar) and _loaded(jvm)):
            raise RuntimeError(
                f"class {_PACKAGE}.MLlibExport is not on the driver's classpath. Start the "
                f"session with .config('spark.jars', '{jar}') (or spark-submit --jars {jar}); "
                "a jar added after the session started does not reach the driver's py4j "
                "class loader"
            )
    return getattr(jvm, _PACKAGE)


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


#: Buffers above this size go to the JVM through a temporary file, not py4j (which moves
#: ``bytes`` at a few tens of MB/s); the driver JVM always shares the Python driver's host.
_FILE_THRESHOLD = 1 << 20


def _spill(args: tuple, tmp: Path) -> list:
    out = []
    for i, a in enumerate(args):
        if isinstance(a, bytes) and len(a) > _FILE_THRESHOLD:
            path = tmp / f"array{i}.bin"
            path.write_bytes(a)
            a = str(path)
        out.append(a)
    return out


def _call(fn: Callable, *args: Any) -> Any:
    """Call a bridge method; the JVM's IllegalArgumentException comes back as ValueError.

    Large ``bytes`` arguments travel as temporary files (see ``LittleEndian.raw`` on the JVM).
    pyspark turns an IllegalArgumentException into its own exception type; a plain py4j error
    is handled too, for gateways without pyspark's converter.
    """
    from py4j.protocol import Py4JJavaError
    from pyspark.errors import IllegalArgumentException

    with tempfile.TemporaryDirectory(prefix="spark-ps-export-") as tmp:
        try:
            return fn(*_spill(args, Path(tmp)))
        except IllegalArgumentException as e:
            raise ValueError(str(e).split("\n\nJVM stacktrace:")[0]) from None
        except Py4JJavaError as e:
            if e.java_exception.getClass().getName() == "java.lang.IllegalArgumentException":
                raise ValueError(str(e.java_exception.getMessage())) from None
            raise


def _wrap(py_cls, java_model, params: Mapping[str, Any] | None):
    model = py_cls(java_model)
    model._transfer_params_from_java()
    if params:
        model._set(**dict(params))
        model._transfer_params_to_java()
    return model


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
        jm = _call(
            export.logisticRegressionSparse,
            uid,
            int(size),
            _le(indices, "<i8", "LR coefficient indices"),
            _le(values, "<f8", "LR coefficient values"),
            float(_finite(np.asarray(intercept).reshape(-1), "LR intercept")[0]),
        )
        return _wrap(LogisticRegressionModel, jm, params)
    w = _finite(coefficients, "LR coefficients")
    if w.ndim == 1:
        b = _finite(np.asarray(intercept).reshape(-1), "LR intercept")
        if b.size != 1:
            raise ValueError(f"binomial LR takes one intercept, got {b.size}")
        jm = _call(export.logisticRegression, uid, _le(w, "<f8", "LR coefficients"), float(b[0]))
    elif w.ndim == 2:
        b = _finite(intercept, "LR intercepts").reshape(-1)
        if b.size != w.shape[0]:
            raise ValueError(
                f"multinomial LR: {w.shape[0]} coefficient rows but {b.size} intercepts"
            )
        jm = _call(
            export.multinomialLogisticRegression,
            uid,
            int(w.shape[0]),
            _le(w, "<f8", "LR coefficients"),
            _le(b, "<f8", "intercepts"),
        )
    else:
        raise ValueError(f"LR coefficients must be 1-D or 2-D, got shape {w.shape}")
    return _wrap(LogisticRegressionModel, jm, params)


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
    jm = _call(build, uid, int(num_features), sizes, *buffers, _le(weights, "<f8", "treeWeights"))
    py_cls = GBTClassificationModel if classifier else GBTRegressionModel
    return _wrap(py_cls, jm, params)


def add_executor_listener(spark: SparkSession, address: str, token: str) -> bool:
    """Register the bridge's ExecutorListener with a running SparkContext.

    It tells the PS coordinator when executors come and go (lost executors are dropped
    from clocks and barriers). Returns False when the bridge jar is not built.
    """
    if not bridge_jar().is_file():
        return False
    listener = ensure_bridge(spark).ExecutorListener(address, token)
    spark.sparkContext._jsc.sc().addSparkListener(listener)
    return True
