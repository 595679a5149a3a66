"""Every private py4j/JVM access of spark_ps, in one place.

A Spark version bump or a move to Spark Connect then touches this file only. Public pyspark
APIs (DataFrame, pyspark.ml wrappers) are used directly elsewhere; what lives here reaches
into JVM classes that pyspark does not expose.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from py4j.java_gateway import JavaObject
    from pyspark.sql import DataFrame, SparkSession

__all__ = [
    "binary_lr_summary",
    "multiclass_lr_summary",
    "linear_regression_summary",
    "linear_svc_summary",
    "bridge_jar",
    "ensure_bridge",
    "call_bridge",
    "wrap_java_model",
    "add_executor_listener",
    "lr_scorer",
    "lr_score",
    "packed_rows",
]

_CLASSIFICATION = "org.apache.spark.ml.classification"
_PACKAGE = "io.sparkps.bridge"
_JAR_NAME = "spark-ps-bridge.jar"


def _jvm_class(dataframe: DataFrame, name: str):
    """The JVM class ``name`` in the gateway of ``dataframe``'s session."""
    return getattr(getattr(_jvm(dataframe.sparkSession), _CLASSIFICATION), name)


def binary_lr_summary(
    predictions: DataFrame,
    probability_col: str,
    prediction_col: str,
    label_col: str,
    features_col: str,
    weight_col: str,
) -> JavaObject:
    """MLlib's own binary LR summary over ``predictions`` (JVM object, metrics computed lazily).

    Using MLlib's class makes every metric (BinaryClassificationMetrics with 100 bins,
    MulticlassMetrics) equal to MLlib's by construction and keeps all row work on the JVM.
    A ``weight_col`` absent from ``predictions`` means weight 1.0, as in MLlib.
    """
    impl = _jvm_class(predictions, "BinaryLogisticRegressionSummaryImpl")
    return impl(
        predictions._jdf, probability_col, prediction_col, label_col, features_col, weight_col
    )


def multiclass_lr_summary(
    predictions: DataFrame,
    probability_col: str,
    prediction_col: str,
    label_col: str,
    features_col: str,
    weight_col: str,
) -> JavaObject:
    """MLlib's multiclass LR summary over ``predictions``; see :func:`binary_lr_summary`."""
    impl = _jvm_class(predictions, "LogisticRegressionSummaryImpl")
    return impl(
        predictions._jdf, probability_col, prediction_col, label_col, features_col, weight_col
    )


def _java_doubles(spark: SparkSession, values) -> JavaObject:
    """A Java ``double[]`` of ``values`` (one buffer through the bridge, not element-wise)."""
    import numpy as np

    raw = np.ascontiguousarray(values, dtype="<f8").tobytes()
    return ensure_bridge(spark).MLlibExport.doubles(raw)


def linear_regression_summary(
    predictions: DataFrame,
    prediction_col: str,
    label_col: str,
    features_col: str,
    weight_col: str,
    num_features: int,
    fit_intercept: bool,
    estimates,
    objective_history=None,
    diag_inv_atwa=None,
) -> JavaObject:
    """MLlib's own ``LinearRegression(Training)Summary`` over ``predictions``.

    ``weight_col`` "" means weight 1.0; ``estimates`` are the coefficients (and the intercept
    last when fitted). ``diag_inv_atwa`` is MLlib's ``diagInvAtWA`` of a normal-equations
    fit (its summary derives the coefficients' standard errors, t- and p-values from it);
    None gives MLlib's ``[0.0]`` of its l-bfgs solver, where they raise as MLlib's do.
    """
    spark = predictions.sparkSession
    pkg = _jvm(spark).org.apache.spark.ml.regression
    head = (predictions._jdf, prediction_col, label_col, features_col, weight_col)
    diag = [0.0] if diag_inv_atwa is None else [float(v) for v in diag_inv_atwa]
    head += (int(num_features), bool(fit_intercept), _java_doubles(spark, diag))
    coefs = _java_doubles(spark, estimates)
    if objective_history is None:
        return pkg.LinearRegressionSummary(*head, coefs)
    return pkg.LinearRegressionTrainingSummary(
        *head, _java_doubles(spark, objective_history), coefs
    )


