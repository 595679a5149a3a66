"""The direct lane: a shard's data-plane RPCs on a plain TCP socket, beside gRPC.

Why: a GBT fit makes one blocking rendezvous call per worker and tree layer (600 for 100
depth-6 trees), and on this project's 2-core VM a gRPC Python round trip costs 1.0 ms for
8 bytes and 2.7 ms for a 400 KB echo, against 0.03 ms and 0.25 ms on a socket (measured
side by side). The layer's work on the shard is ~0.5 ms, so gRPC was most of the wait. Bulk
pulls and pushes pay gRPC's copies per byte: a 16 MB push spent ~20 ms in gRPC's transport
against ~3 ms on the socket (``python -m bench.ps``). An L-BFGS iteration's vector algebra
(server functions, vector ops, reduces, vectors made and dropped) is a few such rounds too:
1.5 ms each through gRPC against 0.4 ms on the lane, for a dot-product call (measured).

What travels is the same protobuf messages as on gRPC, their big arrays aside, framed::

    Call      b"PSD1", u32 token length, token, u64 length, CallRequest
    typed     b"PSD3", u32 token length, token, u64 length,
              u8 rpc (1 Pull, 2 Push, 3 Call, 4 VectorOp, 5 Reduce, 6 CreateModel,
              7 DropModel), u16 request-id length, request id,
              u32 request length, u8 arrays, the request, then per array:
              u8 field (1 keys, 2 values, 3 the call's next array), u64 length, zero
              bytes up to an 8-byte offset of the body, its raw bytes
    answer    u8 status (0 answer, 1 error, 2 answer with raw arrays), u64 length,
              the answer | b"CODE\\nmessage" | as a request's, from its length on

A pull's keys, a push's keys and values, a call's arrays and a pull's answer travel after
their message as raw little-endian bytes (dtype and shape in the message's ``Array``
fields), sent straight from numpy arrays and read in place, aligned, on both ends: encoding
a 16 MB push into a protobuf copied it twice, and the shard copying the bytes into its
request cost ~3 ms; a GBT layer's 1.3 MB of histograms took ~2 ms of copies per call.
A client has one request in flight per connection (two could block both ends on full
socket buffers: the shard writing an answer, the client writing the next request), and
two connections per shard in each thread: a call's next request to a shard travels on
one while the shard applies the other's.

The shard answers exactly as on gRPC: a typed frame that may write (a push, a pull that
creates rows, a reduce, a vector op, a model made or dropped, a call of a function its
module does not list in ``READ_ONLY``) runs the servicer's own handler, so it is replicated
to the backup before it is acknowledged and remembered under its request id (a retry, on
the lane or on gRPC, gets the first answer: ``ps_server.shard.replica``); a pull or call
that only reads makes the same checks and reads. A plain call frame (``PSD1``, no request
id) is served only for read-only functions on models whose reads create no rows; any other
is refused. A frame with a bad token, over the request limit or not parseable gets an error
and the connection is closed; a truncated one is dropped. Either way nothing was applied.
A lane from before typed writes refuses them (``OLD_LANE_REFUSALS``) and applies nothing;
its clients send those through gRPC.

A connection must authenticate with its first frame within ``SPARK_PS_HANDSHAKE_TIMEOUT``
seconds (default 10), and at most ``MAX_PENDING`` connections may be waiting to do so; more
are closed at once. So a peer that connects and stalls, or floods connections, holds a
thread and a descriptor for seconds, not forever. Authenticated connections may idle between
calls as long as their client keeps them.

Plaintext, like the PS's gRPC without TLS: a shard started with TLS opens no lane, and its
clients stay on gRPC. ``SPARK_PS_DIRECT=0`` keeps clients on gRPC too.
"""

from __future__ import annotations

import hmac
import logging
import os
import socket
import struct
import threading
from collections.abc import Callable
from typing import Any

import numpy as np
from google.protobuf.message import Message

from ps_server import timeouts
from ps_server.proto import ps_pb2 as pb
from ps_server.wire import RequestError, check_request_size

