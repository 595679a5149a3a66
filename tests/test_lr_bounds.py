"""Bound-constrained binomial LR (L-BFGS-B, as MLlib) against MLlib on the same data."""

from __future__ import annotations

import numpy as np
import pytest
from pyspark.ml import classification as mllib
from pyspark.ml.linalg import Matrices, Vectors

from spark_ps.ml.classification import LogisticRegression, LogisticRegressionModel


@pytest.fixture(scope="module")
def tiny(spark):
    """pyspark's own bound-constrained LR example data (four weighted rows)."""
    return spark.createDataFrame(
        [
            (1.0, 1.0, Vectors.dense(0.0, 5.0)),
            (0.0, 2.0, Vectors.dense(1.0, 2.0)),
            (1.0, 3.0, Vectors.dense(2.0, 1.0)),
            (0.0, 4.0, Vectors.dense(3.0, 3.0)),
        ],
        ["label", "weight", "features"],
    )


@pytest.fixture(scope="module")
def wide(spark):
    """600 rows, 6 features of different scales (one constant), a logistic label."""
    rng = np.random.default_rng(4)
    X = rng.normal(size=(600, 6)) * np.array([1.0, 3.0, 0.5, 2.0, 1.0, 0.0]) + 0.7
    margin = X @ np.array([1.5, -0.8, 2.0, 0.3, -1.2, 0.0]) - 0.4
    y = (rng.random(600) < 1 / (1 + np.exp(-margin))).astype(float)
    w = rng.uniform(0.5, 2.0, size=600)
    rows = [(float(y[i]), float(w[i]), Vectors.dense(X[i])) for i in range(600)]
    return spark.createDataFrame(rows, ["label", "weight", "features"]).cache()


def _same_optimum(ours, theirs) -> None:
    """Both solvers stop on a relative objective change of tol=1e-6, so the coefficients
    agree to 1e-4 of their scale (the largest one, so that small ones are held to the same
    absolute error), and our objective is no worse than MLlib's."""
    a, b = ours.coefficients.toArray(), theirs.coefficients.toArray()
    scale = max(1e-1, np.abs(b).max())
    np.testing.assert_allclose(a, b, rtol=0, atol=1e-4 * scale)
    assert abs(ours.intercept - theirs.intercept) <= 1e-4 * max(scale, abs(theirs.intercept))
    f1, f2 = ours.summary.objectiveHistory[-1], theirs.summary.objectiveHistory[-1]
    assert f1 <= f2 + 1e-8 * abs(f2), (f1, f2)


def _both(df, **params):
    ours = LogisticRegression(**params).fit(df)
    theirs = mllib.LogisticRegression(**params).fit(df)
    return ours, theirs


def test_pyspark_unit_test_example(tiny, tmp_path):
    """pyspark's test_binomial_logistic_regression_with_bound, in our words: the intercept
    sits on its upper bound 0, the coefficients on MLlib's values."""
    params = dict(
        regParam=0.01,
        weightCol="weight",
        lowerBoundsOnCoefficients=Matrices.dense(1, 2, [-1.0, -1.0]),
        upperBoundsOnIntercepts=Vectors.dense(0.0),
    )
    ours, theirs = _both(tiny, **params)
    np.testing.assert_allclose(ours.coefficients.toArray(), [-0.2944, -0.0484], atol=1e-4)
    _same_optimum(ours, theirs)
    assert ours.intercept <= 0.0 and abs(ours.intercept - theirs.intercept) < 1e-6
    ours.save(str(tmp_path / "m"))
    back = LogisticRegressionModel.load(str(tmp_path / "m"))
    assert back.coefficients == ours.coefficients and back.intercept == ours.intercept
    assert back.getLowerBoundsOnCoefficients() == params["lowerBoundsOnCoefficients"]


