"""TLS for both services: server credentials from a cert/key, channels that trust a CA.

Without a cert the PS speaks plaintext gRPC (loopback default); with one, every server
(coordinator and shards) listens with TLS and every client channel verifies the server
against the given CA (for a self-signed cert, the cert itself).
"""

from __future__ import annotations

import os
from pathlib import Path

import grpc

__all__ = [
    "CHANNEL_OPTIONS",
    "server_credentials",
    "open_channel",
    "read_pem",
    "bind",
    "configured",
    "env_ca",
]

#: Where the service and its shards find TLS files (paths), set by spark-ps-server/PSContext.
ENV_CERT, ENV_KEY, ENV_CA = "SPARK_PS_TLS_CERT", "SPARK_PS_TLS_KEY", "SPARK_PS_TLS_CA"


def read_pem(path: str) -> bytes | None:
    """The bytes of a PEM file, or None for an empty path; a clear error if unreadable."""
    if not path:
        return None
    try:
        return Path(path).read_bytes()
    except OSError as e:
        raise ValueError(f"cannot read TLS file {path!r}: {e}") from None


def server_credentials(cert: str, key: str) -> grpc.ServerCredentials | None:
    """TLS credentials for a server, or None when no cert is configured."""
    if not cert and not key:
        return None
    if not (cert and key):
        raise ValueError("TLS needs both a certificate and a private key (got only one)")
    return grpc.ssl_server_credentials([(read_pem(key), read_pem(cert))])


def env_ca() -> bytes | None:
    """The CA a PS process trusts: $SPARK_PS_TLS_CA, else its own cert (self-signed)."""
    return read_pem(os.environ.get(ENV_CA) or os.environ.get(ENV_CERT, ""))


def configured() -> bool:
    """Whether this process's servers listen with TLS ($SPARK_PS_TLS_CERT/KEY set)."""
    return bool(os.environ.get(ENV_CERT) or os.environ.get(ENV_KEY))


def bind(server: grpc.Server, address: str) -> int:
    """Bind `address`, with TLS when $SPARK_PS_TLS_CERT/KEY are set; returns the port."""
    creds = server_credentials(os.environ.get(ENV_CERT, ""), os.environ.get(ENV_KEY, ""))
    if creds is None:
        return server.add_insecure_port(address)
    return server.add_secure_port(address, creds)


#: Options every PS channel gets. Shards restart on fresh ephemeral ports, so a port a dead
#: shard held is soon reused by a live one in the same cluster. gRPC shares connections
#: ("subchannels") between all channels of a process with the same target, and a connection
#: that kept failing backs off exponentially up to 120 s: a new channel to the reused port
#: then failed fast with the *dead* process's "Connection refused" for up to two minutes
#: (seen as a flake in test_replication). Hence a pool per channel, and a reconnect back-off
#: capped at one second, which is cheap against a handful of PS addresses.
CHANNEL_OPTIONS = [
    ("grpc.use_local_subchannel_pool", 1),
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
]


def open_channel(address: str, ca: bytes | None, options=None) -> grpc.Channel:
    """A channel to `address`: TLS verified against `ca` when given, else plaintext.

    `options` are added to (and override) :data:`CHANNEL_OPTIONS`.
    """
    given = dict(options or ())
    options = [(k, v) for k, v in CHANNEL_OPTIONS if k not in given] + list(given.items())
    if ca:
        return grpc.secure_channel(
            address, grpc.ssl_channel_credentials(root_certificates=ca), options=options
        )
    return grpc.insecure_channel(address, options=options)
