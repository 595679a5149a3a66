"""Executor side of the coordinator's task queue: lease data shards, keep the lease
alive, mark them DONE (see `ps_server.coordinator.tasks` for the queue itself).

Workers name themselves ``executor:<id>/<name>``, so that when the JVM bridge's
listener reports executor ``<id>`` lost, the coordinator gives that executor's
leased shards back at once instead of waiting for their leases to lapse.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING

from spark_ps.client import PSClient

if TYPE_CHECKING:
    import psutil

__all__ = ["executor_id", "executor_jvm", "worker_name", "leased_tasks"]

log = logging.getLogger("spark_ps.tasks")

_EXECUTOR_FILE = "spark-ps-executor.properties"  # written by io.sparkps.bridge.PSPlugin


def executor_id() -> str:
    """The Spark executor id of this process: from the bridge plugin's file, else the
    ``--executor-id`` argument of the executor JVM above us, else ``driver`` (local mode)."""
    for d in os.environ.get("SPARK_LOCAL_DIRS", "").split(","):
        path = os.path.join(d, _EXECUTOR_FILE) if d else ""
        if path and os.path.exists(path):
            with open(path) as f:
                for line in f:
                    if line.startswith("executor.id="):
                        return line.split("=", 1)[1].strip()
    proc = executor_jvm()
    args = proc.cmdline() if proc is not None else []
    if "--executor-id" in args[:-1]:
        return args[args.index("--executor-id") + 1]
    return "driver"


def executor_jvm() -> psutil.Process | None:
    """The JVM this Python worker serves (the nearest ``java`` ancestor, a psutil.Process),
    or None outside Spark."""
    import psutil

    proc = psutil.Process().parent()
    while proc is not None and proc.name() != "java":
        proc = proc.parent()
    return proc


def worker_name(name: str) -> str:
    """``executor:<id>/<name>``: the id the executor listener's removals match."""
    return f"executor:{executor_id()}/{name}"


def leased_tasks(
    client: PSClient,
    queue: str,
    worker: str,
    *,
    heartbeat_seconds: float = 5.0,
    poll_seconds: float = 5.0,
) -> Iterator[tuple[int, str]]:
    """Yield ``(task_id, task)`` leases until every task of `queue` is DONE.

    A task is marked DONE when the caller asks for the next one (so a worker that dies
    while processing it gives it back); a background thread heartbeats meanwhile, so a
    slow but live worker keeps its lease. A failed beat (the coordinator briefly away) is
    logged and the next one tried: the thread used to die on it, and the lease lapsed while
    the worker kept working, so its task was done twice.
    """
    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(heartbeat_seconds):
            try:
                client.heartbeat(queue, worker)
            except Exception as e:  # noqa: BLE001 - the next beat may get through
                log.warning("queue %s: heartbeat of %s failed: %s", queue, worker, e)

    threading.Thread(target=beat, name=f"spark-ps lease {worker}", daemon=True).start()
    try:
        while True:
            lease = client.get_task(queue, worker, timeout=poll_seconds)
            if lease.drained:
                return
            if lease.task_id < 0:
                continue
            yield lease.task_id, lease.task
            client.finish_task(queue, worker, lease.task_id)
    finally:
        stop.set()
