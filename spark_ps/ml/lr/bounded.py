"""MLlib's bound-constrained logistic regression (binomial and multinomial): L-BFGS-B.

MLlib switches to L-BFGS-B (breeze's ``LBFGSB``, history 10) as soon as any of
``lowerBoundsOnCoefficients``, ``upperBoundsOnCoefficients``, ``lowerBoundsOnIntercepts``,
``upperBoundsOnIntercepts`` is set, and allows it with L2 regularization only. The
coefficient bounds are a ``[numCoefficientSets, numFeatures]`` matrix (one row for the
binomial family, one per class for the multinomial), the intercept bounds a vector of
``numCoefficientSets`` entries. Bounds are given in the original feature space; the solver
works on standardized coefficients ``b_kj = beta_kj * std_j``, so its box is
``[lo_kj * std_j, hi_kj * std_j]`` (0 for a constant feature, whose coefficient is 0
anyway). The intercepts are not virtually centered when any of them has a finite bound
(centering would turn its box into a constraint on a combination of coordinates), and the
start point is clipped into the box. A bounded multinomial solution is not centered over
the classes afterwards (centering could leave the box).

The solver is scipy's L-BFGS-B (the same method) on the driver, over the coordinates the
data touches (``keys x sets``, plus the intercepts): bounds are listed for every feature,
so these are models whose values the driver holds anyway, while every objective
evaluation is still the usual distributed pass over the PS vectors.
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


def _matrix(value: Any, name: str, num_sets: int, num_features: int) -> np.ndarray:
    arr = np.asarray(value.toArray(), dtype=np.float64)
    if arr.shape != (num_sets, num_features):
        raise ValueError(
            f"The shape of {name} must be compatible with (1, number of features) for "
            "binomial regression, or (number of classes, number of features) for multinomial "
            f"regression, here ({num_sets}, {num_features}), but found: "
            f"({arr.shape[0]}, {arr.shape[1]})"
        )
    return arr


def _vector(value: Any, name: str, num_sets: int) -> np.ndarray:
    arr = np.asarray(value.toArray(), dtype=np.float64).reshape(-1)
    if arr.size != num_sets:
        raise ValueError(
            f"The size of {name} must be equal to 1 for binomial regression, or the number of "
            f"classes for multinomial regression, here {num_sets}, but found: {arr.size}"
        )
    return arr


def _check_order(lower: np.ndarray, upper: np.ndarray, what: str) -> None:
    """MLlib's check, in the original space: every lower bound <= its upper bound."""
    bad = np.argwhere(~(lower <= upper))
    if bad.size:
        at = tuple(int(i) for i in bad[0])
        where = f"[{at[0]}, {at[1]}]" if len(at) == 2 else f"[{at[0]}]"
        raise ValueError(
            f"LowerBounds must be less than or equal to UpperBounds: lowerBoundsOn{what}{where} "
            f"= {lower[at]} > upperBoundsOn{what}{where} = {upper[at]}"
        )


def box_of(
    params: dict,
    num_features: int,
    keys: np.ndarray,
    ids: np.ndarray,
    std: np.ndarray,
    fit_intercept: bool,
    num_sets: int = 1,
) -> Box | None:
    """The solver's box from the bounds Params, or None when none is set.

    ``keys``/``ids``: the touched features and their compact ids (a hashed key set numbers
    them in another order than the keys); ``std`` indexed by id. ``num_sets``: 1 for the
    binomial family, the number of classes for the multinomial. The box is flat in the
    solver's layout: coordinate ``id * num_sets + k``, the intercepts last.
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
    K, n = int(num_sets), int(ids.size)
    dim = (n + int(fit_intercept)) * K
    lower, upper = np.full(dim, -math.inf), np.full(dim, math.inf)
    coef = {
        name: _matrix(given[name], name, K, num_features)
        for name in ("lowerBoundsOnCoefficients", "upperBoundsOnCoefficients")
        if name in given
    }
    if len(coef) == 2:
        _check_order(*coef.values(), "Coefficients")
    std = np.asarray(std, dtype=np.float64)[ids]  # by id -> in `keys` order (ids may permute)
    for name, out in (("lowerBoundsOnCoefficients", lower), ("upperBoundsOnCoefficients", upper)):
        if name in coef:
            scaled = (coef[name][:, keys] * std).T  # [n, K] in `keys` order
            rows = out[: n * K].reshape(n, K)  # a view: row `id` holds that feature's K
            rows[ids] = np.where(std[:, None] == 0.0, 0.0, scaled)  # MLlib: bound * 0
    center = fit_intercept
    if fit_intercept:
        icpt = {
            name: _vector(given[name], name, K)
            for name in ("lowerBoundsOnIntercepts", "upperBoundsOnIntercepts")
            if name in given
        }
        if len(icpt) == 2:
            _check_order(*icpt.values(), "Intercepts")
        if "lowerBoundsOnIntercepts" in icpt:
            lower[n * K :] = icpt["lowerBoundsOnIntercepts"]
        if "upperBoundsOnIntercepts" in icpt:
            upper[n * K :] = icpt["upperBoundsOnIntercepts"]
        tail_lo, tail_hi = lower[n * K :], upper[n * K :]
        center = bool(np.all(np.isneginf(tail_lo)) and np.all(np.isposinf(tail_hi)))
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
    cols = int(getattr(space, "cols", 1))  # a [dim, K] matrix: its flat values, row by row

    def put(v: np.ndarray) -> None:
        x0.update(ids, v.reshape(space.dim, cols) if cols > 1 else v)

    def get(vec: Any) -> np.ndarray:
        return np.asarray(vec.pull(ids), dtype=np.float64).reshape(-1)

    g_vec = space.new("lbfgsb.g")
    last: dict = {}  # the newest evaluation: scipy asks again for the point it stands on
    history: list[float] = []
    evals = [0]

    def fg(x: np.ndarray) -> tuple[float, np.ndarray]:
        if last.get("x") is not None and np.array_equal(last["x"], x):
            return last["f"], last["g"].copy()
        put(x)
        value = float(evaluate(x0, g_vec))
        evals[0] += 1
        grad = get(g_vec)
        last.update(x=x.copy(), f=value, g=grad)
        return value, grad.copy()

    start = np.clip(get(x0), box.lower, box.upper)
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
    put(res.x)
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