__all__ = [
    "RawMessage",
    "DirectServer",
    "DirectLink",
    "DirectError",
    "Payload",
    "MAGIC",
    "TYPED",
    "RPCS",
    "OLD_LANE_REFUSALS",
    "enabled",
]

log = logging.getLogger("ps_server")

MAGIC = b"PSD1"  # a Call frame
TYPED = b"PSD3"  # a Pull, Push or raw-array Call frame (PSD2: the same without padding)
#: The RPCs a typed frame carries: its code -> (name, request type, answer type).
RPCS: dict[int, tuple[str, type[Message], type[Message]]] = {
    1: ("Pull", pb.PullRequest, pb.PullResponse),
    2: ("Push", pb.PushRequest, pb.Ack),
    3: ("Call", pb.CallRequest, pb.CallResponse),
    4: ("VectorOp", pb.VectorOpRequest, pb.Scalar),
    5: ("Reduce", pb.ReduceRequest, pb.Ack),
    6: ("CreateModel", pb.CreateModelRequest, pb.ModelInfo),
    7: ("DropModel", pb.ModelRef, pb.Ack),
}
#: What a lane from before lane writes answers to one (a new rpc code, or a call that is
#: not read-only): a client then sends that shard's writes through gRPC.
OLD_LANE_REFUSALS = ("unknown rpc code", "serves only read-only functions")
_CODES = {name: code for code, (name, _, _) in RPCS.items()}
_HEAD = struct.Struct("<4sI")  # magic, token length
_TYPED = struct.Struct("<BH")  # rpc code, request-id length
_META = struct.Struct("<IB")  # request length, raw arrays after it
_RAW = struct.Struct("<BQ")  # field code, byte length (then padding, see `_pad`)
_ALIGN = 8
#: The request fields that may travel as raw arrays: code -> name, and per rpc.
FIELDS = {1: "keys", 2: "values", 3: "arrays"}
_FIELD_CODES = {name: code for code, name in FIELDS.items()}
_RAW_FIELDS = {
    "Pull": ("keys",), "Push": ("keys", "values"), "Call": ("arrays",),
    "VectorOp": (), "Reduce": (), "CreateModel": (), "DropModel": (),
}  # fmt: skip
#: Repeated fields: each raw array of one fills the next entry, in order.
_REPEATED = ("arrays",)
_LEN = struct.Struct("<Q")
_STATUS = struct.Struct("<BQ")  # 0 answer / 1 error / 2 answer with raw arrays, its length
_RAW_ANSWER = 2
_MAX_TOKEN = 4096
_IOV_MAX = 1024  # buffers per sendmsg (the kernel's limit)
ENV = "SPARK_PS_DIRECT"
#: Connections that have not yet sent a frame with the right token, at most.
MAX_PENDING = 64


def handshake_timeout() -> float:
    """Seconds a new connection has to send its first frame ($SPARK_PS_HANDSHAKE_TIMEOUT)."""
    return timeouts.handshake_timeout()


def enabled() -> bool:
    """Whether clients use shards' direct lanes ($SPARK_PS_DIRECT, default on)."""
    return os.environ.get(ENV, "1").strip().lower() not in ("0", "false", "no", "off")


def _read_exactly(sock: socket.socket, n: int) -> bytearray | None:
    """n bytes, or None if the peer closed the connection before sending them all."""
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            return None
        got += k
    return buf


class DirectError(Exception):
    """An error answer (`code` is the gRPC status name) or a broken connection (code None)."""

    def __init__(self, code: str | None, message: str):
        super().__init__(message)
        self.code = code


