"""numpy arrays <-> wire `Array` messages, and the errors a request can carry.

Everything a request sends is checked here before any state is touched, so a
bad request is refused with a message naming what was wrong and changes nothing.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable

import grpc
import numpy as np

from ps_server.proto import ps_pb2 as pb

__all__ = [
    "RequestError",
    "guard",
    "to_array",
    "from_array",
    "check_request_size",
    "server_options",
    "RequestLimitInterceptor",
    "AioRequestLimitInterceptor",
    "ALLOWED_DTYPES",
    "TOKEN_KEY",
    "DEFAULT_MAX_REQUEST_MB",
    "LIMIT_HINT",
]

#: The metadata key that carries the auth token on every call.
TOKEN_KEY = "x-spark-ps-token"

#: Largest request a server accepts unless configured otherwise.
DEFAULT_MAX_REQUEST_MB = 256
#: How to raise the request limit (named in every refusal).
LIMIT_HINT = (
    "raise it with spark-ps-server --max-request-mb (spark.ps.maxRequestMB for the embedded PS) "
    "or send smaller requests (spark.ps.maxMessageMB)"
)

#: dtypes that may travel on the wire; anything else is refused.
ALLOWED_DTYPES = ("int64", "int32", "float64", "float32", "uint8", "int8")


class RequestError(Exception):
    """A request that cannot be served; `code` is the gRPC status name to answer with."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code


def to_array(a: np.ndarray) -> pb.Array:
    """Wrap a numpy array as raw little-endian bytes (no per-element encoding)."""
    a = np.asarray(a)
    if a.dtype.byteorder == ">":
        a = a.astype(a.dtype.newbyteorder("<"))
    return pb.Array(data=np.ascontiguousarray(a).tobytes(), dtype=a.dtype.name, shape=a.shape)


def from_array(msg: pb.Array, what: str, *, ndim: tuple[int, ...] | None = None) -> np.ndarray:
    """Decode an `Array`, refusing unknown dtypes, truncated buffers and bad shapes.

    `what` names the field in error messages ("keys of Push to model 'w'").
    """
    if msg.dtype not in ALLOWED_DTYPES:
        raise RequestError(
            "INVALID_ARGUMENT",
            f"{what}: dtype {msg.dtype!r} is not allowed (allowed: {', '.join(ALLOWED_DTYPES)})",
        )
    dtype = np.dtype(msg.dtype).newbyteorder("<")
    data = msg.data  # each read of a bytes field copies it: read it once
    if len(data) % dtype.itemsize:
        raise RequestError(
            "INVALID_ARGUMENT",
            f"{what}: payload of {len(data)} bytes is not a multiple of the "
            f"{dtype.itemsize}-byte {msg.dtype} element (truncated payload?)",
        )
    shape = tuple(int(s) for s in msg.shape)
    if any(s < 0 for s in shape):
        raise RequestError("INVALID_ARGUMENT", f"{what}: negative dimension in shape {shape}")
    n = len(data) // dtype.itemsize
    if int(np.prod(shape, dtype=np.int64)) != n:
        raise RequestError(
            "INVALID_ARGUMENT",
            f"{what}: shape {shape} needs {int(np.prod(shape))} elements but the payload "
            f"holds {n} (truncated payload?)",
        )
    if ndim is not None and len(shape) not in ndim:
        raise RequestError("INVALID_ARGUMENT", f"{what}: expected {ndim} dims, got shape {shape}")
    return np.frombuffer(data, dtype=dtype).reshape(shape)


#: What a primary's forward adds around a client request it accepted (method name, request
#: id, field tags): its backup allows that much over the limit on Replicate(Batch).
FORWARD_ENVELOPE_BYTES = 4096


def check_request_size(nbytes: int, limit: int, what: str) -> None:
    """Refuse a request of `nbytes` above `limit` (0 = no limit) with RESOURCE_EXHAUSTED."""
    if limit > 0 and nbytes > limit:
        raise RequestError(
            "RESOURCE_EXHAUSTED",
            f"{what}: request of {nbytes} bytes ({nbytes / 2**20:.1f} MB) exceeds the limit of "
            f"{limit} bytes ({limit / 2**20:g} MB); {LIMIT_HINT}",
        )


