"""Parsed partitions kept on the executors: a second fit on the same cached DataFrame (a
refit with other Params, a param grid within a CrossValidator fold) skips the Arrow pass.

The first fit on a persisted DataFrame saves each partition's parse (the localized rows
its worker trains on) as ``.npy`` files in the executor's Spark local directory, which
Spark removes when the executor stops; the driver remembers the parse once every
partition saved. A later fit with the same key starts its worker job on a one-column
projection of the same DataFrame (one null per row: Spark still schedules the tasks by
the cached blocks, the rows' JVM-to-Python transfer is a few bytes each, and the row
count checks the files) and maps the files copy-on-write. A partition whose files are
not on its executor (another host, evicted, a new executor) or are damaged fails its
task, and the worker job is launched again reading the rows
(:class:`spark_ps.ml._job.PSJob`).

The key is the application, the cached data's RDD (a re-cache after ``unpersist`` makes a
new one, so changed source files are read again), its plan, the columns read, the
partition count and the read's options (:func:`persisted_input_key` says what is never
saved). ``spark.ps.parseCache=false`` turns it off; ``spark.ps.parseCache.maxMB`` bounds
the files per executor (the least recently used go first).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import time
import uuid
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from spark_ps.data import CSRBatch, DenseBatch

__all__ = ["ParsePlan", "ParseCacheMiss", "plan_parse", "MARKER"]

log = logging.getLogger("spark_ps.parse_cache")

#: The one column of a worker job that reads saved parses.
MARKER = "__spark_ps_parsed__"
#: Bumped when what is saved changes, so that older files are never read.
FORMAT = 1
_ENABLED = "spark.ps.parseCache"
_MAX_MB = "spark.ps.parseCache.maxMB"
DEFAULT_MAX_MB = 8192
_DIR = "spark-ps-parsed"
#: The driver's record of parses every partition saved (keys carry the application id).
_SAVED: set[str] = set()


class ParseCacheMiss(RuntimeError):
    """A partition's saved parse is not on the executor its task runs on."""


@dataclass
class ParsePlan:
    """What a fit's workers do with saved parses: save theirs (``read`` False) or read them
    (``read`` True, the worker job's input being :meth:`marker_df`)."""

    key: str
    max_bytes: int
    read: bool = False

    def marker_df(self, df):
        """`df` reduced to one null per row, for a job that reads saved parses."""
        from pyspark.sql import functions as F

        return df.select(F.lit(None).cast("boolean").alias(MARKER))

    def saved(self, parts_saved: list[bool]) -> None:
        """The job ended: remember the parse if every partition saved (or read) it."""
        if parts_saved and all(parts_saved):
            _SAVED.add(self.key)

    def missed(self) -> None:
        """A partition's files were gone: forget the parse (the re-read saves it again)."""
        _SAVED.discard(self.key)
        self.read = False


def plan_parse(prepared, options: str) -> ParsePlan | None:
    """The parse plan of a fit on `prepared` (a :class:`~spark_ps.ml.base.PreparedData`)
    whose read takes `options` (the read's own settings, e.g. ``"dense"``), or None when
    its input has no key (:func:`persisted_input_key`) or the cache is off."""
    if prepared.input_key is None:
        return None
    spark = prepared.df.sparkSession
    try:
        conf = spark.conf
        if str(conf.get(_ENABLED, "true")).strip().lower() == "false":
            return None
        max_mb = float(conf.get(_MAX_MB, str(DEFAULT_MAX_MB)))
        app = spark.sparkContext.applicationId
    except Exception:  # noqa: BLE001 - an optimisation: the fit reads its rows
        log.debug("spark-ps: no parse cache for this fit", exc_info=True)
        return None
    text = f"{FORMAT}|{app}|{prepared.input_key}|{options}"
    key = hashlib.sha1(text.encode()).hexdigest()[:20]
    return ParsePlan(key, int(max_mb * 2**20), read=key in _SAVED)


def persisted_input_key(dataset, repartitioned: bool, *columns) -> str | None:
    """What identifies the rows a fit reads from `dataset` (its cached data's RDD, its plan,
    `columns`: the columns read and the partition count), or None when no parse should be
    saved: the cache is off, `dataset` is not persisted, it is kept in memory only and its
    plan is not repeatable (a dropped block recomputed could hold other rows), or the fit
    repartitions it on a cluster (the worker tasks then run where the shuffle put them,
    not where the parses are). The fit's own input plan is not hashed: the JVM bridge's
    packed rows make its semantic hash differ on every call."""
    try:
        spark = dataset.sparkSession
        if str(spark.conf.get(_ENABLED, "true")).strip().lower() == "false":
            return None
        master = spark.sparkContext.master
        if repartitioned and not (master == "local" or master.startswith("local[")):
            return None
        found = spark._jsparkSession.sharedState().cacheManager()
        found = found.lookupCachedData(dataset._jdf)
        if not found.isDefined():
            return None
        builder = found.get().cachedRepresentation().cacheBuilder()
        # a block that spills to disk is recomputed only when its executor, and the parses
        # saved there, are lost; one kept in memory alone may be dropped and recomputed,
        # with other rows unless the plan repeats (no shuffle, no rand: not CrossValidator's
        # folds)
        if not (builder.storageLevel().useDisk() or builder.isCachedPlanRepeatable()):
            return None
        rdd = builder.cachedColumnBuffers().id()
        return "|".join(map(str, (rdd, dataset.semanticHash(), *columns)))
    except Exception:  # noqa: BLE001 - another Spark's internals: no parse cache
        log.debug("spark-ps: could not look up the cached data", exc_info=True)
        return None


