"""Moving partitions between hosts while the PS serves: scale out (a host joins) and in
(`spark-ps-server drain HOST`).

**Which partitions move.** When a host joins a placed service, the partitions whose
weighted rendezvous ranking (``ps_server.coordinator.placement``) now puts the newcomer
first move to it: about 1/N of them. With few partitions that count varies a lot, so it is
clamped to the newcomer's share by weight: at least its floor, at most its capacity (the bounded
load); partitions added to reach the floor are taken from the hosts furthest above their
new share, by the newcomer's score. With ``replicas=2`` the backups are chosen the same
way among the partitions whose primary stays. Draining a host moves every replica on it:
a primary to its backup's host when it has one (a promotion), else to its next choice;
a backup to its next choice other than its primary's host. A drain is refused when fewer
live hosts than replicas would be left.

**How one moves, without stopping writes** (``run_move`` in
``ps_server.coordinator.host_service``, on the partition's own watcher thread, the only
thread that changes its processes; at most :data:`PARALLEL` moves run at once):

1. A backup is seeded on the target host from the primary's snapshot and attached, as for
   any new backup (``ps_server.shard.replica``): from then on it applies every update before
   the primary acknowledges it. With ``replicas=2`` the partition's old backup is retired
   first, so while the copy is seeded the partition has no other replica.
2. Hand-over: the old primary steps down (after the update it is applying, which the
   copy applies too; it serves nothing from then on, reads included), the coordinator's
   map names the copy as primary, and the copy is told to serve. Clients get UNAVAILABLE
   for that moment and retry the same request ids on the new primary: nothing is lost,
   applied twice or read stale. The old primary's process is stopped. Should the copy
   fail to take over now (it died), the partition is restarted as after any loss of both
   replicas: from the checkpoint directory, else marked lost.
3. With ``replicas=2`` a new backup is seeded where the placement wants it.

Moving a backup is steps 1 and 3 only. A primary that dies during a move is handled as
any other death (its attached copy is promoted); a move that fails is recorded with its
error and the partition keeps serving where it was.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ps_server.coordinator import placement
from ps_server.coordinator.placement import Slot
from ps_server.proto import ps_pb2 as pb

__all__ = ["Move", "Moves", "plan_join", "plan_drain", "PARALLEL", "MOVE_SECONDS"]

log = logging.getLogger("ps_server.coordinator.migrate")

#: Moves running at once over the whole service: each costs a snapshot of one partition
#: on its primary's host and a copy over the network, beside the fit's own traffic.
PARALLEL = 1
#: A move whose copy is not seeded and attached within this long fails (and is undone).
MOVE_SECONDS = 300.0
_HISTORY = 1000  # finished moves kept for `status`


@dataclass
class Move:
    """One replica of one partition moving from one host to another."""

    partition: int
    role: str  # "primary" | "backup"
    from_host: str
    to_host: str
    reason: str
    backup_to: str = ""  # primary moves: where the partition's backup goes afterwards
    state: str = "planned"
    started: float = 0.0
    seconds: float = 0.0
    error: str = ""

    def message(self) -> pb.Move:
        seconds = self.seconds
        if self.state == "moving":
            seconds = time.monotonic() - self.started
        return pb.Move(
            partition=self.partition,
            role=self.role,
            from_host=self.from_host,
            to_host=self.to_host,
            reason=self.reason,
            state=self.state,
            seconds=seconds,
            error=self.error,
        )


# ---------------------------------------------------------------- planning (pure)
def _fill(
    candidates: Sequence[int],
    tops: set[int],
    host: str,
    weights: Mapping[str, float],
    count: int,
    cap: int,
    owner: Sequence[str],
) -> list[int]:
    """Up to `cap` partitions of `candidates` for `host`: those it tops (`tops`) by its
    score, then, until `count`, more from the hosts furthest above their new share."""
    w = weights[host]
    by_score = sorted(candidates, key=lambda p: -placement.score(host, p, w))
    chosen = [p for p in by_score if p in tops][:cap]
    total = sum(weights.values())
    share = {h: len(owner) * x / total for h, x in weights.items()}
    load = Counter(owner[p] for p in candidates)
    for p in chosen:
        load[owner[p]] -= 1
    rest = [p for p in by_score if p not in tops]
    while len(chosen) < count and rest:
        over = lambda p: load[owner[p]] - share.get(owner[p], 0.0)  # noqa: E731
        p = max(rest, key=over)  # max keeps the first (best score) of equals
        rest.remove(p)
        chosen.append(p)
        load[owner[p]] -= 1
    return chosen


def plan_join(
    slots: Sequence[Slot], weights: Mapping[str, float], host: str, replicas: int = 1
) -> list[Move]:
    """The moves that give host `host` (in `weights`, the live hosts) its share."""
    n, reason = len(slots), f"join {host}"
    total = sum(weights.values())
    share = n * weights[host] / total
    cap = placement.capacity(weights, n)[host]
    count = min(math.floor(share), cap)
    primaries = [s.primary for s in slots]
    candidates = [p for p, s in enumerate(slots) if host not in (s.primary, s.backup)]
    tops = {p for p in candidates if placement.rank(p, weights)[0] == host}
    moves = [
        Move(p, "primary", slots[p].primary, host, reason, backup_to=slots[p].backup)
        for p in _fill(candidates, tops, host, weights, count, cap, primaries)
    ]
    if replicas == 2:
        moving = {m.partition for m in moves}
        backups = [s.backup for s in slots]
        candidates = [p for p in candidates if p not in moving and slots[p].backup]
        others = lambda p: {h: x for h, x in weights.items() if h != slots[p].primary}  # noqa: E731
        tops = {p for p in candidates if placement.rank(p, others(p))[0] == host}
        cap = placement.capacity(weights, 2 * n)[host] - len(moves)
        count = min(math.floor(share), cap)
        moves += [
            Move(p, "backup", slots[p].backup, host, reason)
            for p in _fill(candidates, tops, host, weights, count, cap, backups)
        ]
    return moves


def plan_drain(
    slots: Sequence[Slot],
    weights: Mapping[str, float],
    host: str,
    replicas: int = 1,
    budget_mb: Mapping[str, float] | None = None,
    nbytes: Sequence[int] | None = None,
) -> list[Move]:
    """The moves that empty host `host`; `weights`: the live hosts that stay. ValueError
    (naming what is missing) when they cannot hold its partitions: fewer than `replicas`
    of them, or, when each has a memory budget (`budget_mb`, MB), budgets that sum to less
    than the bytes of every replica (`nbytes`: each partition's)."""
    if len(weights) < replicas:
        raise ValueError(
            f"cannot drain host {host!r}: {len(weights)} other live host(s) "
            f"({', '.join(sorted(weights)) or 'none'}) cannot hold {replicas} replicas of each "
            "partition on different hosts; join another host first"
        )
    budgets = [(budget_mb or {}).get(h, 0.0) for h in weights]
    if nbytes is not None and all(b > 0 for b in budgets):
        need, room = replicas * sum(nbytes) / 2**20, sum(budgets)
        if need > room:
            raise ValueError(
                f"cannot drain host {host!r}: the other live hosts' memory budgets "
                f"(--shards x --shard-memory-mb) sum to {room:.1f} MB, and the partitions' "
                f"{replicas} replica(s) hold {need:.1f} MB; join another host first"
            )
    reason = f"drain {host}"
    loads = Counter(h for s in slots for h in (s.primary, s.backup) if h and h != host)
    caps = placement.capacity(weights, len(slots) * replicas)
    moves = []
    for p, s in enumerate(slots):
        if s.primary == host:
            to = s.backup if s.backup in weights else ""
            if not to:
                to = placement.choose(p, weights, loads, caps, exclude={s.backup} - {""})
                loads[to] += 1
            backup = ""
            if replicas == 2:
                backup = placement.choose(p, weights, loads, caps, exclude={to})
                loads[backup] += 1
            moves.append(Move(p, "primary", host, to, reason, backup_to=backup))
        elif s.backup == host:
            to = placement.choose(p, weights, loads, caps, exclude={s.primary})
            loads[to] += 1
            moves.append(Move(p, "backup", host, to, reason))
    return moves


class Moves:
    """The service's moves: planned, running and the last finished ones (thread-safe)."""

    def __init__(self, parallel: int = PARALLEL) -> None:
        self.parallel = parallel
        self.lock = threading.Lock()
        self.moves: list[Move] = []

    def add(self, moves: Sequence[Move]) -> list[Move]:
        """Plan `moves`, except those of partitions that have a move planned or running;
        returns those planned."""
        with self.lock:
            busy = {m.partition for m in self.moves if m.state in ("planned", "moving")}
            moves = [m for m in moves if m.partition not in busy]
            self.moves += moves
            done = [m for m in self.moves if m.state not in ("planned", "moving")]
            for m in done[: max(0, len(done) - _HISTORY)]:
                self.moves.remove(m)
        for m in moves:
            log.info(
                "planned: partition %d's %s from host %s to %s (%s)",
                m.partition,
                m.role,
                m.from_host,
                m.to_host,
                m.reason,
            )
        return moves

    def take(self, partition: int) -> Move | None:
        """The next planned move of `partition`, now running, if fewer than `parallel` run."""
        with self.lock:
            if sum(m.state == "moving" for m in self.moves) >= self.parallel:
                return None
            for m in self.moves:
                if m.partition == partition and m.state == "planned":
                    m.state, m.started = "moving", time.monotonic()
                    return m
            return None

    def finish(self, move: Move, error: str = "") -> None:
        with self.lock:
            move.seconds = time.monotonic() - move.started
            move.state, move.error = ("failed", error) if error else ("done", "")

    def cancel(self, to_host: str) -> None:
        """Drop the planned (not yet running) moves to `to_host` (it is being drained)."""
        with self.lock:
            for m in self.moves:
                if m.to_host == to_host and m.state == "planned":
                    m.state, m.error = "cancelled", f"host {to_host} is being drained"

    def partitions(self, reason: str) -> set[int]:
        """The partitions that have a move for `reason`, in any state."""
        with self.lock:
            return {m.partition for m in self.moves if m.reason == reason}

    def pending(self, reason: str) -> bool:
        """Whether moves for `reason` are planned or running."""
        with self.lock:
            return any(m.reason == reason and m.state in ("planned", "moving") for m in self.moves)

    def messages(self) -> list[pb.Move]:
        with self.lock:
            return [m.message() for m in self.moves]
