"""PSContext lifecycle (no orphans) and executors pushing straight to the shards."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import psutil
import pytest

from spark_ps import PSContext, PSVector

_CHILD = textwrap.dedent(
    """
    import os, sys, time
    from spark_ps import PSContext
    ps = PSContext.getOrCreate(numShards=2)
    pids = [ps.process.pid] + [h.pid for h in ps.client.health()]
    print(" ".join(map(str, pids)), flush=True)
    mode = sys.argv[1]
    if mode == "stop":
        ps.stop()
    elif mode == "kill":
        os.kill(os.getpid(), 9)
    # "exit": fall off the end; atexit must stop the PS
    """
)


def _gone(pids, timeout=15.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        alive = [
            p
            for p in pids
            if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE
        ]
        if not alive:
            return True
        time.sleep(0.2)
    return False


@pytest.mark.parametrize("mode", ["stop", "exit", "kill"])
def test_embedded_ps_leaves_no_process_behind(mode):
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, mode], capture_output=True, text=True, timeout=90
    )
    pids = [int(p) for p in out.stdout.split()]
    assert len(pids) == 3, out.stderr  # the service and its two shards were running
    assert _gone(pids), f"orphans after {mode}: {pids}"


def _calls_of(fn, *args) -> list[str]:
    """Every Python and C function `fn(*args)` calls, as ``module:name``."""
    seen: list[str] = []

    def profile(frame, event, arg):
        if event == "call":
            seen.append(f"{frame.f_code.co_filename}:{frame.f_code.co_name}")
        elif event == "c_call":
            seen.append(
                f"{getattr(arg, '__module__', None) or type(arg.__self__).__name__}:{arg.__name__}"
            )

    sys.setprofile(profile)
    try:
        fn(*args)
    finally:
        sys.setprofile(None)
    return seen


def test_a_stop_signal_handler_takes_no_lock():
    """A handler runs on the main thread between two bytecodes, possibly inside a lock that
    thread holds (a previous handler's Event.set was one): it must not take any."""
    import threading

    from ps_server.lifecycle import StopSignals

    signals = StopSignals()
    calls = _calls_of(signals.handle, signal.SIGTERM, None)
    assert not [c for c in calls if "threading" in c or "acquire" in c or "lock" in c], calls
    assert signals and signals.received == [signal.SIGTERM] and not StopSignals()
    event = threading.Event()  # what the handlers did before: caught by the same check
    assert [c for c in _calls_of(event.set) if "acquire" in c or "threading" in c]


_HOLDER = textwrap.dedent(
    """
    import sys, time
    from spark_ps import PSContext
    ps = PSContext.getOrCreate(numShards=2)
    print(" ".join(map(str, [ps.process.pid] + [h.pid for h in ps.client.health()])), flush=True)
    time.sleep(120)
    """
)


def test_the_service_and_shards_stop_under_a_storm_of_sigterms():
    """Hundreds of SIGTERMs at once (each runs the handler again, possibly inside the one
    before it): the service still stops its shards and exits. Its own PS, in a child that
    outlives the storm (the session's PS is not touched)."""
    child = subprocess.Popen(
        [sys.executable, "-c", _HOLDER], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
    )
    try:
        pids = [int(p) for p in child.stdout.readline().split()]
        assert len(pids) == 3
        for _ in range(300):
            try:
                os.kill(pids[0], signal.SIGTERM)
            except ProcessLookupError:
                break
        assert _gone(pids, timeout=30), f"left alive: {pids}"
        assert child.poll() is None  # the PS stopped on the signals, not with its parent
    finally:
        child.kill()
        child.wait()


def test_stopping_spark_context_is_wired_to_the_ps(spark_ps):
    spark, ps = spark_ps
    assert getattr(spark.sparkContext.stop, "_spark_ps", False)
    assert ps.embedded and ps.num_shards == 2


def test_executors_increment_a_2pow40_sparse_vector_exactly(spark_ps):
    spark, ps = spark_ps
    w = PSVector.sparse(dim=2**40)
    n_parts, per_part = 4, 5000

    def work(index, rows):
        rng = np.random.default_rng(index)
        keys = rng.integers(0, 2**40, size=per_part)
        keys[: per_part // 10] = index  # collisions across and within partitions
        w.increment(keys, rng.integers(-1000, 1000, size=per_part).astype(np.float64))
        yield os.getpid()

    pids = (
        spark.sparkContext.parallelize(range(n_parts), n_parts)
        .mapPartitionsWithIndex(work)
        .collect()
    )
    assert os.getpid() not in pids  # the pushes came from executor Python workers
    all_keys, all_vals = [], []
    for index in range(n_parts):
        rng = np.random.default_rng(index)
        keys = rng.integers(0, 2**40, size=per_part)
        keys[: per_part // 10] = index
        all_keys.append(keys)
        all_vals.append(rng.integers(-1000, 1000, size=per_part).astype(np.float64))
    keys = np.concatenate(all_keys)
    vals = np.concatenate(all_vals)
    uniq, inv = np.unique(keys, return_inverse=True)
    expect = np.zeros(uniq.size)
    for i in range(keys.size):  # plain reference, in the same per-key order as the PS sums
        expect[inv[i]] += vals[i]
    # integer-valued floats: sums are exact in any order, so the check can be exact
    np.testing.assert_array_equal(w.pull(uniq), expect)
    k, _ = w.pull()
    np.testing.assert_array_equal(k, uniq)


@pytest.mark.slow
def test_shard_sigkill_is_restarted_and_clients_retry():
    ps = PSContext.start(numShards=2)  # a PS of its own: we are about to break it
    try:
        _kill_and_retry(ps)
    finally:
        ps.stop()


def _kill_and_retry(ps):
    w = PSVector.dense(1000, context=ps)
    w.increment(np.arange(1000), np.ones(1000))
    victim = ps.client.health()[1].pid
    os.kill(victim, signal.SIGKILL)
    # the restarted shard has no checkpoint: the model is gone there, and the error says so
    deadline = time.monotonic() + 30
    while True:
        try:
            w.pull(np.arange(10))
            break
        except Exception:  # noqa: BLE001 - shard 0 answers; shard 1 is restarting
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    assert victim not in [h.pid for h in ps.client.health()]
    with pytest.raises(Exception, match="unknown model"):
        w.pull(np.arange(1000))


def test_context_registers_the_executor_listener(spark_ps):
    """getOrCreate(spark) hooks the bridge's listener into the live SparkContext."""
    from spark_ps.ml.export import bridge_jar

    spark, ps = spark_ps
    if not bridge_jar().is_file():
        pytest.skip("the JVM bridge jar is not built (scripts/build_jar.sh)")
    listeners = spark.sparkContext._jsc.sc().listenerBus().listeners()
    names = [listeners.get(i).getClass().getName() for i in range(listeners.size())]
    assert "io.sparkps.bridge.ExecutorListener" in names, names
