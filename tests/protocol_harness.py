"""A deterministic interleaving harness for the replication protocol.

The real ``Replica`` objects (one per replica process), the real ``CoordinatorServicer``
and the supervisors' real steps (``fencing.seed_and_attach``, ``fencing.promote_backup``)
run in this one thread; only the transport is replaced. Every place where one party waits
on another (a forward in flight, a DropReplica call, a Configure answer) is a *point*: the
harness may run other parties' steps there, and decides the fate of the message (delivered,
lost before it arrives, or delivered with its answer lost). A `World` is one run; `explore`
runs a scenario under every placement of the other party's steps at those points and
every fate of the first forward and the first drop, and returns the runs that broke an
invariant (none, for a correct protocol).

A placement that would need a lock its holder still holds (impossible in one thread, and
a real thread would just wait) is skipped, not counted as a run.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field

import grpc

from ps_server import fencing
from ps_server.coordinator.servicer import CoordinatorServicer
from ps_server.proto import ps_pb2 as pb
from ps_server.shard.replica import Replica
from ps_server.shard.server import ShardServicer
from ps_server.wire import RequestError

FORWARD_FATES = ("deliver", "lose", "lose-answer")
DROP_FATES = ("deliver", "lose")


def _backup_push(servicer, request, context) -> pb.Ack:
    servicer.log.append(request.model)  # the request id: what this replica applied
    return pb.Ack(value=1)


_HANDLERS = {"Push": _backup_push}


class Infeasible(Exception):
    """This placement needs a lock its holder keeps until the step it interrupts is done."""


class RpcFailure(grpc.RpcError):
    def __init__(self, code: str, details: str) -> None:
        super().__init__(details)
        self._code, self._details = grpc.StatusCode[code], details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


class _Lock:
    """The replica's mutation lock; acquiring it while held means the placement is one a
    real thread would have waited out: `Infeasible`."""

    def __init__(self) -> None:
        self.held = False

    def __enter__(self) -> _Lock:
        if self.held:
            raise Infeasible()
        self.held = True
        return self

    def __exit__(self, *exc) -> None:
        self.held = False


@dataclass
class World:
    """One run: replicas by address, the coordinator of one index, the message fates, and
    the other party's steps with the point at which each starts."""

    schedule: tuple[int, ...] = ()  # point index at which each pending step starts
    forward_fate: str = "deliver"  # of the first forward; the later ones are delivered
    drop_fate: str = "deliver"  # of the first DropReplica; the later ones are delivered
    coord: CoordinatorServicer = field(default_factory=lambda: CoordinatorServicer(1))
    replicas: dict[str, Replica] = field(default_factory=dict)
    dead: set[str] = field(default_factory=set)  # processes gone (or cut off from everyone)
    acked: list[str] = field(default_factory=list)  # request ids a client got answered
    trace: list[str] = field(default_factory=list)
    points: int = 0
    forwards: int = 0
    drops: int = 0
    pending: list[tuple[str, Callable[[], None]]] = field(default_factory=list)
    _started: int = 0
    restarts: int = 0  # the map's restart count when the scenario began

    # ---------------------------------------------------------------- parties
    def replica(self, address: str, role: str, pid: int) -> Replica:
        servicer = ShardServicer(0)
        servicer.log = []  # request ids applied here, in order (a seed copies none)
        rep = Replica(servicer, role, coordinator="coordinator")
        rep.pid, rep.lock = pid, _Lock()
        rep._connect = lambda target: (None, _ShardStub(self, target))
        rep._coordinator_stub = lambda: _CoordinatorStub(self)
        self.replicas[address] = rep
        self.coord.register_shard(
            pb.RegisterShardRequest(index=0, address=address, pid=pid, backup=role == "backup")
        )
        return rep

    def configure(
        self, address: str, backup: str, term: int, expect_term: int = 0, min_seq: int = 0
    ) -> pb.Ack:
        """The supervisor's Configure call (``ps_server.coordinator.service._configure``)."""
        self.point(f"configure {address} (backup {backup or '-'}, term {term})")
        config = pb.ReplicaConfig(
            role="primary", backup=backup, term=term, expect_term=expect_term, min_seq=min_seq
        )
        answer = self.call(address, lambda rep: rep.configure(config))
        self.point(f"configured {address}")
        return answer

    def write(self, address: str, rid: str) -> bool:
        """A client's Push with request id `rid` at `address`; True if acknowledged."""
        self.trace.append(f"write {rid} at {address}")
        try:
            self.call(address, lambda rep: _apply(rep, rid))
        except RpcFailure as e:
            self.trace.append(f"  {rid} refused: {e.code().name} {e.details()}")
            return False
        self.trace.append(f"  {rid} acknowledged by {address}")
        self.acked.append(rid)
        return True

    def seed(self, backup: str) -> bool:
        """The supervisor seeds `backup` from the primary and attaches it."""
        self.trace.append(f"seed and attach {backup}")
        try:
            return fencing.seed_and_attach(self.coord, 0, backup, self.configure) is not None
        except RpcFailure as e:
            self.trace.append(f"  seeding failed: {e.details()}")
            return False

    def promote(self, backup: str) -> bool:
        """The supervisor promotes `backup` (its primary was declared dead)."""
        self.trace.append(f"promote {backup}")
        try:
            pid = self.replicas[backup].pid
            done = fencing.promote_backup(self.coord, 0, backup, pid, self.configure)
        except RpcFailure as e:
            self.trace.append(f"  promotion refused: {e.details()}")
            done = False
        self.trace.append(f"  promoted: {done}")
        return done

    def fail_over(self, backup: str) -> None:
        """The primary was declared dead (it may still run, cut off): promote `backup` if
        that is safe, else start a new, empty primary (a counted restart: fits roll back),
        as ``ps_server.coordinator.service._primary_died`` does."""
        if not self.promote(backup):
            self.trace.append("  restart from a checkpoint (counted)")
            self.replica("R", "primary", 999)
            self.coord.count("restart")

    def begin(self) -> None:
        """The set-up is done: points count from here."""
        self.points, self.restarts = 0, self.coord.restarts

    # ---------------------------------------------------------------- interleaving
    def later(self, name: str, step: Callable[[], None]) -> None:
        self.pending.append((name, step))

    def point(self, name: str) -> None:
        """A place where one party waits on another: start the pending steps due here."""
        here, self.points = self.points, self.points + 1
        self.trace.append(f"[{here}] {name}")
        while self._started < len(self.pending) and self._due(self._started) <= here:
            step_name, step = self.pending[self._started]
            self._started += 1
            self.trace.append(f"  -> {step_name}")
            step()

    def finish(self) -> None:
        """Run the steps no point started."""
        while self._started < len(self.pending):
            step_name, step = self.pending[self._started]
            self._started += 1
            self.trace.append(f"-> {step_name}")
            step()

    def _due(self, k: int) -> int:
        return self.schedule[k] if k < len(self.schedule) else 1 << 30

    # ---------------------------------------------------------------- transport
    def call(self, address: str, fn: Callable[[Replica], object]):
        if address in self.dead:
            raise RpcFailure("UNAVAILABLE", f"{address} is gone")
        try:
            return fn(self.replicas[address])
        except RequestError as e:
            raise RpcFailure(e.code, str(e)) from None

    def forward(self, address: str, request: pb.ReplicateRequest):
        self.forwards += 1
        fate = self.forward_fate if self.forwards == 1 else "deliver"
        self.point(f"forward seq {request.seq} term {request.term} to {address}: {fate}")
        if fate == "lose":
            raise RpcFailure("DEADLINE_EXCEEDED", "forward lost")
        answer = self.call(address, lambda rep: rep.replicate(request, _HANDLERS))
        if fate == "lose-answer":
            raise RpcFailure("DEADLINE_EXCEEDED", "forward's answer lost")
        return answer

    def drop(self, request: pb.RegisterShardRequest) -> pb.ShardMap:
        self.drops += 1
        fate = self.drop_fate if self.drops == 1 else "deliver"
        self.point(f"DropReplica {request.address} term {request.term}: {fate}")
        if fate == "lose":
            raise RpcFailure("UNAVAILABLE", "coordinator unreachable")
        try:
            return self.coord.drop_replica(request)
        except RequestError as e:
            raise RpcFailure(e.code, str(e)) from None

    # ---------------------------------------------------------------- invariants
    def violations(self) -> list[str]:
        """What the protocol promises, checked on the final state."""
        found = []
        primary = self.coord.addresses[0]
        rep = self.replicas.get(primary)
        if primary in self.dead or rep is None or rep.role != "primary":
            found.append(f"the map names {primary or 'nothing'}, which serves no client")
        lost = [r for r in self.acked if rep is None or r not in rep.answers]
        if lost and self.coord.restarts == self.restarts:
            found.append(f"acknowledged {lost} missing on primary {primary}, no restart counted")
        twice = {r for r in rep.servicer.log if rep.servicer.log.count(r) > 1} if rep else set()
        if twice:
            found.append(f"{sorted(twice)} applied twice on primary {primary}")
        backup = self.coord.backups[0]
        if backup:
            missing = [r for r in self.acked if r not in self.replicas[backup].answers]
            if missing and backup not in self.dead:
                found.append(f"acknowledged {missing} missing on promotable backup {backup}")
        return found


