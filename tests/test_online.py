"""Online FTRL from Structured Streaming: real Spark (local[2]), real PS shards, real files.

Each micro-batch is one parquet file (``maxFilesPerTrigger``), so batch ids are the file
order and a clean run and a crashed-and-restarted run see identical batches.
"""

from __future__ import annotations

import math
import shutil

import numpy as np
import pytest
from online_data import rows, vocabulary, write_stream_files

from bench.common import auc
from spark_ps.ml.online import OBSERVATION, OnlineLogisticRegression
from spark_ps.ml.online import learner as online_learner

LOG2 = 40
FILES, PER_FILE = 6, 1500


@pytest.fixture(scope="module")
def stream_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("online")
    write_stream_files(d / "src", FILES, PER_FILE, LOG2)
    return d


def _stream(spark, src, files_per_batch: int = 1):
    schema = spark.read.parquet(str(src)).schema
    return (
        spark.readStream.schema(schema)
        .option("maxFilesPerTrigger", files_per_batch)
        .parquet(str(src))
    )


def _run(spark, learner, src, ckpt, files_per_batch: int = 1):
    """Train until the files are consumed; returns the finished query (raises its error)."""
    q = learner.trainOn(
        _stream(spark, src, files_per_batch), str(ckpt), trigger={"availableNow": True}
    )
    q.awaitTermination(240)
    return q


def _state(learner) -> tuple[np.ndarray, np.ndarray]:
    """(sorted keys, [z, n]) of every key the model holds on the PS."""
    keys, zn = learner._cfg.state.pull()
    order = np.argsort(keys)
    return np.asarray(keys)[order], np.asarray(zn).reshape(-1, 2)[order]


def _score_auc(model, df) -> float:
    from pyspark.ml.functions import vector_to_array

    t = model.transform(df).select("label", vector_to_array("rawPrediction")[1].alias("s"))
    table = t.toArrow()
    return auc(table.column("label").to_numpy(), table.column("s").to_numpy())


@pytest.fixture(scope="module")
def trained(spark_ps, stream_dir):
    """One clean online run over the stream files (reused by several tests)."""
    spark, _ = spark_ps
    learner = OnlineLogisticRegression(featuresCol="keys", alpha=0.1, modelName="clean")
    q = _run(spark, learner, stream_dir / "src", stream_dir / "ck-clean")
    yield learner, q
    learner.drop()


@pytest.mark.timeout(300)
def test_online_auc_within_001_of_batch_ftrl_and_metrics_in_progress(spark_ps, stream_dir, trained):
    spark, _ = spark_ps
    learner, q = trained
    test = spark.createDataFrame(rows(4000, LOG2, seed=999).to_pandas())
    train = spark.read.parquet(str(stream_dir / "src"))
    from spark_ps.ml.classification import LogisticRegression

    batch = LogisticRegression(
        solver="ftrl", stepSize=0.1, batchSize=256, maxIter=1, regParam=0.0, featuresCol="keys"
    ).fit(train)
    online_auc = _score_auc(learner.latestModel(), test)
    batch_auc = _score_auc(batch, test)
    assert online_auc > 0.6, online_auc  # it learned something (0.5 = nothing)
    assert abs(online_auc - batch_auc) < 0.01, (online_auc, batch_auc)
    # progressive validation: the first batch is scored by the empty model, later ones improve
    hist = learner.history
    assert [h["batchId"] for h in hist] == list(range(FILES))
    assert hist[0]["logloss"] == pytest.approx(math.log(2), abs=1e-12)
    assert hist[-1]["logloss"] < hist[0]["logloss"] - 0.05
    assert hist[-1]["runningLogloss"] < hist[1]["runningLogloss"]
    # the same numbers reach the query's progress through observe
    seen = {p["batchId"]: p["observedMetrics"][OBSERVATION] for p in q.recentProgress}
    for h in hist:
        m = seen[h["batchId"]]
        assert m["rows"] == PER_FILE == h["rows"]
        assert m["logloss"] == pytest.approx(h["logloss"], rel=1e-12)
        assert m["auc"] == pytest.approx(h["auc"], rel=1e-9)


@pytest.mark.timeout(120)
def test_hashed_2_40_memory_grows_with_keys_seen(spark_ps, stream_dir, trained):
    spark, ps = spark_ps
    learner, _ = trained
    keys, _ = _state(learner)
    data = spark.read.parquet(str(stream_dir / "src")).toArrow()
    seen = np.unique(data.column("keys").combine_chunks().flatten().to_numpy())
    assert seen.max() > 2**39  # the keys really span the 2^40 space
    np.testing.assert_array_equal(keys, np.append(seen, 2**LOG2))  # + the intercept key
    fp = learner.footprint()
    assert fp["keys"] == keys.size
    nbytes = fp["nbytes"]
    assert nbytes < 200 * keys.size, (nbytes, keys.size)  # bytes per key, not per dimension
    snap = learner.latestModel().snapshot()
    assert snap.numFeatures == 2**LOG2 and snap.coefficientKeys.max() > 2**31
