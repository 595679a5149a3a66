"""Element-wise kernels over co-located dense vector slices (run inside PS shards).

Every kernel has the signature ``kernel(out, *inputs, **scalars) -> float``: the
arrays are one shard's slices of vectors of the same dimension (the same
coordinates on every array), ``scalars`` are plain floats (the wire carries a
``map<string, double>``; booleans travel as 0.0/1.0). A kernel may write
``out`` in place and returns a partial scalar for its slice; the caller sums the
partials over all shards. Kernels are purely coordinate-wise, so any split of
the vectors into slices gives the same elements and the same sum (up to the
order of the final additions). Reduction-only kernels read ``out`` as their
first operand and leave it untouched.

The L-BFGS / OWL-QN solver (``spark_ps.ml.lr.optim``) and the logistic
regression setup (``spark_ps.ml.lr.objective``) call these through a VecSpace,
so the same code runs on local numpy arrays and on PS shards. The OWL-QN rules
follow Andrew & Gao (2007) as breeze implements them, which MLlib uses.

numpy only: this module is imported by PS shards, which never import pyspark.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

__all__ = [
    "KERNELS",
    "l2_penalty",
    "lr_finish",
    "l1_value",
    "owlqn_pseudo_gradient",
    "owlqn_directional_derivative",
    "owlqn_constrain_direction",
    "owlqn_step_project",
    "lr_inverse_std",
    "lr_scaled_mean",
    "lr_l2_scale",
    "lr_l1_weight",
    "multiply",
]


def l2_penalty(out: np.ndarray, w: np.ndarray, scale: np.ndarray, *, reg: float) -> float:
    """Add the gradient of ``reg/2 * sum(scale * w**2)`` to ``out``; return that penalty.

    ``scale`` holds per-coordinate penalty factors: 1 for a standardized
    coefficient, ``1/std**2`` when the penalty lives in the original space, 0 for
    the intercept and for coordinates that are not penalized.
    """
    sw = scale * w
    out += reg * sw
    return 0.5 * reg * float(np.dot(sw, w))


def lr_finish(
    out: np.ndarray,
    w: np.ndarray,
    scaled_mean: np.ndarray,
    scale: np.ndarray,
    *,
    inv_weight: float,
    intercept_step: float,
    reg: float,
) -> float:
    """The summed data gradient ``out`` -> the objective's gradient, in one pass.

    ``out = out * inv_weight + intercept_step * scaled_mean`` (the mean over the weight
    and the centering correction), then :func:`l2_penalty`; returns the penalty. The
    same arithmetic as ``scale``, ``axpy`` and ``l2_penalty`` one after another, so
    the result is bit-identical, for one request instead of three.
    """
    out *= inv_weight
    out += intercept_step * scaled_mean
    return l2_penalty(out, w, scale, reg=reg)


def l1_value(out: np.ndarray, l1: np.ndarray) -> float:
    """Return ``sum(l1 * |out|)`` (weighted L1 norm); ``out`` is only read."""
    return float(np.dot(l1, np.abs(out)))


def _pseudo_gradient(x: np.ndarray, g: np.ndarray, l1: np.ndarray) -> np.ndarray:
    """OWL-QN pseudo-gradient of ``f(x) + sum(l1 * |x|)`` given ``g = grad f(x)``.

    Away from zero the L1 term is differentiable (``g + l1 * sign(x)``); at zero the
    pseudo-gradient is the one-sided derivative that points downhill, or 0 when
    neither side descends (``|g| <= l1``).
    """
    right = g + l1  # derivative when moving into x > 0
    left = g - l1  # derivative when moving into x < 0
    at_zero = np.where(left > 0, left, np.where(right < 0, right, 0.0))
    return np.where(x == 0, at_zero, g + np.sign(x) * l1)


def owlqn_pseudo_gradient(out: np.ndarray, x: np.ndarray, g: np.ndarray, l1: np.ndarray) -> float:
    """Write the OWL-QN pseudo-gradient into ``out``; return ``sum(l1 * |x|)``.

    The return value is the L1 part of the objective, so one call gives both what
    the solver needs at a new point (adjusted gradient and adjusted value).
    """
    out[...] = _pseudo_gradient(x, g, l1)
    return float(np.dot(l1, np.abs(x)))


def owlqn_directional_derivative(
    out: np.ndarray, x: np.ndarray, g: np.ndarray, l1: np.ndarray
) -> float:
    """Return ``pseudo_gradient(x, g, l1) . out`` without storing the pseudo-gradient.

    ``out`` is the search direction (only read); used by the OWL-QN line search at
    every trial point.
    """
    return float(np.dot(_pseudo_gradient(x, g, l1), out))


def owlqn_constrain_direction(out: np.ndarray, pg: np.ndarray) -> float:
    """Zero the direction ``out`` where it does not descend along ``-pg``; return ``out . pg``.

    OWL-QN keeps only coordinates with ``out_i * pg_i < 0`` so the step stays in the
    orthant the pseudo-gradient chose.
    """
    out[...] = np.where(out * pg < 0, out, 0.0)
    return float(np.dot(out, pg))


def owlqn_step_project(
    out: np.ndarray, x: np.ndarray, d: np.ndarray, pg: np.ndarray, *, step: float
) -> float:
    """``out = x + step * d`` projected onto the orthant of ``x``; return the count zeroed.

    The orthant is ``sign(x)`` where ``x != 0`` and ``sign(-pg)`` where ``x == 0``;
    coordinates of the step whose sign differs from it are set to 0.
    """
    stepped = x + d * step
    orthant = np.where(x != 0, np.sign(x), np.sign(-pg))
    keep = np.sign(stepped) == orthant
    out[...] = np.where(keep, stepped, 0.0)
    return float(np.count_nonzero(~keep & (stepped != 0)))


def lr_inverse_std(out: np.ndarray, std: np.ndarray) -> float:
    """``out = 1/std`` where ``std != 0``, else 0; return the count of zero stds.

    MLlib scales feature ``j`` by ``1/std_j`` and drops constant features (std 0),
    whose coefficient then stays 0.
    """
    nz = std != 0
    out[...] = np.divide(1.0, std, out=np.zeros_like(std, dtype=np.float64), where=nz)
    return float(std.size - np.count_nonzero(nz))


def lr_scaled_mean(out: np.ndarray, mean: np.ndarray, inv_std: np.ndarray) -> float:
    """``out = mean * inv_std`` (the feature means in the standardized space); return its sum."""
    out[...] = mean * inv_std
    return float(out.sum())


def lr_l2_scale(
    out: np.ndarray, std: np.ndarray, coef_mask: np.ndarray, *, standardization: float
) -> float:
    """Per-coordinate L2 factors in the standardized space; return their sum.

    With standardization the penalty is on the standardized coefficients (factor
    1); without, on the original ones ``beta_j / std_j`` (factor ``1/std_j**2``, 0
    when ``std_j == 0``). ``coef_mask`` is 1 on coefficients, 0 on the intercept.
    """
    if standardization:
        out[...] = coef_mask
    else:
        nz = std != 0
        inv2 = np.divide(1.0, std * std, out=np.zeros_like(std, dtype=np.float64), where=nz)
        out[...] = coef_mask * inv2
    return float(out.sum())


def lr_l1_weight(
    out: np.ndarray,
    std: np.ndarray,
    coef_mask: np.ndarray,
    *,
    reg_l1: float,
    standardization: float,
) -> float:
    """Per-coordinate L1 weights in the standardized space; return their sum.

    ``reg_l1`` on standardized coefficients, or ``reg_l1 / std_j`` (0 when
    ``std_j == 0``) when the penalty is on the original coefficients; 0 on the
    intercept (``coef_mask == 0``).
    """
    if standardization:
        out[...] = reg_l1 * coef_mask
    else:
        nz = std != 0
        w = np.divide(reg_l1, std, out=np.zeros_like(std, dtype=np.float64), where=nz)
        out[...] = coef_mask * w
    return float(out.sum())


def multiply(out: np.ndarray, a: np.ndarray, b: np.ndarray) -> float:
    """``out = a * b`` element-wise (e.g. back from the standardized space); return its sum."""
    out[...] = a * b
    return float(out.sum())


KERNELS: dict[str, Callable[..., float]] = {
    "l2_penalty": l2_penalty,
    "lr_finish": lr_finish,
    "l1_value": l1_value,
    "owlqn_pseudo_gradient": owlqn_pseudo_gradient,
    "owlqn_directional_derivative": owlqn_directional_derivative,
    "owlqn_constrain_direction": owlqn_constrain_direction,
    "owlqn_step_project": owlqn_step_project,
    "lr_inverse_std": lr_inverse_std,
    "lr_scaled_mean": lr_scaled_mean,
    "lr_l2_scale": lr_l2_scale,
    "lr_l1_weight": lr_l1_weight,
    "multiply": multiply,
}