class DirectServer:
    """Serves framed requests on `host`, one thread per connection.

    `handle(request)` answers a ``CallRequest``, or a :class:`RawMessage` of one whose
    ``arrays`` are :class:`RawArray` views (it must refuse what the lane may not serve);
    `serve(rpc, request, request_id)` answers a pull or push (:data:`RPCS`; None: the lane
    serves calls only) with its answer message, or a :class:`Payload` whose arrays
    go raw. Both raise :class:`RequestError` to refuse. `where` names the server in messages.
    """

    def __init__(
        self,
        host: str,
        token: str,
        handle: Callable[[pb.CallRequest | RawMessage], pb.CallResponse],
        max_request_bytes: int,
        where: str,
        handshake: float | None = None,
        max_pending: int = MAX_PENDING,
        serve: Callable[[str, Message, str], Message] | None = None,
    ) -> None:
        self._token, self._handle, self._serve_rpc = token.encode(), handle, serve
        self._limit, self._where = max_request_bytes, where
        self._handshake = handshake_timeout() if handshake is None else handshake
        self._pending = threading.BoundedSemaphore(max_pending)
        self._max_pending = max_pending
        family = socket.getaddrinfo(host, 0, type=socket.SOCK_STREAM)[0][0]
        self._sock = socket.create_server((host, 0), family=family)
        self.port = self._sock.getsockname()[1]
        self._closed = False
        threading.Thread(target=self._accept, name=f"{where} direct lane", daemon=True).start()

    def close(self) -> None:
        self._closed = True
        try:
            self._sock.close()
        except OSError:
            pass

    def _accept(self) -> None:
        while not self._closed:
            try:
                conn, peer = self._sock.accept()
            except OSError:
                return  # closed
            if not self._pending.acquire(blocking=False):
                log.warning(
                    "%s: direct lane: %s connections wait to authenticate; closing one from %s",
                    self._where,
                    self._max_pending,
                    peer,
                )
                conn.close()
                continue
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        """Serve a connection's frames; it holds a pending slot until its first frame has
        shown the token (within the handshake timeout), then idles as long as it likes."""
        pending = True
        try:
            with conn:
                conn.settimeout(self._handshake)
                while True:
                    frame = self._authenticate(conn)
                    if frame is None:
                        return
                    if pending:
                        pending = False
                        self._pending.release()
                        conn.settimeout(None)
                    if not self._answer(conn, *frame):
                        return
        except OSError:
            pass  # the client went away mid-frame, or stalled past the handshake: nothing applied
        finally:
            if pending:
                self._pending.release()

    def _authenticate(self, conn: socket.socket) -> tuple[bool, int] | None:
        """A frame's header and token: (typed, its body length), or None when the connection
        must close (closed by the peer, or refused: not a frame, or a bad token)."""
        head = _read_exactly(conn, _HEAD.size)
        if head is None:
            return None
        magic, token_len = _HEAD.unpack(head)
        typed = magic == TYPED
        if (magic != MAGIC and not typed) or token_len > _MAX_TOKEN:
            return self._refuse(conn, "INVALID_ARGUMENT", "not a direct-lane frame")
        token = _read_exactly(conn, token_len)
        size = _read_exactly(conn, _LEN.size) if token is not None else None
        if size is None:
            return None
        if self._token and not hmac.compare_digest(bytes(token), self._token):
            return self._refuse(conn, "UNAUTHENTICATED", "bad auth token on the direct lane")
        return typed, _LEN.unpack(size)[0]

    def _answer(self, conn: socket.socket, typed: bool, n: int) -> bool:
        """Read an authenticated frame's `n`-byte body and answer it; False: close."""
        try:
            check_request_size(n, self._limit, f"{self._where}: direct request")
        except RequestError as e:
            self._refuse(conn, e.code, str(e))
            return False
        body = _read_exactly(conn, n)
        if body is None:
            return False  # truncated: dropped before anything was parsed
        try:
            if typed:
                rpc, request, rid = parse_typed(body)
            else:  # parses the bytearray: no copy
                rpc, request, rid = "Call", pb.CallRequest.FromString(body), ""
        except Exception as e:  # noqa: BLE001 - any parse failure is the client's
            what = "typed frame" if typed else "CallRequest"
            self._refuse(conn, "INVALID_ARGUMENT", f"malformed {what}: {e}")
            return False
        if rpc != "Call" and self._serve_rpc is None:
            self._refuse(conn, "INVALID_ARGUMENT", f"this lane serves no {rpc}")
            return False
        try:
            if rpc == "Call" and (not typed or self._serve_rpc is None):
                answer = self._handle(request)  # a plain frame: read-only calls only
            else:
                answer = self._serve_rpc(rpc, request, rid)
        except RequestError as e:
            return self._error(conn, e.code, str(e))
        except MemoryError:
            return self._error(conn, "RESOURCE_EXHAUSTED", f"{self._where}: out of memory")
        except Exception as e:  # noqa: BLE001 - a server survives every request
            log.exception("%s: direct %s failed", self._where, rpc)
            return self._error(conn, "INTERNAL", f"{self._where}: {type(e).__name__}: {e}")
        if isinstance(answer, Payload):  # its arrays as raw bytes
            parts = with_arrays(answer)
            _send(conn, [_STATUS.pack(_RAW_ANSWER, sum(len(p) for p in parts)), *parts])
            return True
        answer = answer.SerializeToString()
        _send(conn, [_STATUS.pack(0, len(answer)), answer])
        return True

    def _error(self, conn: socket.socket, code: str, message: str) -> bool:
        text = f"{code}\n{message}".encode()
        conn.sendall(_STATUS.pack(1, len(text)) + text)
        return True

    def _refuse(self, conn: socket.socket, code: str, message: str) -> None:
        """Answer with an error; the caller closes: the rest of the stream cannot be trusted.
        Unread input is drained a little first; closing over it would reset the connection,
        and the client might lose the answer."""
        self._error(conn, code, message)
        conn.shutdown(socket.SHUT_WR)
        conn.settimeout(0.5)
        try:
            for _ in range(16):  # at most 1 MB
                if not conn.recv(1 << 16):
                    break
        except OSError:
            pass
        return None


