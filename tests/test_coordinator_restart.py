"""Coordinator loss: `spark-ps-server coordinator` SIGKILLed mid-fit and started again at the
same address resumes from its journal in the checkpoint directory
(``ps_server.coordinator.journal``).

Real processes on loopback: the coordinator, two `spark-ps-server shards --join`
supervisors (hosts "h0" and "h1", one shard slot each) and a Spark local[2] fit whose PS is
that service. Without a checkpoint directory, or with a journal of other settings, the
restarted coordinator does what the README says.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from contextlib import ExitStack, contextmanager
from pathlib import Path

import numpy as np
import pytest
from test_lr_fit import _dense_df

from bench.netns import Hosts, _expect, _lines, unavailable
from ps_server.coordinator import journal
from ps_server.lifecycle import stop_processes
from spark_ps import PSContext
from spark_ps.client import PSClient
from spark_ps.client.spec import TensorSpec
from spark_ps.ml import _job
from spark_ps.ml.classification import LogisticRegression

pytestmark = pytest.mark.timeout(300)
TOKEN = "coordinator-restart-token"
ROOT = Path(__file__).resolve().parents[1]
LEASE = 4.0  # --host-timeout


def _env() -> dict:
    return dict(os.environ, SPARK_PS_TOKEN=TOKEN)


def _free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class Service:
    """The coordinator (restartable at its port) and two host supervisors: on loopback, or
    with `hosts`, each supervisor in its own network namespace and the coordinator on the
    bridge address of the root namespace."""

    def __init__(self, logs: Path, checkpoint_dir: str, hosts: Hosts | None = None) -> None:
        self.hosts_ns = hosts
        self.bind = hosts.bridge_address if hosts is not None else "127.0.0.1"
        self.logs, self.port = logs, _free_port(self.bind)
        self.address = f"{self.bind}:{self.port}"
        self.args = ["--checkpoint-dir", checkpoint_dir] if checkpoint_dir else []
        self.coordinator: subprocess.Popen | None = None
        self.starts = 0
        self.hosts: list[subprocess.Popen] = []

    def start_coordinator(self, *extra: str, wait: bool = True) -> subprocess.Popen:
        self.starts += 1
        log = open(self.logs / f"coordinator{self.starts}.log", "w")  # noqa: SIM115
        cmd = [sys.executable, "-m", "ps_server", "coordinator", "--host", self.bind,
               "--port", str(self.port),
               "--min-hosts", "2", "--host-timeout", str(LEASE), *self.args, *extra]  # fmt: skip
        self.coordinator = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=log, text=True, env=_env(), cwd=ROOT,
            stdin=subprocess.DEVNULL,
        )  # fmt: skip
        log.close()
        if wait:
            self.lines = _lines(self.coordinator.stdout)
            _expect(self.lines, "SPARK_PS_LISTENING ", 30, self.logs)
        return self.coordinator

    def ready(self) -> None:
        try:
            _expect(self.lines, "SPARK_PS_READY ", 60, self.logs)
        except RuntimeError:
            raise RuntimeError(self.log(self.starts)) from None

    def log(self, n: int) -> str:
        return (self.logs / f"coordinator{n}.log").read_text()

    def start_hosts(self) -> None:
        for i in range(2):
            log = open(self.logs / f"host{i}.log", "w")  # noqa: SIM115
            ns = self.hosts_ns
            me = ns.address(i) if ns is not None else "127.0.0.1"
            cmd = [sys.executable, "-m", "ps_server", "shards", "--join", self.address,
                   "--host", me, "--host-id", f"h{i}", "--shards", "1"]  # fmt: skip
            kw = dict(stderr=log, env=_env(), cwd=ROOT, stdin=subprocess.DEVNULL)
            self.hosts.append(
                ns.popen(i, cmd, **kw) if ns is not None else subprocess.Popen(cmd, **kw)
            )
            log.close()

    def kill_coordinator(self) -> None:
        self.coordinator.send_signal(signal.SIGKILL)
        self.coordinator.wait()

    def status(self) -> dict:
        done = subprocess.run(
            [sys.executable, "-m", "ps_server", "status", self.address],
            capture_output=True, text=True, timeout=60, env=_env(), cwd=ROOT,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    def stop(self) -> None:
        procs = [p for p in (self.coordinator, *self.hosts) if p is not None]
        if self.coordinator is not None and self.coordinator.poll() is None:
            self.coordinator.terminate()  # the hosts hear it and stop their shards
            try:
                self.coordinator.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        stop_processes(procs, grace=10)


@contextmanager
def _service(tmp_path: Path, checkpoint: bool = True, *extra: str, hosts: Hosts | None = None):
    ckpt = str(tmp_path / "ckpt") if checkpoint else ""
    svc = Service(tmp_path, ckpt, hosts)
    with ExitStack() as stack:
        stack.callback(svc.stop)
        svc.start_coordinator(*extra)
        svc.start_hosts()
        svc.ready()
        try:
            yield svc
        except BaseException:
            for f in sorted(tmp_path.glob("*.log")):
                print(f"---- {f.name}\n{f.read_text()[-4000:]}")
            raise


def _map(st: dict) -> tuple:
    """The shard map and hosts a status shows, without what moves by itself."""
    keys = ("index", "address", "host", "backup", "lost")
    parts = [tuple(p[k] for k in keys) for p in st["partitions"]]
    hosts = sorted((h["id"], h["address"], h["alive"], tuple(h["primaries"])) for h in st["hosts"])
    return parts, hosts


@pytest.mark.slow
@pytest.mark.parametrize("journaled", [True, False], ids=["journal", "no-checkpoint-dir"])
def test_coordinator_killed_mid_fit_restarts_and_the_fit_ends_with_the_clean_model(
    spark, tmp_path, monkeypatch, journaled
):
    """With a journal: the fit goes on and ends with the clean model bit for bit. Without a
    checkpoint directory the restarted coordinator is a new, empty PS: the fit sees every
    shard restart and recovers from the state its driver holds (as in
    tests/test_default_recovery.py), within the same tolerance."""
    with _service(tmp_path, journaled) as svc:
        previous, PSContext._active = PSContext._active, None
        ctx = PSContext.getOrCreate(address=svc.address, token=TOKEN)  # spark.ps.address
        try:
            _fit_through_a_restart(spark, svc, monkeypatch, journaled)
        finally:
            PSContext._active = previous
            ctx.client.close()


@pytest.mark.slow
def test_across_hosts_a_coordinator_killed_mid_fit_resumes_and_the_fit_is_the_clean_one(
    spark, tmp_path, monkeypatch
):
    """The same with each host a network namespace (its own address, reached over a
    bridge), the coordinator and the fit in the root namespace."""
    why = unavailable()
    if why:
        pytest.skip(why)
    with Hosts(2) as hosts, _service(tmp_path, True, hosts=hosts) as svc:
        st = svc.status()  # (the fit below checks the map is the same after the restart)
        assert {h["address"] for h in st["hosts"]} == {hosts.address(0), hosts.address(1)}
        previous, PSContext._active = PSContext._active, None
        ctx = PSContext.getOrCreate(address=svc.address, token=TOKEN)
        try:
            _fit_through_a_restart(spark, svc, monkeypatch, True)
        finally:
            PSContext._active = previous
            ctx.client.close()


def _fit_through_a_restart(spark, svc: Service, monkeypatch, journaled: bool) -> None:
    df = _dense_df(spark, n=600, d=6, seed=4)
    lr = LogisticRegression(maxIter=15, regParam=0.01, tol=0.0)
    clean = lr.fit(df)
    before = svc.status()
    assert sorted(h["id"] for h in before["hosts"]) == ["h0", "h1"]

    original, grads, restarted = _job.PSJob.command, [0], threading.Event()
    gone: list[float] = []
    fitted = threading.Event()

    def restart() -> None:  # while the driver collects and the workers answer round 4
        svc.kill_coordinator()
        gone.append(time.monotonic())
        time.sleep(1.0)  # clients meet a dead address meanwhile
        svc.start_coordinator(wait=False)
        svc.lines = _lines(svc.coordinator.stdout)
        svc.ready()
        gone.append(time.monotonic())
        restarted.set()
        fitted.wait(300)  # the coordinator dies with the thread that started it (pdeathsig)

    def command(self, name, **payload):
        r = original(self, name, **payload)
        if name == "grad":
            grads[0] += 1
            if grads[0] == 4:
                threading.Thread(target=restart, daemon=True).start()
        return r

    monkeypatch.setattr(_job.PSJob, "command", command)
    try:
        faulted = lr.fit(df)
        after = svc.status()
    finally:
        fitted.set()
    assert restarted.is_set() and grads[0] > 6  # killed mid-fit, which went on
    print(f"coordinator down (SIGKILL to ready again): {gone[1] - gone[0]:.2f}s")
    resumed = svc.log(svc.starts)
    assert ("coordinator resumed from" in resumed) == journaled, resumed[-3000:]
    if not journaled:
        _check_a_new_empty_ps(svc, before, after, faulted, clean)
        return

    # Nothing the fit computes went through a lost state: the shards kept every tensor, the
    # board and contributions were replayed, every sum is taken in part order. So the
    # model is the clean run's bit for bit (no rollback either: no shard restarted).
    np.testing.assert_array_equal(faulted.coefficients.toArray(), clean.coefficients.toArray())
    assert faulted.intercept == clean.intercept
    assert faulted.summary.objectiveHistory == clean.summary.objectiveHistory
    assert _map(after) == _map(before)  # the same processes, adopted, on the same hosts
    assert after["restarts"] == before["restarts"]
    assert after["counters"]["restart"] == before["counters"]["restart"] == 0
    assert after["epoch"] > before["epoch"]  # clients were told to re-read the map


def _until(predicate, what: str, timeout: float = 60.0):
    deadline = time.monotonic() + timeout
    while not (got := predicate()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)
    return got


def _with_backups(svc: Service) -> dict | None:
    """The status once every partition has an attached backup, else None."""
    st = svc.status()
    return st if all(p["backup"] for p in st["partitions"]) else None


@pytest.mark.slow
def test_replicas_are_adopted_and_a_primary_that_died_meanwhile_is_promoted(tmp_path):
    """With replicas=2: the restarted coordinator adopts both replicas of each partition;
    the primary SIGKILLed while the coordinator was down is reported by its host and its
    backup promoted: no update lost."""
    with _service(tmp_path, True, "--replicas", "2") as svc:
        restart = "--replicas", "2"
        c = PSClient(svc.address, TOKEN, retry_seconds=60, timeout=30)
        try:
            st = _until(lambda: _with_backups(svc), "both backups")
            spec = TensorSpec("replicated", "dense", 1000, 1, c.num_shards)
            c.create(spec)
            x = np.arange(1000.0)
            c.push(spec, np.arange(1000), x, "set")
            svc.kill_coordinator()
            victim = c.health()[0].pid  # shards serve while the coordinator is down
            os.kill(victim, signal.SIGKILL)
            svc.start_coordinator(*restart)
            svc.ready()
            c.push(spec, np.arange(1000), x)  # retried until partition 0 is promoted
            np.testing.assert_array_equal(c.pull(spec, np.arange(1000)), 2 * x)
            after = _until(lambda: _with_backups(svc), "a new backup of partition 0")
            old, new = st["partitions"], after["partitions"]
            assert new[0]["address"] == old[0]["backup"]  # promoted, not restarted
            assert new[0]["host"] == old[0]["backup_host"] != new[0]["backup_host"]
            where = ("address", "host", "backup", "backup_host")
            assert [new[1][k] for k in where] == [old[1][k] for k in where]  # adopted as it was
            assert after["counters"]["promotion"] == 1 and after["counters"]["restart"] == 0
            assert after["restarts"] == st["restarts"]
            for p, b in c.replica_digests():
                assert p.digest == b.digest
        finally:
            c.close()


def _check_a_new_empty_ps(svc: Service, before: dict, after: dict, faulted, clean) -> None:
    assert sorted(h["id"] for h in after["hosts"]) == ["h0", "h1"]  # the hosts rejoined
    old, new = _map(before)[0], _map(after)[0]
    assert {p[1] for p in new}.isdisjoint({p[1] for p in old})  # new shard processes
    assert after["restarts"] != before["restarts"]  # which every fit sees
    assert "stopping shard" in (svc.logs / "host0.log").read_text()
    np.testing.assert_allclose(
        faulted.coefficients.toArray(), clean.coefficients.toArray(), rtol=0, atol=1e-6
    )
    assert faulted.intercept == pytest.approx(clean.intercept, abs=1e-6)


def test_a_journal_of_other_settings_or_format_stops_the_coordinator_by_name(tmp_path):
    ckpt = tmp_path / "ckpt"
    j = journal.Journal(journal.journal_dir(str(ckpt)))
    j.start([{"t": "config", "partitions": 4, "replicas": 2}])
    j.close()
    svc = Service(tmp_path, str(ckpt))
    try:
        p = svc.start_coordinator("--replicas", "1", wait=False)
        assert p.wait(timeout=60) != 0
        said = svc.log(1)
        assert "4 partitions and --replicas 2; this coordinator was started with" in said
        assert os.path.exists(j.path)  # kept: it is the state of another PS
        with open(j.path, "r+b") as f:
            f.seek(len(journal.MAGIC))
            f.write((9).to_bytes(4, "little"))
        p = svc.start_coordinator(wait=False)
        assert p.wait(timeout=60) != 0
        assert "is journal format version 9" in svc.log(2)
    finally:
        svc.stop()
