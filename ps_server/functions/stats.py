"""Element-wise kernels for feature statistics summed on the shards (numpy only)."""

from __future__ import annotations

import numpy as np

__all__ = ["KERNELS", "weighted_std"]


def weighted_std(
    out: np.ndarray,
    s1: np.ndarray,
    s2: np.ndarray,
    count: np.ndarray,
    vmax: np.ndarray,
    neg_vmin: np.ndarray,
    *,
    weight_sum: float,
    weight_sq_sum: float,
    n_rows: float,
) -> float:
    """``out`` = MLlib's weighted unbiased std from summed ``s1 = sum w x``, ``s2 = sum w x^2``.

    A feature whose values (implicit zeros included) are all equal gets exactly 0,
    whatever the rounding of the sums: ``vmax``/``neg_vmin`` are the max of x and of -x
    over stored entries, ``count`` the rows storing one. Returns the count of zero stds.
    """
    mean = s1 / weight_sum
    denom = weight_sum - weight_sq_sum / weight_sum
    var = np.maximum((s2 - mean * s1) / denom, 0.0) if denom > 0 else np.zeros_like(mean)
    has_zero = count < n_rows
    lo = np.where(has_zero, np.minimum(-neg_vmin, 0.0), -neg_vmin)
    hi = np.where(has_zero, np.maximum(vmax, 0.0), vmax)
    var = np.where(lo == hi, 0.0, var)
    np.sqrt(var, out=out)
    return float(np.count_nonzero(out == 0.0))


KERNELS = {"weighted_std": weighted_std}
