"""numpy arrays <-> wire `Array` messages, and the errors a request can carry.

Everything a request sends is checked here before any state is touched, so a
bad request is refused with a message naming what was wrong and changes nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import grpc
import numpy as np

from ps_server.proto import ps_pb2 as pb

__all__ = ["RequestError", "guard", "to_array", "from_array", "ALLOWED_DTYPES", "TOKEN_KEY"]

#: The metadata key that carries the auth token on every call.
TOKEN_KEY = "x-spark-ps-token"

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
    if len(msg.data) % dtype.itemsize:
        raise RequestError(
            "INVALID_ARGUMENT",
            f"{what}: payload of {len(msg.data)} bytes is not a multiple of the "
            f"{dtype.itemsize}-byte {msg.dtype} element (truncated payload?)",
        )
    shape = tuple(int(s) for s in msg.shape)
    if any(s < 0 for s in shape):
        raise RequestError("INVALID_ARGUMENT", f"{what}: negative dimension in shape {shape}")
    n = len(msg.data) // dtype.itemsize
    if int(np.prod(shape, dtype=np.int64)) != n:
        raise RequestError(
            "INVALID_ARGUMENT",
            f"{what}: shape {shape} needs {int(np.prod(shape))} elements but the payload "
            f"holds {n} (truncated payload?)",
        )
    if ndim is not None and len(shape) not in ndim:
        raise RequestError("INVALID_ARGUMENT", f"{what}: expected {ndim} dims, got shape {shape}")
    return np.frombuffer(msg.data, dtype=dtype).reshape(shape)


def guard(where: Callable[[object], str]) -> Callable[[Callable], Callable]:
    """Decorate a servicer method: RequestError -> its status; anything else -> INTERNAL.

    A server must survive every request; `where(self)` names the server in messages.
    """

    def decorate(method: Callable) -> Callable:
        def wrapper(self, request, context):
            try:
                return method(self, request, context)
            except RequestError as e:
                context.abort(getattr(grpc.StatusCode, e.code), str(e))
            except MemoryError:
                context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, f"{where(self)}: out of memory")
            except Exception as e:  # noqa: BLE001
                logging.getLogger("ps_server").exception(
                    "%s: %s failed", where(self), method.__name__
                )
                context.abort(grpc.StatusCode.INTERNAL, f"{where(self)}: {type(e).__name__}: {e}")

        wrapper.__name__ = method.__name__
        return wrapper

    return decorate
