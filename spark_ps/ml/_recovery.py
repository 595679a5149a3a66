"""Checkpoints during a fit, and the way back when a shard process dies.

A restarted shard comes back with the newest sealed checkpoint (or empty), so the
other shards and the driver are now ahead of it: any result computed since is
suspect. The fit notices through the shard map's restart count (it moves whenever a
shard process starts as a primary, not when a backup replica is promoted — that one
lost nothing; `PSJob.collect` and every worker compare it) and goes back to its newest
consistent point. Which point depends on the mode:

* **Default (no ``spark.ps.checkpointDir``): driver-held state.** Nothing is written to
  disk. The driver keeps a small copy of the fit's state at boundaries: GBT its trees
  (they live on the driver anyway); L-BFGS its scalars and the iterate ``x`` (K+1
  floats, up to 2^27 keys, pulled every ``checkpointInterval`` iterations: 0.25-1.5 s
  per 20-iteration fit at 2^24 keys, 0.5-2 % of its time, bench/ft_cost.py). After a
  restart every tensor of the fit is dropped, the set-up rounds (key numbering,
  statistics, sketches) are redone under fresh names — the workers still hold their
  partitions, so this costs rounds, not a re-read — and the solver starts again from the
  held state: L-BFGS from ``x`` with an empty curvature history (the path after the
  restart differs from a clean run's; the optimum does not). A fit with nothing held yet
  (a restart during set-up, or before the first held boundary) starts over from set-up.
  This was chosen over a default on-disk checkpoint because a checkpoint writes every
  vector of the fit (2m + 7 = 27 for L-BFGS: up to ~3.6 GB per checkpoint at 2^24 keys),
  and over default replication because it doubles the PS's processes and memory and
  every push.
* **``spark.ps.checkpointDir`` set: PS checkpoints.** At every ``checkpointInterval``-th
  boundary all the fit's tensors go to the directory with the driver state in the
  manifest; a rollback restores them (on every shard) and the solver goes on exactly
  where it was (same floats as a clean run). A restart before the fit's first checkpoint
  falls back to starting over from set-up.

Checkpoints are taken at consistent points only (LR: an iteration boundary; GBT: a
tree boundary), and at the next boundary when `PSContext.checkpoint()` is called during
the fit.
"""

from __future__ import annotations

import copy
import logging
import time
from collections.abc import Callable
from typing import TypeVar

from ps_server.checkpoint import read_manifest, sealed_versions
from spark_ps.ml._job import PSJob, ShardRestarted

__all__ = ["FitRecovery", "ShardRestarted", "MAX_RESTORES", "redo_on_restart"]

log = logging.getLogger("spark_ps.recovery")

T = TypeVar("T")

#: A fit gives up after this many restores (a shard that keeps dying is not transient).
MAX_RESTORES = 5
#: The default mode's work while nothing fails (driver-held state, set-up rounds watched);
#: off, a shard restart fails a fit without PS checkpoints. Only bench/ft_cost.py turns it
#: off, to measure what it costs.
DEFAULT_RECOVERY = True


