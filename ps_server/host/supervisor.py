"""The per-host supervisor: `spark-ps-server shards --join HOST:PORT` on every host.

It registers its host with the coordinator (an identity — `--host-id`, else the
address it advertises, since network namespaces or containers may share a hostname —
its shard slots and memory budget), then heartbeats. Each answer lists the shard
processes the coordinator placed here; the supervisor starts each new one bound to
its address, stops those no longer listed, and reports a death at once instead of
restarting it: only the coordinator knows whether a backup elsewhere should take over
(a primary restarted empty here would lose its updates), and it answers with a new
launch when this host should run the partition again.

Shard processes die with their supervisor (``lifecycle.die_with_parent``), so a host
whose supervisor is gone serves nothing stale once its lease lapses.
"""

from __future__ import annotations

import argparse
import logging
import os
import subprocess
import sys
import time
import uuid

import grpc

from ps_server import cli, lifecycle, tls
from ps_server.auth import require_token
from ps_server.proto import ps_pb2 as pb
from ps_server.proto import ps_pb2_grpc as pb_grpc
from ps_server.wire import TOKEN_KEY

__all__ = ["HostSupervisor", "main"]

log = logging.getLogger("ps_server.host.supervisor")
_UNREACHABLE_LOG_SECONDS = 10.0  # how often an unreachable coordinator is logged
_STOP_SECONDS = 5.0  # a shard told to stop gets this long before SIGKILL


class HostSupervisor:
    """Runs the shard processes the coordinator at `join` places on this host."""

    def __init__(
        self,
        join: str,
        address: str,
        shards: int,
        token: str = "",
        host_id: str = "",
        shard_memory_mb: float = 0.0,
    ) -> None:
        if shards < 1:
            raise ValueError(f"--shards must be >= 1, got {shards}")
        if shard_memory_mb < 0:
            raise ValueError(f"--shard-memory-mb must be >= 0, got {shard_memory_mb}")
        require_token(address, token, "run shards on", "set SPARK_PS_TOKEN to the coordinator's")
        self.join, self.token, self.shard_memory_mb = join, token, shard_memory_mb
        self.info = pb.HostInfo(
            id=host_id or address,
            address=address,
            shards=shards,
            memory_mb=shards * shard_memory_mb,
            run_id=uuid.uuid4().hex,
        )
        self.procs: dict[int, tuple[pb.ShardLaunch, subprocess.Popen]] = {}
        self.retiring: list[tuple[float, subprocess.Popen]] = []  # (kill deadline, process)
        self.interval = 1.0  # until the coordinator says otherwise
        self.max_request_mb = 0.0
        self._channel = tls.open_channel(join, tls.env_ca())
        self._stub = pb_grpc.CoordinatorStub(self._channel)
        self._unreachable_since = 0.0

    def run(self, signals: lifecycle.StopSignals) -> None:
        """Heartbeat and reconcile until a signal, our parent's death or the service's stop."""
        parent, next_beat, reported = os.getppid(), 0.0, set()
        try:
            while not signals and os.getppid() == parent:
                exited = {n for n, (_, p) in self.procs.items() if p.poll() is not None}
                now = time.monotonic()
                if now >= next_beat or exited - reported:
                    assignment = self._heartbeat()
                    reported = exited
                    next_beat = now + self.interval
                    if assignment is not None:
                        if assignment.stop:
                            log.info(
                                "told to stop (the PS service is stopping, or this host was "
                                "drained); so do this host's shards"
                            )
                            return
                        self._reconcile(assignment)
                self._reap()
                time.sleep(0.05)
        finally:
            self.stop()

    def _heartbeat(self) -> pb.HostAssignment | None:
        report = pb.HostReport(host=self.info)
        for n, (_, p) in self.procs.items():
            code = p.poll()
            report.processes.add(
                incarnation=n, pid=p.pid, exited=code is not None, exit_code=code or 0
            )
        try:
            answer = self._stub.HostHeartbeat(
                report, metadata=((TOKEN_KEY, self.token),), timeout=max(self.interval, 2.0)
            )
        except grpc.RpcError as e:
            if e.code() in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.INVALID_ARGUMENT):
                raise RuntimeError(
                    f"coordinator {self.join} refused host {self.info.id!r}: {e.details()}"
                ) from None
            now = time.monotonic()
            if now - self._unreachable_since > _UNREACHABLE_LOG_SECONDS:
                self._unreachable_since = now
                log.warning(
                    "coordinator %s: %s: %s; this host's shards keep serving, trying again",
                    self.join,
                    e.code().name,
                    e.details(),
                )
            return None
        self.interval, self.max_request_mb = answer.heartbeat_seconds, answer.max_request_mb
        return answer

    def _reconcile(self, assignment: pb.HostAssignment) -> None:
        """Start the listed launches not yet started; stop and forget the others."""
        wanted = {launch.incarnation: launch for launch in assignment.launches}
        for n, (launch, p) in list(self.procs.items()):
            if n in wanted:
                continue
            if p.poll() is None:
                log.info(
                    "stopping shard %d (%s): no longer placed here", launch.partition, launch.role
                )
                p.terminate()  # reaped by _reap, without holding up the heartbeats
                self.retiring.append((time.monotonic() + _STOP_SECONDS, p))
            del self.procs[n]
        for n, launch in wanted.items():
            if n not in self.procs:
                self.procs[n] = (launch, self._start(launch))

    def _reap(self) -> None:
        """Forget stopped processes; SIGKILL those that outlived their grace."""
        now, left = time.monotonic(), []
        for deadline, p in self.retiring:
            if p.poll() is None:
                if now > deadline:
                    p.kill()
                left.append((deadline, p))
        self.retiring = left

    def _start(self, launch: pb.ShardLaunch) -> subprocess.Popen:
        cmd = [
            sys.executable,
            "-m",
            "ps_server.shard",
            "--index",
            str(launch.partition),
            "--coordinator",
            self.join,
            "--host",
            self.info.address,
            "--role",
            launch.role,
            "--memory-mb",
            str(self.shard_memory_mb),
            "--host-id",
            self.info.id,
            "--incarnation",
            str(launch.incarnation),
        ]
        if self.max_request_mb:
            cmd += ["--max-request-mb", str(self.max_request_mb)]
        if launch.restore:
            cmd += ["--restore", launch.restore]
        env = lifecycle.shard_env(self.token)
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL)
        log.info(
            "started shard %d (%s, launch %d): pid %d",
            launch.partition,
            launch.role,
            launch.incarnation,
            proc.pid,
        )
        return proc

    def stop(self) -> None:
        """Stop every shard process of this host."""
        procs = [p for _, p in self.procs.values()] + [p for _, p in self.retiring]
        lifecycle.stop_processes(procs)
        self.procs.clear()
        self._channel.close()


