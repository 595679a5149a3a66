"""The coordinator's host table: hosts, their leases, and the shard processes they run.

A host is a `spark-ps-server shards --join` supervisor. Its first report registers it;
it then reports every ``heartbeat_seconds`` and on every death of one of its shard
processes. A host that has not reported for ``timeout`` seconds (its lease, five
heartbeats) is lost: every shard process it ran counts as dead with code
:data:`LOST_CODE`, and the service promotes backups and re-places partitions exactly
as for a single dead process.

Each shard process the coordinator wants is a *launch*: a partition, a role, a host
and a number unique in this coordinator. The supervisor starts each listed launch
once and never restarts it; the service decides what replaces a dead one (a promoted
backup, or a new launch, on the same host while it lives). A process registers with
its launch number, so one left over from a superseded launch can never enter the map.

:class:`RemoteShard` shows a launch to the service's supervision (``ps_server.coordinator.service``)
as the subset of ``subprocess.Popen`` it uses, so replication and recovery run the same
code on one host and across hosts.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from ps_server.coordinator import journal, migrate, placement
from ps_server.proto import ps_pb2 as pb
from ps_server.wire import RequestError

__all__ = ["HostTable", "RemoteShard", "LOST_CODE", "HEARTBEATS_PER_LEASE"]

log = logging.getLogger("ps_server.coordinator.hosts")

#: Exit code given to the processes of a host whose lease lapsed (as if SIGKILLed).
LOST_CODE = -9
#: A host is lost after missing this many heartbeats.
HEARTBEATS_PER_LEASE = 5
#: Exit code recorded for a launch its host was told to stop (no longer in its assignment).
STOPPED_CODE = -15
_DEAD_KEPT_PER_PARTITION = 4  # dead launches remembered (the map names their hosts)


@dataclass
class _Host:
    info: pb.HostInfo
    last_seen: float
    alive: bool = True
    told_stop: bool = False
    draining: bool = False  # `spark-ps-server drain`: being emptied, nothing new goes there
    retired: bool = False  # drained: told to stop

    @property
    def weight(self) -> float:
        """Memory budget in MB when the host has one, else its shard count."""
        return self.info.memory_mb or float(self.info.shards)


@dataclass
class _Launch:
    number: int
    partition: int
    role: str
    host: str
    restore: str
    pid: int = 0
    address: str = ""  # where it registered
    returncode: int | None = None
    wanted: bool = True

    def message(self) -> pb.ShardLaunch:
        return pb.ShardLaunch(
            incarnation=self.number, partition=self.partition, role=self.role, restore=self.restore
        )


class HostTable:
    """Hosts and launches of a PS across hosts; every method is thread-safe.

    Lock order: a caller may hold the coordinator's condition when it calls in (the
    shard map, registrations); nothing here calls out while holding `self.lock`.
    """

    def __init__(
        self,
        timeout: float = 10.0,
        replicas: int = 1,
        checkpoint_dir: str = "",
        max_request_mb: float = 0.0,
    ) -> None:
        if not timeout > 0:
            raise ValueError(f"host lease timeout must be > 0 seconds, got {timeout}")
        self.timeout, self.replicas = timeout, replicas
        self.checkpoint_dir, self.max_request_mb = checkpoint_dir, max_request_mb
        self.lock = threading.Condition()
        self.hosts: dict[str, _Host] = {}
        self.launches: dict[int, _Launch] = {}
        self.slots: list[placement.Slot] = []  # where each partition's replicas belong
        self.lost: dict[int, str] = {}  # partition -> why it is lost
        self.stopping = False
        # launch numbers are unique across coordinator restarts: continued from the journal
        # (ps_server.coordinator.journal), else from the clock, so no process of an earlier
        # run matches
        self.next_number = time.time_ns() // 1000
        self.journal: journal.Journal | None = None
        # hosts restored from the journal, not yet heard -> their launches restored with them
        self.rejoining: dict[str, set[int]] = {}

        self.moves = migrate.Moves()
        #: Each partition's bytes (asked of the primaries; set by the service): a drain
        #: is refused when they outgrow the other hosts' memory budgets.
        self.partition_bytes: Callable[[], list[int] | None] = lambda: None
        self.planned_for: set[str] = set()  # hosts the partitions were (re)balanced over

    def _log(self, record: dict, sync: bool = False) -> None:
        """Journal a change (holds the lock: records are in the order of the changes)."""
        if self.journal is not None:
            self.journal.append(record, sync)

    def replay(self, r: dict, now: float) -> None:
        """Apply one of the journal's host-table records (``journal.HOST_RECORDS``)."""
        t = r["t"]
        if t == "next_launch":
            self.next_number = max(self.next_number, int(r["n"]))
        elif t == "host":
            info = pb.HostInfo.FromString(journal.unb64(r["info"]))
            self.hosts[info.id] = _Host(info, now, alive=bool(r["alive"]))
        elif t == "launch":
            x = _Launch(int(r["n"]), int(r["partition"]), r["role"], r["host"], r["restore"])
            self.launches[x.number] = x
            self.next_number = max(self.next_number, x.number + 1)
        elif t == "lost":
            self.lost[int(r["i"])] = r["why"]
        else:  # registered, ended, unwanted
            x = self.launches.get(int(r["n"]))
            if x is None:
                return  # pruned before the snapshot
            if t == "registered":
                x.address, x.pid = r["address"], int(r["pid"])
            elif t == "ended":
                x.returncode, x.wanted = int(r["code"]), False
            else:
                x.wanted = False

    @property
    def heartbeat_seconds(self) -> float:
        return self.timeout / HEARTBEATS_PER_LEASE

    # ------------------------------------------------------------ hosts
    def report(self, report: pb.HostReport) -> pb.HostAssignment:
        """A supervisor's heartbeat: (re)register its host, record its processes' fates,
        and answer with the launches it must be running."""
        info = report.host
        if not info.id or not info.address or info.shards < 1 or info.memory_mb < 0:
            raise RequestError(
                "INVALID_ARGUMENT",
                f"host report needs an id, an address, shards >= 1 and memory_mb >= 0; got "
                f"id={info.id!r} address={info.address!r} shards={info.shards} "
                f"memory_mb={info.memory_mb}",
            )
        with self.lock:
            self._expire()
            if info.id in self.rejoining:
                self._rejoin(report)
            host = self.hosts.get(info.id)
            if host is not None and host.alive and host.info.run_id != info.run_id:
                raise RequestError(
                    "ALREADY_EXISTS",
                    f"host id {info.id!r} (address {info.address}) is held by another live "
                    f"supervisor at {host.info.address}; give each host a unique --host-id "
                    f"(or wait {self.timeout:g}s for the old one's lease to lapse)",
                )
            if host is None or not host.alive:
                self.planned_for.discard(info.id)  # back with nothing: it may take a share
                log.warning(
                    "host %s (%s) %s: %d shard slots, %.0f MB",
                    info.id,
                    info.address,
                    "joined" if host is None else "is back (its old shards are not)",
                    info.shards,
                    info.memory_mb,
                )
                host = self.hosts[info.id] = _Host(pb.HostInfo(), 0.0)
            if host.info != info or not host.alive:
                self._log({"t": "host", "info": journal.b64(info), "alive": True}, sync=True)
            host.info.CopyFrom(info)
            host.last_seen, host.alive = time.monotonic(), True
            for proc in report.processes:
                self._record(info.id, proc)
            self._stopped(info.id)
            if host.draining and not host.retired and self._empty(info.id):
                host.retired = True
                log.warning("host %s holds no partition now: drained, told to stop", info.id)
            host.told_stop = self.stopping or host.retired
            self.lock.notify_all()
            if host.retired:
                return pb.HostAssignment(heartbeat_seconds=self.heartbeat_seconds, stop=True)
            return pb.HostAssignment(
                launches=[
                    launch.message()
                    for launch in self.launches.values()
                    if launch.host == info.id and launch.wanted and launch.returncode is None
                ],
                heartbeat_seconds=self.heartbeat_seconds,
                stop=self.stopping,
                max_request_mb=self.max_request_mb,
            )

    def _rejoin(self, report: pb.HostReport) -> None:
        """The first report of a host restored from the journal (holds the lock): its
        launches that the report does not list died or never started while the coordinator
        was down, and all of them did if its supervisor is a new run (shards die with it)."""
        restored = self.rejoining.pop(report.host.id)
        old = self.hosts.get(report.host.id)
        same_run = old is not None and old.info.run_id == report.host.run_id
        listed = {p.incarnation for p in report.processes} if same_run else set()
        if old is not None and not same_run:
            old.alive = False  # "is back": its old shards are not
        for x in [self.launches[n] for n in sorted(restored) if n in self.launches]:
            if x.returncode is None and x.number not in listed:
                x.returncode, x.wanted = LOST_CODE, False
                self._log({"t": "ended", "n": x.number, "code": LOST_CODE})
                log.warning(
                    "host %s rejoined without shard %d (%s, launch %d): it is dead",
                    report.host.id,
                    x.partition,
                    x.role,
                    x.number,
                )

    def _record(self, host: str, proc: pb.ShardProcess) -> None:
        launch = self.launches.get(proc.incarnation)
        if launch is None or launch.host != host:
            return
        launch.pid = launch.pid or proc.pid
        if proc.exited and launch.returncode is None:
            launch.returncode, launch.wanted = proc.exit_code, False
            self._log({"t": "ended", "n": launch.number, "code": proc.exit_code})
            self.lock.notify_all()

    def _stopped(self, host: str) -> None:
        """The launches of `host` left out of its assignment are being stopped by it now:
        record them as ended (holds the lock)."""
        for launch in self.launches.values():
            if launch.host == host and not launch.wanted and launch.returncode is None:
                launch.returncode = STOPPED_CODE

    def _empty(self, host: str) -> bool:
        """Whether `host` runs no wanted launch and no move involves it (holds the lock)."""
        busy = any(
            x.host == host and x.wanted and x.returncode is None for x in self.launches.values()
        )
        return not busy and not self.moves.pending(f"drain {host}")

    def _expire(self) -> None:
        """Declare lost every host whose lease lapsed (holds the lock)."""
        now = time.monotonic()
        for host in self.hosts.values():
            if host.alive and now - host.last_seen > self.timeout:
                host.alive = False
                self.rejoining.pop(host.info.id, None)
                self._log({"t": "host", "info": journal.b64(host.info), "alive": False})
                if host.retired:
                    log.info("host %s (drained) stopped", host.info.id)
                    continue
                dead = [x for x in self.launches.values() if x.host == host.info.id]
                dead = [x for x in dead if x.returncode is None]
                for launch in dead:
                    launch.returncode, launch.wanted = LOST_CODE, False
                    self._log({"t": "ended", "n": launch.number, "code": LOST_CODE})
                log.error(
                    "host %s (%s) sent no heartbeat for %.1fs (lease %.1fs): lost, with its "
                    "shard processes (partition/role at launch) %s",
                    host.info.id,
                    host.info.address,
                    now - host.last_seen,
                    self.timeout,
                    [f"{x.partition}/{x.role}" for x in dead] or "(none)",
                )
                self.lock.notify_all()

    def live_weights(self) -> dict[str, float]:
        with self.lock:
            self._expire()
            return {
                h: host.weight for h, host in self.hosts.items() if host.alive and not host.draining
            }

    def wait_for_hosts(self, count: int, stopped: Callable[[], bool]) -> list[pb.HostInfo]:
        """Block until `count` hosts are alive; returns them ([] once `stopped()`)."""
        with self.lock:
            while not stopped():
                self._expire()
                alive = [h.info for h in self.hosts.values() if h.alive]
                if len(alive) >= count:
                    return alive
                self.lock.wait(0.2)
            return []

    # ------------------------------------------------------------ placement & launches
    def place_all(self, num_partitions: int) -> list[placement.Slot]:
        """Place every partition on the live hosts (once, before the first launch)."""
        weights = self.live_weights()
        slots = placement.place(num_partitions, weights, self.replicas)
        with self.lock:
            self.slots = slots
            self.planned_for = set(weights)
        log.info("placed %d partitions: %s", num_partitions, _summary(slots))
        return slots

    def launch(self, partition: int, role: str, avoid: str = "") -> _Launch | None:
        """A new launch of `partition` in `role` on its placed host, or on its next choice
        among live hosts other than `avoid` (the other replica's); None without a host."""
        weights = self.live_weights()
        with self.lock:
            slot = self.slots[partition]
            backup = role == "backup"
            host = slot.backup if backup else slot.primary
            if host not in weights or host == avoid:
                loads = Counter(x.host for x in self.launches.values() if x.wanted)
                caps = placement.capacity(weights, len(self.slots) * self.replicas)
                host = placement.choose(partition, weights, loads, caps, exclude={avoid} - {""})
            if not host:
                return None
            self.slots[partition] = (
                placement.Slot(slot.primary, host) if backup else placement.Slot(host, slot.backup)
            )
            restore = self.checkpoint_dir  # a backup does not restore, but checkpoints there
            launch = _Launch(self.next_number, partition, role, host, restore)
            self.next_number += 1
            self.launches[launch.number] = launch
            self._log(journal.launch_record(launch), sync=True)  # before its host hears of it
            self._prune()
            return launch

    def _prune(self) -> None:
        """Forget the oldest dead launches beyond a bound (holds the lock): a service that
        runs for months restarts shards without bound."""
        dead = [n for n, x in self.launches.items() if x.returncode is not None]
        for n in dead[: max(0, len(dead) - _DEAD_KEPT_PER_PARTITION * len(self.slots))]:
            del self.launches[n]

    def set_slot(self, partition: int, primary: str | None = None, backup: str | None = None):
        """Where `partition`'s primary and backup belong from now on (None: unchanged)."""
        with self.lock:
            slot = self.slots[partition]
            self.slots[partition] = placement.Slot(
                slot.primary if primary is None else primary,
                slot.backup if backup is None else backup,
            )

    # ------------------------------------------------------------ scale out and in
    def plan_joins(self) -> None:
        """Plan the moves that give each host that joined since the placement its share."""
        weights = self.live_weights()
        with self.lock:
            new = sorted(set(weights) - self.planned_for) if self.slots else []
            if not new or self.stopping:
                return
            slots = list(self.slots)
            self.planned_for |= set(new)
        for host in new:  # one at a time, each over the hosts of the one before
            moves = migrate.plan_join(slots, weights, host, self.replicas)
            self.moves.add(moves)
            for m in moves:
                s = slots[m.partition]
                slots[m.partition] = (
                    placement.Slot(host, s.backup)
                    if m.role == "primary"
                    else placement.Slot(s.primary, host)
                )

    def drain(self, host_id: str) -> None:
        """Plan moving every replica off `host_id`; RequestError when it is unknown or the
        other live hosts cannot hold them. Its supervisor is told to stop once it is empty.
        May block on the primaries (their bytes): not for the coordinator's event loop."""
        weights = self.live_weights()
        with self.lock:
            host = self.hosts.get(host_id)
            if host is None or not host.alive or host.retired:
                known = sorted(h for h, x in self.hosts.items() if x.alive and not x.retired)
                raise RequestError(
                    "NOT_FOUND",
                    f"drain: no live host {host_id!r}; live hosts: {', '.join(known) or 'none'}",
                )
            weights.pop(host_id, None)
            slots = list(self.slots)
            budgets = {h: self.hosts[h].info.memory_mb for h in weights}
        try:
            nbytes = self.partition_bytes() if budgets and all(budgets.values()) else None
            moves = migrate.plan_drain(slots, weights, host_id, self.replicas, budgets, nbytes)
        except ValueError as e:
            raise RequestError("FAILED_PRECONDITION", str(e)) from None
        with self.lock:
            host.draining = True
        self.moves.cancel(host_id)
        planned = self.moves.add(moves)  # one busy with another move: plan_drains() later
        log.warning(
            "draining host %s: %d of its %d replica moves planned now",
            host_id,
            len(planned),
            len(moves),
        )

    def plan_drains(self) -> None:
        """Plan the moves off each draining host that its drain could not plan at once (a
        partition then moving, e.g. onto it)."""
        weights = self.live_weights()
        with self.lock:
            draining = [h for h, x in self.hosts.items() if x.draining and not x.retired]
            slots = list(self.slots)
        for host in draining:
            reason = f"drain {host}"
            if self.moves.pending(reason):
                continue
            planned = self.moves.partitions(reason)
            left = [
                p for p, s in enumerate(slots) if host in (s.primary, s.backup) and p not in planned
            ]
            if not left:
                continue
            try:
                moves = migrate.plan_drain(slots, weights, host, self.replicas)
            except ValueError as e:
                log.error("%s", e)
                continue
            self.moves.add([m for m in moves if m.partition in left])

    def swap(self, partition: int) -> None:
        """The backup of `partition` was promoted: primary and backup hosts trade places."""
        with self.lock:
            slot = self.slots[partition]
            self.slots[partition] = placement.Slot(slot.backup, slot.primary)

    def check_registration(self, request: pb.RegisterShardRequest) -> None:
        """Refuse a shard process that is not a current launch of its partition and host."""
        with self.lock:
            launch = self.launches.get(request.incarnation)
            current = (
                launch is not None
                and launch.wanted
                and launch.returncode is None
                and (launch.host, launch.partition) == (request.host_id, request.index)
                and (launch.role == "backup") == request.backup
            )
            if not current:
                raise RequestError(
                    "FAILED_PRECONDITION",
                    f"shard {request.index} at {request.address} (host {request.host_id!r}, "
                    f"launch {request.incarnation}) is not a current launch of that partition "
                    "on that host; refused",
                )
            launch.address, launch.pid = request.address, request.pid
            record = {"t": "registered", "n": launch.number, "address": request.address}
            self._log({**record, "pid": request.pid}, sync=True)

    def lose(self, partition: int, why: str) -> None:
        """Mark `partition` lost: clients get `why` instead of a shard."""
        with self.lock:
            self.lost[partition] = why
            self._log({"t": "lost", "i": partition, "why": why}, sync=True)

    def state(self, number: int) -> tuple[int | None, int, bool]:
        """(returncode, pid, whether its host was told to stop) of a launch."""
        with self.lock:
            self._expire()
            launch = self.launches.get(number)
            if launch is None:  # pruned: long dead
                return LOST_CODE, 0, True
            host = self.hosts.get(launch.host)
            return launch.returncode, launch.pid, host is None or host.told_stop

    def unwant(self, number: int) -> None:
        """Ask the launch's host to stop its process (at its next heartbeat)."""
        with self.lock:
            if number in self.launches:
                self.launches[number].wanted = False
                self._log({"t": "unwanted", "n": number})

    # ------------------------------------------------------------ the shard map
    def annotate(self, smap: pb.ShardMap) -> None:
        """Fill in the map's hosts, each replica's host and the lost partitions."""
        with self.lock:
            self._expire()
            now = time.monotonic()
            for host in self.hosts.values():
                info = smap.hosts.add()
                info.CopyFrom(host.info)
                info.alive, info.seconds_since_heartbeat = host.alive, now - host.last_seen
                info.draining, info.retired = host.draining, host.retired
            where = {x.address: x.host for x in self.launches.values() if x.address}
            smap.primary_hosts.extend(where.get(a, "") for a in smap.addresses)
            smap.backup_hosts.extend(where.get(a, "") for a in smap.backups)
            smap.lost.extend(self.lost.get(i, "") for i in range(len(smap.addresses)))
        smap.moves.extend(self.moves.messages())


