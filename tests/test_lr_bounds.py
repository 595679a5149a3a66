"""Bound-constrained LR, binomial and multinomial (L-BFGS-B, as MLlib), against MLlib on the
same data."""

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


def test_one_label_trains_when_the_intercept_is_bounded(wide):
    """All labels 1: MLlib returns coefficients 0 and an infinite intercept without training,
    except when a bounded fit's start (clipped into the box) is finite: then it trains, with
    the intercept held by its bound. Ours follows both branches."""
    from pyspark.sql import functions as F

    ones = wide.withColumn("label", F.lit(1.0))
    ours, theirs = _both(ones, regParam=0.05, upperBoundsOnIntercepts=Vectors.dense([1.5]))
    assert ours.intercept == theirs.intercept == 1.5  # on its bound, not +inf
    assert ours.summary.totalIterations > 0
    _same_optimum(ours, theirs)
    # a coefficient bound leaves the intercept free: MLlib's start is +inf, nothing to train
    ours, theirs = _both(
        ones, regParam=0.05, upperBoundsOnCoefficients=Matrices.dense(1, 6, [1.0] * 6)
    )
    assert ours.intercept == theirs.intercept == np.inf
    assert not ours.coefficients.toArray().any() and not theirs.coefficients.toArray().any()
    assert ours.summary.objectiveHistory == theirs.summary.objectiveHistory == [0.0]


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


@pytest.fixture(scope="module")
def iris(spark):
    """MLlib's sample multiclass data: iris, each feature min-max scaled to [-1, 1], labels
    setosa=1, versicolor=2, virginica=0 (what pyspark's multinomial bound test reads)."""
    datasets = pytest.importorskip("sklearn.datasets")
    data = datasets.load_iris()
    lo, hi = data.data.min(axis=0), data.data.max(axis=0)
    X = 2.0 * (data.data - lo) / (hi - lo) - 1.0
    y = np.array([1.0, 2.0, 0.0])[data.target]
    rows = [(float(y[i]), Vectors.dense(X[i])) for i in range(len(y))]
    return spark.createDataFrame(rows, ["label", "features"]).cache()


@pytest.fixture(scope="module")
def four_classes(spark):
    """500 rows, 4 overlapping classes, 5 features of different scales (one constant)."""
    rng = np.random.default_rng(11)
    X = rng.normal(size=(500, 5)) * np.array([1.0, 2.5, 0.4, 1.5, 0.0]) + 0.3
    B = rng.normal(size=(5, 4))
    y = np.argmax(X @ B + rng.gumbel(size=(500, 4)), axis=1).astype(float)
    w = rng.uniform(0.5, 2.0, size=500)
    rows = [(float(y[i]), float(w[i]), Vectors.dense(X[i])) for i in range(500)]
    return spark.createDataFrame(rows, ["label", "weight", "features"]).cache()


def _same_multinomial_optimum(ours, theirs) -> None:
    """As `_same_optimum`, over the K x d coefficient matrix and the K intercepts: both
    solvers are L-BFGS-B on the same objective from the same start point, stopping on a
    relative objective change of tol=1e-6."""
    a, b = ours.coefficientMatrix.toArray(), theirs.coefficientMatrix.toArray()
    scale = max(1e-1, np.abs(b).max(), np.abs(theirs.interceptVector.toArray()).max())
    np.testing.assert_allclose(a, b, rtol=0, atol=1e-4 * scale)
    # The intercepts are unpenalized and the softmax is unchanged by a shift of all K of
    # them, so the objective is flat along that shift wherever the bounds let it move (as
    # in pyspark's example: every intercept below 0): compare them up to the shift, and the
    # class probabilities below.
    bo, bt = ours.interceptVector.toArray(), theirs.interceptVector.toArray()
    np.testing.assert_allclose(bo - bo.mean(), bt - bt.mean(), rtol=0, atol=1e-4 * scale)
    f1, f2 = ours.summary.objectiveHistory[-1], theirs.summary.objectiveHistory[-1]
    assert f1 <= f2 + 1e-8 * abs(f2), (f1, f2)


def _inside(model, params) -> None:
    """Every coefficient and intercept inside its (original-space) bound."""
    W, b = model.coefficientMatrix.toArray(), model.interceptVector.toArray()
    for name, values, sign in (
        ("lowerBoundsOnCoefficients", W, 1.0),
        ("upperBoundsOnCoefficients", W, -1.0),
        ("lowerBoundsOnIntercepts", b, 1.0),
        ("upperBoundsOnIntercepts", b, -1.0),
    ):
        if name in params:
            bound = params[name].toArray()
            assert (sign * (values - bound) >= -1e-12).all(), (name, values, bound)


