"""Blocking rendezvous of a job's partitions on a shard: the server half of worker-driven loops.

Workers of one barrier job that must agree on a step (a GBT layer's splits, a few scalars
every worker needs) call the same server function with their partition's part. The shard
keeps one part per partition (a retried task's call *replaces* its first attempt's, so a
step is exactly-once per (step, partition)); the call that completes the set computes the
answer once, and every caller — and any later retry of the step — gets that same answer.
No driver is in the loop.

A call waits at most ``wait`` seconds and then answers "pending" (the client simply asks
again), so no client deadline is ever hit while a retried stage re-reads its data.

A driver drops its job's topics when the job ends; one that died first cannot, so a topic
none of whose steps was called for ``SPARK_PS_RENDEZVOUS_TTL`` seconds (default 3600, far
above any wait) is dropped by a later call (idle topics are looked for every few seconds).

Imports only numpy: this module is loaded by shard processes.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ps_server import timeouts
from ps_server.wire import RequestError

__all__ = [
    "Rendezvous",
    "RENDEZVOUS",
    "READ_ONLY",
    "SERVER_FUNCTIONS",
    "check_step_args",
    "gather",
]

_MAX_WAIT = timeouts.RENDEZVOUS_MAX_WAIT_SECONDS
TTL_ENV = "SPARK_PS_RENDEZVOUS_TTL"  # seconds a topic may sit idle before it is dropped
_SWEEP_SECONDS = 5.0  # idle topics are looked for at most this often (on a join)


class Rendezvous:
    """Parts and answers of every (topic, step) this shard has seen, until `drop(topic)` or
    until the topic has been idle for `ttl` seconds (its driver died before dropping it)."""

    def __init__(self, ttl: float | None = None) -> None:
        self._cond = threading.Condition()
        self._parts: dict[tuple[str, int], _Pending] = {}
        self._done: dict[tuple[str, int], Any] = {}  # answers of completed steps
        self._failed: dict[tuple[str, int], tuple[int, Exception]] = {}  # (generation, error)
        self._scratch: dict[str, dict] = {}
        self._generation = itertools.count()
        self._ttl = _ttl_from_env() if ttl is None else float(ttl)
        self._touched: dict[str, float] = {}  # topic -> monotonic time of its last call
        self._waiting: dict[str, int] = {}  # topic -> callers waiting now (never expired)
        self._next_sweep = time.monotonic() + self._sweep_every()

    def scratch(self, topic: str) -> dict:
        """State a `compute` keeps between the steps of `topic` (only touch it under the
        lock: in `compute` or `admit`); dropped with the topic."""
        return self._scratch.setdefault(topic, {})

    def join(
        self,
        key: tuple[str, int],
        part: int,
        n_parts: int,
        value: Any,
        compute: Callable[[dict[int, Any]], Any],
        wait: float,
        admit: Callable[[], None] | None = None,
    ) -> tuple[bool, Any]:
        """Leave `value` as `part`'s share of step `key`; (True, answer) once all `n_parts`
        are in (`compute(parts)` runs once, on the completing call), (False, None) if the
        set is still incomplete after `wait` seconds.

        `admit()` (under the lock) may refuse the part by raising before it is left, but
        only while the step is open: a retry of a completed step gets its answer. If
        `compute` raises, every caller whose part was in that set gets the error, and the
        step starts afresh with the next call. A call whose `n_parts` differs from the
        pending set's is refused: the set would complete at the wrong count (too early,
        with parts missing, or never)."""
        deadline = time.monotonic() + min(max(float(wait), 0.0), _MAX_WAIT)
        topic = key[0]
        with self._cond:
            self._expire_idle()
            self._touched[topic] = time.monotonic()
            generation = None
            if key not in self._done:
                generation = self._leave(key, part, n_parts, value, compute, admit)
            self._waiting[topic] = self._waiting.get(topic, 0) + 1
            try:
                while key not in self._done:
                    failed = self._failed.get(key)
                    if failed is not None and failed[0] == generation:
                        raise _copy(failed[1])
                    left = deadline - time.monotonic()
                    if left <= 0:
                        return False, None
                    self._cond.wait(left)
                return True, self._done[key]
            finally:
                self._waiting[topic] -= 1
                if not self._waiting[topic]:
                    del self._waiting[topic]
                self._touched[topic] = time.monotonic()

    def _leave(self, key, part, n_parts, value, compute, admit) -> int:
        """Add the part to the open set of `key` (computing it when complete); its generation."""
        pending = self._parts.get(key)
        if pending is not None and pending.n_parts != n_parts:
            raise RequestError(
                "INVALID_ARGUMENT",
                f"step {key[1]} of {key[0]!r}: part {part} says n_parts {n_parts}, "
                f"but parts {sorted(pending.parts)} said {pending.n_parts}",
            )
        if admit is not None:
            admit()  # before anything is stored: a refused call leaves no trace
        if pending is None:
            pending = self._parts[key] = _Pending(n_parts, {}, next(self._generation))
        pending.parts[part] = value
        if len(pending.parts) >= n_parts:
            del self._parts[key]
            try:
                self._done[key] = compute(pending.parts)
                self._failed.pop(key, None)
            except Exception as e:  # noqa: BLE001 - every caller of this set gets it
                self._failed[key] = (pending.generation, e)
            self._cond.notify_all()
        return pending.generation

    def _sweep_every(self) -> float:
        return min(_SWEEP_SECONDS, max(self._ttl / 2, 0.05))

    def _expire_idle(self) -> None:
        """Drop the topics idle for longer than the TTL (at most once every few seconds)."""
        now = time.monotonic()
        if now < self._next_sweep:
            return
        self._next_sweep = now + self._sweep_every()
        idle = [
            t for t, at in self._touched.items() if now - at > self._ttl and t not in self._waiting
        ]
        for t in idle:
            self._forget(lambda name, t=t: name == t)

    def _forget(self, match: Callable[[str], bool]) -> int:
        """Remove every step, answer and scratch of the topics `match` selects (under the lock)."""
        for t in [t for t in self._scratch if match(t)]:
            del self._scratch[t]
        for t in [t for t in self._touched if match(t)]:
            del self._touched[t]
        keys = {k for k in (*self._parts, *self._done, *self._failed) if match(k[0])}
        for k in keys:
            self._parts.pop(k, None)
            self._done.pop(k, None)
            self._failed.pop(k, None)
        return len(keys)

    def drop(self, topic: str) -> int:
        """Forget every step of `topic` and its sub-topics ("topic/...", the job ended);
        returns how many steps were held."""
        with self._cond:
            return self._forget(lambda t: t == topic or t.startswith(topic + "/"))

    def topics(self) -> list[str]:
        """The topics held now (for tests and health checks)."""
        with self._cond:
            return sorted({k[0] for k in (*self._parts, *self._done, *self._failed)})


@dataclass
class _Pending:
    """The parts of one open step so far; `generation` tells its callers apart from those
    of a later attempt at the same step (after this one failed)."""

    n_parts: int
    parts: dict[int, Any]
    generation: int


def _copy(e: Exception) -> Exception:
    """A RequestError to raise in one more thread (its traceback is its own)."""
    return RequestError(e.code, str(e)) if isinstance(e, RequestError) else e


def _ttl_from_env() -> float:
    return timeouts.rendezvous_ttl()


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
