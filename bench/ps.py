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

from bench.common import load_note, markdown_table
from ps_server.keys import is_strictly_increasing

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


def _stages(spec, op: str, keys: np.ndarray, values: np.ndarray, repeat: int) -> dict:
    """Seconds of each stage of one call, measured apart in this process: the client's
    combine/dedup and routing, serialisation (the direct lane's request built, the answer
    decoded), and the shard's apply (the frame parsed, checks, index and update on a local
    Tensor of the same spec, one shard doing all the keys, the answer encoded). The rest of
    the call's time is the wire."""
    from ps_server.proto import ps_pb2 as pb
    from ps_server.shard.direct import Payload, parse_answer, parse_typed, typed_body, with_arrays
    from ps_server.shard.tensors import Tensor
    from ps_server.wire import from_array
    from spark_ps.client.client import _few_repeats, _span

    span = _span(spec, keys)
    if span is not None:
        return _range_stages(spec, op, keys, values, span, repeat)

    def prepare():  # as the client decides (spark_ps.client.client.PSClient.push / pull)
        plain = is_strictly_increasing(keys) or _few_repeats(keys)
        if op == "push" and not plain:
            return spec.combine(keys, values)
        if op == "pull" and not plain:
            uniq, offsets, _ = spec.dedup(keys)
            return uniq, values[: uniq.size], offsets
        order, offsets = spec.group(keys)
        return (keys, values, offsets) if order is None else (keys[order], values[order], offsets)

    k, v, _ = prepare()
    rows = v.reshape(-1, 1)
    # as the direct lane sends them: the request's fields, then the arrays' raw bytes
    if op == "push":
        request = lambda: Payload(pb.PushRequest(model="m"), keys=k, values=rows)  # noqa: E731
    else:
        request = lambda: Payload(pb.PullRequest(model="m"), keys=k)  # noqa: E731
    answer = bytearray(
        b"".join(bytes(p) for p in with_arrays(Payload(pb.PullResponse(), values=v)))
    )

    def serial():
        body = typed_body(request(), op.capitalize(), "rid")
        if op == "pull":
            from_array(parse_answer(answer, pb.PullResponse).values, "bench")
        return body

    local = spec.shard_spec(0)
    local.num_shards, local.offset, local.length = 1, 0, spec.dim if spec.kind == "dense" else 0
    tensor = Tensor.create(local)
    tensor.push(k, rows, pb.ADD)  # rows exist: the steady state, as on the shards
    frame = bytearray(b"".join(bytes(p) for p in serial()))

    def apply():
        _, req, _ = parse_typed(frame)
        kk = tensor.check_keys(from_array(req.keys, "k"), "bench")
        if op == "push":
            kk, vv = tensor.check_push(kk, from_array(req.values, "v"), "bench")
            tensor.push(kk, vv, pb.ADD)
        else:
            with_arrays(Payload(pb.PullResponse(), values=tensor.pull(kk, "")))

    return {
        "route": _best(prepare, repeat),
        "serialise": _best(serial, repeat),
        "shard": _best(apply, repeat),
    }


