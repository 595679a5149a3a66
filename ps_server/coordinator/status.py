"""`spark-ps-server status HOST:PORT`: the shard map as JSON.

Hosts (alive, heartbeat age, draining or retired, what they hold), partitions (primary and
backup with their hosts, or why a partition is lost), models (rows and bytes per partition
and in total), the recovery counters and the partition moves (planned, moving, done or
failed, with their time), read from the coordinator and each partition's primary.
"""

from __future__ import annotations

import argparse
import json
import sys

import grpc

from ps_server import cli, tls
from ps_server.proto import ps_pb2 as pb
from ps_server.proto import ps_pb2_grpc as pb_grpc
from ps_server.wire import TOKEN_KEY

__all__ = ["status", "main"]


def status(address: str, token: str = "", timeout: float = 10.0) -> dict:
    """The service's shard map, hosts, partitions and models as plain data."""
    md = ((TOKEN_KEY, token),)
    ca = tls.env_ca()
    with tls.open_channel(address, ca) as ch:
        stub = pb_grpc.CoordinatorStub(ch)
        smap = stub.GetShardMap(pb.Empty(), metadata=md, timeout=timeout)
        counters = dict(stub.GetMetrics(pb.Empty(), metadata=md, timeout=timeout).counters)
    partitions = []
    models: dict[str, dict] = {}
    for i, primary in enumerate(smap.addresses):
        part = _partition(smap, i)
        if primary and not part["lost"]:
            part.update(_shard_models(primary, ca, md, timeout))
        for name, m in part.get("models", {}).items():
            total = models.setdefault(name, {**m["spec"], "rows": 0, "bytes": 0})
            total["rows"] += m["rows"]
            total["bytes"] += m["bytes"]
        partitions.append(part)
    for part in partitions:
        for m in part.get("models", {}).values():
            del m["spec"]
    hosts = [_host(h, smap) for h in smap.hosts]
    return {
        "coordinator": address,
        "epoch": smap.epoch,
        "restarts": smap.restarts,
        "hosts": hosts,
        "partitions": partitions,
        "models": models,
        "bytes": sum(p.get("bytes", 0) for p in partitions),
        "counters": counters,  # promotions, restarts, lost partitions, moves, ...
        "moves": [move_json(m) for m in smap.moves],
    }


def move_json(m: pb.Move) -> dict:
    return {
        "partition": m.partition,
        "role": m.role,
        "from": m.from_host,
        "to": m.to_host,
        "reason": m.reason,
        "state": m.state,
        "seconds": round(m.seconds, 3),
        "error": m.error,
    }


def _partition(smap: pb.ShardMap, i: int) -> dict:
    def at(field) -> str:
        return field[i] if i < len(field) else ""

    return {
        "index": i,
        "address": smap.addresses[i],
        "host": at(smap.primary_hosts),
        "backup": at(smap.backups),
        "backup_host": at(smap.backup_hosts),
        "lost": at(smap.lost),
    }


def _host(h: pb.HostInfo, smap: pb.ShardMap) -> dict:
    return {
        "id": h.id,
        "address": h.address,
        "alive": h.alive,
        "seconds_since_heartbeat": round(h.seconds_since_heartbeat, 3),
        "shards": h.shards,
        "memory_mb": h.memory_mb,
        "draining": h.draining,
        "retired": h.retired,
        "primaries": [i for i, x in enumerate(smap.primary_hosts) if x == h.id],
        "backups": [i for i, x in enumerate(smap.backup_hosts) if x == h.id],
    }


def _shard_models(address: str, ca: bytes | None, md, timeout: float) -> dict:
    """Models on one primary, or the error that kept us from asking it."""
    try:
        with tls.open_channel(address, ca) as ch:
            listed = pb_grpc.ShardStub(ch).ListModels(pb.Empty(), metadata=md, timeout=timeout)
    except grpc.RpcError as e:
        return {"error": f"{e.code().name}: {e.details()}"}
    out = {}
    for m in listed.models:
        spec = {"kind": m.spec.kind, "dim": m.spec.dim, "cols": m.spec.cols}
        out[m.spec.name] = {"rows": m.num_rows, "bytes": m.nbytes, "spec": spec}
    return {"models": out, "bytes": sum(m["bytes"] for m in out.values())}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(
        prog="spark-ps-server status",
        description="Print the PS's shard map (hosts, partitions, models, bytes) as JSON; the "
        "token comes from SPARK_PS_TOKEN.",
    )
    p.add_argument("address", help="HOST:PORT of the coordinator")
    p.add_argument("--timeout", type=float, default=10.0, help="seconds per call")
    cli.add_common(p, limits=False)
    args = p.parse_args(argv)
    token = cli.apply_common(args)
    try:
        report = status(args.address, token, args.timeout)
    except grpc.RpcError as e:
        sys.exit(
            f"spark-ps-server status: coordinator {args.address}: {e.code().name}: {e.details()}"
        )
    json.dump(report, sys.stdout, indent=2)
    sys.stdout.write("\n")
