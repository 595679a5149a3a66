"""The PS service across hosts: a coordinator with no local shards.

`spark-ps-server coordinator` runs this; every other machine runs
`spark-ps-server shards --join` (``ps_server.host_supervisor``). Once ``min_hosts``
hosts have joined (and, with ``join_wait``, no other joined for that many seconds), the
partitions are placed on them (``ps_server.placement``) and each host's supervisor starts
the shard processes placed on it.

Supervision is the single-host service's own (``ps_server.service.Service``): one
watcher thread per partition promotes an attached backup when its primary dies, seeds
new backups and restarts lost primaries. Only the processes differ: here each is a
:class:`~ps_server.hosts.RemoteShard` whose fate comes from its host's heartbeats, and
a whole host that stops heartbeating loses all of its processes at once. Replacements
go to the same host while it lives, else to the partition's next choice among the
live hosts, never beside the other replica. A partition whose primary and backup are
both gone is restored from the checkpoint directory, or, without one, marked lost: the
shard map says why and clients raise that error instead of serving an empty partition.
"""

from __future__ import annotations

import argparse
import logging
import subprocess
import sys
import time

from ps_server import lifecycle
from ps_server.hosts import HostTable, RemoteShard
from ps_server.proto import ps_pb2 as pb
from ps_server.service import READY_PREFIX, Service
from ps_server.wire import DEFAULT_MAX_REQUEST_MB

__all__ = ["HostService", "LISTENING_PREFIX", "DEFAULT_HOST_TIMEOUT", "main"]

log = logging.getLogger("ps_server.hosts")
#: Printed once the coordinator accepts hosts (before they join; READY_PREFIX follows).
LISTENING_PREFIX = "SPARK_PS_LISTENING "
#: Seconds without a heartbeat after which a host is lost (its lease).
DEFAULT_HOST_TIMEOUT = 10.0


class HostService(Service):
    """Coordinator server + the partitions' shard processes on the hosts that join."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        partitions: int = 0,
        token: str = "",
        checkpoint_dir: str = "",
        replicas: int = 1,
        max_request_mb: float = DEFAULT_MAX_REQUEST_MB,
        host_timeout: float = DEFAULT_HOST_TIMEOUT,
        min_hosts: int = 1,
        announce: bool = False,
        join_wait: float = 0.0,
    ) -> None:
        if partitions < 0:
            raise ValueError(
                f"--partitions must be >= 0 (0: the first hosts' --shards), got {partitions}"
            )
        if min_hosts < replicas:
            raise ValueError(
                f"--min-hosts {min_hosts} is below --replicas {replicas}: a backup never "
                "shares its primary's host"
            )
        super().__init__(
            host,
            port,
            max(partitions, 1),
            token,
            checkpoint_dir,
            replicas=replicas,
            max_request_mb=max_request_mb,
        )
        self.partitions, self.min_hosts, self.announce = partitions, min_hosts, announce
        self.join_wait = join_wait
        self.table = HostTable(host_timeout, replicas, checkpoint_dir, max_request_mb)
        self.coordinator.hosts = self.table

    def _launch(self, timeout: float) -> None:
        """Wait for `min_hosts` hosts, place the partitions on them, start them."""
        if self.announce:
            print(f"{LISTENING_PREFIX}{self.address}", flush=True)
        log.info("coordinator at %s: waiting for %d hosts to join", self.address, self.min_hosts)
        hosts = self._wait_for_joins()
        if not hosts:
            return  # stopped before they joined: main() sees no placement
        self._resize(self.partitions or sum(h.shards for h in hosts))
        self.table.place_all(self.num_shards)
        super()._launch(timeout)

    def _wait_for_joins(self) -> list[pb.HostInfo]:
        """The live hosts once `min_hosts` joined and, with `join_wait`, none joined for
        that many seconds since; [] if stopped first."""

        def stopped() -> bool:
            return self.stop_event.is_set() or bool(self.signals)

        hosts = self.table.wait_for_hosts(self.min_hosts, stopped)
        while hosts and self.join_wait > 0:
            quiet = time.monotonic() + self.join_wait
            more = self.table.wait_for_hosts(
                len(hosts) + 1, lambda q=quiet: stopped() or time.monotonic() > q
            )
            if not more:
                return self.table.wait_for_hosts(self.min_hosts, stopped)  # those alive now
            hosts = more
        return hosts

    def _resize(self, n: int) -> None:
        """Size the partition tables (their count may come from the joining hosts)."""
        self.num_shards = n
        self.procs, self.backups, self.backup_addr = [None] * n, [None] * n, [""] * n
        c = self.coordinator
        with c.cond:
            c.addresses, c.pids, c.backups = [""] * n, [0] * n, [""] * n

    def _spawn(self, index: int, role: str) -> RemoteShard | None:
        """A new launch of `index` on a host other than its other replica's."""
        other = self.backups[index] if role != "backup" else self.procs[index]
        avoid = other.host if other is not None and other.poll() is None else ""
        with self._lock:
            if self.stop_event.is_set():
                return None
        launch = self.table.launch(index, role, avoid)
        if launch is None:
            return None
        proc = RemoteShard(self.table, launch)
        with self._lock:
            self._spawned = [p for p in self._spawned if p.poll() is None] + [proc]
        return proc

    def _primary_died(self, i: int, p: subprocess.Popen) -> None:
        """As on one host, except that a partition with neither a usable backup nor a
        checkpoint to restore is marked lost rather than restarted empty."""
        b, addr = self.backups[i], self.backup_addr[i]
        usable = b is not None and b.poll() is None and addr and self.coordinator.backups[i] == addr
        if usable or self.checkpoint_dir:
            super()._primary_died(i, p)
            if b is not None and self.procs[i] is b:  # promoted: the new backup goes where
                self.table.swap(i)  # the primary was, while that host lives
            return
        why = (
            f"partition {i} is lost: its primary on host {p.host} died (code {p.returncode}) "
            f"with no attached backup, and the PS has no --checkpoint-dir to restore it from"
        )
        log.error("%s", why)
        self.table.lose(i, why)
        if b is not None:
            self._discard_backup(i, "its primary died before it was usable")
        self.procs[i] = None
        with self.coordinator.cond:
            self.coordinator.epoch += 1  # clients re-read the map and see why
            self.coordinator.counters["partition_lost"] += 1
        self.coordinator.map_changed()

    def _tend_backup(self, i: int, resync: bool = True) -> None:
        if i not in self.table.lost:
            super()._tend_backup(i, resync)

    def stop(self) -> None:
        with self.table.lock:
            self.table.stopping = True  # supervisors stop their shards at their next report
        super().stop()


