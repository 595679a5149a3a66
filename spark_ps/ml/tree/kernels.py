"""Compiled kernels of the tree workers: histograms, routing, binning, the loss pass.

Why compiled: a layer touches every (row, feature) cell once. In numpy that is one
``np.add.at`` per feature and statistic (a scatter-add numpy runs element by element), about
half of a tree's time; a numba loop over rows does the same work in one pass over memory.
The kernels only add int64 fixed-point statistics (see :mod:`spark_ps.ml.tree.histogram`),
so their sums are exact and equal to the numpy path's bit for bit, whatever the order
(the loss pass's error is the one float sum: see :func:`logistic_pass`).

Threads: a task given more than one CPU (``spark.task.cpus``) splits each pass over its
threads (:mod:`spark_ps.ml.threads`), histograms by features and the rest by rows (numba
releases the GIL). Every kernel's output is the same whatever the split, except the loss
pass's error, a float sum of one partial sum per thread.

Compile cost: numba compiles on first call, ~1-2 s per signature; ``cache=True`` keeps the
machine code on disk (next to this file, else in numba's per-user cache dir, or
``NUMBA_CACHE_DIR``), so a Spark python worker pays only a cache load (tens of ms) once per
process. Without numba (or with ``SPARK_PS_NO_JIT=1``) callers fall back to numpy.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import numpy as np

from ps_server.jit import jit_wanted
from spark_ps.ml import threads
from spark_ps.ml.tree.portable_exp import exp_scalar

__all__ = [
    "HAVE_JIT",
    "add_leaf_values",
    "bin_pass",
    "logistic_pass",
    "node_histogram_pass",
    "quantize_pass",
    "route_pass",
    "row_ids_pass",
    "warm_up",
]

try:  # pragma: no cover - exercised by whichever environment runs the tests
    if not jit_wanted():
        raise ImportError("SPARK_PS_NO_JIT is set")
    from llvmlite import ir
    from numba import config, njit, types
    from numba.extending import intrinsic

    if config.DISABLE_JIT:  # NUMBA_DISABLE_JIT: an intrinsic cannot run as plain Python
        raise ImportError("NUMBA_DISABLE_JIT is set")
    HAVE_JIT = True
except ImportError:  # numpy fallbacks in histogram.py / local.py are used instead
    HAVE_JIT = False

    def njit(*args, **kwargs):  # noqa: D103 - a no-op decorator so the module imports
        return (lambda f: f) if not args or not callable(args[0]) else args[0]

    intrinsic = njit


@intrinsic
def _add4(typingctx, acc, at, v0, v1, v2, v3):
    """``acc[at:at + 4] += (v0, v1, v2, v3)`` as one 4 x int64 vector load, add and store.

    Why by hand: a histogram cell's four statistics are adjacent, but LLVM keeps the
    cell's scalar read-modify-writes apart (3-4 loads and stores a cell, which bound the
    pass). One vector add a cell: 20-35% less time per histogram pass on 100k x 80 rows
    (measured at every layer depth). The type is a plain LLVM vector, so a CPU without
    AVX2 gets two SSE2 adds; integer adds give the same sums on any CPU. `acc` must be a
    C-contiguous int64 array (nothing else compiles); the caller keeps
    ``at + 4 <= acc.size``."""
    if not (isinstance(acc, types.Array) and acc.dtype == types.int64 and acc.layout == "C"):
        return None
    sig = types.void(acc, at, v0, v1, v2, v3)

    def codegen(context, builder, signature, args):
        a = context.make_array(signature.args[0])(context, builder, args[0])
        at, *values = (
            context.cast(builder, v, t, types.int64)
            for v, t in zip(args[1:], signature.args[1:], strict=True)
        )
        vty = ir.VectorType(ir.IntType(64), 4)
        ptr = builder.bitcast(builder.gep(a.data, [at]), vty.as_pointer())
        vec = ir.Constant(vty, None)
        for k, x in enumerate(values):
            vec = builder.insert_element(vec, x, ir.Constant(ir.IntType(32), k))
        builder.store(builder.add(builder.load(ptr, align=8), vec), ptr, align=8)
        return context.get_dummy_value()

    return sig, codegen


@njit(cache=True, nogil=True)
def _hist_node_rows(
    flat, n_feat, row_step, col_step, node_of_row, slot_of_node, in_sample, stats, n_bins, unit,
    out, j0, j1,
):  # fmt: skip
    """Add each kept row's statistics to its slot in features ``j0 <= j < j1``; a bad bin's
    feature (the caller names it and discards `out`), else -1. `flat`: the ``[rows,
    n_feat]`` bins' buffer, bin (r, j) at ``r * row_step + j * col_step`` (C or Fortran
    order, no copy).

    Sums go to a fresh local array through unsigned offsets, which the compiler keeps apart
    from the inputs: 7 -> 5.5 ms on half of 131k x 24 rows (measured). A row's bins are read
    from one unsigned offset into the flat bins, and each feature's cells follow the last's
    (no 2-D index with its negative-index wraparound, no multiply per cell): 13 -> 10
    instructions a cell, 30.9 -> 20.8 ms per depth-5 tree on 100k x 80 rows, 32 bins
    (measured). A cell takes a row's count and statistics in one vector add
    (:func:`_add4`). `unit` > 0: every row's fixed-point weight is `unit` (no weight column
    is read)."""
    width = j1 - j0
    nb = np.uint64(n_bins)
    cell_span = nb * np.uint64(4)  # one feature's cells
    per_slot = np.uint64(width) * cell_span
    n_slots = out.size // max(n_feat * n_bins * 4, 1)
    block = width * n_bins * 4
    acc = np.zeros(n_slots * block, np.int64)  # flat [slots, width, bins, 4]
    rs, cs, w = np.uint64(row_step), np.uint64(col_step), np.uint64(width)
    first_col = np.uint64(j0) * cs
    for r in range(node_of_row.shape[0]):  # one pass: each row's bins and stats read once
        if not in_sample[r]:
            continue
        s = slot_of_node[node_of_row[r]]
        if s < 0:
            continue
        q0 = unit if unit != 0 else stats[0, r]
        q1, q2 = stats[1, r], stats[2, r]
        at = np.uint64(s) * per_slot
        cell = np.uint64(r) * rs + first_col
        k = np.uint64(0)
        while k < w:
            b = np.uint64(flat[cell])
            if b >= nb:
                return j0 + np.int64(k)
            _add4(acc, np.int64(at + b * np.uint64(4)), 1, q0, q1, q2)
            at += cell_span
            cell += cs
            k += np.uint64(1)
    for s in range(n_slots):  # out: flat [slots, features, bins, 4]
        first = (s * n_feat + j0) * n_bins * 4
        out[first : first + block] = acc[s * block : (s + 1) * block]
    return -1


@njit(cache=True, nogil=True, inline="always")
def _add_cell(acc, o, q0, q1, q2):
    """One row's count and three statistics into the bin cell at flat offset `o`."""
    _add4(acc, np.int64(o), 1, q0, q1, q2)


