"""The JVM bridge: MLlib export, the Java PS client, the executor listener and the plugin.

Export tests run in the shared session (the bridge adds its jar to the driver's class
loader); loading saved models with stock MLlib and the plugin each run in a fresh Spark
application in a subprocess, the first one without the bridge on its classpath at all.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from child_jobs import result_of, run_script, spark_submit

ROOT = Path(__file__).resolve().parents[1]
JAR = ROOT / "spark_ps" / "jars" / "spark-ps-bridge.jar"
SOURCES = ROOT / "jvm_bridge" / "src"

pytestmark = pytest.mark.timeout(600)


def _stale() -> bool:
    if not JAR.is_file():
        return True
    newest = max((p.stat().st_mtime for p in SOURCES.rglob("*.java")), default=0.0)
    build = max((ROOT / f).stat().st_mtime for f in ("build.gradle", "settings.gradle"))
    return JAR.stat().st_mtime < max(newest, build)


@pytest.fixture(scope="module")
def bridge_jar() -> Path:
    """The bridge jar, built by scripts/build_jar.sh when missing or older than its sources."""
    if _stale():
        can_install = os.geteuid() == 0 or shutil.which("sudo") is not None
        if shutil.which("gradle") is None and not (can_install and shutil.which("apt-get")):
            pytest.skip("the JVM bridge cannot be built: no gradle and no way to install it")
        done = subprocess.run(
            [str(ROOT / "scripts" / "build_jar.sh")],
            capture_output=True,
            text=True,
            timeout=900,
        )
        if shutil.which("gradle") is None:
            pytest.skip(f"gradle could not be installed: {done.stderr[-2000:]}")
        assert done.returncode == 0, f"build_jar.sh failed:\n{done.stdout}\n{done.stderr}"
    assert JAR.is_file()
    return JAR


@pytest.fixture(scope="module")
def bridge(spark, bridge_jar):
    """The io.sparkps.bridge JVM package in the shared session's driver."""
    from spark_ps.ml.export import ensure_bridge

    return ensure_bridge(spark)


# --------------------------------------------------------------------------- data & helpers


def _data(n: int = 240, d: int = 5, classes: int = 2, seed: int = 7):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d))
    X[:, -1] = np.round(X[:, -1], 1)  # ties on a split threshold exercise `<=`
    w = rng.normal(size=(classes, d))
    y = np.argmax(X @ w.T + rng.normal(scale=0.5, size=(n, classes)), axis=1).astype(float)
    return X, y


def _frame(spark, X: np.ndarray, y: np.ndarray):
    from pyspark.ml.linalg import Vectors

    rows = [(float(label), Vectors.dense(row)) for row, label in zip(X, y, strict=True)]
    return spark.createDataFrame(rows, ["label", "features"]).coalesce(1)


def _outputs(model, df) -> dict[str, np.ndarray]:
    """The output columns a model writes, as arrays keyed by their default names."""
    params = {"rawPrediction": "rawPredictionCol", "probability": "probabilityCol"}
    names = [n for n, p in params.items() if model.hasParam(p)] + ["prediction"]
    cols = [model.getOrDefault(params.get(n, "predictionCol")) for n in names]
    rows = model.transform(df).select(*cols).collect()
    out = {}
    for i, name in enumerate(names):
        if name == "prediction":
            out[name] = np.array([r[i] for r in rows], dtype=float)
        else:
            out[name] = np.array([r[i].toArray() for r in rows])
    return out


def _assert_same(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> None:
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)


def _trees_from_mllib(java_model) -> list[dict[str, np.ndarray]]:
    """The tree contract arrays of every tree of a fitted MLlib GBT (breadth-first)."""
    trees = []
    for jt in java_model.trees():
        nodes, fields = [jt.rootNode()], {k: [] for k in ("feature", "threshold", "left", "right")}
        for k in ("value", "impurity", "gain", "count"):
            fields[k] = []
        i = 0
        while i < len(nodes):
            node = nodes[i]
            internal = node.getClass().getSimpleName() == "InternalNode"
            fields["value"].append(node.prediction())
            fields["impurity"].append(node.impurity())
            fields["count"].append(node.impurityStats().count())
            if internal:
                fields["feature"].append(node.split().featureIndex())
                fields["threshold"].append(node.split().threshold())
                fields["gain"].append(node.gain())
                fields["left"].append(len(nodes))
                fields["right"].append(len(nodes) + 1)
                nodes += [node.leftChild(), node.rightChild()]
            else:
                for k, v in (("feature", -1), ("threshold", 0.0), ("gain", -1.0)):
                    fields[k].append(v)
                fields["left"].append(-1)
                fields["right"].append(-1)
            i += 1
        ints = ("feature", "left", "right")
        trees.append({k: np.array(v, np.int32 if k in ints else float) for k, v in fields.items()})
    return trees


