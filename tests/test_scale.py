"""Scale out and in while the PS serves (``ps_server.coordinator.migrate``): a host that joins takes
~1/N of the partitions, `spark-ps-server drain` empties one before it is retired.

The planning is pure and checked here directly; the moves run on real processes: hosts
on loopback (no root needed) under a stream of exactly-countable pushes, and network-
namespace hosts (``bench/netns.py``) under a Spark LogisticRegression fit.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from bench.netns import Hosts, join, service, unavailable
from ps_server.coordinator import migrate, placement
from ps_server.coordinator.host_service import HostService
from ps_server.coordinator.status import status
from spark_ps.client import PSClient
from spark_ps.client.spec import TensorSpec

pytestmark = pytest.mark.timeout(300)
_WHY = unavailable()
needs_hosts = pytest.mark.skipif(bool(_WHY), reason=_WHY or "-")

TOKEN = "scale-test-token"
ROOT = Path(__file__).resolve().parents[1]
LEASE = 4.0  # --host-timeout (see tests/test_hosts.py)


def _env() -> dict:
    return dict(os.environ, SPARK_PS_TOKEN=TOKEN)


# ---------------------------------------------------------------- planning
def _apply(slots: list[placement.Slot], moves: list[migrate.Move]) -> list[placement.Slot]:
    out = list(slots)
    for m in moves:
        s = out[m.partition]
        if m.role == "primary":
            backup = m.backup_to if m.backup_to or not s.backup else s.backup
            out[m.partition] = placement.Slot(m.to_host, backup)
        else:
            out[m.partition] = placement.Slot(s.primary, m.to_host)
    return out


@pytest.mark.parametrize("n", [1200, 7])
def test_a_joining_host_takes_its_share_from_the_others_and_nothing_else_moves(n):
    old = {"h1": 1.0, "h2": 1.0, "h3": 1.0}
    slots = placement.place(n, old)
    weights = {**old, "h4": 1.0}
    moves = migrate.plan_join(slots, weights, "h4")
    assert {m.to_host for m in moves} == {"h4"} and {m.role for m in moves} == {"primary"}
    assert len({m.partition for m in moves}) == len(moves)
    assert n // 4 <= len(moves) <= placement.capacity(weights, n)["h4"]  # ~1/N, bounded
    if n == 1200:  # its rendezvous choices alone, within a few percent of 1/4
        assert 0.23 <= len(moves) / n <= 0.27
        assert all(m.from_host == slots[m.partition].primary for m in moves)
        assert min(Counter(m.from_host for m in moves).values()) > 0.2 * len(moves)


def test_with_backups_a_join_moves_both_kinds_and_never_pairs_them_on_one_host():
    slots = placement.place(12, {"a": 1.0, "b": 1.0}, replicas=2)
    moves = migrate.plan_join(slots, {"a": 1.0, "b": 1.0, "c": 1.0}, "c", replicas=2)
    roles = Counter(m.role for m in moves)
    assert roles == {"primary": 4, "backup": 4}  # a third of each
    after = _apply(slots, moves)
    assert all(s.primary != s.backup and s.backup for s in after)
    assert sum(s.primary == "c" for s in after) == 4


def test_a_drain_empties_the_host_promoting_backups_where_there_are():
    weights = {"a": 1.0, "b": 1.0, "c": 1.0}
    slots = placement.place(9, weights, replicas=2)
    rest = {"a": 1.0, "c": 1.0}
    moves = migrate.plan_drain(slots, rest, "b", replicas=2)
    on_b = [p for p, s in enumerate(slots) if "b" in (s.primary, s.backup)]
    assert sorted(m.partition for m in moves) == on_b
    for m in moves:
        s = slots[m.partition]
        if m.role == "primary":  # a hand-over to its backup: no copy to make
            assert m.to_host == s.backup and m.backup_to not in ("", m.to_host, "b")
    after = _apply(slots, moves)
    assert all("b" not in (s.primary, s.backup) and s.primary != s.backup for s in after)


def test_a_drain_the_others_cannot_hold_is_refused_naming_why():
    slots = placement.place(4, {"a": 1.0, "b": 1.0}, replicas=2)
    with pytest.raises(ValueError, match=r"cannot drain host 'b': 1 other live host\(s\) \(a\)"):
        migrate.plan_drain(slots, {"a": 1.0}, "b", replicas=2)
    with pytest.raises(ValueError, match=r"'a': 0 other live host\(s\) \(none\)"):
        migrate.plan_drain(placement.place(4, {"a": 1.0}), {}, "a")


def test_moves_run_one_at_a_time_and_a_drained_target_s_are_cancelled():
    slots = placement.place(6, {"a": 1.0, "b": 1.0})
    moves = migrate.Moves()
    join = migrate.plan_join(slots, {"a": 1.0, "b": 1.0, "c": 1.0}, "c")
    moves.add(join)
    moves.add(join)  # their partitions are busy: not planned twice
    assert len(moves.messages()) == len(join) == 2
    first, second = (m.partition for m in join)
    running = moves.take(first)
    assert running is not None and moves.take(second) is None  # one at a time
    moves.cancel("c")  # the one running goes on, the planned one does not
    assert [m.state for m in moves.messages()] == ["moving", "cancelled"]
    moves.finish(running, "seed failed")
    assert moves.messages()[0].error == "seed failed" and not moves.pending("join c")
    assert moves.partitions("join c") == {first, second}


# ---------------------------------------------------------------- hosts on loopback
def _supervisor(address: str, host_id: str, *args: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "ps_server", "shards", "--join", address, "--host",
           "127.0.0.1", "--host-id", host_id, *(args or ("--shards", "3"))]  # fmt: skip
    return subprocess.Popen(cmd, env=_env(), cwd=ROOT, stdin=subprocess.DEVNULL)


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "ps_server", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=_env(),
        cwd=ROOT,
    )


def _wait(predicate, what: str, timeout: float = 60.0):
    deadline = time.monotonic() + timeout
    while True:
        got = predicate()
        if got:
            return got
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def _moves_done(address: str, reason: str) -> dict | None:
    st = status(address, TOKEN)
    mine = [m for m in st["moves"] if m["reason"] == reason]
    return st if mine and all(m["state"] in ("done", "failed") for m in mine) else None


class _Pusher:
    """Pushes random integer increments until stopped; `expect` is their exact sum."""

    def __init__(self, client: PSClient, spec: TensorSpec) -> None:
        self.client, self.spec = client, spec
        self.expect, self.pushes, self.error = np.zeros(spec.dim), 0, None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        rng = np.random.default_rng(5)
        try:
            while not self._stop.is_set():
                keys = np.sort(rng.choice(self.spec.dim, 500, replace=False))
                values = rng.integers(-9, 10, 500).astype(np.float64)
                self.client.push(self.spec, keys, values)
                self.expect[keys] += values
                self.pushes += 1
        except Exception as e:  # noqa: BLE001 - reported by stop()
            self.error = e

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(60)
        assert self.error is None, f"a push failed during the moves: {self.error!r}"


@pytest.mark.slow
def test_join_and_drain_on_loopback_lose_no_update_with_backups(tmp_path):
    """replicas=2: primaries move by way of a copy (join) and by promotion (drain)."""
    svc = HostService(partitions=6, token=TOKEN, host_timeout=LEASE, replicas=2, min_hosts=2)
    runner = threading.Thread(target=lambda: (svc.start(), svc.supervise()), daemon=True)
    runner.start()
    hosts = {h: _supervisor(svc.address, h) for h in ("a", "b")}
    client = None
    try:
        _wait(lambda: svc.coordinator.ready() and all(svc.backup_addr), "the backups")
        client = PSClient(svc.address, TOKEN, retry_seconds=60, timeout=30)
        spec = TensorSpec("scale", "dense", 6000, 1, client.num_shards)
        client.create(spec)
        pusher = _Pusher(client, spec)
        _wait(lambda: pusher.pushes > 20, "the first pushes")
        hosts["c"] = _supervisor(svc.address, "c")
        st = _wait(lambda: _moves_done(svc.address, "join c"), "the join's moves")
        moves = [m for m in st["moves"] if m["reason"] == "join c"]
        assert {m["state"] for m in moves} == {"done"}, moves
        assert Counter(m["role"] for m in moves) == {"primary": 2, "backup": 2}
        on_c = next(h for h in st["hosts"] if h["id"] == "c")
        assert len(on_c["primaries"]) == 2 and len(on_c["backups"]) == 2  # a third of each

        done = _cli("drain", svc.address, "b")  # waits until b is empty and told to stop
        assert done.returncode == 0, done.stderr
        report = json.loads(done.stdout)
        assert report["retired"] and {m["state"] for m in report["moves"]} == {"done"}
        pusher.stop()
        assert pusher.pushes > 40
        np.testing.assert_array_equal(client.pull(spec, np.arange(spec.dim)), pusher.expect)
        st = status(svc.address, TOKEN)
        b = next(h for h in st["hosts"] if h["id"] == "b")
        assert b["retired"] and b["primaries"] == b["backups"] == []
        assert st["counters"]["restart"] == 0 and st["counters"]["promotion"] == 0
        assert st["counters"]["handover"] == sum(
            m["role"] == "primary" for m in st["moves"] if m["state"] == "done"
        )
        assert hosts["b"].wait(timeout=30) == 0  # told to stop, it stopped
        _wait(lambda: all(svc.backup_addr), "the new backups")
        pairs = client.replica_digests()
        assert all(bk is not None and pr.digest == bk.digest for pr, bk in pairs)
        for p in status(svc.address, TOKEN)["partitions"]:
            assert p["host"] in ("a", "c") and p["backup_host"] in ("a", "c"), p
            assert p["host"] != p["backup_host"], p
    finally:
        if client is not None:
            client.close()
        svc.stop_event.set()
        runner.join(30)
        for p in hosts.values():
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def test_drain_refuses_an_unknown_host_and_one_the_others_cannot_hold():
    svc = HostService(partitions=2, token=TOKEN, host_timeout=LEASE)
    runner = threading.Thread(target=lambda: (svc.start(), svc.supervise()), daemon=True)
    runner.start()
    host = _supervisor(svc.address, "only", "--shards", "2")
    try:
        _wait(svc.coordinator.ready, "both partitions")
        done = _cli("drain", svc.address, "nowhere")
        assert done.returncode != 0
        assert "drain: no live host 'nowhere'; live hosts: only" in done.stderr
        done = _cli("drain", svc.address, "only")
        assert done.returncode != 0
        assert "cannot drain host 'only': 0 other live host(s) (none)" in done.stderr
        assert host.poll() is None  # refused: it still serves
        assert status(svc.address, TOKEN)["moves"] == []
    finally:
        svc.stop_event.set()
        runner.join(30)
        try:
            host.wait(timeout=15)
        finally:
            if host.poll() is None:
                host.kill()
                host.wait()


def test_a_model_larger_than_one_host_s_budget_trains_on_three_and_no_drain_squeezes_it():
    """3 hosts x 1 shard x 4 MB: a 9.6 MB model fits on the three together (3.2 MB each);
    draining one would leave 8 MB of budget for it, and is refused saying so."""
    svc = HostService(token=TOKEN, host_timeout=LEASE, min_hosts=3)
    runner = threading.Thread(target=lambda: (svc.start(), svc.supervise()), daemon=True)
    runner.start()
    cmd = ["--shards", "1", "--shard-memory-mb", "4"]
    hosts = [_supervisor(svc.address, h, *cmd) for h in ("x", "y", "z")]
    client = None
    try:
        _wait(lambda: svc.coordinator.ready() and svc.num_shards == 3, "three partitions")
        client = PSClient(svc.address, TOKEN, retry_seconds=30, timeout=30)
        spec = TensorSpec("big", "dense", 1_200_000, 1, client.num_shards)
        client.create(spec)
        x = np.arange(spec.dim, dtype=np.float64)
        client.push(spec, np.arange(spec.dim), x, "set")
        np.testing.assert_array_equal(client.pull(spec, np.arange(spec.dim)), x)
        st = status(svc.address, TOKEN)
        assert st["bytes"] > 4 * 2**20 * 2  # more than two hosts' budgets, let alone one's
        assert [h["memory_mb"] for h in st["hosts"]] == [4.0] * 3
        done = _cli("drain", svc.address, "y")
        assert done.returncode != 0
        assert "cannot drain host 'y': the other live hosts' memory budgets" in done.stderr
        assert "sum to 8.0 MB, and the partitions' 1 replica(s) hold 9.2 MB" in done.stderr
        assert status(svc.address, TOKEN)["moves"] == []
    finally:
        if client is not None:
            client.close()
        svc.stop_event.set()
        runner.join(30)
        for p in hosts:
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


# ---------------------------------------------------------------- a Spark fit, across hosts
@pytest.fixture(scope="module")
def ctr(spark):
    from bench.datagen import synthetic_ctr

    df = synthetic_ctr(spark, 20_000, 14, seed=3, partitions=2).cache()
    df.count()
    yield df
    df.unpersist()


def _fit(spark, df, address: str) -> tuple[np.ndarray, float]:
    from spark_ps import PSContext
    from spark_ps.ml.classification import LogisticRegression

    # the service's context, not an embedded PS an earlier test of this process left active
    previous, PSContext._active = PSContext._active, None
    ps = PSContext.getOrCreate(spark, address=address, token=TOKEN)
    try:
        est = LogisticRegression(maxIter=100, regParam=0.01, standardization=False, tol=0.0)
        model = est.fit(df)
    finally:
        ps.stop()  # an external service: only this process's connection closes
        PSContext._active = previous
    return np.append(model.coefficients.toArray(), model.intercept), time.monotonic()


class _HoldAt(logging.Handler):
    """Holds one thread when it logs iteration `at` of a fit until `go` is set: the fit
    works on while a test's step runs, and is certain to end after the step, however fast
    the fit or slow the step (iteration logs: spark_ps.ml._progress.Progress.update, whose
    args are name, unit, done, total, ...). `held_at`: when it first held the thread."""

    def __init__(self, thread: threading.Thread, at: int) -> None:
        super().__init__(logging.INFO)
        self.thread, self.at, self.go = thread, at, threading.Event()
        self.held_at: float | None = None

    def handle(self, record: logging.LogRecord) -> bool:  # (no handler lock: others log on)
        args = record.args
        if (
            threading.current_thread() is self.thread
            and isinstance(args, tuple)
            and len(args) >= 4
            and isinstance(args[2], (int, np.integer))
            and args[2] >= self.at
        ):
            if self.held_at is None:
                self.held_at = time.monotonic()
            self.go.wait(240)
        return True

    def emit(self, record: logging.LogRecord) -> None:
        pass


class _Fit:
    """A fit on a thread, as a context: `.started()` once its tensors exist on the PS; it
    waits at iteration `HOLD_AT` until `.done()` (or leaving the context, which also
    waits for it: a failed test leaves no fit behind to run into a later one)."""

    HOLD_AT = 90  # of maxIter 100 (tol 0)

    def __init__(self, spark, df, address: str) -> None:
        self.address, self.result, self.error = address, None, None
        self.thread = threading.Thread(target=self._run, args=(spark, df), daemon=True)
        self.hold = _HoldAt(self.thread, self.HOLD_AT)
        self.logger = logging.getLogger("spark_ps.progress")
        self.level = self.logger.level
        self.logger.setLevel(logging.INFO)
        self.logger.addHandler(self.hold)
        self.thread.start()

    def __enter__(self) -> _Fit:
        return self

    def __exit__(self, *exc) -> None:
        self.hold.go.set()
        self.thread.join(240)
        self.logger.removeHandler(self.hold)
        self.logger.setLevel(self.level)

    def _run(self, spark, df) -> None:
        try:
            self.result = _fit(spark, df, self.address)
        except Exception as e:  # noqa: BLE001 - raised by done()
            self.error = e

    def started(self) -> bool:
        assert self.thread.is_alive() or self.result is not None, self.error
        return bool(status(self.address, TOKEN)["models"])

    def done(self, step_began: float) -> tuple[np.ndarray, float]:
        """The fit's result, once it is let past its hold; asserts that it was still working
        when the test's step began at `step_began` (it reached the hold after that)."""
        self.hold.go.set()
        self.thread.join(240)
        assert self.error is None, f"the fit failed: {self.error!r}"
        assert self.result is not None, "the fit did not finish in 240 s"
        held = self.hold.held_at
        assert held is not None, f"the fit never reached iteration {self.HOLD_AT}"
        assert held > step_began, "the fit was waiting at its hold before the step began"
        return self.result


