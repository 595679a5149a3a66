"""`spark-ps-server` / `python -m ps_server`: run the PS as a service.

With no command, a coordinator and N shards on this host (``--shards N``). Across hosts:
``coordinator`` on one machine, ``shards --join HOST:PORT`` on each of the others, and
``status HOST:PORT`` prints the shard map as JSON, and ``drain HOST:PORT HOST_ID`` moves
every partition off a host before it is retired.
"""

from __future__ import annotations

import argparse
import os

from ps_server import cli

__all__ = ["main", "COMMANDS"]

#: Subcommands: name -> module whose main(argv) runs it.
COMMANDS = {
    "coordinator": "ps_server.coordinator.host_service",
    "shards": "ps_server.host.supervisor",
    "status": "ps_server.coordinator.status",
    "drain": "ps_server.coordinator.drain",
}


def main(argv: list[str] | None = None) -> None:
    import sys

    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in COMMANDS:
        import importlib

        importlib.import_module(COMMANDS[argv[0]]).main(argv[1:])
        return
    single_host(argv)


def single_host(argv: list[str]) -> None:
    """The coordinator and N shard processes, all on this host."""
    p = argparse.ArgumentParser(
        prog="spark-ps-server",
        description="Run the spark-ps parameter server: a coordinator and N shard processes. "
        "Spark jobs connect with --conf spark.ps.address=HOST:PORT and spark.ps.token. "
        "Across hosts: `spark-ps-server coordinator ...` on one machine and "
        "`spark-ps-server shards --join HOST:PORT ...` on the others "
        "(`spark-ps-server coordinator --help`).",
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
    cli.add_common(p)
    cli.add_ui_port(p)
    args = p.parse_args(argv)
    token = cli.apply_common(args)
    from ps_server.coordinator.service import run
    from ps_server.lifecycle import keep_freed_memory

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
        ui_port=args.ui_port,
    )


if __name__ == "__main__":
    main()
