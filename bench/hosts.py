"""PS throughput and LR s/iter on 1, 2, 3 hosts whose links are capped: does it scale out?

Each host is a network namespace (``bench/netns.py``) running `spark-ps-server shards
--join`; the coordinator, the client processes and Spark (``local[2]``) run in the root
namespace. Every host's link is capped with ``tc`` (``--rate``, both directions), so the
NIC, not this machine's cores, is the limit, as on a real cluster: aggregate throughput
should then grow with the hosts (issue 19 asks for >= 2.5x from 1 to 3). Several client
processes push and pull one dense vector whose partitions sit on every host, for
``--seconds`` each, ``--repeat`` times (the median counts). The largest host count is
also measured before its links are capped: that is the machine's limit, which the capped
figures must stay well below for the cap to be what is measured. Run::

    python -m bench.hosts --hosts 1,2,3 --rate 200mbit --repeat 3

Needs root (network namespaces and ``tc``).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import re
import statistics
import tempfile
import time
from collections import Counter
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import numpy as np

from bench.common import Timer, load_note, markdown_table
from bench.netns import Hosts, service, unavailable

__all__ = ["main", "rate_mb"]

#: Bytes one key moves on the wire: its float64 value. Pushing or pulling every key of a
#: dense vector travels as ranges (``spark_ps.client.client._span``): no keys are sent.
KEY_BYTES = 8
_UNITS = {"kbit": 1e3 / 8, "mbit": 1e6 / 8, "gbit": 1e9 / 8}


def rate_mb(rate: str) -> float:
    """A tc rate such as ``200mbit`` in MB/s (10^6 bytes)."""
    m = re.fullmatch(r"(\d+(?:\.\d+)?)(kbit|mbit|gbit)", rate.strip().lower())
    if not m:
        raise ValueError(f"--rate must look like 200mbit or 1gbit (kbit|mbit|gbit), got {rate!r}")
    return float(m.group(1)) * _UNITS[m.group(2)] / 1e6


# ------------------------------------------------------------------ client processes
def _client_main(conn, address: str, token: str, spec, seed: int) -> None:
    """A client process: on ``(op, start, seconds)`` it pushes or pulls every key of `spec`
    from `start` (time.monotonic, shared by the processes of one machine) until `seconds`
    have passed, and answers ``(calls, end)``. Its own process, so that the client's
    serialization does not share one interpreter's lock with the others."""
    from spark_ps.client import PSClient

    client = PSClient(address, token, timeout=120, retry_seconds=30)
    keys = np.arange(spec.dim, dtype=np.int64)  # sorted: every partition, no dedup
    values = np.random.default_rng(seed).normal(size=spec.dim)
    ops = {"push": lambda: client.push(spec, keys, values), "pull": lambda: client.pull(spec, keys)}
    try:
        while (msg := conn.recv()) is not None:
            op, start, seconds = msg
            time.sleep(max(0.0, start - time.monotonic()))
            calls = 0
            while calls == 0 or time.monotonic() < start + seconds:
                ops[op]()
                calls += 1
            conn.send((calls, time.monotonic()))
    finally:
        client.close()


class Clients:
    """`n` client processes (spawned: none inherits this process's gRPC state) that run
    the same op at the same moment, so that the figure is what the PS serves to all."""

    def __init__(self, n: int, address: str, token: str, spec) -> None:
        ctx = mp.get_context("spawn")
        self.conns, self.procs = [], []
        for i in range(n):
            ours, theirs = ctx.Pipe()
            p = ctx.Process(target=_client_main, args=(theirs, address, token, spec, i))
            p.daemon = True
            p.start()
            self.conns.append(ours)
            self.procs.append(p)
        self.keys = spec.dim

    def run(self, op: str, seconds: float) -> float:
        """Aggregate keys/s of one round of `op` by every client."""
        start = time.monotonic() + 0.2
        for c in self.conns:
            c.send((op, start, seconds))
        answers = [c.recv() for c in self.conns]
        calls = sum(n for n, _ in answers)
        return calls * self.keys / (max(end for _, end in answers) - start)

    def close(self) -> None:
        """Stop the clients (killed if they do not leave within 10 s)."""
        for c in self.conns:
            try:
                c.send(None)
            except OSError:
                pass
        for p in self.procs:
            p.join(10)
            if p.is_alive():
                p.kill()
                p.join()


