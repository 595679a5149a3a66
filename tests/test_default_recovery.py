"""Fits on a PS with the DEFAULT configuration survive a SIGKILLed shard at any moment.

No checkpoint directory, no replicas: the session's embedded PS as a user gets it. A real
shard process is SIGKILLed at chosen moments of one fit (set-up, iterations, the final
pull), the supervisor restarts it empty, and the fit must finish with the model of a clean
fit on the same data. Several kills go into one fit where the phases allow it, so each
family costs one faulted fit.

Tolerances: a rollback that starts over from set-up walks the clean fit's path (exact
equality). An L-BFGS warm restart from a held iterate starts with an empty curvature
history, so it takes a different path to the same optimum: both fits stop with a gradient
norm below ``tol * |f|`` (tol=1e-10 here), and with L2 (regParam=0.05, the objective is
0.05-strongly convex in standardized space) the iterates are then within
``|g| / 0.05`` ~ 1e-8 of the optimum; 1e-6 on coefficients leaves room for the
standardization's scaling.
"""

from __future__ import annotations

import os
import signal
import time

import numpy as np
import pytest
from pyspark.ml.linalg import Vectors

from spark_ps.ml import _job
from spark_ps.ml.classification import GBTClassifier, LogisticRegression
from spark_ps.ml.gbt import boost_worker
from spark_ps.ml.lr import distributed

pytestmark = [pytest.mark.timeout(600)]


def _kill_shard(ps, index: int = 1) -> int:
    """SIGKILL shard `index` and wait until its replacement is in the shard map."""
    before = ps.client.shard_restarts()
    pid = ps.client.health()[index].pid
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 60
    while ps.client.shard_restarts() == before:
        assert time.monotonic() < deadline, "the killed shard was not restarted"
        time.sleep(0.05)
    return pid


@pytest.fixture
def kill_after(monkeypatch, spark_ps):
    """kill_after({op: [n, ...]}): SIGKILL shard 1 right after the driver posts the n-th
    (0-based) command `op` of the next fits; op "final" kills as an LR fit starts reading
    its coefficients back (when it lists the touched keys, right before the last pulls),
    op "tree" right after a GBT fit reads its n-th finished tree (its workers grow trees
    without driver commands). Returns the list the victims' pids go into."""
    _, ps = spark_ps
    killed: list[int] = []

    def arm(plan: dict[str, list[int]]) -> list[int]:
        seen: dict[str, int] = {}
        command, final = _job.PSJob.command, distributed._KeySpace.touched
        wait_posted = _job.PSJob.wait_posted

        def maybe_kill(op: str) -> None:
            n = seen[op] = seen.get(op, -1) + 1
            if n in plan.get(op, ()):
                killed.append(_kill_shard(ps))

        def command_then_kill(self, op, **payload):
            r = command(self, op, **payload)
            maybe_kill(op)
            return r

        def final_then_kill(*args, **kwargs):
            maybe_kill("final")
            return final(*args, **kwargs)

        def wait_then_kill(self, topic):
            r = wait_posted(self, topic)
            if "/tree/" in topic:
                maybe_kill("tree")
            return r

        monkeypatch.setattr(_job.PSJob, "command", command_then_kill)
        monkeypatch.setattr(_job.PSJob, "wait_posted", wait_then_kill)
        monkeypatch.setattr(distributed._KeySpace, "touched", final_then_kill)
        return killed

    return arm


def _correlated_df(spark, n=1500, d=20, seed=4):
    """Correlated features of mixed scales: ~50 L-BFGS iterations to converge."""
    rng = np.random.default_rng(seed)
    z = rng.normal(size=(n, d))
    x = z @ (np.eye(d) + 0.9 * rng.normal(size=(d, d)) / np.sqrt(d)) * rng.uniform(0.1, 10, d)
    y = (rng.uniform(size=n) < 1 / (1 + np.exp(-(z @ rng.normal(size=d))))).astype(float)
    rows = [(float(y[i]), Vectors.dense(x[i])) for i in range(n)]
    return spark.createDataFrame(rows, ["label", "features"]).cache()


def _delta(ps, before: dict) -> dict:
    return {k: v - before.get(k, 0) for k, v in ps.metrics().items()}


def _check_recovered(ps, before: dict, models: set, kills: int, warm: bool = True) -> None:
    """Every kill was answered by one restart and one restore, the fit left no tensor
    behind, and (`warm`) a warm restart went back to a held iterate."""
    after = _delta(ps, before)
    assert after["restart"] == kills and after["restore"] == kills, after
    if warm:
        assert after["iteration_lost"] > 0, after
    assert set(ps.client.models()) <= models  # the fit left no tensor behind


