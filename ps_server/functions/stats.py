"""Element-wise kernels for feature statistics summed on the shards (numpy only)."""

from __future__ import annotations

import numpy as np

from ps_server.wire import RequestError

__all__ = ["KERNELS", "SERVER_FUNCTIONS", "weighted_std", "standardize"]


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


def standardize(tensors, args: dict, arrays: list[np.ndarray]):
    """mean, std = MLlib's statistics from one shard's slice of the summed matrices.

    models: ``sums`` [n, 3] (count, sum w x, sum w x^2), ``extremes`` [n, 2] (max x,
    max -x), then the ``mean`` and ``std`` vectors to write; all row-co-located (same dim).
    One call instead of a copy, a scale and a kernel over five vectors.

    With ``sums`` [n, 4] (a fourth column ``sum w y x``) a fifth vector gets ``start_s1 *
    s1 + start_sy * sum w y x`` (scalar arguments): the data gradient at a start point where
    every row's loss derivative is an affine function of its label, before the ``1/std``
    scaling (logistic loss at margins all b0: ``sigmoid(b0)`` and -1).
    """
    if len(tensors) not in (4, 5):
        raise RequestError(
            "INVALID_ARGUMENT", "standardize: models are sums, extremes, mean, std[, start]"
        )
    sums = tensors[0]
    width = 4 if len(tensors) == 5 else 3
    for t, cols in zip(tensors, (width, 2, 1, 1, 1)[: len(tensors)], strict=True):
        spec = t.spec
        if (spec.kind, spec.dim, spec.offset, spec.cols) != (
            "dense",
            sums.spec.dim,
            sums.spec.offset,
            cols,
        ):
            raise RequestError(
                "INVALID_ARGUMENT",
                f"standardize: {t.where} is not a dense [{sums.spec.dim}, {cols}] tensor "
                "co-located with the sums",
            )
    written = [t.spec.name for t in tensors[2:]]
    if len(set(written)) != len(written) or sums.spec.name in written:
        raise RequestError("INVALID_ARGUMENT", f"standardize: outputs {written} must differ")
    names = ["weight_sum", "weight_sq_sum", "n_rows"]
    names += ["start_s1", "start_sy"] if len(tensors) == 5 else []
    scalar = {k: _finite(args, k) for k in names}  # all checked before anything is written
    ext, mean_t, std_t = tensors[1:4]
    n = sums.spec.length
    s = sums.dense_values().reshape(n, width)
    e = ext.dense_values().reshape(n, 2)
    w = scalar["weight_sum"]
    mean_t.dense_values()[...] = s[:, 1] / w
    zeros = weighted_std(
        std_t.dense_values(),
        s[:, 1],
        s[:, 2],
        s[:, 0],
        e[:, 0],
        e[:, 1],
        weight_sum=w,
        weight_sq_sum=scalar["weight_sq_sum"],
        n_rows=scalar["n_rows"],
    )
    if len(tensors) == 5:
        start = tensors[4].dense_values()
        np.multiply(scalar["start_s1"], s[:, 1], out=start)
        start += scalar["start_sy"] * s[:, 3]
    return {"zero_std": zeros}, []


def _finite(args: dict, name: str) -> float:
    """``args[name]`` as a finite float, else a clear refusal."""
    value = args.get(name) if isinstance(args, dict) else None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not np.isfinite(value):
        raise RequestError(
            "INVALID_ARGUMENT", f"standardize: {name!r} must be a finite number, got {value!r}"
        )
    return float(value)


KERNELS = {"weighted_std": weighted_std}
SERVER_FUNCTIONS = {"standardize": standardize}
