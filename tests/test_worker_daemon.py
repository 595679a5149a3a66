"""Local-mode Python workers fork from spark_ps.worker_daemon, with spark-ps preloaded.

A real local[2] session: once a PSContext is attached, the next Python task is served by a
worker whose daemon has already imported the rounds and loaded the compiled kernels.
"""

from __future__ import annotations

import time

import pytest

from spark_ps.worker_daemon import MODULE


def test_workers_fork_from_the_preloaded_daemon(spark, spark_ps):
    def probe(_):  # a closure: pickled by value, imports nothing of spark-ps itself
        import sys

        rounds = "spark_ps.ml.gbt.rounds" in sys.modules
        kernels = sys.modules.get("spark_ps.ml.tree.kernels")
        compiled = bool(kernels and kernels.HAVE_JIT and kernels._hist_node_rows.signatures)
        return [(rounds, compiled)]

    conf = spark.sparkContext._jsc.sc().conf()
    deadline = time.monotonic() + 60
    while not conf.contains("spark.python.daemon.module") and time.monotonic() < deadline:
        time.sleep(0.1)  # PSContext installs it from a background thread
    assert conf.get("spark.python.daemon.module") == MODULE
    got = spark.sparkContext.parallelize([0, 1], 2).flatMap(probe).collect()
    assert got == [(True, True), (True, True)]


_FORKED_READ = """
import gc, json, os, sys
import pyarrow as pa
from spark_ps.worker_daemon import preload

preload()
frozen = gc.get_freeze_count()
with pa.ipc.open_stream(open(sys.argv[1], "rb").read()) as reader:
    batches = list(reader)
r, w = os.pipe()
if os.fork() == 0:  # a worker, as pyspark.daemon forks it
    try:  # a failure writes nothing: the parent then reads an empty answer
        from spark_ps.data import read_partition

        before = set(sys.modules)
        read = read_partition(batches, "features", label_col="label", dense_matrix=True)
        new = sorted(m for m in set(sys.modules) - before if not m.startswith("encodings"))
        os.write(w, json.dumps([new, read.n_rows, read.num_features]).encode())
    finally:
        os._exit(0)
os.close(w)
print(json.dumps({"frozen": frozen, "child": json.loads(os.read(r, 1 << 20))}))
"""


def test_a_forked_worker_reads_its_rows_without_importing(tmp_path):
    """The daemon's preload leaves nothing for a worker's first read to import: pyarrow's
    first ``to_numpy`` imports its compute module and pandas (~0.5 s per fresh worker)."""
    import json
    import subprocess
    import sys

    import numpy as np
    import pyarrow as pa

    X = np.arange(12.0).reshape(4, 3)
    packed = pa.array([row.tobytes() for row in X], pa.binary())
    batch = pa.record_batch([packed, pa.array([0.0, 1.0, 1.0, 0.0])], ["features", "label"])
    path = tmp_path / "rows.arrow"
    with pa.ipc.new_stream(str(path), batch.schema) as out:
        out.write_batch(batch)
    done = subprocess.run(
        [sys.executable, "-c", _FORKED_READ, str(path)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["child"] == [[], 4, 3]  # read every row, imported nothing
    assert got["frozen"] > 0  # the preloaded heap is out of the children's collections


_ZIP_IMPORTS = """
import importlib, json, sys, zipimport
sys.path.insert(0, sys.argv[1])
import zpkg.a  # imported from the zip, as Spark's workers import pyspark from pyspark.zip
from spark_ps.worker_daemon import preload

preload()
reads = []
_read = zipimport._read_directory
zipimport._read_directory = lambda path: reads.append(path) or _read(path)
sys.path.append(sys.argv[2])  # what a fresh worker's first task does (its files directory)
importlib.invalidate_caches()  # ... and then pyspark
import zpkg.b  # the zip still serves imports
print(json.dumps({"reads": len(reads), "b": zpkg.b.VALUE}))
"""


def test_a_fresh_workers_first_task_does_not_reread_zip_archives(tmp_path):
    """The daemon forgets its zipimporters: pyspark's invalidate_caches() in a fresh
    worker's first task made each re-read its archive (0.3-0.6 s per worker)."""
    import json
    import subprocess
    import sys
    import zipfile

    archive = tmp_path / "zpkg.zip"
    with zipfile.ZipFile(archive, "w") as z:
        z.writestr("zpkg/__init__.py", "")
        z.writestr("zpkg/a.py", "VALUE = 1\n")
        z.writestr("zpkg/b.py", "VALUE = 2\n")
    files = tmp_path / "files"
    files.mkdir()
    done = subprocess.run(
        [sys.executable, "-c", _ZIP_IMPORTS, str(archive), str(files)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {"reads": 0, "b": 2}


_LR_PRODUCTS = """
import json
import numpy as np, scipy.sparse
from spark_ps.data import CSRBatch
from spark_ps.worker_daemon import preload
from spark_ps.ml.lr import row_blocks
from spark_ps.ml.lr.objective import loss_and_grad

preload()
if row_blocks.kernels() is None:
    print(json.dumps(None))
    raise SystemExit
def counts():
    return [len(f.signatures) for pair in row_blocks._KERNELS[0] for f in pair]
loaded = counts()
X = scipy.sparse.random(50, 20, density=0.2, random_state=0, format="csr")
X.data[:] = 1.0  # hashed one-hot rows: the products that skip the values
keys, local = CSRBatch(X.indptr, X.indices, X.data, 20, np.arange(50) % 2 * 1.0, None).localize()
loss_and_grad(local, np.zeros(keys.size), 0.0, np.ones(keys.size), True)
print(json.dumps([loaded, counts()]))
"""


def test_the_preload_loads_the_lr_products_a_fit_calls():
    """A forked worker's first LR fit compiles nothing: the preload loaded the products
    with the argument types a fit passes (a fresh process's first load took ~1 s)."""
    import json
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", _LR_PRODUCTS], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout.strip().splitlines()[-1])
    if got is None:
        pytest.skip("without numba LR's products run in scipy")
    assert got == [[1, 1, 1, 1], [1, 1, 1, 1]]