@pytest.mark.slow  # two fits of 3 x 4 under L-BFGS-B, ~60-110 s on a busy machine
def test_multinomial_pyspark_unit_test_example(iris):
    """pyspark's test_multinomial_logistic_regression_with_bound, in our words: lower bounds
    0..11 on the 3 x 4 coefficients (most bind) and intercepts at most 0; the same optimum
    as MLlib, within the box, and not centered over the classes (MLlib leaves a bounded
    solution as the solver returns it)."""
    params = dict(
        regParam=0.01,
        lowerBoundsOnCoefficients=Matrices.dense(3, 4, list(range(12))),
        upperBoundsOnIntercepts=Vectors.dense(0.0, 0.0, 0.0),
    )
    ours, theirs = _both(iris, **params)
    assert ours.numClasses == 3 and ours.coefficientMatrix.numRows == 3
    _same_multinomial_optimum(ours, theirs)
    _inside(ours, params)
    W = ours.coefficientMatrix.toArray()
    lower = params["lowerBoundsOnCoefficients"].toArray()
    assert np.sum(np.abs(W - lower) < 1e-9) >= 6  # most coefficients sit on their bound
    assert np.abs(W.sum(axis=0)).min() > 1.0  # not centered over the classes
    # coefficients within 1e-4 x 12 (the largest), 4 features in [-1, 1]: margins within
    # ~5e-3, so probabilities (softmax is 1/2-Lipschitz per margin) within ~1e-3
    np.testing.assert_allclose(_probabilities(ours, iris), _probabilities(theirs, iris), atol=1e-3)


def _probabilities(model, df) -> np.ndarray:
    return np.array([r.probability.toArray() for r in model.transform(df).collect()])


@pytest.mark.parametrize(
    "params",
    [
        # coefficients forced non-negative (some to 0) and some capped, standardized
        dict(
            regParam=0.02,
            lowerBoundsOnCoefficients=Matrices.dense(4, 5, [0.0] * 20),
            upperBoundsOnCoefficients=Matrices.dense(4, 5, [0.3, 9, 9, 9] * 5),
        ),
        # mixed-sign boxes, weighted and without standardization
        dict(
            regParam=0.01,
            weightCol="weight",
            standardization=False,
            lowerBoundsOnCoefficients=Matrices.dense(4, 5, [-0.2, -9, 0.0, -9] * 5),
            upperBoundsOnCoefficients=Matrices.dense(4, 5, [9, 0.1, 9, 0.5] * 5),
        ),
        # bounded intercepts (no virtual centering): one class's intercept held up
        dict(
            regParam=0.05,
            lowerBoundsOnIntercepts=Vectors.dense(0.5, -9.0, -9.0, -9.0),
            upperBoundsOnIntercepts=Vectors.dense(9.0, 9.0, 0.0, 9.0),
        ),
        # bounds without an intercept
        dict(
            regParam=0.01,
            fitIntercept=False,
            upperBoundsOnCoefficients=Matrices.dense(4, 5, [0.2] * 20),
        ),
    ],
    ids=["non-negative", "unstandardized-weighted", "intercept-bounds", "no-intercept"],
)
def test_multinomial_same_optimum_as_mllib(four_classes, params):
    ours, theirs = _both(four_classes, family="multinomial", **params)
    _same_multinomial_optimum(ours, theirs)
    _inside(ours, params)
    assert (ours.coefficientMatrix.toArray()[:, 4] == 0.0).all()  # the constant feature
    if "lowerBoundsOnIntercepts" in params:
        b = ours.interceptVector.toArray()
        assert b[0] >= 0.5 - 1e-12 and b[2] <= 1e-12


def test_multinomial_bad_bounds_are_refused_by_name(iris):
    with pytest.raises(
        ValueError,
        match=r"lowerBoundsOnCoefficients.*\(number of classes, number of features\).*"
        r"here \(3, 4\).*\(1, 4\)",
    ):
        LogisticRegression(lowerBoundsOnCoefficients=Matrices.dense(1, 4, [0.0] * 4)).fit(iris)
    with pytest.raises(ValueError, match=r"upperBoundsOnIntercepts.*here 3.*found: 1"):
        LogisticRegression(upperBoundsOnIntercepts=Vectors.dense(0.0)).fit(iris)
    lower = np.zeros((3, 4))
    lower[2, 1] = 2.0
    with pytest.raises(
        ValueError, match=r"lowerBoundsOnCoefficients\[2, 1\] = 2.0 > upperBoundsOnCoeff"
    ):
        LogisticRegression(
            lowerBoundsOnCoefficients=Matrices.dense(3, 4, lower.T.ravel().tolist()),
            upperBoundsOnCoefficients=Matrices.dense(3, 4, [1.0] * 12),
        ).fit(iris)


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