def _send(sock: socket.socket, parts: list) -> None:
    """Send `parts` (bytes-like) gathered: none is copied (a 16 MB answer, say)."""
    views = [memoryview(p).cast("B") for p in parts if len(p)]
    while views:
        sent = sock.sendmsg(views[:_IOV_MAX])
        while views and sent >= len(views[0]):
            sent -= len(views[0])
            views.pop(0)
        if sent:
            views[0] = views[0][sent:]


def typed_body(request: Message | Payload, rpc: str, request_id: str) -> list:
    """The buffers of a typed frame's body (the arrays' own memory, not copies)."""
    rid = request_id.encode()
    head = _TYPED.pack(_CODES[rpc], len(rid)) + rid
    return [head, *with_arrays(request, len(head))]


def _pad(at: int) -> int:
    """Zero bytes before a raw array that starts at body offset `at`: arrays start at a
    multiple of 8, so the receiver's views of them are aligned (as numpy and numba expect)."""
    return -at % _ALIGN


def with_arrays(message: Message | Payload, at: int = 0) -> list:
    """A message's buffers on the lane, written at body offset `at`: its length and
    raw-array count, its fields, then each raw array's field code and length, zero padding
    to an 8-byte offset, and its bytes."""
    arrays = message.arrays if isinstance(message, Payload) else {}
    flat = [(n, a) for n, v in arrays.items() for a in (v if isinstance(v, list) else [v])]
    meta = (message.request if isinstance(message, Payload) else message).SerializeToString()
    parts = [_META.pack(len(meta), len(flat)), meta]
    at += _META.size + len(meta)
    for name, a in flat:
        pad = _pad(at + _RAW.size)
        head = _RAW.pack(_FIELD_CODES[name], a.nbytes) + bytes(pad)
        parts += [head, a.reshape(-1).view(np.uint8)]
        at += _RAW.size + pad + a.nbytes
    return parts


