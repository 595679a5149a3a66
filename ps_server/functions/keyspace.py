"""Compacting a huge key space: number the keys any partition touched, 0..K-1, on the shards.

A sparse PS vector holds the touched keys (hash-partitioned). `count` reports how many a
shard holds; `number` gives them consecutive ids starting at the offset the caller
computed from all shards' counts (shard order, keys sorted within a shard) and stores
each id as the key's value. Workers then pull ids for their keys, and full-batch
solvers run on dense vectors of dimension K, however large the key space.

A key space small enough to allocate (vector input) may use a *dense* vector instead:
a touched key holds a non-zero, no hash index is built, and `number` also returns the
touched keys (in id order), since a numbered key 0 can no longer be told from an
untouched one.
"""

from __future__ import annotations

import numpy as np

__all__ = ["SERVER_FUNCTIONS"]


def count(tensors, args: dict, arrays: list[np.ndarray]):
    t = tensors[0]
    if t.spec.kind == "dense":
        return {"count": int(np.count_nonzero(t.dense_values()))}, []
    return {"count": int(t.store.num_rows)}, []


def number(tensors, args: dict, arrays: list[np.ndarray]):
    """arrays[0] = [offset] of this shard; returns the count numbered."""
    t = tensors[0]
    offset = int(arrays[0][0])
    if t.spec.kind == "dense":
        with t.lock:
            values = t.dense_values()
            rows = np.flatnonzero(values)
            values[rows] = offset + np.arange(rows.size)
        return {"count": int(rows.size)}, [rows + t.spec.offset]
    with t.lock:
        keys = np.sort(t.store.all_keys())
        ids = (offset + np.arange(keys.size)).astype(t.store.dtype).reshape(-1, 1)
        t.store.assign(keys, ids)
    return {"count": int(keys.size)}, []


SERVER_FUNCTIONS = {"count": count, "number": number}
#: functions that change no state (replicated shards do not forward them)
READ_ONLY = ("count",)
