"""How the coordinator answers with many workers waiting on it: waiters -> Post latency.

Run from the repository root, e.g.::

    python -m bench.waiters --waiters 100,1000,10000

Starts a real ``spark-ps-server`` on loopback (1 shard) and, for each count N, parks N
``Wait`` calls on a board topic from a child process (asyncio gRPC, one connection per
1,000 calls, as many workers would have), waits until the coordinator reports them all
waiting (``GetMetrics().waiting``), then posts the topic from this process with a plain
gRPC client, as a GBT driver does (so the crowd's answers do not delay its timing).
It prints, per N: the Post's latency, GetShardMap's latency with the crowd parked and
while it is being released, whether every waiter got the posted round, how long the
release took, and the coordinator process's RSS with the crowd parked. Every call has
a deadline and the server is stopped at the end: the run ends by itself.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a file: make `bench` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import grpc

from bench.common import REPO_ROOT, load_note, markdown_table
from ps_server.proto import ps_pb2 as pb
from ps_server.proto import ps_pb2_grpc as pb_grpc
from ps_server.wire import TOKEN_KEY

__all__ = ["main"]

COLUMNS = (
    "waiters", "Post ms", "GetShardMap ms (parked)", "GetShardMap ms (releasing)",
    "all released", "release s", "coordinator RSS MiB",
)  # fmt: skip
#: Calls per connection.
PER_CHANNEL = 1000
#: Seconds a waiter waits at most (its gRPC deadline is 10 s more): bounds the run.
WAIT_SECONDS = 60.0


def rss_mib(pid: int) -> float:
    """Resident set size of process `pid` (Linux /proc), in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def crowd(address: str, token: str, topic: str, n: int) -> None:
    """Park `n` Wait calls on `topic`; once they are answered print a JSON line: how many
    got round 1, and the wall time of the last answer."""
    md = ((TOKEN_KEY, token),)
    channels = [
        grpc.aio.insecure_channel(address, options=[("grpc.use_local_subchannel_pool", 1)])
        for _ in range(max(1, -(-n // PER_CHANNEL)))
    ]
    stubs = [pb_grpc.CoordinatorStub(ch) for ch in channels]
    request = pb.WaitRequest(topic=topic, min_round=1, timeout=WAIT_SECONDS)
    last = [0.0]

    async def answered(call) -> bool:
        try:
            got = await call
        except grpc.aio.AioRpcError:
            return False
        last[0] = time.time()
        return got.round == 1

    try:
        await asyncio.gather(*(ch.channel_ready() for ch in channels))
        calls = [
            stubs[i % len(stubs)].Wait(request, metadata=md, timeout=WAIT_SECONDS + 10)
            for i in range(n)
        ]
        ok = sum(await asyncio.gather(*(answered(call) for call in calls)))
        print(json.dumps({"released": ok, "last": last[0]}), flush=True)
    finally:
        for ch in channels:
            await ch.close(grace=None)


def _ms(call, *args, **kw) -> float:
    t = time.perf_counter()
    call(*args, **kw)
    return (time.perf_counter() - t) * 1e3


def all_parked(stub: pb_grpc.CoordinatorStub, md, n: int) -> bool:
    """Whether the coordinator holds `n` waiting calls within WAIT_SECONDS / 2."""
    deadline = time.monotonic() + WAIT_SECONDS / 2
    while stub.GetMetrics(pb.Empty(), metadata=md, timeout=10).waiting < n:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def one_count(ps, n: int) -> dict:
    """Park `n` waiters (a child process), post their topic from here, and measure."""
    topic, md = f"bench-waiters-{n}-{time.monotonic_ns()}", ((TOKEN_KEY, ps.token),)
    cmd = [sys.executable, "-m", "bench.waiters", "--crowd", str(n), "--address", ps.address]
    env = dict(os.environ, SPARK_PS_TOKEN=ps.token, BENCH_WAITERS_TOPIC=topic)
    child = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True, cwd=REPO_ROOT)
    row: dict = {"waiters": n}
    try:
        with grpc.insecure_channel(ps.address) as channel:
            stub = pb_grpc.CoordinatorStub(channel)
            if not all_parked(stub, md, n):
                row["all released"] = "no: the crowd never parked"
                return row
            maps = [_ms(stub.GetShardMap, pb.Empty(), metadata=md, timeout=10) for _ in range(3)]
            row["GetShardMap ms (parked)"] = statistics.median(maps)
            row["coordinator RSS MiB"] = rss_mib(ps.process.pid)
            t0 = time.time()
            post = pb.PostRequest(topic=topic, round=1, payload="{}")
            row["Post ms"] = _ms(stub.Post, post, metadata=md, timeout=10)
            row["GetShardMap ms (releasing)"] = _ms(
                stub.GetShardMap, pb.Empty(), metadata=md, timeout=10
            )
        done = json.loads(child.stdout.readline())
        row["release s"] = max(done["last"] - t0, 0.0)
        ok = done["released"]
        row["all released"] = "yes" if ok == n else f"no ({ok}/{n})"
    except grpc.RpcError as e:
        row["all released"] = f"no: {e.code().name}"
    finally:
        if "release s" not in row:  # it failed: its waiters need not run out their time
            child.kill()
        child.wait(WAIT_SECONDS + 20)
    return row


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--waiters", default="100,1000,10000", help="comma-separated counts")
    parser.add_argument("--crowd", type=int, default=-1, help=argparse.SUPPRESS)
    parser.add_argument("--address", default="", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.crowd >= 0:  # the child that parks the waiters
        token, topic = os.environ["SPARK_PS_TOKEN"], os.environ["BENCH_WAITERS_TOPIC"]
        asyncio.run(crowd(args.address, token, topic, args.crowd))
        return

    from spark_ps import PSContext

    print(load_note())
    ps = PSContext.start(numShards=1)
    try:
        rows = [one_count(ps, int(x)) for x in args.waiters.split(",") if x]
    finally:
        ps.stop()
    print(markdown_table(rows, COLUMNS))


if __name__ == "__main__":
    main()
