"""Token auth for both services: every call carries `x-spark-ps-token` metadata."""

from __future__ import annotations

import hmac
import ipaddress
import secrets
import socket

import grpc

from ps_server.wire import TOKEN_KEY

__all__ = ["TokenInterceptor", "new_token", "is_loopback", "TOKEN_KEY"]


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


def _refuse(code: grpc.StatusCode, message: str) -> grpc.RpcMethodHandler:
    def handler(request, context):
        context.abort(code, message)

    return grpc.unary_unary_rpc_method_handler(
        handler, request_deserializer=lambda b: b, response_serializer=lambda b: b
    )


class TokenInterceptor(grpc.ServerInterceptor):
    """Refuses a call whose token is missing or wrong before any handler runs."""

    def __init__(self, token: str):
        self._token = token.encode()

    def intercept_service(self, continuation, handler_call_details):
        if not self._token:
            return continuation(handler_call_details)
        sent = None
        for key, value in handler_call_details.invocation_metadata or ():
            if key == TOKEN_KEY:
                sent = value.encode() if isinstance(value, str) else value
        if sent is None:
            return _refuse(
                grpc.StatusCode.UNAUTHENTICATED,
                f"missing auth token ({TOKEN_KEY} metadata) on {handler_call_details.method}",
            )
        if not hmac.compare_digest(sent, self._token):
            return _refuse(
                grpc.StatusCode.UNAUTHENTICATED, f"bad auth token on {handler_call_details.method}"
            )
        return continuation(handler_call_details)
