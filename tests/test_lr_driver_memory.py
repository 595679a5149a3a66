"""The driver stays out: fitting LR at 2^28 features costs the driver what 2^20 costs.

MLlib aggregates dense gradients of the full dimension in the driver (2^28 doubles =
2 GiB per vector); spark-ps keeps every solver vector on the PS, over the keys the data
touches. The same rows, hashed into 2^20 and into 2^28 features, must move the driver's
JVM heap and Python RSS by about the same amount.
"""

from __future__ import annotations

import numpy as np
import pytest

from bench.common import PeakMemory
from bench.datagen import synthetic_ctr
from spark_ps.ml.classification import LogisticRegression

ROWS, NNZ = 4000, 10
BOUND_MIB = 96  # a single dense float64 vector of 2^28 entries is 2048 MiB


def _fit_memory(spark, log2_dim: int):
    df = synthetic_ctr(spark, ROWS, log2_dim, NNZ, seed=3, partitions=2).cache()
    df.count()
    lr = LogisticRegression(maxIter=5, regParam=0.01, standardization=False)
    with PeakMemory(spark, interval=0.02) as mem:
        model = lr.fit(df)
    df.unpersist()
    return model, (mem.jvm_peak - mem.jvm_base) / 2**20, mem.py_mib


@pytest.mark.timeout(300)
def test_driver_memory_does_not_grow_with_the_feature_dimension(spark_ps):
    spark, _ = spark_ps
    _fit_memory(spark, 16)  # warm-up: Python workers, JIT, imports
    small, jvm_small, py_small = _fit_memory(spark, 20)
    big, jvm_big, py_big = _fit_memory(spark, 28)
    assert small.numFeatures == 1 << 20 and big.numFeatures == 1 << 28
    # the same rows learn the same number of coefficients: only the key space differs
    assert big.coefficientKeys.size <= small.numFeatures
    assert np.isclose(big.summary.objectiveHistory[-1], small.summary.objectiveHistory[-1], 1e-2)
    grow_jvm, grow_py = jvm_big - jvm_small, py_big - py_small
    assert grow_jvm < BOUND_MIB, f"driver JVM heap grew {grow_jvm:.0f} MiB from 2^20 to 2^28"
    assert grow_py < BOUND_MIB, f"driver Python RSS grew {grow_py:.0f} MiB from 2^20 to 2^28"
