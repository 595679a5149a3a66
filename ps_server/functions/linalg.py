"""Batched BLAS-1 over co-located dense vectors: many dots, or one linear combination,
in a single request per shard (what vector-free L-BFGS needs per iteration)."""

from __future__ import annotations

import numpy as np

from ps_server.wire import RequestError

__all__ = ["SERVER_FUNCTIONS"]


def _colocated(tensors) -> list[np.ndarray]:
    first = tensors[0].spec
    for t in tensors:
        if (t.spec.dim, t.spec.cols, t.spec.offset) != (first.dim, first.cols, first.offset):
            raise RequestError(
                "INVALID_ARGUMENT", f"{t.where} is not co-located with {tensors[0].where}"
            )
    return [t.dense_values() for t in tensors]


def dots(tensors, args: dict, arrays: list[np.ndarray]):
    """Partial dot products of the model pairs `args["pairs"]` (indices into models)."""
    vecs = _colocated(tensors)
    pairs = args["pairs"]
    out = np.array([np.dot(vecs[i], vecs[j]) for i, j in pairs], dtype=np.float64)
    return {}, [out]


def lincomb(tensors, args: dict, arrays: list[np.ndarray]):
    """models[0] = sum_i coeffs[i] * models[i + 1] (models[0] may appear on the right)."""
    vecs = _colocated(tensors)
    coeffs = [float(c) for c in args["coeffs"]]
    if len(coeffs) != len(vecs) - 1:
        raise RequestError(
            "INVALID_ARGUMENT", f"lincomb: {len(coeffs)} coefficients for {len(vecs) - 1} vectors"
        )
    acc = coeffs[0] * vecs[1]
    for c, v in zip(coeffs[1:], vecs[2:], strict=True):
        acc += c * v
    vecs[0][...] = acc
    return {}, []


SERVER_FUNCTIONS = {"dots": dots, "lincomb": lincomb}
#: functions that change no state (replicated shards do not forward them)
READ_ONLY = ("dots",)