@pytest.mark.slow
def test_lbfgs_fit_survives_kills_in_set_up_iterations_and_final_pull(spark_ps, kill_after):
    """Default config: kills while the statistics are summed (set-up, nothing held: starts
    over), in the first gradient round (the first line search's trial, the start's value
    coming from the statistics: nothing held yet, starts over), ~15 iterations
    in (a warm restart from the iterate held at iteration 10), and while the coefficients
    are read back (from the iterate held last)."""
    spark, ps = spark_ps
    df = _correlated_df(spark)
    lr = LogisticRegression(maxIter=200, regParam=0.001, tol=1e-10)
    clean = lr.fit(df)
    assert clean.summary.totalIterations > 30  # the kill in grad round 20 lands mid-fit
    before, models = ps.metrics(), set(ps.client.models())
    killed = kill_after({"stats": [0], "grad": [0, 20], "final": [0]})
    faulted = lr.fit(df)
    assert len(killed) == 4
    _check_recovered(ps, before, models, 4)
    np.testing.assert_allclose(
        faulted.coefficients.toArray(), clean.coefficients.toArray(), rtol=0, atol=1e-6
    )
    assert faulted.intercept == pytest.approx(clean.intercept, abs=1e-6)
    assert faulted.summary.objectiveHistory[-1] == pytest.approx(
        clean.summary.objectiveHistory[-1], rel=1e-10
    )
    # transform and export after a kill: the model is on the driver
    _kill_shard(ps)
    exported = faulted.toMLlib()
    np.testing.assert_array_equal(exported.coefficients.toArray(), faulted.coefficients.toArray())
    got = [r.probability[1] for r in faulted.transform(df).select("probability").collect()]
    want = [r.probability[1] for r in clean.transform(df).select("probability").collect()]
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)


@pytest.mark.slow
def test_multinomial_fit_survives_kills_in_set_up_iterations_and_final_pull(spark_ps, kill_after):
    """The multinomial fit recovers as the binomial one: kills while the statistics are
    summed and in the first gradient round (set-up redone), ~16 iterations in (a warm
    restart from the [keys, K] iterate held at iteration 10) and while the coefficients
    are read back. Same optimum as a clean fit: the objective to 1e-9 relative; the
    coefficients to 1e-3, because shifting every class's coefficients by one vector is a
    direction only the L2 term (0.001) curves, so two stopping points of tol=1e-10 lie
    ~1e-4 apart along it (observed 1.4e-4 on a coefficient of 17.5)."""
    spark, ps = spark_ps
    rng = np.random.default_rng(8)
    n, d = 1200, 10
    z = rng.normal(size=(n, d))
    x = z @ (np.eye(d) + 0.9 * rng.normal(size=(d, d)) / np.sqrt(d)) * rng.uniform(0.1, 10, d)
    y = np.argmax(z @ rng.normal(size=(d, 3)) + rng.gumbel(size=(n, 3)), axis=1).astype(float)
    df = spark.createDataFrame(
        [(float(y[i]), Vectors.dense(x[i])) for i in range(n)], ["label", "features"]
    ).cache()
    lr = LogisticRegression(family="multinomial", maxIter=200, regParam=0.001, tol=1e-10)
    clean = lr.fit(df)
    assert clean.summary.totalIterations > 20  # the kill in round 18 lands mid-fit
    before, models = ps.metrics(), set(ps.client.models())
    killed = kill_after({"stats": [0], "softmax_grad": [0, 18], "final": [0]})
    faulted = lr.fit(df)
    assert len(killed) == 4
    _check_recovered(ps, before, models, 4)
    assert faulted.summary.objectiveHistory[-1] == pytest.approx(
        clean.summary.objectiveHistory[-1], rel=1e-9
    )
    np.testing.assert_allclose(
        faulted.coefficientMatrix.toArray(), clean.coefficientMatrix.toArray(), rtol=0, atol=1e-3
    )
    np.testing.assert_allclose(
        faulted.interceptVector.toArray(), clean.interceptVector.toArray(), rtol=0, atol=1e-3
    )