# --------------------------------------------------------------------- executor side


def _root() -> str | None:
    """This executor's folder of saved parses (inside its Spark local directory)."""
    dirs = [d for d in os.environ.get("SPARK_LOCAL_DIRS", "").split(",") if d]
    return os.path.join(dirs[0], _DIR) if dirs else None


#: the arrays of each kind of batch, as saved
_BATCH_FIELDS = {
    "csr": ("indptr", "indices", "values", "labels", "weights"),
    "dense": ("matrix", "labels", "weights"),
}


def _arrays(state: dict) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """The files and the metadata that rebuild `state`: arrays, batches and numbers."""
    arrays: dict[str, np.ndarray] = {}
    meta: dict[str, Any] = {"numbers": {}, "arrays": [], "batches": {}}
    for name, value in state.items():
        if isinstance(value, np.ndarray):
            arrays[name] = value
            meta["arrays"].append(name)
        elif isinstance(value, (CSRBatch, DenseBatch)):
            kind = "dense" if isinstance(value, DenseBatch) else "csr"
            meta["batches"][name] = {"kind": kind, "num_features": int(value.num_features)}
            for f in _BATCH_FIELDS[kind]:
                arr = getattr(value, f)
                if arr is not None:
                    arrays[f"{name}.{f}"] = arr
        elif isinstance(value, (bool, int, float, np.integer, np.floating)):
            meta["numbers"][name] = value.item() if isinstance(value, np.generic) else value
        else:
            raise TypeError(f"cannot save {name!r} ({type(value).__name__}) with a parse")
    return arrays, meta


def save(plan: ParsePlan, part: int, state: dict, rows_in: int) -> bool:
    """Save partition `part`'s parse under `plan`'s key: `state` holds what its worker keeps
    of the read (numpy arrays, CSRBatch/DenseBatch, numbers); `rows_in` counts the rows
    the task read, for :func:`load`'s check. The least recently used parses of other keys
    go first when the folder would exceed ``plan.max_bytes``. False (never an error: the
    fit does not need it) when there is no local directory, the parse does not fit the
    budget or the disk, or writing failed."""
    root = _root()
    if root is None:
        return False
    try:
        return _save(root, plan, part, state, rows_in)
    except Exception:  # noqa: BLE001 - only a speed-up for a later fit
        log.warning("spark-ps: could not save partition %d's parse", part, exc_info=True)
        return False


def _save(root: str, plan: ParsePlan, part: int, state: dict, rows_in: int) -> bool:
    arrays, meta = _arrays(state)
    meta.update(rows_in=int(rows_in), files=sorted(arrays))
    size = sum(int(a.nbytes) for a in arrays.values())
    key_dir = os.path.join(root, plan.key)
    final = os.path.join(key_dir, f"p{part}")
    if _complete(final, rows_in):  # saved by an earlier fit (or a concurrent one)
        _touch(key_dir)
        return True
    shutil.rmtree(final, ignore_errors=True)  # damaged: saved again
    _sweep(root, key_dir, part)
    mine = _size(key_dir)
    if mine + size > plan.max_bytes:
        return False
    os.makedirs(root, exist_ok=True)
    if shutil.disk_usage(root).free < 2 * size + _FREE_MARGIN:
        return False  # shuffle and spill files need the space more
    _evict(root, plan.key, plan.max_bytes - mine - size)
    tmp = os.path.join(key_dir, f".p{part}.{uuid.uuid4().hex[:8]}")
    os.makedirs(tmp)
    try:
        for name, arr in arrays.items():
            np.save(os.path.join(tmp, name + ".npy"), np.ascontiguousarray(arr))
        with open(os.path.join(tmp, "meta.json"), "w") as f:
            json.dump(meta, f)  # written last: a folder without it is incomplete
        os.rename(tmp, final)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        if _complete(final, rows_in):  # another task saved it first
            return True
        raise
    return True


#: Free disk space a save leaves beyond twice its own size.
_FREE_MARGIN = 1 << 30
#: A temporary folder this old was left by a task killed while it saved or evicted.
STALE_SECONDS = 600.0


