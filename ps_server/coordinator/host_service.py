"""The PS service across hosts: a coordinator with no local shards.

`spark-ps-server coordinator` runs this; every other machine runs
`spark-ps-server shards --join` (``ps_server.host.supervisor``). Once ``min_hosts``
hosts have joined (and, with ``join_wait``, no other joined for that many seconds), the
partitions are placed on them (``ps_server.coordinator.placement``) and each host's
supervisor starts the shard processes placed on it.

Supervision is the single-host service's own (``ps_server.coordinator.service.Service``): one
watcher thread per partition promotes an attached backup when its primary dies, seeds
new backups and restarts lost primaries. Only the processes differ: here each is a
:class:`~ps_server.coordinator.hosts.RemoteShard` whose fate comes from its host's heartbeats, and
a whole host that stops heartbeating loses all of its processes at once. Replacements
go to the same host while it lives, else to the partition's next choice among the
live hosts, never beside the other replica. A partition whose primary and backup are
both gone is restored from the checkpoint directory, or, without one, marked lost: the
shard map says why and clients raise that error instead of serving an empty partition.

With a local checkpoint directory the coordinator journals its state there
(``ps_server.coordinator.journal``); started again at the same address after a crash, it replays the
journal and adopts the shard processes still running instead of placing anything anew.
Without one, a restarted coordinator is a new, empty PS: the hosts that rejoin have
their old shard processes stopped (their launches are unknown to it), and its restart
count starts past any earlier one's (from the clock), so running fits see every shard
restart and recover as from one (``spark_ps.ml._recovery``).

A host that joins later takes its share of the partitions, and `spark-ps-server drain`
empties one: each watcher thread also carries out its partition's moves
(``ps_server.coordinator.migrate`` plans them, :func:`run_move` carries one out). With
``replicas=1`` a shard runs solo until a move
first configures it: it then turns primary (``ShardServicer.become_primary``) to seed the copy.
"""

from __future__ import annotations

import argparse
import logging
import subprocess
import sys
import threading
import time

import grpc

from ps_server import fencing, lifecycle, timeouts, tls
from ps_server.coordinator import journal, migrate, placement
from ps_server.coordinator.hosts import HostTable, RemoteShard
from ps_server.coordinator.service import READY_PREFIX, Service
from ps_server.proto import ps_pb2 as pb
from ps_server.proto import ps_pb2_grpc as pb_grpc
from ps_server.wire import DEFAULT_MAX_REQUEST_MB, TOKEN_KEY

__all__ = ["HostService", "LISTENING_PREFIX", "DEFAULT_HOST_TIMEOUT", "main"]

