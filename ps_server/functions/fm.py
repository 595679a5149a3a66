"""Factorization machines' optimizer step, run inside a PS shard.

Imports only numpy: this module is loaded by shard processes.

An FM lives in two sparse tensors: ``factors`` (one row of ``factorSize`` per feature key,
created on first pull with N(0, initStd) values derived from (seed, key)) and ``linear``
(one column: the linear weight of each feature key, and the intercept at key
``numFeatures``). Each worker pushes the gradient *sum* of its sampled rows as the
exactly-once contribution ``(round, part)`` of both tensors. ``step`` then combines the
contributions of one round (duplicate keys summed), scales them by ``1 / miniBatchSize``
(the driver knows the batch size only once every worker answered) and applies MLlib's
update to the rows they touch:

* ``gd``: MLlib's ``SquaredL2Updater``, ``w = w * (1 - lr * reg) - lr * g`` with
  ``lr = stepSize / sqrt(iteration)``;
* ``adamW``: the tensors' server-side :class:`ps_server.shard.optim.AdamW` (moments in slots of the
  store, ``weight_decay = regParam``), MLlib's ``AdamWUpdater``.

Rows a round does not touch are left as they are (a lazy step). The answer carries this
shard's sums of squares, for MLlib's regularization value and convergence test:
``before`` (||w||^2 of every held row before the step), ``after`` and ``diff``
(||w_new - w_old||^2 over the stepped rows).
"""

from __future__ import annotations

import math

import numpy as np

from ps_server.keys import combine
from ps_server.wire import RequestError

__all__ = ["SERVER_FUNCTIONS", "READ_ONLY"]

_SOLVERS = ("gd", "adamW")


def _arg(args: dict, name: str, kind: type):
    value = args.get(name) if isinstance(args, dict) else None
    ok = isinstance(value, kind) and not isinstance(value, bool)
    if kind is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        ok = ok and math.isfinite(value)
    if not ok:
        raise RequestError(
            "INVALID_ARGUMENT", f"fm.step: arg {name!r} must be a {kind.__name__}, got {value!r}"
        )
    return value


def _sumsq(store) -> float:
    w = store.slot("w")[: store.num_rows]
    return float(np.einsum("ij,ij->", w, w, dtype=np.float64))


def _folded(t, round_: int) -> int:
    """Bytes of the contributions a step of `round_` drops (every round up to it)."""
    rounds = [r for r in t.contributions.rounds() if r <= round_]
    return sum(k.nbytes + v.nbytes for r in rounds for k, v in t.contributions.entries(r))


def _combined(t, round_: int, parts: int) -> tuple[np.ndarray, np.ndarray]:
    entries = t.contributions.entries(round_, num_parts=parts)
    if not entries:
        return np.zeros(0, np.int64), np.zeros((0, t.spec.cols))
    keys = np.concatenate([k for k, _ in entries])
    values = np.concatenate([v.reshape(-1, t.spec.cols) for _, v in entries])
    return combine(keys, values)


def _step_one(t, keys, grads, solver: str, lr: float, reg: float) -> float:
    """Apply the update to `keys` of tensor `t` (its lock held); returns ||dw||^2."""
    rows = t.store.locate(keys, create=True)
    w = t.store.slot("w")
    old = w[rows].astype(np.float64)
    if solver == "gd":
        w[rows] = old * (1.0 - lr * reg) - lr * grads
    else:
        t.optimizer.step(t.store, rows, grads)
    d = w[rows] - old
    return float(np.einsum("ij,ij->", d, d, dtype=np.float64))


def step(tensors: list, args: dict, arrays: list[np.ndarray]) -> tuple[dict, list[np.ndarray]]:
    """tensors = [factors, linear]; args = {round, parts, scale, solver, lr, reg}."""
    if len(tensors) != 2:
        raise RequestError(
            "INVALID_ARGUMENT", f"fm.step takes 2 models (factors, linear), got {len(tensors)}"
        )
    round_, parts = _arg(args, "round", int), _arg(args, "parts", int)
    scale, lr, reg = _arg(args, "scale", float), _arg(args, "lr", float), _arg(args, "reg", float)
    solver = args.get("solver")
    if solver not in _SOLVERS:
        raise RequestError("INVALID_ARGUMENT", f"fm.step: solver {solver!r} not in {_SOLVERS}")
    for t in tensors:
        if t.spec.kind != "sparse" or t.store.dtype.kind != "f":
            raise RequestError(
                "INVALID_ARGUMENT", f"fm.step: {t.where} must be a sparse float tensor"
            )
        if solver == "adamW" and (t.optimizer is None or t.optimizer.name != "adamw"):
            raise RequestError(
                "FAILED_PRECONDITION", f"fm.step: solver adamW needs {t.where} with optimizer adamw"
            )
    factors, linear = tensors
    out = {"before": 0.0, "after": 0.0, "diff": 0.0, "rows": 0}
    with factors.lock, linear.lock:
        combined = [_combined(t, round_, parts) for t in tensors]
        for t, (keys, _) in zip(tensors, combined, strict=True):  # refused before any change
            with t.growing(keys, "an FM step of", _folded(t, round_)):
                pass
        for t, (keys, g) in zip(tensors, combined, strict=True):
            out["before"] += _sumsq(t.store)
            if keys.size:
                out["diff"] += _step_one(t, keys, g * scale, solver, lr, reg)
            out["after"] += _sumsq(t.store)
            out["rows"] += int(t.store.num_rows)
            t.contributions.drop_before(round_ + 1)
    return out, []


def discard(tensors: list, args: dict, arrays: list[np.ndarray]) -> tuple[dict, list[np.ndarray]]:
    """tensors = [factors, linear]: forget the pending contributions of one round."""
    round_ = _arg(args, "round", int)
    for t in tensors:
        with t.lock:
            t.contributions.drop(round_)
    return {}, []


def sumsq(tensors: list, args: dict, arrays: list[np.ndarray]) -> tuple[dict, list[np.ndarray]]:
    """||w||^2 over every row the tensors hold on this shard."""
    total = 0.0
    for t in tensors:
        with t.lock:
            total += _sumsq(t.store)
    return {"sumsq": total}, []


def footprint(tensors: list, args: dict, arrays: list[np.ndarray]) -> tuple[dict, list[np.ndarray]]:
    """Rows held and bytes used by each tensor on this shard."""
    out = {}
    for t in tensors:
        with t.lock:
            out[t.spec.name] = {"rows": int(t.store.num_rows), "nbytes": int(t.store.nbytes)}
    return out, []


SERVER_FUNCTIONS = {"step": step, "discard": discard, "sumsq": sumsq, "footprint": footprint}
READ_ONLY = ("sumsq", "footprint")