def _sweep(root: str, key_dir: str, part: int) -> None:
    """Remove what killed tasks left: this partition's unfinished saves under `key_dir`
    and half-deleted evictions under `root`, once older than :data:`STALE_SECONDS` (a
    younger one may be a save or eviction in progress, of a task running now). They
    would hold disk space until the executor stops, and count against the budget."""
    cutoff = time.time() - STALE_SECONDS
    for folder, prefix in ((key_dir, f".p{part}."), (root, ".trash-")):
        try:
            entries = list(os.scandir(folder))
        except OSError:  # no such folder yet
            continue
        for e in entries:
            try:
                if e.name.startswith(prefix) and e.stat().st_mtime < cutoff:
                    shutil.rmtree(e.path, ignore_errors=True)
                    log.info("spark-ps: removed %s, left by a killed task", e.path)
            except OSError:  # removed by another task meanwhile
                continue


def _complete(folder: str, rows_in: int) -> bool:
    """Does `folder` hold a whole parse of `rows_in` rows (every file its metadata lists)?"""
    try:
        with open(os.path.join(folder, "meta.json")) as f:
            meta = json.load(f)
        names = meta["files"]
        return meta["rows_in"] == rows_in and all(
            os.path.exists(os.path.join(folder, n + ".npy")) for n in names
        )
    except (OSError, ValueError, KeyError, TypeError):
        return False


def load(plan: ParsePlan, part: int, rows_in: int) -> dict:
    """Partition `part`'s saved parse as worker state; raises :class:`ParseCacheMiss` when
    it is not here, is incomplete, or was saved for another row count (a damaged folder
    is removed: the relaunch that reads the rows saves it again)."""
    root = _root()
    folder = os.path.join(root, plan.key, f"p{part}") if root else None
    try:
        if folder is None:
            raise FileNotFoundError("no Spark local directory")
        state = _load(folder, rows_in)
    except Exception as e:  # noqa: BLE001 - whatever is wrong with the files: read the rows
        if folder is not None and os.path.isdir(folder):  # damaged or stale (saves rename
            shutil.rmtree(folder, ignore_errors=True)  # whole folders in: never half of one)
        raise ParseCacheMiss(
            f"partition {part}: its saved parse is not usable on this executor ({e}); "
            "the worker job is launched again to read its rows"
        ) from e
    _touch(os.path.join(root, plan.key))
    return state


def _load(folder: str, rows_in: int) -> dict:
    with open(os.path.join(folder, "meta.json")) as f:
        meta = json.load(f)
    if meta["rows_in"] != rows_in:
        raise ValueError(f"it has {meta['rows_in']} rows but the partition has {rows_in}")
    # every listed file, mapped before anything is built: a missing one is a miss, never a
    # batch without its weights
    files = {n: np.load(os.path.join(folder, n + ".npy"), mmap_mode="c") for n in meta["files"]}
    state: dict[str, Any] = dict(meta["numbers"])
    state.update({name: files[name] for name in meta["arrays"]})
    for name, spec in meta["batches"].items():
        fields = {f: files.get(f"{name}.{f}") for f in _BATCH_FIELDS[spec["kind"]]}
        if spec["kind"] == "dense":
            state[name] = DenseBatch(**fields)
        else:
            state[name] = CSRBatch(num_features=spec["num_features"], **fields)
    return state


def count_rows(batches) -> int:
    """Rows of a marker job's partition (see :meth:`ParsePlan.marker_df`)."""
    return sum(b.num_rows for b in batches)


def is_marker(schema: pa.Schema) -> bool:
    """Is this the input of a job that reads saved parses?"""
    return schema.names == [MARKER]


def _touch(path: str) -> None:
    try:
        os.utime(path)
    except OSError:
        pass


def _size(path: str) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.path.getsize(os.path.join(dirpath, name))
            except OSError:
                pass
    return total


def _evict(root: str, keep: str, budget: int) -> None:
    """Delete the least recently used parses (not `keep`) until the rest fit `budget`. A
    parse is renamed away before it is deleted, so that no task maps half of one."""
    entries = []
    for e in os.scandir(root):
        try:
            if e.is_dir() and e.name != keep and not e.name.startswith("."):
                entries.append((e.stat().st_mtime, e.path, _size(e.path)))
        except OSError:  # another task on this executor removed it meanwhile
            continue
    total = sum(size for _, _, size in entries)
    for _, path, size in sorted(entries):
        if total <= budget:
            break
        trash = os.path.join(root, f".trash-{uuid.uuid4().hex[:8]}")
        try:
            os.rename(path, trash)
        except OSError:
            continue
        _touch(trash)  # a rename keeps the old mtime: now _sweep sees an eviction under way
        shutil.rmtree(trash, ignore_errors=True)
        total -= size
        log.info("spark-ps: dropped a saved parse (%d MB) for room", size >> 20)