#: Features the root pass sums per sweep over the rows (the kernel is written for 4).
ROOT_BLOCK = 4
#: Widest rows the blocked root pass takes; wider roots go row by row. Each sweep reads every
#: row's cache line again, so the blocked pass's cost grows with the width: on 100k rows,
#: 24 features 2.3-3.0 vs 3.7-3.9 ms row by row, 64 features 7.9-8.9 vs 5.8-9.9 ms
#: (measured with vector adds on both cores; before them, 200 features took 77 vs 27 ms):
#: the two meet at 40-50 features.
ROOT_MAX_FEATURES = 48


@njit(cache=True, nogil=True)
def _hist_all_rows(bins, stats, n_bins, out, j0, j1):
    """Histograms of one slot holding every row (a tree's root) in features ``j0 <= j <
    j1``, four features per sweep over the rows; a bad bin's feature (the caller names it
    and discards `out`), else -1. uint8 bins only.

    Why four at a time: the pass is bound by reading the rows, not by adding. Feature by
    feature it read a row's statistics 24 times over 131k x 24 rows, 150 MB a pass, and two
    workers doing so at once overflow the shared L3 cache. Four features, each with its own
    histogram, also keep consecutive adds to a repeated bin apart, and the four adds of a
    row need no loop (a loop over a runtime block width measured no faster than one
    feature at a time). 10.2-10.6 -> 5.5-5.7 ms on 131k x 24 C-order rows (measured). Each
    histogram has room for any uint8 bin, so the bins are checked once per block, by
    looking for counts above ``n_bins``. A last block of fewer than four features repeats
    its last column and drops the copies."""
    n = bins.shape[0]
    span = np.uint64(256 * 4)
    acc = np.zeros(ROOT_BLOCK * 256 * 4, np.int64)
    last = j1 - 1
    for j in range(j0, j1, ROOT_BLOCK):
        c1, c2, c3 = min(j + 1, last), min(j + 2, last), min(j + 3, last)
        acc[:] = 0
        for r in range(n):
            q0, q1, q2 = stats[0, r], stats[1, r], stats[2, r]
            four = np.uint64(4)
            _add_cell(acc, np.uint64(bins[r, j]) * four, q0, q1, q2)
            _add_cell(acc, span + np.uint64(bins[r, c1]) * four, q0, q1, q2)
            _add_cell(acc, span * np.uint64(2) + np.uint64(bins[r, c2]) * four, q0, q1, q2)
            _add_cell(acc, span * np.uint64(3) + np.uint64(bins[r, c3]) * four, q0, q1, q2)
        for k in range(min(ROOT_BLOCK, j1 - j)):
            region = np.uint64(k) * span
            for b in range(n_bins, 256):  # a count above the last bin: a bad bin
                if acc[region + np.uint64(b * 4)] != 0:
                    return j + k
            first = np.uint64(j + k) * np.uint64(n_bins * 4)
            for c in range(n_bins * 4):
                out[first + np.uint64(c)] = acc[region + np.uint64(c)]
    return -1