def _apply(rep: Replica, rid: str) -> pb.Ack:
    def run() -> pb.Ack:
        rep.servicer.log.append(rid)
        return pb.Ack(value=1)

    rep.check_serving()
    return rep.apply("Push", pb.PushRequest(model=rid), rid, run)


class _Future:
    def __init__(self, world: World, address: str, request: pb.ReplicateRequest) -> None:
        self.world, self.address, self.request = world, address, request

    def result(self):
        return self.world.forward(self.address, self.request)


class _Replicate:
    def __init__(self, world: World, address: str) -> None:
        self.world, self.address = world, address

    def __call__(self, request, metadata=None, timeout=None):  # a seed's catch-up replay
        return self.world.call(self.address, lambda rep: rep.replicate(request, _HANDLERS))

    def future(self, request, metadata=None, timeout=None) -> _Future:
        return _Future(self.world, self.address, request)


class _ShardStub:
    def __init__(self, world: World, address: str) -> None:
        self.world, self.address = world, address
        self.Replicate = _Replicate(world, address)

    def ReplicateBatch(self, batch, metadata=None, timeout=None):  # noqa: N802
        for request in batch.requests:  # a seed's catch-up replay, in order
            self.Replicate(request)
        return pb.Ack(value=len(batch.requests))

    def Seed(self, chunks, metadata=None, timeout=None):  # noqa: N802 - the RPC's name
        self.world.point(f"seed {self.address}")
        return self.world.call(self.address, lambda rep: pb.Ack(value=rep.seed(chunks)))


class _CoordinatorStub:
    def __init__(self, world: World) -> None:
        self.world = world

    def DropReplica(self, request, metadata=None, timeout=None):  # noqa: N802
        return self.world.drop(request)


def explore(
    scenario: Callable[[World], None], steps: int, max_points: int = 12
) -> tuple[int, list[World]]:
    """Run `scenario` under every schedule of its `steps` pending steps over the first
    `max_points` points and every fate of the first forward and drop: (runs, bad runs)."""
    runs, bad = 0, []
    for fates in itertools.product(FORWARD_FATES, DROP_FATES):
        for schedule in itertools.combinations_with_replacement(range(max_points + 1), steps):
            world = World(schedule=schedule, forward_fate=fates[0], drop_fate=fates[1])
            try:
                scenario(world)
            except Infeasible:
                continue
            runs += 1
            if world.violations():
                bad.append(world)
    return runs, bad


def report(bad: list[World], limit: int = 1) -> str:
    """The first bad runs' traces, for an assertion message."""
    return "\n\n".join(
        f"schedule {w.schedule}, forward {w.forward_fate}, drop {w.drop_fate}: "
        f"{w.violations()}\n" + "\n".join(w.trace)
        for w in bad[:limit]
    )