log = logging.getLogger("ps_server.coordinator.hosts")
move_log = logging.getLogger("ps_server.coordinator.migrate")  # run_move's records
#: Printed once the coordinator accepts hosts (before they join; READY_PREFIX follows).
LISTENING_PREFIX = "SPARK_PS_LISTENING "
#: Seconds without a heartbeat after which a host is lost (its lease).
DEFAULT_HOST_TIMEOUT = timeouts.HOST_LEASE_SECONDS


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
        where = journal.journal_dir(checkpoint_dir)
        self.journal = journal.Journal(where) if where else None
        if checkpoint_dir and where is None:
            log.warning(
                "--checkpoint-dir %s is not a local directory: the coordinator keeps no "
                "journal, and a restarted coordinator starts an empty PS",
                checkpoint_dir,
            )

        self.moves = self.table.moves
        self.table.partition_bytes = self._partition_bytes

    def start(self, timeout: float = 60.0) -> None:
        """Resume from the journal if it holds a placed PS, else start as a new one."""
        records = self.journal.read() if self.journal is not None else []
        if not records:
            super().start(timeout)
            return
        self._resume(records)  # before serving: nobody sees a half-restored map
        self.server.start()
        if self.announce:
            print(f"{LISTENING_PREFIX}{self.address}", flush=True)

    def _start_journal(self) -> None:
        """Write the journal anew (a snapshot of the state now) and journal from now on."""
        c = self.coordinator
        with c.cond:
            records = journal.snapshot(c, self.table, self.num_shards, self.replicas)
            self.journal.start(records)
            c.journal = self.table.journal = self.journal

    def _resume(self, records: list[dict]) -> None:
        """Rebuild the state a killed coordinator journaled and adopt its shard processes."""
        config = records[0]
        if config.get("t") != "config":
            raise journal.JournalError(f"{self.journal.path}: no config record first")
        n, replicas = int(config["partitions"]), int(config["replicas"])
        if replicas != self.replicas or self.partitions not in (0, n):
            raise journal.JournalError(
                f"{self.journal.path} is the journal of a PS with {n} partitions and "
                f"--replicas {replicas}; this coordinator was started with --partitions "
                f"{self.partitions} --replicas {self.replicas} (use the same settings, or move "
                "the journal away to start an empty PS)"
            )
        self._resize(n)
        c, table = self.coordinator, self.table
        with c.cond:
            journal.replay(records, c, table)
            c.epoch += 1  # clients re-read the map
            for i in range(n):
                self._adopt(i)
            table.slots = self._slots()
            # the journaled hosts were placed over (or planned for) already: their rejoin
            # after this restart is no scale-out (ps_server.coordinator.migrate)
            table.planned_for = set(table.hosts)
            table.rejoining = {
                h: {x.number for x in table.launches.values() if x.host == h}
                for h, host in table.hosts.items()
                if host.alive
            }
            live = [p for p in (*self.procs, *self.backups) if p is not None]
            self._spawned = [p for p in live if p.poll() is None]
        self._start_journal()
        missing = [i for i in range(n) if self.procs[i] is None and i not in table.lost]
        for i in missing:  # killed before it launched them
            self.procs[i] = self._spawn(i, self._primary_role)
        log.warning(
            "coordinator resumed from %s (%d records): %d partitions on hosts %s, %d models, "
            "restart count %d; waiting for the hosts to report their shard processes%s",
            self.journal.path,
            len(records),
            n,
            sorted(table.hosts),
            len(c.models),
            c.restarts,
            f"; launched the never-launched partitions {missing}" if missing else "",
        )

    def _adopt(self, i: int) -> None:
        """Partition `i`'s primary and backup processes as the journal left them (holds
        the coordinator's condition): its primary is the launch registered at the map's
        address (dead or alive: a dead one is replaced by the watchers as usual), else the
        live primary launch not yet registered; its backup the live backup launch."""
        c, table = self.coordinator, self.table
        with table.lock:
            mine = [x for x in table.launches.values() if x.partition == i]
            live = [x for x in mine if x.returncode is None and x.wanted]
            at_map = [x for x in mine if x.address and x.address == c.addresses[i]]
            primary = next(
                (x for x in at_map if x in live),
                next((x for x in live if x.role != "backup"), at_map[-1] if at_map else None),
            )
            backup = next((x for x in live if x is not primary and x.role == "backup"), None)
        for x in live:
            if x is not primary and x is not backup:
                table.unwant(x.number)
        self.procs[i] = RemoteShard(table, primary) if primary is not None else None
        self.backups[i] = RemoteShard(table, backup) if backup is not None else None
        if backup is not None and backup.address and c.backups[i] == backup.address:
            self.backup_addr[i] = backup.address
        else:
            c.backups[i] = ""  # its attached backup is gone: not promoted
            if backup is not None and backup.address:
                c.joining[i] = (backup.address, backup.pid)  # registered, not yet seeded

    def _slots(self) -> list[placement.Slot]:
        """Where each partition belongs: its processes' hosts, else a placement over the
        journaled live hosts."""
        weights = {h: x.weight for h, x in self.table.hosts.items() if x.alive}
        base = placement.place(self.num_shards, weights, self.replicas) if weights else []
        slots = []
        for i in range(self.num_shards):
            slot = base[i] if base else placement.Slot("")
            p, b = self.procs[i], self.backups[i]
            slots.append(
                placement.Slot(
                    p.host if p is not None else slot.primary,
                    b.host if b is not None else slot.backup,
                )
            )
        return slots

    def supervise(self) -> None:
        if self.journal is not None:
            threading.Thread(target=self._compact, name="journal compaction", daemon=True).start()
        super().supervise()

    def _compact(self) -> None:
        """Replace the journal by a snapshot whenever it outgrows its bound."""
        while not self.stop_event.wait(1.0):
            if self.journal.wants_compaction:
                self._start_journal()

    def _partition_bytes(self) -> list[int] | None:
        """Each partition's bytes, from its primary (None if one does not answer)."""
        with self.coordinator.cond:
            addresses = list(self.coordinator.addresses)
        out = []
        for address in addresses:
            try:
                with tls.open_channel(address, tls.env_ca()) as ch:
                    health = pb_grpc.ShardStub(ch).Health(
                        pb.Empty(), metadata=((TOKEN_KEY, self.token),), timeout=10
                    )
            except grpc.RpcError:
                return None
            out.append(health.nbytes)
        return out

    def _tend_more(self, i: int) -> None:
        """Plan the moves a newly joined or draining host calls for; carry out `i`'s next."""
        self.table.plan_joins()
        self.table.plan_drains()
        if i in self.table.lost or self.stop_event.is_set():
            return
        move = self.moves.take(i)
        if move is not None:
            run_move(self, move)

    def _launch(self, timeout: float) -> None:
        """Wait for `min_hosts` hosts, place the partitions on them, start them."""
        if self.announce:
            print(f"{LISTENING_PREFIX}{self.address}", flush=True)
        log.info("coordinator at %s: waiting for %d hosts to join", self.address, self.min_hosts)
        hosts = self._wait_for_joins()
        if not hosts:
            return  # stopped before they joined: main() sees no placement
        self._resize(self.partitions or sum(h.shards for h in hosts))
        with self.coordinator.cond:  # a new PS: no earlier one's restart count is repeated,
            self.coordinator.restarts = self.table.next_number  # so fits see the change
        if self.journal is not None:
            self._start_journal()
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
            c.terms = [0] * n

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
        if self.journal is not None:  # its shards stop with it: nothing left to resume
            self.journal.close(remove=True)