@njit(cache=True, nogil=True)
def _route_rows(bins, node_of_row, feature, split_bin, left, right, split_now):
    """Unsigned node and feature ids (the caller has range-checked them) leave no index
    wraparound, and the compiler then picks the child without a branch: the left/right
    branch mispredicted on about half the rows (1.15-1.38 -> 0.22-0.28 ms per 131k-row
    layer, measured)."""
    for r in range(node_of_row.shape[0]):
        nd = np.uint64(node_of_row[r])
        if split_now[nd]:
            if np.int64(bins[r, np.uint64(feature[nd])]) <= split_bin[nd]:
                node_of_row[r] = left[nd]
            else:
                node_of_row[r] = right[nd]


# ------------------------------------------------------------------------------- threads

#: Fewer rows than this a thread are not split: handing a part to a thread costs ~20-50 us.
_MIN_ROWS = 16384
#: Nor are histograms of fewer (row, feature) cells.
_MIN_CELLS = 1 << 18


def _run(kernel: Callable, calls: list[tuple]) -> list:
    """``kernel(*args)`` for each of `calls`, the first on this thread and the rest on the
    pool at once; the results in order."""
    if not HAVE_JIT:  # plain Python holds the GIL: no use splitting it
        return [kernel(*args) for args in calls]
    return threads.run(kernel, calls)