@needs_hosts
@pytest.mark.slow
def test_a_fit_goes_on_while_a_host_joins_and_another_is_drained(tmp_path, spark, ctr):
    """2 hosts serve a fit; a 3rd joins mid-fit and takes a third of the partitions; in
    the next fit the first host is drained and stops. Both fits end with the model of a
    fit that nothing disturbed: a move copies a partition's state bit for bit and
    reorders no operation, so the fits do the same float operations in the same order;
    the tolerance (1e-12 relative) only spares the comparison the last bits."""
    args = ["--host-timeout", str(LEASE)]
    with (
        Hosts(3) as hosts,
        service(hosts, tmp_path, TOKEN, shards=3, joined=2, coordinator_args=args) as svc,
    ):
        try:
            _join_and_drain_under_fits(spark, ctr, hosts, svc)
        except BaseException:  # the service's own words, for a failure seen once under load
            for f in sorted(tmp_path.glob("*.log")):
                said = [ln for ln in f.read_text().splitlines() if "WARNING" in ln or "ERROR" in ln]
                print(f"---- {f.name}\n" + "\n".join(said[-40:]))
            raise


def _join_and_drain_under_fits(spark, ctr, hosts, svc) -> None:
    t = time.monotonic()
    clean, _ = _fit(spark, ctr, svc.address)
    print(f"clean fit: {time.monotonic() - t:.1f}s")

    with _Fit(spark, ctr, svc.address) as fit:  # held at an iteration until the moves end
        _wait(fit.started, "the fit to start", timeout=120)
        t0 = time.monotonic()
        join(svc, 2, TOKEN, shards=3)
        new = hosts.address(2)
        st = _wait(lambda: _moves_done(svc.address, f"join {new}"), "the join's moves")
        joined_at = time.monotonic()
        coefficients, ended = fit.done(step_began=t0)  # the moves began as the fit ran
    np.testing.assert_allclose(coefficients, clean, rtol=1e-12, atol=1e-15)
    moves = [m for m in st["moves"] if m["reason"] == f"join {new}"]
    assert {m["state"] for m in moves} == {"done"}, moves
    on_new = next(h for h in st["hosts"] if h["id"] == new)["primaries"]
    fraction = len(on_new) / len(st["partitions"])
    assert 0.25 <= fraction <= 0.4, st["hosts"]  # 6 partitions, 3 hosts: 2 of them
    assert sorted(on_new) == sorted(m["partition"] for m in moves)
    print(
        f"join: {ended - joined_at:.1f}s of the fit left after the moves; "
        f"{fraction:.2f} of the partitions moved to the new host, "
        f"{joined_at - t0:.1f}s from its start to the last move's end; moves "
        + ", ".join(f"{m['seconds']:.2f}s" for m in moves)
    )
    counters = st["counters"]
    assert counters["restart"] == 0 and counters["promotion"] == 0  # none restarted empty

    with _Fit(spark, ctr, svc.address) as fit:
        _wait(fit.started, "the fit to start", timeout=120)
        gone = hosts.address(0)
        began = time.monotonic()
        report = json.loads(_check(_cli("drain", svc.address, gone, "--timeout", "120")).stdout)
        drained_at = time.monotonic()
        coefficients, ended = fit.done(step_began=began)  # the drain began as the fit ran
    print(f"drain: {ended - drained_at:.1f}s of the fit left after it")
    np.testing.assert_allclose(coefficients, clean, rtol=1e-12, atol=1e-15)
    assert report["retired"] and report["moves"], report
    assert {m["state"] for m in report["moves"]} == {"done"}
    st = status(svc.address, TOKEN)
    host = next(h for h in st["hosts"] if h["id"] == gone)
    assert host["retired"] and host["primaries"] == host["backups"] == []
    assert all(p["host"] != gone for p in st["partitions"])
    assert svc.supervisors[0].wait(timeout=30) == 0  # told to stop, it stopped
    assert st["counters"]["restart"] == 0 and st["counters"]["promotion"] == 0


def _check(done: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert done.returncode == 0, done.stderr
    return done
