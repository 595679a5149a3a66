"""The options every `spark-ps-server` command shares: request limit, TLS, logging.

The token never travels in argv (``ps`` shows argv to every user of a machine): it is
read from ``SPARK_PS_TOKEN`` and handed to shard processes in their environment.
"""

from __future__ import annotations

import argparse
import logging
import os

from ps_server.wire import DEFAULT_MAX_REQUEST_MB

__all__ = ["add_common", "add_ui_port", "apply_common", "TOKEN_ENV"]

TOKEN_ENV = "SPARK_PS_TOKEN"


def add_common(p: argparse.ArgumentParser, limits: bool = True) -> None:
    """Add --max-request-mb (with `limits`), --tls-* and --log-level to `p`."""
    if limits:
        p.add_argument(
            "--max-request-mb",
            type=float,
            default=DEFAULT_MAX_REQUEST_MB,
            help=f"refuse requests larger than this (default {DEFAULT_MAX_REQUEST_MB}); "
            "clients chunk below it",
        )
    p.add_argument("--tls-cert", default="", help="PEM certificate: serve TLS (with --tls-key)")
    p.add_argument("--tls-key", default="", help="PEM private key of --tls-cert")
    p.add_argument("--tls-ca", default="", help="PEM CA the shards trust (default: the cert)")
    p.add_argument("--log-level", default="INFO")


def add_ui_port(p: argparse.ArgumentParser) -> None:
    """Add --ui-port: the coordinator's status page (``ps_server.coordinator.ui``)."""
    p.add_argument(
        "--ui-port",
        type=int,
        default=None,
        help="serve the status page (HTML at /, /status.json, Prometheus /metrics) on this "
        "port of --host (0 = any free port; default: no page); it asks for the token too",
    )


def apply_common(args: argparse.Namespace) -> str:
    """Set up logging and the TLS environment (inherited by shard processes); returns the
    token from SPARK_PS_TOKEN."""
    from ps_server import tls

    logging.basicConfig(level=args.log_level, format="%(asctime)s %(name)s %(message)s")
    for env, value in (
        (tls.ENV_CERT, args.tls_cert),
        (tls.ENV_KEY, args.tls_key),
        (tls.ENV_CA, args.tls_ca),
    ):
        if value:
            os.environ[env] = os.path.abspath(value)
    return os.environ.get(TOKEN_ENV, "")
