"""Bad training data and Params are refused at ``fit()`` with MLlib's wording, before any
work reaches the PS: the real trainers (on the real embedded PS) never start, so no model
appears on the shards."""

from __future__ import annotations

import pytest
from pyspark.ml.linalg import Vectors, VectorUDT
from pyspark.sql import types as T

from spark_ps.ml.classification import GBTClassifier, LogisticRegression

pytestmark = pytest.mark.timeout(300)

_SCHEMA = T.StructType(
    [
        T.StructField("label", T.DoubleType()),
        T.StructField("w", T.DoubleType()),
        T.StructField("features", VectorUDT()),
    ]
)
_GOOD = [
    (0.0, 1.0, Vectors.dense(0.0, 1.0)),
    (1.0, 1.0, Vectors.dense(1.0, 0.0)),
    (0.0, 2.0, Vectors.sparse(2, [1], [0.5])),
    (1.0, 1.0, Vectors.sparse(2, [0], [2.0])),
]


def _df(spark, extra):
    return spark.createDataFrame(_GOOD + extra, _SCHEMA)


def _refused(ps, fit, exc, message):
    before = ps.client.models()
    with pytest.raises(exc, match=message):
        fit()
    assert ps.client.models() == before  # nothing was sent to the PS


_MISMATCH = r"Dimensions mismatch when adding new sample\. Expecting 2 but got 3"
_NON_FINITE = r"Vector values MUST NOT be NaN or Infinity, but got "


@pytest.mark.parametrize(
    "estimator, extra, message",
    [
        (LogisticRegression, [(1.0, 1.0, Vectors.dense(1.0, 2.0, 3.0))], _MISMATCH),
        (GBTClassifier, [(1.0, 1.0, Vectors.sparse(3, [2], [1.0]))], _MISMATCH),
        (LogisticRegression, [(1.0, 1.0, None)], r"Vectors MUST NOT be Null: 1 null rows"),
        (GBTClassifier, [(1.0, 1.0, None)], r"Vectors MUST NOT be Null: 1 null rows"),
        (
            LogisticRegression,
            [(1.0, 1.0, Vectors.sparse(2, [1], [float("nan")]))],
            _NON_FINITE + r"\(2,\[1\],\[NaN\]\) \(featuresCol 'features'\)",
        ),
        (GBTClassifier, [(1.0, 1.0, Vectors.dense(1.0, float("-inf")))], _NON_FINITE + r"\[1"),
    ],
)
def test_bad_features_refused_before_the_ps(spark_ps, estimator, extra, message):
    spark, ps = spark_ps
    df = _df(spark, extra)
    _refused(ps, lambda: estimator(maxIter=2, weightCol="w").fit(df), ValueError, message)


def test_features_column_of_the_wrong_type(spark_ps):
    spark, ps = spark_ps
    df = spark.createDataFrame([(0.0, "a")], ["label", "features"])
    message = r"Column 'features' \(featuresCol\) must be of type VectorUDT.* was actually string"
    for estimator in (LogisticRegression, GBTClassifier):
        _refused(ps, lambda e=estimator: e(maxIter=2).fit(df), TypeError, message)


@pytest.mark.parametrize(
    "extra, kwargs, exc, message",
    [
        ([(0.5, 1.0, Vectors.dense(1.0, 2.0))], {}, ValueError, r"Labels MUST be in \{0, 1\}"),
        ([(None, 1.0, Vectors.dense(1.0, 2.0))], {}, ValueError, "Labels MUST NOT be Null or NaN"),
        (
            [(1.0, -1.0, Vectors.dense(1.0, 2.0))],
            {},
            ValueError,
            r"Weights MUST NOT be Negative or Infinity, but got -1\.0 \(weightCol 'w'; 1 such",
        ),
        (
            [(1.0, float("inf"), Vectors.dense(1.0, 2.0))],
            {},
            ValueError,
            "Weights MUST NOT be Negative or Infinity, but got Infinity",
        ),
        ([(1.0, float("nan"), Vectors.dense(1.0, 2.0))], {}, ValueError, "MUST NOT be Null or NaN"),
        ([], {"stepSize": 0.0}, ValueError, "parameter stepSize given invalid value 0.0"),
        ([], {"staleness": -2}, ValueError, "parameter staleness given invalid value -2"),
        ([], {"solver": "sgd", "batchSize": 0}, ValueError, "parameter batchSize given invalid"),
    ],
)
def test_bad_labels_weights_and_params_refused_before_the_ps(spark_ps, extra, kwargs, exc, message):
    spark, ps = spark_ps
    df = _df(spark, extra)
    fit = LogisticRegression(maxIter=2, weightCol="w", **kwargs).fit
    _refused(ps, lambda: fit(df), exc, message)


def test_empty_dataframe_refused_before_the_ps(spark_ps):
    spark, ps = spark_ps
    empty = _df(spark, []).limit(0)
    lr, gbt = LogisticRegression(maxIter=2), GBTClassifier(maxIter=2)
    _refused(ps, lambda: lr.fit(empty), ValueError, "the training dataset is empty")
    _refused(ps, lambda: gbt.fit(empty), ValueError, "requires size of input RDD > 0")
    _refused(
        ps, lambda: GBTClassifier(maxBins=1).fit(empty), ValueError, "maxBins given invalid value 1"
    )
