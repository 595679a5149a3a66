"""Primary/backup replication of one shard partition (a replication chain of two).

The protocol (state, messages, invariants and the tests that check them) is written
down in docs/replication.md.

With ``--replicas 2`` each shard index runs two processes. The *primary* serves
clients; every mutating request is sent on to the *backup* as the same request
bytes and applied on both at once, and only when both have applied it is the
client answered. Mutations are serialized by one lock per process, so both
replicas apply them in the same order and stay bit-identical (server-side ops
are deterministic). A backup refuses client calls with UNAVAILABLE, so a client
holding a stale shard map re-reads it.

Retries: the client tags each request with an id (``x-spark-ps-request``); both
replicas remember the answers of mutating requests for the clients' retry horizon
(:func:`retry_horizon`) and answer a retried one from memory. So a request whose
answer was lost when a primary died is applied exactly once, whether or not the
backup had it.

If forwarding fails the primary tells the coordinator to drop that backup
*before* it answers, and answers nothing until the coordinator has confirmed it, so a
backup that misses an acknowledged update is never promoted; the
supervisor (``ps_server.coordinator.service``) then starts a fresh backup, which the
primary seeds with a snapshot of its whole state (models, optimizer state,
pending exactly-once contributions, remembered answers; see ``_seed_backup``), and
the coordinator never attaches a backup its primary dropped while it was seeded.
A primary that was cut off while its backup was promoted (a host that lost its
lease, ``ps_server.coordinator.hosts``) learns it from the promoted replica, which refuses its
forwards as fenced, or from the coordinator, which refuses its drop: it steps down
(role "deposed") without acknowledging, so the client retries the same request id on
the new primary.

Fencing (terms on every replication message, sequence numbers that prove a backup
current) is decided by the pure steps of ``ps_server.fencing``; this module does the
I/O around them.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import tempfile
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Protocol

import grpc
import numpy as np

from ps_server.fencing import ReplicaState
from ps_server.proto import ps_pb2 as pb
from ps_server.proto import ps_pb2_grpc as pb_grpc
from ps_server.shard.snapshot import model_arrays, models_from_arrays
from ps_server.timeouts import (
    DROP_CONFIRM_SECONDS,
    FORWARD_SECONDS,
    retry_horizon,
    seed_seconds,
)
from ps_server.wire import TOKEN_KEY, RequestError

if TYPE_CHECKING:
    from google.protobuf.message import Message

    from ps_server.shard.tensors import Tensor


class ReplicatedShard(Protocol):
    """What a replica needs of its shard (``ps_server.shard.server.ShardServicer``), which holds
    the replica: the shard's index, its models, and adopting a seeded state."""

    index: int
    models: dict[str, Tensor]

    def adopt(self, models: dict[str, Tensor]) -> None: ...


__all__ = ["Replica", "REQUEST_ID_KEY", "MUTATIONS", "request_id", "digest", "retry_horizon"]

log = logging.getLogger("ps_server.shard.replica")

#: Metadata key of the per-request id a client sends with every shard call.
REQUEST_ID_KEY = "x-spark-ps-request"
#: Bytes of remembered answers a replica holds at most; beyond it the oldest go (logged
#: when one goes before the retry horizon, since a retry of it would be applied again).
_WINDOW_BYTES = 256 << 20


_SEED_CHUNK = 4 << 20
#: Mutations logged during a seed that are replayed with the lock held (the rest before).
_CATCH_UP_UNDER_LOCK = 64
#: Bytes of logged mutations replayed per call when the shard has no request limit.
_REPLAY_BYTES = 64 << 20
#: Forwards are client requests the primary accepted: the backup (same --max-request-mb,
#: plus FORWARD_ENVELOPE_BYTES on Replicate) is the one to refuse, not this channel.
_OPTIONS = [
    ("grpc.max_receive_message_length", -1),
    ("grpc.max_send_message_length", -1),
]

#: Shard RPCs that may change state: request type, answer type, and whether a
#: retry must be answered from memory (a pull that creates rows is idempotent).
MUTATIONS: dict[str, tuple[type, type, bool]] = {
    "CreateModel": (pb.CreateModelRequest, pb.ModelInfo, True),
    "DropModel": (pb.ModelRef, pb.Ack, True),
    "Pull": (pb.PullRequest, pb.PullResponse, False),
    "Push": (pb.PushRequest, pb.Ack, True),
    "Reduce": (pb.ReduceRequest, pb.Ack, True),
    "VectorOp": (pb.VectorOpRequest, pb.Scalar, True),
    "Call": (pb.CallRequest, pb.CallResponse, True),
    "Restore": (pb.CheckpointRequest, pb.CheckpointResponse, True),
}
# answers that may legitimately differ between replicas (storage capacity in nbytes)
_UNCOMPARED = ("Pull", "CreateModel", "Restore")


