"""Batched BLAS-1 over co-located dense vectors: many dots, or one linear combination,
in a single request per shard (what vector-free L-BFGS needs per iteration).

The ``col_*`` functions and ``spread`` serve ``[rows, cols]`` dense matrices laid out row
by row (a multinomial model: one row per feature, one column per class), whose shards
hold whole rows: per-column dots, a per-column axpy, and a vector copied into every column.
"""

from __future__ import annotations

import numpy as np

from ps_server.functions import linalg_jit
from ps_server.wire import RequestError

__all__ = ["SERVER_FUNCTIONS", "pair_dots", "warm_up"]


def _colocated(tensors) -> list[np.ndarray]:
    first = tensors[0].spec
    for t in tensors:
        if (t.spec.dim, t.spec.cols, t.spec.offset) != (first.dim, first.cols, first.offset):
            raise RequestError(
                "INVALID_ARGUMENT", f"{t.where} is not co-located with {tensors[0].where}"
            )
    return [t.dense_values() for t in tensors]


#: Entries a linear combination sums at a time: its blocks stay in the core's cache.
_BLOCK = 16384


def _combine(out: np.ndarray, terms: list[tuple[float, np.ndarray]]) -> None:
    """``out = sum(c * v)`` block by block, in place (``out`` may be one of the ``v``).

    Why blocks: over whole vectors every term made a temporary the size of the vector and
    a second pass over it; an L-BFGS direction of 21 terms over 556k entries took 24 ms,
    blocked 15 ms (measured). Each entry gets the operations of ``acc = c0 * v0; acc +=
    c * v ...; out[...] = acc`` in the same order and dtypes, so the result is the same
    bit for bit. Float64 vectors take the compiled kernel (:mod:`linalg_jit`: the same
    operations, one pass over each block of each term), others these numpy calls."""
    jit = linalg_jit.kernel()
    vecs = [v for _, v in terms]
    if jit is not None and all(_flat64(v) for v in (out, *vecs)):
        jit(out, np.array([c for c, _ in terms], dtype=np.float64), vecs)
        return
    n = out.shape[0]
    size = min(_BLOCK, n)
    acc = np.empty(size, dtype=np.result_type(terms[0][1].dtype, 1.0))  # c0 * v0's dtype
    tmp: dict[np.dtype, np.ndarray] = {}  # c * v's, one per dtype of the terms
    for lo in range(0, n, _BLOCK):
        hi = min(lo + _BLOCK, n)
        a = acc[: hi - lo]
        np.multiply(terms[0][1][lo:hi], terms[0][0], out=a)
        for c, v in terms[1:]:
            kind = np.result_type(v.dtype, 1.0)
            t = tmp.setdefault(kind, np.empty(size, dtype=kind))[: hi - lo]
            np.multiply(v[lo:hi], c, out=t)
            a += t
        out[lo:hi] = a


#: Entries a dot product sums at a time (256 KB of float64 per vector), see `pair_dots`.
DOT_CHUNK = 32768


def pair_dots(vecs: list[np.ndarray], pairs) -> list[float]:
    """``vecs[i] . vecs[j]`` for each ``(i, j)`` of `pairs`, a chunk of every pair at a
    time: a vector's chunk is read from memory once and stays in cache for every pair it
    is in, where whole-vector dots streamed it once per pair (an L-BFGS request's ~60 dots
    of 556k entries, both shards at once: 20-21 -> 14.5-14.7 ms, measured). A pair's value
    is its chunks' ``np.dot``, added in chunk order: it depends on the pair only, not on the
    pairs asked with it (the solver caches dots across requests), and it is ``np.dot``'s
    own for vectors of at most one chunk."""
    n = vecs[0].shape[0] if vecs else 0
    out = [float(np.dot(vecs[i][:DOT_CHUNK], vecs[j][:DOT_CHUNK])) for i, j in pairs]
    for lo in range(DOT_CHUNK, n, DOT_CHUNK):
        part = [v[lo : lo + DOT_CHUNK] for v in vecs]
        for p, (i, j) in enumerate(pairs):
            out[p] += float(np.dot(part[i], part[j]))
    return out


def _flat64(v: np.ndarray) -> bool:
    return v.dtype == np.float64 and v.ndim == 1 and v.flags.c_contiguous


def warm_up() -> None:
    """Load the compiled combination from numba's cache (else paid by a fit's first
    direction)."""
    _combine(np.zeros(2), [(1.0, np.ones(2)), (2.0, np.ones(2))])


