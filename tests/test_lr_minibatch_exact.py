"""The mini-batch solvers take exactly the step they promise: with one worker and one
mini-batch per epoch, `solver="sgd"` is plain gradient descent on MLlib's objective,
L2 term included, so its coefficients equal a numpy reference to rounding.

(Before this test, a solver that dropped the L2 term from its step passed every test:
they used regParam=0.001 and compared AUC within 0.02.) Real Spark, real PS."""

from __future__ import annotations

import numpy as np
import pytest
from pyspark.ml.linalg import Vectors

from spark_ps.ml.classification import LogisticRegression

pytestmark = pytest.mark.timeout(300)


def _gradient_descent(X, y, steps: int, rate: float, l2: float) -> np.ndarray:
    w = np.zeros(X.shape[1])
    for _ in range(steps):
        p = 1.0 / (1.0 + np.exp(-(X @ w)))
        w = w - rate * (X.T @ (p - y) / len(y) + l2 * w)
    return w


@pytest.mark.parametrize("reg", [0.0, 0.3])
def test_sgd_with_one_batch_per_epoch_is_gradient_descent_with_its_l2_term(spark_ps, reg):
    spark, _ = spark_ps
    rng = np.random.default_rng(4)
    X = rng.normal(size=(300, 4))
    y = (X @ np.array([1.5, -2.0, 0.5, 0.0]) + rng.normal(size=300) > 0).astype(float)
    df = spark.createDataFrame(
        [(float(y[i]), Vectors.dense(X[i])) for i in range(len(y))], ["label", "features"]
    ).repartition(1)
    lr = LogisticRegression(
        solver="sgd",
        maxIter=4,
        tol=0.0,
        stepSize=0.5,
        regParam=reg,
        elasticNetParam=0.0,
        fitIntercept=False,
        standardization=False,
        batchSize=10_000,
        numWorkers=1,
    )
    got = lr.fit(df).coefficients.toArray()
    want = _gradient_descent(X, y, steps=4, rate=0.5, l2=reg)
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12)
    if reg:  # the L2 term moved the answer well beyond the tolerance
        assert np.abs(want - _gradient_descent(X, y, 4, 0.5, 0.0)).max() > 1e-3