def _summary(slots: list[placement.Slot]) -> str:
    load = Counter(s.primary for s in slots)
    backups = Counter(s.backup for s in slots if s.backup)
    return ", ".join(f"{h}: {load[h]} primaries, {backups[h]} backups" for h in sorted(load))


class RemoteShard:
    """A launch seen as the part of ``subprocess.Popen`` that the service's supervision
    uses: ``poll``/``returncode`` from its host's reports (or its lease), ``pid`` as
    reported, ``terminate``/``kill`` by dropping it from the host's assignment."""

    def __init__(self, table: HostTable, launch: _Launch) -> None:
        self.table, self.number = table, launch.number
        self.host, self.partition, self.role = launch.host, launch.partition, launch.role

    @property
    def pid(self) -> int:
        return self.table.state(self.number)[1]

    @property
    def returncode(self) -> int | None:
        return self.table.state(self.number)[0]

    def poll(self) -> int | None:
        return self.returncode

    def terminate(self) -> None:
        self.table.unwant(self.number)

    kill = terminate

    def wait(self, timeout: float | None = None) -> int | None:
        """Until its host reports it gone, is lost, or was told to stop (at most `timeout`,
        or one lease)."""
        deadline = time.monotonic() + (timeout if timeout is not None else self.table.timeout)
        while time.monotonic() < deadline:
            code, _, told_stop = self.table.state(self.number)
            if code is not None or told_stop:
                return code
            time.sleep(0.05)
        return self.returncode

    def __repr__(self) -> str:
        return f"RemoteShard(partition {self.partition}, {self.role}, host {self.host})"
