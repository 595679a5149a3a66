"""L-BFGS and OWL-QN written only in VecSpace operations.

The solver follows breeze's ``LBFGS`` / ``OWLQN`` (the optimizers MLlib's
LogisticRegression runs) rule for rule, so it walks the same path and stops for
the same reasons: the two-loop recursion with ``s'y / y'y`` scaling, a strong
Wolfe cubic line search for L-BFGS, backtracking with orthant projection for
OWL-QN, breeze's convergence tests, and its reset-history-once-then-give-up
reaction to a failed step. Every vector is a VecSpace handle, so with a PS space
the history lives on the shards and only scalars reach the driver.

Each ``evaluate`` call is a distributed pass; the solver never evaluates the
same point twice (the point a line search accepts is the last one it tried).
Live vectors: ``2*m`` history + a spare pair + 4 (x, g, trial x, trial g) + direction
(+ pseudo-gradient for OWL-QN).

Round trips: with a PS space every op is one request per shard, so an L-BFGS iteration
that accepts its first trial makes two besides the evaluation. One builds the direction
and the trial point together; the other, right after the evaluation, forms the pair
``s, y`` that trial would add to the history (into the spare pair) and every dot product
the line search and the next direction need. The directional derivative at the current
point and the direction's norm come from the Gram matrix of the two-loop basis.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import numpy as np

from spark_ps.ml.lr.vecspace import VecSpace

__all__ = ["minimize_lbfgs", "MinimizeResult", "IterationInfo", "WARM", "warm_state"]

V = TypeVar("V")

# breeze constants (LBFGS, StrongWolfeLineSearch, BacktrackingLineSearch, convergence checks).
_WOLFE_C1, _WOLFE_C2 = 1e-4, 0.9
_MAX_ZOOM, _MAX_LINE_SEARCH = 10, 10
_BT_MAX_ITER, _BT_GROW, _BT_MIN_ALPHA, _BT_MAX_ALPHA = 20, 2.1, 1e-10, 1e10
_FVAL_MEMORY = 20
_GRAD_FLOOR = 1e-8


_LOOP = ("f_init", "fvals", "history", "failed_once", "search_failed")


class _StepFailure(Exception):
    """A failed step (breeze's FirstOrderException): reset the history once, then stop."""


@dataclass
class IterationInfo:
    """What a callback sees after each iteration."""

    iteration: int
    value: float
    grad_norm: float
    step: float
    n_evals: int


@dataclass
class MinimizeResult(Generic[V]):
    """Outcome of :func:`minimize_lbfgs`.

    ``x`` is a live handle owned by the caller (release it when done);
    ``objective_history`` starts with the initial value and has one entry per
    iteration, as MLlib's ``summary.objectiveHistory``.
    """

    x: V
    value: float
    grad_norm: float
    n_iter: int
    n_evals: int
    reason: str
    objective_history: list[float] = field(default_factory=list)


@dataclass
class _Point:
    """Scalars of a line-search point: step t, value, directional derivative."""

    t: float
    f: float
    dd: float


class _Solver(Generic[V]):
    """State of one minimization: current point, trial point, history."""

    def __init__(self, space: VecSpace, evaluate: Callable, x0: Any, m: int, l1: Any) -> None:
        self.space, self.evaluate_fn, self.m, self.l1 = space, evaluate, m, l1
        self.x, self.g = x0, space.new("lbfgs.g")
        self.xt, self.gt = space.new("lbfgs.x_trial"), space.new("lbfgs.g_trial")
        self.d = space.new("lbfgs.direction")
        self.pg = space.new("lbfgs.pseudo_grad") if l1 is not None else None
        self.s: list[Any] = []  # most recent first
        self.y: list[Any] = []
        self.rho: list[float] = []
        self.yy0 = 1.0
        self.n_evals = 0
        self.f = self.adj_f = self.ft = self.adj_ft = 0.0
        self.gnorm = 0.0
        self.iter = 0
        # dot products of the two-loop basis, by the pair of handle ids: entries between
        # history vectors (which never change while in the history) and those of the
        # gradient the last accepted trial left (see _after_trial)
        self._gcache: dict[tuple[int, int], float] = {}
        self._gt_norm: float | None = None  # |g_trial|, when update_history computed it
        self._spare: tuple[Any, Any] | None = None  # the next history pair's storage
        self._plan: list | None = None  # the direction's terms, built with the first trial
        self._slope = (0.0, 0.0)  # (g . d, d . d) of the planned direction
        self._spec: dict | None = None  # what _after_trial computed for the last trial

    # ------------------------------------------------------------ evaluations

    def _eval(self, x: Any, g: Any) -> float:
        self.n_evals += 1
        return float(self.evaluate_fn(x, g))

    def start(self) -> None:
        """Evaluate the initial point (the only evaluation outside a line search)."""
        self.f = self._eval(self.x, self.g)
        self.adj_f = self.f
        if self.l1 is not None:
            self.adj_f += self.space.apply(
                "owlqn_pseudo_gradient", self.pg, self.x, self.g, self.l1
            )
        self.gnorm = self.space.nrm2(self._adjusted_grad())

    def _adjusted_grad(self) -> Any:
        return self.g if self.l1 is None else self.pg

    # ------------------------------------------------------------ checkpoints

    def snapshot(self, name_of: Callable[[Any], str], loop: dict) -> dict:
        """The solver at an iteration boundary: scalars and the names of its live vectors
        (x, g, pseudo-gradient, history); `loop` adds the driver loop's own variables."""
        names = {"x": name_of(self.x), "g": name_of(self.g)}
        if self.pg is not None:
            names["pg"] = name_of(self.pg)
        return {
            **names,
            "s": [name_of(h) for h in self.s],
            "y": [name_of(h) for h in self.y],
            "rho": list(self.rho),
            **{k: getattr(self, k) for k in ("yy0", "f", "adj_f", "gnorm", "iter", "n_evals")},
            **loop,
        }

    def restore(self, state: dict, handle_of: Callable[[str], Any]) -> dict:
        """Take up a :meth:`snapshot` (its vectors already hold their values again);
        returns the loop variables."""
        self.space.release(self.g)
        if self.pg is not None:
            self.space.release(self.pg)
            self.pg = handle_of(state["pg"])
        self.x, self.g = handle_of(state["x"]), handle_of(state["g"])
        self.s = [handle_of(n) for n in state["s"]]
        self.y = [handle_of(n) for n in state["y"]]
        self.rho = [float(r) for r in state["rho"]]
        for k in ("yy0", "f", "adj_f", "gnorm"):
            setattr(self, k, float(state[k]))
        self.iter, self.n_evals = int(state["iter"]), int(state["n_evals"])
        return {k: state[k] for k in _LOOP}

    # ------------------------------------------------------------ direction

    def direction(self) -> None:
        """``d = -H * grad`` by the two-loop recursion (breeze's ApproximateInverseHessian).

        Vector-free form (Chen et al., 2014): the recursion runs on the Gram matrix of
        the basis ``[s_0..s_k-1, y_0..y_k-1, grad]`` and builds ``d`` as one linear
        combination, so a PS backend pays at most two round trips instead of ``4k + 3``.
        For L-BFGS the combination is only planned here: the first trial builds it
        together with the trial point, and ``g . d`` and ``|d|`` come from the Gram matrix.
        """
        sp, d = self.space, self.d
        q = self._adjusted_grad()
        k = len(self.s)
        if not k:
            terms = [(-1.0, q)]
            # L-BFGS: q = g and gnorm = |g| (OWL-QN builds d below and needs neither)
            self._slope = (-self.gnorm * self.gnorm, self.gnorm * self.gnorm)
        else:
            sy = self.rho[0]
            if sy < 0 or math.isnan(sy) or 0.0 in (self.yy0, *self.rho):
                raise _StepFailure(f"unusable L-BFGS history (s'y = {sy}, y'y = {self.yy0})")
            basis = self.s + self.y + [q]
            gram = self._gram(basis)
            delta = np.zeros(2 * k + 1)
            delta[2 * k] = 1.0
            alphas = []
            for i in range(k):
                a = float(gram[i] @ delta) / self.rho[i]
                if math.isnan(a):
                    raise _StepFailure("NaN in the L-BFGS history")
                alphas.append(a)
                delta[k + i] -= a
            delta *= sy / self.yy0
            for i in range(k - 1, -1, -1):
                beta = float(gram[k + i] @ delta) / self.rho[i]
                delta[i] += alphas[i] - beta
            terms = [(-float(c), b) for c, b in zip(delta, basis, strict=True)]
            self._slope = (-float(delta @ gram[2 * k]), float(delta @ gram @ delta))
        if self.l1 is None:
            self._plan = terms
        else:
            sp.lincomb(d, terms)
            sp.apply("owlqn_constrain_direction", d, self.pg)

    def _gram(self, basis: list) -> np.ndarray:
        """Dot products of the basis: cached ones, and the rest in one request."""
        n = len(basis)
        ids = [id(h) for h in basis]
        gram = np.empty((n, n))
        missing = []
        for i in range(n):
            for j in range(i, n):
                hit = self._gcache.get(_pair(ids[i], ids[j]))
                if hit is None:
                    missing.append((i, j))
                else:
                    gram[i, j] = gram[j, i] = hit
        values = self.space.dots([(basis[i], basis[j]) for i, j in missing])
        for (i, j), v in zip(missing, values, strict=True):
            gram[i, j] = gram[j, i] = v
            if j < n - 1:  # between history vectors: valid while both stay in the history
                self._gcache[_pair(ids[i], ids[j])] = v
        return gram

    def reset_history(self) -> None:
        for h in self.s + self.y:
            self.space.release(h)
        self.s, self.y, self.rho = [], [], []
        self._gcache, self._spec = {}, None

    def release(self) -> None:
        """Give back every vector but ``x`` (the end of a minimization)."""
        held = [self.g, self.xt, self.gt, self.d, *(self._spare or ()), self.pg]
        for h in held:
            if h is not None:
                self.space.release(h)
        self._spare = None
        self.reset_history()

    def _take_spare(self) -> tuple[Any, Any]:
        if self._spare is None:
            k = len(self.s)
            self._spare = (self.space.new(f"lbfgs.s{k}"), self.space.new(f"lbfgs.y{k}"))
        return self._spare

    def _pair_combos(self, s: Any, y: Any) -> list:
        """``s = x_trial - x`` and ``y = g_trial - g``, as lincombs_dots combinations."""
        return [(s, [(1.0, self.xt), (-1.0, self.x)]), (y, [(1.0, self.gt), (-1.0, self.g)])]

    def _after_trial(self) -> float:
        """``g_trial . d`` after a trial's evaluation, and in the same request what the
        trial adds if the line search accepts it: ``s = x_trial - x`` and ``y = g_trial -
        g`` (into the spare pair), ``s'y``, ``y'y``, ``|g_trial|`` and every dot product of
        ``s``, ``y`` and ``g_trial`` with the next direction's basis."""
        s, y = self._take_spare()
        keep = min(len(self.s), self.m - 1)
        basis = [s, *self.s[:keep], y, *self.y[:keep], self.gt]
        new = (s, y, self.gt)
        pairs, seen = [(self.gt, self.d)], set()
        for a in new:
            for b in basis:
                key = _pair(id(a), id(b))
                if key not in seen:
                    seen.add(key)
                    pairs.append((a, b))
        values = self.space.lincombs_dots(self._pair_combos(s, y), pairs)
        dots = {_pair(id(a), id(b)): v for (a, b), v in zip(pairs[1:], values[1:], strict=True)}
        self._spec = {"evals": self.n_evals, "dots": dots}
        return values[0]

    def update_history(self) -> None:
        """Push ``s = x_trial - x`` and ``y = g_trial - g`` (the oldest pair becomes the
        spare); after an L-BFGS line search they and their dot products are already on
        hand (:meth:`_after_trial`)."""
        s, y = self._take_spare()
        spec, self._spec = self._spec, None
        if spec is not None and spec["evals"] == self.n_evals:
            dots = spec["dots"]
            sy, yy = dots[_pair(id(s), id(y))], dots[_pair(id(y), id(y))]
            self._gt_norm = math.sqrt(dots[_pair(id(self.gt), id(self.gt))])
        else:
            dots = {}
            pairs = [(s, y), (y, y)]
            if self.l1 is None:  # |g_trial|, which accept() needs next, rides along
                pairs.append((self.gt, self.gt))
            sy, yy, *gg = self.space.lincombs_dots(self._pair_combos(s, y), pairs)
            self._gt_norm = math.sqrt(gg[0]) if gg else None
        self._spare = None
        if len(self.s) == self.m:
            self._spare = (self.s.pop(), self.y.pop())
            self.rho.pop()
        self.s.insert(0, s)
        self.y.insert(0, y)
        self.rho.insert(0, sy)
        self.yy0 = yy
        # history vectors keep their dot products; those of the new gradient (g_trial's
        # handle becomes g's in accept()) come from the trial
        live = {id(h) for h in self.s + self.y}
        cache = {k: v for k, v in self._gcache.items() if k[0] in live and k[1] in live}
        cache.update(dots)
        self._gcache = cache

    def accept(self) -> None:
        """Make the trial point current (swap handles; nothing is copied)."""
        self.x, self.xt = self.xt, self.x
        self.g, self.gt = self.gt, self.g
        self.f = self.ft
        if self.l1 is None:
            self.adj_f = self.ft
            known, self._gt_norm = self._gt_norm, None
            self.gnorm = self.space.nrm2(self.g) if known is None else known
            return
        self.adj_f = self.ft + self.space.apply(
            "owlqn_pseudo_gradient", self.pg, self.x, self.g, self.l1
        )
        self.gnorm = self.space.nrm2(self._adjusted_grad())

    # ------------------------------------------------------------ L-BFGS line search

    def _phi(self, t: float) -> _Point:
        """Evaluate at ``x + t*d`` into the trial vectors."""
        sp = self.space
        trial = (self.xt, [(1.0, self.x), (t, self.d)])
        if self._plan is not None:  # the direction, built in the same request
            sp.lincombs_dots([(self.d, self._plan), trial], [])
            self._plan = None
        else:
            sp.lincomb(*trial)
        self.ft = self._eval(self.xt, self.gt)
        return _Point(t, self.ft, self._after_trial())

    def strong_wolfe(self) -> float:
        """breeze's StrongWolfeLineSearch (Nocedal & Wright alg. 3.5/3.6, cubic zoom)."""
        t = 1.0
        gd, dd = self._slope
        if self.iter == 0:
            t = _inverse(math.sqrt(max(dd, 0.0)), "search direction")
        low = _Point(0.0, self.f, gd)
        f0, dd0 = low.f, low.dd
        if dd0 > 0:
            raise _StepFailure(f"line search invoked with a non-descent direction: {dd0}")
        for i in range(_MAX_LINE_SEARCH):
            c = self._phi(t)
            if math.isinf(c.f) or math.isnan(c.f):
                t /= 2.0
                continue
            if c.f > f0 + _WOLFE_C1 * t * dd0 or (c.f >= low.f and i > 0):
                return self._zoom(low, c, f0, dd0)
            if abs(c.dd) <= _WOLFE_C2 * abs(dd0):
                return c.t
            if c.dd >= 0:
                return self._zoom(c, low, f0, dd0)
            low = c
            t *= 1.5
        raise _StepFailure("line search failed")

    def _zoom(self, low: _Point, hi: _Point, f0: float, dd0: float) -> float:
        for _ in range(_MAX_ZOOM):
            t = _interp(hi, low) if low.t > hi.t else _interp(low, hi)
            c = self._phi(t)
            if c.f > f0 + _WOLFE_C1 * c.t * dd0 or c.f >= low.f:
                hi = c
            else:
                if abs(c.dd) <= _WOLFE_C2 * abs(dd0):
                    return c.t
                if c.dd * (hi.t - low.t) >= 0:
                    hi = low
                low = c
        raise _StepFailure("line search zoom failed")

    # ------------------------------------------------------------ OWL-QN line search

    def _owl_trial(self, alpha: float) -> _Point:
        """Projected step of length ``alpha``: (alpha, adjusted value, pseudo-grad . d)."""
        sp = self.space
        sp.apply("owlqn_step_project", self.xt, self.x, self.d, self.pg, step=alpha)
        self.ft = self._eval(self.xt, self.gt)
        self.adj_ft = self.ft + sp.apply("l1_value", self.xt, self.l1)
        dd = sp.apply("owlqn_directional_derivative", self.d, self.xt, self.gt, self.l1)
        return _Point(alpha, self.adj_ft, dd)

    def backtracking(self) -> float:
        """breeze's BacktrackingLineSearch as OWL-QN configures it.

        As in breeze, the first trial is judged with the smooth value at the
        current point in place of its own value (only its derivative is used).
        """
        first = self.iter < 1
        shrink = 0.1 if first else 0.5
        init = 0.5 * _inverse(self.space.nrm2(self.g), "gradient") if first else 1.0
        f0, df0 = self.adj_f, self.space.dot(self.pg, self.d)
        cur = self._owl_trial(init)
        cur = _Point(init, self.f, cur.dd)
        prev_alpha = init
        for _ in range(_BT_MAX_ITER):
            if cur.f > f0 + cur.t * df0 * _WOLFE_C1:
                mult = shrink
            elif cur.dd < _WOLFE_C2 * df0:
                mult = _BT_GROW
            elif cur.dd > -_WOLFE_C2 * df0:
                mult = shrink
            else:
                return cur.t
            alpha = cur.t * mult
            if alpha < _BT_MIN_ALPHA:
                raise _StepFailure("step size underflow")
            if alpha > _BT_MAX_ALPHA:
                raise _StepFailure("step size overflow")
            prev_alpha = cur.t
            cur = self._owl_trial(alpha)
        # Out of tries: breeze keeps the step before the last one tried.
        self._owl_trial(prev_alpha)
        return prev_alpha


def _pair(a: int, b: int) -> tuple[int, int]:
    """The Gram cache's key of two handle ids (unordered)."""
    return (a, b) if a <= b else (b, a)


def _inverse(norm: float, what: str) -> float:
    """``1 / norm`` for a first step length; a zero norm is a failed step, not a crash."""
    if not norm > 0:
        raise _StepFailure(f"the {what} has norm {norm}")
    return 1.0 / norm


def _interp(l: _Point, r: _Point) -> float:
    """Safeguarded cubic interpolation of the minimizer between brackets ``l`` and ``r``."""
    d1 = l.dd + r.dd - 3 * (l.f - r.f) / (l.t - r.t)
    disc = d1 * d1 - l.dd * r.dd
    lo, hi = l.t + 0.1 * (r.t - l.t), l.t + 0.9 * (r.t - l.t)
    if disc < 0 or math.isnan(disc):
        # breeze would evaluate at NaN here; the bracket midpoint is the sane choice.
        return 0.5 * (lo + hi)
    d2 = math.sqrt(disc)
    t = r.t - (r.t - l.t) * (r.dd + d2 - d1) / (r.dd - l.dd + 2 * d2)
    if t < lo:
        return lo
    if t > hi:
        return hi
    return t if not math.isnan(t) else 0.5 * (lo + hi)


def _converged(
    st: _Solver, fvals: list[float], f_init: float, max_iter: int, tol: float, failed: bool
) -> str | None:
    """breeze's defaultConvergenceCheck, in its order; None while not converged."""
    if max_iter >= 0 and st.iter >= max_iter:
        return "max iterations reached"
    if len(fvals) >= 2 and abs(st.adj_f - max(fvals)) <= tol * abs(f_init):
        return "function values converged"
    if st.gnorm <= max(tol * abs(st.adj_f), _GRAD_FLOOR):
        return "gradient converged"
    if failed:
        return "line search failed!"
    return None


def minimize_lbfgs(
    space: VecSpace,
    evaluate: Callable[[Any, Any], float],
    x0: Any,
    *,
    max_iter: int,
    tol: float,
    m: int = 10,
    l1: Any = None,
    callback: Callable[[IterationInfo], None] | None = None,
    checkpoint: Callable[[int, Callable[[Callable], dict]], None] | None = None,
    resume: tuple[dict, Callable[[str], Any]] | None = None,
) -> MinimizeResult:
    """Minimize ``f(x) [+ sum(l1 * |x|)]`` by L-BFGS, or OWL-QN when ``l1`` is given.

    Parameters
    ----------
    space : VecSpace
        Where the vectors live; only its ops are used.
    evaluate : callable
        ``evaluate(x, g_out) -> f``: value of the smooth part at ``x``, gradient
        written into ``g_out``; must not modify ``x``. One distributed pass.
    x0 : handle
        Start point. The solver takes ownership (it becomes working storage);
        the solution comes back as ``result.x``.
    max_iter, tol : int, float
        As MLlib's ``maxIter`` / ``tol`` (breeze's relative tests: the value has
        changed by at most ``tol * |f(x0)|`` over the last 20 iterations, or the
        (pseudo-)gradient norm is at most ``max(tol * |f|, 1e-8)``).
    m : int
        History size (MLlib uses 10).
    l1 : handle, optional
        Per-coordinate L1 weights (>= 0; 0 for unpenalized coordinates such as
        the intercept). Switches to OWL-QN.
    callback : callable, optional
        Called with an :class:`IterationInfo` after every iteration.
    checkpoint : callable, optional
        ``checkpoint(boundary, snapshot)`` at the start and after every iteration;
        ``snapshot(name_of)`` returns the solver state (see ``resume``).
    resume : (state, handle_of), optional
        Go on from a ``snapshot`` instead of ``x0``; ``handle_of(name)`` gives the
        vector of that name, already restored to its value at that boundary. A `state`
        with the key ``WARM`` (see :func:`warm_state`) is a warm restart instead: ``x0``
        holds the iterate of that boundary, its value and gradient are evaluated again
        and the curvature history starts empty (the loop's counters and objective
        history go on from `state`).
    """
    if int(m) != m or m < 1:
        raise ValueError(f"minimize_lbfgs: m must be a positive integer, got {m!r}")
    if int(max_iter) != max_iter or max_iter < 0:
        raise ValueError(f"minimize_lbfgs: max_iter must be an integer >= 0, got {max_iter!r}")
    if not tol >= 0:
        raise ValueError(f"minimize_lbfgs: tol must be >= 0, got {tol!r}")
    st = _Solver(space, evaluate, x0, int(m), l1)
    if resume is None or WARM in resume[0]:
        st.start()
        f_init, fvals, history = st.adj_f, [math.inf], [st.adj_f]
        failed_once = search_failed = False
        if resume is not None:  # x0 holds the iterate of a boundary; the history is empty
            held = resume[0]
            f_init, fvals, history = held["f_init"], list(held["fvals"]), list(held["history"])
            st.iter, st.n_evals = int(held["iter"]), st.n_evals + int(held["n_evals"])
    else:
        loop = st.restore(*resume)
        f_init, fvals, history = loop["f_init"], list(loop["fvals"]), list(loop["history"])
        failed_once, search_failed = loop["failed_once"], loop["search_failed"]

    def snapshot(name_of: Callable[[Any], str]) -> dict:
        loop = (f_init, fvals, history, failed_once, search_failed)
        return st.snapshot(name_of, dict(zip(_LOOP, loop, strict=True)))

    if checkpoint is not None:
        checkpoint(len(history) - 1, snapshot)
    reason = _converged(st, fvals, f_init, max_iter, tol, search_failed)
    while reason is None:
        step = 0.0
        try:
            step = _iterate(st)
            failed_once = False
            st.iter += 1
            fvals = (fvals + [st.adj_f])[-_FVAL_MEMORY:]
        except _StepFailure:
            if failed_once:
                search_failed = True
            else:
                failed_once = True
                st.reset_history()
        history.append(st.adj_f)
        if callback is not None:
            callback(IterationInfo(st.iter, st.adj_f, st.gnorm, step, st.n_evals))
        if checkpoint is not None:
            checkpoint(len(history) - 1, snapshot)
        reason = _converged(st, fvals, f_init, max_iter, tol, search_failed)
    st.release()
    return MinimizeResult(st.x, st.adj_f, st.gnorm, st.iter, st.n_evals, reason, history)


#: The key of a :func:`warm_state`: the iterate's values themselves, not a vector name.
WARM = "x_values"


def warm_state(snapshot: Callable[[Callable], dict], read: Callable[[Any], Any]) -> dict:
    """What a warm restart needs from a ``checkpoint`` hook's `snapshot`: the iterate's
    values (``read(x)``) and the loop's counters, without the curvature history."""
    state = snapshot(lambda v: v)
    keep = ("f_init", "fvals", "history", "iter", "n_evals")
    return {WARM: read(state["x"]), **{k: state[k] for k in keep}}


def _iterate(st: _Solver) -> float:
    """One quasi-Newton step: direction, line search, history; returns the step length."""
    st.direction()
    if st.l1 is None:
        step = st.strong_wolfe()
        if step * st.gnorm < 1e-10:  # gnorm is |g| for L-BFGS
            raise _StepFailure("step size underflow")
    else:
        step = st.backtracking()
    st.update_history()
    st.accept()
    return step
