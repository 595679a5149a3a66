"""`spark-ps-server` / `python -m ps_server`: run a coordinator and N shards as a service."""

from __future__ import annotations

import argparse
import logging
import os

from ps_server.wire import DEFAULT_MAX_REQUEST_MB

__all__ = ["main"]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(
        prog="spark-ps-server",
        description="Run the spark-ps parameter server: a coordinator and N shard processes. "
        "Spark jobs connect with --conf spark.ps.address=HOST:PORT and spark.ps.token.",
    )
    p.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to bind (default 127.0.0.1; non-loopback needs a token)",
    )
    p.add_argument("--port", type=int, default=0, help="coordinator port (0 = any free port)")
    p.add_argument(
        "--shards",
        type=int,
        default=os.cpu_count() or 1,
        help="number of shard processes (default: one per core)",
    )
    p.add_argument(
        "--checkpoint-dir",
        default="",
        help="directory (or pyarrow.fs URI) that restarted shards restore from",
    )
    p.add_argument(
        "--max-request-mb",
        type=float,
        default=DEFAULT_MAX_REQUEST_MB,
        help=f"refuse requests larger than this (default {DEFAULT_MAX_REQUEST_MB}); clients "
        "chunk below it",
    )
    p.add_argument(
        "--shard-memory-mb",
        type=float,
        default=0,
        help="memory budget of each shard over all its models (default 0 = none): a push "
        "that would grow past it is refused with RESOURCE_EXHAUSTED",
    )
    p.add_argument(
        "--replicas",
        type=int,
        default=1,
        choices=(1, 2),
        help="processes per shard: 2 adds a backup that applies every update before it is "
        "acknowledged and takes over when the primary dies (default 1: no replication)",
    )
    p.add_argument("--tls-cert", default="", help="PEM certificate: serve TLS (with --tls-key)")
    p.add_argument("--tls-key", default="", help="PEM private key of --tls-cert")
    p.add_argument("--tls-ca", default="", help="PEM CA the shards trust (default: the cert)")
    p.add_argument("--log-level", default="INFO")
    args = p.parse_args(argv)
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(name)s %(message)s")
    token = os.environ.get("SPARK_PS_TOKEN", "")
    from ps_server import tls

    for env, value in (
        (tls.ENV_CERT, args.tls_cert),
        (tls.ENV_KEY, args.tls_key),
        (tls.ENV_CA, args.tls_ca),
    ):
        if value:
            os.environ[env] = os.path.abspath(value)  # inherited by the shard processes
    from ps_server.lifecycle import keep_freed_memory
    from ps_server.service import run

    keep_freed_memory()  # the coordinator relays board posts (a GBT fit's trees) too
    run(
        args.host,
        args.port,
        args.shards,
        token,
        args.checkpoint_dir,
        args.replicas,
        max_request_mb=args.max_request_mb,
        shard_memory_mb=args.shard_memory_mb,
    )


if __name__ == "__main__":
    main()
