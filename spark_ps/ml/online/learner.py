"""OnlineLogisticRegression: FTRL-proximal LR on the PS, trained by a Structured Streaming query.

Per micro-batch the driver only launches: it sets the batch id as a local property and
collects the learning stream's task rows (a few KB); the tasks score, learn and push their
increments (:mod:`spark_ps.ml.online.worker`). It then commits the batch on the shards
(:mod:`ps_server.functions.online`): exactly once per batch id, recorded in a ledger that
PS checkpoints carry. A replayed batch id already in the ledger on every shard is skipped;
one in the ledger of some shards only (the driver died mid-commit) is committed on the
others from the contributions they still hold; any other replay recomputes and replaces
its contributions. Every ``psCheckpointInterval`` batches (default: every batch) the
model is snapshotted after the commit and before Spark logs the batch done, so a snapshot
is never behind the query's checkpointLocation: with ``spark.ps.checkpointDir`` set the
whole PS goes there; without it (an embedded loopback PS) only this model's tensors go to
a temp dir of the PSContext (``PSContext.recovery_dir``).

A shard that restarts (empty, or from an older checkpoint) is noticed by its restart count,
during a batch or between batches: the learner restores the model's tensors on every shard
from its newest snapshot (the state after the previous batch) and learns the batch again,
so a SIGKILLed shard costs one batch's work, not the fit. With ``psCheckpointInterval``
above 1 the snapshot may be older than batches Spark already logged: the batch then fails
with an error naming the batches lost.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import logging
import threading
import weakref
from typing import Any

import numpy as np
from pyspark import keyword_only
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery, StreamingQueryListener

from ps_server.checkpoint import latest_version
from spark_ps.context import PSContext
from spark_ps.ml._progress import Progress
from spark_ps.ml._recovery import MAX_RESTORES
from spark_ps.ml.base import _check_numeric, _check_values_col, _quote, features_kind
from spark_ps.ml.lr.model import LogisticRegressionModel
from spark_ps.ml.online.metrics import RunningMetrics, observed_metrics
from spark_ps.ml.online.model import LiveLogisticRegressionModel
from spark_ps.ml.online.params import _OnlineLogisticRegressionParams
from spark_ps.ml.online.worker import (
    BATCH_PROPERTY,
    FAULT_PROPERTY,
    STATS_SCHEMA,
    FTRLConfig,
    learn_partition,
)
from spark_ps.models import PSMatrix, PSVector

__all__ = ["OnlineLogisticRegression", "OBSERVATION"]

log = logging.getLogger("spark_ps.ml.online")

OBSERVATION = "spark_ps_online"  # name of the observed metrics in query.lastProgress
_PARTS_BITS = 20  # ledger value = query tag << 20 | number of parts committed


class OnlineLogisticRegression(_OnlineLogisticRegressionParams):
    """Online FTRL-proximal logistic regression whose model lives on the PS.

    >>> learner = OnlineLogisticRegression(alpha=0.1, l1=1.0, numFeatures=2**40)
    >>> query = learner.trainOn(stream_df, checkpointLocation="/ckpt/q")   # doctest: +SKIP
    >>> learner.latestModel().transform(test_df)                          # doctest: +SKIP
    """

    @keyword_only
    def __init__(
        self,
        *,
        alpha: float = 0.1,
        beta: float = 1.0,
        l1: float = 0.0,
        l2: float = 0.0,
        numFeatures: int = 2**40,
        batchSize: int = 256,
        featuresCol: str = "features",
        labelCol: str = "label",
        weightCol: str | None = None,
        featureValuesCol: str = "",
        fitIntercept: bool = True,
        modelName: str = "",
        psCheckpointInterval: int = 1,
    ) -> None:
        super().__init__()
        self.setParams(**self._input_kwargs)
        self._initial: LogisticRegressionModel | None = None
        self._cfg: FTRLConfig | None = None
        self._ledger: PSVector | None = None
        self._running = RunningMetrics()
        self._history: list[dict] = []
        self._committed = 0
        self._seen: int | None = None  # shard restart count the model's PS state matches
        self._progress: Progress | None = None  # this learner's curves on the status page

    @keyword_only
    def setParams(self, **kwargs: Any) -> OnlineLogisticRegression:
        """Sets Params (keyword arguments only)."""
        return self._set(**kwargs)

    def setAlpha(self, value: float) -> OnlineLogisticRegression:
        return self._set(alpha=value)

    def setL1(self, value: float) -> OnlineLogisticRegression:
        return self._set(l1=value)

    def setL2(self, value: float) -> OnlineLogisticRegression:
        return self._set(l2=value)

    def setModelName(self, value: str) -> OnlineLogisticRegression:
        return self._set(modelName=value)

    # ------------------------------------------------------------------ the PS model
    def _name(self) -> str:
        return self.getOrDefault("modelName") or self.uid

    def _config(self, ps: PSContext) -> FTRLConfig:
        """The FTRL config with its PS state tensor, created (or attached to) once."""
        if self._cfg is None:
            self._validate_params()
            get = self.getOrDefault
            dim = int(get("numFeatures")) + 1
            state = PSMatrix.sparse(
                2, dim, name=f"online/{self._name()}/state", context=ps, exist_ok=True
            )
            self._ledger = PSVector.sparse(
                name=f"online/{self._name()}/ledger", dtype="int64", context=ps, exist_ok=True
            )
            self._cfg = FTRLConfig(
                state=state,
                num_features=int(get("numFeatures")),
                alpha=float(get("alpha")),
                beta=float(get("beta")),
                l1=float(get("l1")),
                l2=float(get("l2")),
                fit_intercept=bool(get("fitIntercept")),
                batch_size=int(get("batchSize")),
                features_col=get("featuresCol"),
                label_col=get("labelCol"),
                weight_col=self._optional(self.weightCol),
                values_col=self._optional(self.featureValuesCol),
            )
            self._seen = ps.client.shard_restarts()
            self._first_snapshot(ps)
        return self._cfg

    def warmStart(self, model: LogisticRegressionModel) -> OnlineLogisticRegression:
        """Start the PS model from a batch-trained spark-ps model's weights, now.

        Only an empty PS model is seeded: a resumed model keeps what it learned. The weights
        become FTRL state with ``n = 0`` (so the first steps are of size ~alpha)."""
        if not isinstance(model, LogisticRegressionModel):
            raise TypeError(f"warmStart needs a spark-ps LogisticRegressionModel, got {model!r}")
        if model.numFeatures > self.getOrDefault("numFeatures"):
            raise ValueError(
                f"warm-start model has numFeatures={model.numFeatures} > this learner's "
                f"numFeatures={self.getOrDefault('numFeatures')}"
            )
        self._initial = model
        self._seed(PSContext.getOrCreate())
        return self

    def _seed(self, ps: PSContext) -> None:
        """Write the warm-start weights as FTRL state (n = 0) into an empty model."""
        cfg = self._config(ps)
        if self._initial is None or self.appliedBatches().size:
            return
        counts = ps.client.call("keyspace.count", [cfg.state.spec])
        if sum(r["count"] for r, _ in counts):
            return
        keys, w = self._initial.coefficientKeys, self._initial.coefficientValues
        keys, w = keys[w != 0], w[w != 0]
        z = -w * (cfg.beta / cfg.alpha + cfg.l2) - np.sign(w) * cfg.l1
        if cfg.fit_intercept:
            keys = np.append(keys, cfg.intercept_key)
            z = np.append(z, -self._initial.intercept * cfg.beta / cfg.alpha)
        cfg.state.update(keys, np.column_stack([z, np.zeros_like(z)]))
        log.info("warm start: %d weights from %s", keys.size, self._initial.uid)
        self._first_snapshot(ps, again=True)

    # ------------------------------------------------------------------ the stream
    def learningStream(self, dataset: DataFrame) -> DataFrame:
        """The per-task stats stream (``STATS_SCHEMA``) with its progressive metrics observed.

        Its rows are produced by tasks that learn; it must be run by :py:meth:`processBatch`
        (``trainOn`` does that). Column types are checked here, before any data moves.
        """
        if not isinstance(dataset, DataFrame):
            raise TypeError(f"dataset must be a DataFrame but got {type(dataset)}.")
        ps = PSContext.getOrCreate(dataset.sparkSession)
        cfg = self._config(ps)
        schema = dataset.schema
        kind = features_kind(schema, cfg.features_col)
        _check_numeric(schema, cfg.label_col, "labelCol")
        cols = [F.col(_quote(cfg.features_col))]
        cols.append(F.col(_quote(cfg.label_col)).cast("double").alias(cfg.label_col))
        if cfg.weight_col:
            _check_numeric(schema, cfg.weight_col, "weightCol")
            cols.append(F.col(_quote(cfg.weight_col)).cast("double").alias(cfg.weight_col))
        if cfg.values_col:
            _check_values_col(schema, cfg.values_col, kind)
            cols.append(F.col(_quote(cfg.values_col)))
        stats = dataset.select(*cols).mapInArrow(
            functools.partial(learn_partition, cfg), STATS_SCHEMA
        )
        return stats.observe(OBSERVATION, *observed_metrics())

    def trainOn(
        self,
        dataset: DataFrame,
        checkpointLocation: str,
        *,
        trigger: dict | None = None,
        queryName: str | None = None,
    ) -> StreamingQuery:
        """Start a query that learns from streaming ``dataset``; returns it running.

        ``trigger`` is passed to ``DataStreamWriter.trigger`` (e.g. ``{"once": True}``,
        ``{"availableNow": True}``, ``{"processingTime": "5 seconds"}``). Restart a stopped
        or failed query with the same ``checkpointLocation`` and ``modelName``.
        """
        writer = self.learningStream(dataset).writeStream.foreachBatch(self.processBatch)
        writer = writer.option("checkpointLocation", checkpointLocation)
        if trigger:
            writer = writer.trigger(**trigger)
        if queryName:
            writer = writer.queryName(queryName)
        ends = _EndsCurves(self, dataset.sparkSession)
        dataset.sparkSession.streams.addListener(ends)
        query = writer.start()
        ends.watch(query)
        return query

    # ------------------------------------------------------------------ per micro-batch
    def processBatch(self, batch: DataFrame, batch_id: int) -> None:
        """The ``foreachBatch`` function: learn from ``batch`` (a :py:meth:`learningStream`
        micro-batch) and commit it exactly once; a shard restart during it restores the
        model from its newest snapshot and learns the batch again."""
        ps = PSContext.getOrCreate(batch.sparkSession)
        self._config(ps)
        for attempt in range(MAX_RESTORES + 1):
            self._recover(ps)
            restarts = self._seen = ps.client.shard_restarts()
            kept = len(self._history), copy.deepcopy(self._running)
            try:
                return self._learn(ps, batch, int(batch_id), restarts)
            except SimulatedCrash:
                raise
            except Exception as e:
                if attempt == MAX_RESTORES or ps.client.shard_restarts() == restarts:
                    raise
                if not self._snapshot_uri(ps):
                    raise
                del self._history[kept[0] :]
                self._running = kept[1]
                log.warning(
                    "micro-batch %d of model %r: a PS shard restarted (%s); restoring the model "
                    "from its newest snapshot and learning the batch again",
                    batch_id,
                    self._name(),
                    str(e)[:300],
                )

    def _learn(self, ps: PSContext, batch: DataFrame, batch_id: int, restarts: int) -> None:
        """One attempt at a micro-batch: learn, commit, snapshot."""
        cfg = self._cfg
        sc = batch.sparkSession.sparkContext
        tag = _query_tag(sc.getLocalProperty("sql.streaming.queryId"))
        status, parts = self._status(int(batch_id), tag)
        if status == "applied":
            log.info("batch %d was already learned (replay after a restart): skipped", batch_id)
            return
        if status == "new":
            sc.setLocalProperty(BATCH_PROPERTY, str(int(batch_id)))
            sc.setLocalProperty(FAULT_PROPERTY, _CHAOS_TASK.pop(int(batch_id), None))
            try:
                rows = batch.collect()  # the learning job; a few KB per task come back
            except Exception:
                ps.client.call("online.discard", [cfg.state.spec], {"round": int(batch_id)})
                raise
            finally:
                sc.setLocalProperty(BATCH_PROPERTY, None)
                sc.setLocalProperty(FAULT_PROPERTY, None)
            parts = len(rows)
            own = self._running.add(rows)
            running = self._running.summary()
            self._history.append(
                {
                    "batchId": int(batch_id),
                    **own,
                    "runningLogloss": running["logloss"],
                    "runningAuc": running["auc"],
                }
            )
        _chaos("before_commit", batch_id)
        self._check_restarts(ps, restarts, int(batch_id))  # its contributions may be gone
        ps.client.call(
            "online.commit",
            [cfg.state.spec, self._ledger.spec],
            {"round": int(batch_id), "parts": parts, "tag": (tag << _PARTS_BITS) | parts},
        )
        self._check_restarts(ps, restarts, int(batch_id))  # one restarted during the commit
        self._committed += 1
        interval = int(self.getOrDefault("psCheckpointInterval"))
        if interval and self._committed % interval == 0:
            self._snapshot(ps, restarts)
        if status == "new":
            self._report(ps)
        _chaos("after_commit", batch_id)

    def _report(self, ps: PSContext) -> None:
        """The batch just committed, as a point of this learner's curves on the status page
        (its window metrics: the batch's progressive logloss, AUC and rows; and the running
        ones), in the ``spark_ps.progress`` log and, with ``spark.ps.logDir``, TensorBoard."""
        if self._progress is None or self._progress.client is not ps.client:
            name = f"spark-ps OnlineLogisticRegression ({self._name()})"
            self._progress = Progress(name, 0, unit="batch", client=ps.client, bar=False)
        h = self._history[-1]
        self._progress.update(
            len(self._history),
            **{
                "window logloss": h["logloss"],
                "window auc": h["auc"],
                "window rows": h["rows"],
                "running logloss": h["runningLogloss"],
                "running auc": h["runningAuc"],
            },
        )

    # ------------------------------------------------------------------ snapshots
    def _snapshot_uri(self, ps: PSContext) -> str:
        """Where the model's snapshots go: spark.ps.checkpointDir (the whole PS), else the
        context's recovery dir (this model only), else "" (none: see recovery_dir)."""
        if ps.checkpoint_dir:
            return ps.checkpoint_dir
        return ps.recovery_dir(f"online-{self._name()}") or ""

    def _prefix(self, ps: PSContext) -> str:
        return "" if ps.checkpoint_dir else f"online/{self._name()}/"

    def _first_snapshot(self, ps: PSContext, again: bool = False) -> None:
        """The model before any batch (or, `again`, as a warm start left it), unless a
        snapshot is there already: a shard restart before the first batch restores it."""
        uri = self._snapshot_uri(ps)
        if uri and (again or latest_version(uri) is None):
            self._snapshot(ps, self._seen)

    def _snapshot(self, ps: PSContext, restarts: int) -> None:
        """Snapshot the model (sealed only if no shard restarted since `restarts`)."""
        uri = self._snapshot_uri(ps)
        if uri:
            version = ps.next_version(uri)
            ps.client.checkpoint(uri, version, restarts=restarts, prefix=self._prefix(ps))

    def _recover(self, ps: PSContext) -> None:
        """If a shard restarted since the model's state was last known good, restore the
        model's tensors on every shard from its newest snapshot."""
        now = ps.client.shard_restarts()
        if self._seen is None or now == self._seen:
            return
        uri = self._snapshot_uri(ps)
        version = latest_version(uri) if uri else None
        if version is None:
            raise RuntimeError(
                f"a PS shard restarted (restart count {self._seen} -> {now}) and model "
                f"{self._name()!r} has no snapshot to restore (psCheckpointInterval=0, or a "
                "PS that is not embedded on loopback without spark.ps.checkpointDir): its "
                "weights on that shard are lost"
            )
        ps.client.restore(uri, version, prefix=f"online/{self._name()}/")
        ps.client.count("restore")
        log.warning("model %r: restored from snapshot v%d (%s)", self._name(), version, uri)
        self._seen = now

    def _check_restarts(self, ps: PSContext, before: int, batch_id: int) -> None:
        """Fail the batch if a shard restarted since it began. The shard came back from a
        checkpoint without this batch's pending contributions, and the commit (or the
        client's retry of it) then marked the batch applied there with nothing added: its
        updates on that shard's keys were silently lost. Failing leaves the batch unlogged
        by Spark, so a restore of the PS checkpoint and a restarted query learn it again."""
        now = ps.client.shard_restarts()
        if now != before:
            raise RuntimeError(
                f"a PS shard restarted during micro-batch {batch_id} of model {self._name()!r} "
                f"(restart count {before} -> {now}): it lost this batch's pending updates. "
                "Restore the PS from its newest checkpoint (PSContext.recover()) and restart "
                "the query from its checkpointLocation; the batch is then learned again"
            )

    def _ledger_rows(self) -> list[tuple[np.ndarray, np.ndarray]]:
        resp = self._ledger.client.call("online.applied", [self._ledger.spec])
        return [(arrays[0], arrays[1]) for _, arrays in resp]

    def _status(self, batch_id: int, tag: int) -> tuple[str, int]:
        """("applied" | "partial" | "new", parts) of ``batch_id`` from every shard's ledger
        (each shard sends its entry of this batch and its highest id, not its whole ledger)."""
        resp = self._ledger.client.call("online.applied", [self._ledger.spec], {"round": batch_id})
        shards = [(meta["latest"], tags) for meta, (_ids, tags) in resp]
        done = [int(tags[0]) for _, tags in shards if tags.size]
        others = {int(v) >> _PARTS_BITS for v in done}
        if done and tag and others - {tag}:
            raise RuntimeError(
                f"batch {batch_id} of model {self._name()!r} was learned by another streaming "
                "query; resume that query (same checkpointLocation) or use a new modelName"
            )
        if done:
            return ("applied" if len(done) == len(shards) else "partial"), done[0] & (
                (1 << _PARTS_BITS) - 1
            )
        latest = max((top for top, _ in shards if top is not None), default=None)
        if latest is not None and batch_id > latest + 1:
            raise RuntimeError(
                f"model {self._name()!r} has learned batches up to {latest} but the query is at "
                f"batch {batch_id}: batches {latest + 1}..{batch_id - 1} would be skipped (the "
                "PS was restored from a checkpoint older than the query's checkpointLocation)"
            )
        return "new", 0

    # ------------------------------------------------------------------ reading the model
    def appliedBatches(self) -> np.ndarray:
        """Batch ids committed on every shard (sorted), from the PS's ledger."""
        if self._ledger is None:
            self._config(PSContext.getOrCreate())
        shards = self._ledger_rows()
        common = functools.reduce(np.intersect1d, [ids for ids, _ in shards])
        return np.asarray(common, dtype=np.int64)

    def latestModel(self) -> LiveLogisticRegressionModel:
        """A transformer scoring with the live weights (read from the PS at transform time)."""
        cfg = self._config(PSContext.getOrCreate())
        model = LiveLogisticRegressionModel(cfg, recover=self._recover_now)
        model._set(featuresCol=cfg.features_col, labelCol=cfg.label_col)
        if cfg.values_col:
            model._set(featureValuesCol=cfg.values_col)
        return model

    def _recover_now(self) -> None:
        """Restore the model if a shard restarted since its state was last known good."""
        self._recover(PSContext.getOrCreate())

    def footprint(self) -> dict:
        """PS memory of the model: keys held (features seen + intercept) and bytes."""
        cfg = self._config(PSContext.getOrCreate())
        resp = cfg.state.client.call("online.footprint", [cfg.state.spec])
        return {
            "keys": sum(r["rows"] for r, _ in resp),
            "nbytes": sum(r["nbytes"] for r, _ in resp),
        }

    @property
    def history(self) -> list[dict]:
        """Per micro-batch learned by this learner object: batchId, rows, logloss and auc
        (progressive: scored before learning), runningLogloss, runningAuc."""
        return list(self._history)

    @property
    def metrics(self) -> dict:
        """Running progressive metrics over every batch this learner object learned."""
        return self._running.summary()

    def _end_curves(self) -> None:
        """Mark this learner's curves on the status page finished (a later batch, of a
        restarted query, starts new ones)."""
        if self._progress is not None:
            self._progress.close()
            self._progress = None

    def drop(self) -> None:
        """Remove the model's tensors from the PS (its curves on the status page end)."""
        self._end_curves()
        if self._cfg is not None:
            self._cfg.state.drop()
            self._ledger.drop()
            self._cfg = self._ledger = None