@pytest.mark.slow
def test_linear_regression_and_svc_survive_kills_in_set_up_iterations_and_final_pull(
    spark_ps, kill_after, monkeypatch
):
    """LinearRegression (squared error) and LinearSVC (hinge, OWL-QN) recover as LR does:
    kills in the statistics round and the first gradient round start over, one ~15
    iterations in resumes from the iterate held at iteration 10, one while the
    coefficients are read back resumes from the last held one. L2 (0.05) makes each
    objective 0.05-strongly convex in standardized space, so both stopping points of
    tol=1e-10 are within |g|/0.05 ~ 1e-7 of the optimum: coefficients within 1e-5."""
    from spark_ps.ml.classification import LinearSVC
    from spark_ps.ml.regression import LinearRegression

    spark, ps = spark_ps
    df = _correlated_df(spark, n=1200, d=12, seed=9)
    for est in (
        LinearRegression(maxIter=200, regParam=0.05, tol=1e-10, solver="l-bfgs"),
        LinearSVC(maxIter=200, regParam=0.05, tol=1e-10),
    ):
        clean = est.fit(df)
        summary = clean.summary() if callable(clean.summary) else clean.summary  # as pyspark's
        assert summary.totalIterations > 20  # the kill in round 16 lands mid-fit
        before, models = ps.metrics(), set(ps.client.models())
        killed = kill_after({"linear_stats": [0], "linear_grad": [0, 16], "final": [0]})
        k0 = len(killed)  # the fixture's one list holds every estimator's victims
        faulted = est.fit(df)
        assert len(killed) - k0 == 4, est
        _check_recovered(ps, before, models, 4)
        np.testing.assert_allclose(
            faulted.coefficients.toArray(), clean.coefficients.toArray(), rtol=0, atol=1e-5
        )
        assert faulted.intercept == pytest.approx(clean.intercept, abs=1e-5)
        monkeypatch.undo()  # disarm: the next estimator's plan starts afresh


@pytest.mark.slow
def test_minibatch_fit_survives_kills_in_set_up_and_epochs(spark_ps, kill_after):
    """sgd (BSP, default staleness): kills while keys are numbered, in epoch 2 and as the
    weights are read back; each starts the fit over (the optimizer's state lives only on
    the PS), with the clean fit's shuffles. BSP is lock-step (every step sees exactly the
    steps before it), so the faulted fit is the clean one up to the order in which the
    two workers' pushes are summed: coefficients within 1e-9, and exactly maxIter epochs
    (a fit that went on from a half-trained model would have trained for more)."""
    spark, ps = spark_ps
    df = _correlated_df(spark, n=1200, d=8, seed=7)
    lr = LogisticRegression(solver="sgd", maxIter=3, stepSize=0.05, batchSize=64, tol=0.0)
    clean = lr.fit(df)
    before, models = ps.metrics(), set(ps.client.models())
    killed = kill_after({"keys": [0], "epoch": [1], "final": [0]})
    faulted = lr.fit(df)
    assert len(killed) == 3
    _check_recovered(ps, before, models, 3, warm=False)
    np.testing.assert_allclose(
        faulted.coefficients.toArray(), clean.coefficients.toArray(), rtol=1e-9, atol=1e-12
    )
    assert len(faulted.summary.objectiveHistory) == 3


@pytest.mark.slow
def test_gbt_fit_survives_kills_in_set_up_and_trees_with_identical_trees(
    spark_ps, kill_after, monkeypatch
):
    """Kills while the sketch is merged (its rounds are redone) and while the workers grow
    tree 2 (their rendezvous fails, the job is relaunched and resumes from the trees the
    driver read). Trees are a deterministic function of the data: identical."""
    spark, ps = spark_ps
    monkeypatch.setattr(boost_worker, "CELLS_PER_SHARD", 1)  # the killed shard finds splits
    rng = np.random.default_rng(5)
    x = np.round(rng.normal(size=(1500, 5)), 1)
    y = ((x[:, 0] + x[:, 1] * x[:, 2]) > 0).astype(float)
    df = spark.createDataFrame(
        [(float(y[i]), Vectors.dense(x[i])) for i in range(len(y))], ["label", "features"]
    ).cache()
    gbt = GBTClassifier(maxIter=4, maxDepth=3, seed=3)
    clean = gbt.fit(df)
    before = ps.metrics()
    killed = kill_after({"sketch": [0], "tree": [1]})
    faulted = gbt.fit(df)
    assert len(killed) == 2
    assert _delta(ps, before)["restart"] == 2
    assert faulted.toDebugString.split("\n", 1)[1] == clean.toDebugString.split("\n", 1)[1]
    np.testing.assert_array_equal(faulted.treeWeights, clean.treeWeights)
    _kill_shard(ps)  # transform and export read no PS
    got = [r.probability[1] for r in faulted.transform(df).select("probability").collect()]
    want = [r.probability[1] for r in clean.transform(df).select("probability").collect()]
    assert got == want


