"""PS throughput: pull/push of dense and sparse tensors, 1..N shards, against the limit.

The limit is measured in the same run: the same bytes through a loopback TCP socket
(what any server on this machine could get), and a numpy copy of the same array
(memory bandwidth). Ratios are ours / limit. Run::

    python -m bench.ps --keys 1000000 --shards 1,2 --repeat 5
    python -m bench.ps --keys 1000000 --shards 2 --repeat 3 --replicas 2   # cost of a backup
"""

from __future__ import annotations

import argparse
import socket
import threading
import time

import numpy as np

from bench.common import markdown_table

__all__ = ["main"]


def _best(fn, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def loopback_seconds(payload: bytes, repeat: int) -> float:
    """Send `payload` once through a loopback TCP connection (receiver reads it all)."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    n = len(payload)
    done = threading.Event()

    def sink():
        conn, _ = srv.accept()
        buf = bytearray(1 << 22)
        while True:
            got = 0
            while got < n:
                k = conn.recv_into(buf)
                if k == 0:
                    conn.close()
                    return
                got += k
            conn.sendall(b"k")
            done.set()

    t = threading.Thread(target=sink, daemon=True)
    t.start()
    cli = socket.create_connection(srv.getsockname())

    def once():
        cli.sendall(payload)
        cli.recv(1)

    secs = _best(once, repeat)
    cli.close()
    srv.close()
    return secs


def _measure(ps, n, values, rng, mb, t_sock, t_copy, repeat) -> list[list]:
    from spark_ps import PSVector

    keys_n = values.size
    dense = PSVector.dense(keys_n, context=ps)
    sparse = PSVector.sparse(2**40, context=ps)
    dkeys = rng.permutation(keys_n).astype(np.int64)
    sorted_keys = np.arange(keys_n, dtype=np.int64)
    skeys = rng.choice(2**40, size=keys_n, replace=False).astype(np.int64)
    sparse.increment(skeys, values)  # create rows once: steady-state numbers below
    cases = [
        ("dense push (sorted keys)", lambda: dense.increment(sorted_keys, values)),
        ("dense pull (sorted keys)", lambda: dense.pull(sorted_keys)),
        ("dense push", lambda: dense.increment(dkeys, values)),
        ("dense pull", lambda: dense.pull(dkeys)),
        ("dense pull all", lambda: dense.pull()),
        ("sparse push", lambda: sparse.increment(skeys, values)),
        ("sparse pull", lambda: sparse.pull(skeys)),
    ]
    rows = []
    for name, fn in cases:
        secs = _best(fn, repeat)
        rows.append(
            [
                name,
                n,
                f"{keys_n / secs / 1e6:.1f}",
                f"{mb / secs:.0f}",
                f"{t_sock / secs:.2f}",
                f"{t_copy / secs:.3f}",
            ]
        )
    return rows


def run(keys_n: int, shards: list[int], repeat: int, replicas: int = 1) -> list[list]:
    from spark_ps import PSContext

    rows = []
    rng = np.random.default_rng(0)
    values = rng.normal(size=keys_n)
    payload = np.concatenate(
        [np.arange(keys_n, dtype=np.int64).view(np.uint8), values.view(np.uint8)]
    ).tobytes()
    mb = len(payload) / 1e6
    t_sock = loopback_seconds(payload, repeat)
    t_copy = _best(lambda: np.copy(values), repeat)
    for n in shards:
        ps = PSContext.start(numShards=n, replicas=replicas)
        try:
            rows += _measure(ps, n, values, rng, mb, t_sock, t_copy, repeat)
        finally:
            ps.stop()
    rows.append(
        [
            "limit: loopback socket",
            "-",
            f"{keys_n / t_sock / 1e6:.1f}",
            f"{mb / t_sock:.0f}",
            "1.00",
            "-",
        ]
    )
    rows.append(
        [
            "limit: numpy copy",
            "-",
            f"{keys_n / t_copy / 1e6:.1f}",
            f"{values.nbytes / 1e6 / t_copy:.0f}",
            "-",
            "1.000",
        ]
    )
    return rows


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--keys", type=int, default=1_000_000)
    p.add_argument("--shards", default="1,2")
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--replicas", type=int, default=1, help="2: every shard has a backup")
    args = p.parse_args(argv)
    rows = run(args.keys, [int(s) for s in args.shards.split(",")], args.repeat, args.replicas)
    print(
        f"PS throughput, {args.keys:,} keys x float64 per call (keys int64 + values = "
        f"{args.keys * 16 / 1e6:.0f} MB), best of {args.repeat}, replicas {args.replicas}"
    )
    cols = ["op", "shards", "Mkeys/s", "MB/s", "vs loopback socket", "vs numpy copy"]
    print(markdown_table([dict(zip(cols, r, strict=True)) for r in rows], cols))


if __name__ == "__main__":
    main()