def _np_tree(tree: dict[str, np.ndarray], X: np.ndarray) -> np.ndarray:
    """Reference evaluation of one contract tree, level by level (no per-row loop)."""
    idx = np.zeros(len(X), dtype=np.int64)
    rows = np.arange(len(X))
    for _ in range(len(tree["feature"])):
        f = tree["feature"][idx]
        inner = f >= 0
        if not inner.any():
            break
        go_left = X[rows, np.maximum(f, 0)] <= tree["threshold"][idx]
        nxt = np.where(go_left, tree["left"][idx], tree["right"][idx])
        idx = np.where(inner, nxt, idx)
    return tree["value"][idx]


def _np_margin(trees, weights, X) -> np.ndarray:
    return sum(w * _np_tree(t, X) for t, w in zip(trees, weights, strict=True))


# --------------------------------------------------------------------------- export


@pytest.fixture(scope="module")
def exported(spark, bridge, tmp_path_factory):
    """MLlib-fitted models, their spark-ps exports, and both saved for a fresh application."""
    from pyspark.ml.classification import GBTClassifier, LogisticRegression

    from spark_ps.ml.export import gbt_to_mllib, lr_to_mllib

    out = tmp_path_factory.mktemp("export")
    X, y = _data()
    X3, y3 = _data(classes=3, seed=11)
    df, df3 = _frame(spark, X, y), _frame(spark, X3, y3)
    np.save(out / "X.npy", X)
    np.save(out / "X3.npy", X3)

    lr = LogisticRegression(maxIter=30, regParam=0.01).fit(df)
    lr_x = lr_to_mllib(spark, lr.uid, lr.coefficients.toArray(), lr.intercept)
    mlr = LogisticRegression(maxIter=30, regParam=0.01, family="multinomial").fit(df3)
    mlr_x = lr_to_mllib(
        spark, mlr.uid, mlr.coefficientMatrix.toArray(), mlr.interceptVector.toArray()
    )
    gbt = GBTClassifier(maxIter=4, maxDepth=3, seed=3).fit(df)
    trees = _trees_from_mllib(gbt._java_obj)
    gbt_x = gbt_to_mllib(spark, gbt.uid, trees, np.array(gbt.treeWeights), X.shape[1])

    models = {"lr": lr_x, "mlr": mlr_x, "gbt": gbt_x}
    for name, model in models.items():
        model.save(str(out / name))
    return {
        "dir": out,
        "X": X,
        "df": df,
        "df3": df3,
        "fitted": {"lr": lr, "mlr": mlr, "gbt": gbt},
        "models": models,
        "trees": trees,
        "outputs": {
            "lr": _outputs(lr_x, df),
            "mlr": _outputs(mlr_x, df3),
            "gbt": _outputs(gbt_x, df),
        },
    }


def test_lr_export_predicts_exactly_like_the_fitted_mllib_model(exported):
    from pyspark.ml.classification import LogisticRegressionModel

    lr, lr_x = exported["fitted"]["lr"], exported["models"]["lr"]
    assert type(lr_x) is LogisticRegressionModel
    assert lr_x.uid == lr.uid and lr_x.numFeatures == lr.numFeatures
    np.testing.assert_array_equal(lr_x.coefficients.toArray(), lr.coefficients.toArray())
    assert lr_x.intercept == lr.intercept
    _assert_same(exported["outputs"]["lr"], _outputs(lr, exported["df"]))
    margin = exported["X"] @ lr.coefficients.toArray() + lr.intercept
    raw = exported["outputs"]["lr"]["rawPrediction"][:, 1]
    np.testing.assert_allclose(raw, margin, rtol=1e-12, atol=1e-12)


def test_multinomial_lr_export_matches(exported):
    mlr, mlr_x = exported["fitted"]["mlr"], exported["models"]["mlr"]
    assert mlr_x.numClasses == 3
    np.testing.assert_array_equal(
        mlr_x.coefficientMatrix.toArray(), mlr.coefficientMatrix.toArray()
    )
    _assert_same(exported["outputs"]["mlr"], _outputs(mlr, exported["df3"]))


