"""The control plane: shard map, model registry, barriers, clocks, the round board,
the task queues and the recovery counters.

Served by ``grpc.aio`` (``ps_server.coordinator.loop_server``): every handler is a coroutine on one
event loop, and a blocking call (barrier, SSP clock, board wait, collect, task lease) is
a future parked in ``ps_server.coordinator.waiting.Waiters`` under the key of what it waits for, so
waiting costs no thread (the reasons for this design are in ``ps_server.coordinator.waiting``).
Whatever changes that state notifies the key, and the waiter runs its check again. A
worker that is removed (lost executor, failed task) stops counting, so nobody waits for
the dead forever; every wait ends by its request's timeout (``waiting.wait_deadline``).

All state is guarded by ``self.cond`` (a re-entrant lock, kept under that name for the
service's supervisor threads, which call ``promote``, ``attach_backup``, ``drop_backup``,
``count`` and ``ready`` and read the shard map under it). The loop holds it only for
short, non-blocking steps; ``Waiters.notify`` is safe from those threads too.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import defaultdict, deque
from collections.abc import Callable, Hashable
from typing import TypeVar

import numpy as np

from ps_server import fencing
from ps_server.coordinator import journal
from ps_server.coordinator.fits import FitBoard
from ps_server.coordinator.idle import LastUse, idle_ttl
from ps_server.coordinator.tasks import TaskQueue
from ps_server.coordinator.waiting import Waiters, wait_deadline
from ps_server.proto import ps_pb2 as pb
from ps_server.proto import ps_pb2_grpc as pb_grpc
from ps_server.wire import RequestError, from_array, guard, to_array

__all__ = ["CoordinatorServicer", "COUNTERS"]

log = logging.getLogger("ps_server.coordinator.servicer")

#: Counters `GetMetrics` always reports (others appear once counted).
COUNTERS = (
    "restart",  # shard processes started again by the service (state from a checkpoint)
    "promotion",  # backups that took over from a dead primary (no update lost)
    "restore",  # fits that rolled their tensors back to a checkpoint
    "checkpoint",  # sealed checkpoint versions
    "iteration_lost",  # fit iterations (LR) / trees (GBT) redone after a restore
    "task_requeued",  # task-queue leases given back (lapsed or worker lost)
    "worker_lost",  # RemoveWorker calls: a worker, or an executor and all its workers
)


_guard = guard(lambda self: "coordinator")
#: Released clock calls kept for inspection (`GetClockLog`); older ones are dropped.
CLOCK_LOG_SIZE = 100_000
#: Floor of the pause between two looks at a task queue's lapsing leases.
_LEASE_RECHECK_SECONDS = 0.01

T = TypeVar("T")


class CoordinatorServicer(pb_grpc.CoordinatorServicer):
    """State of the control plane; all fields are guarded by `self.cond` (see module doc)."""

    def __init__(
        self,
        num_shards: int,
        on_shutdown: Callable[[], None] | None = None,
        max_request_bytes: int = 0,
        idle_seconds: float | None = None,
    ):
        self.cond = threading.RLock()
        self.waiters = Waiters()
        self.max_request_bytes = max_request_bytes
        self.ui_url = ""  # the status page's URL, once served (Service.start_ui)
        self.addresses = [""] * num_shards  # the primaries (or solo shards) clients use
        self.pids = [0] * num_shards  # process ids of the primaries
        self.backups = [""] * num_shards  # seeded backups, promoted if their primary dies
        self.joining: dict[int, tuple[str, int]] = {}  # index -> (address, pid) to seed
        self.dropped: set[tuple[int, str]] = set()  # backups never to attach or promote
        # replication terms (ps_server.fencing): the current primary's, per index, and the
        # (term, seq) each attached backup was attached at
        self.terms = [0] * num_shards
        self.attached: dict[int, tuple[int, int]] = {}
        self.counters: dict[str, int] = _Counters(self._log_counters)
        self.epoch = 0
        self.restarts = 0  # primaries (re)started: their state is a checkpoint's (or empty)
        self.models: dict[str, pb.ModelSpec] = {}
        self.barriers: dict[str, tuple[int, set[str]]] = {}  # name -> (generation, arrived)
        self.clocks: dict[str, dict[str, int]] = defaultdict(dict)
        self.removed: dict[str, set[str]] = defaultdict(set)
        self.clock_log: deque[pb.ClockEntry] = deque(maxlen=CLOCK_LOG_SIZE)
        self.heartbeats: dict[tuple[str, str], float] = {}  # monotonic stamps
        self.removed_executors: set[str] = set()  # "executor:<id>" removed from every group
        self.board: dict[str, tuple[int, str]] = {}
        self.parts: dict[tuple[str, int], dict[int, np.ndarray]] = defaultdict(dict)
        # topic -> (round, parts) of its last Collect: a retry whose answer was lost (the
        # coordinator killed as it answered) gets the same sum again
        self.collected: dict[str, tuple[int, dict[int, np.ndarray]]] = {}
        self.queues: dict[str, TaskQueue] = {}
        self.last_use = LastUse(idle_ttl() if idle_seconds is None else idle_seconds)
        self._on_shutdown = on_shutdown
        self.hosts = None  # a service across hosts: its ps_server.coordinator.hosts.HostTable
        self.journal: journal.Journal | None = None  # across hosts, with a checkpoint dir
        self.fits = FitBoard()  # the fits' progress, for the status page (ps_server.coordinator.ui)

    def _log(self, record: dict, sync: bool = False) -> None:
        """Journal a change (under `cond`, so records are in the order of the changes)."""
        if self.journal is not None:
            self.journal.append(record, sync)

    def _log_counters(self) -> None:
        self._log({"t": "counters", "c": dict(self.counters)})

    def count(self, event: str, n: int = 1) -> int:
        """Add `n` to the counter of a recovery event ("restart", "promotion", "restore",
        "task_requeued", ...); the hook for the service, the replicas and fits."""
        with self.cond:
            self.counters[event] += int(n)
            return self.counters[event]

    def _use(self, kind: str, key: Hashable) -> None:
        """Record that `key` of `kind` ("board", "parts", "barrier", "clock", "heartbeat",
        "queue", "executor") was used now, and drop what has been idle for the ttl
        (holds `cond`; see ps_server.coordinator.idle)."""
        self.last_use.touch(kind, key)
        for kind, key in self.last_use.expired():
            if kind == "board":
                self.board.pop(key, None)
            elif kind == "parts":
                for k in [k for k in self.parts if k[0] == key]:
                    del self.parts[k]
                self.collected.pop(key, None)
            elif kind == "barrier":
                self.barriers.pop(key, None)
                self.removed.pop(key, None)
            elif kind == "clock":
                self.clocks.pop(key, None)
                self.removed.pop(key, None)
            elif kind == "heartbeat":
                self.heartbeats.pop(key, None)
            elif kind == "queue":
                self.queues.pop(key, None)
                self.removed.pop(key, None)
            elif kind == "executor":
                self.removed_executors.discard(key)

    def map_changed(self) -> None:
        """Wake what waits on the shard map (for code that changed it from outside)."""
        self._notify(_SHARDS)

    def _notify(self, *keys: Hashable) -> None:
        """Wake the calls waiting on `keys` (any thread; under `cond` or not)."""
        self.waiters.notify(*keys)

    async def _until(
        self,
        keys: tuple[Hashable, ...],
        attempt: Callable[[], T | None],
        deadline: float,
        recheck_at: Callable[[], float | None] | None = None,
    ) -> T | None:
        """Run `attempt()` under `cond` now and whenever `keys` are notified, until it
        returns a result (returned) or monotonic `deadline` passes (None).

        `attempt` checks and acts in one step, so nothing comes between the two;
        `recheck_at()` (under `cond` too) is a time to look again although nobody
        notified (a lease that may lapse), or None.
        """
        while True:
            with self.cond:
                got = attempt()
                wake = recheck_at() if got is None and recheck_at is not None else None
            if got is not None:
                return got
            if time.monotonic() >= deadline:
                return None
            until = deadline if wake is None else min(deadline, wake)
            await self.waiters.park(keys, until)

    # ------------------------------------------------------------ shards & models
    def ready(self) -> bool:
        with self.cond:
            return all(self.addresses)

    def _map(self) -> pb.ShardMap:
        smap = pb.ShardMap(
            addresses=self.addresses,
            epoch=self.epoch,
            backups=self.backups,
            restarts=self.restarts,
            max_request_bytes=self.max_request_bytes,
            ui_url=self.ui_url,
        )
        if self.hosts is not None:
            self.hosts.annotate(smap)
        return smap

    def _check_index(self, index: int) -> None:
        if not 0 <= index < len(self.addresses):
            raise RequestError(
                "OUT_OF_RANGE", f"shard index {index} not in [0, {len(self.addresses)})"
            )

    @_guard
    async def GetShardMap(self, request, context):
        with self.cond:
            if self.hosts is not None and not (self.hosts.slots and all(self.addresses)):
                raise RequestError(  # clients retry an unavailable coordinator
                    "UNAVAILABLE",
                    "the PS coordinator is starting: its hosts have not all joined, or its "
                    "partitions not all registered",
                )
            return self._map()

    @_guard
    async def RegisterShard(self, request, context):
        return self.register_shard(request)

    def register_shard(self, request: pb.RegisterShardRequest) -> pb.ShardMap:
        """A primary (or solo shard) enters the map in a new term; a backup waits to be
        seeded."""
        with self.cond:
            self._check_index(request.index)
            if self.hosts is not None and request.host_id:
                self.hosts.check_registration(request)  # a superseded process is refused
            i = request.index
            if request.backup:
                self.joining[i] = (request.address, request.pid)
            elif (self.addresses[i], self.pids[i]) != (request.address, request.pid):
                # (a retry of a registration already made is not another start)
                self.addresses[i] = request.address
                self.pids[i] = request.pid
                self.backups[i] = ""  # a new primary starts without a backup
                self.attached.pop(i, None)
                self.epoch += 1
                self.terms[request.index] = self.epoch  # a new term: the old one is fenced
                self.restarts += 1
                self._log(journal.shard_record(self, i), sync=True)
            self._notify(_SHARDS)
            return self._map()

    @_guard
    async def DropReplica(self, request, context):
        return self.drop_replica(request)

    def drop_replica(self, request: pb.RegisterShardRequest) -> pb.ShardMap:
        """The primary of `index` could not update its backup: never promote that one.

        Refused to a primary of an older term (its backup was promoted while it was cut
        off): it must step down rather than acknowledge on its own (``fencing.drop_refusal``).
        """
        i = request.index
        with self.cond:
            self._check_index(i)
            why = fencing.drop_refusal(self.terms[i], self.pids[i], request.term, request.pid)
            if why is not None:
                raise RequestError(
                    "FAILED_PRECONDITION", f"shard {i} (primary {self.addresses[i]}): {why}"
                )
            self.drop_backup(i, request.address)
            return self._map()

    def drop_backup(self, index: int, address: str) -> bool:
        """Never promote `address` as the backup of `index`: forget it if it is the backup,
        and refuse to attach it later if it is not yet (its primary dropped it between the
        seed and the attach: it missed an update). True if it was the attached backup."""
        with self.cond:
            if not address:
                return False
            self.dropped.add((index, address))
            self._log({"t": "dropped", "i": index, "address": address}, sync=True)
            if self.backups[index] != address:
                return False
            self.backups[index] = ""
            self.attached.pop(index, None)
            self._log(journal.shard_record(self, index), sync=True)
            self.counters["backup_lost"] += 1
            self._notify(_SHARDS)
            return True

    def attach_backup(
        self, index: int, address: str, term: int, seq: int, resync: bool = True
    ) -> bool:
        """A backup of `index`, seeded by the primary of `term`, receives every update from
        that primary's `seq` on (the supervisor's Configure answered both); False, and not
        attached, if its primary dropped it meanwhile or the index moved to another term."""
        with self.cond:
            self.joining.pop(index, None)
            why = fencing.attach_refusal(self.terms[index], term, (index, address) in self.dropped)
            if why is not None:
                log.warning("shard %d: backup %s not attached: %s", index, address, why)
                return False
            self.dropped = {d for d in self.dropped if d[0] != index}  # those are gone
            self.backups[index] = address
            self.attached[index] = (term, seq)
            self._log({**journal.shard_record(self, index), "undrop": True}, sync=True)
            self.counters["resync"] += int(resync)
            self._notify(_SHARDS)
            return True

    def fence(self, index: int) -> fencing.Promotion | None:
        """Start promoting the backup of `index`: move the index to a new term at once (the
        old primary's drops are refused from now on), and say which backup to promote, in
        which term, and what it must prove (``fencing.promotion``). None, and no new term,
        if no backup is promotable."""
        with self.cond:
            offer = fencing.promotion(
                self.backups[index], self.attached.get(index), self.terms[index], self.epoch + 1
            )
            if offer is not None:
                self.epoch = self.terms[index] = offer.term
                self._log(journal.shard_record(self, index), sync=True)
                self._notify(_SHARDS)
            return offer

    def promote(self, index: int, pid: int, term: int, planned: bool = False) -> str:
        """The backup of `index` (process `pid`), which became primary in `term` (``fence``),
        is its primary in the map; returns its address ("" if the index moved on since).
        `planned`: a hand-over of a live primary (a move, ps_server.coordinator.migrate), not
        counted as a promotion."""
        with self.cond:
            address = self.backups[index]
            if address and self.terms[index] == term:
                self.addresses[index], self.backups[index] = address, ""
                self.attached.pop(index, None)
                self.pids[index] = pid
                self.epoch += 1
                self._log(journal.shard_record(self, index), sync=True)
                self.counters["handover" if planned else "promotion"] += 1
                self._notify(_SHARDS)
                return address
            return ""

    @_guard
    async def RegisterModel(self, request, context):
        with self.cond:
            old = self.models.get(request.name)
            if old is not None and old != request:
                raise RequestError(
                    "ALREADY_EXISTS",
                    f"model {request.name!r} exists with kind={old.kind} dim={old.dim} "
                    f"cols={old.cols} dtype={old.dtype}; asked for kind={request.kind} "
                    f"dim={request.dim} cols={request.cols} dtype={request.dtype}",
                )
            if old is None:
                self._log({"t": "model", "spec": journal.b64(request)}, sync=True)
            self.models[request.name] = request
            return pb.Ack(value=len(self.models))

    @_guard
    async def GetModel(self, request, context):
        with self.cond:
            spec = self.models.get(request.name)
        if spec is None:
            raise RequestError("NOT_FOUND", f"unknown model {request.name!r}")
        return spec

    @_guard
    async def UnregisterModel(self, request, context):
        """Forget a dropped model, so its name may be registered again with any spec."""
        with self.cond:
            gone = self.models.pop(request.name, None) is not None
            if gone:
                self._log({"t": "unmodel", "name": request.name}, sync=True)
            return pb.Ack(value=int(gone))

    # ------------------------------------------------------------ synchronization
    async def _wait_or_fail(
        self,
        keys: tuple[Hashable, ...],
        attempt: Callable[[], T | None],
        request,
        context,
        what: Callable[[], str],
    ) -> T:
        """`_until` within the request's timeout; DEADLINE_EXCEEDED naming `what()` after."""
        got = await self._until(keys, attempt, wait_deadline(request.timeout, _left(context)))
        if got is None:
            with self.cond:
                raise RequestError(
                    "DEADLINE_EXCEEDED", f"{what()}: timed out after {request.timeout}s"
                )
        return got

    @_guard
    async def Barrier(self, request, context):
        name, worker = request.name, request.worker
        if not worker:
            raise RequestError("INVALID_ARGUMENT", f"barrier {name!r}: empty worker id")
        with self.cond:
            self._use("barrier", name)
            generation, arrived = self.barriers.setdefault(name, (0, set()))
            arrived.add(worker)
        released = await self._wait_or_fail(
            (("barrier", name),),
            lambda: self._release_barrier(name, generation, request.count),
            request,
            context,
            lambda: f"barrier {name!r} ({len(arrived - self.removed[name])}/{request.count})",
        )
        return pb.Ack(value=released)

    def _release_barrier(self, name: str, generation: int, count: int) -> int | None:
        """The next generation once `generation` of barrier `name` is released, else None.

        It is released when its live arrivals (removed workers do not count, whether
        they were removed before or after they arrived) reach `count` minus the removed.
        """
        current, arrived = self.barriers[name]
        if current > generation:
            return generation + 1
        removed = self.removed[name]
        if len(arrived - removed) < count - len(removed):
            return None
        self.barriers[name] = (generation + 1, set())
        self._notify(("barrier", name))
        return generation + 1

    @_guard
    async def Clock(self, request, context):
        group, worker = request.group, request.worker
        with self.cond:
            self._use("clock", group)
            clocks = self.clocks[group]
            _check_clock(request, clocks, self.removed[group])
            if request.clock > clocks.get(worker, 0) or worker not in clocks:
                clocks[worker] = max(clocks.get(worker, 0), request.clock)
                self._log({"t": "clock", "group": group, "worker": worker, "clock": clocks[worker]})
            self._notify(("clock", group))
        return await self._wait_or_fail(
            (("clock", group),),
            lambda: self._release_clock(request),
            request,
            context,
            lambda: f"clock {group!r} worker {worker!r}",
        )

    def _live_min(self, group: str, num_workers: int) -> int | None:
        """The smallest clock of the live workers of `group`, None until all have one."""
        removed = self.removed[group]
        live = [c for w, c in self.clocks[group].items() if w not in removed]
        if len(live) < num_workers - len(removed):
            return None
        return min(live)

    def _release_clock(self, request: pb.ClockRequest) -> pb.ClockResponse | None:
        """The answer once every live worker is within `staleness` clocks (logged), else None."""
        m = self._live_min(request.group, request.num_workers)
        if m is None or m < request.clock - request.staleness:
            return None
        self.clock_log.append(
            pb.ClockEntry(
                group=request.group,
                worker=request.worker,
                clock=request.clock,
                min_clock=m,
                staleness=request.staleness,
            )
        )
        return pb.ClockResponse(min_clock=m)

    @_guard
    async def GetClockLog(self, request, context):
        """The logged clock calls of groups starting with `request.group` (all with "")."""
        with self.cond:
            return pb.ClockLog(
                entries=[e for e in self.clock_log if e.group.startswith(request.group)]
            )

    @_guard
    async def Heartbeat(self, request, context):
        with self.cond:
            self.heartbeats[(request.group, request.worker)] = time.monotonic()
            self._use("heartbeat", (request.group, request.worker))
        return pb.Ack()

    @_guard
    async def RemoveWorker(self, request, context):
        """Drop a worker from a group; group "*" with worker "executor:<id>" drops every
        worker of that executor (ids "executor:<id>/...") from every group."""
        with self.cond:
            if request.group != "*":
                self.removed[request.group].add(request.worker)
                self._log({"t": "removed", "group": request.group, "worker": request.worker})
                self._lost(request.worker, lambda w: w == request.worker, {request.group})
                return pb.Ack(value=1)
            prefix = request.worker + "/"
            self.removed_executors.add(request.worker)
            self._log({"t": "removed_executor", "worker": request.worker})
            self._use("executor", request.worker)
            n, touched = 0, set()
            groups = set(self.clocks) | {g for g, _ in self.heartbeats}
            for group in groups:
                known = set(self.clocks.get(group, {})) | {
                    w for g, w in self.heartbeats if g == group
                }
                for worker in known:
                    if worker.startswith(prefix) and worker not in self.removed[group]:
                        self.removed[group].add(worker)
                        self._log({"t": "removed", "group": group, "worker": worker})
                        touched.add(group)
                        n += 1
            self._lost(request.worker, lambda w: w.startswith(prefix), touched, everywhere=True)
            return pb.Ack(value=n)

    def _lost(
        self, who: str, match: Callable[[str], bool], groups: set[str], everywhere: bool = False
    ) -> None:
        """Count a lost worker (or executor), give its leased tasks back and wake whoever
        waits on `groups` (holds `cond`); `everywhere`: its tasks in every queue."""
        self.counters["worker_lost"] += 1
        for q in self.queues.values():
            if everywhere or q.name in groups:
                back = q.requeue(match, f"{who} was removed")
                self.counters["task_requeued"] += back
                if back:
                    self._notify(("queue", q.name))
        self._notify(*[(kind, g) for g in groups for kind in ("barrier", "clock")])

    # ------------------------------------------------------------ the round board
    @_guard
    async def Post(self, request, context):
        with self.cond:
            self._use("board", request.topic)
            self.board[request.topic] = (request.round, request.payload)
            post = {"topic": request.topic, "round": request.round, "payload": request.payload}
            self._log({"t": "post", **post})
            self._notify(("board", request.topic))
        return pb.Ack(value=request.round)

    @_guard
    async def Wait(self, request, context):
        topic = request.topic
        with self.cond:
            self._use("board", topic)

        def posted() -> pb.PostRequest | None:
            round_, payload = self.board.get(topic, (-1 << 62, ""))
            if round_ < request.min_round:
                return None
            return pb.PostRequest(topic=topic, round=round_, payload=payload)

        return await self._wait_or_fail(
            (("board", topic),),
            posted,
            request,
            context,
            lambda: f"wait for {topic!r} round {request.min_round}",
        )

    @_guard
    async def Contribute(self, request, context):
        values = from_array(request.values, f"contribution to {request.topic!r}", ndim=(1,))
        values = values.astype(np.float64)
        with self.cond:
            self._use("parts", request.topic)
            self.parts[(request.topic, request.round)][request.part] = values
            self._log(journal.part_record(request.topic, request.round, request.part, values))
            self._notify(("parts", request.topic, request.round))
        return pb.Ack(value=request.part)

    @_guard
    async def Collect(self, request, context):
        key = (request.topic, request.round)
        with self.cond:
            self._use("parts", request.topic)

        def take() -> dict[int, np.ndarray] | None:
            done = self.collected.get(request.topic)
            if done is not None and done[0] == request.round:
                return done[1]
            if len(self.parts[key]) < request.num_parts:
                return None
            parts = self.parts.pop(key)
            for old in [k for k in self.parts if k[0] == request.topic and k[1] < request.round]:
                del self.parts[old]
            self.collected[request.topic] = (request.round, parts)
            self._log({"t": "take", "topic": request.topic, "round": request.round})
            return parts

        parts = await self._wait_or_fail(
            (("parts", *key),),
            take,
            request,
            context,
            lambda: (
                f"collect {request.topic!r} round {request.round} "
                f"({len(self.parts[key])}/{request.num_parts} parts)"
            ),
        )
        total = None
        for part in sorted(parts):  # fixed order: the same parts always give the same sum
            total = parts[part].copy() if total is None else total + parts[part]
        return pb.CollectResponse(
            sum=to_array(total if total is not None else np.zeros(0)), num_parts=len(parts)
        )

    # ------------------------------------------------------------ task queues
    @_guard
    async def AddTasks(self, request, context):
        if not request.queue:
            raise RequestError("INVALID_ARGUMENT", "AddTasks: empty queue name")
        with self.cond:
            self._use("queue", request.queue)
            q = self.queues.setdefault(request.queue, TaskQueue(request.queue))
            try:
                n = q.add(list(request.tasks), request.lease_seconds)
            except ValueError as e:
                raise RequestError("INVALID_ARGUMENT", str(e)) from None
            record = {"t": "tasks", "queue": q.name, "tasks": list(request.tasks)}
            self._log({**record, "lease_seconds": request.lease_seconds})
            self._notify(("queue", q.name))
            return pb.Ack(value=n)

    def _queue(self, name: str) -> TaskQueue:
        q = self.queues.get(name)
        if q is None:
            raise RequestError("NOT_FOUND", f"unknown task queue {name!r} (AddTasks first)")
        return q

    def _last_seen(self, queue: str) -> Callable[[str], float]:
        # monotonic stamps: a step of the wall clock must not lapse (or renew) every lease
        return lambda w: self.heartbeats.get((queue, w), -1e18)

    def _check_not_removed(self, queue: str, worker: str, rpc: str) -> None:
        """A removed worker (or one of a removed executor) may not lease or finish work:
        its leases went back to the queue, and another worker may hold them now."""
        executor = worker.split("/", 1)[0]
        if worker in self.removed[queue] or executor in self.removed_executors:
            raise RequestError(
                "FAILED_PRECONDITION",
                f"{rpc} on {queue!r}: worker {worker!r} was removed (its leases were requeued)",
            )

    def _expire(self, q: TaskQueue) -> None:
        """Give back the leases of `q` that lapsed (and wake its waiters if any did)."""
        back = q.expire(time.monotonic(), self._last_seen(q.name))
        if back:
            self.counters["task_requeued"] += back
            self._notify(("queue", q.name))

    @_guard
    async def GetTask(self, request, context):
        """Lease the next TODO task to `worker`, waiting up to `timeout` for one."""
        if not request.worker:
            raise RequestError("INVALID_ARGUMENT", f"GetTask on {request.queue!r}: empty worker")
        with self.cond:
            q = self._queue(request.queue)
            self._use("queue", request.queue)
            self._check_not_removed(request.queue, request.worker, "GetTask")
        deadline = time.monotonic()  # a timeout of 0 asks without waiting
        if request.timeout > 0:
            deadline = wait_deadline(request.timeout, _left(context))

        def lease() -> pb.TaskLease | None:
            self._expire(q)
            got = q.lease(request.worker, time.monotonic())
            if got is not None:
                return pb.TaskLease(task_id=got[0], task=got[1], attempt=got[2])
            return pb.TaskLease(task_id=-1, drained=True) if q.drained else None

        def lapse() -> float | None:
            at = q.next_expiry(self._last_seen(q.name))
            return None if at is None else max(at, time.monotonic() + _LEASE_RECHECK_SECONDS)

        got = await self._until((("queue", q.name),), lease, deadline, lapse)
        return got if got is not None else pb.TaskLease(task_id=-1, drained=q.drained)

    @_guard
    async def FinishTask(self, request, context):
        with self.cond:
            q = self._queue(request.queue)
            self._use("queue", request.queue)
            self._check_not_removed(request.queue, request.worker, "FinishTask")
            try:
                first = q.finish(request.task_id, request.worker)
            except ValueError as e:
                raise RequestError("OUT_OF_RANGE", str(e)) from None
            if first:
                self._log({"t": "finished", "queue": q.name, "ids": [request.task_id]})
            self._notify(("queue", q.name))
            return pb.Ack(value=int(first))

    # ------------------------------------------------------------ metrics
    @_guard
    async def Count(self, request, context):
        if not request.event:
            raise RequestError("INVALID_ARGUMENT", "Count: empty event name")
        return pb.Ack(value=self.count(request.event, request.n or 1))

    @_guard
    async def GetMetrics(self, request, context):
        with self.cond:
            for q in self.queues.values():  # leases lapse even when nobody asks for work
                self._expire(q)
            return pb.Metrics(counters=dict(self.counters), waiting=len(self.waiters))

    @_guard
    async def ReportProgress(self, request, context):
        if not request.fit:
            raise RequestError("INVALID_ARGUMENT", "ReportProgress: empty fit id")
        self.fits.report(request)
        return pb.Ack(value=request.done)

    @_guard
    async def HostHeartbeat(self, request, context):
        """A per-host supervisor's report; answered with the shards it must run."""
        if self.hosts is None:
            raise RequestError(
                "FAILED_PRECONDITION",
                f"host {request.host.id!r}: this coordinator runs its own shards "
                "(spark-ps-server --shards N); hosts join a `spark-ps-server coordinator`",
            )
        return self.hosts.report(request)

    @_guard
    async def Drain(self, request, context):
        """Move every replica off host `request.host`, then tell it to stop
        (ps_server.coordinator.migrate)."""
        if self.hosts is None:
            raise RequestError(
                "FAILED_PRECONDITION",
                "drain: this coordinator runs its own shards on one host; only a "
                "`spark-ps-server coordinator` with joined hosts drains one",
            )
        await asyncio.get_running_loop().run_in_executor(None, self.hosts.drain, request.host)
        with self.cond:
            return self._map()

    @_guard
    async def Shutdown(self, request, context):
        if self._on_shutdown is not None:
            threading.Thread(target=self._on_shutdown, daemon=True).start()
        return pb.Ack()


class _Counters(defaultdict):
    """The recovery counters; every change is journaled (`CoordinatorServicer._log`)."""

    def __init__(self, on_change: Callable[[], None]) -> None:
        super().__init__(int, dict.fromkeys(COUNTERS, 0))
        self._on_change = on_change

    def __setitem__(self, key: str, value: int) -> None:
        super().__setitem__(key, value)
        self._on_change()


#: The key notified when the shard map changes.
_SHARDS = ("shards",)


def _left(context) -> float | None:
    """Seconds left of a call's gRPC deadline (None: it has none)."""
    left = context.time_remaining()
    return None if left is None or left > 1e9 else left


def _check_clock(request: pb.ClockRequest, clocks: dict[str, int], removed: set[str]) -> None:
    """Refuse a clock call that could never be served: bad ids or counts, a removed worker,
    or a worker the group has no room for (it already has `num_workers` others)."""
    group, worker = request.group, request.worker
    if not group or not worker:
        raise RequestError(
            "INVALID_ARGUMENT", f"clock: empty group {group!r} or worker {worker!r} id"
        )
    if request.num_workers < 1 or request.staleness < 0:
        raise RequestError(
            "INVALID_ARGUMENT",
            f"clock {group!r} worker {worker!r}: num_workers {request.num_workers} must be "
            f">= 1 and staleness {request.staleness} >= 0",
        )
    if worker in removed:
        raise RequestError(
            "FAILED_PRECONDITION", f"worker {worker!r} was removed from group {group!r}"
        )
    live = sorted(w for w in clocks if w not in removed)
    if worker not in clocks and len(live) >= request.num_workers:
        raise RequestError(
            "FAILED_PRECONDITION",
            f"clock {group!r}: unknown worker {worker!r}; the group already has its "
            f"{request.num_workers} live workers ({', '.join(live)})",
        )
