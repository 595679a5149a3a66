"""Compacting a huge key space: number the keys any partition touched, 0..K-1, on the shards.

A sparse PS vector holds the touched keys (hash-partitioned). `count` reports how many a
shard holds; `number` gives them consecutive ids starting at the offset the caller
computed from all shards' counts (shard order, keys sorted within a shard) and stores
each id as the key's value. Workers then pull ids for their keys, and full-batch
solvers run on dense vectors of dimension K, however large the key space.
"""

from __future__ import annotations

import numpy as np

__all__ = ["SERVER_FUNCTIONS"]


def count(tensors, args: dict, arrays: list[np.ndarray]):
    return {"count": int(tensors[0].store.num_rows)}, []


def number(tensors, args: dict, arrays: list[np.ndarray]):
    """arrays[0] = [offset] of this shard; returns the count numbered."""
    t = tensors[0]
    offset = int(arrays[0][0])
    with t.lock:
        keys = np.sort(t.store.all_keys())
        ids = (offset + np.arange(keys.size)).astype(t.store.dtype).reshape(-1, 1)
        t.store.assign(keys, ids)
    return {"count": int(keys.size)}, []


SERVER_FUNCTIONS = {"count": count, "number": number}
#: functions that change no state (replicated shards do not forward them)
READ_ONLY = ("count",)
