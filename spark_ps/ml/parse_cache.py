"""Parsed partitions kept on the executors: a second fit on the same cached DataFrame (a
param grid, CrossValidator's folds, a refit) skips the Arrow pass.

The first fit on a persisted DataFrame saves each partition's parse (the localized rows
its worker trains on) as ``.npy`` files in the executor's Spark local directory, which
Spark deletes with the executor; the driver remembers the parse once every partition
saved. A later fit with the same key starts its worker job on a one-column projection of
the same DataFrame (one null per row: Spark still schedules the tasks by the cached
blocks, the rows' JVM-to-Python transfer is a few bytes each, and the row count checks
the files) and maps the files copy-on-write. A partition whose files are not on its
executor (another host, evicted, a new executor) fails its task, and the worker job is
launched again reading the rows (:class:`spark_ps.ml._job.PSJob`).

The key is the application, the cached data's RDD (a re-cache after ``unpersist`` makes a
new one, so changed source files are read again), the fit's input plan (columns, casts,
partitioning) and the read's options. Only persisted inputs are saved: for anything else
Spark itself promises no stable rows. ``spark.ps.parseCache=false`` turns it off;
``spark.ps.parseCache.maxMB`` bounds the files per executor (oldest parses go first).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
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
    its input is not persisted or the cache is off."""
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


def persisted_input_key(dataset, *columns) -> str | None:
    """What identifies the rows a fit reads from `dataset` (its cached data's RDD, its plan,
    `columns`: the columns read and the partition count), or None if it is not persisted.
    The fit's own input plan is not hashed: the JVM bridge's packed rows make its
    semantic hash differ on every call."""
    try:
        found = dataset.sparkSession._jsparkSession.sharedState().cacheManager()
        found = found.lookupCachedData(dataset._jdf)
        if not found.isDefined():
            return None
        rdd = found.get().cachedRepresentation().cacheBuilder().cachedColumnBuffers().id()
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
    the task read, for :func:`load`'s check. False when there is no local directory or the
    parse exceeds the budget. The least recently used parses of other keys go first when
    the folder would exceed ``plan.max_bytes``."""
    root = _root()
    if root is None:
        return False
    arrays, meta = _arrays(state)
    size = sum(int(a.nbytes) for a in arrays.values())
    if size > plan.max_bytes:
        return False
    meta["rows_in"] = int(rows_in)
    final = os.path.join(root, plan.key, f"p{part}")
    if os.path.exists(os.path.join(final, "meta.json")):
        _touch(os.path.join(root, plan.key))
        return True
    _evict(root, plan.key, plan.max_bytes - size)
    tmp = os.path.join(root, plan.key, f".p{part}.{uuid.uuid4().hex[:8]}")
    os.makedirs(tmp)
    try:
        for name, arr in arrays.items():
            np.save(os.path.join(tmp, name + ".npy"), np.ascontiguousarray(arr))
        with open(os.path.join(tmp, "meta.json"), "w") as f:
            json.dump(meta, f)  # written last: a folder without it is incomplete
        os.rename(tmp, final)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        if os.path.exists(os.path.join(final, "meta.json")):  # another task saved it first
            return True
        log.warning("spark-ps: could not save partition %d's parse", part, exc_info=True)
        return False
    return True


def load(plan: ParsePlan, part: int, rows_in: int) -> dict:
    """Partition `part`'s saved parse as worker state; raises :class:`ParseCacheMiss` when
    it is not here or was saved for another row count."""
    root = _root()
    folder = os.path.join(root, plan.key, f"p{part}") if root else None
    try:
        if folder is None:
            raise FileNotFoundError("no Spark local directory")
        with open(os.path.join(folder, "meta.json")) as f:
            meta = json.load(f)

        def arr(name: str) -> np.ndarray | None:
            path = os.path.join(folder, name + ".npy")
            return np.load(path, mmap_mode="c") if os.path.exists(path) else None

        state: dict[str, Any] = dict(meta["numbers"])
        state.update({name: arr(name) for name in meta["arrays"]})
        for name, spec in meta["batches"].items():
            fields = {f: arr(f"{name}.{f}") for f in _BATCH_FIELDS[spec["kind"]]}
            if spec["kind"] == "dense":
                state[name] = DenseBatch(**fields)
            else:
                state[name] = CSRBatch(num_features=spec["num_features"], **fields)
        if any(v is None for v in state.values()):
            raise FileNotFoundError("an array file is missing")
    except (OSError, ValueError, KeyError) as e:
        raise ParseCacheMiss(
            f"partition {part}: its parsed rows are not on this executor ({e}); "
            "the worker job is launched again to read them"
        ) from e
    if meta["rows_in"] != rows_in:
        raise ParseCacheMiss(
            f"partition {part}: its saved parse has {meta['rows_in']} rows but the partition "
            f"has {rows_in}; the worker job is launched again to read them"
        )
    _touch(os.path.join(root, plan.key))
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
    """Delete the least recently used parses (not `keep`) until the rest fit `budget`."""
    try:
        entries = [e for e in os.scandir(root) if e.is_dir() and e.name != keep]
    except FileNotFoundError:
        return
    mine = _size(os.path.join(root, keep))
    entries.sort(key=lambda e: e.stat().st_mtime)
    sizes = [_size(e.path) for e in entries]
    total = mine + sum(sizes)
    for entry, size in zip(entries, sizes, strict=True):
        if total <= budget:
            break
        shutil.rmtree(entry.path, ignore_errors=True)
        total -= size
        log.info("spark-ps: dropped the saved parse %s (%d MB) for room", entry.name, size >> 20)
