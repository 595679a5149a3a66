"""Online FTRL from Structured Streaming: real Spark (local[2]), real PS shards, real files.

Each micro-batch is one parquet file (``maxFilesPerTrigger``), so batch ids are the file
order and a clean run and a crashed-and-restarted run see identical batches.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from online_data import rows, write_stream_files

from bench.common import auc
from spark_ps.ml.lr.model import LogisticRegressionModel
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


@pytest.mark.timeout(120)
def test_warm_start_live_scoring_and_mllib_export(spark_ps):
    from pyspark.ml.classification import LogisticRegressionModel as MLlibModel
    from pyspark.ml.linalg import Vectors

    from spark_ps.ml.export import ensure_bridge

    spark, _ = spark_ps
    keys, vals = np.array([3, 17, 40, 999]), np.array([0.5, -1.25, 2.0, -0.1])
    start = LogisticRegressionModel.fromCoefficients(vals, -0.75, keys=keys, numFeatures=1000)
    learner = OnlineLogisticRegression(
        numFeatures=1000, alpha=0.2, beta=1.0, l1=0.5, l2=0.1, modelName="warm"
    ).warmStart(start)
    try:
        live = learner.latestModel()
        snap = live.snapshot()  # the warm-start weights, read back from the FTRL state
        np.testing.assert_array_equal(snap.coefficientKeys, keys)
        np.testing.assert_allclose(snap.coefficientValues, vals, rtol=1e-14)
        assert snap.intercept == pytest.approx(-0.75, rel=1e-14)
        df = spark.createDataFrame(
            [
                (Vectors.sparse(1000, [3, 40], [1.0, 2.0]), 1.0),
                (Vectors.sparse(1000, [17], [1.0]), 0.0),
            ],
            ["features", "label"],
        )
        got = [r.probability[1] for r in live.transform(df).collect()]
        want = [r.probability[1] for r in start.transform(df).collect()]
        np.testing.assert_allclose(got, want, rtol=1e-13)
        ensure_bridge(spark)  # the bridge jar in the shared session (as test_jvm_bridge does)
        mllib = live.toMLlib()
        assert isinstance(mllib, MLlibModel)
        np.testing.assert_allclose(mllib.coefficients.toArray()[keys], vals, rtol=1e-14)
        # a model that already holds state is not re-seeded
        other = LogisticRegressionModel.fromCoefficients(-vals, 3.0, keys=keys, numFeatures=1000)
        OnlineLogisticRegression(
            numFeatures=1000, alpha=0.2, l1=0.5, l2=0.1, modelName="warm"
        ).warmStart(other)
        np.testing.assert_allclose(live.snapshot().coefficientValues, vals, rtol=1e-14)
    finally:
        learner.drop()


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_crashes_and_restarts_learn_every_batch_exactly_once(spark_ps, stream_dir, trained):
    from pyspark.errors import StreamingQueryException

    spark, ps = spark_ps
    clean, _ = trained
    src, ckpt, marker = stream_dir / "src", stream_dir / "ck-crash", stream_dir / "task-died"
    learner = OnlineLogisticRegression(featuresCol="keys", alpha=0.1, modelName="crashy")
    resumed = OnlineLogisticRegression(featuresCol="keys", alpha=0.1, modelName="crashy")
    old_dir, ps.checkpoint_dir = ps.checkpoint_dir, str(stream_dir / "ps-ckpt")
    try:
        # the driver dies after the PS committed batch 1 but before Spark logged it
        online_learner.inject_crash("after_commit", 1)
        with pytest.raises(StreamingQueryException, match="crash after commit 1"):
            _run(spark, learner, src, ckpt)
        assert learner.appliedBatches().tolist() == [0, 1]
        # restart: batch 1 is replayed (and skipped); batch 3 is pushed, then the driver
        # dies before committing it; on the way a task of batch 2 dies after its push and
        # Spark's retry replaces its contribution
        online_learner.inject_crash("task", 2, part=0, marker=str(marker))
        online_learner.inject_crash("before_commit", 3)
        with pytest.raises(StreamingQueryException, match="crash before commit 3"):
            _run(spark, learner, src, ckpt)
        assert marker.exists()
        assert learner.appliedBatches().tolist() == [0, 1, 2]
        # learned by this driver: 1's replay was skipped, 3 was learned but never committed
        assert [h["batchId"] for h in learner.history] == [0, 1, 2, 3]
        # the PS loses the model too; a new driver restores the PS checkpoint written after
        # the last commit and restarts the query from its checkpointLocation
        learner.drop()
        assert ps.recover() >= 3
        _run(spark, resumed, src, ckpt)
        assert resumed.appliedBatches().tolist() == list(range(FILES))
        assert [h["batchId"] for h in resumed.history] == [3, 4, 5]
        # no batch twice, none skipped: the very same state as the clean run, bit for bit
        keys_a, zn_a = _state(clean)
        keys_b, zn_b = _state(resumed)
        np.testing.assert_array_equal(keys_a, keys_b)
        np.testing.assert_array_equal(zn_a, zn_b)
        # a different query (fresh checkpoint) cannot silently re-feed batch ids to this model
        with pytest.raises(StreamingQueryException, match="learned by another streaming query"):
            _run(spark, resumed, src, stream_dir / "ck-other")
        assert resumed.appliedBatches().tolist() == list(range(FILES))
    finally:
        ps.checkpoint_dir = old_dir
        online_learner._CHAOS.clear()
        online_learner._CHAOS_TASK.clear()
        resumed.drop()


def _with_values(n: int, bad_label_row: int = -1, nan_row: int = -1):
    """``rows`` plus a ``vals`` array<double> column (all 1.0), with one defect planted."""
    import pyarrow as pa

    t = rows(n, LOG2, seed=1)
    labels = t.column("label").to_numpy().copy()
    vals = np.ones((n, 12))
    if bad_label_row >= 0:
        labels[bad_label_row] = 2.0
    if nan_row >= 0:
        vals[nan_row, 3] = np.nan
    offsets = pa.array(np.arange(0, vals.size + 1, 12, dtype=np.int32))
    t = t.set_column(0, "label", pa.array(labels))
    return t.append_column("vals", pa.ListArray.from_arrays(offsets, pa.array(vals.ravel())))


@pytest.mark.timeout(400)
def test_bad_input_is_refused_clearly_and_the_model_is_unchanged(spark_ps, stream_dir, tmp_path):
    import pyarrow.parquet as pq
    from pyspark.errors import StreamingQueryException

    spark, _ = spark_ps
    src = stream_dir / "src"
    # wrong column types and Params: refused on the driver before a query starts
    with pytest.raises(TypeError, match=r"Column 'label' \(featuresCol\) must be of type"):
        OnlineLogisticRegression(featuresCol="label", modelName="t1").trainOn(
            _stream(spark, src), str(tmp_path / "c1")
        )
    with pytest.raises(TypeError, match=r"Column 'keys' \(labelCol\) must be of type numeric"):
        OnlineLogisticRegression(featuresCol="keys", labelCol="keys", modelName="t2").trainOn(
            _stream(spark, src), str(tmp_path / "c2")
        )
    with pytest.raises(ValueError, match="alpha must be > 0, got 0.0"):
        OnlineLogisticRegression(featuresCol="keys", alpha=0.0, modelName="t3").latestModel()
    # bad values: the batch fails naming column, row and partition; nothing is learned
    keys = np.unique(rows(300, LOG2, seed=1).column("keys").combine_chunks().flatten())
    start = LogisticRegressionModel.fromCoefficients(
        np.linspace(-1, 1, keys.size), 0.25, keys=keys, numFeatures=2**LOG2
    )
    learner = OnlineLogisticRegression(featuresCol="keys", featureValuesCol="vals")
    learner.setModelName("bad-input").warmStart(start)
    before = _state(learner)
    try:
        # through a real query: the good file is batch 0, the bad one batch 1
        d = tmp_path / "label"
        (d / "src").mkdir(parents=True)
        pq.write_table(_with_values(300, bad_label_row=7), d / "src" / "part-0000.parquet")
        with pytest.raises(StreamingQueryException, match="but got 2.0 in column 'label' at row 7"):
            _run(spark, learner, d / "src", d / "ck")
        # the foreachBatch function on a static batch: a NaN feature value
        pq.write_table(_with_values(300, nan_row=5), tmp_path / "nan.parquet")
        batch = learner.learningStream(spark.read.parquet(str(tmp_path / "nan.parquet")))
        with pytest.raises(Exception, match="value nan at row 5 is not finite") as err:
            learner.processBatch(batch, 0)
        assert "partition 0 of this micro-batch" in str(err.value)
        after = _state(learner)
        np.testing.assert_array_equal(before[0], after[0])
        np.testing.assert_array_equal(before[1], after[1])
        assert learner.appliedBatches().size == 0 and learner.history == []
    finally:
        learner.drop()


@pytest.mark.timeout(60)
def test_commit_applies_a_round_once_and_only_its_current_parts(ps):
    """The shard-side protocol alone: replace per (round, part), apply once, drop the rest."""
    from spark_ps.models import PSMatrix, PSVector

    state = PSMatrix.sparse(2, 2**40, name="online-unit/state", context=ps)
    ledger = PSVector.sparse(name="online-unit/ledger", dtype="int64", context=ps)
    keys = np.array([5, 2**39 + 7, 2**40 - 1], dtype=np.int64)
    try:
        state.aggregate(keys, np.full((3, 2), 100.0), round=4, part=0)  # replaced below
        state.aggregate(keys, np.ones((3, 2)), round=4, part=0)
        state.aggregate(keys[:1], np.full((1, 2), 2.0), round=4, part=1)
        state.aggregate(keys, np.full((3, 2), 50.0), round=4, part=2)  # a stale, larger attempt

        def commit():
            return ps.client.call(
                "online.commit", [state.spec, ledger.spec], {"round": 4, "parts": 2, "tag": 9}
            )

        first = commit()
        assert [r["applied"] for r, _ in first] == [True] * ps.num_shards
        np.testing.assert_array_equal(state.pull(keys), [[3.0, 3.0], [1.0, 1.0], [1.0, 1.0]])
        state.aggregate(keys, np.ones((3, 2)), round=4, part=0)  # a zombie task's late push
        second = commit()
        assert [r["applied"] for r, _ in second] == [False] * ps.num_shards
        np.testing.assert_array_equal(state.pull(keys), [[3.0, 3.0], [1.0, 1.0], [1.0, 1.0]])
        for _, (ids, tags) in ps.client.call("online.applied", [ledger.spec]):
            assert ids.tolist() == [4] and tags.tolist() == [9]
    finally:
        state.drop()
        ledger.drop()


@pytest.mark.timeout(60)
def test_commit_refuses_bad_args_by_name_and_changes_nothing(ps):
    """A malformed commit is INVALID_ARGUMENT naming the arg (not INTERNAL), applies nothing."""
    from spark_ps.client import PSError
    from spark_ps.models import PSMatrix, PSVector

    state = PSMatrix.sparse(2, 2**40, name="online-bad/state", context=ps)
    ledger = PSVector.sparse(name="online-bad/ledger", dtype="int64", context=ps)
    floats = PSVector.sparse(name="online-bad/floats", context=ps)
    keys = np.array([5, 2**39 + 7], dtype=np.int64)
    try:
        state.aggregate(keys, np.ones((2, 2)), round=1, part=0)
        specs = [state.spec, ledger.spec]
        bad = [
            (specs, {"parts": 1}, r"arg 'round' must be an integer, got None"),
            (specs, {"round": "1", "parts": 1}, r"arg 'round' must be an integer, got '1'"),
            (specs, {"round": 1, "parts": -1}, r"parts must be >= 0, got -1"),
            (specs[:1], {"round": 1, "parts": 1}, r"takes 2 models \(state, ledger\), got 1"),
            ([state.spec, floats.spec], {"round": 1, "parts": 1}, r"sparse int64 vector"),
        ]
        for models, args, match in bad:
            with pytest.raises(PSError, match=match) as err:
                ps.client.call("online.commit", models, args)
            assert err.value.code.name == "INVALID_ARGUMENT", err.value
        with pytest.raises(PSError, match=r"online.discard: arg 'round' must be an integer"):
            ps.client.call("online.discard", [state.spec], {"round": 1.5})
        ledgers = ps.client.call("online.applied", [ledger.spec])
        assert all(ids.size == 0 for _, (ids, _tags) in ledgers)
        np.testing.assert_array_equal(state.pull(keys), np.zeros((2, 2)))  # nothing applied
        # the contribution is still pending: a good commit applies it exactly once
        ps.client.call("online.commit", [state.spec, ledger.spec], {"round": 1, "parts": 1})
        np.testing.assert_array_equal(state.pull(keys), np.ones((2, 2)))
    finally:
        for t in (state, ledger, floats):
            t.drop()


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_shard_restart_mid_batch_is_learned_again_instead_of_losing_its_updates(
    spark, stream_dir, trained, tmp_path, monkeypatch
):
    """SIGKILL a shard after batch 2 was learned, before its commit: the shard comes back
    from the checkpoint of batch 1 without batch 2's contributions. The batch must not be
    committed so (the commit's retry used to mark it applied there with nothing added):
    the learner restores the model on every shard from that checkpoint and learns batch 2
    again, and the run ends bit for bit where a clean run does."""
    import os
    import signal
    import time

    from spark_ps import PSContext

    clean, _ = trained
    own = PSContext.start(numShards=2, checkpointDir=str(tmp_path / "ps-ckpt"))
    previous, PSContext._active = PSContext._active, own
    learner = OnlineLogisticRegression(featuresCol="keys", alpha=0.1, modelName="restarted")
    chaos = online_learner._chaos

    def kill_shard_before_commit_2(point: str, batch_id: int) -> None:
        chaos(point, batch_id)
        if point == "before_commit" and int(batch_id) == 2 and not own.metrics().get("restart"):
            before = own.client.shard_restarts()
            os.kill(own.client.health()[1].pid, signal.SIGKILL)
            deadline = time.monotonic() + 60
            while own.client.shard_restarts() == before:  # back from batch 1's checkpoint
                assert time.monotonic() < deadline, "shard 1 was not restarted"
                time.sleep(0.1)

    monkeypatch.setattr(online_learner, "_chaos", kill_shard_before_commit_2)
    try:
        q = _run(spark, learner, stream_dir / "src", tmp_path / "query")
        assert q.exception() is None
        assert own.metrics().get("restart") == 1
        assert learner.appliedBatches().tolist() == list(range(FILES))
        assert [h["batchId"] for h in learner.history] == list(range(FILES))
        keys_a, zn_a = _state(clean)
        keys_b, zn_b = _state(learner)
        np.testing.assert_array_equal(keys_a, keys_b)
        np.testing.assert_array_equal(zn_a, zn_b)
    finally:
        learner.drop()
        PSContext._active = previous
        own.stop()


@pytest.mark.timeout(60)
def test_batch_status_from_the_ledgers(ps):
    """applied / partial (committed on some shards only) / new, a foreign query's batch,
    and a gap (the PS restored from an older checkpoint than the query's) refused."""
    learner = OnlineLogisticRegression(featuresCol="keys", modelName="status", numFeatures=100)
    cfg = learner._config(ps)
    try:

        def commit(batch: int, tag: int, shards=None) -> None:
            args = {"round": batch, "parts": 2, "tag": (tag << online_learner._PARTS_BITS) | 2}
            ps.client.call(
                "online.commit", [cfg.state.spec, learner._ledger.spec], args, shards=shards
            )

        for b in range(3):
            commit(b, tag=7)
        commit(3, tag=7, shards=[0])  # the driver died mid-commit
        assert learner._status(1, 7) == ("applied", 2)
        assert learner._status(3, 7) == ("partial", 2)
        assert learner._status(4, 7) == ("new", 0)
        assert learner.appliedBatches().tolist() == [0, 1, 2]
        # what _status reads per micro-batch: one entry and the highest id, not the ledger
        one = ps.client.call("online.applied", [learner._ledger.spec], {"round": 1})
        assert [ids.tolist() for _, (ids, _tags) in one] == [[1], [1]]
        assert [meta["latest"] for meta, _ in one] == [3, 2] and [m["count"] for m, _ in one] == [
            4,
            3,
        ]
        with pytest.raises(RuntimeError, match="learned by another streaming query"):
            learner._status(2, 8)
        with pytest.raises(RuntimeError, match=r"up to 3 but the query is at batch 6"):
            learner._status(6, 7)
    finally:
        learner.drop()


@pytest.mark.timeout(60)
def test_commit_past_the_models_budget_is_refused_and_changes_nothing(ps):
    """Folding a batch into the state creates rows: a budget it would pass refuses the
    commit whole (it used to grow the state past it); the folded contributions count as
    released, so a budget the committed state fits lets it through."""
    from spark_ps.client import PSError
    from spark_ps.models import PSMatrix, PSVector

    keys = np.random.default_rng(0).choice(2**40, 1000, replace=False)
    made = []
    try:
        for budget in (20_000, 30_000):  # per shard; ~500 rows hold 28,672 bytes there
            state = PSMatrix.sparse(
                2, 2**40, name=f"online-budget-{budget}/state", context=ps, budget_bytes=budget
            )
            ledger = PSVector.sparse(
                name=f"online-budget-{budget}/ledger", dtype="int64", context=ps
            )
            made += [state, ledger]
            state.aggregate(keys, np.ones((keys.size, 2)), round=0, part=0)
            args = {"round": 0, "parts": 1}
            if budget == 20_000:
                with pytest.raises(
                    PSError,
                    match="committing batch 0 to model .* past its budget "
                    "of 20000 bytes; nothing was changed",
                ) as err:
                    ps.client.call("online.commit", [state.spec, ledger.spec], args)
                assert err.value.code.name == "RESOURCE_EXHAUSTED"
                assert [r["rows"] for r, _ in ps.client.call("online.footprint", [state.spec])] == [
                    0,
                    0,
                ]
                assert all(
                    ids.size == 0
                    for _, (ids, _t) in ps.client.call("online.applied", [ledger.spec])
                )
            else:
                ps.client.call("online.commit", [state.spec, ledger.spec], args)
                np.testing.assert_array_equal(state.pull(keys), np.ones((keys.size, 2)))
    finally:
        for t in made:
            t.drop()