class _EndsCurves(StreamingQueryListener):
    """Ends a learner's curves on the status page when the query :py:meth:`trainOn`
    started terminates (stopped, finished or failed), then removes itself."""

    def __init__(self, learner: OnlineLogisticRegression, session) -> None:
        self._learner, self._session = weakref.ref(learner), session
        self._query: StreamingQuery | None = None
        self._lock = threading.Lock()

    def watch(self, query: StreamingQuery) -> None:
        with self._lock:
            self._query = query
        if not query.isActive:  # it ended before the listener knew its id
            self._end()

    def _end(self) -> None:
        learner = self._learner()
        if learner is not None:
            learner._end_curves()
        try:
            self._session.streams.removeListener(self)
        except Exception as e:  # noqa: BLE001 - a stopped session: nothing to remove
            log.debug("listener not removed: %s", e)

    def onQueryStarted(self, event) -> None:
        pass

    def onQueryProgress(self, event) -> None:
        pass

    def onQueryIdle(self, event) -> None:
        pass

    def onQueryTerminated(self, event) -> None:
        with self._lock:
            mine = self._query is not None and str(event.id) == self._query.id
        if mine:
            self._end()


def _query_tag(query_id: str | None) -> int:
    """A 31-bit tag of the streaming query's id (stable across restarts); 0 if unknown."""
    if not query_id:
        return 0
    return int(hashlib.sha1(query_id.encode()).hexdigest()[:8], 16) >> 1 or 1


_CHAOS: dict[str, int] = {}
_CHAOS_TASK: dict[int, str] = {}


class SimulatedCrash(RuntimeError):
    """Raised by the chaos hook: the driver 'dies' at a point of the commit protocol."""


def inject_crash(point: str, batch_id: int, *, part: int = 0, marker: str = "") -> None:
    """Chaos hook for tests: the next processBatch of ``batch_id`` fails at ``point``
    as if the driver died there ("before_commit": learned and pushed, not committed;
    "after_commit": committed, not logged by Spark), or with point "task", its task
    ``part`` dies once after pushing (``marker``: a file path recording the failure)."""
    if point == "task":
        _CHAOS_TASK[int(batch_id)] = f"{int(batch_id)}:{int(part)}:{marker}"
    else:
        _CHAOS[point] = int(batch_id)


def _chaos(point: str, batch_id: int) -> None:
    if _CHAOS.get(point) == int(batch_id):
        del _CHAOS[point]
        raise SimulatedCrash(f"simulated driver crash {point.replace('_', ' ')} {batch_id}")
