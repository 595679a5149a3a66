"""Separate hosts on one machine: Linux network namespaces on a bridge.

Each host is a network namespace with its own network stack, loopback and address,
joined to the root namespace by a veth pair on a bridge; the subnet is private to the
test and has no route out. A process started on a host (:meth:`Hosts.popen`) binds and
connects as a separate machine would: its 127.0.0.1 is its own, and other hosts reach it
only at its address. ``tc`` caps a host's link so that its NIC, not the loopback, is the
limit (:meth:`Hosts.cap`). Needs root and iproute2; :func:`unavailable` says why not.

Used by the multi-host tests and ``bench/hosts.py``::

    with Hosts(3) as hosts:
        p = hosts.popen(0, ["python", "-m", "ps_server", ...])
        hosts.address(0)          # "10.213.x.10"
        hosts.kill_host(0)        # SIGKILL every process of that host

    with Hosts(3) as hosts, service(hosts, logs, token) as svc:
        PSClient(svc.address, token)   # a coordinator on the bridge, shards on every host
"""

from __future__ import annotations

import os
import queue
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from ps_server.lifecycle import stop_processes

__all__ = ["Hosts", "Service", "service", "unavailable"]

_ROOT = Path(__file__).resolve().parents[1]


def unavailable() -> str:
    """Why namespaces cannot be made here ("" when they can)."""
    if os.geteuid() != 0:
        return "network namespaces need root (CI runs as root)"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"{tool} (iproute2) is not installed"
    return ""


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["ip", *args], capture_output=True, text=True, check=check, stdin=subprocess.DEVNULL
    )


def _free_subnet(first: int) -> str:
    """A 10.213.x subnet no interface of the root namespace is on, trying `first` first.

    Why: two runs whose pids agree modulo 250 got the same subnet, and the second bridge's
    route hid the first's hosts from the root namespace (every connect timed out).
    """
    used = _ip("-o", "-4", "addr", "show", check=False).stdout
    for k in range(250):
        x = (first - 1 + k) % 250 + 1
        if f" 10.213.{x}." not in used:
            return f"10.213.{x}"
    raise RuntimeError("hosts: every 10.213.x subnet is in use on this machine")


