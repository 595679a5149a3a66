"""Scale out and in under load: what a joining host takes, and how long the moves take.

Two hosts (network namespaces, ``bench/netns.py``) with ``--shards`` partitions each hold
one dense float64 vector of ``--keys`` keys while a client in the root namespace keeps
pushing to every partition. A third host joins: the table reports the fraction of the
partitions it took, each move's seconds and a partition's MB, the slowest push during
the moves against the median push before, and the time from the join to the last move's
end. A move's seconds include starting the copy's shard process (about a second of
Python start-up on an idle machine) besides its snapshot and transfer. Then the first two
hosts' fuller one is drained (`spark-ps-server drain`) the same way: with few partitions
the joining host may take all of one host's (rendezvous placement moves the partitions
it ranks first), and draining an empty host moves nothing.
The pushed sums are checked exactly at the end (no update lost). Run::

    python -m bench.scale --keys 32000000 --shards 3

Needs root (network namespaces); ``--rate`` caps every host's link with ``tc``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import ExitStack
from pathlib import Path

import numpy as np

from bench.common import load_note, markdown_table
from bench.netns import Hosts, join, service, unavailable

__all__ = ["main"]

COLUMNS = ["event", "partitions", "moved", "fraction", "MB each", "move s",
           "event s", "push p50 ms", "slowest push ms", "pushes"]  # fmt: skip


class _Pusher:
    """Pushes ones to a random tenth of the keys, timing each call, until stopped."""

    def __init__(self, client, spec) -> None:
        self.client, self.spec = client, spec
        self.sums, self.times = np.zeros(spec.dim), []  # (end, seconds)
        self.error: Exception | None = None
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        rng = np.random.default_rng(0)
        n = max(1, self.spec.dim // 10)
        try:
            while not self._stop.is_set():
                keys = np.sort(rng.choice(self.spec.dim, n, replace=False))
                t = time.monotonic()
                self.client.push(self.spec, keys, np.ones(n))
                self.times.append((time.monotonic(), time.monotonic() - t))
                self.sums[keys] += 1.0
        except Exception as e:  # noqa: BLE001 - reported by stop()
            self.error = e

    def between(self, start: float, end: float) -> list[float]:
        return [s for e, s in list(self.times) if start <= e <= end]

    def stop(self) -> None:
        self._stop.set()
        self.thread.join(120)
        if self.error is not None:
            raise RuntimeError(f"a push failed during the moves: {self.error!r}")


def _moves(address: str, token: str, reason: str, timeout: float = 600.0) -> dict:
    from ps_server.coordinator.status import status

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        st = status(address, token)
        mine = [m for m in st["moves"] if m["reason"] == reason]
        if mine and all(m["state"] in ("done", "failed") for m in mine):
            return st
        time.sleep(0.2)
    raise TimeoutError(f"moves for {reason!r} not done in {timeout:g}s")


def _row(event: str, st: dict, reason: str, mb: float, pusher, t0: float, t1: float) -> dict:
    moves = [m for m in st["moves"] if m["reason"] == reason]
    failed = [m for m in moves if m["state"] != "done"]
    if failed:
        raise RuntimeError(f"{event}: moves failed: {failed}")
    before = pusher.between(0.0, t0)
    during = pusher.between(t0, t1)
    n = len(st["partitions"])
    seconds = [m["seconds"] for m in moves] or [float("nan")]
    return {
        "event": event,
        "partitions": n,
        "moved": len(moves),
        "fraction": f"{len(moves) / n:.2f}",
        "move s": f"{min(seconds):.2f}-{max(seconds):.2f}",
        "MB each": f"{mb:.1f}",
        "event s": f"{t1 - t0:.1f}",
        "push p50 ms": f"{1e3 * statistics.median(before):.0f}" if before else "n/a",
        "slowest push ms": f"{1e3 * max(during):.0f}" if during else "n/a",
        "pushes": len(during),
    }


def run(args: argparse.Namespace) -> list[dict]:
    from ps_server.auth import new_token
    from spark_ps.client import PSClient
    from spark_ps.client.spec import TensorSpec

    token, rows = new_token(), []
    with ExitStack() as stack:
        logs = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-scale-")))
        hosts = stack.enter_context(Hosts(3))
        if args.rate:
            for i in range(3):
                hosts.cap(i, rate=args.rate)
        svc = stack.enter_context(
            service(hosts, logs, token, shards=args.shards, joined=2, ready_timeout=120)
        )
        client = PSClient(svc.address, token, timeout=120, retry_seconds=60)
        stack.callback(client.close)
        spec = TensorSpec("bench-scale", "dense", args.keys, 1, client.num_shards)
        client.create(spec)
        mb = args.keys * 8 / client.num_shards / 1e6  # one partition's weights
        pusher = _Pusher(client, spec)
        time.sleep(args.warmup)

        t0 = time.monotonic()
        join(svc, 2, token, shards=args.shards)
        reason = f"join {hosts.address(2)}"
        st = _moves(svc.address, token, reason)
        rows.append(_row("3rd host joins", st, reason, mb, pusher, t0, time.monotonic()))

        held = {h["id"]: len(h["primaries"]) + len(h["backups"]) for h in st["hosts"]}
        gone = max((hosts.address(0), hosts.address(1)), key=lambda h: held.get(h, 0))
        t0 = time.monotonic()
        cmd = [sys.executable, "-m", "ps_server", "drain", svc.address, gone]
        done = subprocess.run(
            cmd, capture_output=True, text=True, env=dict(os.environ, SPARK_PS_TOKEN=token)
        )
        if done.returncode:
            raise RuntimeError(f"drain failed: {done.stderr[-2000:]}")
        t1 = time.monotonic()
        from ps_server.coordinator.status import status

        st = status(svc.address, token)
        rows.append(_row("old host drained", st, f"drain {gone}", mb, pusher, t0, t1))
        time.sleep(1.0)
        pusher.stop()
        got = client.pull(spec, np.arange(args.keys))
        if not np.array_equal(got, pusher.sums):
            raise RuntimeError("updates were lost: the pulled sums differ from those pushed")
    return rows


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--keys", type=int, default=4_000_000, help="dense float64 keys")
    p.add_argument("--shards", type=int, default=3, help="partitions per host")
    p.add_argument("--rate", default="", help="tc cap of every host's link, e.g. 1gbit")
    p.add_argument("--warmup", type=float, default=3.0, help="seconds of pushes before")
    args = p.parse_args(argv)
    if args.shards < 2:  # 2 partitions over 3 hosts: the joining host's fair share is none
        p.error("--shards must be at least 2, so that a joining third host takes partitions")
    why = unavailable()
    if why:
        raise SystemExit(f"bench.scale: {why}")
    print(load_note(), flush=True)
    rows = run(args)
    mb = args.keys * 8 / (2 * args.shards) / 1e6
    print(
        f"\n{args.keys:,} float64 keys on 2 x {args.shards} partitions ({mb:.1f} MB each), "
        f"one client pushing ones to a tenth of them per call; link cap "
        f"{args.rate or 'none'}; every pushed update was there at the end"
    )
    print(markdown_table(rows, COLUMNS))
    return rows


if __name__ == "__main__":
    main()
