"""PSClient: one screen of API over the shards and the coordinator.

Array contract (written once, every method points here): keys are 1-D int64 in
[0, dim); values are float arrays of shape [n] for vectors (cols == 1) or
[n, cols]. Keys may repeat: a pull deduplicates them before sending, a push sums
the values of equal keys before sending (one compiled hash pass that also groups them by
shard, :mod:`ps_server.keys_jit`); a caller whose keys are known to be distinct passes
``unique=True`` and skips it. Each call sends one request per shard
(chunked below `max_message_bytes`), all shards concurrently, and retries with
backoff when a shard is unavailable (restarting, or its backup being promoted),
re-resolving the shard map. Every shard request carries an id that its retries
reuse, so a replicated PS applies a retried mutation once (`ps_server.shard.replica`).
"""

from __future__ import annotations

import functools
import itertools
import json
import logging
import math
import os
import threading
import time
import urllib.parse
import uuid

import grpc
import numpy as np

from ps_server.keys import is_strictly_increasing, validate_keys
from ps_server.proto import ps_pb2 as pb
from ps_server.proto import ps_pb2_grpc as pb_grpc
from ps_server.shard import direct as direct_lane
from ps_server.shard.direct import OLD_LANE_REFUSALS, DirectError, DirectLink, Payload
from ps_server.shard.replica import REQUEST_ID_KEY
from ps_server.timeouts import (
    DEADLINE_MARGIN_SECONDS,
    DEFAULT_WAIT_SECONDS,
    MAX_WAIT_SECONDS,
)
from ps_server.tls import open_channel
from ps_server.wire import ALLOWED_DTYPES, LIMIT_HINT, TOKEN_KEY, from_array, to_array
from spark_ps.client.reach import check_reachable
from spark_ps.client.spec import TensorSpec

__all__ = ["PSClient", "PSError", "get_client"]

log = logging.getLogger("spark_ps.client")