def _by_rows(
    kernel: Callable, n: int, args_of: Callable[[int, int], tuple], split: bool = True
) -> list:
    """`kernel` over rows ``[a, b)`` of `n` (``args_of(a, b)`` its arguments), split over
    the threads when each gets at least :data:`_MIN_ROWS` rows (and `split`: row slices of
    an F-ordered matrix would compile another signature); the parts' results in order."""
    parts = threads.ranges(n, min(threads.count(), max(1, n // _MIN_ROWS)) if split else 1)
    return _run(kernel, [args_of(a, b) for a, b in parts])


def _check_bins(bins: np.ndarray, bad: int, n_bins: int) -> None:
    """A kernel stopped at feature `bad` (>= 0) on a bin out of range: name it."""
    if bad >= 0:
        top = int(np.asarray(bins)[:, bad].max())
        raise ValueError(f"feature {bad} has bin {top} >= n_bins={n_bins}")


def node_histogram_pass(
    bins: np.ndarray,
    node_of_row: np.ndarray,
    slot_of_node: np.ndarray,
    in_sample: np.ndarray,
    row_stats: np.ndarray,
    n_slots: int,
    n_bins: int,
    unit_weight: int | None = None,
) -> np.ndarray:
    """Histograms int64 ``[n_slots, f, n_bins, 4]`` of the rows ``in_sample`` whose node has
    a slot (``slot_of_node[node_of_row] >= 0``), the slot looked up in the loop.
    ``unit_weight``: every row's weight statistic, when all are equal (see
    ``histogram.unit_weight``).

    ``bins`` should be C-ordered (a row's bins are read together; Fortran order is read as
    it is, more slowly, anything else copied); callers have checked the shapes and that
    nodes and slots are in range. A bin ``>= n_bins`` raises, naming its feature. A slot
    of every row (a tree's root without subsampling) of at most :data:`ROOT_MAX_FEATURES`
    features runs four features a sweep (:func:`_hist_all_rows`), anything else row by
    row: the sums are exact integers, the same in any order.
    """
    n, n_feat = bins.shape
    out = np.zeros(n_slots * n_feat * n_bins * 4, dtype=np.int64)
    root = slot_of_node.shape == (1,) and slot_of_node[0] == 0  # nodes are in range: all 0
    narrow = bins.dtype == np.uint8 and n_feat <= ROOT_MAX_FEATURES and n_bins <= 256
    if root and n_slots == 1 and narrow and in_sample.all():
        kernel, args = _hist_all_rows, (bins, row_stats, n_bins, out)
        step = ROOT_BLOCK  # whole blocks per thread
    else:
        unit = np.int64(unit_weight or 0)
        kernel, step = _hist_node_rows, 1
        if bins.flags.f_contiguous and not bins.flags.c_contiguous:
            flat, steps = bins.ravel(order="F"), (1, n)  # a view, read column-strided
        else:
            flat, steps = np.ascontiguousarray(bins).reshape(-1), (n_feat, 1)
        head = (flat, n_feat, *steps)
        args = (*head, node_of_row, slot_of_node, in_sample, row_stats, n_bins, unit, out)
    parts = threads.ranges(n_feat, threads.count() if n * n_feat >= _MIN_CELLS else 1, step)
    found = [b for b in _run(kernel, [(*args, j0, j1) for j0, j1 in parts]) if b >= 0]
    _check_bins(bins, min(found, default=-1), n_bins)
    return out.reshape(n_slots, bins.shape[1], n_bins, 4)


def route_pass(
    bins: np.ndarray,
    node_of_row: np.ndarray,
    feature: np.ndarray,
    split_bin: np.ndarray,
    left: np.ndarray,
    right: np.ndarray,
    split_now: np.ndarray,
) -> np.ndarray:
    """``node_of_row`` with the rows of nodes split this layer moved to their child (a copy)."""
    splits = (feature, split_bin, left, right, split_now)
    out = np.array(node_of_row, dtype=np.int32, copy=True)
    c_order = bins.flags.c_contiguous
    _by_rows(_route_rows, out.shape[0], lambda a, b: (bins[a:b], out[a:b], *splits), c_order)
    return out


@njit(cache=True, nogil=True)
def _quantize(targets, weights, center, to_u, to_q, limit, out, r0, r1):
    for r in range(r0, r1):  # the numpy path's operations, in its order
        u = (targets[r] - center) * to_u
        w = weights[r]
        wq = w * to_q
        if not (abs(u) <= 1.0 and w >= 0.0 and wq <= limit):
            return r
        wu = w * u
        out[0, r] = np.int64(np.rint(wq))
        out[1, r] = np.int64(np.rint(wu * to_q))
        out[2, r] = np.int64(np.rint((wu * u) * to_q))
    return -1


def quantize_pass(
    targets: np.ndarray, weights: np.ndarray, center: float, target_exp: int, weight_exp: int
) -> np.ndarray | None:
    """``quantize_rows``'s int64 (3, n) statistics in one pass, or None if a row breaks the
    scale's bounds or a power of two is out of float range (the numpy path then decides).

    Multiplying by an exact power of two is correctly rounded, as ``np.ldexp`` is, so the
    integers are the numpy path's bit for bit.
    """
    if not (-1000 < target_exp < 1000 and -1000 < weight_exp < 1000):
        return None
    out = np.empty((3, targets.shape[0]), dtype=np.int64)
    args = (targets, weights, float(center), 2.0**-target_exp, 2.0**weight_exp, 2.0**62, out)
    bad = _by_rows(_quantize, targets.shape[0], lambda a, b: (*args, a, b))
    return None if any(r >= 0 for r in bad) else out


_exp = njit(cache=True, nogil=True)(exp_scalar)


@njit(cache=True, nogil=True)
def _logistic_rows(pred, labels, targets, z):
    lo, hi = np.inf, -np.inf
    for r in range(pred.shape[0]):
        y = labels[r]
        m = 2.0 * y * pred[r]
        e = _exp(m)  # LogLoss.gradient's exp: the same bits on every CPU
        t = 4.0 * y / (1.0 + e)  # -LogLoss.gradient, bit for bit
        targets[r] = t
        lo = min(lo, t)
        hi = max(hi, t)
        z[r] = e if m < 0.0 else 1.0 / e  # exp(-|m|), from the same exp
    return lo, hi


@njit(cache=True, nogil=True)
def _error_sum(pred, labels, weights, log1p_z):
    err = 0.0
    for r in range(pred.shape[0]):
        m = 2.0 * labels[r] * pred[r]
        err += weights[r] * (2.0 * (max(-m, 0.0) + log1p_z[r]))
    return err


def logistic_pass(
    pred: np.ndarray, labels: np.ndarray, weights: np.ndarray
) -> tuple[np.ndarray, float, float, float]:
    """LogLoss's pseudo-residuals of margins `pred` (labels +-1), their min and max, and the
    weighted error sum: (targets, min, max, sum w * error).

    Why: numpy took ~5 ms a tree for 131k rows, in three exps, a log1p and a dozen
    temporaries; here one exp serves both. The targets equal ``-LogLoss.gradient`` bit for
    bit on any CPU (both use :mod:`~spark_ps.ml.tree.portable_exp`); the error uses
    ``1/exp(m)`` for ``exp(-m)`` and numpy's vectorized ``log1p`` (a library call a row
    took 0.9 of 3.0 ms on 100k rows), so it may differ from ``LogLoss.error`` in its last
    bits. An empty input gives min inf and max -inf."""
    pred, labels, weights = (np.ascontiguousarray(a, np.float64) for a in (pred, labels, weights))
    n = pred.shape[0]
    targets, z = np.empty(n, dtype=np.float64), np.empty(n, dtype=np.float64)
    parts = _by_rows(_logistic_rows, n, lambda a, b: (pred[a:b], labels[a:b], targets[a:b], z[a:b]))
    np.log1p(z, out=z)
    sums = _by_rows(_error_sum, n, lambda a, b: (pred[a:b], labels[a:b], weights[a:b], z[a:b]))
    lo = min((p[0] for p in parts), default=np.inf)
    hi = max((p[1] for p in parts), default=-np.inf)
    err = 0.0
    for part in sums:  # in row order: the same sum for the same thread count
        err += part
    return targets, lo, hi, err


@njit(cache=True, nogil=True)
def _add_leaf_values(pred, node_of_row, values, weight):
    for r in range(pred.shape[0]):
        pred[r] += values[node_of_row[r]] * weight


def add_leaf_values(
    pred: np.ndarray, node_of_row: np.ndarray, values: np.ndarray, weight: float
) -> None:
    """``pred += values[node_of_row] * weight`` in place, without numpy's two temporaries
    (the same bits). Callers have checked that every node indexes `values`."""
    w = float(weight)
    _by_rows(_add_leaf_values, pred.shape[0], lambda a, b: (pred[a:b], node_of_row[a:b], values, w))


@njit(cache=True, nogil=True)
def _bin_rows(X, thr, n_thr, out):
    """``searchsorted(thr[j, :n_thr[j]], X[r, j], side="left")`` per cell, row by row; NaN
    sorts after every threshold, as numpy's does."""
    for r in range(X.shape[0]):
        for j in range(X.shape[1]):
            x = X[r, j]
            lo, hi = 0, n_thr[j]
            if x != x:
                lo = hi
            while lo < hi:
                mid = (lo + hi) >> 1
                if thr[j, mid] < x:
                    lo = mid + 1
                else:
                    hi = mid
            out[r, j] = lo


@njit(cache=True, nogil=True)
def _bin_rows_count(X, thr, n_thr, out):
    """:func:`_bin_rows` by counting: ``searchsorted(side="left")`` is the number of (sorted)
    thresholds below x; the rows of `thr` are padded with +inf, so every cell runs the same
    branch-free loop, which LLVM vectorizes."""
    width = thr.shape[1]
    for r in range(X.shape[0]):
        for j in range(X.shape[1]):
            x = X[r, j]
            c = 0
            for k in range(width):
                c += thr[j, k] < x
            if x != x:
                c = n_thr[j]
            out[r, j] = c


#: Up to this many thresholds a feature, counting beats the binary search: 26 against
#: 128 ms for 131k x 24 rows and 31 thresholds (measured); its work grows with the width.
_COUNT_WIDTH = 64


def bin_pass(X: np.ndarray, thresholds: list[np.ndarray], dtype) -> np.ndarray:
    """C-ordered bins of float64 rows `X`, numpy's ``searchsorted(side="left")`` per feature
    bit for bit, in one pass over the rows. One numpy search per feature read each strided
    column once and wrote the bins by column (Fortran order) for a transpose afterwards:
    ~0.1 s of a worker's 131k x 24 set-up, measured."""
    n_thr = np.array([t.size for t in thresholds], dtype=np.int64)
    width = -(-max(int(n_thr.max(initial=0)), 1) // 8) * 8  # whole vectors of doubles
    count = width <= _COUNT_WIDTH
    thr = np.full((len(thresholds), width), np.inf if count else 0.0)
    for j, t in enumerate(thresholds):  # loop over features: a few dozen
        thr[j, : t.size] = t
    out = np.empty(X.shape, dtype=dtype)
    kernel = _bin_rows_count if count else _bin_rows
    _by_rows(kernel, X.shape[0], lambda a, b: (X[a:b], thr, n_thr, out[a:b]), X.flags.c_contiguous)
    return out


@njit(cache=True, nogil=True)
def _mix(z):
    """``ps_server.keys.mix64`` of one uint64 word (splitmix64's finalizer)."""
    z ^= z >> np.uint64(30)
    z *= np.uint64(0xBF58476D1CE4E5B9)
    z ^= z >> np.uint64(27)
    z *= np.uint64(0x94D049BB133111EB)
    z ^= z >> np.uint64(31)
    return z


#: Rows hashed together by :func:`_row_ids`.
_ID_BLOCK = 64


@njit(cache=True, nogil=True)
def _row_ids(y, X, w, out):
    """Each row's chain of ``_mix`` calls depends on the previous one (~13 cycles each),
    so the rows go 64 at a time, their words copied column by column: the 64 chains then
    advance side by side in vector registers (27.5 -> 12.2 ms on 100k x 80 rows, measured;
    four chains interleaved by hand: 17 ms)."""
    n, f = X.shape
    h = np.empty(_ID_BLOCK, np.uint64)
    cols = np.empty((f, _ID_BLOCK), np.uint64)
    for r0 in range(0, n, _ID_BLOCK):
        m = min(_ID_BLOCK, n - r0)
        for i in range(m):
            for j in range(f):
                cols[j, i] = X[r0 + i, j]
            h[i] = _mix(y[r0 + i])
        for j in range(f):
            col = cols[j]
            for i in range(m):
                h[i] = _mix(h[i] ^ col[i])
        for i in range(m):
            out[r0 + i] = _mix(h[i] ^ w[r0 + i])


def row_ids_pass(X: np.ndarray, y: np.ndarray, w: np.ndarray) -> np.ndarray:
    """int64 hash of each row's label, feature and weight bits, chained through ``mix64`` as
    ``spark_ps.ml.gbt.rounds._row_ids`` does column by column: one pass over the rows
    instead of ~150 whole-array numpy passes (40-90 ms of a 131k x 24 set-up, measured)."""
    out = np.empty(X.shape[0], dtype=np.uint64)
    bits = np.ascontiguousarray(X, dtype=np.float64).view(np.uint64)
    as_u64 = [np.ascontiguousarray(a, dtype=np.float64).view(np.uint64) for a in (y, w)]
    y, w = as_u64
    _by_rows(_row_ids, X.shape[0], lambda a, b: (y[a:b], bits[a:b], w[a:b], out[a:b]))
    return out.view(np.int64)


def _warm() -> None:
    """Call every kernel once with the argument types the workers use (uint8 C-order bins)."""
    bins = np.zeros((2, 1), dtype=np.uint8)
    i32 = np.zeros(2, dtype=np.int32)
    stats = np.zeros((3, 2), np.int64)
    node_histogram_pass(bins, i32, i32[:1], np.ones(2, bool), stats, 1, 1)  # a root
    node_histogram_pass(bins, i32, i32[:1], np.zeros(2, bool), stats, 1, 1)  # any other layer
    route_pass(bins, i32, i32, i32, i32, i32, np.zeros(2, bool))
    quantize_pass(np.zeros(2), np.ones(2), 0.0, 0, 0)
    bin_pass(np.zeros((2, 1)), [np.zeros(1)], np.uint8)
    row_ids_pass(np.zeros((2, 1)), np.zeros(2), np.ones(2))
    logistic_pass(np.zeros(2), np.ones(2), np.ones(2))
    add_leaf_values(np.zeros(2), i32, np.zeros(1), 1.0)
    bin_pass(np.zeros((2, 1)), [np.arange(_COUNT_WIDTH + 1.0)], np.uint8)


def warm_up() -> threading.Thread | None:
    """Load (or compile) the kernels in a background thread, e.g. while a worker waits for
    its Arrow batches: the first use costs ~1-2 s of CPU even from numba's disk cache."""
    if not HAVE_JIT:
        return None
    t = threading.Thread(target=_warm, name="spark-ps-jit-warm-up", daemon=True)
    t.start()
    return t
