"""pyspark.ml's own docstring examples of LinearRegression and LinearSVC pass with the
spark-ps classes swapped in (run by doctest from the installed pyspark's source).

A printed float (``model.intercept``, 17 significant digits) is compared to 1e-12 relative:
our solver walks MLlib's path, but its sums round in another order (last-digit noise).
"""

from __future__ import annotations

import doctest

import pytest
from pyspark.ml import classification as mllib_cls
from pyspark.ml import regression as mllib_reg

from spark_ps.ml.classification import LinearSVC, LinearSVCModel
from spark_ps.ml.regression import LinearRegression, LinearRegressionModel

pytestmark = pytest.mark.timeout(600)

_FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE


class _FloatChecker(doctest.OutputChecker):
    def check_output(self, want: str, got: str, optionflags: int) -> bool:
        if super().check_output(want, got, optionflags):
            return True
        try:
            a, b = float(want), float(got)
        except ValueError:
            return False
        return abs(a - b) <= 1e-12 * abs(a)


def _run(spark, tmp_path, mllib_class, swaps):
    globs = {"spark": spark, "sc": spark.sparkContext, "temp_path": str(tmp_path), **swaps}
    tests = doctest.DocTestFinder(recurse=False).find(mllib_class, globs=globs)
    runner = doctest.DocTestRunner(checker=_FloatChecker(), optionflags=_FLAGS)
    for test in tests:
        runner.run(test)
    return runner.summarize(verbose=False)


def test_linear_regression_docstring_examples(spark_ps, tmp_path):
    spark, _ = spark_ps
    swaps = {"LinearRegression": LinearRegression, "LinearRegressionModel": LinearRegressionModel}
    result = _run(spark, tmp_path, mllib_reg.LinearRegression, swaps)
    assert result.attempted >= 30
    assert result.failed == 0, result


def test_linear_svc_docstring_examples(spark_ps, tmp_path):
    spark, _ = spark_ps
    swaps = {"LinearSVC": LinearSVC, "LinearSVCModel": LinearSVCModel}
    result = _run(spark, tmp_path, mllib_cls.LinearSVC, swaps)
    assert result.attempted >= 30
    assert result.failed == 0, result
