"""The PS across hosts: a coordinator in the root namespace, one `shards --join` supervisor
per host (a network namespace, ``bench/netns.py``), a client in the root namespace; and, on
loopback without root, the checks that need no separate network stacks.

Real processes, real separate network stacks; every test tears its namespaces and
processes down, also when it fails.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import grpc
import numpy as np
import pytest

from bench.netns import Hosts, service, unavailable
from ps_server.coordinator.host_service import HostService
from ps_server.host.supervisor import HostSupervisor
from ps_server.proto import ps_pb2 as pb
from ps_server.proto import ps_pb2_grpc as pb_grpc
from ps_server.wire import TOKEN_KEY
from spark_ps.client import PSClient, PSError
from spark_ps.client.spec import TensorSpec

_WHY = unavailable()
pytestmark = pytest.mark.timeout(120)
needs_hosts = pytest.mark.skipif(bool(_WHY), reason=_WHY or "-")

TOKEN = "hosts-test-token"
ROOT = Path(__file__).resolve().parents[1]
# --host-timeout: a killed host is lost after this. Not shorter: on a loaded machine (2
# cores shared, load ~10) a live supervisor must not miss a whole lease.
LEASE = 4.0


@dataclass
class Cluster:
    hosts: Hosts
    address: str
    client: PSClient
    logs: Path
    supervisors: list[subprocess.Popen]
    tls: list[str]  # the TLS flags of every command ([] = plaintext)

    def status(self) -> dict:
        done = subprocess.run(
            [sys.executable, "-m", "ps_server", "status", self.address, *self.tls],
            capture_output=True,
            text=True,
            timeout=30,
            env=_env(),
            cwd=ROOT,
        )
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    def host_of(self, host_id: str) -> int:
        return [self.hosts.address(i) for i in range(len(self.hosts))].index(host_id)


def _env() -> dict:
    return dict(os.environ, SPARK_PS_TOKEN=TOKEN)


@contextmanager
def _cluster(
    tmp_path: Path, n: int, replicas: int, *extra: str, tls: bool = False
) -> Iterator[Cluster]:
    """`n` hosts with 2 shard slots each (2n partitions) and their coordinator."""
    with Hosts(n) as hosts:
        ips = [hosts.bridge_address, *map(hosts.address, range(n))]
        tls_args = _certificate(tmp_path, ips) if tls else []
        coordinator_args = ["--replicas", str(replicas), "--host-timeout", str(LEASE), *extra]
        with service(
            hosts, tmp_path, TOKEN, coordinator_args=coordinator_args, common_args=tls_args
        ) as svc:
            ca = Path(tls_args[1]).read_bytes() if tls else None
            client = PSClient(svc.address, TOKEN, retry_seconds=60, timeout=30, tls_ca=ca)
            try:
                yield Cluster(hosts, svc.address, client, tmp_path, svc.supervisors, tls_args)
            except BaseException:
                _print_logs(tmp_path)  # shown with the failure
                raise
            finally:
                client.close()


def _print_logs(d: Path) -> None:
    for log in sorted(d.glob("*.log")):
        print(f"---- {log.name} (last 4000 characters)\n{log.read_text()[-4000:]}")


def _certificate(d: Path, ips: list[str]) -> list[str]:
    """A self-signed certificate for `ips`, as the flags that serve and trust it."""
    cert, key = d / "cert.pem", d / "key.pem"
    san = "subjectAltName=" + ",".join(f"IP:{ip}" for ip in ips)
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-subj", "/CN=spark-ps-test", "-addext", san, "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )  # fmt: skip
    return ["--tls-cert", str(cert), "--tls-key", str(key)]


def _models(c: PSClient) -> tuple[TensorSpec, TensorSpec]:
    dense = TensorSpec("h-dense", "dense", 1000, 1, c.num_shards)
    sparse = TensorSpec("h-sparse", "sparse", 2**40, 3, c.num_shards, dtype="float32")
    c.create(dense)
    c.create(sparse)
    return dense, sparse


@needs_hosts
def test_three_hosts_serve_every_partition_and_status_names_their_hosts(tmp_path):
    with _cluster(tmp_path, 3, 1) as cl:
        ids = {cl.hosts.address(i) for i in range(3)}
        st = cl.status()
        assert {h["id"] for h in st["hosts"]} == ids
        assert all(h["alive"] for h in st["hosts"])
        assert len(st["partitions"]) == 6 == cl.client.num_shards
        for p in st["partitions"]:
            assert p["host"] in ids and p["address"].startswith(p["host"] + ":"), p
            assert p["backup"] == p["backup_host"] == p["lost"] == ""
        assert sorted(i for h in st["hosts"] for i in h["primaries"]) == list(range(6))
        assert [len(h["primaries"]) for h in st["hosts"]] == [2, 2, 2]  # their --shards

        dense, sparse = _models(cl.client)
        rng = np.random.default_rng(1)
        x = rng.integers(-1000, 1000, 1000).astype(np.float64)
        cl.client.push(dense, np.arange(1000), x, "set")
        keys = rng.choice(2**40, 300, replace=False)
        rows = rng.integers(-50, 50, (300, 3)).astype(np.float32)
        cl.client.push(sparse, keys, rows)
        cl.client.push(sparse, keys[:100], rows[:100])
        assert set(sparse.shard_of(keys).tolist()) == set(range(6))  # every partition touched
        np.testing.assert_array_equal(cl.client.pull(dense, np.arange(1000)), x)
        expect = rows.copy()
        expect[:100] *= 2
        np.testing.assert_array_equal(cl.client.pull(sparse, keys), expect)
        assert cl.client.vector_op("dot", [dense, dense]) == x @ x  # integers: exact
        gather = {"topic": "h-lane", "step": 0, "part": 0, "n_parts": 1, "wait": 10.0}
        got = cl.client.call(
            "rendezvous.gather", [], gather, [[x[:3]]] * 6, shards=list(range(6)), direct=True
        )
        assert all(np.array_equal(arrays[0], [x[:3]]) for _, arrays in got)
        lanes = {a.rsplit(":", 1)[0] for a in cl.client._links.links}  # the shards' own lanes
        assert lanes == {p["host"] for p in st["partitions"]}

        st = cl.status()
        assert st["models"]["h-sparse"]["rows"] == 300
        assert st["models"]["h-dense"]["rows"] == 1000
        assert st["bytes"] == sum(m["bytes"] for m in st["models"].values()) > 0
        assert all("h-dense" in p["models"] for p in st["partitions"])


@needs_hosts
def test_tls_and_token_across_hosts_with_replicas(tmp_path):
    if shutil.which("openssl") is None:
        pytest.skip("openssl is needed to make a test certificate")
    with _cluster(tmp_path, 2, 2, tls=True) as cl:
        st = _wait_for_backups(cl)  # seeded and forwarding over TLS, host to host
        assert all(p["backup_host"] not in ("", p["host"]) for p in st["partitions"])
        dense, sparse = _models(cl.client)
        cl.client.push(dense, np.arange(1000), np.arange(1000.0), "set")
        np.testing.assert_array_equal(cl.client.pull(dense, np.arange(1000)), np.arange(1000.0))
        assert all(a.digest == b.digest for a, b in cl.client.replica_digests())
        with pytest.raises(PSError):  # plaintext is refused
            PSClient(cl.address, TOKEN, retry_seconds=1, timeout=5)
        ca = Path(cl.tls[1]).read_bytes()
        with pytest.raises(PSError) as e:
            PSClient(cl.address, "wrong-token", retry_seconds=1, timeout=5, tls_ca=ca)
        assert e.value.code == grpc.StatusCode.UNAUTHENTICATED


def _round(c: PSClient, spec: TensorSpec, r: int, rng: np.random.Generator) -> np.ndarray:
    """One exactly-once round: three parts contribute, then their sum is added."""
    total = np.zeros(spec.dim)
    for part in range(3):
        keys = np.sort(rng.choice(spec.dim, 200, replace=False))
        values = rng.integers(-9, 10, 200).astype(np.float64)
        c.push(spec, keys, values, round=r, part=part)
        total[keys] += values
    c.reduce(spec, r, op="add")
    return total


def _wait_for_backups(cl: Cluster, timeout: float = 40.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        st = cl.status()
        if all(p["backup_host"] for p in st["partitions"]) or time.monotonic() > deadline:
            return st


def _moved_primary(cl: Cluster, index: int, old: str, timeout: float = 20.0) -> str:
    """The host of `index`'s primary once it is no longer on host `old`."""
    deadline = time.monotonic() + timeout
    while True:
        host = cl.status()["partitions"][index]["host"]
        if host != old or time.monotonic() > deadline:
            return host
        time.sleep(0.1)


