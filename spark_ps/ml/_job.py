"""The worker model: ONE barrier Spark job runs a whole fit, driven through the PS.

The driver starts a barrier `mapInArrow` job in a background thread. Each task
reads its partition once, keeps it in memory, and then serves commands that the
driver posts on the coordinator's round board (`post`/`wait`). A worker answers a
command by pushing its share to the PS as the exactly-once contribution of
(round, partition) and contributing a few scalars; the driver `collect`s the
scalars of all partitions and reduces the PS tensors. No Spark job per iteration,
no gradient through the driver.

If a task fails or an executor dies, Spark aborts the barrier job and the driver launches
it again (up to ``spark.stage.maxConsecutiveAttempts`` launches, Spark's own limit for a
failed stage): the new tasks re-read their partitions, wait for the latest posted command
and answer it again; their contributions *replace* the earlier attempt's, so a retry
leaves the model exactly as a clean run would.

If a PS shard restarts (its state is a checkpoint's, or empty: not a promotion of a
replica), the shard map's restart count moves: `collect` raises
`ShardRestarted`, and a worker whose command failed because of the restart skips
that round instead of failing its task; the fit rolls back (`spark_ps.ml._recovery`)
and posts ``rewind`` so that workers rebuild their memory from the posted state.
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pyarrow as pa

from ps_server.lifecycle import huge_page_advice, keep_freed_memory
from ps_server.timeouts import MAX_WAIT_SECONDS
from spark_ps.client import PSUnreachable, get_client
from spark_ps.client.reach import reaches, unreachable_in
from spark_ps.ml import threads

__all__ = [
    "PSJob",
    "ShardRestarted",
    "job_description",
    "best_effort",
    "WorkerContext",
    "run_worker_loop",
    "num_partitions",
    "partitions_for",
    "inject_failure_once",
    "clear_failures",
]

log = logging.getLogger("spark_ps.job")

_DONE_SCHEMA = "partition long, rows long, saved boolean"
_MAX_LAUNCHES = "spark.stage.maxConsecutiveAttempts"
#: How Spark words the abort of a barrier result stage whose task failed (or whose
#: executor died): the one failure a relaunch answers. A cancelled job or a stopped
#: SparkContext is not relaunched.
_BARRIER_ABORT = "Could not recover from a failed barrier ResultStage"


def _max_launches(sc) -> int:
    """How many times a fit launches its worker job: Spark's limit for a failed stage."""
    try:
        return max(1, int(sc._jsc.sc().conf().get(_MAX_LAUNCHES, "4")))
    except Exception:  # noqa: BLE001 - an unreadable setting: Spark's default
        return 4


def _task_failed(e: BaseException) -> bool:
    """Did the worker job end because Spark aborted its failed barrier stage?"""
    return _BARRIER_ABORT in str(e)


_TENSORS: dict = {}

#: Below Int.MaxValue (the default is 64 MB), Spark 4 sizes the Arrow batch it is writing
#: after every row: a walk over every Arrow vector of the row's schema, ~20% of the JVM's
#: CPU handing GBT's nycflights rows to the workers (JFR). A job's batches stay bounded by
#: maxRecordsPerBatch (10,000 rows by default), as they were before Spark 4.
_ARROW_BYTES = "spark.sql.execution.arrow.maxBytesPerBatch"
_ARROW_ROWS = "spark.sql.execution.arrow.maxRecordsPerBatch"
_UNCAPPED = str(2**31 - 1)


def _uncap_arrow_bytes(conf) -> bool:
    """Lift the session's Arrow byte cap for the job about to start, unless the user set it
    (or lifted the row cap); True if it was lifted (then :func:`_recap_arrow_bytes`)."""
    if conf.get(_ARROW_BYTES, None) is not None or int(conf.get(_ARROW_ROWS, "10000")) <= 0:
        return False
    conf.set(_ARROW_BYTES, _UNCAPPED)
    return True


def _recap_arrow_bytes(conf) -> None:
    """Undo :func:`_uncap_arrow_bytes` unless someone has set another value meanwhile."""
    if conf.get(_ARROW_BYTES, None) == _UNCAPPED:
        conf.unset(_ARROW_BYTES)