def throughput(clients: Clients, seconds: float, repeat: int) -> dict[str, float]:
    """Median push and pull keys/s over `repeat` rounds (each op after a short warm-up)."""
    out = {}
    for op in ("push", "pull"):
        clients.run(op, min(seconds, 0.5))  # connections, first allocations
        out[op] = statistics.median(clients.run(op, seconds) for _ in range(repeat))
    return out


# ------------------------------------------------------------------ LR on the service
def lr_data(spark, rows: int, log2_dim: int, warmup: bool = True):
    """A small cached synthetic CTR set (bench/datagen.py), two partitions (local[2]), and
    one untimed fit on an embedded PS, so that no timed fit pays JIT or worker start-up."""
    from bench.datagen import synthetic_ctr
    from spark_ps import PSContext
    from spark_ps.ml.classification import LogisticRegression

    df = synthetic_ctr(spark, rows, log2_dim, seed=3, partitions=2).cache()
    df.count()
    if not warmup:
        return df
    ps = PSContext.getOrCreate(spark)
    try:
        LogisticRegression(maxIter=2).fit(df)
    finally:
        ps.stop()
    return df


def lr_fit(spark, df, address: str, token: str, max_iter: int) -> tuple[float, float | None]:
    """(fit s / iteration, s / iteration after the set-up) of LogisticRegression on the
    service at `address`, as a job with ``spark.ps.address`` set would run it."""
    from spark_ps import PSContext
    from spark_ps.ml.classification import LogisticRegression

    ps = PSContext.getOrCreate(spark, address=address, token=token)
    try:
        est = LogisticRegression(maxIter=max_iter, regParam=0.01, standardization=False, tol=0.0)
        with Timer() as t:
            model = est.fit(df)
    finally:
        ps.stop()  # an external service: only this process's connection closes
    iters = max(int(model.summary.totalIterations), 1)
    stamps = getattr(model.summary, "iterationTimestamps", None) or []
    after = (stamps[-1] - stamps[0]) / iters if len(stamps) > 1 else None
    return t.elapsed / iters, after


# ------------------------------------------------------------------ one host count
def _placement(client, hosts: Hosts) -> str:
    """Partitions per host, e.g. ``2/2/2``: the model must span every host."""
    on = Counter(a.rsplit(":", 1)[0] for a in client.addresses)
    return "/".join(str(on[hosts.address(i)]) for i in range(len(hosts)))


def _row(n: int, cap: str, rates: dict[str, float], cap_mb: float | None) -> dict[str, Any]:
    """A table row. `link use`: the bytes over the hosts' caps; a push sends the values
    one way, a pull brings them back the other (the requests are a few bytes).
    """
    push_mb, pull_mb = rates["push"] * KEY_BYTES / 1e6, rates["pull"] * KEY_BYTES / 1e6

    def use(mb: float) -> str:
        return "n/a" if cap_mb is None else f"{mb / (n * cap_mb):.0%}"

    return {
        "hosts": n,
        "link cap": cap,
        "push MB/s": push_mb,
        "pull MB/s": pull_mb,
        "push Mkeys/s": rates["push"] / 1e6,
        "pull Mkeys/s": rates["pull"] / 1e6,
        "push link use": use(push_mb),
        "pull link use": use(pull_mb),
    }


def run_hosts(n: int, args: argparse.Namespace, spark, df, uncapped: bool) -> list[dict]:
    """Rows for `n` hosts: uncapped first when asked, then capped (with LR s/iter)."""
    from ps_server.auth import new_token
    from spark_ps.client import PSClient
    from spark_ps.client.spec import TensorSpec

    token, rows = new_token(), []
    with ExitStack() as stack:
        logs = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-hosts-")))
        hosts = stack.enter_context(Hosts(n))
        svc = stack.enter_context(service(hosts, logs, token, shards=args.shards_per_host))
        client = PSClient(svc.address, token, timeout=120, retry_seconds=30)
        stack.callback(client.close)
        spec = TensorSpec("bench-hosts", "dense", args.keys, 1, client.num_shards)
        client.create(spec)
        placement = _placement(client, hosts)
        clients = Clients(args.clients, svc.address, token, spec)
        stack.callback(clients.close)
        if uncapped:
            rates = throughput(clients, args.seconds, args.repeat)
            rows.append({**_row(n, "none", rates, None), "partitions per host": placement})
        for i in range(n):
            hosts.cap(i, rate=args.rate)
        rates = throughput(clients, args.seconds, args.repeat)
        row = {**_row(n, args.rate, rates, rate_mb(args.rate)), "partitions per host": placement}
        client.drop(spec)
        if df is not None:
            row["LR s/iter"], row["LR iter s"] = lr_fit(spark, df, svc.address, token, args.lr_iter)
        rows.append(row)
    return rows


