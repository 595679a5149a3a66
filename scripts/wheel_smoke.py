"""Run by scripts/wheel_check.sh inside a fresh venv holding only the installed wheel."""

import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
from pyspark.ml.linalg import Vectors
from pyspark.sql import SparkSession

import spark_ps

assert "site-packages" in spark_ps.__file__, f"spark_ps imported from {spark_ps.__file__}"
assert spark_ps.jar_path().is_file(), f"no bridge jar at {spark_ps.jar_path()}"
assert shutil.which("gradle") is None, "gradle is on PATH: the check proves nothing"
server = shutil.which("spark-ps-server")
assert server, "spark-ps-server is not on PATH"
subprocess.run([server, "--help"], check=True, capture_output=True)

from spark_ps.ml.classification import LogisticRegression  # noqa: E402

spark = SparkSession.builder.master("local[2]").appName("wheel check").getOrCreate()
rng = np.random.default_rng(0)
X = rng.normal(size=(400, 5))
y = (X @ np.array([1.0, -2.0, 0.5, 0.0, 1.5]) + rng.normal(size=400) > 0).astype(float)
df = spark.createDataFrame(
    [(float(t), Vectors.dense(r)) for t, r in zip(y, X, strict=True)], ["label", "features"]
)
model = LogisticRegression(maxIter=50).fit(df)
genuine = model.toMLlib()  # needs the jar from the wheel on the JVM's class path
ours = np.array([r.probability[1] for r in model.transform(df).collect()])
theirs = np.array([r.probability[1] for r in genuine.transform(df).collect()])
assert np.allclose(ours, theirs, atol=1e-9), "exported model scores differently"
print(f"wheel: fit + export ok (train AUC {model.summary.areaUnderROC:.4f})", flush=True)
spark.stop()

data = Path(sys.argv[1])
if data.is_file():
    cmd = [sys.executable, "-m", "spark_ps.examples.flights_lr", "--data", str(data)]
    subprocess.run([*cmd, "--fraction", "0.01", "--max-iter", "5"], check=True)
else:
    print(f"wheel: {data} absent, flights example skipped")