@pytest.mark.slow
def test_online_ftrl_survives_kills_at_set_up_before_commit_between_batches_and_transform(
    spark_ps, tmp_path, monkeypatch
):
    """Kills right after the model is created (before the first batch), after batch 1 was
    learned and before its commit (its contributions on the killed shard are gone), after
    batch 1 was committed (found at the start of batch 2), and before scoring: each time
    the model is restored from its newest snapshot and the batch learned again. The model
    ends bit for bit where a clean run does (a batch's increments do not depend on the
    attempt that computed them), and so do its scores."""
    from online_data import learner_state as state
    from online_data import train_stream, write_stream_files

    from spark_ps.ml.online import OnlineLogisticRegression
    from spark_ps.ml.online import learner as online_learner

    spark, ps = spark_ps
    src = tmp_path / "src"
    write_stream_files(src, 3, 1000, 40)
    schema = spark.read.parquet(str(src)).schema

    def run(learner, ckpt):
        train_stream(spark, learner, src, tmp_path / ckpt, schema)

    clean = OnlineLogisticRegression(featuresCol="keys", alpha=0.1, modelName="ft-clean")
    faulted = OnlineLogisticRegression(featuresCol="keys", alpha=0.1, modelName="ft-faulted")
    try:
        run(clean, "ck-clean")
        keys_a, zn_a = state(clean)  # before the kills take its rows on shard 1 away
        before = ps.metrics()
        killed: list[int] = []
        chaos = online_learner._chaos

        plan = {("before_commit", 1), ("after_commit", 1)}

        def kill_at(point: str, batch_id: int) -> None:
            chaos(point, batch_id)
            if (point, int(batch_id)) in plan:  # once: the batch learned again goes on
                plan.discard((point, int(batch_id)))
                killed.append(_kill_shard(ps))

        monkeypatch.setattr(online_learner, "_chaos", kill_at)
        faulted.latestModel()  # creates the model on the PS
        killed.append(_kill_shard(ps))  # set-up: before any batch
        run(faulted, "ck-faulted")
        assert len(killed) == 3
        assert faulted.appliedBatches().tolist() == [0, 1, 2]
        assert [h["batchId"] for h in faulted.history] == [0, 1, 2]  # 1 counted once
        keys_b, zn_b = state(faulted)
        np.testing.assert_array_equal(keys_a, keys_b)
        np.testing.assert_array_equal(zn_a, zn_b)
        after = _delta(ps, before)
        assert after["restart"] == 3 and after["restore"] == 3
        _kill_shard(ps)  # transform: the live model restores itself before it pulls
        test = spark.read.parquet(str(src))
        got = faulted.latestModel().transform(test).select("probability").collect()
        want = clean.latestModel().transform(test).select("probability").collect()
        assert [r[0][1] for r in got] == [r[0][1] for r in want]
    finally:
        clean.drop()
        faulted.drop()


@pytest.mark.slow
def test_fm_fit_survives_kills_in_set_up_iterations_and_the_last_pass(spark_ps, kill_after):
    """FMClassifier (adamW, factors and optimizer state only on the PS): kills in the
    ``dims`` round (set-up), the first gradient round, 5 iterations in, and in the
    objective-only pass right before the model is read. A restarted shard comes back
    without its rows, so each kill starts the fit over on fresh tensors; the rows are a
    function of their key and seed, the samples of seed and iteration, and two workers'
    sums add the same in either order, so the model is the clean fit's bit for bit."""
    from spark_ps.ml.classification import FMClassifier

    spark, ps = spark_ps
    rng = np.random.default_rng(3)
    n, d = 600, 30
    x = rng.normal(size=(n, d)) * (rng.uniform(size=(n, d)) < 0.2)
    y = (x[:, :5].sum(axis=1) + x[:, 5] * x[:, 6] > 0).astype(float)
    rows = [
        (float(y[i]), Vectors.sparse(d, {j: x[i, j] for j in np.flatnonzero(x[i])}))
        for i in range(n)
    ]
    df = spark.createDataFrame(rows, ["label", "features"]).cache()
    fm = FMClassifier(factorSize=4, maxIter=10, tol=0.0, seed=2, stepSize=0.05, numWorkers=2)
    clean = fm.fit(df)
    history = clean.summary().objectiveHistory  # a method, as pyspark's FM models have it
    assert len(history) == 11  # 10 steps + the objective-only pass
    before, models = ps.metrics(), set(ps.client.models())
    # attempt 3 runs grad rounds 1-6, attempt 4 rounds 7-17 (17: the objective-only pass)
    killed = kill_after({"dims": [0], "grad": [0, 6, 17]})
    faulted = fm.fit(df)
    assert len(killed) == 4
    _check_recovered(ps, before, models, 4, warm=False)
    np.testing.assert_array_equal(faulted.factors.toArray(), clean.factors.toArray())
    np.testing.assert_array_equal(faulted.linear.toArray(), clean.linear.toArray())
    assert faulted.intercept == clean.intercept
    assert faulted.summary().objectiveHistory == history