def server_options(max_request_bytes: int) -> list[tuple[str, int]]:
    """gRPC server options for a request limit.

    gRPC's own receive limit is set to twice ours (plus 1 MB), so that a request a little
    over the limit reaches `RequestLimitInterceptor`, which refuses it with a message naming
    the limit and how to raise it, while a huge one is still cut off (with gRPC's own
    "larger than max" status) before it is read into memory.
    """
    hard = 2 * max_request_bytes + (1 << 20) if max_request_bytes > 0 else -1
    return [
        ("grpc.max_receive_message_length", min(hard, 2**31 - 1)),
        ("grpc.max_send_message_length", -1),
    ]


def guard(where: Callable[[object], str]) -> Callable[[Callable], Callable]:
    """Decorate a servicer method: RequestError -> its status; anything else -> INTERNAL.

    A server must survive every request; `where(self)` names the server in messages.
    Coroutine methods (the coordinator's, on a ``grpc.aio`` server) get a coroutine
    wrapper that awaits ``context.abort``.
    """

    def decorate(method: Callable) -> Callable:
        if inspect.iscoroutinefunction(method):
            return _guard_async(method, where)

        def wrapper(self, request, context):
            try:
                return method(self, request, context)
            except Exception as e:  # noqa: BLE001
                context.abort(*_status(e, where(self), method.__name__))

        wrapper.__name__ = method.__name__
        return wrapper

    return decorate


def _guard_async(method: Callable, where: Callable[[object], str]) -> Callable:
    async def wrapper(self, request, context):
        try:
            return await method(self, request, context)
        except Exception as e:  # noqa: BLE001
            await context.abort(*_status(e, where(self), method.__name__))

    wrapper.__name__ = method.__name__
    return wrapper


def _status(e: Exception, where: str, rpc: str) -> tuple[grpc.StatusCode, str]:
    """The status a failed handler answers with (unexpected errors are logged)."""
    if isinstance(e, RequestError):
        return getattr(grpc.StatusCode, e.code), str(e)
    if isinstance(e, MemoryError):
        return grpc.StatusCode.RESOURCE_EXHAUSTED, f"{where}: out of memory"
    logging.getLogger("ps_server").exception("%s: %s failed", where, rpc)
    return grpc.StatusCode.INTERNAL, f"{where}: {type(e).__name__}: {e}"


class _Oversized:
    """Stands in for a request whose raw bytes were over the limit (never parsed)."""

    def __init__(self, nbytes: int):
        self.nbytes = nbytes


class RequestLimitInterceptor(grpc.ServerInterceptor):
    """Refuses a request whose serialized size is over `limit` bytes, before parsing it.

    The size is the length of the raw bytes gRPC hands to the deserializer, so the check
    is O(1) (reading a protobuf's size after parsing would copy its payloads).
    """

    def __init__(self, limit: int, where: str):
        self.limit, self.where = int(limit), where

    def intercept_service(self, continuation, handler_call_details):
        return self._wrap(continuation(handler_call_details), handler_call_details)

    def _refusal(self, request, what: str) -> str | None:
        """The refusal for a request that was over the limit, else None."""
        if not isinstance(request, _Oversized):
            return None
        try:
            check_request_size(request.nbytes, self.limit, what)
        except RequestError as e:
            return str(e)
        return None

    def _wrap(self, handler, handler_call_details):
        if self.limit <= 0 or handler is None or handler.unary_unary is None:
            return handler
        parse, serve, limit = handler.request_deserializer, handler.unary_unary, self.limit
        if handler_call_details.method.endswith(("/Replicate", "/ReplicateBatch")):
            limit += FORWARD_ENVELOPE_BYTES  # requests the primary accepted, wrapped
        what = f"{self.where}: {handler_call_details.method.rsplit('/', 1)[-1]}"

        def deserialize(raw: bytes):
            return _Oversized(len(raw)) if len(raw) > limit else parse(raw)

        if inspect.iscoroutinefunction(serve):

            async def behavior(request, context):
                why = self._refusal(request, what)
                if why is not None:
                    await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, why)
                return await serve(request, context)

        else:

            def behavior(request, context):
                why = self._refusal(request, what)
                if why is not None:
                    context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, why)
                return serve(request, context)

        return grpc.unary_unary_rpc_method_handler(
            behavior,
            request_deserializer=deserialize,
            response_serializer=handler.response_serializer,
        )


class AioRequestLimitInterceptor(grpc.aio.ServerInterceptor):
    """`RequestLimitInterceptor` for a ``grpc.aio`` server (the coordinator)."""

    def __init__(self, limit: int, where: str):
        self._sync = RequestLimitInterceptor(limit, where)

    async def intercept_service(self, continuation, handler_call_details):
        handler = await continuation(handler_call_details)
        return self._sync._wrap(handler, handler_call_details)