class WorkerContext:
    """What a command handler sees on the executor: the partition, the PS, its ids."""

    def __init__(
        self,
        address: str,
        token: str,
        topic: str,
        part: int,
        attempt: int,
        tls_ca: bytes | None = None,
        cpus: int = 1,
    ):
        self.client = get_client(address, token, tls_ca)
        self.client.refresh()  # a cached client may hold an older map
        self._shards_at_start = list(self.client.addresses)  # see rendezvous()
        self._tls_ca = tls_ca
        self._token = token
        self.topic, self.part, self.attempt = topic, part, attempt
        #: CPUs Spark gave this task (``spark.task.cpus``): threads its kernels may use
        self.cpus = max(1, int(cpus))
        self.state: dict[str, Any] = {}
        self._fault_counts: dict[str, int] = {}

    def refuse(self, reason: str) -> None:
        """Tell the driver why this partition's rows cannot train (:meth:`PSJob.refusal`):
        a read that refused a row is reported in a set-up round instead of failing the
        task, so that the driver can word MLlib's error before any model exists."""
        self.client.post(f"{self.topic}/refused/{self.part}", 1, {"error": reason})

    def tensor(self, name: str):
        """The handle of PS tensor `name` (looked up once per worker process)."""
        from spark_ps.models import PSMatrix, PSVector

        key = ("tensor", name)
        if key not in _TENSORS:
            spec = self.client.lookup(name)
            cls = PSVector if spec.cols == 1 else PSMatrix
            _TENSORS[key] = cls(spec, self.client.address, self._token, self._tls_ca)
        return _TENSORS[key]

    def rendezvous(
        self, function: str, args: dict, arrays: list[list] | None = None, shards=None
    ) -> list[list[np.ndarray]]:
        """Call blocking server function `function` (see ps_server.functions.rendezvous) as
        this partition on `shards` (default all; arrays[i] go to the i-th) until each one
        has answered; returns every shard's arrays, in the order of `shards`."""
        shards = list(range(self.client.num_shards)) if shards is None else list(shards)
        args = dict(args, part=self.part)
        out: dict[int, list[np.ndarray]] = {}
        todo = list(range(len(shards)))
        deadline = time.monotonic() + MAX_WAIT_SECONDS
        while todo:  # a "pending" shard waited its fill without the others: ask it again
            self._check_rendezvous(function, args, shards, deadline)
            res = self.client.call(
                function,
                [],
                args,
                [arrays[i] for i in todo] if arrays is not None else None,
                shards=[shards[i] for i in todo],
                direct=True,  # rendezvous functions are read-only: the shards' direct lanes
            )
            for i, (meta, arr) in zip(todo, res, strict=True):
                if not meta.get("pending"):
                    out[i] = arr
            todo = [i for i in todo if i not in out]
        return [out[i] for i in range(len(shards))]

    def _check_rendezvous(self, function: str, args: dict, shards: list, deadline: float) -> None:
        """Fail this task rather than wait forever. A rendezvous shard that failed over (or
        restarted) since the task began lost its steps: a worker that did not get a step's
        answer would ask the new process, where the others, who moved on, never come; and
        later steps need what earlier ones left there. The failed task makes the driver
        relaunch the worker job, which redoes the steps from its last posted state."""
        for s in shards:
            if self.client.addresses[s] != self._shards_at_start[s]:
                raise RuntimeError(
                    f"partition {self.part}: PS shard {s} moved from "
                    f"{self._shards_at_start[s]} to {self.client.addresses[s]} (failed over or "
                    f"restarted) during {function} step {args.get('step')} of "
                    f"{args.get('topic')!r}; its rendezvous state is gone, so this worker job "
                    "is relaunched"
                )
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"partition {self.part}: {function} step {args.get('step')} of "
                f"{args.get('topic')!r} did not complete within {MAX_WAIT_SECONDS:.0f}s"
            )

    def fault_point(self, op: str) -> None:
        """Chaos hook inside a long command: die at this partition's `nth` `op` if a test
        asked for it (`inject_failure_once`); the retried attempt finds the marker and goes on."""
        fault = (self.state.get("_faults") or {}).get(op)
        if fault is None:
            return
        n = self._fault_counts[op] = self._fault_counts.get(op, -1) + 1
        if n == fault["count"]:
            self.injected_failure(fault, f"at {op} #{n}")

    def injected_failure(self, fault: dict | None, where: str) -> None:
        """Die here if `fault` (an `inject_failure_once` request) names this partition
        and has not fired yet; the marker file lets the retried attempt go on."""
        if fault and fault["part"] == self.part and not os.path.exists(fault["marker"]):
            open(fault["marker"], "w").close()
            if fault.get("kill_executor"):
                _kill_executor_jvm(fault["marker"])
            raise RuntimeError(f"injected failure of partition {self.part} {where}")

    def contribute(self, round_: int, values) -> None:
        """This partition's scalars for `round_` (a retry replaces them)."""
        self.injected_failure(
            self.state.get("_fault"),
            f"in round {round_}, after its pushes and before its contribution",
        )
        self.client.contribute(f"{self.topic}/out", round_, self.part, np.asarray(values))