@needs_hosts
@pytest.mark.slow
def test_a_lost_host_s_primaries_are_promoted_and_the_model_is_a_clean_run_s(tmp_path):
    with _cluster(tmp_path, 3, 2) as cl:
        st = _wait_for_backups(cl)
        for p in st["partitions"]:
            assert p["backup_host"] and p["backup_host"] != p["host"], p
        c = cl.client
        dense, sparse = _models(c)
        rng = np.random.default_rng(7)
        expect = np.zeros(dense.dim)
        keys = rng.choice(2**40, 120, replace=False)
        victim = st["partitions"][0]["host"]
        on_victim = [p["index"] for p in st["partitions"] if p["host"] == victim]
        one = next(p for p in st["partitions"] if p["host"] != victim)  # a single process
        for r in range(1, 13):
            if r == 3:
                os.kill(c.health()[one["index"]].pid, signal.SIGKILL)
            if r == 5:
                assert _moved_primary(cl, one["index"], one["host"]) == one["backup_host"]
                # its new backup must be seeded first: a second loss before that loses it
                parts = _wait_for_backups(cl)["partitions"]
                assert all(p["backup"] for p in parts)
                assert parts[one["index"]]["backup_host"] == one["host"]  # where it died
                assert cl.hosts.kill_host(cl.host_of(victim)) >= 2  # supervisor + shards
            expect += _round(c, dense, r, rng)
            c.push(sparse, keys, np.full((120, 3), float(r), np.float32))
        np.testing.assert_array_equal(c.pull(dense, np.arange(dense.dim)), expect)
        np.testing.assert_array_equal(c.pull(sparse, keys), np.full((120, 3), 78.0, np.float32))
        assert c.metrics()["promotion"] >= len(on_victim) + 1
        assert cl.status()["counters"]["promotion"] == c.metrics()["promotion"]

        st = _wait_for_backups(cl)
        alive = {h["id"] for h in st["hosts"] if h["alive"]}
        assert alive == {cl.hosts.address(i) for i in range(3)} - {victim}
        for p in st["partitions"]:
            assert p["host"] in alive and p["backup_host"] in alive, p
            assert p["backup_host"] != p["host"], p
        pairs = c.replica_digests()  # the new backups hold exactly the primaries' state
        assert all(b is not None and a.digest == b.digest for a, b in pairs)


