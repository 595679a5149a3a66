"""Token auth for both services: every call carries `x-spark-ps-token` metadata."""

from __future__ import annotations

import hmac
import ipaddress
import secrets
import socket

import grpc

from ps_server.wire import TOKEN_KEY

__all__ = [
    "TokenInterceptor",
    "AioTokenInterceptor",
    "new_token",
    "is_loopback",
    "require_token",
    "TOKEN_KEY",
]


def new_token() -> str:
    """A random token for an embedded PS (handed to executors with the address)."""
    return secrets.token_urlsafe(24)


def is_loopback(host: str) -> bool:
    """True when `host` only accepts connections from this machine."""
    if host in ("localhost", ""):
        return host == "localhost"
    try:
        return ipaddress.ip_address(socket.gethostbyname(host)).is_loopback
    except (OSError, ValueError):
        return False


def require_token(host: str, token: str, doing: str, hint: str = "set SPARK_PS_TOKEN") -> None:
    """Refuse (ValueError) to `doing` a non-loopback `host` without a token: anyone who can
    reach the address could read and write every model."""
    if not token and not is_loopback(host):
        raise ValueError(
            f"refusing to {doing} non-loopback address {host!r} without a token ({hint})"
        )


def _refuse(code: grpc.StatusCode, message: str) -> grpc.RpcMethodHandler:
    def handler(request, context):
        context.abort(code, message)

    return grpc.unary_unary_rpc_method_handler(
        handler, request_deserializer=lambda b: b, response_serializer=lambda b: b
    )


def _refuse_async(code: grpc.StatusCode, message: str) -> grpc.RpcMethodHandler:
    async def handler(request, context):
        await context.abort(code, message)

    return grpc.unary_unary_rpc_method_handler(
        handler, request_deserializer=lambda b: b, response_serializer=lambda b: b
    )


def _refusal(token: bytes, details: grpc.HandlerCallDetails) -> str | None:
    """Why a call must be refused (its token is missing or wrong), or None to serve it."""
    if not token:
        return None
    sent = None
    for key, value in details.invocation_metadata or ():
        if key == TOKEN_KEY:
            sent = value.encode() if isinstance(value, str) else value
    if sent is None:
        return f"missing auth token ({TOKEN_KEY} metadata) on {details.method}"
    if not hmac.compare_digest(sent, token):
        return f"bad auth token on {details.method}"
    return None


class TokenInterceptor(grpc.ServerInterceptor):
    """Refuses a call whose token is missing or wrong before any handler runs."""

    def __init__(self, token: str):
        self._token = token.encode()

    def intercept_service(self, continuation, handler_call_details):
        why = _refusal(self._token, handler_call_details)
        if why is not None:
            return _refuse(grpc.StatusCode.UNAUTHENTICATED, why)
        return continuation(handler_call_details)


class AioTokenInterceptor(grpc.aio.ServerInterceptor):
    """`TokenInterceptor` for a ``grpc.aio`` server (the coordinator)."""

    def __init__(self, token: str):
        self._token = token.encode()

    async def intercept_service(self, continuation, handler_call_details):
        why = _refusal(self._token, handler_call_details)
        if why is not None:
            return _refuse_async(grpc.StatusCode.UNAUTHENTICATED, why)
        return await continuation(handler_call_details)