def run_worker_loop(
    address: str,
    token: str,
    topic: str,
    setup: Callable[[Iterator[pa.RecordBatch], WorkerContext], None],
    handlers: dict[str, Callable[[WorkerContext, int, dict], None]],
    tls_ca: bytes | None = None,
    launch: int = 1,
):
    """Build the function a barrier `mapInArrow` runs: read once, then serve commands.
    `launch` numbers the launch of the job the function is built for (see `next_command`)."""

    recover = handlers.get("recover")

    def task(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from pyspark import BarrierTaskContext

        tc = BarrierTaskContext.get()
        keep_freed_memory()  # message buffers are reused, not page-faulted in per call
        ctx = WorkerContext(
            address, token, topic, tc.partitionId(), tc.attemptNumber(), tls_ca, tc.cpus()
        )
        # spark.task.cpus > 1: the worker's passes use them (this task's only: a reused
        # Python worker may run a task of another resource profile next); the same for
        # numpy's huge-page advice, off while the rows are read (see huge_page_advice)
        previous = threads.set_threads(ctx.cpus)
        advice = huge_page_advice(False)
        try:
            yield from _serve_commands(batches, ctx)
        finally:
            threads.set_threads(previous)
            if advice is not None:
                huge_page_advice(advice)

    def _serve_commands(batches, ctx: WorkerContext) -> Iterator[pa.RecordBatch]:
        setup(batches, ctx)
        if recover is not None:  # a retried task: rebuild what earlier rounds left in memory
            state = _latest(ctx.client, f"{topic}/state")
            if state is not None:
                recover(ctx, state)
        last = -1
        watch = LaunchWatch(ctx.client, topic, launch, ctx.part)
        watch.start()
        try:
            while True:
                round_, cmd = ctx.client.wait(f"{topic}/cmd", last + 1, timeout=3600)
                op = cmd.get("op")
                if op == "stop":
                    ctx.injected_failure(cmd.get("_fault"), "on stop")
                    break
                handler = _rewind if op == "rewind" else handlers.get(op)
                if handler is None:
                    raise ValueError(f"unknown worker command {op!r} (known: {sorted(handlers)})")
                ctx.state["_fault"] = cmd.get("_fault")
                ctx.state["_faults"] = cmd.get("_faults")
                _serve(handler, ctx, round_, cmd)
                last = round_
        finally:
            watch.stop()
        rows = int(ctx.state.get("rows", 0))
        yield pa.RecordBatch.from_pydict(
            {
                "partition": pa.array([ctx.part], pa.int64()),
                "rows": pa.array([rows], pa.int64()),
                "saved": pa.array([bool(ctx.state.get("parse_saved"))], pa.bool_()),
            }
        )

    def _rewind(ctx: WorkerContext, round_: int, cmd: dict) -> None:
        """Rebuild memory from the state the driver rolled back to."""
        if recover is not None:
            recover(ctx, _latest(ctx.client, f"{topic}/state") or {})
        ctx.contribute(round_, [1.0])

    return task


#: Seconds between a worker's looks at its job's newest launch.
WATCH_EVERY = 5.0


def superseded(client, topic: str, launch: int) -> bool:
    """Has the driver posted a newer launch of job `topic` than `launch`?"""
    newest = _latest(client, f"{topic}/launch")
    return newest is not None and int(newest.get("launch", 0)) > launch


class LaunchWatch(threading.Thread):
    """Ends this Python worker once a newer launch of its job has started.

    A task of an aborted launch must end: Spark's kill does not always reach a Python
    worker that waits in a call (an executor's task thread was seen spinning on the
    worker's pipe for minutes after "Stage cancelled", its worker blocked in a command
    wait or a GBT rendezvous), and a task that goes on holds its slot, so the relaunched
    barrier job never gets its slots. Exiting the worker process is what Spark's own kill
    does; the executor's daemon forks a new one for the next task."""

    def __init__(self, client, topic: str, launch: int, part: int, every: float = WATCH_EVERY):
        super().__init__(daemon=True, name=f"spark-ps launch watch {topic}")
        self.client, self.topic, self.launch, self.part = client, topic, launch, part
        self.every = every
        self._done = threading.Event()

    def run(self) -> None:
        while not self._done.wait(self.every):
            try:
                gone = superseded(self.client, self.topic, self.launch)
            except Exception:  # noqa: BLE001 - the coordinator is restarting: look again
                continue
            if gone and not self._done.is_set():
                log.warning(
                    "partition %d: launch %d of worker job %s was aborted and a newer one "
                    "runs; this worker exits",
                    self.part,
                    self.launch,
                    self.topic,
                )
                os._exit(3)

    def stop(self) -> None:
        self._done.set()


def _serve(handler, ctx: WorkerContext, round_: int, cmd: dict) -> None:
    """Run one command; a failure caused by a shard restart skips the round (the driver
    sees the restart too, rolls back and posts ``rewind``) instead of failing the task."""
    try:
        handler(ctx, round_, cmd)
    except Exception as e:
        if "_restarts" not in cmd or ctx.client.shard_restarts() == cmd["_restarts"]:
            raise
        log.warning(
            "partition %d skips round %d (%s): a PS shard restarted (%s); "
            "the driver rolls the fit back",
            ctx.part,
            round_,
            cmd.get("op"),
            e,
        )


_FAULTS: dict[str, dict] = {}


def best_effort(what: str, fn: Callable[[], object]) -> None:
    """Run the clean-up step `fn` (e.g. dropping a fit's PS state in a ``finally:``); if it
    fails, log it instead of raising: it must not hide the fit's own error (the PS may be
    gone), and after a successful fit the model is fine without it."""
    try:
        fn()
    except Exception:  # noqa: BLE001 - logged: the caller's outcome is what matters
        log.warning("spark-ps: %s failed (ignored)", what, exc_info=True)


def inject_failure_once(
    op: str, nth: int, part: int, marker: str, kill_executor: bool = False
) -> None:
    """Chaos hook for tests: partition `part` dies once in the `nth` (0-based) `op` round
    of the next fits, after its pushes and before its contribution (or, for an op a long
    command reaches through `WorkerContext.fault_point`, at its `nth` such point). `marker`
    is a file path that records the failure (so the retried attempt goes on); clear with
    `clear_failures()`. With `kill_executor`, the task SIGKILLs its executor's JVM."""
    _FAULTS[op] = {"count": nth, "part": part, "marker": marker, "kill_executor": kill_executor}


def _kill_executor_jvm(marker: str) -> None:
    """SIGKILL the JVM this Python worker serves (the nearest `java` ancestor); its pid
    goes into `marker`."""
    import signal

    from spark_ps.tasks import executor_jvm

    proc = executor_jvm()
    if proc is None:
        raise RuntimeError("no executor JVM above this Python worker")
    with open(marker, "w") as f:
        f.write(str(proc.pid))
    os.kill(proc.pid, signal.SIGKILL)


def clear_failures() -> None:
    _FAULTS.clear()


def _latest(client, topic: str) -> dict | None:
    """The latest payload posted on `topic`, or None if nothing was posted yet."""
    try:
        return client.wait(topic, 0, timeout=0.05)[1]
    except Exception as e:  # noqa: BLE001 - nothing posted: the wait timed out
        if "timed out" in str(e):
            return None
        raise


class ShardRestarted(RuntimeError):
    """A PS shard restarted during a fit: results since the last check are suspect
    (`spark_ps.ml._recovery` rolls the fit back)."""


def job_description(name: str, ps) -> str:
    """The fit's Spark job description, as the Spark UI shows it: with the PS status page's
    URL when the PS serves one (``spark.ps.uiPort``; never the token)."""
    url = getattr(ps, "ui_url", None)
    return f"spark-ps {name}: worker loop" + (f" · PS status page {url}" if url else "")


class PSJob:
    """Driver side of one fit: launch the barrier job, post commands, collect answers."""

    def __init__(self, ps, df, num_workers: int, setup, handlers, name: str, parse=None):
        """`parse`: a :class:`~spark_ps.ml.parse_cache.ParsePlan` when `setup` saves or
        reads parsed partitions (then the first launch may read saved ones)."""
        self.ps, self.num_workers, self.name = ps, num_workers, name
        self._parse = parse
        self.topic = f"job-{uuid.uuid4().hex[:12]}"
        self.round = 0
        self._state_round = 0
        self.restarts: int | None = None  # shard restart count the fit's PS state matches
        self.error: BaseException | None = None
        self.result: list | None = None
        self._loop_args = (
            ps.address, ps.token, self.topic, setup, handlers, getattr(ps, "tls_ca", None)
        )  # fmt: skip
        # One barrier result stage, relaunched by `_run` when it fails: Spark aborts a failed
        # barrier result stage where it re-runs a shuffle-map one, but the shuffle that made
        # it one cost every fit a second stage, ~0.1 s at the end (measured).
        self._source = df
        self._df = self._worker_df(1)
        self._sc = df.sparkSession.sparkContext
        self._stopping = False
        self._cap_lock, self._uncapped = threading.Lock(), False
        self._thread = threading.Thread(target=self._run, name=f"spark-ps {name}", daemon=True)

    def _run(self) -> None:
        self._sc.setJobDescription(job_description(self.name, self.ps))
        conf = self._df.sparkSession.conf
        with self._cap_lock:
            try:  # read as the job is planned, for its retries too
                self._uncapped = _uncap_arrow_bytes(conf)
            except Exception:  # noqa: BLE001 - only a speed-up: the job runs capped
                log.debug("%s: could not lift %s", self.name, _ARROW_BYTES, exc_info=True)
        launches, launch = _max_launches(self._sc), 0
        try:
            while launch < launches:
                launch += 1
                try:
                    if launch > 1:  # tasks of an earlier launch still waiting end now
                        self.ps.client.post(f"{self.topic}/launch", launch, {"launch": launch})
                        self._df = self._worker_df(launch)
                    self.result = self._df.collect()
                    return
                except BaseException as e:  # noqa: BLE001 - re-raised on the caller's thread
                    if self._stopping and _task_failed(e):
                        # `stop` comes after the fit's last round was collected: the model
                        # is on the PS, and a worker lost while leaving (an executor killed
                        # as the job winds down) takes nothing the fit needs.
                        log.warning(
                            "spark-ps %s: a worker was lost while the finished fit stopped "
                            "its workers; the fit is complete: %s",
                            self.name,
                            str(e)[str(e).find(_BARRIER_ABORT) :][:300],
                        )
                        return
                    if self._missed_parse(e):
                        launches += 1  # not a failure: the rows are read instead
                        continue
                    if (
                        self._stopping
                        or launch == launches
                        or not _task_failed(e)
                        or self._unreachable(e)  # a relaunch cannot reach it either
                    ):
                        self.error = e
                        return
                    why = str(e)[str(e).find(_BARRIER_ABORT) :][:400]
                    log.warning(
                        "spark-ps %s: launching the workers again (%d of %d): %s",
                        self.name,
                        launch + 1,
                        launches,
                        why,
                    )
        finally:
            self._restore_cap()

    def _worker_df(self, launch: int):
        """A new Dataset of the worker job for every launch: an adaptive plan (an input
        with a shuffle, e.g. ``repartition(n).cache()``) keeps its query stages, so
        collecting a Dataset whose stage failed throws that failure again without
        starting a job. Its tasks know their launch (see `next_command`)."""
        fn = run_worker_loop(*self._loop_args, launch=launch)
        source = self._source
        if self._parse is not None and self._parse.read:
            if launch == 1:
                source = self._parse.marker_df(source)
            else:  # a relaunch reads the rows (an executor may be new)
                self._parse.read = False
        return source.mapInArrow(fn, _DONE_SCHEMA, barrier=True)

    def _missed_parse(self, error: BaseException) -> bool:
        """Did the first launch fail because a partition's saved parse was not on its
        executor? Then the rows are read in a relaunch that does not count as a failure."""
        if self._parse is None or not self._parse.read or self._stopping:
            return False
        if not _task_failed(error) or "ParseCacheMiss" not in str(error):
            return False
        self._parse.missed()
        log.info("spark-ps %s: a saved parse was not on its executor; reading the rows", self.name)
        return True

    def _restore_cap(self) -> None:
        """Put the session's Arrow byte cap back, once: as soon as the workers answer a
        round (Spark read the cap when it planned their job, so the session's other
        queries need not run uncapped for the rest of the fit), else when the job ends."""
        with self._cap_lock:
            if self._uncapped:
                self._uncapped = False
                conf = self._df.sparkSession.conf
                best_effort("restoring " + _ARROW_BYTES, lambda: _recap_arrow_bytes(conf))

    def __enter__(self) -> PSJob:
        self._thread.start()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc is None:
            self.stop()
        else:  # the fit's error is the one to see, not a failure to stop (PS gone)
            best_effort(f"{self.name}: stopping the worker job", lambda: self.stop(False))

    def command(self, op: str, **payload) -> int:
        """Post a command for every worker; returns its round."""
        self.round += 1
        fault = _FAULTS.get(op)
        if fault is not None and fault["count"] == 0:
            payload["_fault"] = fault
        if fault is not None:
            fault["count"] -= 1
        if self.restarts is not None:
            payload["_restarts"] = self.restarts
        if _FAULTS:  # for fault points inside long commands (WorkerContext.fault_point)
            payload["_faults"] = {k: dict(v) for k, v in _FAULTS.items()}
        self.ps.client.post(f"{self.topic}/cmd", self.round, {"op": op, **payload})
        return self.round

    def refusal(self, part: int) -> str:
        """Why partition `part` refused its rows (:meth:`WorkerContext.refuse`)."""
        msg = _latest(self.ps.client, f"{self.topic}/refused/{part}")
        return msg["error"] if msg else f"partition {part} refused its rows"

    def post_state(self, state: dict) -> None:
        """What a retried task needs to rebuild its memory (handed to the `recover` handler)."""
        self._state_round += 1
        self.ps.client.post(f"{self.topic}/state", self._state_round, state)

    def collect(self, round_: int) -> np.ndarray:
        """Sum of all partitions' scalars for `round_`; raises if the Spark job died."""
        while True:
            self._check()
            try:
                out = self.ps.client.collect(
                    f"{self.topic}/out", round_, self.num_workers, timeout=2.0
                )
            except Exception as e:  # noqa: BLE001 - a timeout: check the job and wait again
                if "timed out" not in str(e):
                    raise
                self.check_shards()  # workers skip a round that a shard restart broke
                continue
            self.check_shards()
            if self._uncapped:  # the workers run: their job no longer needs the session's
                self._restore_cap()
            return out

    def shards_moved(self) -> bool:
        """Did a shard restart since the count was `restarts` (None: not watched)?"""
        return self.restarts is not None and self.ps.client.shard_restarts() != self.restarts

    def check_shards(self) -> None:
        """Raise `ShardRestarted` if a shard restarted since the count was `restarts`."""
        if self.shards_moved():
            raise ShardRestarted(
                f"spark-ps {self.name}: a PS shard restarted (restart count {self.restarts} -> "
                f"{self.ps.client.restarts})"
            )

    def rewind(self, state: dict) -> None:
        """After a rollback: post `state` and have every worker rebuild from it."""
        self.post_state(state)
        self.call("rewind")

    def wait_posted(self, topic: str) -> dict:
        """What a worker posted on `topic` (its first round); raises if the Spark job died,
        or if nothing came for MAX_WAIT_SECONDS (the workers' own bound on a step)."""
        deadline = time.monotonic() + MAX_WAIT_SECONDS
        while True:
            self._check()
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"spark-ps {self.name}: no worker posted {topic!r} within "
                    f"{MAX_WAIT_SECONDS:.0f}s"
                )
            try:
                return self.ps.client.wait(topic, 1, timeout=2.0)[1]
            except Exception as e:  # noqa: BLE001 - a timeout: check the job and wait again
                if "timed out" not in str(e):
                    raise

    def call(self, op: str, **payload) -> tuple[int, np.ndarray]:
        """`command` then `collect`: one synchronous round."""
        r = self.command(op, **payload)
        return r, self.collect(r)

    def _unreachable(self, error: BaseException) -> bool:
        """Did the job fail because an executor cannot reach a PS that the driver reaches?
        Then relaunching cannot help. If the driver cannot reach it either, the PS is down
        (a coordinator or shard restarting), and if the address is no longer in the shard
        map, that shard moved (its host was lost, e.g. with its executor): either way the
        job is relaunched as for any failure."""
        line = unreachable_in(str(error))
        if line is None:
            return False
        try:
            self.ps.client.refresh()
        except Exception:  # noqa: BLE001 - the coordinator is down: relaunch, as above
            return False
        current = [self.ps.address, *self.ps.client.addresses]
        named = re.search(r" at (\S+) from host ", line)
        if named is not None and named.group(1) not in current:
            return False
        return reaches(current)

    def _failed(self) -> Exception:
        """The error to raise for the worker job's failure: an executor that could not
        reach the PS is a `PSUnreachable` naming the address and the settings, not a
        page of Spark stack traces."""
        line = unreachable_in(str(self.error))
        if line is not None:
            return PSUnreachable(f"{line} (spark-ps {self.name}: the worker job failed)")
        return RuntimeError(f"spark-ps {self.name}: the worker job failed: {self.error}")

    def _check(self) -> None:
        if self.error is not None:
            raise self._failed() from self.error
        if self.result is not None:
            raise RuntimeError(f"spark-ps {self.name}: the worker job ended early")

    def stop(self, raise_errors: bool = True) -> None:
        self._stopping = True  # a failure from here on ends the job: no relaunch
        self.command("stop")
        self._thread.join(timeout=120)
        if self._parse is not None and self.result is not None and self.error is None:
            self._parse.saved([bool(r["saved"]) for r in self.result])
            if self._parse.read:
                log.info("spark-ps %s: the workers read their saved parses", self.name)
        if raise_errors and self.error is not None:
            raise self._failed() from self.error


