"""Blocking rendezvous of a job's partitions on a shard: the server half of worker-driven loops.

Workers of one barrier job that must agree on a step (a GBT layer's splits, a few scalars
every worker needs) call the same server function with their partition's part. The shard
keeps one part per partition (a retried task's call *replaces* its first attempt's, so a
step is exactly-once per (step, partition)); the call that completes the set computes the
answer once, and every caller — and any later retry of the step — gets that same answer.
No driver is in the loop.

A call waits at most ``wait`` seconds and then answers "pending" (the client simply asks
again), so no client deadline is ever hit while a retried stage re-reads its data.

Imports only numpy: this module is loaded by shard processes.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from ps_server.wire import RequestError

__all__ = [
    "Rendezvous",
    "RENDEZVOUS",
    "READ_ONLY",
    "SERVER_FUNCTIONS",
    "check_step_args",
    "gather",
]

_MAX_WAIT = 60.0


class Rendezvous:
    """Parts and answers of every (topic, step) this shard has seen, until `drop(topic)`."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._parts: dict[tuple[str, int], tuple[int, dict[int, Any]]] = {}  # (n_parts, parts)
        self._done: dict[tuple[str, int], tuple[bool, Any]] = {}  # (ok, answer or error)
        self._scratch: dict[str, dict] = {}

    def scratch(self, topic: str) -> dict:
        """State a `compute` keeps between the steps of `topic` (only touch it in `compute`,
        which runs under the lock); dropped with the topic."""
        return self._scratch.setdefault(topic, {})

    def join(
        self,
        key: tuple[str, int],
        part: int,
        n_parts: int,
        value: Any,
        compute: Callable[[dict[int, Any]], Any],
        wait: float,
    ) -> tuple[bool, Any]:
        """Leave `value` as `part`'s share of step `key`; (True, answer) once all `n_parts`
        are in (`compute(parts)` runs once, on the completing call), (False, None) if the
        set is still incomplete after `wait` seconds. If `compute` raises, the callers
        waiting then get the error and the step starts afresh with the next call. A call
        whose `n_parts` differs from the pending set's is refused: the set would complete
        at the wrong count (too early, with parts missing, or never)."""
        deadline = time.monotonic() + min(max(float(wait), 0.0), _MAX_WAIT)
        with self._cond:
            if key in self._done and not self._done[key][0]:
                del self._done[key]  # a failed step is tried afresh (e.g. by a replay)
            if key not in self._done:
                expected, parts = self._parts.setdefault(key, (n_parts, {}))
                if expected != n_parts:
                    raise RequestError(
                        "INVALID_ARGUMENT",
                        f"step {key[1]} of {key[0]!r}: part {part} says n_parts {n_parts}, "
                        f"but parts {sorted(parts)} said {expected}",
                    )
                parts[part] = value
                if len(parts) >= n_parts:
                    del self._parts[key]
                    try:
                        self._done[key] = (True, compute(parts))
                    except Exception as e:  # noqa: BLE001 - every waiting caller gets it
                        self._done[key] = (False, e)
                    self._cond.notify_all()
            while key not in self._done:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False, None
                self._cond.wait(left)
            ok, answer = self._done[key]
        if not ok:
            raise answer
        return True, answer

    def drop(self, topic: str) -> int:
        """Forget every step of `topic` and its sub-topics ("topic/...", the job ended);
        returns how many steps were held."""
        with self._cond:
            mine = [t for t in self._scratch if t == topic or t.startswith(topic + "/")]
            for t in mine:
                del self._scratch[t]
            keys = [
                k
                for k in (*self._parts, *self._done)
                if k[0] == topic or k[0].startswith(topic + "/")
            ]
            for k in keys:
                self._parts.pop(k, None)
                self._done.pop(k, None)
            return len(keys)


RENDEZVOUS = Rendezvous()  # one per shard process


def check_step_args(args: Any, what: str) -> tuple[str, int, int, int, float]:
    """(topic, step, part, n_parts, wait) of a rendezvous call, refusing bad values by name."""
    if not isinstance(args, dict):
        raise RequestError("INVALID_ARGUMENT", f"{what}: args must be a JSON object")
    try:
        topic, step = str(args["topic"]), int(args["step"])
        part, n_parts = int(args["part"]), int(args["n_parts"])
        wait = float(args.get("wait", 10.0))
    except (KeyError, TypeError, ValueError) as e:
        raise RequestError(
            "INVALID_ARGUMENT", f"{what}: needs topic, step, part, n_parts ({e!r})"
        ) from None
    if not topic or n_parts < 1 or not 0 <= part < n_parts:
        raise RequestError(
            "INVALID_ARGUMENT",
            f"{what}: bad topic {topic!r} or part {part} of n_parts {n_parts}",
        )
    return topic, step, part, n_parts, wait


def gather(tensors: list, args: dict, arrays: list[np.ndarray]) -> tuple[dict, list[np.ndarray]]:
    """All-gather: every partition's float64 vector, stacked in partition order.

    args: topic, step, part, n_parts, wait; arrays: [this partition's vector].
    """
    topic, step, part, n_parts, wait = check_step_args(args, "rendezvous.gather")
    if len(arrays) != 1 or arrays[0].ndim != 1:
        raise RequestError("INVALID_ARGUMENT", "rendezvous.gather takes one 1-D array")
    value = np.asarray(arrays[0], dtype=np.float64)

    def stack(parts: dict[int, np.ndarray]) -> np.ndarray:
        sizes = {p.size for p in parts.values()}
        if len(sizes) != 1:
            raise RequestError("INVALID_ARGUMENT", f"gather {topic!r} step {step}: sizes {sizes}")
        return np.stack([parts[p] for p in sorted(parts)])

    ok, out = RENDEZVOUS.join((topic, step), part, n_parts, value, stack, wait)
    return ({"pending": not ok}, [out] if ok else [])


def drop(tensors: list, args: dict, arrays: list[np.ndarray]) -> tuple[dict, list[np.ndarray]]:
    """Forget a finished job's steps: args {topic}."""
    if not isinstance(args, dict) or not args.get("topic"):
        raise RequestError("INVALID_ARGUMENT", "rendezvous.drop needs args {topic}")
    return {"dropped": RENDEZVOUS.drop(str(args["topic"]))}, []


SERVER_FUNCTIONS = {"gather": gather, "drop": drop}
# No model state is touched: with replication these calls are not serialized under the
# replica's mutation lock (a waiting call would hold it) nor sent to the backup. A shard
# that dies mid-job loses its steps; workers then fail their call, Spark retries the stage,
# and the retried tasks replay from the last tree the driver read (the steps recompute).
READ_ONLY = ("gather", "drop")
