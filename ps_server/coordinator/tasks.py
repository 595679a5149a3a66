"""The coordinator's task queue: data shards that workers lease (TODO -> DOING -> DONE).

As ElasticDL does it: the queue, not the worker, owns the work. A worker leases one
task at a time; a lease lapses when the worker stops heartbeating for the queue's
lease time or is removed (a lost executor), and the task goes back to TODO for the
next worker. A task becomes DONE once, by whichever lease finishes it first.

Not thread-safe on its own: the coordinator calls it under its condition variable.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from ps_server import timeouts

__all__ = ["TaskQueue", "DEFAULT_LEASE_SECONDS"]

log = logging.getLogger("ps_server.coordinator.tasks")

DEFAULT_LEASE_SECONDS = timeouts.TASK_LEASE_SECONDS


@dataclass
class TaskQueue:
    """Tasks of one queue, by id (ids are positions in `tasks`)."""

    name: str
    lease_seconds: float = DEFAULT_LEASE_SECONDS
    tasks: list[str] = field(default_factory=list)
    todo: deque[int] = field(default_factory=deque)  # FIFO of ids (O(1) at both ends)
    doing: dict[int, tuple[str, float]] = field(default_factory=dict)  # id -> (worker, since)
    done: set[int] = field(default_factory=set)
    leases: dict[int, int] = field(default_factory=dict)  # id -> how often it was leased

    def add(self, tasks: list[str], lease_seconds: float) -> int:
        if lease_seconds < 0:
            raise ValueError(
                f"queue {self.name!r}: lease_seconds must be >= 0, got {lease_seconds}"
            )
        if lease_seconds:
            self.lease_seconds = lease_seconds
        start = len(self.tasks)
        self.tasks.extend(tasks)
        self.todo.extend(range(start, len(self.tasks)))
        return len(tasks)

    @property
    def drained(self) -> bool:
        return len(self.done) == len(self.tasks)

    def lease(self, worker: str, now: float) -> tuple[int, str, int] | None:
        """(id, task, earlier leases) of the next TODO task, now DOING for `worker`."""
        if not self.todo:
            return None
        tid = self.todo.popleft()
        self.doing[tid] = (worker, now)
        attempt = self.leases.get(tid, 0)
        self.leases[tid] = attempt + 1
        return tid, self.tasks[tid], attempt

    def finish(self, tid: int, worker: str) -> bool:
        """Mark `tid` DONE; False if it already was (a requeued task finished twice)."""
        if not 0 <= tid < len(self.tasks):
            raise ValueError(f"queue {self.name!r}: no task {tid} (it has {len(self.tasks)})")
        if tid in self.done:
            return False
        holder = self.doing.pop(tid, None)
        # DOING and TODO are disjoint, so only a task nobody holds needs the O(n) search
        if holder is None and tid in self.todo:  # its lease had lapsed: the finish counts
            self.todo.remove(tid)
        if holder is not None and holder[0] != worker:
            log.info(
                "queue %s: task %d finished by %s while leased to %s",
                self.name,
                tid,
                worker,
                holder[0],
            )
        self.done.add(tid)
        return True

    def requeue(self, match: Callable[[str], bool], why: str) -> int:
        """Give back every DOING task whose worker matches; returns how many."""
        back = sorted(t for t, (w, _) in self.doing.items() if match(w))
        self.todo.extendleft(reversed(back))  # next in line, in id order
        for tid in back:
            worker, _ = self.doing.pop(tid)
            log.warning(
                "queue %s: task %d (%r) of worker %s back to TODO: %s",
                self.name,
                tid,
                self.tasks[tid],
                worker,
                why,
            )
        return len(back)

    def _latest(self) -> dict[str, float]:
        """Each worker holding leases -> when it took its newest one."""
        latest: dict[str, float] = {}
        for w, since in self.doing.values():
            latest[w] = max(latest.get(w, since), since)
        return latest

    def expire(self, now: float, last_seen: Callable[[str], float]) -> int:
        """Requeue the leases of workers silent (no lease, no heartbeat) for the lease time.

        A worker's newest lease counts as a sign of life for all its leases: a worker that
        just leased a task is alive and keeps the others it holds.
        """
        latest = self._latest()
        stale = {w for w, t in latest.items() if now - max(t, last_seen(w)) > self.lease_seconds}
        if not stale:
            return 0
        return self.requeue(lambda w: w in stale, f"lease of {self.lease_seconds}s expired")

    def next_expiry(self, last_seen: Callable[[str], float]) -> float | None:
        """The earliest time a lease lapses if no holder is heard from again (None: no
        leases); a waiter for work looks again then, as nothing else would wake it."""
        latest = self._latest()
        if not latest:
            return None
        return min(max(t, last_seen(w)) for w, t in latest.items()) + self.lease_seconds
