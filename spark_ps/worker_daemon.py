"""Spark's Python daemon with spark-ps's worker code loaded before it forks any worker.

Why: Spark forks each Python worker from one daemon process per executor and stops a worker
that has been idle for 60 s (hard-coded in ``PythonWorkerFactory``). A fresh worker then paid
for its imports (numpy, pyarrow, grpc, the spark-ps rounds) and for loading the compiled tree
kernels from numba's cache: ~2-3 s of CPU at the start of every fit that follows a pause,
on the cores the fit needs. Loaded once in the daemon, every forked worker has them.

``python -m spark_ps.worker_daemon`` preloads, then runs ``pyspark.daemon``'s manager
unchanged. :func:`install` points a local-mode SparkContext at it (``PSContext`` calls it;
``spark.ps.workerDaemon=false`` opts out). On a cluster, set
``spark.python.daemon.module=spark_ps.worker_daemon`` where spark-ps is installed on the
executors. The preload keeps no thread running: the daemon forks.
"""

from __future__ import annotations

import gc
import logging
import subprocess

__all__ = ["MODULE", "forget_zip_importers", "install", "preload"]

log = logging.getLogger("spark_ps")

MODULE = "spark_ps.worker_daemon"
_KEY = "spark.python.daemon.module"
# Finds this module without importing the package (~30 ms; importing it takes ~1 s).
_FIND = (
    "import importlib.util as u, os, sys; s = u.find_spec('spark_ps'); "
    "sys.exit(not (s and any(os.path.exists(os.path.join(d, 'worker_daemon.py')) "
    "for d in s.submodule_search_locations or ())))"
)


def preload() -> None:
    """Import what the workers' rounds use and load the compiled kernels (synchronously)."""
    import numpy  # noqa: F401
    import pyarrow as pa

    import spark_ps.ml.gbt.rounds  # noqa: F401
    import spark_ps.ml.lr.rounds  # noqa: F401
    from spark_ps.ml.lr import row_blocks, stats_pass
    from spark_ps.ml.tree import kernels

    # (no keep_freed_memory(): the user's own UDF workers fork from here too; spark-ps
    # tasks set their buffer policy when they start)
    if kernels.HAVE_JIT:
        kernels._warm()
    row_blocks.warm_up()  # LR's products (unit-valued rows take them on one thread too)
    stats_pass.warm_up()  # the linear models' per-key statistics
    import pyspark.worker  # noqa: F401 - the daemon imports it in each child, after fork

    # pyarrow imports its compute module, and pandas if installed, at the first to_numpy():
    # ~0.4-0.6 s in every fresh worker's first read of its rows (measured). Neither starts
    # a thread.
    pa.Array.from_buffers(pa.float64(), 1, [None, pa.py_buffer(bytes(8))]).to_numpy()
    forget_zip_importers()
    gc.freeze()  # no child's collection walks (and so copies) the preloaded heap


def forget_zip_importers() -> int:
    """Drop the zip archives' importers from ``sys.path_importer_cache``; how many.

    Why: a fresh worker's first task puts Spark's files directory on ``sys.path``, and
    pyspark then calls ``importlib.invalidate_caches()``. On Python 3.11 that makes every
    cached zipimporter re-read its archive's directory in pure Python: Spark's workers
    import pyspark from ``pyspark.zip``, 14 importers of its 1,485 entries, 0.3-0.6 s
    of every fresh worker (py-spy; a fit after a minute's pause paid it twice, on the
    cores the fit needs). An import from the zip after this makes a new importer from
    zipimport's own directory cache, without reading the archive again.
    """
    import sys
    import zipimport

    zips = [k for k, v in sys.path_importer_cache.items() if isinstance(v, zipimport.zipimporter)]
    for path in zips:
        del sys.path_importer_cache[path]
    return len(zips)


def install(sc) -> bool:
    """Have `sc`'s Python workers fork from this daemon: local masters only (their workers
    belong to the driver's JVM, whose live conf the next Python task reads), and only when
    nobody chose a daemon module and the workers' Python can import this one. True if set."""
    master = sc.master or ""
    if not master.startswith("local") or master.startswith("local-cluster"):
        return False
    jconf = sc._jsc.sc().conf()  # the live SparkConf, shared with the driver's SparkEnv
    if jconf.contains(_KEY) or jconf.get("spark.python.use.daemon", "true") != "true":
        return False
    python = sc.pythonExec or "python3"
    try:
        ok = subprocess.run([python, "-c", _FIND], capture_output=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        log.info("spark-ps worker daemon not used: %s cannot run (%s)", python, e)
        return False
    if ok.returncode != 0:
        log.info("spark-ps worker daemon not used: %s cannot import %s", python, MODULE)
        return False
    jconf.set(_KEY, MODULE)
    return True


if __name__ == "__main__":
    try:
        preload()
    except Exception:  # noqa: BLE001 - a worker imports what it needs anyway
        logging.getLogger("spark_ps").exception("spark-ps worker daemon: preload failed")
    from pyspark.daemon import manager

    manager()