def request_id(context: grpc.ServicerContext | None) -> str:
    """The client's request id from the call metadata ("" when it sent none)."""
    if context is None:
        return ""
    for key, value in context.invocation_metadata():
        if key == REQUEST_ID_KEY:
            return value
    return ""


def replay_groups(
    batch: list[pb.ReplicateRequest], limit: int
) -> Iterator[list[pb.ReplicateRequest]]:
    """`batch` in order, cut into groups of at most `limit` serialized bytes (a request
    bigger than that alone: a forward may pass the limit by its envelope)."""
    group, size = [], 0
    for req in batch:
        n = req.ByteSize() + 16  # its field tag and length in the batch, generously
        if group and size + n > limit:
            yield group
            group, size = [], 0
        group.append(req)
        size += n
    if group:
        yield group


class Replica:
    """The replication state of one shard process: role, backup link, remembered answers."""

    def __init__(
        self,
        servicer: ReplicatedShard,
        role: str,
        coordinator: str = "",
        token: str = "",
        max_request_bytes: int = 0,
    ) -> None:
        if role not in ("primary", "backup"):
            raise ValueError(f"replica role must be primary or backup, got {role!r}")
        self.servicer, self.pid = servicer, os.getpid()
        # role, term, seq; a backup serves nothing until seeded
        self.state = ReplicaState(role, seeded=role == "primary")
        # seed chunks stay under the request limit that the backup (same flags) enforces
        self.seed_chunk = min(_SEED_CHUNK, max_request_bytes or _SEED_CHUNK)
        self.max_request_bytes = max_request_bytes
        self._log: list[pb.ReplicateRequest] | None = None  # mutations while seeding
        self._unconfirmed: str | None = None  # a dropped backup the coordinator may still list
        self._coord_channel: grpc.Channel | None = None
        self.coordinator, self._md = coordinator, ((TOKEN_KEY, token),)
        self.lock = threading.Lock()  # one mutation at a time: the same order on both
        self.backup = ""
        self._backup_stub: pb_grpc.ShardStub | None = None
        self._channel: grpc.Channel | None = None
        self.answers: OrderedDict[str, tuple[str, object]] = OrderedDict()
        self._stamps: deque[float] = deque()  # when each answer (in order) was remembered
        self._answer_bytes = 0
        self.horizon = retry_horizon()
        self.applied = 0
        self.apply_seconds = self.forward_seconds = 0.0

    @property
    def role(self) -> str:
        return self.state.role

    @property
    def seeded(self) -> bool:
        return self.state.seeded

    @property
    def where(self) -> str:
        return f"shard {self.servicer.index} ({self.role}, pid {self.pid})"

    def check_serving(self) -> None:
        """Clients talk to primaries only; a backup sends them back to the shard map."""
        if self.role != "primary":
            raise RequestError(
                "UNAVAILABLE",
                f"{self.where} serves no clients; re-read the shard map",
            )

    # ------------------------------------------------------------ applying
    def apply(
        self,
        method: str,
        request: Message,
        rid: str,
        run: Callable[[], Message],
        deadline: float | None = None,
    ) -> Message:
        """Run a mutating request once (a retry gets the remembered answer) here and on the
        backup; the backup's copy is sent first, so both apply it at the same time.
        `deadline`: seconds the client still waits (the forward's deadline)."""
        with self.lock:
            self.check_serving()  # deposed meanwhile: acknowledge nothing
            self._confirm_drop()  # a dropped backup the coordinator still lists: ack nothing
            known = self.answers.get(rid) if rid else None
            if known is not None:
                return known[1]
            forward = _forward(method, request, rid, *self.state.forward())
            pending = self._send(forward, deadline)
            t = time.perf_counter()
            try:
                answer = run()
            except Exception as e:
                if pending is not None:  # the backup must have refused it too
                    self._settle(method, pending, None, e)
                raise
            self._remember(method, rid, answer)
            self.state.applied()
            self.applied += 1
            self.apply_seconds += time.perf_counter() - t
            if self._log is not None:  # a backup is being seeded: it gets this afterwards
                self._log.append(forward)
            if pending is not None:
                t = time.perf_counter()
                self._settle(method, pending, answer, None)
                self.forward_seconds += time.perf_counter() - t
        return answer

    def replicate(self, request: pb.ReplicateRequest, handlers: dict) -> pb.ReplicateResponse:
        """Backup side: apply a request the primary already applied, in its order: only the
        next one (`seq`) of the term we were seeded in (``fencing.ReplicaState``)."""
        if request.method not in MUTATIONS:
            raise RequestError("INVALID_ARGUMENT", f"cannot replicate {request.method!r}")
        req_type, _, _ = MUTATIONS[request.method]
        req = req_type.FromString(request.request)
        rid = request.request_id
        with self.lock:
            try:
                self.state.check_replicate(request.term, request.seq)
            except RequestError as e:
                raise RequestError(e.code, f"{self.where}: {e}") from None
            known = self.answers.get(rid) if rid else None
            if known is not None:
                answer = known[1]
            else:
                t = time.perf_counter()
                answer = handlers[request.method](self.servicer, req, None)
                self._remember(request.method, rid, answer)
                self.applied += 1
                self.apply_seconds += time.perf_counter() - t
            self.state.applied()
        if request.method in _UNCOMPARED:
            return pb.ReplicateResponse()
        return pb.ReplicateResponse(response=answer.SerializeToString())

    def _remember(self, method: str, rid: str, answer: Message) -> None:
        if not rid or not MUTATIONS[method][2]:
            return
        now = time.monotonic()
        self.answers[rid] = (method, answer)
        self._stamps.append(now)
        self._answer_bytes += answer.ByteSize()
        while self._stamps and now - self._stamps[0] > self.horizon:
            self._forget_oldest()
        while self._answer_bytes > _WINDOW_BYTES:
            age = now - self._stamps[0]
            log.warning(
                "%s: remembered answers past %d MB; forgetting one %.0fs old, before the %.0fs "
                "retry horizon (a retry of it would be applied again)",
                self.where,
                _WINDOW_BYTES >> 20,
                age,
                self.horizon,
            )
            self._forget_oldest()

    def _forget_oldest(self) -> None:
        _, (_, old) = self.answers.popitem(last=False)
        self._stamps.popleft()
        self._answer_bytes -= old.ByteSize()

    def _send(self, forward: pb.ReplicateRequest, deadline: float | None) -> grpc.Future | None:
        if self._backup_stub is None:
            return None
        return self._backup_stub.Replicate.future(
            forward,
            metadata=self._md,
            timeout=deadline if deadline and deadline > 0 else FORWARD_SECONDS,
        )

    def _settle(
        self, method: str, pending: grpc.Future, answer: Message | None, error: Exception | None
    ) -> None:
        """Wait for the backup; drop it unless it did what we did (same answer, or the
        same refusal: validation is deterministic, so a bad request fails on both)."""
        try:
            got = pending.result()
        except grpc.RpcError as e:
            if self.state.refused(e.details()):  # a newer term exists: we were deposed
                log.error("%s: stepping down: %s", self.where, e.details())
                raise RequestError(
                    "UNAVAILABLE", f"{self.where}: {e.details()}; re-read the shard map"
                ) from None
            if isinstance(error, RequestError) and e.code().name == error.code:
                return
            self._drop_backup(f"{method} failed there: {e.code().name} {e.details()}")
            return
        if error is not None:
            self._drop_backup(f"{method} succeeded there but failed here: {error}")
        elif method not in _UNCOMPARED and got.response != answer.SerializeToString():
            self._drop_backup(f"{method} answered differently there (replicas diverged)")

    def _drop_backup(self, why: str) -> None:
        """Stop forwarding to the backup and have the coordinator forget it (so it is never
        promoted). Until the coordinator has confirmed that, this primary acknowledges
        nothing: see :meth:`_confirm_drop`."""
        log.error("%s: backup %s lost: %s; dropping it", self.where, self.backup, why)
        self._unconfirmed = self.backup
        self._set_backup("")
        self._confirm_drop()

    def _confirm_drop(self) -> None:
        """Tell the coordinator to forget the backup we dropped; raise UNAVAILABLE if it
        cannot be told now. The update that made us drop it is applied here and remembered
        under its request id, but the coordinator still lists a backup that lacks it: if
        we acknowledged it (or any later update) and then died, that backup would be
        promoted without it. So every request first waits for this confirmation, and the
        client's retries (same request id: answered from memory once confirmed) drive it,
        each a short call, never a long one under the lock."""
        if self._unconfirmed is None or not self.coordinator:
            self._unconfirmed = None
            return
        req = pb.RegisterShardRequest(
            index=self.servicer.index,
            address=self._unconfirmed,
            pid=self.pid,
            term=self.state.term,
            seq=self.state.seq,
        )
        try:
            self._coordinator_stub().DropReplica(
                req, metadata=self._md, timeout=DROP_CONFIRM_SECONDS
            )
        except grpc.RpcError as e:
            if self._coord_channel is not None:  # the next attempt connects afresh
                self._coord_channel.close()
                self._coord_channel = None
            if e.code() == grpc.StatusCode.FAILED_PRECONDITION:  # we were deposed
                self.state.role = "deposed"  # never acknowledge again
                raise RequestError(
                    "UNAVAILABLE", f"{self.where}: {e.details()}; re-read the shard map"
                ) from None
            raise RequestError(
                "UNAVAILABLE",
                f"{self.where}: cannot confirm with the coordinator that backup "
                f"{self._unconfirmed} was dropped ({e.code().name}: {e.details()}); "
                "acknowledging no update until it can (retry)",
            ) from None
        self._unconfirmed = None

    def _coordinator_stub(self) -> pb_grpc.CoordinatorStub:
        if self._coord_channel is None:
            from ps_server.tls import env_ca, open_channel

            self._coord_channel = open_channel(self.coordinator, env_ca())
        return pb_grpc.CoordinatorStub(self._coord_channel)

    # ------------------------------------------------------------ configuration
    def configure(self, config: pb.ReplicaConfig) -> pb.Ack:
        """Promote this backup if it is provably current, or (on a primary) adopt the term
        and seed and attach / detach a backup, or step down ("deposed": a planned hand-over
        to another replica, ps_server.coordinator.migrate). Answers the bytes seeded and the
        sequence number at which forwarding to the backup began (or at which it stepped down)."""
        if config.role == "deposed":
            with self.lock:  # after the mutation in flight, if any: serve nothing more
                self.state.role = "deposed"
                self._set_backup("")
            log.info("shard %d: stepped down (its partition is handed over)", self.servicer.index)
            return pb.Ack(seq=self.state.seq)
        if config.role != "primary":
            raise RequestError("INVALID_ARGUMENT", f"{self.where}: cannot become {config.role!r}")
        with self.lock:
            where = self.where
            try:
                promoted = self.state.configure(config.term, config.expect_term, config.min_seq)
            except RequestError as e:
                raise RequestError(e.code, f"{where}: {e}") from None
            if promoted:
                log.info(
                    "shard %d: promoted to primary in term %d at seq %d",
                    self.servicer.index,
                    self.state.term,
                    self.state.seq,
                )
            if not config.backup:
                self._set_backup("")
                return pb.Ack(seq=self.state.seq)
            if config.backup == self.backup:
                return pb.Ack(seq=self.state.seq)
        return self._seed_backup(config.backup)

    def _set_backup(self, address: str) -> None:
        if self._channel is not None:
            self._channel.close()
        self._channel = self._backup_stub = None
        self.backup = address
        if address:
            self._channel, self._backup_stub = self._connect(address)

    def _seed_backup(self, address: str) -> pb.Ack:
        """Seed `address` with our state, then forward every mutation to it.

        Mutations wait only while the state is copied (the cut). The copy is written to a
        temp file and streamed with no lock held, while the mutations applied meanwhile
        are logged; the log is then replayed to the backup, the last few entries under the
        lock, which is released with forwarding on. So seeding a large shard does not
        freeze writes, and its deadline grows with the bytes to send."""
        t = time.monotonic()
        with self.lock:
            if self._log is not None:
                raise RequestError("FAILED_PRECONDITION", f"{self.where}: already seeding a backup")
            self._set_backup("")
            arrays = snapshot_arrays(self.servicer.models, self.answers)  # copies: the cut
            term, seq = self.state.term, self.state.seq
            self._log = []
        channel = None
        try:
            with tempfile.TemporaryFile(prefix="spark-ps-seed-") as f:
                write_snapshot(f, arrays)
                del arrays
                nbytes = f.tell()
                f.seek(0)
                channel, stub = self._connect(address)
                timeout = seed_seconds(nbytes)
                chunks = iter(lambda: f.read(self.seed_chunk), b"")
                stub.Seed(
                    (pb.SeedChunk(data=c, term=term, seq=seq) for c in chunks),
                    metadata=self._md,
                    timeout=timeout,
                )
            attached_at = self._catch_up(stub, address)
        except (grpc.RpcError, RequestError) as e:
            with self.lock:
                self._log = None
            why = e.details() if isinstance(e, grpc.RpcError) else str(e)
            raise RequestError(
                "UNAVAILABLE", f"{self.where}: seeding backup {address} failed: {why}"
            ) from None
        finally:
            if channel is not None:  # forwards use their own (``_set_backup``)
                channel.close()
        log.info(
            "shard %d: seeded backup %s with %d models (%.1f MB) in %.2fs",
            self.servicer.index,
            address,
            len(self.servicer.models),
            nbytes / 1e6,
            time.monotonic() - t,
        )
        return pb.Ack(value=nbytes, seq=attached_at)

    def _catch_up(self, stub: pb_grpc.ShardStub, address: str) -> int:
        """Replay the mutations logged since the cut, in order: rounds with no lock held
        while the log is long and shrinking, the rest under the lock, which then turns
        forwarding on. Returns our seq at that moment: the backup has applied every mutation
        up to it. A log that did not halve in a round (writes arrive as fast as they are
        replayed, one at a time) is replayed under the lock at once: otherwise the rounds
        could go on as long as the writes do; writers then wait about one round."""
        previous = None
        while True:
            with self.lock:
                batch, self._log = self._log, []
                stalled = previous is not None and len(batch) > previous // 2
                previous = len(batch)
                if len(batch) <= _CATCH_UP_UNDER_LOCK or stalled:
                    self._replay(stub, batch)
                    self._log = None
                    self._set_backup(address)
                    return self.state.seq
            self._replay(stub, batch)

    def _replay(self, stub: pb_grpc.ShardStub, batch: list[pb.ReplicateRequest]) -> None:
        """Send `batch` in order, many per call: one call per mutation is slower than the
        writes a busy client makes, and the log would not shrink."""
        for group in replay_groups(batch, self.max_request_bytes or _REPLAY_BYTES):
            stub.ReplicateBatch(
                pb.ReplicateRequests(requests=group), metadata=self._md, timeout=FORWARD_SECONDS
            )

    def _connect(self, address: str) -> tuple[grpc.Channel | None, pb_grpc.ShardStub]:
        """A channel to a backup and its stub (the protocol harness replaces this)."""
        from ps_server.tls import env_ca, open_channel

        channel = open_channel(address, env_ca(), _OPTIONS)
        return channel, pb_grpc.ShardStub(channel)

    def seed(self, chunks: Iterator[pb.SeedChunk]) -> int:
        """Backup side: replace our state with the snapshot the primary of a term took at
        its sequence number (both on every chunk)."""
        term = seq = None
        with tempfile.TemporaryFile(prefix="spark-ps-seed-") as f:
            for c in chunks:  # spooled to disk: the state is in memory once, when loaded
                if term is None:
                    term, seq = c.term, c.seq
                    with self.lock:
                        self._check_seed(term)
                data = c.data  # each read of a bytes field copies it
                if self.max_request_bytes and len(data) > self.max_request_bytes:
                    raise RequestError(
                        "RESOURCE_EXHAUSTED",
                        f"{self.where}: seed chunk of {len(data)} bytes is over the request "
                        f"limit of {self.max_request_bytes}",
                    )
                f.write(data)
            f.seek(0)
            models, answers = restore_snapshot(f)
        with self.lock:
            self._check_seed(term or 0)  # still a backup, no newer primary seeded us meanwhile
            self.state.seeded_at(term or 0, seq or 0)
            self.servicer.models = {}
            self.servicer.adopt(models)  # they count against the shard's memory budget
            self.answers = answers
            self._stamps = deque([time.monotonic()] * len(answers))
            self._answer_bytes = sum(a.ByteSize() for _, a in answers.values())
            self.applied = 0
            self.apply_seconds = 0.0
        return len(models)

    def _check_seed(self, term: int) -> None:
        try:
            self.state.check_seed(term)
        except RequestError as e:
            raise RequestError(e.code, f"{self.where}: {e}") from None

    def describe(self) -> pb.DigestResponse:
        """Role, counters and the state's digest. Mutations wait only while the state is
        copied; the hash (the slow part) runs with no lock held."""
        with self.lock:
            arrays = digest_arrays(self.servicer.models)
            answer = pb.DigestResponse(
                role=self.role,
                term=self.state.term,
                seq=self.state.seq,
                applied=self.applied,
                backup=self.backup,
                apply_seconds=self.apply_seconds,
                forward_seconds=self.forward_seconds,
            )
        answer.digest = digest({}, arrays)
        return answer