@needs_hosts
def test_a_lost_host_s_partitions_restore_from_the_checkpoint(tmp_path):
    ckpt = tmp_path / "ckpt"
    with _cluster(tmp_path, 2, 1, "--checkpoint-dir", str(ckpt)) as cl:
        c = cl.client
        dense, _ = _models(c)
        x = np.arange(1000, dtype=np.float64)
        c.push(dense, np.arange(1000), x, "set")
        c.checkpoint(str(ckpt), 1)
        c.push(dense, np.arange(1000), np.ones(1000))  # after the checkpoint: lost with it
        restarts = c.shard_restarts()
        victim = cl.status()["partitions"][0]["host"]
        cl.hosts.kill_host(cl.host_of(victim))
        got = c.pull(dense, np.arange(1000))
        on_victim = dense.shard_of(np.arange(1000)) == 0
        np.testing.assert_array_equal(got[on_victim], x[on_victim])
        assert c.shard_restarts() > restarts  # a fit would see it and roll back too
        st = cl.status()
        assert {p["host"] for p in st["partitions"]} == {h["id"] for h in st["hosts"] if h["alive"]}


@needs_hosts
def test_without_backup_or_checkpoint_a_lost_partition_is_an_error_naming_it(tmp_path):
    with _cluster(tmp_path, 2, 1) as cl:
        c = cl.client
        dense, _ = _models(c)
        st = cl.status()
        victim = st["partitions"][0]["host"]
        lost = [p["index"] for p in st["partitions"] if p["host"] == victim]
        cl.hosts.kill_host(cl.host_of(victim))
        with pytest.raises(PSError) as e:
            c.pull(dense, np.arange(1000))
        assert e.value.code == grpc.StatusCode.DATA_LOSS
        assert e.value.shard in lost
        assert f"partition {e.value.shard} is lost: its primary on host {victim}" in str(e.value)
        assert "no --checkpoint-dir" in str(e.value)
        marked = lambda: [p["index"] for p in cl.status()["partitions"] if p["lost"]]  # noqa: E731
        _wait(lambda: marked() == lost, f"partitions {lost} to be marked lost")


