"""One ``exp`` with the same bits on every x86-64 CPU, in numpy and in compiled code.

Why: GBT grows its trees from LogLoss's pseudo-residuals ``4y / (1 + exp(2yF))``, and the
platform's ``exp`` is not one function: numpy picks a SIMD implementation by CPU (AVX512F
machines have their own), numba calls the C library's, and the two differ in the last bit
on some CPUs (93 of 5,000 values on one Xeon). Workers on different CPUs, or a partition
retried on another host, would then grow different trees from the same rows.

This ``exp`` uses only ``+ - * /``, ``floor`` and ``ldexp``, each exact or correctly
rounded by IEEE 754, in one fixed order: fdlibm's algorithm (Cody-Waite reduction
``x = k ln2 + r`` with a split ln2, a degree-5 Remez polynomial in ``r**2``, then
``2**k``), error below 1 ulp. Scaling by ``2**k`` is exact whenever the result is a normal
float, so :func:`exp_scalar` multiplies by ``2**k`` from a table there (the same bits as
``ldexp``, which compiled code can only call as a library function: 1.07 -> 0.55 ms for
100k values, measured) and calls ``ldexp`` only for subnormal results (and the largest
finite ones). :func:`exp` (numpy, element-wise) and :func:`exp_scalar` (one float; the
kernels compile it with numba, which fuses no multiply-add without fastmath) perform the
same operations, so they agree bit for bit on any machine.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["exp", "exp_scalar"]

# fdlibm e_exp.c's constants: ln2 split so that k * _LN2_HI is exact for |k| < 2**20
_LN2_HI = 6.93147180369123816490e-01
_LN2_LO = 1.90821492927058770002e-10
_INV_LN2 = 1.44269504088896338700e00
_P1 = 1.66666666666666019037e-01
_P2 = -2.77777777770155933842e-03
_P3 = 6.61375632143793436117e-05
_P4 = -1.65339022054652515390e-06
_P5 = 4.13813679705723846039e-08
#: Above this exp overflows to inf; below _UNDERFLOW it is 0.
_OVERFLOW = 7.09782712893383973096e02
_UNDERFLOW = -7.45133219101941108420e02
#: 2**k for -1021 <= k <= 1023: with e**r in (0.7, 1.42), ``e**r * 2**k`` is then a normal
#: float, and multiplying by a power of two is exact (the same bits as ``ldexp``). Just
#: below the overflow bound k is 1024 (2**1024 is no float): ``ldexp`` takes it.
_K_MIN, _K_MAX = -1021, 1023
_POW2 = np.ldexp(1.0, np.arange(_K_MIN, _K_MAX + 1))


def exp_scalar(x: float) -> float:
    """``exp(x)`` of one float: the same operations, in the same order, as :func:`exp`."""
    if x != x:
        return x
    if x > _OVERFLOW:
        return math.inf
    if x < _UNDERFLOW:
        return 0.0
    k = np.floor(x * _INV_LN2 + 0.5)
    hi = x - k * _LN2_HI
    lo = k * _LN2_LO
    r = hi - lo
    t = r * r
    c = r - t * (_P1 + t * (_P2 + t * (_P3 + t * (_P4 + t * _P5))))
    y = 1.0 - ((lo - (r * c) / (2.0 - c)) - hi)
    if _K_MIN <= k <= _K_MAX:
        return y * _POW2[int(k) - _K_MIN]
    return math.ldexp(y, int(k))


def exp(x: np.ndarray) -> np.ndarray:
    """Element-wise ``exp`` of float64 `x`, bit for bit :func:`exp_scalar` of each value."""
    x = np.asarray(x, dtype=np.float64)
    inside = (x <= _OVERFLOW) & (x >= _UNDERFLOW)  # False for NaN too
    v = np.where(inside, x, 0.0)
    k = np.floor(v * _INV_LN2 + 0.5)
    hi = v - k * _LN2_HI
    lo = k * _LN2_LO
    r = hi - lo
    t = r * r
    c = r - t * (_P1 + t * (_P2 + t * (_P3 + t * (_P4 + t * _P5))))
    y = np.ldexp(1.0 - ((lo - (r * c) / (2.0 - c)) - hi), k.astype(np.int32))
    outside = np.where(x > _OVERFLOW, np.inf, np.where(x < _UNDERFLOW, 0.0, x))  # NaN stays
    return np.where(inside, y, outside)
