"""What a backup costs per push: client wall time, and per shard the primary's apply,
the wait for the backup (its apply, plus wire and decoding beyond it), from the
replicas' own counters. Run::

    python -m bench.replication --keys 1000000 --repeat 5
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from bench.common import markdown_table

__all__ = ["main"]


def _phases(client, label: str, fn, repeat: int) -> dict:
    before = client.replica_digests()
    t = time.perf_counter()
    for _ in range(repeat):
        fn()
    wall = (time.perf_counter() - t) / repeat
    after = client.replica_digests()
    per = repeat * len(after)

    def delta(side: int, field: str) -> float:
        return sum(
            getattr(a[side], field) - getattr(b[side], field)
            for a, b in zip(after, before, strict=True)
        )

    primary, wait = delta(0, "apply_seconds") / per, delta(0, "forward_seconds") / per
    backup = delta(1, "apply_seconds") / per
    return {
        "op": label,
        "wall ms": f"{wall * 1e3:.0f}",
        "primary apply ms": f"{primary * 1e3:.0f}",
        "backup apply ms": f"{backup * 1e3:.0f}",
        "extra wait for backup ms": f"{wait * 1e3:.0f}",
    }


def run(keys_n: int, repeat: int, shards: int = 2) -> list[dict]:
    from ps_server.coordinator.service import Service
    from spark_ps.client import PSClient
    from spark_ps.client.spec import TensorSpec

    svc = Service(num_shards=shards, token="bench", replicas=2)
    svc.start()
    client = PSClient(svc.address, "bench")
    try:
        dense = TensorSpec("bench-d", "dense", keys_n, 1, shards)
        sparse = TensorSpec("bench-s", "sparse", 2**40, 1, shards)
        client.create(dense)
        client.create(sparse)
        keys, values = np.arange(keys_n), np.ones(keys_n)
        skeys = np.random.default_rng(0).choice(2**40, keys_n, replace=False)
        client.push(sparse, skeys, values)  # rows exist: steady state below
        return [
            _phases(client, "dense push", lambda: client.push(dense, keys, values), repeat),
            _phases(client, "sparse push", lambda: client.push(sparse, skeys, values), repeat),
        ]
    finally:
        client.close()
        svc.stop()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--keys", type=int, default=1_000_000)
    p.add_argument("--repeat", type=int, default=5)
    args = p.parse_args(argv)
    rows = run(args.keys, args.repeat)
    print(f"Replicated push, {args.keys:,} keys x float64, 2 shards x (primary + backup)")
    print(markdown_table(rows, list(rows[0])))


if __name__ == "__main__":
    main()
