"""One GBDT layer on a shard: sum the partitions' histograms, subtract, find the best splits.

Each shard owns the histograms of a contiguous feature range. Every worker calls
``gbt_layer.splits`` on every shard with its partition's histograms of that shard's features
(the smaller child of each split, int64 ``[n_slots, f_local, n_bins, 4]``) — the
exactly-once contribution of (tree, layer, partition), kept by the rendezvous
(``ps_server.functions.rendezvous``) so a retried task replaces its first attempt's. The
call that completes the set sums them exactly (int64), derives the larger child of each
split as parent minus smaller child from the previous layer's full histograms (kept on this
shard between the steps of a job), and finds the best split per node; only those travel
back, to every worker, which then apply them and route their rows themselves.
"""

from __future__ import annotations

import numpy as np

from ps_server.functions.gbt import SPLIT_DTYPE, best_splits
from ps_server.functions.rendezvous import RENDEZVOUS, check_step_args
from ps_server.wire import RequestError

__all__ = ["READ_ONLY", "SERVER_FUNCTIONS", "decode_splits", "layer_splits"]


def _check_part(args: dict, arrays: list[np.ndarray]) -> tuple[np.ndarray, int]:
    """(histograms, feature offset) of one partition's call, refusing a bad shape by name."""
    try:
        n_slots, n_bins = int(args["n_slots"]), int(args["n_bins"])
    except (KeyError, TypeError, ValueError):
        raise RequestError("INVALID_ARGUMENT", "gbt_layer.splits: needs n_slots, n_bins") from None
    if len(arrays) != 2 or arrays[1].shape != (1,) or arrays[1].dtype != np.int64:
        raise RequestError(
            "INVALID_ARGUMENT",
            "gbt_layer.splits takes two arrays: histograms and [offset] (int64)",
        )
    hist = arrays[0]
    if (
        hist.dtype != np.int64
        or hist.ndim != 4
        or hist.shape[0] != n_slots
        or (hist.shape[2:] != (n_bins, 4))
    ):
        raise RequestError(
            "INVALID_ARGUMENT",
            f"gbt_layer.splits: histograms must be int64 [{n_slots}, features, {n_bins}, 4], "
            f"got {hist.dtype} {list(hist.shape)}",
        )
    return hist, int(arrays[1][0])


def _full_histograms(small: np.ndarray, args: dict, scratch: dict, step: int) -> np.ndarray:
    """This layer's histograms of every open node: the summed smaller children, and their
    siblings derived from the previous layer's full histograms (kept in `scratch`)."""
    if "parent_slots" not in args:  # the root: every sampled row was scanned
        return small
    prev_step, prev = scratch.get("full", (None, None))
    if prev_step != step - 1:
        raise RequestError(
            "FAILED_PRECONDITION",
            f"gbt_layer.splits step {step}: the previous layer's histograms (step {step - 1}) "
            f"are not on this shard (it holds step {prev_step})",
        )
    parents = prev[np.asarray(args["parent_slots"], dtype=np.intp)]
    big = parents - small
    left_small = np.asarray(args["small_is_left"], dtype=bool)[:, None, None, None]
    left, right = np.where(left_small, small, big), np.where(left_small, big, small)
    pick_left = np.asarray(args["pick_left"], dtype=bool)[:, None, None, None]
    pick = np.asarray(args["pick"], dtype=np.intp)
    return np.where(pick_left, left[pick], right[pick])


def layer_splits(tensors, args: dict, arrays: list[np.ndarray]):
    """Best split per open node over this shard's features, once every partition is in.

    args: topic, step, part, n_parts, wait (see rendezvous), n_slots, n_bins, split_kw;
    below the root parent_slots, small_is_left, pick, pick_left; optional feature_mask
    (open nodes x all features). arrays: this partition's histograms int64
    [n_slots, f_local, n_bins, 4] and [offset], the global index of this shard's first feature.
    Returns {"pending": bool} and the SPLIT_DTYPE records as bytes.
    """
    topic, step, part, n_parts, wait = check_step_args(args, "gbt_layer.splits")
    hist, offset = _check_part(args, arrays)

    def compute(parts: dict[int, np.ndarray]) -> np.ndarray:
        shapes = {p.shape for p in parts.values()}
        if len(shapes) != 1:
            raise RequestError("INVALID_ARGUMENT", f"gbt_layer.splits: part shapes {shapes}")
        small = np.zeros(next(iter(shapes)), dtype=np.int64)
        for p in sorted(parts):
            small += parts[p]  # exact: int64 sums cannot depend on the order
        scratch = RENDEZVOUS.scratch(topic)
        full = _full_histograms(small, args, scratch, step)
        scratch["full"] = (step, full)
        mask = args.get("feature_mask")
        if mask is not None:
            mask = np.asarray(mask, dtype=bool)[:, offset : offset + full.shape[1]]
        kw = dict(args["split_kw"])
        kw["scale"] = tuple(kw["scale"])
        result = best_splits(full, offset, feature_mask=mask, **kw)
        return np.frombuffer(result.tobytes(), dtype=np.uint8)

    ok, out = RENDEZVOUS.join((topic, step), part, n_parts, hist, compute, wait)
    return {"pending": not ok}, [out] if ok else []


def decode_splits(raw: np.ndarray) -> np.ndarray:
    """The SPLIT_DTYPE array a shard returned as bytes."""
    return np.frombuffer(np.ascontiguousarray(raw).tobytes(), dtype=SPLIT_DTYPE)


SERVER_FUNCTIONS = {"splits": layer_splits}
READ_ONLY = ("splits",)  # rendezvous state only, no model state (see rendezvous.READ_ONLY)
