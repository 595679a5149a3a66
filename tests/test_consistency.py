"""BSP, SSP(s) and ASP: the coordinator's clock log proves the staleness bound.

Real PS processes and real Spark: mini-batch LR fits run their workers on a barrier
stage and tick one coordinator clock per mini-batch; every released clock call is logged
with the slowest live worker's clock at that moment.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from pyspark.ml.linalg import Vectors

from spark_ps.client import PSClient
from spark_ps.ml.classification import LogisticRegression

pytestmark = pytest.mark.timeout(300)


def _entries(client, group):
    return [e for e in client.clock_log(group) if e.group == group]


def test_fast_worker_is_held_to_the_bound_and_a_removed_worker_releases_it(ps):
    """3 workers, staleness 2: `fast` never waits on itself, `slow` sleeps per clock and
    `dead` stops at clock 2; once `dead` is removed, the other two finish."""
    group, s, last = "ssp-threads", 2, 8
    progress: dict[str, int] = {}

    def run(worker, delay, stop_at):
        c = PSClient(ps.address, ps.token)
        for clock in range(1, stop_at + 1):
            time.sleep(delay)
            c.clock(group, worker, clock, staleness=s, num_workers=3, timeout=60)
            progress[worker] = clock
        c.close()

    threads = [
        threading.Thread(target=run, args=("fast", 0.0, last)),
        threading.Thread(target=run, args=("slow", 0.05, last)),
        threading.Thread(target=run, args=("dead", 0.0, 2)),
    ]
    for t in threads:
        t.start()
    time.sleep(1.5)
    # dead stopped at 2: nobody may pass clock 2 + s = 4
    assert progress["fast"] == 4 and progress["slow"] == 4 and threads[0].is_alive()
    ps.client.remove_worker(group, "dead")
    for t in threads:
        t.join(30)
    assert progress == {"fast": last, "slow": last, "dead": 2}
    log = _entries(ps.client, group)
    assert len(log) == 2 * last + 2
    assert all(e.clock - e.min_clock <= s for e in log)
    assert max(e.clock - e.min_clock for e in log) == s  # fast really ran ahead to the bound


def _data(spark, n=2400, d=120, seed=4):
    rng = np.random.default_rng(seed)
    beta = rng.normal(size=d)
    rows = []
    for _ in range(n):  # test data construction, not a hot path
        idx = np.sort(rng.choice(d, size=8, replace=False))
        val = rng.uniform(0.5, 2.0, 8)
        p = 1 / (1 + np.exp(-(beta[idx] @ val)))
        rows.append((float(rng.uniform() < p), Vectors.sparse(d, idx.tolist(), val.tolist())))
    return spark.createDataFrame(rows, ["label", "features"]).repartition(2).cache()


@pytest.fixture(scope="module")
def data(spark_ps):
    spark, _ = spark_ps
    df = _data(spark)
    df.count()
    yield df
    df.unpersist()


def _fit(ps, df, staleness):
    before = len(ps.client.clock_log("job-"))
    model = LogisticRegression(
        solver="sgd",
        stepSize=0.5,
        batchSize=100,
        maxIter=3,
        tol=0.0,
        regParam=0.001,
        staleness=staleness,
    ).fit(df)
    return model, ps.client.clock_log("job-")[before:]


@pytest.mark.slow  # three fits: ~15 s each on a loaded 2-core machine
def test_a_clock_waits_for_every_worker_not_all_but_one(ps):
    """BSP (staleness 0) over 3 workers: after two of them clock 1, neither is released
    until the third clocks too; then all three are, each seeing min clock 1."""
    group = "bsp-all-three"
    released: dict[str, int] = {}

    def tick(worker: str) -> None:
        c = PSClient(ps.address, ps.token)
        try:
            released[worker] = c.clock(group, worker, 1, staleness=0, num_workers=3, timeout=30)
        finally:
            c.close()

    first = [threading.Thread(target=tick, args=(w,)) for w in ("a", "b")]
    for t in first:
        t.start()
    time.sleep(1.5)  # two of three have clocked: nobody may be released yet
    assert released == {}
    tick("c")
    for t in first:
        t.join(30)
    assert released == {"a": 1, "b": 1, "c": 1}
    assert sorted(e.worker for e in _entries(ps.client, group)) == ["a", "b", "c"]


def test_bsp_ssp_and_asp_fits_keep_their_bounds_and_learn_alike(spark_ps, data):
    _, ps = spark_ps
    bsp, bsp_log = _fit(ps, data, 0)
    ssp, ssp_log = _fit(ps, data, 2)
    asp, asp_log = _fit(ps, data, -1)
    # ~1200 rows per worker / 100 per batch = ~12 clocks (+ the join) per worker per epoch
    assert len(bsp_log) >= 3 * 2 * 10 and len(ssp_log) >= 3 * 2 * 10
    assert all(e.clock == e.min_clock and e.staleness == 0 for e in bsp_log)  # lock-step
    assert all(e.clock - e.min_clock <= 2 and e.staleness == 2 for e in ssp_log)
    assert len({e.group for e in ssp_log}) == 3  # one clock table per epoch
    assert asp_log == []  # ASP never waits
    auc = {k: m.summary.areaUnderROC for k, m in (("bsp", bsp), ("ssp", ssp), ("asp", asp))}
    assert auc["bsp"] > 0.85, auc
    assert abs(auc["ssp"] - auc["bsp"]) < 0.01 and abs(auc["asp"] - auc["bsp"]) < 0.01, auc
    for m in (bsp, ssp, asp):
        hist = m.summary.objectiveHistory
        assert len(hist) == 3 and hist[-1] < hist[0]


def test_bsp_fits_repeat_to_rounding_whatever_the_workers_speeds(spark_ps, data):
    """BSP is lock-step: every worker reads step c's weights before any pushes its step-c
    update (a second tick per mini-batch, after the pull), so each step sees exactly the
    updates of the steps before it. Two fits then differ only by the order in which two
    workers' pushes are added on the shards (rounding, ~1e-16 relative per step). Without
    the pull tick a worker released at clock c could pull after a faster one pushed step
    c+1, and two fits differed by ~0.01 in a coefficient; a worker ticking one clock
    behind does the same."""
    _, ps = spark_ps
    first, log = _fit(ps, data, 0)
    second, _ = _fit(ps, data, 0)
    np.testing.assert_allclose(
        second.coefficients.toArray(), first.coefficients.toArray(), rtol=1e-9, atol=1e-12
    )
    assert second.intercept == pytest.approx(first.intercept, rel=1e-9, abs=1e-12)
    # per worker and epoch: odd clocks after its pulls, even ones after its pushes, in order
    for group in {e.group for e in log}:
        for worker in {e.worker for e in log if e.group == group}:
            clocks = [e.clock for e in log if e.group == group and e.worker == worker]
            assert clocks == list(range(len(clocks))), clocks[:8]  # 0 (the join), 1, 2, ...


def test_bsp_needs_every_worker_running_at_once(spark_ps, data):
    """More workers than task slots: refused before any work reaches the PS."""
    _, ps = spark_ps
    models = ps.client.models()
    with pytest.warns(RuntimeWarning, match="exceeds the 2 task slots"):
        with pytest.raises(ValueError, match=r"staleness=0 \(BSP\) needs every worker running"):
            LogisticRegression(solver="adam", numWorkers=3).fit(data)
    assert ps.client.models() == models