def add_ratios(rows: list[dict]) -> None:
    """`vs 1 host`: capped push and pull throughput over 1 capped host's (n/a without)."""
    capped = [r for r in rows if r["link cap"] != "none"]
    base = next((r for r in capped if r["hosts"] == 1), None)
    for r in capped:
        for op in ("push", "pull"):
            r[f"{op} vs 1 host"] = r[f"{op} MB/s"] / base[f"{op} MB/s"] if base else None


COLUMNS = [
    "hosts",
    "link cap",
    "push MB/s",
    "pull MB/s",
    "push vs 1 host",
    "pull vs 1 host",
    "push Mkeys/s",
    "pull Mkeys/s",
    "push link use",
    "pull link use",
    "LR s/iter",
    "LR iter s",
    "partitions per host",
]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hosts", default="1,2,3", help="host counts, e.g. 1,2,3")
    p.add_argument("--rate", default="200mbit", help="tc cap of every host's link (each way)")
    p.add_argument("--keys", type=int, default=250_000, help="keys per push/pull call")
    p.add_argument("--clients", type=int, default=4, help="client processes (root namespace)")
    p.add_argument("--seconds", type=float, default=3.0, help="length of one measurement")
    p.add_argument("--repeat", type=int, default=3, help="measurements per op (median)")
    p.add_argument("--shards-per-host", type=int, default=1)
    p.add_argument("--no-uncapped", action="store_true", help="skip the uncapped row")
    p.add_argument("--lr-rows", type=int, default=20_000)
    p.add_argument("--lr-log2-dim", type=int, default=18)
    p.add_argument("--lr-iter", type=int, default=10, help="LR maxIter (0: no LR)")
    p.add_argument("--no-warmup", action="store_true", help="skip the untimed LR fit")
    args = p.parse_args(argv)
    args.host_counts = [int(h) for h in args.hosts.split(",")]
    rate_mb(args.rate)  # refuse a bad rate before anything starts
    return args


def main(argv: list[str] | None = None) -> list[dict]:
    """Run every host count and print one markdown table."""
    args = parse_args(argv)
    why = unavailable()
    if why:
        raise SystemExit(f"bench.hosts: {why}")
    print(load_note(), flush=True)
    spark = df = None
    if args.lr_iter > 0:
        from bench.common import bench_session

        with Timer() as t:
            spark = bench_session("2g")
            df = lr_data(spark, args.lr_rows, args.lr_log2_dim, not args.no_warmup)
        print(f"Spark, LR data and warm-up: {t.elapsed:.1f} s", flush=True)
    rows: list[dict] = []
    try:
        for n in args.host_counts:
            uncapped = n == max(args.host_counts) and not args.no_uncapped
            with Timer() as t:
                rows += run_hosts(n, args, spark, df, uncapped)
            print(f"{n} host(s): {t.elapsed:.1f} s", flush=True)
    finally:
        if spark is not None:
            spark.stop()
    add_ratios(rows)
    print(
        f"\nPS across hosts: {args.clients} client processes x {args.keys:,} keys x float64 "
        f"per call ({args.keys * KEY_BYTES / 1e6:.1f} MB), {args.seconds:g} s per measurement, "
        f"median of {args.repeat}; cap {args.rate} = {rate_mb(args.rate):.1f} MB/s per host "
        f"each way; LR: {args.lr_rows:,} rows, 2^{args.lr_log2_dim}, maxIter {args.lr_iter}"
    )
    print(markdown_table(rows, COLUMNS))
    return rows


if __name__ == "__main__":
    main()