# sizes are the servers' business: they announce their request limit and the client
# checks against it before sending (see `_fanout`)
_OPTIONS = [("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)]
#: Arrays a lane frame carries raw, at most (its count is one byte); more go inside.
_MAX_RAW_ARRAYS = 255
#: Room left in a chunk for the envelope around its arrays (model name, shape, ids).
_ENVELOPE_BYTES = 64 << 10
_OPS = {"add": pb.ADD, "set": pb.SET, "step": pb.STEP}


class PSError(RuntimeError):
    """A PS call failed; carries the gRPC status `code`, the `shard` (or None) and the `rpc`."""

    def __init__(
        self,
        message: str,
        *,
        code: grpc.StatusCode | None = None,
        shard: int | None = None,
        rpc: str = "",
    ):
        where = f"{rpc} on shard {shard}" if shard is not None else rpc
        super().__init__(f"{where}: {message}" if where else message)
        self.code, self.shard, self.rpc = code, shard, rpc


class _Done:
    """A blocking unary call behind the ``result()`` of a future (raises on ``result()``)."""

    def __init__(self, stub, request, metadata, timeout: float) -> None:
        self._call = (stub, request, metadata, timeout)

    def result(self):
        stub, request, metadata, timeout = self._call
        return stub(request, metadata=metadata, timeout=timeout)


class _DirectRpcError(grpc.RpcError):
    """An error answer from a shard's direct lane, shaped like gRPC's (code(), details())."""

    def __init__(self, code: str, details: str) -> None:
        super().__init__(details)
        self._code = getattr(grpc.StatusCode, code, grpc.StatusCode.UNKNOWN)
        self._details = details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


class _DirectCall:
    """A request on a shard's direct lane (:mod:`ps_server.shard.direct`) behind a future's
    ``result()``; sent at once, so requests to several shards overlap. If the lane is broken
    the request goes through gRPC instead with the same request id: a read is harmless to
    send twice, and a replicated write is answered once (its primary remembers the id)."""

    def __init__(
        self,
        client: PSClient,
        shard: int,
        link: DirectLink,
        request,
        rpc,
        md,
        fallback,
        later,
        writes: bool = False,
    ):
        self._client, self._shard, self._link = client, shard, link
        self._fallback, self._sent = fallback, False
        self._refused: DirectError | None = None  # the shard's answer to a broken send
        self._answer = pb.CallResponse if rpc == "Call" else _LANE_ANSWERS[rpc]
        self._call = rpc == "Call"
        #: a frame an older lane may refuse unapplied: a raw-array call, or a write
        self._new_frame = writes or (rpc == "Call" and isinstance(request, Payload))
        self._request = (request, rpc, next((v for k, v in md if k == REQUEST_ID_KEY), ""))
        #: the call to send on this connection once this one's answer is read
        self.then: _DirectCall | None = None
        if not later:
            self._send()

    def _send(self) -> None:
        try:
            self._link.send(*self._request)
            self._sent = True
        except OSError:  # gRPC carries it, unless the shard refused it unread
            self._refused = self._link.refusal()
            self._client._drop_link(self._shard, self._link)
        self._request = None

    def abandon(self) -> None:
        """The caller will not read the answer: close the connection, so that its next
        request cannot read this one's answer."""
        if self._sent:
            self._client._drop_link(self._shard, self._link)
        self._request, self._sent = None, False

    def result(self):
        if self._request is not None:  # sent `later`: now
            self._send()
        usable = False  # the connection can carry the next request
        try:
            if self._sent:
                try:
                    answer = self._link.receive(self._answer)
                    usable = True
                    return answer
                except DirectError as e:
                    # after an error answer the shard may have closed the connection (it
                    # does when it refused the frame unread): not to be reused
                    self._client._drop_link(self._shard, self._link)
                    if self._new_frame and any(t in str(e) for t in OLD_LANE_REFUSALS):
                        # an older shard refused the frame unapplied: gRPC now, and its
                        # writes through gRPC from now on (plain call frames too if it
                        # predates raw-array calls)
                        address = self._client.addresses[self._shard]
                        self._client._read_lanes.add(address)
                        if self._call and "unknown rpc code" in str(e):
                            self._client._plain_calls.add(address)
                    elif e.code is not None:
                        raise _DirectRpcError(e.code, str(e)) from None
            elif self._refused is not None:  # refused unread (over the limit): no retry
                raise _DirectRpcError(self._refused.code, str(self._refused))
        finally:  # the connection is free: the next request on it goes out while the
            # caller reads other connections' answers; gRPC carries it if it broke
            after, self.then = self.then, None
            if after is not None and after._request is not None:
                if usable:
                    after._send()
                else:
                    after._request = None
        return self._fallback().result()


#: RPCs that always take a shard's direct lane when it has one (and their answers' types).
#: A call takes one too: with ``direct`` (read-only) as a plain frame, else as a write.
_LANE_ANSWERS = {name: answer for name, _, answer in direct_lane.RPCS.values() if name != "Call"}
#: Lane RPCs a lane from before typed writes refuses (a call that may write as well).
_LANE_WRITES = frozenset(_LANE_ANSWERS) - {"Pull", "Push"}
#: Connections a thread keeps to each shard's lane: a call of several requests to a shard
#: sends the next on the other connection while the shard applies one (the wire and the
#: apply overlap instead of taking turns).
LANES_PER_SHARD = 2


def _dialled(url: str, address: str) -> str:
    """`url` with a wildcard host (a page listening on every interface) replaced by the host
    of `address`, the coordinator this client reached."""
    parts = urllib.parse.urlsplit(url)
    if parts.hostname not in ("0.0.0.0", "::"):
        return url
    host = address.rsplit(":", 1)[0]
    return parts._replace(netloc=f"{host}:{parts.port}").geturl()


class PSClient:
    """A connection set to one PS service (coordinator + shards)."""

    def __init__(
        self,
        address: str,
        token: str = "",
        *,
        timeout: float = 120.0,
        retry_seconds: float = 90.0,
        max_message_bytes: int = 4 << 20,
        tls_ca: bytes | None = None,
        checkpoint_keep: int = 2,
    ):
        if checkpoint_keep < 0:
            raise ValueError(f"checkpoint_keep must be >= 0 (0 keeps all), got {checkpoint_keep}")
        self.checkpoint_keep = checkpoint_keep  # sealed versions kept under a checkpoint uri
        self.address, self.timeout, self.retry_seconds = address, timeout, retry_seconds
        self.token, self.tls_ca = token, tls_ca
        self.max_message_bytes = max_message_bytes
        self.max_request_bytes = 0  # the servers' limit, from the shard map
        self._md = ((TOKEN_KEY, token),)
        self._rid_prefix, self._rids = uuid.uuid4().hex[:16], itertools.count()
        self._channels: dict[str, grpc.Channel] = {}
        self._retired: list[tuple[float, grpc.Channel]] = []  # to closed shards, closing soon
        self._lock = threading.Lock()
        self._direct_ports: dict[str, int] = {}  # shard address -> direct lane port (0: none)
        #: shard addresses whose lanes predate raw-array calls (they get plain call frames)
        self._plain_calls: set[str] = set()
        #: shard addresses whose lanes predate typed writes (those go through gRPC)
        self._read_lanes: set[str] = set()
        # per thread: shard address -> DirectLink ("links"; "spares": the second connection)
        self._links = threading.local()
        self.coordinator = pb_grpc.CoordinatorStub(self._channel(address))
        self.epoch, self.restarts, self.shards = -1, -1, []
        self.refresh()

    # ------------------------------------------------------------ plumbing
    def _channel(self, address: str) -> grpc.Channel:
        with self._lock:
            if address not in self._channels:
                self._channels[address] = open_channel(address, self.tls_ca, _OPTIONS)
            return self._channels[address]

    def refresh(self) -> None:
        """Re-read the shard map (after a shard restarted elsewhere)."""
        smap = self._coord("GetShardMap", pb.Empty())
        self.epoch, self.restarts = smap.epoch, smap.restarts
        self.shards = [pb_grpc.ShardStub(self._channel(a)) for a in smap.addresses]
        self.addresses = list(smap.addresses)
        self.backups = list(smap.backups)  # "" per shard without a (seeded) backup
        self.lost = list(smap.lost)  # across hosts: why a partition is lost ("" = it is not)
        self.ui_url = _dialled(smap.ui_url, self.address)  # the status page ("" = none)
        self._retire({*self.addresses, *self.backups, self.address})
        limit = smap.max_request_bytes
        if limit and limit != self.max_request_bytes:
            self.max_request_bytes = limit
            if self.max_message_bytes > limit - _ENVELOPE_BYTES:
                log.warning(
                    "spark.ps.maxMessageMB (%.1f MB) is above the PS's request limit "
                    "(%.1f MB); chunking below the limit instead",
                    self.max_message_bytes / 2**20,
                    limit / 2**20,
                )

    def _retire(self, live: set[str]) -> None:
        """Close channels to addresses the map no longer holds: a restarted shard listens on
        a new port, and a long-lived client would otherwise keep one channel per restart.
        A call may still be in flight on one, so it closes only once every call started on
        it has passed its deadline."""
        now = time.monotonic()
        with self._lock:
            for address in [a for a in self._channels if a not in live]:
                self._retired.append((now, self._channels.pop(address)))
                self._direct_ports.pop(address, None)
            expired = [ch for t, ch in self._retired if now - t > self.timeout + 1.0]
            self._retired = [(t, ch) for t, ch in self._retired if now - t <= self.timeout + 1.0]
        for ch in expired:
            ch.close()

    @property
    def chunk_bytes(self) -> int:
        """Payload bytes per request: maxMessageMB, kept below the servers' request limit."""
        if not self.max_request_bytes:
            return self.max_message_bytes
        return max(1, min(self.max_message_bytes, self.max_request_bytes - _ENVELOPE_BYTES))

    @property
    def num_shards(self) -> int:
        return len(self.shards)

    def _coord(self, rpc: str, request, timeout: float | None = None):
        """Call the coordinator; while it is unavailable (restarting: its state is in its
        journal), retry for `retry_seconds` from the first failure, not from the call's
        start, so that a long wait cut by the restart is asked again."""
        deadline = None
        while True:
            try:
                return getattr(self.coordinator, rpc)(
                    request, metadata=self._md, timeout=timeout or self.timeout
                )
            except grpc.RpcError as e:
                now = time.monotonic()
                deadline = now + self.retry_seconds if deadline is None else deadline
                if e.code() != grpc.StatusCode.UNAVAILABLE or now > deadline:
                    raise PSError(_details(e), code=e.code(), rpc=rpc) from None
                time.sleep(0.2)

    def _fanout(self, rpc: str, requests: list[tuple[int, object]], direct: bool = False) -> list:
        """Send (shard, request) pairs concurrently; retry unavailable shards with backoff.

        A retry resends the request with its first attempt's id (`REQUEST_ID_KEY`).
        `direct`: read-only ``Call``s that may use the shards' direct lanes.
        """
        results: list = [None] * len(requests)
        pending = list(range(len(requests)))
        mds = [
            (*self._md, (REQUEST_ID_KEY, f"{self._rid_prefix}-{next(self._rids)}"))
            for _ in requests
        ]
        deadline, delay = time.monotonic() + self.retry_seconds, 0.1
        while pending:
            self._check_lost(rpc, {requests[i][0] for i in pending})
            retry = []
            calls, done = self._send(rpc, requests, mds, pending, direct), 0
            try:
                for i, fut in calls:
                    done += 1
                    try:
                        results[i] = fut.result()
                    except grpc.RpcError as e:
                        shard = requests[i][0]
                        if e.code() == grpc.StatusCode.UNAVAILABLE and time.monotonic() < deadline:
                            retry.append(i)
                            continue
                        raise PSError(_details(e), code=e.code(), shard=shard, rpc=rpc) from None
            except BaseException:
                for _, fut in calls[done:]:  # their answers will not be read
                    if isinstance(fut, _DirectCall):
                        fut.abandon()
                raise
            if retry:
                log.warning(
                    "%s: shards %s unavailable; retrying in %.1fs",
                    rpc,
                    sorted({requests[i][0] for i in retry}),
                    delay,
                )
                time.sleep(delay)
                delay = min(delay * 2, 2.0)
                self.refresh()
            pending = retry
        return results

    def _check_lost(self, rpc: str, shards: set[int]) -> None:
        """Refuse a call to a partition the PS lost (both replicas gone, nothing to restore)."""
        for s in sorted(shards):
            if s < len(self.lost) and self.lost[s]:
                raise PSError(self.lost[s], code=grpc.StatusCode.DATA_LOSS, shard=s, rpc=rpc)

    def _send(
        self,
        rpc: str,
        requests: list[tuple[int, object]],
        mds: list,
        pending: list[int],
        direct: bool = False,
        lanes: bool = True,
    ):
        """(index, future-like) per pending request. One request is a plain blocking call:
        a future costs a hand-off to gRPC's polling thread (~0.5 ms per call, measured).
        The RPCs of `_LANE_ANSWERS` and calls go to shards' direct lanes where they have
        one (see `_DirectCall`); ``lanes=False``: gRPC whatever the call."""
        lane = lanes and (rpc in _LANE_ANSWERS or rpc == "Call")
        if lane and not self.tls_ca and direct_lane.enabled():
            out: list = []
            try:
                return self._send_lanes(rpc, requests, mds, pending, out, direct)
            except BaseException:
                for _, call in out:  # sent ones: their answers would be read as another's
                    if isinstance(call, _DirectCall):
                        call.abandon()
                raise
        if len(pending) == 1:
            (i,) = pending
            stub = getattr(self.shards[requests[i][0]], rpc)
            return [(i, _Done(stub, _message(requests[i][1]), mds[i], self.timeout))]
        return [
            (
                i,
                getattr(self.shards[requests[i][0]], rpc).future(
                    _message(requests[i][1]), metadata=mds[i], timeout=self.timeout
                ),
            )
            for i in pending
        ]

    def _send_lanes(
        self, rpc: str, requests, mds, pending: list[int], out: list, direct: bool
    ) -> list:
        """`_send` on the lanes: each request's (index, call) goes into `out` as it is
        made, so that the caller can abandon the ones sent if a later one raises. A call
        that may write travels as a typed frame (a :class:`Payload`, see `call`), with its
        request id; gRPC carries it, and every write, to a shard whose lane predates them."""
        count: dict = {}
        last: dict = {}
        writes = rpc in _LANE_WRITES or (rpc == "Call" and not direct)
        for i in pending:
            shard, request = requests[i]
            # A shard's requests alternate over LANES_PER_SHARD connections, so that the
            # next one travels while the shard applies this one.
            nth = count[shard] = count.get(shard, -1) + 1
            which = nth % LANES_PER_SHARD
            by_grpc = writes and (
                self.addresses[shard] in self._read_lanes
                or (rpc == "Call" and not isinstance(request, Payload))  # arrays not raw
            )
            link = None if by_grpc else self._link(shard, which)
            # the request's own way when the lane cannot carry it: gRPC, never a lane
            # connection (another request of this call may be in flight on it)
            grpc_call = functools.partial(self._send, rpc, requests, mds, [i], lanes=False)
            if link is None:
                out.extend(grpc_call())
            else:
                # One request in flight per connection: a second one sent before the
                # first's answer is read could block both ends on full socket buffers
                # (the shard writing its answer, the client writing the next request).
                # A later one goes out when the one before it on its connection is read.
                before = last.get((shard, which))
                fallback = lambda g=grpc_call: g()[0][1]  # noqa: E731
                call = _DirectCall(
                    self, shard, link, request, rpc, mds[i], fallback, before is not None, writes
                )
                if before is not None:
                    before.then = call
                last[shard, which] = call
                out.append((i, call))
        return out

    def _link(self, shard: int, which: int = 0) -> DirectLink | None:
        """This thread's connection `which` (0 or 1, see `LANES_PER_SHARD`) to `shard`'s
        direct lane (None: the shard has none)."""
        address = self.addresses[shard]
        links = self._links.__dict__.setdefault("links" if which == 0 else "spares", {})
        link = links.get(address)
        if link is None:
            port = self._direct_ports.get(address)
            if port is None:  # asked once per shard address (a restarted shard has a new one)
                port = self._fanout("Health", [(shard, pb.Empty())])[0].direct_port
                self._direct_ports[address] = port
            if not port:
                return None
            host = address.rsplit(":", 1)[0].strip("[]")
            try:
                link = DirectLink(host, port, self.token, self.timeout)
            except OSError as e:
                log.warning("shard %d: no direct lane at port %d (%s); using gRPC", shard, port, e)
                self._direct_ports[address] = 0
                return None
            links[address] = link
        return link

    def _drop_link(self, shard: int, link: DirectLink) -> None:
        """Close and forget this thread's connection `link` to `shard`'s lane (broken, or
        holding an answer no one will read); the next call reconnects, asking the shard map
        again if the shard moved. The thread's other connection to it is left alone: a
        request on it may have been applied, and its answer is still to be read."""
        address = self.addresses[shard]
        link.close()
        for kind in ("links", "spares"):
            links = self._links.__dict__.get(kind, {})
            if links.get(address) is link:
                del links[address]
        self._direct_ports.pop(address, None)

    def _check_size(self, nbytes: int, rpc: str, shard: int | None = None) -> None:
        """Refuse, before sending anything, a request the servers would refuse as too big."""
        limit = self.max_request_bytes
        if limit and nbytes + _ENVELOPE_BYTES > limit:
            where = f"{rpc} to shard {shard}" if shard is not None else rpc
            raise PSError(
                f"{where}: request of about {nbytes} bytes ({nbytes / 2**20:.1f} MB) exceeds "
                f"the PS's limit of {limit} bytes ({limit / 2**20:g} MB); {LIMIT_HINT}",
                code=grpc.StatusCode.RESOURCE_EXHAUSTED,
                shard=shard,
                rpc=rpc,
            )

    def _pieces(self, offsets: np.ndarray, row_bytes: int, every_shard: bool = False):
        """(shard, chunk index, slice) for every non-empty request below the size limit,
        over rows grouped by shard (shard s's rows are ``offsets[s]:offsets[s + 1]``);
        `every_shard`: an empty chunk 0 too for a shard that gets no rows."""
        self._check_size(row_bytes, "one row of a request")  # chunks hold >= 1 row
        step = max(1, self.chunk_bytes // max(row_bytes, 1))
        for s in range(offsets.size - 1):
            lo, hi = int(offsets[s]), int(offsets[s + 1])
            if lo == hi and every_shard:
                yield s, 0, slice(lo, lo)
            for chunk, i in enumerate(range(lo, hi, step)):
                yield s, chunk, slice(i, min(i + step, hi))

    # ------------------------------------------------------------ models
    def create(self, spec: TensorSpec, exist_ok: bool = False) -> None:
        """Register `spec` with the coordinator and create its slice on every shard."""
        self._coord("RegisterModel", spec.global_spec())
        self._fanout(
            "CreateModel",
            [
                (s, pb.CreateModelRequest(spec=spec.shard_spec(s), exist_ok=exist_ok))
                for s in range(spec.num_shards)
            ],
        )

    def lookup(self, name: str) -> TensorSpec:
        return TensorSpec.from_global(self._coord("GetModel", pb.ModelRef(name=name)))

    def drop(self, spec: TensorSpec) -> None:
        """Drop the model from every shard, then free its name at the coordinator (in that
        order: a drop that fails half-way keeps the name, and dropping again finishes it)."""
        self._fanout(
            "DropModel", [(s, pb.ModelRef(name=spec.name)) for s in range(spec.num_shards)]
        )
        self._coord("UnregisterModel", pb.ModelRef(name=spec.name))

    # ------------------------------------------------------------ data plane
    def pull(
        self, spec: TensorSpec, keys: np.ndarray, slot: str = "", *, unique: bool = False
    ) -> np.ndarray:
        """Values of `keys` (see the array contract); absent sparse rows read as 0.

        `unique`: the caller knows its keys are distinct (they came from a pull, a
        partition's dictionary, ``np.unique``), so no deduplication pass is made. Repeated
        keys are still answered right, only sent more than once.
        """
        keys = np.ascontiguousarray(keys, dtype=np.int64).reshape(-1)
        validate_keys(keys, spec.dim, f"pull from {spec.name!r}")
        span = _span(spec, keys)
        if span is not None:  # dense keys that fill most of their range: pull the range
            lo, n = span
            out = self._pull_range(spec, lo, lo + n, slot)
            if n != keys.size or not is_strictly_increasing(keys):  # not the range itself
                out = out[keys - lo]
            return out[:, 0] if spec.cols == 1 else out
        order = inverse = None
        if unique or is_strictly_increasing(keys) or _few_repeats(keys):
            order, offsets = spec.group(keys)
            uniq = keys if order is None else keys[order]
        else:
            uniq, offsets, inverse = spec.dedup(keys)
        out = np.empty((uniq.size, spec.cols), dtype=spec.dtype)
        reqs, places = [], []
        for s, _, pos in self._pieces(offsets, 8 + 8 * spec.cols):
            reqs.append((s, Payload(pb.PullRequest(model=spec.name, slot=slot), keys=uniq[pos])))
            places.append(pos)
        for place, resp in zip(places, self._fanout("Pull", reqs), strict=True):
            out[place] = from_array(resp.values, f"Pull {spec.name!r}").reshape(-1, spec.cols)
        if inverse is not None:
            out = out[inverse]
        elif order is not None:
            back = np.empty_like(out)
            back[order] = out
            out = back
        return out[:, 0] if spec.cols == 1 else out

    def _range_pieces(self, spec: TensorSpec, start: int, stop: int, row_bytes: int):
        """(shard, chunk, slice of [start, stop) counted from `start`) per request of a
        dense range, below the size limit."""
        offsets = np.clip(spec.bounds() - start, 0, stop - start)
        return self._pieces(offsets, row_bytes)

    def _pull_range(self, spec: TensorSpec, start: int, stop: int, slot: str) -> np.ndarray:
        """Values [stop - start, cols] of a dense tensor's global keys [start, stop)."""
        out = np.empty((stop - start, spec.cols), dtype=spec.dtype)
        reqs, places = [], []
        for s, _, pos in self._range_pieces(spec, start, stop, 8 * spec.cols):
            a, b = start + pos.start, start + pos.stop
            req = pb.PullRequest(model=spec.name, by_range=True, start=a, stop=b, slot=slot)
            reqs.append((s, req))
            places.append(pos)
        for place, resp in zip(places, self._fanout("Pull", reqs), strict=True):
            out[place] = from_array(resp.values, f"Pull {spec.name!r}").reshape(-1, spec.cols)
        return out

    def pull_all(self, spec: TensorSpec, slot: str = "") -> tuple[np.ndarray, np.ndarray]:
        """(keys, values) of every row: all of a dense tensor, the touched rows of a sparse one."""
        if spec.kind == "dense":
            v = self._pull_range(spec, 0, spec.dim, slot)
            return np.arange(spec.dim, dtype=np.int64), (v[:, 0] if spec.cols == 1 else v)
        rows = max(1, self.chunk_bytes // (8 + 8 * spec.cols))
        keys, values = [], []
        for s in range(spec.num_shards):
            start = 0
            while True:
                req = pb.PullRequest(
                    model=spec.name, by_range=True, start=start, stop=start + rows, slot=slot
                )
                (r,) = self._fanout("Pull", [(s, req)])
                keys.append(from_array(r.keys, "Pull keys"))
                values.append(from_array(r.values, "Pull values").reshape(-1, spec.cols))
                n = keys[-1].size
                start += n
                if n < rows:
                    break
        k = np.concatenate(keys) if keys else np.zeros(0, np.int64)
        v = np.concatenate(values) if values else np.zeros((0, spec.cols), spec.dtype)
        order = np.argsort(k, kind="stable")
        k, v = k[order], v[order]
        return k, (v[:, 0] if spec.cols == 1 else v)

    def push(
        self,
        spec: TensorSpec,
        keys: np.ndarray,
        values: np.ndarray,
        op: str = "add",
        *,
        round: int | None = None,
        part: int = 0,
        unique: bool = False,
    ) -> None:
        """Push rows (see the array contract). `op`: add | set | step (the model's optimizer).

        With `round`, the push is this `part`'s exactly-once contribution to that round:
        a second attempt replaces the first, and nothing is applied until `reduce`.
        `unique`: the caller knows its keys are distinct, so no combining pass is made (the
        shards still sum repeated keys, so the result is right either way).
        """
        if op not in _OPS:
            raise ValueError(f"push op must be one of {sorted(_OPS)}, got {op!r}")
        keys = np.ascontiguousarray(keys, dtype=np.int64).reshape(-1)
        values = np.asarray(values)
        if values.shape[0] != keys.size or values.size != keys.size * spec.cols:
            raise ValueError(
                f"push to {spec.name!r}: {keys.size} keys but values of shape "
                f"{values.shape} (cols {spec.cols})"
            )
        validate_keys(keys, spec.dim, f"push to {spec.name!r}")
        values = values.reshape(keys.size, spec.cols)
        if spec.nan_policy != "skip":
            _refuse_non_finite(spec, keys, values)
        aggregate = round is not None
        span = None if aggregate else _span(spec, keys)
        if span is not None:  # dense keys that fill most of their range: push the range
            lo, n = span
            if n == keys.size and is_strictly_increasing(keys):  # the keys are the range
                self._push_range(spec, lo, values, op)
                return
            if op == "add" and values.dtype.kind == "f":  # summed into the range's rows
                self._push_range(spec, lo, _sum_rows(keys - lo, values, n), op)
                return
        if op == "set" and not unique and spec.dedup(keys)[0].size != keys.size:
            raise ValueError(f"push op 'set' to {spec.name!r} needs unique keys")
        plain = round is None and op != "set" and _few_repeats(keys)  # the shard sums repeats
        if op == "set" or unique or is_strictly_increasing(keys) or plain:
            order, offsets = spec.group(keys)
            if order is not None:
                keys, values = keys[order], np.take(values, order, axis=0)
        else:
            keys, values, offsets = spec.combine(keys, values)
        values = values.astype(spec.dtype, copy=False)
        row_bytes = 8 + values.itemsize * spec.cols
        reqs = [
            (
                s,
                Payload(
                    pb.PushRequest(
                        model=spec.name,
                        op=_OPS[op],
                        aggregate=aggregate,
                        round=round or 0,
                        part=part,
                        chunk=chunk,
                    ),
                    keys=keys[pos],
                    values=values[pos],
                ),
            )
            for s, chunk, pos in self._pieces(offsets, row_bytes, every_shard=aggregate)
        ]
        if not aggregate:
            self._fanout("Push", reqs)
            return
        # A contribution's chunk 0 replaces every chunk of this part's earlier attempt on its
        # shard (one that split differently, or sent keys where this one sends none: hence
        # a chunk 0 to every shard). So it must be applied before the other chunks.
        self._fanout("Push", [r for r in reqs if r[1].chunk == 0])
        rest = [r for r in reqs if r[1].chunk > 0]
        if rest:
            self._fanout("Push", rest)

    def _push_range(self, spec: TensorSpec, start: int, values: np.ndarray, op: str) -> None:
        """Push `values` [n, cols] to a dense tensor's global keys [start, start + n)."""
        values = values.astype(spec.dtype, copy=False)
        n = values.shape[0]
        reqs = [
            (
                s,
                Payload(
                    pb.PushRequest(
                        model=spec.name, op=_OPS[op], by_range=True, start=start + pos.start
                    ),
                    values=values[pos],
                ),
            )
            for s, _, pos in self._range_pieces(spec, start, start + n, values.itemsize * spec.cols)
        ]
        self._fanout("Push", reqs)

    def reduce(self, spec: TensorSpec, round: int, op: str = "set", how: str = "sum") -> None:
        """Apply the combined contributions of `round`: set (replace the tensor), add or step.

        `how`: "sum" adds the parts' contributions, "max" takes their element-wise max.
        """
        zero = op == "set"
        rop = pb.ADD if zero else _OPS[op]
        self._fanout(
            "Reduce",
            [
                (
                    s,
                    pb.ReduceRequest(
                        model=spec.name, round=round, op=rop, zero_first=zero, how=how
                    ),
                )
                for s in range(spec.num_shards)
            ],
        )

    def vector_op(
        self,
        op: str,
        specs: list[TensorSpec],
        alpha: float = 0.0,
        kernel: str = "",
        **kwargs: float,
    ) -> float:
        """Server-side algebra over co-located dense tensors; only the scalar comes back."""
        n = specs[0].num_shards
        parts = self._fanout(
            "VectorOp",
            [
                (
                    s,
                    pb.VectorOpRequest(
                        op=op,
                        models=[x.name for x in specs],
                        alpha=alpha,
                        kernel=kernel,
                        kwargs={k: float(v) for k, v in kwargs.items()},
                    ),
                )
                for s in range(n)
            ],
        )
        total = float(sum(p.value for p in parts))
        return float(np.sqrt(total)) if op == "nrm2" else total

    def call(
        self,
        function: str,
        specs: list[TensorSpec],
        args: dict | None = None,
        arrays: list[list[np.ndarray]] | None = None,
        *,
        shards: list[int] | None = None,
        direct: bool = False,
    ) -> list[tuple[dict, list[np.ndarray]]]:
        """Run server function `function` on every shard (or on `shards`, in that order);
        arrays[i] go to the i-th of them. `direct`: the function changes no model state
        (it is in its module's READ_ONLY), so it needs no request id: a plain frame on the
        shards' direct lanes. Any other call takes a lane with its request id, replicated
        and answered once as on gRPC (arrays the lane cannot carry raw: gRPC)."""
        if shards is None:
            shards = list(range(specs[0].num_shards if specs else self.num_shards))
        for i, s in enumerate(shards) if arrays else ():  # Call requests are not chunked
            self._check_size(sum(np.asarray(a).nbytes for a in arrays[i]), "Call", s)
        text = json.dumps(args or {})

        def request(i: int, shard: int):
            given = [np.asarray(a) for a in (arrays[i] if arrays else [])]
            req = pb.CallRequest(function=function, models=[x.name for x in specs], args=text)
            raw = 0 < len(given) <= _MAX_RAW_ARRAYS and all(
                a.dtype.name in ALLOWED_DTYPES for a in given
            )
            if direct and raw and self.addresses[shard] not in self._plain_calls:
                return Payload(req, arrays=given)  # raw on a lane; else the shard names it
            if not direct and (raw or not given):  # may write: a typed frame on a lane
                return Payload(req, arrays=given)
            req.arrays.extend(to_array(a) for a in given)
            return req

        resps = self._fanout(
            "Call", [(s, request(i, s)) for i, s in enumerate(shards)], direct=direct
        )
        return [
            (json.loads(r.result or "{}"), [from_array(a, f"{function} result") for a in r.arrays])
            for r in resps
        ]

    def checkpoint(
        self,
        uri: str,
        version: int,
        meta: dict | None = None,
        restarts: int | None = None,
        prefix: str = "",
    ) -> int:
        """Snapshot every shard, then seal the version with a manifest. Returns bytes written.

        Once sealed, older versions beyond the newest `checkpoint_keep` and torn ones older
        than it are deleted (``ps_server.checkpoint.prune``).

        `prefix`: only models whose name starts with it. `meta` goes into the manifest.
        The version is sealed only if no shard restarted
        since the restart count was `restarts` (default: now) — a restarted shard answers
        from an older state, so its file would not match the others'; the version is then
        left torn and never loaded.
        """
        from ps_server.checkpoint import prune, write_manifest

        restarts = self.shard_restarts() if restarts is None else restarts
        resps = self._fanout(
            "Checkpoint",
            [
                (s, pb.CheckpointRequest(uri=uri, version=version, prefix=prefix))
                for s in range(self.num_shards)
            ],
        )
        if self.shard_restarts() != restarts:
            raise PSError(
                f"a shard restarted (restart count {restarts} -> {self.restarts}) while version "
                f"{version} was written to {uri}; it stays unsealed and is never loaded",
                rpc="Checkpoint",
            )
        write_manifest(uri, version, self.num_shards, meta)
        self.count("checkpoint")
        prune(uri, self.checkpoint_keep)
        return sum(r.nbytes for r in resps)

    def restore(self, uri: str, version: int, prefix: str = "") -> None:
        """Load `version` on every shard (only models named `prefix`... when given)."""
        self._fanout(
            "Restore",
            [
                (s, pb.CheckpointRequest(uri=uri, version=version, prefix=prefix))
                for s in range(self.num_shards)
            ],
        )

    def shard_restarts(self) -> int:
        """How many times a shard process started as a primary, now: it moves when a shard
        restarts (from a checkpoint, or empty), not when a backup is promoted."""
        self.refresh()
        return self.restarts

    def models(self) -> list[str]:
        """Names of the models any shard holds, sorted."""
        lists = self._fanout("ListModels", [(s, pb.Empty()) for s in range(self.num_shards)])
        return sorted({m.spec.name for r in lists for m in r.models})

    def health(self) -> list[pb.HealthResponse]:
        return self._fanout("Health", [(s, pb.Empty()) for s in range(self.num_shards)])

    def replica_digests(self) -> list[tuple[pb.DigestResponse, pb.DigestResponse | None]]:
        """(primary, backup) state digests per shard: equal digests = identical replicas."""
        self.refresh()
        primaries = self._fanout("Digest", [(s, pb.Empty()) for s in range(self.num_shards)])
        backups = [
            pb_grpc.ShardStub(self._channel(a)).Digest(pb.Empty(), metadata=self._md, timeout=60)
            if a
            else None
            for a in self.backups
        ]
        return list(zip(primaries, backups, strict=True))

    # ------------------------------------------------------------ control plane
    def barrier(
        self, name: str, worker: str, count: int, timeout: float = DEFAULT_WAIT_SECONDS
    ) -> None:
        self._coord(
            "Barrier",
            pb.BarrierRequest(name=name, worker=worker, count=count, timeout=timeout),
            _grpc_deadline(timeout),
        )

    def clock(
        self,
        group: str,
        worker: str,
        clock: int,
        *,
        staleness: int,
        num_workers: int,
        timeout: float = DEFAULT_WAIT_SECONDS,
    ) -> int:
        """Report `clock`; block until every live worker is within `staleness` of it."""
        return self._coord(
            "Clock",
            pb.ClockRequest(
                group=group,
                worker=worker,
                clock=clock,
                staleness=staleness,
                num_workers=num_workers,
                timeout=timeout,
            ),
            _grpc_deadline(timeout),
        ).min_clock

    def clock_log(self, group: str = "") -> list[pb.ClockEntry]:
        """The coordinator's log of released clock calls of groups starting with `group`."""
        return list(self._coord("GetClockLog", pb.WorkerRef(group=group)).entries)

    def heartbeat(self, group: str, worker: str) -> None:
        self._coord("Heartbeat", pb.WorkerRef(group=group, worker=worker))

    def remove_worker(self, group: str, worker: str) -> None:
        self._coord("RemoveWorker", pb.WorkerRef(group=group, worker=worker))

    def post(self, topic: str, round: int, payload: dict) -> None:
        self._coord("Post", pb.PostRequest(topic=topic, round=round, payload=json.dumps(payload)))

    def wait(
        self, topic: str, min_round: int, timeout: float = DEFAULT_WAIT_SECONDS
    ) -> tuple[int, dict]:
        r = self._coord(
            "Wait",
            pb.WaitRequest(topic=topic, min_round=min_round, timeout=timeout),
            _grpc_deadline(timeout),
        )
        return r.round, json.loads(r.payload or "{}")

    def contribute(self, topic: str, round: int, part: int, values: np.ndarray) -> None:
        self._coord(
            "Contribute",
            pb.ContributeRequest(
                topic=topic,
                round=round,
                part=part,
                values=to_array(np.ascontiguousarray(values, dtype=np.float64).reshape(-1)),
            ),
        )

    def collect(
        self, topic: str, round: int, num_parts: int, timeout: float = DEFAULT_WAIT_SECONDS
    ) -> np.ndarray:
        """Sum (in part order) of the contributions of `num_parts` parts to `round`."""
        r = self._coord(
            "Collect",
            pb.CollectRequest(topic=topic, round=round, num_parts=num_parts, timeout=timeout),
            _grpc_deadline(timeout),
        )
        return from_array(r.sum, "Collect")

    # ------------------------------------------------------------ task queues & metrics
    def add_tasks(self, queue: str, tasks: list[str], lease_seconds: float = 0.0) -> int:
        """Append data shards to `queue` (created on first use); `lease_seconds` 0 keeps it."""
        return self._coord(
            "AddTasks", pb.TaskList(queue=queue, tasks=tasks, lease_seconds=lease_seconds)
        ).value

    def get_task(self, queue: str, worker: str, timeout: float = 10.0) -> pb.TaskLease:
        """Lease the next task (`task_id` -1: none within `timeout`; `drained`: all DONE)."""
        return self._coord(
            "GetTask",
            pb.TaskRequest(queue=queue, worker=worker, timeout=timeout),
            _grpc_deadline(timeout),
        )

    def finish_task(self, queue: str, worker: str, task_id: int) -> bool:
        """Mark a leased task DONE; False if it already was."""
        return bool(
            self._coord(
                "FinishTask", pb.TaskRequest(queue=queue, worker=worker, task_id=task_id)
            ).value
        )

    def count(self, event: str, n: int = 1) -> int:
        """Add to a coordinator counter (see `metrics`)."""
        return self._coord("Count", pb.CountRequest(event=event, n=n)).value

    def report_progress(
        self,
        fit: str,
        name: str,
        done: int,
        total: int,
        unit: str,
        metrics: dict[str, float],
        finished: bool = False,
        timeout: float = 2.0,
    ) -> None:
        """Tell the coordinator how far fit `fit` is (its status page draws the curves);
        one try with a short deadline: a missed report only leaves a gap in a curve."""
        progress = pb.FitProgress(
            fit=fit,
            name=name,
            done=int(done),
            total=int(total),
            unit=unit,
            metrics={k: float(v) for k, v in metrics.items()},
            finished=finished,
        )
        self.coordinator.ReportProgress(progress, metadata=self._md, timeout=timeout)

    def metrics(self) -> dict[str, int]:
        """The coordinator's counters: shard restarts, restores, checkpoints, requeued tasks..."""
        return dict(self._coord("GetMetrics", pb.Empty()).counters)

    def shutdown(self) -> None:
        self._coord("Shutdown", pb.Empty())

    def close(self) -> None:
        for kind in ("links", "spares"):  # this thread's lane connections
            for link in self._links.__dict__.pop(kind, {}).values():
                link.close()
        with self._lock:
            for ch in [*self._channels.values(), *(ch for _, ch in self._retired)]:
                ch.close()
            self._channels.clear()
            self._retired.clear()


def _message(request):
    """The protobuf of a request (a :class:`Payload`'s, its arrays inside), for gRPC."""
    return request.message() if isinstance(request, Payload) else request


def _span(spec: TensorSpec, keys: np.ndarray) -> tuple[int, int] | None:
    """(first key, length) of the range that `keys` of a dense tensor span, when sending the
    range's values costs no more bytes than the keys and their values: then a request
    names its range instead of carrying keys (no dedup, sort or index on either side)."""
    if spec.kind != "dense" or keys.size == 0:
        return None
    lo, hi = int(keys.min()), int(keys.max())
    row = np.dtype(spec.dtype).itemsize * spec.cols
    n = hi - lo + 1
    return (lo, n) if n * row <= keys.size * (8 + row) else None


def _few_repeats(keys: np.ndarray) -> bool:
    """Whether `keys` repeat so little that combining or deduplicating them on the client
    costs more than sending the repeats (a shard sums a push's repeated keys and answers
    each of a pull's). Looks at s = sqrt(20 n) keys spread over the call: none repeats.

    If a fraction f of the n keys are repeats, about (s^2 / 2) * f / n = 10 f sampled pairs
    collide: ~1 at f = 10% at any n. So calls with more repeats than that are combined, and
    one that is not sends at most ~10% more keys. Below 65536 keys combining is cheap: done."""
    n = keys.size
    if n < 65536:
        return False
    size = math.isqrt(20 * n)
    sample = keys[np.linspace(0, n - 1, size).astype(np.int64)]
    return np.unique(sample).size == size


def _sum_rows(rows: np.ndarray, values: np.ndarray, n: int) -> np.ndarray:
    """[n, cols] sums of `values`' rows by `rows` (repeated rows summed, others 0)."""
    out = np.empty((n, values.shape[1]), dtype=np.float64)
    for c in range(values.shape[1]):
        out[:, c] = np.bincount(rows, weights=values[:, c], minlength=n)
    return out


def _grpc_deadline(timeout: float) -> float:
    """The gRPC deadline of a blocking coordinator call that waits up to `timeout` seconds
    (<= 0: the coordinator's limit): a margin later, so the coordinator's own answer
    (which names what it waited for) arrives first."""
    return (timeout if timeout > 0 else MAX_WAIT_SECONDS) + DEADLINE_MARGIN_SECONDS


def _details(e: grpc.RpcError) -> str:
    """The status message, with how to raise the limit when gRPC itself cut a request off."""
    text = e.details() or str(e.code())
    if e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "larger than max" in text:
        text += f" (the PS's request size limit; {LIMIT_HINT})"
    return text


_CLIENTS: dict[tuple[str, str, int], PSClient] = {}
_CLIENTS_LOCK = threading.Lock()


def _refuse_non_finite(spec: TensorSpec, keys: np.ndarray, values: np.ndarray) -> None:
    """Refuse a push holding NaN/inf before anything is sent: each shard refuses its own
    slice, so a NaN in one shard's slice would otherwise leave the others' parts applied."""
    if values.dtype.kind not in "fc":
        return
    bad = ~np.isfinite(values)
    if not bad.any():
        return
    row = int(np.flatnonzero(bad.any(axis=1))[0])
    raise PSError(
        f"model {spec.name!r}: non-finite value {values[row][bad[row]][0]} at row {row} "
        f"(key {int(keys[row])}); nan_policy='refuse' refuses the whole push and nothing "
        "was sent ('skip' drops such rows)",
        code=grpc.StatusCode.INVALID_ARGUMENT,
        rpc="Push",
    )


def _reread(client: PSClient) -> list[str]:
    client.refresh()
    return client.addresses


def get_client(address: str, token: str = "", tls_ca: bytes | None = None) -> PSClient:
    """The cached client of this process for (address, token, CA): one channel set per worker.

    `tls_ca` (PEM bytes) switches the channels to TLS, verifying the servers against it.
    A new client first probes the coordinator and then the shards (`check_reachable`):
    a PS this process cannot reach fails in seconds with `PSUnreachable`, not after the
    retries meant for a restarting server.
    """
    key = (address, token, tls_ca, os.getpid())
    with _CLIENTS_LOCK:
        client = _CLIENTS.get(key)
        if client is None:
            check_reachable([address])
            client = PSClient(address, token, tls_ca=tls_ca)
            try:
                check_reachable(client.addresses, refresh=lambda: _reread(client))
            except BaseException:
                client.close()
                raise
            _CLIENTS[key] = client
        return client
