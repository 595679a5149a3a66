"""The coordinator's journal: what a `spark-ps-server coordinator` restarted at the same
address needs to go on where the killed one stopped.

One append-only file, ``<checkpoint dir>/coordinator-journal/journal.log``: a header (magic
and format version), then records, each a little-endian ``u32`` length, a ``u32`` CRC-32
and that many bytes of JSON. Every change of the journaled state appends the record that
replays it, under the lock that guards that state, so the file's order is the state's.
Records a restart cannot do without are fsync'd before the change is answered (launches
and registrations of shard processes, the shard map, model specs); the others (board
posts, contributions, clocks, task queues, counters) reach the OS at once, so they
survive a SIGKILL of the coordinator, and the disk at the next fsync'd record. Once the
file outgrows :data:`COMPACT_BYTES`, it is replaced by a snapshot: the records that
rebuild the current state, written to a temporary file, fsync'd and renamed over it.

What is journaled and what is rebuilt:

- journaled: the partition count and replication, every host (its identity and run id),
  every launch of a shard process (number, partition, role, host; where it registered;
  its end), the shard map (primary, backup, epoch, restart count), lost partitions, model
  specs, the round board (latest post per topic), contributions not yet collected and
  each topic's last collected round (a `Collect` retried because the kill cut off its
  answer gets the same sum), SSP clocks, removed workers and executors, task queues
  (tasks and which are DONE) and the recovery counters;
- rebuilt: whether each shard process still runs, from its host's first report to the
  restarted coordinator (a launch that report does not list, or every launch of a host
  whose supervisor restarted too, is dead; a host that does not report within its lease
  is lost, as always); heartbeats; where each partition belongs (the hosts of its live
  launches);
- lost: barriers in progress (a worker's retried call arrives again; one released in the
  instant of the kill may strand the workers whose answer was lost, until their timeout),
  the clock log (`GetClockLog`), and the leases of DOING tasks: they go back to TODO, so
  a task may run twice but is DONE once, as after a lapsed lease.

Replay stops at a torn last record (a write cut by the kill), which is cut off the file;
anything else unreadable, or a format version this code does not know, is an error
naming the file, and the coordinator does not start on it.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import struct
import threading
import time
import zlib
from collections.abc import Iterable

import numpy as np

from ps_server.proto import ps_pb2 as pb

__all__ = [
    "Journal",
    "JournalError",
    "VERSION",
    "COMPACT_BYTES",
    "journal_dir",
    "snapshot",
    "replay",
]

log = logging.getLogger("ps_server.coordinator.journal")

MAGIC = b"spark-ps coordinator journal\n"
VERSION = 1
#: Past this size the file is replaced by a snapshot of the state it describes.
COMPACT_BYTES = 64 << 20
_HEADER = MAGIC + struct.pack("<I", VERSION)
_FRAME = struct.Struct("<II")  # length, crc32


class JournalError(RuntimeError):
    """The journal cannot be read (or written): names the file and what is wrong."""


def journal_dir(checkpoint_dir: str) -> str | None:
    """Where the coordinator journals under `checkpoint_dir` (None: it is not a local
    directory, and a journal needs appends and fsync)."""
    if not checkpoint_dir:
        return None
    if checkpoint_dir.startswith("file://"):
        checkpoint_dir = checkpoint_dir[len("file://") :]
    elif "://" in checkpoint_dir:
        return None
    return os.path.join(os.path.abspath(checkpoint_dir), "coordinator-journal")


class Journal:
    """The journal file in `directory`: :meth:`read` it, then :meth:`start` it anew (with
    a snapshot) and :meth:`append` to it. Thread-safe; its lock is taken last."""

    def __init__(self, directory: str, compact_bytes: int = COMPACT_BYTES) -> None:
        self.directory = directory
        self.path = os.path.join(directory, "journal.log")
        self.compact_bytes = compact_bytes
        self.lock = threading.Lock()
        self.size = 0
        self._fd: int | None = None

    # ------------------------------------------------------------ reading
    def read(self) -> list[dict]:
        """Every record, in order ([] without a file); cuts a torn last record off."""
        try:
            with open(self.path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            return []
        if len(data) < len(_HEADER) and _HEADER.startswith(data):
            return []  # cut while its header was written: nothing in it yet
        if not data.startswith(MAGIC):
            raise JournalError(f"{self.path} is not a spark-ps coordinator journal")
        if len(data) < len(_HEADER):
            raise JournalError(f"{self.path}: its header is cut short ({len(data)} bytes)")
        (version,) = struct.unpack_from("<I", data, len(MAGIC))
        if version != VERSION:
            raise JournalError(
                f"{self.path} is journal format version {version}; this spark-ps reads "
                f"version {VERSION} only (start the coordinator of the spark-ps that wrote "
                "it, or move the file away to start an empty PS)"
            )
        records, at = [], len(_HEADER)
        while at < len(data):
            record, end = self._record(data, at)
            if record is None:
                log.warning(
                    "%s: the last record (at byte %d of %d) was cut short by a crash; "
                    "dropped, as it was never answered",
                    self.path,
                    at,
                    len(data),
                )
                os.truncate(self.path, at)
                break
            records.append(record)
            at = end
        return records

    def _record(self, data: bytes, at: int) -> tuple[dict | None, int]:
        """(record, end) of the record at `at`; (None, at) if it is the torn tail."""
        if len(data) - at < _FRAME.size:
            return None, at
        length, crc = _FRAME.unpack_from(data, at)
        start, end = at + _FRAME.size, at + _FRAME.size + length
        if end > len(data):
            return None, at
        body = data[start:end]
        if zlib.crc32(body) != crc:
            if end == len(data):
                return None, at
            raise JournalError(
                f"{self.path}: record at byte {at} is corrupt (checksum mismatch) and "
                f"{len(data) - end} bytes follow it; not a crash mid-write: refusing to guess"
            )
        try:
            return json.loads(body), end
        except ValueError as e:
            raise JournalError(f"{self.path}: record at byte {at} is not JSON: {e}") from None

    # ------------------------------------------------------------ writing
    def start(self, records: Iterable[dict]) -> None:
        """Replace the file by one holding `records` (atomically), and append from now on."""
        os.makedirs(self.directory, mode=0o700, exist_ok=True)
        tmp = self.path + ".tmp"
        with self.lock:
            blob = _HEADER + b"".join(_frame(r) for r in records)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                os.write(fd, blob)
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, self.path)
            _fsync_dir(self.directory)
            if self._fd is not None:
                os.close(self._fd)
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
            self.size = len(blob)

    def append(self, record: dict, sync: bool = False) -> None:
        """Add one record (flushed to the OS; with `sync`, to the disk too)."""
        frame = _frame(record)
        with self.lock:
            if self._fd is None:
                return  # not started (or closed): nothing journals yet
            os.write(self._fd, frame)
            self.size += len(frame)
            if sync:
                os.fsync(self._fd)

    @property
    def wants_compaction(self) -> bool:
        return self._fd is not None and self.size > self.compact_bytes

    def close(self, remove: bool = False) -> None:
        """Stop journaling; with `remove`, delete the file if this process wrote it (a PS
        stopped on purpose: its shards stop too, so there is nothing to resume)."""
        with self.lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None
                if remove:
                    os.unlink(self.path)


def _frame(record: dict) -> bytes:
    body = json.dumps(record, separators=(",", ":")).encode()
    return _FRAME.pack(len(body), zlib.crc32(body)) + body


def _fsync_dir(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def b64(message_or_bytes) -> str:
    raw = message_or_bytes
    if not isinstance(raw, bytes):
        raw = raw.SerializeToString()
    return base64.b64encode(raw).decode()


def unb64(text: str) -> bytes:
    return base64.b64decode(text)


def array_record(values: np.ndarray) -> str:
    return b64(np.ascontiguousarray(values, dtype="<f8").tobytes())


# ------------------------------------------------------------ snapshot
def snapshot(coordinator, table, partitions: int, replicas: int) -> list[dict]:
    """The records that rebuild the coordinator's and the host table's state now (the
    caller holds the coordinator's condition; the table's lock is taken here)."""
    c = coordinator
    out: list[dict] = [{"t": "config", "partitions": partitions, "replicas": replicas}]
    with table.lock:
        out.append({"t": "next_launch", "n": table.next_number})
        for host in table.hosts.values():
            out.append({"t": "host", "info": b64(host.info), "alive": host.alive})
        for x in table.launches.values():
            out.append(launch_record(x))
            if x.address:
                out.append({"t": "registered", "n": x.number, "address": x.address, "pid": x.pid})
            if x.returncode is not None:
                out.append({"t": "ended", "n": x.number, "code": x.returncode})
            elif not x.wanted:
                out.append({"t": "unwanted", "n": x.number})
        for i, why in table.lost.items():
            out.append({"t": "lost", "i": i, "why": why})
    for i in range(len(c.addresses)):
        out.append(shard_record(c, i))
    out.extend({"t": "dropped", "i": i, "address": a} for i, a in sorted(c.dropped))
    out.extend({"t": "model", "spec": b64(spec)} for spec in c.models.values())
    out.append({"t": "counters", "c": dict(c.counters)})
    for topic, (round_, payload) in c.board.items():
        out.append({"t": "post", "topic": topic, "round": round_, "payload": payload})
    for topic, (round_, parts) in c.collected.items():
        for part, values in parts.items():
            out.append(part_record(topic, round_, part, values))
        out.append({"t": "take", "topic": topic, "round": round_})
    for (topic, round_), parts in c.parts.items():
        for part, values in parts.items():
            out.append(part_record(topic, round_, part, values))
    for group, clocks in c.clocks.items():
        for worker, clock in clocks.items():
            out.append({"t": "clock", "group": group, "worker": worker, "clock": clock})
    for group, workers in c.removed.items():
        out.extend({"t": "removed", "group": group, "worker": w} for w in sorted(workers))
    out.extend({"t": "removed_executor", "worker": w} for w in sorted(c.removed_executors))
    for q in c.queues.values():
        out.append(
            {"t": "tasks", "queue": q.name, "tasks": q.tasks, "lease_seconds": q.lease_seconds}
        )
        if q.done:
            out.append({"t": "finished", "queue": q.name, "ids": sorted(q.done)})
    return out


def shard_record(c, i: int) -> dict:
    return {
        "t": "shard",
        "i": i,
        "address": c.addresses[i],
        "pid": c.pids[i],
        "backup": c.backups[i],
        "epoch": c.epoch,
        "restarts": c.restarts,
        "term": c.terms[i],  # replication fencing (ps_server.fencing)
        "attached": list(c.attached.get(i, ())),  # the backup's (term, seq) at attach
    }


def launch_record(x) -> dict:
    return {
        "t": "launch",
        "n": x.number,
        "partition": x.partition,
        "role": x.role,
        "host": x.host,
        "restore": x.restore,
    }


def part_record(topic: str, round_: int, part: int, values: np.ndarray) -> dict:
    return {"t": "part", "topic": topic, "round": round_, "part": part, "v": array_record(values)}


# ------------------------------------------------------------ replay
#: The records the host table writes and replays (``ps_server.coordinator.hosts``).
HOST_RECORDS = frozenset(
    {"next_launch", "host", "launch", "registered", "ended", "unwanted", "lost"}
)


def replay(records: list[dict], coordinator, table) -> dict:
    """Apply `records` to a fresh coordinator and host table; returns the config record.

    The coordinator's shard map must already be sized to the config's partitions (the
    caller sizes it from the first record). The host table applies its own records
    (``HostTable.replay``)."""
    from ps_server.coordinator.tasks import TaskQueue

    c, config = coordinator, {}
    now = time.monotonic()
    for r in records:
        t = r.get("t")
        if t == "config":
            config = r
        elif t in HOST_RECORDS:
            table.replay(r, now)
        else:
            _replay_coordinator(c, r, TaskQueue)
    for q in c.queues.values():  # DOING leases are not journaled: every undone task is TODO
        q.todo.clear()
        q.todo.extend(t for t in range(len(q.tasks)) if t not in q.done)
    _touch(c)
    return config


def _touch(c) -> None:
    """Count what was replayed as used now, so it is forgotten once idle
    (ps_server.coordinator.idle) as it would have been without the restart."""
    keys = [("board", t) for t in c.board]
    keys += [("parts", t) for t, _ in c.parts] + [("parts", t) for t in c.collected]
    keys += [("clock", g) for g in c.clocks] + [("queue", q) for q in c.queues]
    keys += [("executor", w) for w in c.removed_executors]
    for kind, key in keys:
        c.last_use.touch(kind, key)


def _replay_coordinator(c, r: dict, task_queue) -> None:
    t = r["t"]
    if t == "shard":
        i = int(r["i"])
        if i < len(c.addresses):
            c.addresses[i], c.pids[i], c.backups[i] = r["address"], int(r["pid"]), r["backup"]
            c.terms[i] = int(r.get("term", 0))
            if r.get("attached"):
                term, seq = r["attached"]
                c.attached[i] = (int(term), int(seq))
            else:
                c.attached.pop(i, None)
        if r.get("undrop"):
            c.dropped = {d for d in c.dropped if d[0] != i}
        c.epoch, c.restarts = int(r["epoch"]), int(r["restarts"])
    elif t == "dropped":
        c.dropped.add((int(r["i"]), r["address"]))
    elif t == "model":
        spec = pb.ModelSpec.FromString(unb64(r["spec"]))
        c.models[spec.name] = spec
    elif t == "unmodel":
        c.models.pop(r["name"], None)
    elif t == "counters":
        c.counters.clear()
        c.counters.update({k: int(v) for k, v in r["c"].items()})
    elif t == "post":
        c.board[r["topic"]] = (int(r["round"]), r["payload"])
    elif t == "part":
        values = np.frombuffer(unb64(r["v"]), dtype="<f8").astype(np.float64)
        c.parts[(r["topic"], int(r["round"]))][int(r["part"])] = values
    elif t == "take":
        topic, round_ = r["topic"], int(r["round"])
        c.collected[topic] = (round_, c.parts.pop((topic, round_), {}))
        for key in [k for k in c.parts if k[0] == topic and k[1] < round_]:
            del c.parts[key]
    elif t == "clock":
        clocks = c.clocks[r["group"]]
        clocks[r["worker"]] = max(clocks.get(r["worker"], 0), int(r["clock"]))
    elif t == "removed":
        c.removed[r["group"]].add(r["worker"])
    elif t == "removed_executor":
        c.removed_executors.add(r["worker"])
    elif t == "tasks":
        q = c.queues.setdefault(r["queue"], task_queue(r["queue"]))
        q.add(list(r["tasks"]), float(r["lease_seconds"]))
    elif t == "finished":
        q = c.queues.get(r["queue"])
        if q is not None:
            q.done.update(int(i) for i in r["ids"])
    else:
        raise JournalError(f"unknown journal record type {t!r}: {str(r)[:200]}")
