"""MLlib's bound-constrained binomial logistic regression: L-BFGS-B in the standardized space.

MLlib switches to L-BFGS-B (breeze's ``LBFGSB``, history 10) as soon as any of
``lowerBoundsOnCoefficients``, ``upperBoundsOnCoefficients``, ``lowerBoundsOnIntercepts``,
``upperBoundsOnIntercepts`` is set, and allows it with L2 regularization only. Bounds are
given in the original feature space; the solver works on standardized coefficients
``b_j = beta_j * std_j``, so its box is ``[lo_j * std_j, hi_j * std_j]`` (0 for a constant
feature, whose coefficient is 0 anyway). The intercept is not virtually centered when it has
a finite bound (centering would turn its box into a constraint on a combination of
coordinates), and the start point is clipped into the box.

The solver is scipy's L-BFGS-B (the same method) on the driver, over the ``K (+1)``
coordinates the data touches: bounds are listed for every feature, so these are models whose
vectors the driver holds anyway, while every objective evaluation is still the usual
distributed pass over the PS vectors.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from spark_ps.ml.lr.optim import IterationInfo, MinimizeResult

__all__ = ["BOUND_PARAMS", "Box", "box_of", "minimize_lbfgsb"]

BOUND_PARAMS = (
    "lowerBoundsOnCoefficients",
    "upperBoundsOnCoefficients",
    "lowerBoundsOnIntercepts",
    "upperBoundsOnIntercepts",
)


@dataclass
class Box:
    """Bounds of the solver's coordinates (compact ids, intercept last when fitted)."""

    lower: np.ndarray
    upper: np.ndarray
    center: bool  # False when the intercept has a finite bound


def _matrix(value: Any, name: str, num_features: int) -> np.ndarray:
    arr = np.asarray(value.toArray(), dtype=np.float64)
    if arr.shape != (1, num_features):
        raise ValueError(
            f"The shape of {name} must be compatible with (1, number of features) for "
            f"binomial regression, but found: ({arr.shape[0]}, {arr.shape[1]})"
        )
    return arr[0]


def _vector(value: Any, name: str) -> float:
    arr = np.asarray(value.toArray(), dtype=np.float64)
    if arr.shape != (1,):
        raise ValueError(
            f"The size of {name} must be equal to 1 for binomial regression, but found: {arr.size}"
        )
    return float(arr[0])


def box_of(
    params: dict,
    num_features: int,
    keys: np.ndarray,
    ids: np.ndarray,
    std: np.ndarray,
    fit_intercept: bool,
) -> Box | None:
    """The solver's box from the bounds Params, or None when none is set.

    ``keys``/``ids``: the touched features and their compact ids (a hashed key set numbers
    them in another order than the keys); ``std`` indexed by id.
    """
    given = {name: params.get(name) for name in BOUND_PARAMS if params.get(name) is not None}
    if not given:
        return None
    if params.get("elasticNetParam", 0.0) != 0.0 and params.get("regParam", 0.0) != 0.0:
        raise ValueError(
            "Fitting under bound constrained optimization only supports L2 regularization, "
            "but got elasticNetParam = "
            f"{params['elasticNetParam']} and regParam = {params['regParam']}."
        )
    if not fit_intercept and any("Intercepts" in name for name in given):
        raise ValueError(
            "Fitting under bound constrained optimization with intercept bounds requires "
            "fitIntercept = true"
        )
    dim = ids.size + int(fit_intercept)
    lower, upper = np.full(dim, -math.inf), np.full(dim, math.inf)
    std = np.asarray(std, dtype=np.float64)[ids]  # by id -> in `keys` order (ids may permute)
    for name, out in (("lowerBoundsOnCoefficients", lower), ("upperBoundsOnCoefficients", upper)):
        if name in given:
            full = _matrix(given[name], name, num_features)
            scaled = full[keys] * std
            out[ids] = np.where(std == 0.0, 0.0, scaled)  # MLlib: bound * 0 for constants
    center = fit_intercept
    if fit_intercept:
        if "lowerBoundsOnIntercepts" in given:
            lower[-1] = _vector(given["lowerBoundsOnIntercepts"], "lowerBoundsOnIntercepts")
        if "upperBoundsOnIntercepts" in given:
            upper[-1] = _vector(given["upperBoundsOnIntercepts"], "upperBoundsOnIntercepts")
        center = math.isinf(lower[-1]) and math.isinf(upper[-1])
    if np.isnan(lower).any() or np.isnan(upper).any() or (lower > upper).any():
        j = int(np.flatnonzero(~(lower <= upper))[0])
        raise ValueError(
            f"LowerBounds must be less than or equal to UpperBounds (coordinate {j}: "
            f"{lower[j]} > {upper[j]} in the standardized space)"
        )
    return Box(lower, upper, center)


def minimize_lbfgsb(
    space: Any,
    evaluate: Callable[[Any, Any], float],
    x0: Any,
    box: Box,
    *,
    max_iter: int,
    tol: float,
    m: int = 10,
    callback: Callable[[IterationInfo], None] | None = None,
) -> MinimizeResult:
    """Minimize ``f`` over ``box`` by L-BFGS-B; ``evaluate(x, g) -> f`` is the PS pass.

    ``x0`` is a PS vector (it becomes the solution's storage, as in ``minimize_lbfgs``); its
    values are clipped into the box first, as MLlib clips its start point.
    """
    from scipy.optimize import minimize

    ids = np.arange(space.dim, dtype=np.int64)
    g_vec = space.new("lbfgsb.g")
    last: dict = {}  # the newest evaluation: scipy asks again for the point it stands on
    history: list[float] = []
    evals = [0]

    def fg(x: np.ndarray) -> tuple[float, np.ndarray]:
        if last.get("x") is not None and np.array_equal(last["x"], x):
            return last["f"], last["g"].copy()
        x0.update(ids, x)
        value = float(evaluate(x0, g_vec))
        evals[0] += 1
        grad = np.asarray(g_vec.pull(ids), dtype=np.float64)
        last.update(x=x.copy(), f=value, g=grad)
        return value, grad.copy()

    start = np.clip(np.asarray(x0.pull(ids), dtype=np.float64), box.lower, box.upper)
    history.append(fg(start)[0])

    def on_iteration(xk: np.ndarray) -> None:
        value = fg(xk)[0]
        history.append(value)
        if callback is not None:
            callback(IterationInfo(len(history) - 1, value, math.nan, math.nan, evals[0]))

    def side(v: float) -> float | None:
        return None if math.isinf(v) else float(v)

    res = minimize(
        fg,
        start,
        jac=True,
        method="L-BFGS-B",
        bounds=[(side(lo), side(hi)) for lo, hi in zip(box.lower, box.upper, strict=True)],
        callback=on_iteration,
        # breeze stops when f improved by at most tol relative to the mean of its last 20
        # values, which waits longer than scipy's step-to-step test at the same tol
        options={"maxiter": int(max_iter), "maxcor": m, "ftol": tol * 1e-3, "gtol": 1e-10},
    )
    x0.update(ids, res.x)
    space.release(g_vec)
    grad_norm = float(np.linalg.norm(res.jac)) if res.jac is not None else math.nan
    return MinimizeResult(
        x0,
        float(res.fun),
        grad_norm,
        len(history) - 1,
        evals[0],
        str(res.message),
        history,
    )