class FitRecovery:
    """Checkpoints of one fit (`job`) and its rollback after a shard restart.

    `ps_state`: the fit's model lives on the PS between boundaries (LR): a rollback needs
    a PS checkpoint or the state the driver held (`hold`), else the fit
    starts over; otherwise (GBT) the last boundary's driver state is enough.
    `checkpoints=False`: never write PS checkpoints; a rollback resumes from the state
    the driver held, or starts over (fits whose set-up is not restorable from tensors).
    `watch=False`: only checkpoint at boundaries, never roll back (GBT's boosting: its
    workers grow trees on their own, so a shard restart fails their rendezvous, the driver
    relaunches the barrier job and the new tasks resume from the trees the driver has read).

    `attempt` (see `run`) names what it creates on the PS under :attr:`prefix`, which is
    fresh after every rollback that starts the set-up again.
    """

    def __init__(
        self,
        job: PSJob,
        interval: int,
        *,
        ps_state: bool,
        what: str,
        watch: bool = True,
        snapshot: Callable[[dict], dict] = copy.deepcopy,
        checkpoints: bool = True,
    ) -> None:
        self.job, self.ps, self.what = job, job.ps, what
        self._snapshot = snapshot  # a copy of the driver's state that later steps don't change
        # checkpoints=False: driver-held state only, even with spark.ps.checkpointDir set
        self.uri = (getattr(self.ps, "checkpoint_dir", "") or "") if checkpoints else ""
        self.interval, self.ps_state = int(interval), ps_state
        self.restores = 0
        self.iteration = 0  # the last boundary reached
        self.saved: int | None = None  # the boundary of the newest checkpoint
        self.last: tuple[int, dict] | None = None  # (boundary, state) in memory
        self.from_checkpoint = False  # did the last rollback restore the fit's tensors?
        self._setups = 0
        if watch:
            job.restarts = self.ps.client.shard_restarts()

    @property
    def enabled(self) -> bool:
        """Does this fit write PS checkpoints (``spark.ps.checkpointDir`` and an interval)?"""
        return bool(self.uri) and self.interval > 0

    @property
    def prefix(self) -> str:
        """Where the current set-up's tensors are named: `job.topic`, then a fresh prefix
        for every set-up redone after a rollback (workers cache tensors by name)."""
        return self.job.topic if not self._setups else f"{self.job.topic}/redo{self._setups}"

    def hold(self, iteration: int, held: Callable[[], dict]) -> None:
        """At boundary `iteration` of a fit with PS state and no PS checkpoints: every
        `interval` boundaries, keep `held()` (it may pull from the PS) as the state the
        driver resumes from after a shard restart."""
        if DEFAULT_RECOVERY and self.ps_state and not self.enabled and self._due(iteration):
            kept = held()
            self.job.check_shards()  # not read from a shard that restarted meanwhile
            self.last = (iteration, kept)

    def boundary(self, iteration: int, state: Callable[[], dict]) -> None:
        """A consistent point: check the shards, keep the state, checkpoint when due."""
        self.job.check_shards()
        self.iteration = iteration
        if not self.ps_state:
            self.last = (iteration, self._snapshot(state()))
        requested = self.ps.take_checkpoint_request(self.uri) if self.uri else False
        due = self.enabled and iteration != self.saved and iteration % self.interval == 0
        if not (due or requested) or not self.uri:
            return
        meta = {"fits": {self.job.topic: {"iteration": iteration, "state": state()}}}
        for attempt in range(3):  # a fit without PS state retries a version a restart spoiled
            version = self.ps.next_version(self.uri)
            restarts = self.ps.client.shard_restarts()
            try:
                self.ps.client.checkpoint(self.uri, version, meta, restarts=self.job.restarts)
                break
            except Exception:
                self.job.check_shards()  # a restart while writing: roll back, not fail
                moved = self.ps.client.shard_restarts() != restarts
                if self.ps_state or not moved or attempt == 2:
                    raise
                log.info("%s: a shard restarted while v%d was written; again", self.what, version)
        self.saved = iteration
        self.ps.checkpoint_taken(self.uri, version)
        log.info("%s: checkpoint v%d at %s %d", self.what, version, self._unit, iteration)

    def _due(self, iteration: int) -> bool:
        """Is the driver-held state due at `iteration` (every `interval` boundaries, not
        the start: starting over costs no more than resuming from the initial point)?"""
        held = self.last[0] if self.last is not None else None
        return (
            self.interval > 0
            and iteration > 0
            and iteration % self.interval == 0
            and (iteration != held)
        )

    @property
    def _unit(self) -> str:
        return "iteration" if self.ps_state else "tree"

    def run(self, attempt: Callable[[dict | None], T]) -> T:
        """`attempt(resume)` until it finishes without a shard restart (at most
        MAX_RESTORES rollbacks). `resume` is None first and after a rollback that starts
        over (`attempt` then builds its set-up again under :attr:`prefix`), else the
        restored state (:attr:`from_checkpoint`: the fit's tensors were restored too)."""
        resume = None
        self.ps.fit_started(self)
        try:
            while True:
                try:
                    result = attempt(resume)
                    self.job.check_shards()  # the final reads were not from a restarted shard
                    return result
                except Exception as e:
                    if not isinstance(e, ShardRestarted) and not self.job.shards_moved():
                        raise
                    if self.restores >= MAX_RESTORES:
                        raise RuntimeError(
                            f"{self.what}: PS shards restarted {self.restores + 1} times; giving up"
                        ) from e
                    resume = self.rollback(e)
        finally:
            self.ps.fit_ended(self)

    def rollback(self, cause: BaseException) -> dict | None:
        """Bring the fit back to its newest consistent point; returns that state (None:
        start over from set-up, with a fresh :attr:`prefix`)."""
        self.restores += 1
        client = self.ps.client
        t0 = time.perf_counter()
        restarts = client.shard_restarts()  # a restart during the restore: the next check
        found = self._newest_checkpoint() if self.ps_state and self.uri else None
        self.from_checkpoint = found is not None
        state: dict | None
        if found is not None:
            version, iteration, state = found
            client.restore(self.uri, version, prefix=f"{self.job.topic}/")
            where = f"checkpoint v{version} ({self.uri})"
        elif self.last is not None:
            iteration, state = self.last[0], self._snapshot(self.last[1])
            where = "the state the driver held"
        else:
            iteration, state, where = 0, None, "the start (set-up redone)"
        if not self.from_checkpoint and self.ps_state:
            self._setups += 1  # the set-up is built again, under new names
        self.job.restarts = restarts
        lost = max(self.iteration - iteration, 0)
        client.count("restore")
        if lost:
            client.count("iteration_lost", lost)
        log.warning(
            "%s: %s; rolled the fit back to %s %d from %s in %.2fs: %d completed %ss and "
            "the one in progress are redone (restore %d of at most %d)",
            self.what,
            _short(cause),
            self._unit,
            iteration,
            where,
            time.perf_counter() - t0,
            lost,
            self._unit,
            self.restores,
            MAX_RESTORES,
        )
        self.iteration, self.saved = iteration, (iteration if found is not None else None)
        return state

    def _newest_checkpoint(self) -> tuple[int, int, dict] | None:
        """(version, boundary, state) of this fit's newest checkpoint, or None."""
        topic = self.job.topic
        for version in reversed(sealed_versions(self.uri)):
            fit = read_manifest(self.uri, version).get("fits", {}).get(topic)
            if fit is not None:
                return version, int(fit["iteration"]), fit["state"]
        return None


def redo_on_restart(job: PSJob, what: str, step: Callable[[int], T]) -> T:
    """Run the set-up `step(n)` (n = 0, 1, ...: name its PS tensors with it) again while a
    shard restarts during it (at most MAX_RESTORES times): for set-up rounds whose results
    the driver reads back before the fit's model exists (GBT's sketch), so nothing needs
    restoring. Workers skip a round a restart broke instead of failing their task."""
    if not DEFAULT_RECOVERY:
        return step(0)
    before = job.restarts
    for n in range(MAX_RESTORES + 1):
        job.restarts = job.ps.client.shard_restarts()
        try:
            result = step(n)
            job.check_shards()  # what it read back was not from a restarted shard
            job.restarts = before
            return result
        except Exception as e:
            if not isinstance(e, ShardRestarted) and not job.shards_moved():
                job.restarts = before
                raise
            job.ps.client.count("restore")
            log.warning("%s: %s; the set-up step is redone", what, _short(e))
    job.restarts = before
    raise RuntimeError(f"{what}: PS shards restarted {MAX_RESTORES + 1} times; giving up")


def _short(error: BaseException, limit: int = 300) -> str:
    text = str(error)
    return text if len(text) <= limit else text[:limit] + "..."
