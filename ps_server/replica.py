"""Primary/backup replication of one shard partition (a replication chain of two).

With ``--replicas 2`` each shard index runs two processes. The *primary* serves
clients; every mutating request is sent on to the *backup* as the same request
bytes and applied on both at once, and only when both have applied it is the
client answered. Mutations are serialized by one lock per process, so both
replicas apply them in the same order and stay bit-identical (server-side ops
are deterministic). A backup refuses client calls with UNAVAILABLE, so a client
holding a stale shard map re-reads it.

Retries: the client tags each request with an id (``x-spark-ps-request``); both
replicas remember the answers of the last ``WINDOW`` mutating requests and
answer a retried one from memory. So a request whose answer was lost when a
primary died is applied exactly once, whether or not the backup had it.

If forwarding fails the primary tells the coordinator to drop that backup
*before* it answers, so a backup that misses an update is never promoted; the
supervisor (``ps_server.service``) then starts a fresh backup, which the
primary seeds with a snapshot of its whole state (models, optimizer state,
pending exactly-once contributions, remembered answers) while mutations wait.
A primary that was cut off while its backup was promoted (a host that lost its
lease, ``ps_server.hosts``) learns it there: the coordinator refuses its drop, and
it steps down (role "deposed") without acknowledging, so the client retries the
same request id on the new primary.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import grpc
import numpy as np

from ps_server import checkpoint
from ps_server.proto import ps_pb2 as pb
from ps_server.proto import ps_pb2_grpc as pb_grpc
from ps_server.wire import TOKEN_KEY, RequestError

if TYPE_CHECKING:
    from google.protobuf.message import Message

    from ps_server.shard import ShardServicer

__all__ = ["Replica", "REQUEST_ID_KEY", "MUTATIONS", "request_id", "digest", "WINDOW"]

log = logging.getLogger("ps_server.replica")

#: Metadata key of the per-request id a client sends with every shard call.
REQUEST_ID_KEY = "x-spark-ps-request"
#: How many answers of mutating requests a replica remembers for retries.
WINDOW = 4096
_WINDOW_BYTES = 64 << 20
_SEED_CHUNK = 4 << 20
_FORWARD_TIMEOUT = 60.0  # a backup slower than this is dropped (and replaced)
_OPTIONS = [
    ("grpc.max_receive_message_length", 256 << 20),
    ("grpc.max_send_message_length", 256 << 20),
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


class Replica:
    """The replication state of one shard process: role, backup link, remembered answers."""

    def __init__(
        self,
        servicer: ShardServicer,
        role: str,
        coordinator: str = "",
        token: str = "",
        max_request_bytes: int = 0,
    ) -> None:
        if role not in ("primary", "backup"):
            raise ValueError(f"replica role must be primary or backup, got {role!r}")
        self.servicer, self.role = servicer, role
        self.seeded = role == "primary"  # a backup serves nothing until seeded
        # seed chunks stay under the request limit that the backup (same flags) enforces
        self.seed_chunk = min(_SEED_CHUNK, max_request_bytes or _SEED_CHUNK)
        self.coordinator, self._md = coordinator, ((TOKEN_KEY, token),)
        self.lock = threading.Lock()  # one mutation at a time: the same order on both
        self.backup = ""
        self._backup_stub: pb_grpc.ShardStub | None = None
        self._channel: grpc.Channel | None = None
        self.answers: OrderedDict[str, tuple[str, object]] = OrderedDict()
        self._answer_bytes = 0
        self.applied = 0
        self.apply_seconds = self.forward_seconds = 0.0

    @property
    def where(self) -> str:
        return f"shard {self.servicer.index} ({self.role}, pid {os.getpid()})"

    def check_serving(self) -> None:
        """Clients talk to primaries only; a backup sends them back to the shard map."""
        if self.role != "primary":
            raise RequestError(
                "UNAVAILABLE",
                f"{self.where} serves no clients; re-read the shard map",
            )

    # ------------------------------------------------------------ applying
    def apply(self, method: str, request: Message, rid: str, run: Callable[[], Message]) -> Message:
        """Run a mutating request once (a retry gets the remembered answer) here and on the
        backup; the backup's copy is sent first, so both apply it at the same time."""
        with self.lock:
            known = self.answers.get(rid) if rid else None
            if known is not None:
                return known[1]
            pending = self._send(method, request, rid)
            t = time.perf_counter()
            try:
                answer = run()
            except Exception as e:
                if pending is not None:  # the backup must have refused it too
                    self._settle(method, pending, None, e)
                raise
            self._remember(method, rid, answer)
            self.applied += 1
            self.apply_seconds += time.perf_counter() - t
            if pending is not None:
                t = time.perf_counter()
                self._settle(method, pending, answer, None)
                self.forward_seconds += time.perf_counter() - t
        return answer

    def replicate(self, request: pb.ReplicateRequest, handlers: dict) -> pb.ReplicateResponse:
        """Backup side: apply a request the primary already applied, in arrival order."""
        if self.role != "backup":
            raise RequestError("FAILED_PRECONDITION", f"{self.where} is not a backup")
        if not self.seeded:
            raise RequestError("FAILED_PRECONDITION", f"{self.where} is not seeded yet")
        if request.method not in MUTATIONS:
            raise RequestError("INVALID_ARGUMENT", f"cannot replicate {request.method!r}")
        req_type, _, _ = MUTATIONS[request.method]
        req = req_type.FromString(request.request)
        rid = request.request_id
        with self.lock:
            known = self.answers.get(rid) if rid else None
            if known is not None:
                answer = known[1]
            else:
                t = time.perf_counter()
                answer = handlers[request.method](self.servicer, req, None)
                self._remember(request.method, rid, answer)
                self.applied += 1
                self.apply_seconds += time.perf_counter() - t
        if request.method in _UNCOMPARED:
            return pb.ReplicateResponse()
        return pb.ReplicateResponse(response=answer.SerializeToString())

    def _remember(self, method: str, rid: str, answer: Message) -> None:
        if not rid or not MUTATIONS[method][2]:
            return
        self.answers[rid] = (method, answer)
        self._answer_bytes += answer.ByteSize()
        while len(self.answers) > WINDOW or self._answer_bytes > _WINDOW_BYTES:
            _, (_, old) = self.answers.popitem(last=False)
            self._answer_bytes -= old.ByteSize()

    def _send(self, method: str, request: Message, rid: str) -> grpc.Future | None:
        if self._backup_stub is None:
            return None
        return self._backup_stub.Replicate.future(
            pb.ReplicateRequest(method=method, request=request.SerializeToString(), request_id=rid),
            metadata=self._md,
            timeout=_FORWARD_TIMEOUT,
        )

    def _settle(
        self, method: str, pending: grpc.Future, answer: Message | None, error: Exception | None
    ) -> None:
        """Wait for the backup; drop it unless it did what we did (same answer, or the
        same refusal: validation is deterministic, so a bad request fails on both)."""
        try:
            got = pending.result()
        except grpc.RpcError as e:
            if isinstance(error, RequestError) and e.code().name == error.code:
                return
            self._drop_backup(f"{method} failed there: {e.code().name} {e.details()}")
            return
        if error is not None:
            self._drop_backup(f"{method} succeeded there but failed here: {error}")
        elif method not in _UNCOMPARED and got.response != answer.SerializeToString():
            self._drop_backup(f"{method} answered differently there (replicas diverged)")

    def _drop_backup(self, why: str) -> None:
        """Have the coordinator forget the backup (so it is never promoted), then go solo."""
        backup = self.backup
        log.error("%s: backup %s lost: %s; dropping it", self.where, backup, why)
        self._set_backup("")
        if not self.coordinator:
            return
        from ps_server.tls import env_ca, open_channel

        req = pb.RegisterShardRequest(index=self.servicer.index, address=backup, pid=os.getpid())
        deadline = time.monotonic() + 30.0
        with open_channel(self.coordinator, env_ca()) as ch:
            while True:
                try:
                    pb_grpc.CoordinatorStub(ch).DropReplica(req, metadata=self._md, timeout=5)
                    return
                except grpc.RpcError as e:
                    if e.code() == grpc.StatusCode.FAILED_PRECONDITION:  # we were deposed
                        self.role = "deposed"  # never acknowledge again
                        raise RequestError(
                            "UNAVAILABLE", f"{self.where}: {e.details()}; re-read the shard map"
                        ) from None
                    if time.monotonic() > deadline:
                        raise RequestError(
                            "UNAVAILABLE", f"{self.where}: coordinator unreachable"
                        ) from None
                    time.sleep(0.2)

    # ------------------------------------------------------------ configuration
    def configure(self, config: pb.ReplicaConfig) -> int:
        """Promote this backup, or (on a primary) seed and attach / detach a backup."""
        if config.role != "primary":
            raise RequestError("INVALID_ARGUMENT", f"{self.where}: cannot become {config.role!r}")
        with self.lock:
            if self.role == "backup":
                if not self.seeded:
                    raise RequestError(
                        "FAILED_PRECONDITION", f"{self.where}: not seeded, cannot be promoted"
                    )
                self.role = "primary"
                log.info("shard %d: promoted to primary", self.servicer.index)
            if config.backup and config.backup != self.backup:
                return self._seed_backup(config.backup)
            if not config.backup:
                self._set_backup("")
        return 0

    def _set_backup(self, address: str) -> None:
        if self._channel is not None:
            self._channel.close()
        self._channel = self._backup_stub = None
        self.backup = address
        if address:
            from ps_server.tls import env_ca, open_channel

            self._channel = open_channel(address, env_ca(), _OPTIONS)
            self._backup_stub = pb_grpc.ShardStub(self._channel)

    def _seed_backup(self, address: str) -> int:
        """Stream the whole state to `address` (mutations wait on our lock), then forward."""
        t = time.monotonic()
        blob = snapshot(self.servicer.models, self.answers)
        self._set_backup(address)
        chunks = (
            pb.SeedChunk(data=blob[i : i + self.seed_chunk])
            for i in range(0, max(len(blob), 1), self.seed_chunk)
        )
        try:
            self._backup_stub.Seed(chunks, metadata=self._md, timeout=_FORWARD_TIMEOUT)
        except grpc.RpcError as e:
            self._set_backup("")
            raise RequestError(
                "UNAVAILABLE", f"{self.where}: seeding backup {address} failed: {e.details()}"
            ) from None
        log.info(
            "shard %d: seeded backup %s with %d models (%.1f MB) in %.2fs",
            self.servicer.index,
            address,
            len(self.servicer.models),
            len(blob) / 1e6,
            time.monotonic() - t,
        )
        return len(blob)

    def seed(self, chunks: Iterator[pb.SeedChunk]) -> int:
        """Backup side: replace our state with the primary's snapshot."""
        if self.role != "backup":
            raise RequestError("FAILED_PRECONDITION", f"{self.where}: only a backup is seeded")
        blob = b"".join(c.data for c in chunks)
        models, answers = restore_snapshot(blob)
        with self.lock:
            self.servicer.models = {}
            self.servicer.adopt(models)  # they count against the shard's memory budget
            self.answers = answers
            self._answer_bytes = sum(a.ByteSize() for _, a in answers.values())
            self.applied, self.seeded = 0, True
            self.apply_seconds = 0.0
        return len(models)

    def describe(self) -> pb.DigestResponse:
        with self.lock:
            return pb.DigestResponse(
                digest=digest(self.servicer.models),
                role=self.role,
                applied=self.applied,
                backup=self.backup,
                apply_seconds=self.apply_seconds,
                forward_seconds=self.forward_seconds,
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


def snapshot(models: dict, answers: OrderedDict) -> bytes:
    """Models, pending exactly-once contributions and remembered answers as one npz blob.

    The answers travel as one byte array and its end offsets: one npz entry per answer
    (up to WINDOW of them) cost ~0.3 s here, with every mutation waiting, and ~0.9 s on
    the backup to read back.
    """
    arrays = checkpoint.model_arrays(models)
    arrays.update(_contribution_arrays(models))
    index = [[rid, method] for rid, (method, _) in answers.items()]
    arrays["answers"] = np.array(json.dumps(index))
    raw = [answer.SerializeToString() for _, answer in answers.values()]
    arrays["answer_bytes"] = np.frombuffer(b"".join(raw), dtype=np.uint8)
    arrays["answer_ends"] = np.cumsum([len(r) for r in raw], dtype=np.int64)
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()


def restore_snapshot(blob: bytes) -> tuple[dict, OrderedDict]:
    """Inverse of `snapshot`: (models with their pending contributions, answers)."""
    data = np.load(io.BytesIO(blob), allow_pickle=False)
    models = checkpoint.models_from_arrays(data)
    by_prefix = {f"c{i}": t for i, (_n, t) in enumerate(sorted(models.items()))}
    for key in data.files:
        if key.startswith("c") and key.endswith(".k"):
            prefix, r, part, chunk, _ = key.split(".")
            by_prefix[prefix].contributions.put(
                int(r), int(part), int(chunk), data[key], data[key[:-1] + "v"]
            )
    answers: OrderedDict = OrderedDict()
    raw, bounds = data["answer_bytes"].tobytes(), [0, *data["answer_ends"].tolist()]
    index = json.loads(str(data["answers"][()]))
    for (rid, method), start, end in zip(index, bounds[:-1], bounds[1:], strict=True):
        answers[rid] = (method, MUTATIONS[method][1].FromString(raw[start:end]))
    return models, answers


def digest(models: dict) -> str:
    """sha256 of every model's spec, state and pending contributions (replica comparison)."""
    h = hashlib.sha256()
    arrays = checkpoint.model_arrays(models)
    arrays.update(_contribution_arrays(models))
    for key in sorted(arrays):
        h.update(key.encode())
        h.update(np.ascontiguousarray(arrays[key]).tobytes())
    return h.hexdigest()
