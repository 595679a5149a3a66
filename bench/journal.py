"""What the coordinator's journal costs its calls: the same calls, journaled or not.

Run from the repository root::

    python -m bench.journal --calls 2000 --repeats 3

For each repeat, two coordinators across hosts are served on loopback in this process
(no hosts join: the calls measured need none), one without and one with a journal in a
temporary checkpoint directory (``ps_server.coordinator.journal``). A client times, per
call, a round board ``Post`` plus a ``Contribute`` of 8 floats (what every round of a fit
sends; journaled with a plain write) and ``RegisterModel`` (journaled with an fsync, as
launches, registrations and the shard map are). Prints one markdown row per repeat and the ratios.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a file: make `bench` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import grpc
import numpy as np

from ps_server.coordinator.host_service import HostService
from ps_server.proto import ps_pb2 as pb
from ps_server.proto import ps_pb2_grpc as pb_grpc
from ps_server.wire import TOKEN_KEY, to_array
from spark_ps.client.spec import TensorSpec

__all__ = ["main"]
_TOKEN = "bench-journal"


def _time(journaled: bool, calls: int) -> tuple[float, float]:
    """(seconds per Post or Contribute, seconds per RegisterModel) on a fresh coordinator."""
    with tempfile.TemporaryDirectory() as d:
        svc = HostService(partitions=2, token=_TOKEN, checkpoint_dir=d if journaled else "")
        svc._resize(2)
        if journaled:
            svc._start_journal()
        svc.server.start()
        # the coordinator's own stub: a PSClient would wait for the shard map, which a
        # coordinator across hosts serves only once hosts have joined
        channel = grpc.insecure_channel(svc.address)
        stub, md = pb_grpc.CoordinatorStub(channel), ((TOKEN_KEY, _TOKEN),)
        try:
            v = to_array(np.arange(8.0))
            for i in range(-200, calls):  # the first 200: warm-up
                if i == 0:
                    t = time.perf_counter()
                payload = json.dumps({"op": "grad", "iteration": i})
                stub.Post(pb.PostRequest(topic="bench/cmd", round=i, payload=payload), metadata=md)
                contribution = pb.ContributeRequest(topic="bench/out", round=i, part=0, values=v)
                stub.Contribute(contribution, metadata=md)
            per_call = (time.perf_counter() - t) / (2 * calls)
            t = time.perf_counter()
            for i in range(50):
                spec = TensorSpec(f"m{i}", "dense", 10, 1, 2).global_spec()
                stub.RegisterModel(spec, metadata=md)
            per_model = (time.perf_counter() - t) / 50
        finally:
            channel.close()
            svc.server.stop()
            if svc.journal is not None:
                svc.journal.close()
        return per_call, per_model


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--calls", type=int, default=2000)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args(argv)
    print("| repeat | Post/Contribute plain | journaled | ratio | RegisterModel plain | "
          "journaled | ratio |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    for r in range(args.repeats):
        (a, ma), (b, mb) = _time(False, args.calls), _time(True, args.calls)
        print(
            f"| {r} | {a * 1e6:.0f} us | {b * 1e6:.0f} us | {b / a:.2f} | {ma * 1e3:.2f} ms | "
            f"{mb * 1e3:.2f} ms | {mb / ma:.1f} |"
        )


if __name__ == "__main__":
    main()