class Hosts:
    """`n` hosts (network namespaces) on a fresh bridge; a context manager that removes
    them, and kills every process left in them, on exit (also when the body fails)."""

    def __init__(self, n: int, tag: str | None = None):
        why = unavailable()
        if why:
            raise RuntimeError(why)
        if not 1 <= n <= 200:
            raise ValueError(f"hosts: n must be in [1, 200], got {n}")
        # names and subnet unique per process, so parallel runs do not collide
        self.tag = tag or f"{os.getpid() % 100000}"
        self.subnet = _free_subnet(os.getpid() % 250 + 1)
        self.bridge = f"spsbr{self.tag}"[:15]
        self.names = [f"sps{self.tag}h{i}" for i in range(n)]
        self._veths = [f"spv{self.tag}h{i}"[:15] for i in range(n)]
        self._made: list[str] = []
        self._bridge_made = False

    # ------------------------------------------------------------------ set-up
    def __enter__(self) -> Hosts:
        try:
            self._make()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _make(self) -> None:
        _ip("link", "del", self.bridge, check=False)  # a leftover of a killed run
        _ip("link", "add", self.bridge, "type", "bridge")
        self._bridge_made = True
        _ip("addr", "add", f"{self.bridge_address}/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        for i, (ns, veth) in enumerate(zip(self.names, self._veths, strict=True)):
            _ip("netns", "del", ns, check=False)
            _ip("netns", "add", ns)
            self._made.append(ns)
            _ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
            _ip("link", "set", veth, "master", self.bridge)
            _ip("link", "set", veth, "up")
            _ip("-n", ns, "addr", "add", f"{self.address(i)}/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
            _ip("-n", ns, "link", "set", "lo", "up")

    @property
    def bridge_address(self) -> str:
        """The root namespace's address on the test subnet (a driver, a client)."""
        return f"{self.subnet}.1"

    def address(self, i: int) -> str:
        """Host `i`'s address."""
        return f"{self.subnet}.{10 + i}"

    def __len__(self) -> int:
        return len(self.names)

    # ------------------------------------------------------------------ processes
    def command(self, i: int, cmd: Sequence[str]) -> list[str]:
        """`cmd` as run on host `i`."""
        return ["ip", "netns", "exec", self.names[i], *cmd]

    def popen(self, i: int, cmd: Sequence[str], **kwargs) -> subprocess.Popen:
        """Start `cmd` on host `i` (Popen keyword arguments as usual)."""
        kwargs.setdefault("stdin", subprocess.DEVNULL)
        return subprocess.Popen(self.command(i, cmd), **kwargs)

    def pids(self, i: int) -> list[int]:
        """Every process living in host `i`'s namespace."""
        out = _ip("netns", "pids", self.names[i], check=False).stdout
        return [int(p) for p in out.split()]

    def kill_host(self, i: int, timeout: float = 10.0) -> int:
        """SIGKILL every process of host `i`, as a machine that loses power; returns how
        many there were. Its namespace (address, link) stays, for a restart."""
        deadline = time.monotonic() + timeout
        killed: set[int] = set()
        while time.monotonic() < deadline:
            pids = self.pids(i)
            if not pids:
                break
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                    killed.add(pid)
                except ProcessLookupError:
                    pass
            time.sleep(0.05)
        return len(killed)

    # ------------------------------------------------------------------ links
    def cap(self, i: int, rate: str = "1gbit", burst: str = "256kb", latency: str = "50ms"):
        """Cap host `i`'s link at `rate` in both directions (``tc`` token buckets on the
        root side of its veth pair, and on its eth0 inside the namespace)."""
        tbf = ["root", "tbf", "rate", rate, "burst", burst, "latency", latency]
        subprocess.run(["tc", "qdisc", "replace", "dev", self._veths[i], *tbf], check=True)
        subprocess.run(
            ["ip", "netns", "exec", self.names[i], "tc", "qdisc", "replace", "dev", "eth0", *tbf],
            check=True,
        )

    # ------------------------------------------------------------------ teardown
    def close(self) -> None:
        """Kill what runs on the hosts, then remove namespaces, links and the bridge."""
        for i in range(len(self._made)):
            self.kill_host(i)
        for ns in self._made:
            _ip("netns", "del", ns, check=False)
        self._made = []
        for veth in self._veths:
            _ip("link", "del", veth, check=False)
        if self._bridge_made:
            _ip("link", "del", self.bridge, check=False)
            self._bridge_made = False


# ---------------------------------------------------------------------- the PS on hosts
@dataclass
class Service:
    """A PS service across hosts: its coordinator's address and each host's supervisor."""

    hosts: Hosts
    address: str
    supervisors: list[subprocess.Popen]
    logs: Path


def _lines(stream) -> queue.Queue:
    """The lines of `stream`, read by a daemon thread (so waits can time out)."""
    q: queue.Queue = queue.Queue()

    def pump() -> None:
        for line in stream:
            q.put(line.strip())

    threading.Thread(target=pump, daemon=True).start()
    return q


def _expect(lines: queue.Queue, prefix: str, timeout: float, logs: Path) -> str:
    """The rest of the coordinator's first line starting with `prefix`; its log if none."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=max(0.01, deadline - time.monotonic()))
        except queue.Empty:
            break
        if line.startswith(prefix):
            return line[len(prefix) :]
    log = (logs / "coordinator.log").read_text()[-3000:]
    raise RuntimeError(f"coordinator printed no {prefix!r} within {timeout}s:\n{log}")


@contextmanager
def service(
    hosts: Hosts,
    logs: Path,
    token: str,
    *,
    shards: int = 2,
    coordinator_args: Sequence[str] = (),
    common_args: Sequence[str] = (),
    ready_timeout: float = 60.0,
    joined: int | None = None,
) -> Iterator[Service]:
    """`spark-ps-server coordinator` on the bridge address (the root namespace) and one
    `spark-ps-server shards --join` with `shards` slots on every host (on the first
    `joined` only, when given: :func:`join` adds the others later), once all have joined.

    `common_args` go to every command (TLS flags); logs are ``coordinator.log`` and
    ``host<i>.log`` in `logs`. Every process is stopped on exit, also when the body fails:
    the tests and ``bench/hosts.py`` start the service across hosts the same way.
    """
    env = dict(os.environ, SPARK_PS_TOKEN=token)
    first = len(hosts) if joined is None else joined
    cmd = [sys.executable, "-m", "ps_server", "coordinator", "--host", hosts.bridge_address,
           "--min-hosts", str(first), *coordinator_args, *common_args]  # fmt: skip
    svc = Service(hosts, "", [], logs)
    coordinator = None
    try:
        with open(logs / "coordinator.log", "w") as log:
            kw = dict(stderr=log, text=True, env=env, cwd=_ROOT, stdin=subprocess.DEVNULL)
            coordinator = subprocess.Popen(cmd, stdout=subprocess.PIPE, **kw)
        lines = _lines(coordinator.stdout)
        svc.address = _expect(lines, "SPARK_PS_LISTENING ", 30, logs)
        for i in range(first):
            join(svc, i, token, shards, common_args)
        _expect(lines, "SPARK_PS_READY ", ready_timeout, logs)
        yield svc
    finally:
        _stop([p for p in (coordinator, *svc.supervisors) if p is not None])


def join(
    svc: Service, i: int, token: str, shards: int = 2, common_args: Sequence[str] = ()
) -> subprocess.Popen:
    """Start host `i`'s `spark-ps-server shards --join` (logging to ``host<i>.log``); it is
    stopped with the service."""
    env = dict(os.environ, SPARK_PS_TOKEN=token)
    cmd = [sys.executable, "-m", "ps_server", "shards", "--join", svc.address,
           "--host", svc.hosts.address(i), "--shards", str(shards), *common_args]  # fmt: skip
    with open(svc.logs / f"host{i}.log", "w") as log:
        proc = svc.hosts.popen(i, cmd, stderr=log, env=env, cwd=_ROOT)
    svc.supervisors.append(proc)
    return proc


def _stop(procs: list[subprocess.Popen], grace: float = 8.0) -> None:
    """SIGTERM the coordinator (`procs[0]`) and let the hosts hear it at their next
    heartbeat and stop their shards; SIGTERM what is left after `grace` seconds, SIGKILL
    what is left 10 s later. Not all at once: a coordinator whose hosts vanished first
    waits out their lease (10 s) before it exits."""
    deadline = time.monotonic() + grace
    if procs and procs[0].poll() is None:
        procs[0].terminate()
    for p in procs[1:]:
        try:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            break
    stop_processes(procs, grace=10)