# ---------------------------------------------------------------- carrying out one move
class MoveFailed(Exception):
    pass


def run_move(svc: HostService, move: migrate.Move) -> None:
    """Carry `move` out on its partition's watcher thread; records its outcome."""
    i = move.partition
    move_log.warning(
        "moving partition %d's %s from host %s to %s (%s)",
        i,
        move.role,
        move.from_host,
        move.to_host,
        move.reason,
    )
    deadline = time.monotonic() + migrate.MOVE_SECONDS
    try:
        if move.role == "backup":
            _move_backup(svc, i, move.to_host, deadline)
        else:
            _move_primary(svc, move, deadline)
    except Exception as e:  # noqa: BLE001 - recorded: a move left "moving" would stall all
        why = e.details() if isinstance(e, grpc.RpcError) else str(e) or repr(e)
        move_log.error(
            "partition %d: moving its %s to host %s failed: %s",
            i,
            move.role,
            move.to_host,
            why,
            exc_info=not isinstance(e, (MoveFailed, grpc.RpcError)),
        )
        svc.moves.finish(move, why)
        if svc.replicas == 1 and svc.backups[i] is not None:  # the copy is no backup of ours
            svc._discard_backup(i, "was a move's copy, and the move failed")
        return
    svc.moves.finish(move)
    svc.coordinator.count("move")
    move_log.warning(
        "partition %d's %s is on host %s now (%.2fs)", i, move.role, move.to_host, move.seconds
    )


def _move_backup(svc: HostService, i: int, to: str, deadline: float) -> None:
    """Seed and attach a backup of `i` on host `to` (retiring one elsewhere first)."""
    b = svc.backups[i]
    if b is not None and b.host == to and svc.backup_addr[i]:
        return
    svc.table.set_slot(i, backup=to)
    if b is not None:
        svc._discard_backup(i, f"is retired: the partition's copy goes to host {to}")
    while not svc.backup_addr[i]:
        p = svc.procs[i]
        if p is None or p.poll() is not None:
            raise MoveFailed(f"its primary died before the copy on host {to} was seeded")
        if svc.stop_event.is_set():
            raise MoveFailed("the PS service is stopping")
        if time.monotonic() > deadline:
            raise MoveFailed(
                f"the copy on host {to} was not seeded within {migrate.MOVE_SECONDS:g}s"
            )
        svc._tend_backup(i, resync=False)  # starts it, seeds it once registered
        b = svc.backups[i]
        if b is not None and b.host != to:  # host `to` is gone: placed elsewhere
            raise MoveFailed(f"host {to} cannot take it (placed on {b.host} instead)")
        svc.stop_event.wait(0.05)


def _move_primary(svc: HostService, move: migrate.Move, deadline: float) -> None:
    i, to = move.partition, move.to_host
    old = svc.procs[i]
    if old is None or old.poll() is not None:
        raise MoveFailed("its primary is not running")
    if old.host == to:
        return
    _move_backup(svc, i, to, deadline)
    b, addr = svc.backups[i], svc.backup_addr[i]
    if svc.coordinator.backups[i] != addr:
        raise MoveFailed(f"its primary dropped the copy on host {to} before the hand-over")
    # the old primary steps down first (after its update in flight, which the copy has
    # too): from here no client reads or writes there, nor anywhere until the copy serves
    stopped = svc._configure(svc.coordinator.addresses[i], backup="", role="deposed")
    # the copy takes the next term if it has every update up to the step-down (fencing)
    try:
        promoted = fencing.promote_backup(
            svc.coordinator, i, addr, b.pid, svc._configure, min_seq=stopped.seq, planned=True
        )
    except grpc.RpcError:
        promoted = False
    if not promoted:  # neither serves now: the watcher restarts the partition (checkpoint)
        b.terminate()
        old.terminate()
        raise MoveFailed(f"the copy on host {to} could not take over from the deposed primary")
    svc.procs[i], svc.backups[i], svc.backup_addr[i] = b, None, ""
    svc.table.set_slot(i, primary=to, backup=move.backup_to if svc.replicas == 2 else "")
    old.terminate()  # its host stops it


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
    cli.add_ui_port(p)
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
    try:
        service.start(timeout=300)
    except journal.JournalError as e:
        service.stop()
        sys.exit(f"spark-ps-server coordinator: {e}")
    if not service.table.slots:
        log.warning("stopped before %d hosts joined", service.min_hosts)
        service.stop()
        return
    if args.ui_port is not None:
        service.start_ui(args.ui_port)
    print(f"{READY_PREFIX}{service.address}", flush=True)
    service.supervise()
