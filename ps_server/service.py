"""The PS as a service: one coordinator plus N shard processes that it supervises.

A shard that dies is started again on a fresh port and re-registers (the shard
map's epoch moves on, so clients re-resolve it); with a checkpoint directory it
restores the newest sealed snapshot first.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
import time
from concurrent import futures

import grpc

from ps_server import lifecycle, tls
from ps_server.auth import TokenInterceptor, is_loopback
from ps_server.coordinator import CoordinatorServicer
from ps_server.proto import ps_pb2_grpc as pb_grpc
from ps_server.wire import DEFAULT_MAX_REQUEST_MB, RequestLimitInterceptor, server_options

__all__ = ["Service", "READY_PREFIX"]

log = logging.getLogger("ps_server.service")
READY_PREFIX = "SPARK_PS_READY "


class Service:
    """Coordinator server + supervised shard processes."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        num_shards: int = 1,
        token: str = "",
        checkpoint_dir: str = "",
        restart: bool = True,
        max_request_mb: float = DEFAULT_MAX_REQUEST_MB,
        shard_memory_mb: float = 0,
    ):
        if num_shards < 1:
            raise ValueError(f"num_shards must be >= 1, got {num_shards}")
        if not token and not is_loopback(host):
            raise ValueError(
                f"refusing to bind non-loopback address {host!r} without a token "
                "(set SPARK_PS_TOKEN)"
            )
        self.host, self.token, self.num_shards = host, token, num_shards
        self.checkpoint_dir, self.restart = checkpoint_dir, restart
        if not max_request_mb > 0 or shard_memory_mb < 0:
            raise ValueError(
                f"max_request_mb must be > 0 (got {max_request_mb}) and shard_memory_mb "
                f">= 0 (got {shard_memory_mb})"
            )
        self.max_request_mb, self.shard_memory_mb = max_request_mb, shard_memory_mb
        limit = int(max_request_mb * (1 << 20))
        self.stop_event = threading.Event()
        self.coordinator = CoordinatorServicer(
            num_shards, on_shutdown=self.stop_event.set, max_request_bytes=limit
        )
        self.server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=128),
            interceptors=[TokenInterceptor(token), RequestLimitInterceptor(limit, "coordinator")],
            options=server_options(limit),
        )
        pb_grpc.add_CoordinatorServicer_to_server(self.coordinator, self.server)
        self.port = tls.bind(self.server, f"{host}:{port}")
        if self.port == 0:
            raise OSError(f"cannot bind coordinator to {host}:{port}")
        self.address = f"{host}:{self.port}"
        self.procs: list[subprocess.Popen | None] = [None] * num_shards
        self.restarts = 0

    def _spawn(self, index: int) -> subprocess.Popen:
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
            "--max-request-mb",
            str(self.max_request_mb),
            "--memory-mb",
            str(self.shard_memory_mb),
        ]
        if self.checkpoint_dir:
            cmd += ["--restore", self.checkpoint_dir]
        env = dict(os.environ, SPARK_PS_TOKEN=self.token)
        return subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL)

    def start(self, timeout: float = 60.0) -> None:
        self.server.start()
        for i in range(self.num_shards):
            self.procs[i] = self._spawn(i)
        deadline = time.monotonic() + timeout
        while not self.coordinator.ready():
            dead = [i for i, p in enumerate(self.procs) if p.poll() is not None]
            if dead or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"PS shards {dead or 'all'} failed to start within {timeout}s")
            time.sleep(0.05)

    def supervise(self) -> None:
        """Restart dead shards until stopped (or the parent goes away)."""
        parent = os.getppid()
        while not self.stop_event.wait(0.2):
            if os.getppid() != parent:
                break
            for i, p in enumerate(self.procs):
                if p is not None and p.poll() is not None and self.restart:
                    log.warning(
                        "shard %d (pid %d) died with code %s; restarting%s",
                        i,
                        p.pid,
                        p.returncode,
                        f" from {self.checkpoint_dir}"
                        if self.checkpoint_dir
                        else " empty (no checkpoint directory)",
                    )
                    self.restarts += 1
                    self.procs[i] = self._spawn(i)
        self.stop()

    def stop(self) -> None:
        self.stop_event.set()
        for p in self.procs:
            if p is not None and p.poll() is None:
                p.terminate()
        for p in self.procs:
            if p is not None:
                try:
                    p.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        self.server.stop(grace=0.5)


def run(
    host: str,
    port: int,
    num_shards: int,
    token: str,
    checkpoint_dir: str = "",
    max_request_mb: float = DEFAULT_MAX_REQUEST_MB,
    shard_memory_mb: float = 0,
) -> None:
    """Start, announce readiness on stdout, supervise until told to stop."""
    import signal

    lifecycle.die_with_parent()
    service = Service(
        host,
        port,
        num_shards,
        token,
        checkpoint_dir,
        max_request_mb=max_request_mb,
        shard_memory_mb=shard_memory_mb,
    )

    def on_signal(signum, frame):
        service.stop_event.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    service.start()
    print(f"{READY_PREFIX}{service.address}", flush=True)
    service.supervise()
