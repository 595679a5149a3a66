"""Partial margins: a shard scores the part of each row whose keys it owns.

Imports only numpy: this module is loaded by shard processes.

A worker scoring a linear model that lives on the PS may, instead of pulling the weights of
the keys its rows use, send each shard the entries of its rows whose keys that shard owns;
the shard answers one float64 per row, ``sum_j x_j * w[key_j]`` over those entries, and the
worker adds the shards' answers and the intercept. The weights never leave the shards.

``margins`` takes one model (a vector: ``cols == 1``) and four arrays:

* ``keys``: int64, the distinct keys of the batch this shard owns (any order);
* ``ids``: int32 per entry, the position of the entry's key in ``keys``;
* ``values``: float64 per entry, or empty when every value is 1.0 (keys-only features);
* ``indptr``: int64 ``[n_rows + 1]``, the row boundaries of the entries sent.

and returns ``[partial]``, float64 ``[n_rows]``, the sum of each row's products (0 for a
row with no entries here). Keys the model never learned read as 0.
"""

from __future__ import annotations

import numpy as np

from ps_server.wire import RequestError

__all__ = ["SERVER_FUNCTIONS", "READ_ONLY"]


def margins(tensors: list, args: dict, arrays: list[np.ndarray]) -> tuple[dict, list[np.ndarray]]:
    """tensors = [weights]; arrays = [keys, ids, values, indptr] (see the module docstring)."""
    if len(tensors) != 1 or tensors[0].spec.cols != 1:
        raise RequestError(
            "INVALID_ARGUMENT", "scoring.margins takes one model with one column (a vector)"
        )
    if len(arrays) != 4:
        raise RequestError(
            "INVALID_ARGUMENT",
            f"scoring.margins takes 4 arrays (keys, ids, values, indptr), got {len(arrays)}",
        )
    t = tensors[0]
    what = f"scoring.margins on {t.where}"
    keys = t.check_keys(arrays[0], what)
    ids, values, indptr = arrays[1], arrays[2], arrays[3].astype(np.int64, copy=False)
    nnz = ids.shape[0]
    if indptr.ndim != 1 or indptr.size < 1 or indptr[0] != 0 or indptr[-1] != nnz:
        raise RequestError("INVALID_ARGUMENT", f"{what}: indptr must run from 0 to {nnz}")
    if values.size not in (0, nnz):
        raise RequestError("INVALID_ARGUMENT", f"{what}: {values.size} values for {nnz} ids")
    if nnz and (int(ids.min()) < 0 or int(ids.max()) >= keys.size):
        raise RequestError("INVALID_ARGUMENT", f"{what}: ids must index the {keys.size} keys")
    w = np.asarray(t.pull(keys, ""), dtype=np.float64).reshape(-1)
    products = w[ids] if values.size == 0 else values * w[ids]
    if indptr.size == 1:
        return {}, [np.zeros(0)]
    sums = np.add.reduceat(np.append(products, 0.0), indptr[:-1])  # the 0.0: a last empty row
    return {}, [np.where(np.diff(indptr) > 0, sums, 0.0)]


SERVER_FUNCTIONS = {"margins": margins}
#: functions that change no state (replicated shards do not forward them)
READ_ONLY = ("margins",)