def test_sparse_lr_export_stays_sparse_and_matches_numpy(spark, bridge):
    from pyspark.ml.linalg import SparseVector

    from spark_ps.ml.export import lr_to_mllib

    X, y = _data(n=60, d=8)
    idx, vals = np.array([1, 4, 6], np.int64), np.array([0.5, -2.0, 1.25])
    model = lr_to_mllib(spark, "lr_sparse", (idx, vals, 8), 0.3, params={"threshold": 0.6})
    assert isinstance(model.coefficients, SparseVector)
    assert list(model.coefficients.indices) == [1, 4, 6] and model.getThreshold() == 0.6
    out = _outputs(model, _frame(spark, X, y))
    margin = X[:, idx] @ vals + 0.3
    np.testing.assert_allclose(out["probability"][:, 1], 1 / (1 + np.exp(-margin)), atol=1e-14)
    np.testing.assert_array_equal(out["prediction"], (1 / (1 + np.exp(-margin)) > 0.6) * 1.0)


def test_large_coefficient_arrays_cross_intact(spark, bridge, monkeypatch):
    """Arrays above the py4j threshold travel through a temporary file; nothing is lost."""
    from spark_ps import _jvm
    from spark_ps.ml import export

    sent: list = []
    spill = _jvm._spill

    def recording_spill(args, tmp):
        sent.append(spill(args, tmp))
        return sent[-1]

    monkeypatch.setattr(_jvm, "_spill", recording_spill)
    rng = np.random.default_rng(5)
    w = rng.normal(size=300_000)  # 2.4 MB > the 1 MiB threshold
    assert w.nbytes > _jvm._FILE_THRESHOLD
    dense = export.lr_to_mllib(spark, "lr_big", w, -0.25)
    np.testing.assert_array_equal(dense.coefficients.toArray(), w)
    assert isinstance(sent[-1][1], str) and sent[-1][1].endswith(".bin")  # went as a file
    idx = np.sort(rng.choice(10_000_000, size=200_000, replace=False)).astype(np.int64)
    vals = rng.normal(size=idx.size)
    sparse = export.lr_to_mllib(spark, "lr_big_sparse", (idx, vals, 10_000_000), 0.5)
    coef = sparse.coefficients
    assert coef.size == 10_000_000 and sparse.intercept == 0.5
    np.testing.assert_array_equal(coef.indices, idx)
    np.testing.assert_array_equal(coef.values, vals)


