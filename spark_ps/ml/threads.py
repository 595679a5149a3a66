"""The threads a worker's passes may use: its task's CPUs (``spark.task.cpus``).

A Python worker process runs one Spark task at a time, so the count is per process; the
task sets it (:func:`set_threads`) before it reads its rows. Passes split their rows (or
features) into one contiguous part per thread and run the parts at once: numba kernels
and numpy's large operations release the GIL.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

__all__ = ["count", "ranges", "run", "set_threads"]

_threads = 1
_pool: ThreadPoolExecutor | None = None
_pool_size = 0
_pool_lock = threading.Lock()


def set_threads(n: int) -> int:
    """Let this process's passes use `n` threads from now on; returns the previous count."""
    global _threads
    previous, _threads = _threads, max(1, int(n))
    return previous


def count() -> int:
    """Threads this process's passes may use."""
    return _threads


def ranges(n: int, parts: int, step: int = 1) -> list[tuple[int, int]]:
    """`n` items in at most `parts` contiguous ranges of whole `step`s (one if `n` is 0)."""
    steps = -(-n // step)
    parts = max(1, min(parts, steps))
    cuts = [min(n, steps * k // parts * step) for k in range(parts + 1)]
    return [(a, b) for a, b in zip(cuts[:-1], cuts[1:], strict=True) if b > a] or [(0, n)]


def run(fn: Callable, calls: list[tuple]) -> list:
    """``fn(*args)`` for each of `calls`: the first on this thread, the rest at once on a
    pool kept for the process; the results in order."""
    if len(calls) == 1:
        return [fn(*calls[0])]
    global _pool, _pool_size
    with _pool_lock:  # a pool too small is replaced, never shut down: a caller may hold it
        if _pool is None or _pool_size < len(calls) - 1:
            _pool_size = len(calls) - 1
            _pool = ThreadPoolExecutor(_pool_size, thread_name_prefix="spark-ps-pass")
        rest = [_pool.submit(fn, *args) for args in calls[1:]]
    try:
        first = fn(*calls[0])
    finally:  # the other parts write to the caller's arrays too: never leave them running
        done = [job.result() if job.exception() is None else None for job in rest]
    errors = [job.exception() for job in rest if job.exception() is not None]
    if errors:
        raise errors[0]
    return [first, *done]