def linear_svc_summary(
    predictions: DataFrame,
    raw_prediction_col: str,
    prediction_col: str,
    label_col: str,
    weight_col: str,
    objective_history=None,
) -> JavaObject:
    """MLlib's own ``LinearSVC(Training)SummaryImpl`` over ``predictions`` (a ``weight_col``
    absent from ``predictions`` means weight 1.0, as in MLlib)."""
    spark = predictions.sparkSession
    args = (predictions._jdf, raw_prediction_col, prediction_col, label_col, weight_col)
    if objective_history is None:
        return _jvm_class(predictions, "LinearSVCSummaryImpl")(*args)
    impl = _jvm_class(predictions, "LinearSVCTrainingSummaryImpl")
    return impl(*args, _java_doubles(spark, objective_history))


# --- the bridge jar (io.sparkps.bridge): loading, calls, MLlib model wrapping ---


def bridge_jar() -> Path:
    """Path of the bridge jar shipped in the package (built by ``scripts/build_jar.sh``)."""
    return Path(__file__).resolve().parent / "jars" / _JAR_NAME


def _jvm(spark: SparkSession):
    """The py4j gateway's JVM view of ``spark`` (classic sessions only)."""
    jvm = spark.sparkContext._jvm
    if jvm is None:
        raise RuntimeError("spark_ps needs a classic (JVM-backed) SparkSession, not Spark Connect")
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


def call_bridge(fn: Callable, *args: Any) -> Any:
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


def wrap_java_model(py_cls, java_model, params: Mapping[str, Any] | None):
    """The pyspark.ml wrapper of ``java_model`` with ``params`` set on both sides."""
    model = py_cls(java_model)
    model._transfer_params_from_java()
    if params:
        model._set(**dict(params))
        model._transfer_params_to_java()
    return model


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


# --- JVM-side LR scoring (io.sparkps.bridge.LRScoring) ---


def _bridge_on_executors(spark: SparkSession) -> None:
    """Ship the bridge jar to executors unless the application already lists it.

    ``ensure_bridge`` reaches the driver only; UDF classes are loaded by the executors.
    """
    sc = spark.sparkContext
    listed = sc._jsc.sc().listJars()
    names = {str(listed.apply(i)).rsplit("/", 1)[-1] for i in range(listed.size())}
    if _JAR_NAME not in names:
        sc._jsc.sc().addJar(str(bridge_jar()))


def lr_scorer(
    spark: SparkSession, num_features: int, keys: bytes, values: bytes, intercept: float
) -> JavaObject:
    """Broadcast binomial LR weights (int64 ``keys``, float64 ``values``, little-endian bytes)
    for :func:`lr_score`; large buffers cross through a temporary file (:func:`call_bridge`)."""
    bridge = ensure_bridge(spark)
    _bridge_on_executors(spark)
    weights = call_bridge(bridge.LRWeights, int(num_features), keys, values, float(intercept))
    return bridge.LRScoring.scorer(spark._jsparkSession, weights)


def lr_score(
    dataset: DataFrame,
    scorer: JavaObject,
    *,
    features: str,
    keys: bool,
    values: str | None,
    name: str,
    cols: tuple[str, str, str],
    predict_from: int,
    threshold: float,
    raw_threshold: float,
) -> DataFrame:
    """``dataset`` with LR rawPrediction/probability/prediction columns computed on the JVM.

    ``features``/``values`` are quoted column references; ``cols`` the (raw, probability,
    prediction) names, empty to skip; see ``LRScoring.transform`` for ``predict_from``.
    """
    from pyspark.sql import DataFrame

    spark = dataset.sparkSession
    scoring = ensure_bridge(spark).LRScoring
    jdf = scoring.transform(
        dataset._jdf, scorer, features, keys, values, name, *cols,
        int(predict_from), float(threshold), float(raw_threshold),
    )  # fmt: skip
    return DataFrame(jdf, spark)


# --- VectorUDT rows packed for Python workers (io.sparkps.bridge.PackedRows) ---


def packed_rows(dataset: DataFrame, features: str, name: str) -> DataFrame:
    """``dataset`` with column ``name`` holding each row's vector (``features``, a quoted
    reference) as little-endian float64 ``binary``, densified; null stays null.

    Raises RuntimeError when the bridge is not available (jar not built, Spark Connect).
    """
    from py4j.java_gateway import JavaClass
    from pyspark.sql import DataFrame

    spark = dataset.sparkSession
    packed = ensure_bridge(spark).PackedRows
    if not isinstance(packed, JavaClass):  # py4j names a missing class a package
        raise RuntimeError(
            f"the spark-ps JVM bridge on the classpath ({bridge_jar()}) predates "
            f"{_PACKAGE}.PackedRows: rebuild it with scripts/build_jar.sh"
        )
    _bridge_on_executors(spark)
    return DataFrame(packed.pack(dataset._jdf, features, name), spark)
