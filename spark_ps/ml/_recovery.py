"""Checkpoints during a fit, and the way back when a shard process dies.

A restarted shard comes back with the newest sealed checkpoint (or empty), so the
other shards and the driver are now ahead of it: any result computed since is
suspect. The fit notices through the shard map's restart count (it moves whenever a
shard process starts as a primary, not when a backup replica is promoted — that one
lost nothing; `PSJob.collect` and every worker compare it), rolls the fit's tensors —
all of them, on every shard — back to the fit's newest checkpoint, restores the
small driver-side state stored in that checkpoint's manifest (solver scalars,
iteration, trees so far) and goes on from there. A fit whose model lives on the
driver between boundaries (GBT: trees; the PS holds only scratch histograms)
rewinds to its last boundary in memory instead and needs no checkpoint at all.

Checkpoints are taken at consistent points only (LR: an iteration boundary; GBT: a
tree boundary), every `interval` boundaries, when `spark.ps.checkpointDir` is set, and
at the next boundary when `PSContext.checkpoint()` is called during the fit.
"""

from __future__ import annotations

import copy
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from ps_server.checkpoint import read_manifest, sealed_versions

if TYPE_CHECKING:
    from spark_ps.ml._job import PSJob

__all__ = ["FitRecovery", "ShardRestarted", "MAX_RESTORES"]

log = logging.getLogger("spark_ps.recovery")

T = TypeVar("T")

#: A fit gives up after this many restores (a shard that keeps dying is not transient).
MAX_RESTORES = 5


class ShardRestarted(RuntimeError):
    """A PS shard restarted during a fit: results since the last check are suspect."""


class FitRecovery:
    """Checkpoints of one fit (`job`) and its rollback after a shard restart.

    `ps_state`: the fit's model lives on the PS between boundaries (LR), so a rollback
    needs a checkpoint; otherwise the last boundary's driver state is enough.
    `watch=False`: only checkpoint at boundaries, never roll back (GBT: its workers grow
    trees on their own, so a shard restart fails their rendezvous, the driver relaunches
    the barrier job and the new tasks resume from the trees the driver has read).
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
    ) -> None:
        self.job, self.ps, self.what = job, job.ps, what
        self._snapshot = snapshot  # a copy of the driver's state that later steps don't change
        self.uri = getattr(self.ps, "checkpoint_dir", "") or ""
        self.interval, self.ps_state = int(interval), ps_state
        self.restores = 0
        self.iteration = 0  # the last boundary reached
        self.saved: int | None = None  # the boundary of the newest checkpoint
        self.last: tuple[int, dict] | None = None  # (boundary, state) in memory
        if watch:
            job.restarts = self.ps.client.shard_restarts()

    @property
    def enabled(self) -> bool:
        return bool(self.uri) and self.interval > 0

    def boundary(self, iteration: int, state: Callable[[], dict]) -> None:
        """A consistent point: check the shards, keep the state, checkpoint when due."""
        self.job.check_shards()
        self.iteration = iteration
        if not self.ps_state:
            self.last = (iteration, self._snapshot(state()))
        requested = self.ps.take_checkpoint_request(self.uri)
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

    @property
    def _unit(self) -> str:
        return "iteration" if self.ps_state else "tree"

    def run(self, attempt: Callable[[dict | None], T]) -> T:
        """`attempt(resume)` until it finishes without a shard restart (at most
        MAX_RESTORES rollbacks); `resume` is None first, then the restored state."""
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

    def rollback(self, cause: BaseException) -> dict:
        """Bring the fit back to its newest consistent point; returns that state."""
        self.restores += 1
        client = self.ps.client
        t0 = time.perf_counter()
        restarts = client.shard_restarts()  # a restart during the restore: the next check
        if self.ps_state:
            version, iteration, state = self._newest_checkpoint(cause)
            client.restore(self.uri, version, prefix=f"{self.job.topic}/")
            where = f"checkpoint v{version} ({self.uri})"
        else:
            if self.last is None:
                raise RuntimeError(
                    f"{self.what}: a shard restarted before the first tree"
                ) from cause
            iteration, state = self.last[0], self._snapshot(self.last[1])
            where = "its last tree boundary"
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
        self.iteration, self.saved = iteration, iteration
        return state

    def _newest_checkpoint(self, cause: BaseException) -> tuple[int, int, dict]:
        topic = self.job.topic
        for version in reversed(sealed_versions(self.uri) if self.uri else []):
            fit = read_manifest(self.uri, version).get("fits", {}).get(topic)
            if fit is not None:
                return version, int(fit["iteration"]), fit["state"]
        hint = "" if self.enabled else " (set spark.ps.checkpointDir and checkpointInterval > 0)"
        raise RuntimeError(
            f"{self.what}: a PS shard restarted and lost this fit's tensors, and the fit has "
            f"no checkpoint to roll back to{hint}"
        ) from cause


def _short(error: BaseException, limit: int = 300) -> str:
    text = str(error)
    return text if len(text) <= limit else text[:limit] + "..."