def main(argv: list[str] | None = None) -> None:
    """`spark-ps-server shards --join HOST:PORT --host MY_ADDRESS --shards N`."""
    p = argparse.ArgumentParser(
        prog="spark-ps-server shards",
        description="Run this host's shard processes for the PS coordinator at --join.",
    )
    p.add_argument("--join", required=True, help="HOST:PORT of `spark-ps-server coordinator`")
    p.add_argument(
        "--host", required=True, help="this host's address: shards bind and advertise it"
    )
    p.add_argument(
        "--shards",
        type=int,
        default=os.cpu_count() or 1,
        help="shard slots (default: one per core): this host's share of the partitions "
        "(without --shard-memory-mb); backups and a lost host's partitions come on top",
    )
    p.add_argument(
        "--host-id", default="", help="this host's identity (default: --host; must be unique)"
    )
    p.add_argument(
        "--shard-memory-mb",
        type=float,
        default=0,
        help="memory budget of each shard (default 0 = none); the host's budget, its "
        "placement weight, is --shards times this",
    )
    cli.add_common(p, limits=False)
    args = p.parse_args(argv)
    token = cli.apply_common(args)
    lifecycle.die_with_parent()
    try:
        supervisor = HostSupervisor(
            args.join, args.host, args.shards, token, args.host_id, args.shard_memory_mb
        )
        supervisor.run(lifecycle.StopSignals().install())
    except (ValueError, RuntimeError) as e:  # bad flags, or refused by the coordinator
        sys.exit(f"spark-ps-server shards: {e}")