def test_gbt_export_predicts_exactly_like_mllib_and_numpy(exported):
    from pyspark.ml.classification import GBTClassificationModel

    gbt, gbt_x = exported["fitted"]["gbt"], exported["models"]["gbt"]
    assert type(gbt_x) is GBTClassificationModel
    assert gbt_x.getNumTrees == gbt.getNumTrees and gbt_x.numFeatures == gbt.numFeatures
    assert gbt_x.toDebugString.split("\n", 1)[1] == gbt.toDebugString.split("\n", 1)[1]
    out = exported["outputs"]["gbt"]
    _assert_same(out, _outputs(gbt, exported["df"]))
    np.testing.assert_array_equal(gbt_x.featureImportances.toArray(), gbt.featureImportances)
    margin = _np_margin(exported["trees"], gbt.treeWeights, exported["X"])
    np.testing.assert_allclose(out["rawPrediction"][:, 1], margin, rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(out["prediction"], (margin > 0) * 1.0)


def test_gbt_regressor_from_contract_arrays(spark, bridge):
    from pyspark.ml.regression import GBTRegressionModel

    from spark_ps.ml.export import gbt_to_mllib

    X, y = _data(n=80, d=3)
    tree = {
        "feature": np.array([2, 0, -1, -1, -1], np.int32),
        "threshold": np.array([0.1, -0.4, 0, 0, 0]),
        "left": np.array([1, 3, -1, -1, -1], np.int32),
        "right": np.array([2, 4, -1, -1, -1], np.int32),
        "value": np.array([0.0, -0.5, 2.0, -1.5, 0.25]),
        "impurity": np.array([1.0, 0.4, 0.0, 0.0, 0.0]),
        "gain": np.array([0.6, 0.4, -1, -1, -1]),
        "count": np.array([80.0, 50.0, 30.0, 20.0, 30.0]),
    }
    stump = {  # a single leaf: a constant
        "feature": np.array([-1], np.int32),
        "threshold": np.zeros(1),
        "left": np.array([-1], np.int32),
        "right": np.array([-1], np.int32),
        "value": np.array([0.7]),
        "impurity": np.zeros(1),
        "gain": np.array([-1.0]),
        "count": np.array([80.0]),
    }
    model = gbt_to_mllib(spark, "gbtr_x", [tree, stump], np.array([1.0, 0.1]), 3, False)
    assert type(model) is GBTRegressionModel
    pred = _outputs(model, _frame(spark, X, y))["prediction"]
    np.testing.assert_allclose(pred, _np_margin([tree, stump], [1.0, 0.1], X), atol=1e-12)


def test_malformed_trees_are_refused_with_the_node_named(spark, bridge):
    from spark_ps.ml.export import gbt_to_mllib

    good = {
        "feature": np.array([0, -1, -1], np.int32),
        "threshold": np.array([0.0, 0, 0]),
        "left": np.array([1, -1, -1], np.int32),
        "right": np.array([2, -1, -1], np.int32),
        "value": np.zeros(3),
        "impurity": np.zeros(3),
        "gain": np.array([0.1, -1, -1]),
        "count": np.ones(3),
    }
    loop = dict(good, left=np.array([0, -1, -1], np.int32))
    with pytest.raises(ValueError, match=r"tree 0, node 0: left child 0"):
        gbt_to_mllib(spark, "bad", [loop], np.ones(1), 2)
    wide = dict(good, feature=np.array([5, -1, -1], np.int32))
    with pytest.raises(ValueError, match=r"feature 5 is not in \[0, numFeatures=2\)"):
        gbt_to_mllib(spark, "bad", [wide], np.ones(1), 2)
    with pytest.raises(ValueError, match=r"tree 0: 'count' has 2 nodes"):
        gbt_to_mllib(spark, "bad", [dict(good, count=np.ones(2))], np.ones(1), 2)
    with pytest.raises(ValueError, match=r"1 trees but 2 treeWeights"):
        gbt_to_mllib(spark, "bad", [good], np.ones(2), 2)


_LOAD_SCRIPT = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path
    import numpy as np
    from py4j.java_gateway import JavaClass
    from pyspark.ml.classification import GBTClassificationModel, LogisticRegressionModel
    from pyspark.ml.linalg import Vectors
    from pyspark.sql import SparkSession

    out = Path(sys.argv[1])
    spark = (SparkSession.builder.master("local[1]").appName("stock-load")
             .config("spark.ui.enabled", "false").getOrCreate())
    bridge = spark._jvm.io.sparkps.bridge.MLlibExport
    result = {"bridge_on_classpath": isinstance(bridge, JavaClass)}
    for name, cls, xfile in (("lr", LogisticRegressionModel, "X.npy"),
                             ("mlr", LogisticRegressionModel, "X3.npy"),
                             ("gbt", GBTClassificationModel, "X.npy")):
        X = np.load(out / xfile)
        df = spark.createDataFrame([(Vectors.dense(r),) for r in X], ["features"]).coalesce(1)
        model = cls.load(str(out / name))
        rows = model.transform(df).select("rawPrediction", "probability", "prediction").collect()
        np.savez(out / f"{name}_loaded.npz",
                 rawPrediction=np.array([r[0].toArray() for r in rows]),
                 probability=np.array([r[1].toArray() for r in rows]),
                 prediction=np.array([r[2] for r in rows], dtype=float))
        result[name] = {"uid": model.uid, "class": type(model).__name__}
    spark.stop()
    print("RESULT " + json.dumps(result))
    """
)


def test_saved_exports_load_with_stock_mllib_in_a_fresh_application(exported):
    d = exported["dir"]
    result = run_script(_LOAD_SCRIPT, str(d))
    assert result["bridge_on_classpath"] is False  # loaded by stock MLlib alone
    for name in ("lr", "mlr", "gbt"):
        assert result[name]["uid"] == exported["models"][name].uid
        loaded = dict(np.load(d / f"{name}_loaded.npz"))
        _assert_same(loaded, exported["outputs"][name])


# --------------------------------------------------------------------------- PS client


@pytest.fixture(scope="module")
def own_ps():
    from spark_ps import PSContext

    ps = PSContext.start(numShards=2)
    yield ps
    ps.stop()


def test_java_client_pulls_what_the_python_client_pulls(bridge, own_ps):
    from ps_server.proto import ps_pb2 as pb
    from spark_ps.models import PSVector

    v = PSVector.dense(1001, context=own_ps)
    values = np.random.default_rng(1).normal(size=1001)
    v.update(np.arange(1001), values)
    client = bridge.PSClient(own_ps.address, own_ps.token)
    tiny = bridge.PSClient(bridge.PSCoordinatorClient(own_ps.address, own_ps.token, 30.0), 64)
    try:
        full = np.frombuffer(bytes(client.pullDenseBytes(v.name, 0, 1001)), "<f8")
        np.testing.assert_array_equal(full, v.pull())
        np.testing.assert_array_equal(full, values)
        # across the shard boundary (501 | 500), in 8-value chunks
        part = np.frombuffer(bytes(tiny.pullDenseBytes(v.name, 480, 530)), "<f8")
        np.testing.assert_array_equal(part, values[480:530])
        smap = own_ps.client._coord("GetShardMap", pb.Empty())
        assert list(client.coordinator().shardMap()) == list(smap.addresses)
        spec = client.coordinator().model(v.name)
        assert (spec.dim(), spec.kind(), spec.numShards()) == (1001, "dense", 2)
    finally:
        tiny.close()
        client.close()


def test_java_client_errors_name_the_call(bridge, own_ps):
    from spark_ps.models import PSVector

    v = PSVector.dense(10, context=own_ps)
    bad = bridge.PSClient(own_ps.address, "wrong-token")
    good = bridge.PSClient(own_ps.address, own_ps.token)
    try:
        with pytest.raises(Exception, match=r"GetModel to 127.0.0.1:\d+ failed: UNAUTHENTICATED"):
            bad.pullDenseBytes(v.name, 0, 10)
        with pytest.raises(Exception, match=r"pull range \[5, 11\) .* outside \[0, 10\)"):
            good.pullDenseBytes(v.name, 5, 11)
        with pytest.raises(Exception, match="GetModel .* NOT_FOUND: unknown model 'no-such-model'"):
            good.pullDenseBytes("no-such-model", 0, 1)
    finally:
        bad.close()
        good.close()


def _blocking(fn) -> tuple[threading.Thread, list]:
    box: list = []

    def run():
        try:
            box.append(fn())
        except Exception as e:  # noqa: BLE001 - handed to the test
            box.append(e)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, box


def test_java_remove_worker_releases_a_barrier(bridge, own_ps):
    from spark_ps.client import PSClient

    py = PSClient(own_ps.address, own_ps.token)
    t, box = _blocking(lambda: py.barrier("jb-barrier", "w0", count=2, timeout=60))
    time.sleep(0.5)
    assert t.is_alive()  # waiting for w1
    coordinator = bridge.PSCoordinatorClient(own_ps.address, own_ps.token, 30.0)
    try:
        assert coordinator.removeWorker("jb-barrier", "w1") == 1
        t.join(20)
        assert not t.is_alive() and box == [None]
    finally:
        coordinator.close()
        py.close()


def test_executor_listener_drops_a_lost_executors_workers(spark, bridge, own_ps):
    from spark_ps.client import PSClient

    py = PSClient(own_ps.address, own_ps.token)

    def clock(worker: str, c: int):
        return lambda: py.clock("jb-ssp", worker, c, staleness=0, num_workers=2, timeout=60)

    slow, slow_box = _blocking(clock("executor:7/p0", 1))
    fast, fast_box = _blocking(clock("executor:8/p1", 2))
    slow.join(20)
    assert slow_box == [1]
    time.sleep(0.5)
    assert fast.is_alive()  # executor 7's worker is still at clock 1
    listener = bridge.ExecutorListener(own_ps.address, own_ps.token)
    try:
        event = spark._jvm.org.apache.spark.scheduler.SparkListenerExecutorRemoved(0, "7", "lost")
        listener.onExecutorRemoved(event)
        assert listener.flush(30.0)
        fast.join(20)
        assert not fast.is_alive() and fast_box == [2]
        assert listener.removedWorkers() == 1 and listener.failures() == 0
    finally:
        listener.close()
        py.close()


# --------------------------------------------------------------------------- plugin

_PLUGIN_SCRIPT = textwrap.dedent(
    """
    import json, os, socket, sys, time
    import numpy as np
    from pyspark.sql import SparkSession
    from spark_ps import PSContext
    from spark_ps.models import PSVector

    spark = (SparkSession.builder.master("local[1]").appName("plugin")
             .config("spark.ui.enabled", "false")
             .config("spark.jars", sys.argv[1])
             .config("spark.plugins", "io.sparkps.bridge.PSPlugin")
             .config("spark.ps.numShards", "1")
             .config("spark.ps.replicas", "2")  # passed on to the service it starts
             .getOrCreate())
    conf = spark.sparkContext.getConf()
    address, token = conf.get("spark.ps.address"), conf.get("spark.ps.token")
    ps = PSContext.getOrCreate(spark)
    v = PSVector.dense(4, context=ps)
    v.update(np.arange(4), np.array([1.0, 2.0, 3.0, 4.5]))

    def worker_view(_):
        for d in os.environ.get("SPARK_LOCAL_DIRS", "").split(","):
            p = os.path.join(d, "spark-ps-executor.properties")
            if os.path.exists(p):
                kv = dict(ln.split("=", 1) for ln in open(p).read().splitlines()
                          if "=" in ln and not ln.startswith("#"))
                return [(kv["executor.id"], kv["address"].replace("\\\\:", ":"),
                         kv["token"] == token, oct(os.stat(p).st_mode & 0o777))]
        return [None]

    seen = spark.sparkContext.parallelize([0], 1).flatMap(worker_view).collect()
    for _ in range(200):  # a backup is seeded in the background, then attached
        ps.client.refresh()
        if all(ps.client.backups):
            break
        time.sleep(0.1)
    jvm = spark._jvm
    result = {
        "address": address, "token_set": bool(token), "ps_address": ps.address,
        "ps_embedded": ps.embedded, "pulled": v.pull().tolist(),
        "sys_executor": jvm.System.getProperty("spark.ps.executorId"),
        "sys_address": jvm.System.getProperty("spark.ps.address"),
        "worker_view": seen, "backups": list(ps.client.backups),
    }
    spark.stop()
    host, port = address.rsplit(":", 1)
    closed = False
    for _ in range(100):
        try:
            socket.create_connection((host, int(port)), timeout=0.5).close()
            time.sleep(0.2)
        except OSError:
            closed = True
            break
    result["closed_after_stop"] = closed
    print("RESULT " + json.dumps(result))
    """
)


def test_plugin_starts_a_ps_hands_it_out_and_stops_it(bridge_jar):
    r = run_script(_PLUGIN_SCRIPT, str(bridge_jar))
    assert r["address"].startswith("127.0.0.1:") and r["token_set"]
    assert r["ps_address"] == r["address"] and r["ps_embedded"] is False
    assert r["pulled"] == [1.0, 2.0, 3.0, 4.5]
    assert r["sys_executor"] == "driver" and r["sys_address"] == r["address"]
    assert r["worker_view"] == [["driver", r["address"], True, "0o600"]]
    assert len(r["backups"]) == 1 and r["backups"][0].startswith("127.0.0.1:")  # replicas=2
    assert r["closed_after_stop"] is True


# --------------------------------------------------------------------------- cluster

_KILL_JOB = textwrap.dedent(
    """
    import json, os, signal, sys, threading, time
    from pathlib import Path
    import numpy as np
    import psutil
    from pyspark import TaskContext
    from pyspark.sql import SparkSession
    from spark_ps import PSContext
    from spark_ps.models import PSVector

    work = Path(sys.argv[1])
    spark = SparkSession.builder.appName("spark-ps-kill-executor").getOrCreate()
    sc = spark.sparkContext
    ps = PSContext.getOrCreate(spark)  # spark.ps.address from --conf: the external PS
    w = PSVector.dense(4, context=ps)
    deadline = time.time() + 120
    while sc._jsc.sc().getExecutorMemoryStatus().size() < 3 and time.time() < deadline:
        time.sleep(0.2)  # driver + 2 executors

    def executor_id():
        for d in os.environ["SPARK_LOCAL_DIRS"].split(","):
            p = os.path.join(d, "spark-ps-executor.properties")
            if os.path.exists(p):
                for line in open(p):
                    if line.startswith("executor.id="):
                        return line.split("=", 1)[1].strip()
        raise RuntimeError("no spark-ps-executor.properties in SPARK_LOCAL_DIRS")

    def executor_jvm():
        p = psutil.Process()
        while p is not None and p.name() != "java":
            p = p.parent()
        return p.pid

    def task(index, rows):
        ctx = TaskContext.get()
        exec_id = executor_id()
        worker = f"executor:{exec_id}/p{index}"
        client, ones = w.client, np.ones(4)
        if index == 1 and ctx.attemptNumber() == 0:
            w.increment(np.arange(4), ones)
            client.clock("train", worker, 1, staleness=0, num_workers=2, timeout=300)
            jvm = executor_jvm()
            (work / "kill.json").write_text(json.dumps({"pid": jvm, "executor": exec_id}))
            while psutil.pid_exists(jvm):  # hang until our executor is killed
                time.sleep(0.2)
            os._exit(1)
        if index == 1:  # the retry of a lost worker's task: its work was already pushed
            return [[index, exec_id, ctx.attemptNumber(), -1]]
        mins = []
        for c in (1, 2, 3):
            w.increment(np.arange(4), ones)
            mins.append(client.clock("train", worker, c, staleness=0, num_workers=2,
                                     timeout=300))
        return [[index, exec_id, ctx.attemptNumber(), mins]]

    def killer():
        f = work / "kill.json"
        while not f.exists():
            time.sleep(0.1)
        time.sleep(0.5)
        os.kill(json.loads(f.read_text())["pid"], signal.SIGKILL)

    threading.Thread(target=killer, daemon=True).start()
    t0 = time.time()
    out = sc.parallelize([0, 1], 2).mapPartitionsWithIndex(task).collect()
    result = {"tasks": out, "w": w.pull().tolist(), "seconds": time.time() - t0,
              "killed": json.loads((work / "kill.json").read_text())}
    spark.stop()
    print("RESULT " + json.dumps(result))
    """
)


@pytest.mark.cluster
@pytest.mark.slow
def test_spark_submit_plugin_listener_survives_a_killed_executor(bridge_jar, own_ps, tmp_path):
    """spark-submit --jars/--conf spark.plugins on local-cluster[2,1,1024] with an external PS:
    a worker's executor JVM is SIGKILLed while its peer waits on an SSP clock; the listener
    tells the coordinator, the peer is released, and the job finishes."""
    job = tmp_path / "job.py"
    job.write_text(_KILL_JOB)
    conf = {
        "spark.plugins": "io.sparkps.bridge.PSPlugin",
        "spark.ps.address": own_ps.address,
        "spark.ui.enabled": "false",
        "spark.task.maxFailures": "4",
    }
    env = dict(os.environ, SPARK_PS_TOKEN=own_ps.token)  # the token stays off the command line
    r = result_of(spark_submit(job, tmp_path, conf=conf, jars=(bridge_jar,), env=env))
    by_index = {t[0]: t for t in r["tasks"]}
    killed = r["killed"]["executor"]
    assert by_index[0][1] != killed  # the peer ran on the other executor
    assert by_index[0][3] == [1, 2, 3]  # released from clock 2 once the dead worker was dropped
    assert by_index[1][2] >= 1  # the lost task was retried
    assert r["w"] == [4.0] * 4  # 3 steps of the survivor + 1 of the lost worker


@pytest.mark.slow
def test_spark_submit_example_job_trains_on_the_plugin_started_ps(bridge_jar, tmp_path):
    """The main example, as a pipeline would run it: spark-submit --jars/--conf spark.plugins
    alone; the plugin starts the PS, the example's LogisticRegression trains on it."""
    from bench.datagen import data_dir

    if not (data_dir() / "flights-3m.parquet").exists():
        pytest.skip(f"no flights data under {data_dir()}")
    conf = {"spark.plugins": "io.sparkps.bridge.PSPlugin", "spark.ui.enabled": "false"}
    example = ROOT / "examples" / "flights_lr.py"
    args = ("--fraction", "0.02", "--max-iter", "5")
    jars = (bridge_jar,)
    done = spark_submit(example, *args, master="local[2]", conf=conf, jars=jars, cwd=tmp_path)
    fit = [ln for ln in done.stdout.splitlines() if ln.startswith("spark-ps ")]
    assert fit and "iterations   5" in fit[0] and "test AUC 0." in fit[0], done.stdout
    assert "external" in done.stdout  # PSContext connected to the PS the plugin started