def task_slots(sc) -> int:
    """Tasks the application runs at once (a barrier job of more tasks never starts): the
    default parallelism (the executors' cores) over ``spark.task.cpus``.

    Not Spark's live count of free slots (``maxNumConcurrentTasks``): while a lost
    executor is replaced that count drops, and a fit started then would be refused
    (measured: the chaos soak's FTRL fits after executor kills). Executors whose cores do
    not divide by ``spark.task.cpus`` hold fewer slots than this; set ``numWorkers`` there.

    ``spark.task.cpus`` is fixed when the application starts, so it is read from the
    context's own conf (one JVM call) rather than ``getConf()``, which copies every setting
    through py4j (6-12 ms of each fit, measured)."""
    conf = getattr(sc, "_conf", None) or sc.getConf()
    return slots_by_division(sc.defaultParallelism, conf.get("spark.task.cpus", "1"))


def slots_by_division(cores: int, task_cpus) -> int:
    """`cores` over the CPUs a task takes, at least 1."""
    return max(1, int(cores) // max(int(task_cpus or 1), 1))


def partitions_for(df, num_workers: int):
    """`df` with exactly `num_workers` partitions, refused when slots are fewer."""
    slots = task_slots(df.sparkSession.sparkContext)
    if num_workers > slots:
        raise ValueError(
            f"numWorkers={num_workers} exceeds the {slots} task slots of this application: "
            "a barrier job needs every worker running at once; lower numWorkers"
        )
    if num_partitions(df) != num_workers:
        df = df.repartition(num_workers)
    return df


def num_partitions(df) -> int:
    """``df.rdd.getNumPartitions()`` without the Python RDD around it: the same planned
    RDD's partitions, 10-16 ms sooner on a fit's input (measured), once per fit."""
    return int(df._jdf.queryExecution().toRdd().getNumPartitions())