def _parser() -> argparse.ArgumentParser:
    from ps_server import cli

    p = argparse.ArgumentParser(
        prog="spark-ps-server coordinator",
        description="Run the coordinator of a PS across hosts (no local shards); each other "
        "machine runs `spark-ps-server shards --join HOST:PORT`.",
    )
    p.add_argument("--host", default="127.0.0.1", help="address to bind and advertise")
    p.add_argument("--port", type=int, default=0, help="port (0 = any free port)")
    p.add_argument(
        "--partitions",
        type=int,
        default=0,
        help="number of partitions (default 0: the sum of --shards of the first hosts)",
    )
    p.add_argument("--min-hosts", type=int, default=0, help="hosts to wait for (default: replicas)")
    p.add_argument(
        "--join-wait",
        type=float,
        default=0.0,
        help="after --min-hosts joined, also wait for hosts that join within this many seconds "
        "of the last one (default 0: place at once)",
    )
    p.add_argument(
        "--host-timeout",
        type=float,
        default=DEFAULT_HOST_TIMEOUT,
        help=f"seconds without a heartbeat after which a host is lost (default "
        f"{DEFAULT_HOST_TIMEOUT:g}; hosts report every fifth of it)",
    )
    p.add_argument(
        "--replicas",
        type=int,
        default=1,
        choices=(1, 2),
        help="2: every partition has a backup on another host, promoted when its primary or "
        "its host is lost (default 1: no replication)",
    )
    p.add_argument("--checkpoint-dir", default="", help="where lost partitions restore from")
    cli.add_common(p)
    return p


def main(argv: list[str] | None = None) -> None:
    """`spark-ps-server coordinator`: serve until stopped."""
    from ps_server import cli

    args = _parser().parse_args(argv)
    token = cli.apply_common(args)
    lifecycle.die_with_parent()
    lifecycle.keep_freed_memory()
    try:
        service = HostService(
            args.host,
            args.port,
            args.partitions,
            token,
            args.checkpoint_dir,
            args.replicas,
            args.max_request_mb,
            args.host_timeout,
            args.min_hosts or args.replicas,
            announce=True,
            join_wait=args.join_wait,
        )
    except (ValueError, OSError) as e:
        sys.exit(f"spark-ps-server coordinator: {e}")
    service.signals.install()
    service.start(timeout=300)
    if not service.table.slots:
        log.warning("stopped before %d hosts joined", service.min_hosts)
        service.stop()
        return
    print(f"{READY_PREFIX}{service.address}", flush=True)
    service.supervise()