def _read_arrays(view: memoryview, at: int, kind: type[Message], fields: tuple[str, ...]):
    """Parse what `_with_arrays` wrote from `view[at:]`: (the message, {field: raw bytes
    as a memoryview, a list of them for a repeated field}); ValueError naming what does
    not fit."""
    if len(view) < at + _META.size:
        raise ValueError("shorter than its message length")
    size, count = _META.unpack_from(view, at)
    at += _META.size
    if len(view) < at + size:
        raise ValueError("shorter than its message")
    message = kind.FromString(view[at : at + size])
    at += size
    raw: dict[str, Any] = {name: [] for name in fields if name in _REPEATED}
    for _ in range(count):
        if len(view) < at + _RAW.size:
            raise ValueError("shorter than its arrays")
        field, n = _RAW.unpack_from(view, at)
        at += _RAW.size
        at += _pad(at)
        name = FIELDS.get(field)
        if name not in fields or (name in raw and name not in _REPEATED):
            raise ValueError(f"raw array field {field} not expected in a {kind.__name__}")
        if len(view) < at + n:
            raise ValueError(f"shorter than its {name}")
        if name in _REPEATED:
            raw[name].append(view[at : at + n])
        else:
            raw[name] = view[at : at + n]
        at += n
    if at != len(view):
        raise ValueError(f"{len(view) - at} bytes after its arrays")
    for name in _REPEATED:
        if name in raw and len(raw[name]) != len(getattr(message, name)):
            raise ValueError(
                f"{len(raw[name])} raw {name} for the {len(getattr(message, name))} it names"
            )
    return message, raw


def parse_answer(body: bytearray, kind: type[Message]) -> RawMessage:
    """An answer with raw arrays (what the shard sent as ``with_arrays(payload)``)."""
    return RawMessage(*_read_arrays(memoryview(body), 0, kind, ("keys", "values")))


def parse_typed(body: bytearray) -> tuple[str, RawMessage, str]:
    """A typed frame's body: (rpc, request with its arrays left in the frame, request id);
    ValueError naming what is wrong when it is not one."""
    view = memoryview(body).toreadonly()  # nothing writes a request's arrays (see put)
    if len(body) < _TYPED.size:
        raise ValueError("shorter than its header")
    code, rid_len = _TYPED.unpack_from(body)
    if code not in RPCS:
        raise ValueError(f"unknown rpc code {code}")
    at = _TYPED.size + rid_len
    if len(body) < at:
        raise ValueError("shorter than its request id")
    rpc, request_type, _ = RPCS[code]
    rid = bytes(view[_TYPED.size : at]).decode()
    return rpc, RawMessage(*_read_arrays(view, at, request_type, _RAW_FIELDS[rpc])), rid


class RawArray:
    """An ``Array`` whose bytes stayed in the frame they came in (``from_array`` reads it)."""

    __slots__ = ("data", "dtype", "shape")

    def __init__(self, data: memoryview, meta: pb.Array) -> None:
        self.data, self.dtype, self.shape = data, meta.dtype, tuple(meta.shape)


class RawMessage:
    """A request or answer read from the lane: the message's fields, its arrays as
    :class:`RawArray` views of the frame's bytes (no copy: a shard applies a push or reads
    a call's histograms, and a client reads a pull's values, straight from the bytes
    received; a repeated field is a list of them). :meth:`message` and
    ``SerializeToString`` put the arrays back, for a replicated push's backup."""

    def __init__(self, message: Message, raw: dict[str, Any]) -> None:
        self._message, self._raw = message, raw
        for name, data in raw.items():
            meta = getattr(message, name)
            if isinstance(data, list):
                setattr(self, name, [RawArray(d, m) for d, m in zip(data, meta, strict=True)])
            else:
                setattr(self, name, RawArray(data, meta))

    def __getattr__(self, name: str):
        return getattr(self.__dict__["_message"], name)

    def message(self) -> Message:
        """The whole protobuf, its arrays inside (a copy of their bytes)."""
        full = type(self._message)()
        full.CopyFrom(self._message)
        for name, data in self._raw.items():
            if isinstance(data, list):
                for entry, d in zip(getattr(full, name), data, strict=True):
                    entry.data = bytes(d)
            else:
                getattr(full, name).data = bytes(data)
        return full

    def SerializeToString(self) -> bytes:  # noqa: N802 - protobuf's name
        return self.message().SerializeToString()