def _wait(predicate, what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


@needs_hosts
@pytest.mark.slow
def test_a_primary_cut_off_while_its_backup_was_promoted_never_acknowledges(tmp_path):
    """A host whose supervisor stops (SIGSTOP) loses its lease while its shards still serve:
    a client with the old map must not get a write acknowledged by a deposed primary."""
    with _cluster(tmp_path, 3, 2) as cl:
        st = _wait_for_backups(cl)
        c = cl.client
        dense, _ = _models(c)
        stale = PSClient(cl.address, TOKEN, retry_seconds=60, timeout=30)  # keeps this map
        victim = st["partitions"][0]["host"]
        old_pid = c.health()[0].pid
        supervisor = cl.supervisors[cl.host_of(victim)]
        supervisor.send_signal(signal.SIGSTOP)
        try:
            _wait(lambda: _moved_primary(cl, 0, victim) != victim, "the promotion")
            ones = np.ones(dense.dim)
            stale.push(dense, np.arange(dense.dim), ones)  # partition 0 at the deposed one
            c.push(dense, np.arange(dense.dim), 2 * ones)
        finally:
            supervisor.send_signal(signal.SIGCONT)
            stale.close()
        fresh = PSClient(cl.address, TOKEN, retry_seconds=60, timeout=30)  # today's map
        try:
            np.testing.assert_array_equal(fresh.pull(dense, np.arange(dense.dim)), 3 * ones)
        finally:
            fresh.close()
        # back, the host is told to stop its superseded processes
        _wait(lambda: not os.path.exists(f"/proc/{old_pid}"), "the deposed primary to stop")
        assert victim in {h["id"] for h in cl.status()["hosts"] if h["alive"]}


# ---------------------------------------------------------------- loopback, no root needed
@pytest.fixture
def one_host():
    """A coordinator in this process and one host's supervisor (a process), on loopback."""
    svc = HostService(partitions=2, token=TOKEN, host_timeout=LEASE)
    runner = threading.Thread(target=lambda: (svc.start(), svc.supervise()), daemon=True)
    runner.start()
    cmd = [sys.executable, "-m", "ps_server", "shards", "--join", svc.address,
           "--host", "127.0.0.1", "--host-id", "loop-host", "--shards", "2"]  # fmt: skip
    host = subprocess.Popen(cmd, env=_env(), cwd=ROOT, stdin=subprocess.DEVNULL)
    try:
        _wait(svc.coordinator.ready, "both partitions to register", timeout=60)
        yield svc, host
    finally:
        svc.stop_event.set()
        runner.join(30)
        try:
            host.wait(timeout=10)  # told to stop at its next heartbeat
        finally:
            if host.poll() is None:
                host.kill()
                host.wait()


def test_one_host_on_loopback_serves_and_stops_with_the_service(one_host):
    svc, host = one_host
    c = PSClient(svc.address, TOKEN, retry_seconds=30)
    try:
        spec = TensorSpec("loop", "sparse", 2**40, 1, c.num_shards)
        c.create(spec)
        keys = np.array([5, 2**39 + 3, 2**40 - 1])
        c.push(spec, keys, np.array([1.0, 2.0, 3.0]))
        np.testing.assert_array_equal(c.pull(spec, keys), [1.0, 2.0, 3.0])
        smap = c._coord("GetShardMap", pb.Empty())
        assert list(smap.primary_hosts) == ["loop-host"] * 2
        assert [h.id for h in smap.hosts] == ["loop-host"] and smap.hosts[0].alive
    finally:
        c.close()
    svc.stop_event.set()
    assert host.wait(timeout=15) == 0  # the supervisor heard the service stop and exited


def test_bad_host_reports_and_stale_shards_are_refused_by_name(one_host):
    svc, _ = one_host
    md = ((TOKEN_KEY, TOKEN),)
    with grpc.insecure_channel(svc.address) as ch:
        stub = pb_grpc.CoordinatorStub(ch)
        with pytest.raises(grpc.RpcError) as e:
            stub.HostHeartbeat(pb.HostReport(host=pb.HostInfo(id="h", shards=2)), metadata=md)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "id='h' address='' shards=2" in e.value.details()
        with pytest.raises(grpc.RpcError) as e:
            stub.HostHeartbeat(pb.HostReport(host=pb.HostInfo(id="h", address="a", shards=1)))
        assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
        twin = pb.HostInfo(id="loop-host", address="127.0.0.2", shards=1, run_id="other")
        with pytest.raises(grpc.RpcError) as e:  # the live supervisor's id, another run
            stub.HostHeartbeat(pb.HostReport(host=twin), metadata=md)
        assert e.value.code() == grpc.StatusCode.ALREADY_EXISTS
        assert "host id 'loop-host' (address 127.0.0.2) is held by another" in e.value.details()
        stale = pb.RegisterShardRequest(
            index=1, address="127.0.0.1:1", pid=1, host_id="loop-host", incarnation=999
        )
        with pytest.raises(grpc.RpcError) as e:
            stub.RegisterShard(stale, metadata=md)
        assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "shard 1 at 127.0.0.1:1 (host 'loop-host', launch 999)" in e.value.details()
        assert stub.GetShardMap(pb.Empty(), metadata=md).addresses[1] != "127.0.0.1:1"


def test_hosts_bad_settings_are_refused_by_name():
    with pytest.raises(ValueError, match="'10.9.8.7' without a token"):
        HostSupervisor("127.0.0.1:1", "10.9.8.7", 2)
    with pytest.raises(ValueError, match="--shards must be >= 1, got 0"):
        HostSupervisor("127.0.0.1:1", "127.0.0.1", 0)
    with pytest.raises(ValueError, match="'10.9.8.7' without a token"):
        HostService("10.9.8.7")
    with pytest.raises(ValueError, match="--min-hosts 1 is below --replicas 2"):
        HostService(replicas=2, min_hosts=1)
