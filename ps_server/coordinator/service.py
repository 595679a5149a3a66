"""The PS as a service: one coordinator plus N shard processes that it supervises.

A shard that dies is started again on a fresh port and re-registers (the shard
map's epoch moves on, so clients re-resolve it); with a checkpoint directory it
restores the newest sealed snapshot first.

With ``replicas=2`` every index also has a backup process that applies every
update before it is acknowledged (``ps_server.shard.replica``). When a primary dies its
backup is promoted instead (no update lost), and a new backup is started and
seeded from the survivor before it joins. Only when both die is the shard
restarted as above. Promotions, resyncs, lost backups and restarts are counted
in the coordinator (`CoordinatorServicer.count`).

Each index is watched by its own thread, the only one that changes that index's
processes: seeding a backup (up to minutes for a big shard, or a hung primary's
timeout) never delays the promotion or restart of another index.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
import time

import grpc

from ps_server import checkpoint, fencing, lifecycle, timeouts, tls
from ps_server.auth import AioTokenInterceptor, require_token
from ps_server.coordinator.loop_server import LoopServer
from ps_server.coordinator.servicer import CoordinatorServicer
from ps_server.coordinator.waiting import WAITING_SERVER_OPTIONS
from ps_server.proto import ps_pb2 as pb
from ps_server.proto import ps_pb2_grpc as pb_grpc
from ps_server.wire import (
    DEFAULT_MAX_REQUEST_MB,
    TOKEN_KEY,
    AioRequestLimitInterceptor,
    server_options,
)

__all__ = ["Service", "READY_PREFIX", "UI_PREFIX"]

log = logging.getLogger("ps_server.coordinator.service")
READY_PREFIX = "SPARK_PS_READY "
#: Printed on stdout with the status page's URL once it serves (before READY_PREFIX).
UI_PREFIX = "SPARK_PS_UI "
#: A shard that dies this soon after (re)starting counts towards its restart back-off.
QUICK_DEATH_SECONDS = timeouts.QUICK_DEATH_SECONDS


class Service:
    """Coordinator server + supervised shard processes (one or two replicas per index)."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        num_shards: int = 1,
        token: str = "",
        checkpoint_dir: str = "",
        restart: bool = True,
        replicas: int = 1,
        max_request_mb: float = DEFAULT_MAX_REQUEST_MB,
        shard_memory_mb: float = 0,
    ):
        if num_shards < 1:
            raise ValueError(f"num_shards must be >= 1, got {num_shards}")
        if replicas not in (1, 2):
            raise ValueError(f"replicas must be 1 (no replication) or 2, got {replicas}")
        require_token(host, token, "bind")
        self.host, self.token, self.num_shards = host, token, num_shards
        self.checkpoint_dir, self.restart, self.replicas = checkpoint_dir, restart, replicas
        if not max_request_mb > 0 or shard_memory_mb < 0:
            raise ValueError(
                f"max_request_mb must be > 0 (got {max_request_mb}) and shard_memory_mb "
                f">= 0 (got {shard_memory_mb})"
            )
        self.max_request_mb, self.shard_memory_mb = max_request_mb, shard_memory_mb
        limit = int(max_request_mb * (1 << 20))
        self.stop_event = threading.Event()
        self.signals = lifecycle.StopSignals()  # installed by run(): SIGTERM/SIGINT stop us
        self.coordinator = CoordinatorServicer(
            num_shards, on_shutdown=self.stop_event.set, max_request_bytes=limit
        )
        # grpc.aio on a thread of its own: a waiting call costs no thread
        # (ps_server.coordinator.waiting)
        self.server = LoopServer(
            lambda server: pb_grpc.add_CoordinatorServicer_to_server(self.coordinator, server),
            f"{host}:{port}",
            interceptors=[
                AioTokenInterceptor(token),
                AioRequestLimitInterceptor(limit, "coordinator"),
            ],
            options=server_options(limit) + WAITING_SERVER_OPTIONS,
            name="coordinator",
        )
        self.port = self.server.port
        if self.port == 0:
            self.server.stop()
            raise OSError(f"cannot bind coordinator to {host}:{port}")
        self.address = f"{host}:{self.port}"
        self.procs: list[subprocess.Popen | None] = [None] * num_shards  # primaries
        self.backups: list[subprocess.Popen | None] = [None] * num_shards
        self.backup_addr = [""] * num_shards  # "" until the backup is seeded and attached
        self.restarts = 0
        self._channels: dict[str, grpc.Channel] = {}
        self._lock = threading.Lock()  # channels, restarts, spawned; never held over an RPC
        self._spawned: list[subprocess.Popen] = []  # every live process started: stop() ends them
        self._started: dict[int, float] = {}  # index -> when its primary last (re)started
        self._quick_deaths: dict[int, int] = {}  # index -> deaths in a row soon after a start
        self.ui = None  # the status page (start_ui)

    @property
    def _primary_role(self) -> str:
        return "solo" if self.replicas == 1 else "primary"

    def _spawn(self, index: int, role: str) -> subprocess.Popen | None:
        """Start a shard process (None once the service is stopping: stop() would miss it)."""
        cmd = [
            sys.executable,
            "-m",
            "ps_server.shard",
            "--index",
            str(index),
            "--coordinator",
            self.address,
            "--host",
            self.host,
            "--role",
            role,
            "--max-request-mb",
            str(self.max_request_mb),
            "--memory-mb",
            str(self.shard_memory_mb),
        ]
        if self.checkpoint_dir:  # a backup does not restore, but checkpoints there if promoted
            cmd += ["--restore", self.checkpoint_dir]
        env = lifecycle.shard_env(self.token)
        with self._lock:
            if self.stop_event.is_set():
                return None
            proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL)
            # the live ones: a long-running service restarts shards without bound
            self._spawned = [p for p in self._spawned if p.poll() is None] + [proc]
        return proc

    def start(self, timeout: float = 60.0) -> None:
        if self.checkpoint_dir:  # torn versions of a crashed run: nobody writes them now
            checkpoint.prune(self.checkpoint_dir, keep=0, all_torn=True)
        self.server.start()
        self._launch(timeout)

    def _launch(self, timeout: float) -> None:
        """Start every shard (and backup) and wait until all are in the map."""
        for i in range(self.num_shards):
            self.procs[i] = self._spawn(i, self._primary_role)
            if self.replicas == 2:
                self.backups[i] = self._spawn(i, "backup")
        deadline = time.monotonic() + timeout
        while not (self.coordinator.ready() and all(self.backup_addr[: self._need_backups])):
            dead = [i for i, p in enumerate(self.procs) if p.poll() is not None]
            if dead or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"PS shards {dead or 'all'} failed to start within {timeout}s")
            if self.coordinator.ready() and self.replicas == 2:
                for i in range(self.num_shards):
                    self._tend_backup(i, resync=False)
            time.sleep(0.05)

    @property
    def _need_backups(self) -> int:
        return self.num_shards if self.replicas == 2 else 0

    def supervise(self) -> None:
        """Restart dead shards (or promote their backups) until stopped or orphaned."""
        parent = os.getppid()
        watchers = [
            threading.Thread(target=self._watch, args=(i,), name=f"ps shard {i}", daemon=True)
            for i in range(self.num_shards if self.restart else 0)
        ]
        for t in watchers:
            t.start()
        while not self.stop_event.wait(0.2):
            if self.signals or os.getppid() != parent:
                break
        self.stop_event.set()
        self._close_channels()  # a watcher blocked in Configure gets its error now
        for t in watchers:
            t.join(10)
        self.stop()

    def _watch(self, i: int) -> None:
        """Index `i`'s supervisor: the only thread that replaces its processes."""
        while not self.stop_event.wait(0.2):
            try:
                p = self.procs[i]
                if p is not None and p.poll() is not None:
                    self._primary_died(i, p)
                if self.replicas == 2 and not self.stop_event.is_set():
                    self._tend_backup(i)
                self._tend_more(i)
            except Exception:  # noqa: BLE001 - a watcher that died would leave `i` unwatched
                log.exception("shard %d: supervising failed; trying again", i)

    def _tend_more(self, i: int) -> None:
        """Further work on index `i` by its watcher (the service across hosts moves it)."""

    def _primary_died(self, i: int, p: subprocess.Popen) -> None:
        """Promote a live attached backup that proves current (no update lost: the steps
        are ``ps_server.fencing``'s), else restart the shard."""
        b, addr = self.backups[i], self.backup_addr[i]
        promoted = False
        if b is not None and b.poll() is None and addr:
            try:  # the backup takes over as a solo primary, if it proves current
                promoted = fencing.promote_backup(self.coordinator, i, addr, b.pid, self._configure)
            except grpc.RpcError as e:
                log.error("shard %d: promoting backup %s failed: %s", i, addr, e.details())
        if promoted:
            log.warning(
                "shard %d: primary (pid %d) died with code %s; promoted its backup "
                "(pid %d, %s): no update lost; a new backup will be seeded from it",
                i,
                p.pid,
                p.returncode,
                b.pid,
                addr,
            )
            self.procs[i], self.backups[i], self.backup_addr[i] = b, None, ""
            return
        log.warning(
            "shard %d (pid %d) died with code %s%s; restarting%s",
            i,
            p.pid,
            p.returncode,
            " and had no usable backup" if self.replicas == 2 else "",
            f" from {self.checkpoint_dir}"
            if self.checkpoint_dir
            else " empty (no checkpoint directory)",
        )
        if b is not None:
            self._discard_backup(i, "its primary died before it was usable")
        with self._lock:
            self.restarts += 1
        self.coordinator.count("restart")
        self._back_off(i, p.pid)
        self.procs[i] = self._spawn(i, self._primary_role)

    def _back_off(self, i: int, pid: int) -> None:
        """Wait before restarting index `i` if it keeps failing to start: 0.4 s after its
        second death in a row within QUICK_DEATH_SECONDS of starting without having
        registered, doubling up to 30 s, so a shard that cannot start (e.g. no checkpoint
        loads) is not respawned five times a second. A shard that registered had started:
        killing it, however soon, restarts it at once."""
        now = time.monotonic()
        with self.coordinator.cond:
            registered = self.coordinator.pids[i] == pid
        young = now - self._started.get(i, -1e9) < QUICK_DEATH_SECONDS and not registered
        self._quick_deaths[i] = self._quick_deaths.get(i, 0) + 1 if young else 0
        n = self._quick_deaths[i]
        if n:
            delay = min(0.2 * 2**n, 30.0)
            log.error(
                "shard %d died %d times in a row within %.0fs of starting; next start in %.1fs",
                i,
                n,
                QUICK_DEATH_SECONDS,
                delay,
            )
            self.stop_event.wait(delay)  # only this index's watcher waits
        self._started[i] = time.monotonic()

    def _tend_backup(self, i: int, resync: bool = True) -> None:
        """Keep one seeded backup per index: start, seed and attach, or replace it."""
        b, addr = self.backups[i], self.backup_addr[i]
        if b is None:
            self.backups[i] = self._spawn(i, "backup")
            return
        if b.poll() is not None:
            self._discard_backup(i, f"died with code {b.returncode}")
            return
        if addr and self.coordinator.backups[i] != addr:
            self._discard_backup(i, "was dropped by its primary (an update failed there)")
            return
        primary = self.procs[i]
        with self.coordinator.cond:
            joined = self.coordinator.joining.get(i)
            ready = primary is not None and self.coordinator.pids[i] == primary.pid
            target = self.coordinator.addresses[i]
        if addr or not ready or joined is None or joined[1] != b.pid:
            return
        t = time.monotonic()
        try:
            ack = fencing.seed_and_attach(self.coordinator, i, joined[0], self._configure, resync)
        except grpc.RpcError as e:
            log.warning("shard %d: seeding backup %s failed: %s", i, joined[0], e.details())
            self._discard_backup(i, "could not be seeded")
            return
        self.backup_addr[i] = joined[0]
        if ack is None:
            self._discard_backup(
                i, "was not attached (its primary dropped it, or a new term began)"
            )
            return
        nbytes = ack.value
        log.log(
            logging.WARNING if resync else logging.INFO,
            "shard %d: backup (pid %d, %s) %s from primary %s (%.1f MB snapshot, %.2fs)",
            i,
            b.pid,
            joined[0],
            "resynced" if resync else "seeded",
            target,
            nbytes / 1e6,
            time.monotonic() - t,
        )

    def _discard_backup(self, i: int, why: str) -> None:
        """Stop using (and stop) the backup of `i`; a fresh one is started next round."""
        b, addr = self.backups[i], self.backup_addr[i]
        log.warning("shard %d: backup (pid %d, %s) %s; replacing it", i, b.pid, addr or "-", why)
        self.coordinator.drop_backup(i, addr)  # never promote it from now on
        if b.poll() is None:
            b.kill()
            b.wait()
        primary = self.procs[i]
        if addr and primary is not None and primary.poll() is None:
            with self.coordinator.cond:
                target, term = self.coordinator.addresses[i], self.coordinator.terms[i]
            try:
                self._configure(target, "", term)
            except grpc.RpcError as e:  # it dropped the backup itself, or died too
                log.info("shard %d: detaching the backup: %s", i, e.details())
        self.backups[i], self.backup_addr[i] = None, ""

    def _configure(
        self,
        address: str,
        backup: str,
        term: int = 0,
        expect_term: int = 0,
        min_seq: int = 0,
        role: str = "primary",
    ) -> pb.Ack:
        """Tell the shard at `address` to be the primary of `term` forwarding to `backup`
        ("" = none); a backup so told is promoted if it proves current (``fencing``). Role
        "deposed": step down (a planned hand-over; the answer's seq is where it stopped)."""
        with self._lock:
            if self.stop_event.is_set():
                raise _Stopping()
            if address not in self._channels:
                self._channels[address] = tls.open_channel(address, tls.env_ca())
            stub = pb_grpc.ShardStub(self._channels[address])
        return stub.Configure(
            pb.ReplicaConfig(
                role=role,
                backup=backup,
                term=term,
                expect_term=expect_term,
                min_seq=min_seq,
            ),
            metadata=((TOKEN_KEY, self.token),),
            timeout=timeouts.configure_seconds(int(self.shard_memory_mb * (1 << 20))),
        )

    def _close_channels(self) -> None:
        with self._lock:
            channels, self._channels = list(self._channels.values()), {}
        for ch in channels:
            ch.close()  # cancels the calls in flight on it

    def start_ui(self, port: int = 0) -> str:
        """Serve the status page (``ps_server.coordinator.ui``) on `port` of the coordinator's
        address (0: any free port); returns its URL, which is logged and printed on stdout."""
        from ps_server.coordinator.ui import StatusPage

        self.ui = StatusPage(self, self.host, port)
        self.coordinator.ui_url = self.ui.url  # in the shard map: clients link to it
        log.info("spark-ps status page: %s (also /status.json, /metrics)", self.ui.url)
        print(f"{UI_PREFIX}{self.ui.url}", flush=True)
        return self.ui.url

    def stop(self) -> None:
        with self._lock:  # no process is started after this
            self.stop_event.set()
            procs = list(self._spawned)
        if self.ui is not None:
            self.ui.stop()
        lifecycle.stop_processes(procs)
        self._close_channels()
        self.server.stop(grace=0.5)


class _Stopping(grpc.RpcError):
    """Configure refused because the service is stopping (callers log `details()`)."""

    def details(self) -> str:
        return "the PS service is stopping"


def run(
    host: str,
    port: int,
    num_shards: int,
    token: str,
    checkpoint_dir: str = "",
    replicas: int = 1,
    max_request_mb: float = DEFAULT_MAX_REQUEST_MB,
    shard_memory_mb: float = 0,
    ui_port: int | None = None,
) -> None:
    """Start, announce readiness on stdout, supervise until told to stop; with `ui_port`
    (0: any free port), serve the status page (``ps_server.coordinator.ui``) too."""
    lifecycle.die_with_parent()
    service = Service(
        host,
        port,
        num_shards,
        token,
        checkpoint_dir,
        replicas=replicas,
        max_request_mb=max_request_mb,
        shard_memory_mb=shard_memory_mb,
    )

    service.signals.install()  # polled by supervise(): a handler must take no lock
    service.start()
    if ui_port is not None:
        service.start_ui(ui_port)
    print(f"{READY_PREFIX}{service.address}", flush=True)
    service.supervise()