class Payload:
    """A pull, push or call request whose arrays are numpy arrays until sent: on the lane
    their bytes go straight from the arrays; :meth:`message` builds the protobuf, for gRPC.
    A repeated field (a call's ``arrays``) takes a list. Other attributes read the
    request's (``payload.chunk``)."""

    def __init__(self, request: Message, **arrays: np.ndarray | list[np.ndarray]) -> None:
        self.request, self.arrays = request, {}
        for name, given in arrays.items():
            field = getattr(request, name)
            if isinstance(given, list):
                self.arrays[name] = [_little(a) for a in given]
                for a in self.arrays[name]:
                    field.add(dtype=a.dtype.name, shape=a.shape)
            else:
                a = self.arrays[name] = _little(given)
                field.CopyFrom(pb.Array(dtype=a.dtype.name, shape=a.shape))

    def __getattr__(self, name: str):
        return getattr(self.__dict__["request"], name)

    def message(self) -> Message:
        """The whole request, its arrays' bytes inside."""
        m = type(self.request)()
        m.CopyFrom(self.request)
        for name, a in self.arrays.items():
            if isinstance(a, list):
                for entry, one in zip(getattr(m, name), a, strict=True):
                    entry.data = one.tobytes()
            else:
                getattr(m, name).data = a.tobytes()
        return m


def _little(a: np.ndarray) -> np.ndarray:
    """`a` C-contiguous and little-endian, as raw bytes travel (a 0-d array stays 0-d)."""
    a = np.asarray(a)
    a = a if a.flags.c_contiguous else np.ascontiguousarray(a)
    return a.astype(a.dtype.newbyteorder("<")) if a.dtype.byteorder == ">" else a


class DirectLink:
    """A client's connection to one shard's lane; not thread-safe (one per thread)."""

    def __init__(self, host: str, port: int, token: str, timeout: float) -> None:
        self._sock = socket.create_connection((host, port), timeout=timeout)
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        token_bytes = token.encode()
        self._call = _HEAD.pack(MAGIC, len(token_bytes)) + token_bytes
        self._typed = _HEAD.pack(TYPED, len(token_bytes)) + token_bytes

    def send(self, request: Message | Payload, rpc: str = "Call", request_id: str = "") -> None:
        """Send a ``Call``, ``Pull`` or ``Push`` request (raises OSError if the connection
        is broken); a pull or push carries its `request_id` as on gRPC, and a
        :class:`Payload`'s arrays (a call's too) as raw bytes."""
        if rpc == "Call" and not isinstance(request, Payload):
            body = request.SerializeToString()
            _send(self._sock, [self._call + _LEN.pack(len(body)), body])
            return
        parts = typed_body(request, rpc, request_id)
        total = sum(len(p) for p in parts)
        _send(self._sock, [self._typed + _LEN.pack(total), *parts])

    def receive(self, answer: type[Message] = pb.CallResponse) -> Message:
        """The answer (of type `answer`) to the last request sent; :class:`DirectError` for
        an error answer (code set) or a connection that broke (code None)."""
        try:
            head = _read_exactly(self._sock, _STATUS.size)
            status, n = _STATUS.unpack(head) if head is not None else (None, 0)
            body = _read_exactly(self._sock, n) if head is not None else None
        except OSError as e:
            raise DirectError(None, f"direct lane: {e}") from None
        if body is None:
            raise DirectError(None, "direct lane: the shard closed the connection")
        if status == 0:
            return answer.FromString(body)
        if status == _RAW_ANSWER:
            return parse_answer(body, answer)
        code, _, message = bytes(body).decode(errors="replace").partition("\n")
        raise DirectError(code, message)

    def refusal(self) -> DirectError | None:
        """After a send broke: the error answer the shard sent before it closed, or None.
        A shard refuses a frame over its limit or with a bad token before reading the body,
        then closes, so a large request's send breaks while the refusal waits unread."""
        try:
            self._sock.settimeout(1.0)
            self.receive(pb.CallResponse)
        except DirectError as e:
            return e if e.code is not None else None
        except OSError:
            return None
        return None

    def close(self) -> None:
        try:
            self._sock.close()
        except OSError:
            pass