def digest_arrays(models: dict) -> dict:
    """What `digest` hashes, copied at one instant (model arrays) or shared (contributions
    are never changed in place)."""
    arrays = model_arrays(models)
    arrays.update(_contribution_arrays(models))
    return arrays


def _forward(method: str, request: Message, rid: str, term: int, seq: int) -> pb.ReplicateRequest:
    return pb.ReplicateRequest(
        method=method, request=request.SerializeToString(), request_id=rid, term=term, seq=seq
    )


# ---------------------------------------------------------------- snapshots
def _contribution_arrays(models: dict) -> dict[str, np.ndarray]:
    arrays = {}
    for i, (_name, t) in enumerate(sorted(models.items())):
        for r in t.contributions.rounds():
            for (part, chunk), (k, v) in t.contributions.items(r):
                arrays[f"c{i}.{r}.{part}.{chunk}.k"] = k
                arrays[f"c{i}.{r}.{part}.{chunk}.v"] = v
    return arrays


def snapshot_arrays(models: dict, answers: OrderedDict) -> dict:
    """What a snapshot holds, taken at one instant: copies of the models' arrays, the
    pending contributions (never changed in place) and the answers (a shallow copy)."""
    arrays = model_arrays(models)
    arrays.update(_contribution_arrays(models))
    arrays["answers"] = OrderedDict(answers)
    return arrays


