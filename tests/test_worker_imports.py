"""A Spark task's Python worker loads only what the boosting and gradient rounds run.

Spark stops idle Python workers after 60 s, so a fit after a pause starts fresh ones; each
paid ~1 s importing ``pyspark.ml`` (and pandas through ``pyspark.ml.functions``) because the
rounds lived beside the estimators. These tests pickle the very function a fit's barrier
job runs, as Spark does, and load it in a fresh interpreter.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from pyspark import cloudpickle

from spark_ps.ml._job import run_worker_loop
from spark_ps.ml.base import PreparedData

_LOAD = """
import sys
import pyspark.worker  # what Spark's daemon has loaded before it forks a worker
from pyspark import cloudpickle
with open(sys.argv[1], "rb") as f:
    cloudpickle.load(f)
heavy = sorted(m for m in ("pyspark.ml", "pandas") if m in sys.modules)  # (numba brings scipy)
print(",".join(heavy))
"""


def _rounds(kind: str):
    if kind == "gbt":
        from spark_ps.ml.gbt.rounds import HANDLERS, setup_rows

        return setup_rows, HANDLERS
    if kind == "linear":
        from spark_ps.ml.linear.rounds import HANDLERS
        from spark_ps.ml.lr.rounds import setup_rows

        return setup_rows, HANDLERS
    from spark_ps.ml.lr.rounds import HANDLERS, setup_rows

    return setup_rows, HANDLERS


@pytest.mark.parametrize("kind", ["gbt", "lr", "linear"])
def test_worker_function_loads_without_pyspark_ml(kind, tmp_path):
    setup_rows, handlers = _rounds(kind)
    prepared = PreparedData(None, "features", "label", None, None, "vector", 2)
    fn = run_worker_loop("127.0.0.1:1", "token", "job-x", setup_rows(prepared), handlers)
    path = tmp_path / "task.pkl"
    path.write_bytes(cloudpickle.dumps(fn))
    out = subprocess.run(
        [sys.executable, "-c", _LOAD, str(path)], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "", f"a worker loading the {kind} rounds imported {out.stdout}"


def test_estimators_still_import_from_the_package():
    import spark_ps.ml.gbt as gbt

    assert gbt.GBTClassifier.__module__ == "spark_ps.ml.gbt.estimator"
    assert "GBTRegressionModel" in dir(gbt)
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        gbt.Nope  # noqa: B018