def _range_stages(spec, op, keys, values, span, repeat) -> dict:
    """`_stages` of a dense call the client sends as a range (``_span``): the route is
    finding the range and summing the pushed rows into it (or picking the pulled keys out
    of it); requests carry values only; the shard adds or copies a slice."""
    from ps_server.proto import ps_pb2 as pb
    from ps_server.shard.direct import Payload, parse_answer, parse_typed, typed_body, with_arrays
    from ps_server.shard.tensors import Tensor
    from ps_server.wire import from_array
    from spark_ps.client.client import _span, _sum_rows

    lo, n = span
    run = n == keys.size and is_strictly_increasing(keys)
    rows = values.reshape(-1, 1)
    block = rows if run else _sum_rows(keys - lo, rows, n)

    def prepare():
        _span(spec, keys)
        if not run:
            _sum_rows(keys - lo, rows, n) if op == "push" else block[keys - lo]

    push = lambda: Payload(  # noqa: E731
        pb.PushRequest(model="m", by_range=True, start=lo), values=block
    )
    pull = lambda: pb.PullRequest(model="m", by_range=True, start=lo, stop=lo + n)  # noqa: E731
    answer = bytearray(
        b"".join(bytes(p) for p in with_arrays(Payload(pb.PullResponse(), values=block)))
    )

    def serial():
        if op == "push":
            return typed_body(push(), "Push", "rid")
        body = typed_body(pull(), "Pull", "rid")
        from_array(parse_answer(answer, pb.PullResponse).values, "bench")
        return body

    local = spec.shard_spec(0)
    local.num_shards, local.offset, local.length = 1, 0, spec.dim
    tensor = Tensor.create(local)
    frame = bytearray(b"".join(bytes(p) for p in serial()))

    def apply():
        _, req, _ = parse_typed(frame)
        if op == "push":
            tensor.push_range(req.start, from_array(req.values, "v"), pb.ADD, "bench")
        else:
            _, v = tensor.pull_range(req.start, req.stop, "")
            with_arrays(Payload(pb.PullResponse(), values=v))

    return {
        "route": _best(prepare, repeat),
        "serialise": _best(serial, repeat),
        "shard": _best(apply, repeat),
    }


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
        ("dense push (sorted keys)", dense, "push", sorted_keys, {}),
        ("dense pull (sorted keys)", dense, "pull", sorted_keys, {}),
        ("dense push", dense, "push", dkeys, {}),
        ("dense pull", dense, "pull", dkeys, {}),
        ("dense pull all", dense, "all", None, {}),
        ("sparse push", sparse, "push", skeys, {}),
        ("sparse pull", sparse, "pull", skeys, {}),
        ("sparse push, unique=True", sparse, "push", skeys, {"unique": True}),
        ("sparse pull, unique=True", sparse, "pull", skeys, {"unique": True}),
    ]
    rows = []
    for name, vec, op, keys, kw in cases:
        if op == "push":
            fn = lambda v=vec, k=keys, kw=kw: v.increment(k, values, **kw)  # noqa: E731
        elif op == "pull":
            fn = lambda v=vec, k=keys, kw=kw: v.pull(k, **kw)  # noqa: E731
        else:
            fn = dense.pull
        secs = _best(fn, repeat)
        cells = {}
        if op != "all":
            st = _stages(vec.spec, op, keys, values, repeat)
            if kw.get("unique"):
                st["route"] = _best(lambda v=vec, k=keys: v.spec.group(k), repeat)
            st["wire"] = max(0.0, secs - sum(st.values()))
            cells = {k: f"{1e3 * t:.1f}" for k, t in st.items()}
        rows.append(
            [
                name,
                n,
                f"{keys_n / secs / 1e6:.1f}",
                f"{mb / secs:.0f}",
                f"{t_sock / secs:.2f}",
                f"{t_copy / secs:.3f}",
                f"{1e3 * secs:.1f}",
                *(cells.get(k, "-") for k in ("route", "serialise", "shard", "wire")),
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
            f"{1e3 * t_sock:.1f}",
            *"----",
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
            f"{1e3 * t_copy:.1f}",
            *"----",
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
    print(
        "ms columns: the whole call; then its stages measured apart in this process: the "
        "client's combine/dedup + routing, serialisation (encode the requests, decode the "
        "answer), the shard's apply (one local shard doing all keys), and the rest: wire "
        "(the shards' direct lane, threads, waiting). Dense keys that fill most of their "
        f"range travel as the range: values only, no keys. {load_note()}"
    )
    cols = ["op", "shards", "Mkeys/s", "MB/s", "vs loopback socket", "vs numpy copy", "ms"]
    cols += ["route ms", "serialise ms", "shard ms", "wire ms"]
    print(markdown_table([dict(zip(cols, r, strict=True)) for r in rows], cols))


if __name__ == "__main__":
    main()
