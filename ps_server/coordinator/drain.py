"""`spark-ps-server drain HOST:PORT HOST_ID`: empty a host before it is retired.

The coordinator moves every replica on the host to the others while the PS keeps
serving (``ps_server.coordinator.migrate``), then tells the host's supervisor to stop. This command
waits for that (unless ``--no-wait``) and prints the drain's moves as JSON; it fails,
naming why, when the coordinator refuses (unknown host, or the others cannot hold its
partitions) or a move fails.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import grpc

from ps_server import cli, tls
from ps_server.coordinator.status import move_json
from ps_server.proto import ps_pb2 as pb
from ps_server.proto import ps_pb2_grpc as pb_grpc
from ps_server.wire import TOKEN_KEY

__all__ = ["drain", "main"]


def drain(
    address: str, host: str, token: str = "", wait: bool = True, timeout: float = 600.0
) -> dict:
    """Drain `host` through the coordinator at `address`: {"host", "retired", "moves"}.
    Raises grpc.RpcError when refused, TimeoutError when not drained within `timeout`."""
    md = ((TOKEN_KEY, token),)
    reason = f"drain {host}"
    deadline = time.monotonic() + timeout
    with tls.open_channel(address, tls.env_ca()) as ch:
        stub = pb_grpc.CoordinatorStub(ch)
        smap = stub.Drain(pb.DrainRequest(host=host), metadata=md, timeout=30)
        while True:
            moves = [m for m in smap.moves if m.reason == reason]
            retired = any(h.id == host and h.retired for h in smap.hosts)
            failed = any(m.state == "failed" for m in moves)
            if not wait or retired or failed:
                return {"host": host, "retired": retired, "moves": [move_json(m) for m in moves]}
            if time.monotonic() > deadline:
                left = [m.partition for m in moves if m.state in ("planned", "moving")]
                raise TimeoutError(
                    f"host {host} is not drained after {timeout:g}s; partitions {left} are "
                    f"still moving (`spark-ps-server status {address}`)"
                )
            time.sleep(0.5)
            smap = stub.GetShardMap(pb.Empty(), metadata=md, timeout=30)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(
        prog="spark-ps-server drain",
        description="Move every partition off a host of a PS across hosts while it serves, "
        "then stop the host's `shards --join` supervisor; prints the moves as JSON. The "
        "token comes from SPARK_PS_TOKEN.",
    )
    p.add_argument("address", help="HOST:PORT of the coordinator")
    p.add_argument("host", help="the host's id (its --host-id, else its --host address)")
    p.add_argument("--no-wait", action="store_true", help="return once the moves are planned")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds to wait (default 600)")
    cli.add_common(p, limits=False)
    args = p.parse_args(argv)
    token = cli.apply_common(args)
    try:
        report = drain(args.address, args.host, token, not args.no_wait, args.timeout)
    except grpc.RpcError as e:
        sys.exit(f"spark-ps-server drain: coordinator {args.address}: {e.details()}")
    except TimeoutError as e:
        sys.exit(f"spark-ps-server drain: {e}")
    json.dump(report, sys.stdout, indent=2)
    sys.stdout.write("\n")
    if any(m["state"] == "failed" for m in report["moves"]):
        sys.exit(f"spark-ps-server drain: a move off host {args.host} failed (see its error)")
