"""The control plane: shard map, model registry, barriers, clocks, the round board,
the task queues and the recovery counters.

Everything blocking (barriers, SSP clocks, waits, collects) waits on one condition
variable with a deadline, and a worker that is removed (lost executor, failed
task) stops counting, so nobody waits for the dead forever.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict, deque
from collections.abc import Callable

import numpy as np

from ps_server.proto import ps_pb2 as pb
from ps_server.proto import ps_pb2_grpc as pb_grpc
from ps_server.tasks import TaskQueue
from ps_server.wire import RequestError, from_array, guard, to_array

__all__ = ["CoordinatorServicer", "COUNTERS"]

log = logging.getLogger("ps_server.coordinator")

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


class CoordinatorServicer(pb_grpc.CoordinatorServicer):
    """State of the control plane; all fields are guarded by `self.cond`."""

    def __init__(
        self,
        num_shards: int,
        on_shutdown: Callable[[], None] | None = None,
        max_request_bytes: int = 0,
    ):
        self.cond = threading.Condition()
        self.max_request_bytes = max_request_bytes
        self.addresses = [""] * num_shards  # the primaries (or solo shards) clients use
        self.pids = [0] * num_shards  # process ids of the primaries
        self.backups = [""] * num_shards  # seeded backups, promoted if their primary dies
        self.joining: dict[int, tuple[str, int]] = {}  # index -> (address, pid) to seed
        self.counters: dict[str, int] = defaultdict(int, dict.fromkeys(COUNTERS, 0))
        self.epoch = 0
        self.restarts = 0  # primaries (re)started: their state is a checkpoint's (or empty)
        self.models: dict[str, pb.ModelSpec] = {}
        self.barriers: dict[str, tuple[int, set[str]]] = {}  # name -> (generation, arrived)
        self.clocks: dict[str, dict[str, int]] = defaultdict(dict)
        self.removed: dict[str, set[str]] = defaultdict(set)
        self.clock_log: deque[pb.ClockEntry] = deque(maxlen=CLOCK_LOG_SIZE)
        self.heartbeats: dict[tuple[str, str], float] = {}
        self.board: dict[str, tuple[int, str]] = {}
        self.parts: dict[tuple[str, int], dict[int, np.ndarray]] = defaultdict(dict)
        self.queues: dict[str, TaskQueue] = {}
        self._on_shutdown = on_shutdown
        self.hosts = None  # a service across hosts: its ps_server.hosts.HostTable

    def count(self, event: str, n: int = 1) -> int:
        """Add `n` to the counter of a recovery event ("restart", "promotion", "restore",
        "task_requeued", ...); the hook for the service, the replicas and fits."""
        with self.cond:
            self.counters[event] += int(n)
            return self.counters[event]

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
    def GetShardMap(self, request, context):
        with self.cond:
            return self._map()

    @_guard
    def RegisterShard(self, request, context):
        """A primary (or solo shard) enters the map; a backup waits to be seeded."""
        with self.cond:
            self._check_index(request.index)
            if self.hosts is not None and request.host_id:
                self.hosts.check_registration(request)  # a superseded process is refused
            if request.backup:
                self.joining[request.index] = (request.address, request.pid)
            else:
                self.addresses[request.index] = request.address
                self.pids[request.index] = request.pid
                self.backups[request.index] = ""  # a new primary starts without a backup
                self.epoch += 1
                self.restarts += 1
            self.cond.notify_all()
            return self._map()

    @_guard
    def DropReplica(self, request, context):
        """The primary of `index` could not update its backup: never promote that one.

        Refused to a process that is no longer the primary (its backup was promoted while
        it was cut off): it must step down rather than acknowledge on its own.
        """
        with self.cond:
            self._check_index(request.index)
            if request.pid and request.pid != self.pids[request.index]:
                raise RequestError(
                    "FAILED_PRECONDITION",
                    f"shard {request.index}: process {request.pid} is no longer its primary "
                    f"(process {self.pids[request.index]} at {self.addresses[request.index]} is)",
                )
            self.drop_backup(request.index, request.address)
            return self._map()

    def drop_backup(self, index: int, address: str) -> bool:
        """Forget the backup `address` of `index` (if it still is the backup)."""
        with self.cond:
            if not address or self.backups[index] != address:
                return False
            self.backups[index] = ""
            self.counters["backup_lost"] += 1
            return True

    def attach_backup(self, index: int, address: str, resync: bool = True) -> None:
        """A seeded backup of `index` now receives every update (called by the supervisor)."""
        with self.cond:
            self.joining.pop(index, None)
            self.backups[index] = address
            self.counters["resync"] += int(resync)

    def promote(self, index: int, pid: int) -> str:
        """The backup of `index` (process `pid`) becomes its primary; returns its address."""
        with self.cond:
            address = self.backups[index]
            if address:
                self.addresses[index], self.backups[index] = address, ""
                self.pids[index] = pid
                self.epoch += 1
                self.counters["promotion"] += 1
                self.cond.notify_all()
            return address

    @_guard
    def RegisterModel(self, request, context):
        with self.cond:
            old = self.models.get(request.name)
            if old is not None and old != request:
                raise RequestError(
                    "ALREADY_EXISTS",
                    f"model {request.name!r} exists with kind={old.kind} dim={old.dim} "
                    f"cols={old.cols} dtype={old.dtype}; asked for kind={request.kind} "
                    f"dim={request.dim} cols={request.cols} dtype={request.dtype}",
                )
            self.models[request.name] = request
            return pb.Ack(value=len(self.models))

    @_guard
    def GetModel(self, request, context):
        with self.cond:
            spec = self.models.get(request.name)
        if spec is None:
            raise RequestError("NOT_FOUND", f"unknown model {request.name!r}")
        return spec

    # ------------------------------------------------------------ synchronization
    def _wait(self, predicate: Callable[[], bool], timeout: float, what: str) -> None:
        deadline = time.monotonic() + (timeout if timeout > 0 else 3600.0)
        while not predicate():
            left = deadline - time.monotonic()
            if left <= 0:
                raise RequestError("DEADLINE_EXCEEDED", f"{what}: timed out after {timeout}s")
            self.cond.wait(min(left, 1.0))

    @_guard
    def Barrier(self, request, context):
        name, worker = request.name, request.worker
        if not worker:
            raise RequestError("INVALID_ARGUMENT", f"barrier {name!r}: empty worker id")
        with self.cond:
            generation, arrived = self.barriers.setdefault(name, (0, set()))
            arrived.add(worker)
            if len(arrived) >= request.count - len(self.removed[name]):
                self.barriers[name] = (generation + 1, set())
                self.cond.notify_all()
                return pb.Ack(value=generation + 1)
            self._wait(
                lambda: (
                    self.barriers[name][0] > generation
                    or len(arrived) >= request.count - len(self.removed[name])
                ),
                request.timeout,
                f"barrier {name!r} ({len(arrived)}/{request.count})",
            )
            if self.barriers[name][0] == generation:  # released by a removal
                self.barriers[name] = (generation + 1, set())
                self.cond.notify_all()
            return pb.Ack(value=generation + 1)

    @_guard
    def Clock(self, request, context):
        group, worker = request.group, request.worker
        with self.cond:
            clocks = self.clocks[group]
            _check_clock(request, clocks, self.removed[group])
            clocks[worker] = max(clocks.get(worker, 0), request.clock)
            self.cond.notify_all()

            def live_min() -> int | None:
                live = {w: c for w, c in clocks.items() if w not in self.removed[group]}
                need = request.num_workers - len(self.removed[group])
                if len(live) < need:
                    return None
                return min(live.values())

            def ok() -> bool:
                m = live_min()
                return m is not None and m >= request.clock - request.staleness

            self._wait(ok, request.timeout, f"clock {group!r} worker {worker!r}")
            m = live_min()
            self.clock_log.append(
                pb.ClockEntry(
                    group=group,
                    worker=worker,
                    clock=request.clock,
                    min_clock=m,
                    staleness=request.staleness,
                )
            )
            return pb.ClockResponse(min_clock=m)

    @_guard
    def GetClockLog(self, request, context):
        """The logged clock calls of groups starting with `request.group` (all with "")."""
        with self.cond:
            return pb.ClockLog(
                entries=[e for e in self.clock_log if e.group.startswith(request.group)]
            )

    @_guard
    def Heartbeat(self, request, context):
        with self.cond:
            self.heartbeats[(request.group, request.worker)] = time.time()
        return pb.Ack()

    @_guard
    def RemoveWorker(self, request, context):
        """Drop a worker from a group; group "*" with worker "executor:<id>" drops every
        worker of that executor (ids "executor:<id>/...") from every group."""
        with self.cond:
            if request.group != "*":
                self.removed[request.group].add(request.worker)
                self._lost(request.worker, lambda w: w == request.worker, request.group)
                return pb.Ack(value=1)
            prefix = request.worker + "/"
            n = 0
            groups = set(self.clocks) | {g for g, _ in self.heartbeats}
            for group in groups:
                known = set(self.clocks.get(group, {})) | {
                    w for g, w in self.heartbeats if g == group
                }
                for worker in known:
                    if worker.startswith(prefix) and worker not in self.removed[group]:
                        self.removed[group].add(worker)
                        n += 1
            self._lost(request.worker, lambda w: w.startswith(prefix), "*")
            return pb.Ack(value=n)

    def _lost(self, who: str, match: Callable[[str], bool], group: str) -> None:
        """Count a lost worker (or executor) and give its leased tasks back (holds `cond`)."""
        self.counters["worker_lost"] += 1
        for q in self.queues.values():
            if group in ("*", q.name):
                self.counters["task_requeued"] += q.requeue(match, f"{who} was removed")
        self.cond.notify_all()

    # ------------------------------------------------------------ the round board
    @_guard
    def Post(self, request, context):
        with self.cond:
            self.board[request.topic] = (request.round, request.payload)
            self.cond.notify_all()
        return pb.Ack(value=request.round)

    @_guard
    def Wait(self, request, context):
        topic = request.topic
        with self.cond:
            self._wait(
                lambda: self.board.get(topic, (-1 << 62, ""))[0] >= request.min_round,
                request.timeout,
                f"wait for {topic!r} round {request.min_round}",
            )
            round_, payload = self.board[topic]
        return pb.PostRequest(topic=topic, round=round_, payload=payload)

    @_guard
    def Contribute(self, request, context):
        values = from_array(request.values, f"contribution to {request.topic!r}", ndim=(1,))
        values = values.astype(np.float64)
        with self.cond:
            self.parts[(request.topic, request.round)][request.part] = values
            self.cond.notify_all()
        return pb.Ack(value=request.part)

    @_guard
    def Collect(self, request, context):
        key = (request.topic, request.round)
        with self.cond:
            self._wait(
                lambda: len(self.parts[key]) >= request.num_parts,
                request.timeout,
                f"collect {request.topic!r} round {request.round} "
                f"({len(self.parts[key])}/{request.num_parts} parts)",
            )
            parts = self.parts.pop(key)
            for old in [k for k in self.parts if k[0] == request.topic and k[1] < request.round]:
                del self.parts[old]
        total = None
        for part in sorted(parts):  # fixed order: the same parts always give the same sum
            total = parts[part].copy() if total is None else total + parts[part]
        return pb.CollectResponse(
            sum=to_array(total if total is not None else np.zeros(0)), num_parts=len(parts)
        )

    # ------------------------------------------------------------ task queues
    @_guard
    def AddTasks(self, request, context):
        if not request.queue:
            raise RequestError("INVALID_ARGUMENT", "AddTasks: empty queue name")
        with self.cond:
            q = self.queues.setdefault(request.queue, TaskQueue(request.queue))
            try:
                n = q.add(list(request.tasks), request.lease_seconds)
            except ValueError as e:
                raise RequestError("INVALID_ARGUMENT", str(e)) from None
            self.cond.notify_all()
            return pb.Ack(value=n)

    def _queue(self, name: str) -> TaskQueue:
        q = self.queues.get(name)
        if q is None:
            raise RequestError("NOT_FOUND", f"unknown task queue {name!r} (AddTasks first)")
        return q

    def _last_seen(self, queue: str) -> Callable[[str], float]:
        wall, mono = time.time(), time.monotonic()  # heartbeats are wall-clock stamps
        return lambda w: self.heartbeats.get((queue, w), -1e18) - wall + mono

    @_guard
    def GetTask(self, request, context):
        """Lease the next TODO task to `worker`, waiting up to `timeout` for one."""
        if not request.worker:
            raise RequestError("INVALID_ARGUMENT", f"GetTask on {request.queue!r}: empty worker")
        deadline = time.monotonic() + max(request.timeout, 0.0)
        with self.cond:
            q = self._queue(request.queue)
            while True:
                now = time.monotonic()
                self.counters["task_requeued"] += q.expire(now, self._last_seen(q.name))
                got = q.lease(request.worker, now)
                if got is not None:
                    return pb.TaskLease(task_id=got[0], task=got[1], attempt=got[2])
                if q.drained or now >= deadline:
                    return pb.TaskLease(task_id=-1, drained=q.drained)
                self.cond.wait(min(deadline - now, 0.5))

    @_guard
    def FinishTask(self, request, context):
        with self.cond:
            q = self._queue(request.queue)
            try:
                first = q.finish(request.task_id, request.worker)
            except ValueError as e:
                raise RequestError("OUT_OF_RANGE", str(e)) from None
            self.cond.notify_all()
            return pb.Ack(value=int(first))

    # ------------------------------------------------------------ metrics
    @_guard
    def Count(self, request, context):
        if not request.event:
            raise RequestError("INVALID_ARGUMENT", "Count: empty event name")
        return pb.Ack(value=self.count(request.event, request.n or 1))

    @_guard
    def GetMetrics(self, request, context):
        with self.cond:
            for q in self.queues.values():  # leases lapse even when nobody asks for work
                self.counters["task_requeued"] += q.expire(
                    time.monotonic(), self._last_seen(q.name)
                )
            return pb.Metrics(counters=dict(self.counters))

    @_guard
    def HostHeartbeat(self, request, context):
        """A per-host supervisor's report; answered with the shards it must run."""
        if self.hosts is None:
            raise RequestError(
                "FAILED_PRECONDITION",
                f"host {request.host.id!r}: this coordinator runs its own shards "
                "(spark-ps-server --shards N); hosts join a `spark-ps-server coordinator`",
            )
        return self.hosts.report(request)

    @_guard
    def Shutdown(self, request, context):
        if self._on_shutdown is not None:
            threading.Thread(target=self._on_shutdown, daemon=True).start()
        return pb.Ack()


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
