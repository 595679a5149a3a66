"""Server-side optimizers whose state lives beside the weights, as slots of a Store.

A push of gradients becomes ``optimizer.step(store, rows, grads)`` on the shard that
owns the rows, so optimizer state never travels. Steps are lazy (sparse): only the
given rows change, which is what embedding tables and FTRL on huge key spaces need.
Arithmetic is float64 whatever the store dtype; results are cast back on write.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ps_server.shard.storage import Store

__all__ = [
    "Optimizer",
    "SGD",
    "Momentum",
    "AdaGrad",
    "Adam",
    "AdamW",
    "FTRL",
    "ftrl_weights",
    "ftrl_accumulate",
    "OPTIMIZERS",
    "make_optimizer",
]


def _positive(name: str, value: float) -> None:
    if not value > 0:
        raise ValueError(f"{name} must be > 0, got {value}")


def _non_negative(name: str, value: float) -> None:
    if not value >= 0:
        raise ValueError(f"{name} must be >= 0, got {value}")


def _unit(name: str, value: float) -> None:
    if not 0 <= value < 1:
        raise ValueError(f"{name} must be in [0, 1), got {value}")


class Optimizer:
    """Base class: parameters, state slots and one lazy update step.

    Subclasses declare ``name``, ``slots`` (state slot -> initial fill),
    ``defaults`` (None marks a required parameter) and ``checks`` (parameter ->
    validator), and implement ``_update``.
    """

    name: str = "optimizer"
    slots: tuple[str, ...] = ()
    defaults: dict[str, float | None] = {}
    checks: dict[str, Any] = {}

    def __init__(self, **params: float) -> None:
        unknown = sorted(set(params) - set(self.defaults))
        if unknown:
            raise ValueError(
                f"{self.name}: unknown parameter(s) {unknown}; known: {sorted(self.defaults)}"
            )
        merged: dict[str, float] = {}
        for key, default in self.defaults.items():
            value = params.get(key, default)
            if value is None:
                raise ValueError(f"{self.name}: missing required parameter {key!r}")
            if isinstance(value, bool) or not isinstance(value, (int, float, np.number)):
                raise ValueError(f"{self.name}: parameter {key} must be a number, got {value!r}")
            value = float(value)
            if not math.isfinite(value):
                raise ValueError(f"{self.name}: parameter {key} must be finite, got {value}")
            self.checks.get(key, _non_negative)(f"{self.name}: parameter {key}", value)
            merged[key] = value
        self.params = merged

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.params.items())
        return f"{type(self).__name__}({args})"

    def _fills(self) -> dict[str, float]:
        """Initial value of each state slot."""
        return {name: 0.0 for name in self.slots}

    def attach(self, store: Store) -> None:
        """Add this optimizer's state slots to ``store`` (existing slots are kept)."""
        for name, fill in self._fills().items():
            store.add_slot(name, fill)

    def step(self, store: Store, rows: np.ndarray, grads: np.ndarray) -> None:
        """Apply one update to ``rows`` of ``store`` (other rows are untouched).

        Parameters
        ----------
        store : Store
            Attached store; ``rows`` come from ``store.locate(keys, create=True)``.
        rows : np.ndarray
            int64 ``[n]`` row ids, UNIQUE (combine gradients of equal keys first):
            duplicate rows would be updated once with one of the gradients.
        grads : np.ndarray
            ``[n, cols]`` gradients (``[n]`` accepted when cols == 1).
        """
        r = np.asarray(rows, dtype=np.int64).reshape(-1)
        g = np.asarray(grads, dtype=np.float64)
        if g.ndim == 1 and store.cols == 1:
            g = g.reshape(-1, 1)
        if g.shape != (r.size, store.cols):
            raise ValueError(
                f"{self.name}.step: grads must have shape ({r.size}, {store.cols}), got {g.shape}"
            )
        if r.size and r.min() < 0:
            raise ValueError(f"{self.name}.step: row ids must be >= 0 (got {r.min()})")
        if r.size:
            self._update(store, r, g)

    def _update(self, store: Store, rows: np.ndarray, g: np.ndarray) -> None:
        raise NotImplementedError


class SGD(Optimizer):
    """``w -= lr * g``."""

    name = "sgd"
    defaults = {"lr": None}
    checks = {"lr": _positive}

    def _update(self, store: Store, rows: np.ndarray, g: np.ndarray) -> None:
        w = store.slot("w")
        w[rows] = w[rows] - self.params["lr"] * g


class Momentum(Optimizer):
    """Heavy ball: ``v = momentum * v + g; w -= lr * v``."""

    name = "momentum"
    slots = ("v",)
    defaults = {"lr": None, "momentum": 0.9}
    checks = {"lr": _positive, "momentum": _unit}

    def _update(self, store: Store, rows: np.ndarray, g: np.ndarray) -> None:
        w, vs = store.slot("w"), store.slot("v")
        v = self.params["momentum"] * vs[rows] + g
        vs[rows] = v
        w[rows] = w[rows] - self.params["lr"] * v