@pytest.mark.parametrize(
    "params",
    [
        # active lower and upper coefficient bounds, L2, standardized
        dict(
            regParam=0.01,
            lowerBoundsOnCoefficients=Matrices.dense(1, 6, [0.0, -0.5, -9, -9, -9, -9]),
            upperBoundsOnCoefficients=Matrices.dense(1, 6, [9, 9, 1.0, 9, 0.0, 9]),
        ),
        # the same without standardization, weighted, no regularization
        dict(
            weightCol="weight",
            standardization=False,
            lowerBoundsOnCoefficients=Matrices.dense(1, 6, [0.0, -0.5, -9, -9, -9, -9]),
            upperBoundsOnCoefficients=Matrices.dense(1, 6, [9, 9, 1.0, 9, 0.0, 9]),
        ),
        # a bounded intercept (no centering) with coefficient bounds that do not bind
        dict(
            regParam=0.05,
            lowerBoundsOnIntercepts=Vectors.dense(0.5),
            upperBoundsOnCoefficients=Matrices.dense(1, 6, [5.0] * 6),
        ),
        # bounds without an intercept
        dict(fitIntercept=False, upperBoundsOnCoefficients=Matrices.dense(1, 6, [0.2] * 6)),
    ],
    ids=["coef-box", "unstandardized-weighted", "intercept-bound", "no-intercept"],
)
def test_same_optimum_as_mllib(wide, params):
    ours, theirs = _both(wide, **params)
    _same_optimum(ours, theirs)
    a = ours.coefficients.toArray()
    lo = params.get("lowerBoundsOnCoefficients")
    hi = params.get("upperBoundsOnCoefficients")
    if lo is not None:
        assert (a >= lo.toArray()[0] - 1e-12).all()
    if hi is not None:
        assert (a <= hi.toArray()[0] + 1e-12).all()
    if "lowerBoundsOnIntercepts" in params:
        assert ours.intercept >= 0.5 - 1e-12
    assert a[5] == 0.0  # the constant feature


def test_bad_bounds_are_refused_by_name(tiny):
    with pytest.raises(
        ValueError, match=r"lowerBoundsOnCoefficients.*\(1, number of features\).*\(1, 3\)"
    ):
        LogisticRegression(lowerBoundsOnCoefficients=Matrices.dense(1, 3, [0.0] * 3)).fit(tiny)
    with pytest.raises(ValueError, match="only supports L2 regularization"):
        LogisticRegression(
            regParam=0.1,
            elasticNetParam=0.5,
            upperBoundsOnCoefficients=Matrices.dense(1, 2, [1.0, 1.0]),
        ).fit(tiny)
    with pytest.raises(ValueError, match="less than or equal to UpperBounds"):
        LogisticRegression(
            lowerBoundsOnCoefficients=Matrices.dense(1, 2, [1.0, 0.0]),
            upperBoundsOnCoefficients=Matrices.dense(1, 2, [0.0, 1.0]),
        ).fit(tiny)


def test_multinomial_bounds_are_refused_not_ignored(spark):
    three = spark.createDataFrame(
        [(float(i % 3), Vectors.dense(float(i), float(i % 5))) for i in range(30)],
        ["label", "features"],
    )
    bounds = Matrices.dense(3, 2, [0.0] * 6)
    with pytest.raises(NotImplementedError, match="binomial family only"):
        LogisticRegression(lowerBoundsOnCoefficients=bounds).fit(three)


def test_bounds_on_a_hashed_key_set(spark):
    """2^18 sparse features, 40 touched: the key set is a hash index whose ids are not in key
    order, so each bound must be scaled by its own feature's std (scales differ 1..40)."""
    rng = np.random.default_rng(7)
    dim, used = 2**18, np.sort(rng.choice(2**18, size=40, replace=False))
    rows = []
    for _ in range(400):
        cols = np.sort(rng.choice(40, size=6, replace=False))
        vals = rng.normal(size=6) * (1.0 + cols)  # feature j's scale grows with j
        margin = float(np.sum(vals / (1.0 + cols) * np.where(cols % 2, 1.5, -1.0)))
        label = float(rng.random() < 1 / (1 + np.exp(-margin)))
        rows.append((label, Vectors.sparse(dim, used[cols].tolist(), vals.tolist())))
    df = spark.createDataFrame(rows, ["label", "features"])
    upper = np.full(dim, 0.05)
    params = dict(regParam=0.01, upperBoundsOnCoefficients=Matrices.dense(1, dim, upper))
    ours, theirs = _both(df, **params)
    a = ours.coefficients.toArray()
    assert (a <= 0.05 + 1e-12).all() and np.isclose(a[used], 0.05).sum() >= 10
    _same_optimum(ours, theirs)
