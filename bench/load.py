"""Bounded load test of the PS on loopback: N clients x M mixed pull/push requests.

Reports throughput, p50/p99 latency, errors (must be 0) and the RSS of the shard
processes before and after (must stay flat). It stops by itself::

    python -m bench.load --clients 8 --requests 500 --keys 2000
"""

from __future__ import annotations

import argparse
import threading
import time

import numpy as np
import psutil

from bench.common import markdown_table

__all__ = ["main", "run"]


def _rss_mb(pids: list[int]) -> float:
    return sum(psutil.Process(p).memory_info().rss for p in pids) / 1e6


def run(clients: int, requests: int, keys: int, shards: int) -> dict:
    from spark_ps import PSContext, PSVector
    from spark_ps.client import PSClient

    ps = PSContext.start(numShards=shards)
    try:
        dense = PSVector.dense(1 << 20, context=ps)
        sparse = PSVector.sparse(2**40, context=ps)
        pids = [h.pid for h in ps.client.health()]
        warm = np.random.default_rng(0).integers(0, 2**40, size=50_000)
        sparse.increment(warm, np.ones(warm.size))  # the key set the clients will touch
        rss_before = _rss_mb(pids)
        latencies: list[list[float]] = [[] for _ in range(clients)]
        errors = [0] * clients

        def client(i: int) -> None:
            c = PSClient(ps.address, ps.token)
            rng = np.random.default_rng(i)
            for r in range(requests):
                op = r % 4
                t = time.perf_counter()
                try:
                    if op == 0:
                        c.pull(dense.spec, rng.integers(0, 1 << 20, size=keys))
                    elif op == 1:
                        c.push(
                            dense.spec, rng.integers(0, 1 << 20, size=keys), rng.normal(size=keys)
                        )
                    elif op == 2:
                        c.pull(sparse.spec, rng.choice(warm, size=keys))
                    else:
                        c.push(sparse.spec, rng.choice(warm, size=keys), rng.normal(size=keys))
                except Exception:  # noqa: BLE001 - counted and reported
                    errors[i] += 1
                latencies[i].append(time.perf_counter() - t)
            c.close()

        t0 = time.perf_counter()
        threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.perf_counter() - t0
        lat = np.concatenate([np.asarray(x) for x in latencies]) * 1e3
        return {
            "clients": clients,
            "requests": clients * requests,
            "keys/request": keys,
            "req/s": round(clients * requests / wall),
            "p50 ms": round(np.percentile(lat, 50), 2),
            "p99 ms": round(np.percentile(lat, 99), 2),
            "errors": sum(errors),
            "shard RSS before MB": round(rss_before),
            "after MB": round(_rss_mb(pids)),
        }
    finally:
        ps.stop()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--requests", type=int, default=500)
    p.add_argument("--keys", type=int, default=2000)
    p.add_argument("--shards", type=int, default=2)
    args = p.parse_args(argv)
    row = run(args.clients, args.requests, args.keys, args.shards)
    print(markdown_table([row]))
    if row["errors"]:
        raise SystemExit(f"{row['errors']} requests failed")


if __name__ == "__main__":
    main()