class AdaGrad(Optimizer):
    """``acc += g**2; w -= lr * g / (sqrt(acc) + eps)``; ``acc`` starts at initial_accumulator."""

    name = "adagrad"
    slots = ("acc",)
    defaults = {"lr": None, "eps": 1e-8, "initial_accumulator": 0.0}
    checks = {"lr": _positive, "eps": _positive, "initial_accumulator": _non_negative}

    def _fills(self) -> dict[str, float]:
        return {"acc": self.params["initial_accumulator"]}

    def _update(self, store: Store, rows: np.ndarray, g: np.ndarray) -> None:
        w, accs = store.slot("w"), store.slot("acc")
        acc = accs[rows] + g * g
        accs[rows] = acc
        w[rows] = w[rows] - self.params["lr"] * g / (np.sqrt(acc) + self.params["eps"])


class Adam(Optimizer):
    """Lazy Adam: moments and the bias-correction step count are per row.

    A row's count ``t`` advances only when the row is pushed, so a rarely seen key
    gets the same corrected first steps as a dense model would (as in TF's LazyAdam).
    """

    name = "adam"
    slots = ("m", "v", "t")
    defaults = {"lr": None, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8}
    checks = {"lr": _positive, "beta1": _unit, "beta2": _unit, "eps": _positive}

    def attach(self, store: Store) -> None:
        """Moments in the store dtype; the step count ``t`` is one float64 column."""
        store.add_slot("m", 0.0)
        store.add_slot("v", 0.0)
        store.add_slot("t", 0.0, dtype=np.float64, cols=1)

    def _update(self, store: Store, rows: np.ndarray, g: np.ndarray) -> None:
        b1, b2 = self.params["beta1"], self.params["beta2"]
        w, ms, vs, ts = store.slot("w"), store.slot("m"), store.slot("v"), store.slot("t")
        t = ts[rows] + 1.0
        m = b1 * ms[rows] + (1.0 - b1) * g
        v = b2 * vs[rows] + (1.0 - b2) * (g * g)
        ts[rows], ms[rows], vs[rows] = t, m, v
        m_hat = m / (1.0 - b1**t)
        v_hat = v / (1.0 - b2**t)
        w[rows] = w[rows] - self.params["lr"] * m_hat / (np.sqrt(v_hat) + self.params["eps"])


class AdamW(Adam):
    """Lazy Adam with decoupled weight decay, as MLlib's ``AdamWUpdater`` (FM's adamW solver).

    ``w -= lr * m_hat / (sqrt(v_hat) + eps) + weight_decay * w``: the decay is not scaled by
    ``lr`` (MLlib's form). Moments and the step count are per row, as in :class:`Adam`, so a
    row's state changes only when the row is pushed.
    """

    name = "adamw"
    defaults = {"lr": None, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8, "weight_decay": 0.0}
    checks = {"lr": _positive, "beta1": _unit, "beta2": _unit, "eps": _positive}

    def _update(self, store: Store, rows: np.ndarray, g: np.ndarray) -> None:
        w_old = store.slot("w")[rows].astype(np.float64)
        super()._update(store, rows, g)
        w = store.slot("w")
        w[rows] = w[rows] - self.params["weight_decay"] * w_old


def ftrl_weights(
    z: np.ndarray, n: np.ndarray, alpha: float, beta: float, l1: float, l2: float
) -> np.ndarray:
    """FTRL-proximal's closed-form weights from its per-coordinate state (z, n)."""
    z = np.asarray(z, dtype=np.float64)
    denom = (beta + np.sqrt(n)) / alpha + l2
    return np.where(np.abs(z) <= l1, 0.0, -(z - np.sign(z) * l1) / denom)


def ftrl_accumulate(
    w: np.ndarray, z: np.ndarray, n: np.ndarray, g: np.ndarray, alpha: float
) -> tuple[np.ndarray, np.ndarray]:
    """One FTRL-proximal state update for gradient ``g`` at weights ``w``: new (z, n)."""
    n_new = n + g * g
    sigma = (np.sqrt(n_new) - np.sqrt(n)) / alpha
    return z + g - sigma * w, n_new


class FTRL(Optimizer):
    """FTRL-proximal (McMahan et al., KDD 2013, Algorithm 1), per coordinate.

    ``sigma = (sqrt(n + g**2) - sqrt(n)) / alpha; z += g - sigma * w; n += g**2``, then
    ``w = 0`` where ``|z| <= l1`` else ``-(z - sign(z) l1) / ((beta + sqrt(n)) / alpha + l2)``.
    """

    name = "ftrl"
    slots = ("z", "n")
    defaults = {"alpha": None, "beta": 1.0, "l1": 0.0, "l2": 0.0}
    checks = {"alpha": _positive}

    def _update(self, store: Store, rows: np.ndarray, g: np.ndarray) -> None:
        p = self.params
        w, zs, ns = store.slot("w"), store.slot("z"), store.slot("n")
        z, n = ftrl_accumulate(w[rows], zs[rows], ns[rows].astype(np.float64), g, p["alpha"])
        zs[rows], ns[rows] = z, n
        w[rows] = ftrl_weights(z, n, p["alpha"], p["beta"], p["l1"], p["l2"])


_CLASSES: dict[str, type[Optimizer]] = {
    cls.name: cls for cls in (SGD, Momentum, AdaGrad, Adam, AdamW, FTRL)
}
OPTIMIZERS: tuple[str, ...] = tuple(_CLASSES)


def make_optimizer(name: str, params: dict[str, float] | None = None) -> Optimizer:
    """Build an optimizer by name (one of ``OPTIMIZERS``) with validated parameters."""
    cls = _CLASSES.get(name)
    if cls is None:
        raise ValueError(f"unknown optimizer {name!r}; known: {list(OPTIMIZERS)}")
    return cls(**(params or {}))
