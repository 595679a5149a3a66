"""One GBDT layer on a shard: sum the partitions' histograms, subtract, find the best splits.

Histograms travel as rows of a dense int64 tensor whose keys are feature ids, so each
shard owns the histograms of a contiguous feature range (range partitioning). A row is
one feature's ``[n_slots, n_bins, 4]`` block, flattened. Partitions push theirs as
exactly-once contributions; here they are summed exactly (int64), the larger child of
each split is derived as parent minus smaller child from the previous layer's full
histograms (kept in a tensor on this shard), and only the best split per node leaves.
"""

from __future__ import annotations

import numpy as np

from ps_server.functions.gbt import SPLIT_DTYPE, best_splits
from ps_server.wire import RequestError

__all__ = ["SERVER_FUNCTIONS", "layer_splits"]


def _blocks(tensor, n_slots: int, n_bins: int) -> np.ndarray:
    """A tensor's local rows as histograms [n_slots, f_local, n_bins, 4]."""
    f, width = tensor.spec.length, n_slots * n_bins * 4
    rows = tensor.store.slot("w")[:f]
    if rows.shape[1] < width:
        raise RequestError(
            "INVALID_ARGUMENT",
            f"{tensor.where}: rows of {rows.shape[1]} values cannot hold "
            f"{n_slots} slots x {n_bins} bins x 4 stats",
        )
    return rows[:, :width].reshape(f, n_slots, n_bins, 4).transpose(1, 0, 2, 3)


def layer_splits(tensors, args: dict, arrays: list[np.ndarray]):
    """models = [small (contributions of `round`), full_out, (prev_full)]; returns splits.

    args: round, n_slots, n_bins, split_kw, and for layers below the root:
    parent_slots, small_is_left, pick, pick_left; optional feature_mask (open x features).
    """
    small_t, full_t = tensors[0], tensors[1]
    n_slots, n_bins = int(args["n_slots"]), int(args["n_bins"])
    small_t.reduce(int(args["round"]), 0, True)  # op ADD after zeroing: the exact int sum
    small = _blocks(small_t, n_slots, n_bins)
    if len(tensors) > 2:
        prev = _blocks(tensors[2], int(args["n_prev"]), n_bins)[np.asarray(args["parent_slots"])]
        big = prev - small
        left_small = np.asarray(args["small_is_left"], dtype=bool)[:, None, None, None]
        left, right = np.where(left_small, small, big), np.where(left_small, big, small)
        pick_left = np.asarray(args["pick_left"], dtype=bool)[:, None, None, None]
        pick = np.asarray(args["pick"], dtype=np.intp)
        full = np.where(pick_left, left[pick], right[pick])
    else:
        full = small
    n_open = full.shape[0]
    width = n_open * n_bins * 4
    want = full_t.store.slot("w")
    if want.shape[1] < width:
        raise RequestError("INVALID_ARGUMENT", f"{full_t.where}: too narrow for {n_open} nodes")
    want[: full_t.spec.length, :width] = full.transpose(1, 0, 2, 3).reshape(full_t.spec.length, -1)
    offset = small_t.spec.offset
    mask = args.get("feature_mask")
    if mask is not None:
        mask = np.asarray(mask, dtype=bool)[:, offset : offset + small_t.spec.length]
    kw = dict(args["split_kw"])
    kw["scale"] = tuple(kw["scale"])
    result = best_splits(full, offset, feature_mask=mask, **kw)
    return {"n_open": n_open}, [np.frombuffer(result.tobytes(), dtype=np.uint8)]


def decode_splits(raw: np.ndarray) -> np.ndarray:
    """The SPLIT_DTYPE array a shard returned as bytes."""
    return np.frombuffer(np.ascontiguousarray(raw).tobytes(), dtype=SPLIT_DTYPE)


SERVER_FUNCTIONS = {"splits": layer_splits}