def write_snapshot(f, arrays: dict) -> None:
    """`snapshot_arrays` as one npz into file `f`.

    The answers travel as one byte array and its end offsets: one npz entry per answer
    (thousands of them) cost ~0.3 s here, and ~0.9 s on the backup to read back.
    """
    arrays = dict(arrays)
    answers = arrays.pop("answers")
    index = [[rid, method] for rid, (method, _) in answers.items()]
    arrays["answers"] = np.array(json.dumps(index))
    raw = [answer.SerializeToString() for _, answer in answers.values()]
    arrays["answer_bytes"] = np.frombuffer(b"".join(raw), dtype=np.uint8)
    arrays["answer_ends"] = np.cumsum([len(r) for r in raw], dtype=np.int64)
    np.savez(f, **arrays)


def snapshot(models: dict, answers: OrderedDict) -> bytes:
    """Models, pending exactly-once contributions and remembered answers as one npz blob."""
    buf = io.BytesIO()
    write_snapshot(buf, snapshot_arrays(models, answers))
    return buf.getvalue()


def restore_snapshot(source) -> tuple[dict, OrderedDict]:
    """Inverse of `snapshot` (its bytes, or a file it was written to): (models with their
    pending contributions, answers)."""
    data = np.load(io.BytesIO(source) if isinstance(source, bytes) else source, allow_pickle=False)
    models = models_from_arrays(data)
    by_prefix = {f"c{i}": t for i, (_n, t) in enumerate(sorted(models.items()))}
    contributed = [k.split(".") for k in data.files if k.startswith("c") and k.endswith(".k")]
    # each part's chunk 0 first: putting it replaces the part's other chunks
    for prefix, r, part, chunk, _ in sorted(contributed, key=lambda c: (c[0], *map(int, c[1:4]))):
        key = f"{prefix}.{r}.{part}.{chunk}"
        by_prefix[prefix].contributions.put(
            int(r), int(part), int(chunk), data[key + ".k"], data[key + ".v"]
        )
    answers: OrderedDict = OrderedDict()
    raw, bounds = data["answer_bytes"].tobytes(), [0, *data["answer_ends"].tolist()]
    index = json.loads(str(data["answers"][()]))
    for (rid, method), start, end in zip(index, bounds[:-1], bounds[1:], strict=True):
        answers[rid] = (method, MUTATIONS[method][1].FromString(raw[start:end]))
    return models, answers


def digest(models: dict, arrays: dict | None = None) -> str:
    """sha256 of every model's spec, state and pending contributions (replica comparison);
    `arrays`: those already taken (`digest_arrays`), hashed with no lock held."""
    h = hashlib.sha256()
    arrays = digest_arrays(models) if arrays is None else arrays
    for key in sorted(arrays):
        h.update(key.encode())
        h.update(np.ascontiguousarray(arrays[key]).tobytes())
    return h.hexdigest()