def dots(tensors, args: dict, arrays: list[np.ndarray]):
    """Partial dot products of the model pairs `args["pairs"]` (indices into models), then
    the values at `args["pick"]` ([model, key] pairs; 0 from shards not owning the key),
    so that the caller's sum over shards is each value exactly."""
    vecs = _colocated(tensors)
    out = pair_dots(vecs, args["pairs"])
    for i, key in args.get("pick", []):
        spec = tensors[i].spec
        if not 0 <= int(key) < spec.dim:
            raise RequestError(
                "INVALID_ARGUMENT", f"dots: key {key} of {tensors[i].where} not in [0, {spec.dim})"
            )
        row = int(key) - spec.offset
        out.append(vecs[i][row] if 0 <= row < spec.length else 0.0)
    return {}, [np.array(out, dtype=np.float64)]


def lincomb(tensors, args: dict, arrays: list[np.ndarray]):
    """models[0] = sum_i coeffs[i] * models[i + 1] (models[0] may appear on the right)."""
    vecs = _colocated(tensors)
    coeffs = [float(c) for c in args["coeffs"]]
    if not coeffs or len(coeffs) != len(vecs) - 1:
        raise RequestError(
            "INVALID_ARGUMENT", f"lincomb: {len(coeffs)} coefficients for {len(vecs) - 1} vectors"
        )
    _combine(vecs[0], list(zip(coeffs, vecs[1:], strict=True)))
    return {}, []


def lincombs_dots(tensors, args: dict, arrays: list[np.ndarray]):
    """For each [out, [[coeff, model], ...]] of `args["combos"]` in order, models[out] =
    sum coeff * models[model] (as `lincomb`); then the partial dots of `args["pairs"]`."""
    vecs = _colocated(tensors)
    n = len(vecs)
    for out, terms in args["combos"]:
        if not terms or not all(0 <= int(i) < n for i in [out, *(t[1] for t in terms)]):
            raise RequestError("INVALID_ARGUMENT", f"lincombs_dots: bad combination {out, terms}")
        _combine(vecs[int(out)], [(float(c), vecs[int(i)]) for c, i in terms])
    return {}, [np.array(pair_dots(vecs, args["pairs"]), dtype=np.float64)]


def _columns(tensors) -> tuple[list[np.ndarray], int]:
    """The co-located matrices as ``[rows, cols]`` views, and cols."""
    vecs = _colocated(tensors)
    cols = int(tensors[0].spec.cols)
    return [v.reshape(-1, cols) for v in vecs], cols


def col_dots(tensors, args: dict, arrays: list[np.ndarray]):
    """Per-column partial dots of the model pairs `args["pairs"]` (``cols`` values a pair),
    then the row `args["rows"]` ([model, row] pairs; zeros from shards not owning it)."""
    mats, cols = _columns(tensors)
    out = [np.einsum("ij,ij->j", mats[i], mats[j]) for i, j in args["pairs"]]
    for i, row in args.get("rows", []):
        spec = tensors[i].spec
        if not 0 <= int(row) < spec.dim:
            raise RequestError(
                "INVALID_ARGUMENT",
                f"col_dots: row {row} of {tensors[i].where} not in [0, {spec.dim})",
            )
        r = int(row) - spec.offset
        out.append(mats[i][r] if 0 <= r < spec.length else np.zeros(cols))
    return {}, [np.concatenate(out) if out else np.zeros(0)]


def col_axpy(tensors, args: dict, arrays: list[np.ndarray]):
    """models[1][:, c] += args["coeffs"][c] * models[0][:, c] for every column c."""
    mats, cols = _columns(tensors)
    if len(mats) != 2:
        raise RequestError("INVALID_ARGUMENT", f"col_axpy takes 2 models, got {len(mats)}")
    coeffs = np.asarray(args["coeffs"], dtype=np.float64)
    if coeffs.shape != (cols,):
        raise RequestError(
            "INVALID_ARGUMENT", f"col_axpy: {coeffs.size} coefficients for {cols} columns"
        )
    mats[1] += coeffs * mats[0]
    return {}, []


def spread(tensors, args: dict, arrays: list[np.ndarray]):
    """models[0] (a ``[rows, cols]`` matrix) gets the vector models[1] in every column."""
    if len(tensors) != 2:
        raise RequestError("INVALID_ARGUMENT", f"spread takes 2 models, got {len(tensors)}")
    out, vec = tensors
    if (out.spec.dim, out.spec.offset) != (vec.spec.dim, vec.spec.offset) or vec.spec.cols != 1:
        raise RequestError(
            "INVALID_ARGUMENT",
            f"spread: {vec.where} is not a vector row-co-located with {out.where}",
        )
    cols = int(out.spec.cols)
    out.dense_values().reshape(-1, cols)[...] = vec.dense_values()[:, None]
    return {}, []


SERVER_FUNCTIONS = {
    "dots": dots,
    "lincomb": lincomb,
    "lincombs_dots": lincombs_dots,
    "col_dots": col_dots,
    "col_axpy": col_axpy,
    "spread": spread,
}
#: functions that change no state (replicated shards do not forward them)
READ_ONLY = ("dots", "col_dots")
