"""Exactly-once commits of streaming micro-batches, run inside a PS shard.

Imports only numpy: this module is loaded by shard processes.

Each task of micro-batch ``b`` pushes its FTRL state increments ``(dz, dn)`` as the
exactly-once contribution ``(round=b, part=p)`` of the state tensor (a replayed task
replaces its earlier push). ``commit`` then adds the contributions of parts ``< parts`` to
the state and records ``b`` in the shard's ledger, under the state's lock; a batch already
in the ledger is never added again, so a replayed micro-batch (the query restarted before
Spark logged the batch as done) changes nothing. The ledger is an int64 sparse tensor
whose *local* rows are the applied batch ids of this shard (it is read only through
``applied``, never pulled by key); it lives in PS checkpoints like any tensor.
"""

from __future__ import annotations

import numpy as np

from ps_server.keys import combine
from ps_server.wire import RequestError

__all__ = ["SERVER_FUNCTIONS", "READ_ONLY"]


def _ints(fn: str, args: dict, names: tuple[str, ...], **defaults: int) -> list[int]:
    """The integer args `names` of `online.<fn>`, refusing a missing or non-integer one
    (and a negative count) by name, before anything changes."""
    if not isinstance(args, dict):
        raise RequestError("INVALID_ARGUMENT", f"online.{fn}: args must be a JSON object")
    out = []
    for name in names:
        value = args.get(name, defaults.get(name))
        if isinstance(value, bool) or not isinstance(value, int):
            raise RequestError(
                "INVALID_ARGUMENT", f"online.{fn}: arg {name!r} must be an integer, got {value!r}"
            )
        if name == "parts" and value < 0:
            raise RequestError("INVALID_ARGUMENT", f"online.{fn}: parts must be >= 0, got {value}")
        out.append(value)
    return out


def _tensors(fn: str, tensors: list, names: tuple[str, ...]) -> list:
    if len(tensors) != len(names):
        raise RequestError(
            "INVALID_ARGUMENT",
            f"online.{fn} takes {len(names)} models ({', '.join(names)}), got {len(tensors)}",
        )
    return tensors


def _folded(state, round_: int) -> int:
    """Bytes of the contributions a commit of `round_` drops (every round up to it)."""
    rounds = [r for r in state.contributions.rounds() if r <= round_]
    return sum(k.nbytes + v.nbytes for r in rounds for k, v in state.contributions.entries(r))


def commit(tensors: list, args: dict, arrays: list[np.ndarray]) -> tuple[dict, list[np.ndarray]]:
    """tensors = [state, ledger]; args = {round, parts, tag}. Returns whether it applied."""
    state, ledger = _tensors("commit", tensors, ("state", "ledger"))
    round_, parts, tag = _ints("commit", args, ("round", "parts", "tag"), tag=1)
    if ledger.spec.kind != "sparse" or ledger.store.dtype != np.int64:
        raise RequestError(
            "INVALID_ARGUMENT",
            f"online.commit: the ledger {ledger.spec.name!r} must be a sparse int64 vector, "
            f"got a {ledger.spec.kind} {ledger.store.dtype} one",
        )
    key = np.array([round_], dtype=np.int64)
    n_keys = 0
    with state.lock, ledger.lock:
        done = ledger.store.locate(key)[0] >= 0
        if not done:
            entries = state.contributions.entries(round_, num_parts=parts)
            if entries:
                keys = np.concatenate([k for k, _ in entries])
                values = np.concatenate([v for _, v in entries])
                keys, values = combine(keys, values)
                # past a budget: refused before anything changes (the contributions stay)
                with state.growing(keys, f"committing batch {round_} to", _folded(state, round_)):
                    state.store.add(keys, values.astype(state.store.dtype, copy=False))
                n_keys = int(keys.size)
            ledger.store.assign(key, np.array([[tag]], dtype=ledger.store.dtype))
        state.contributions.drop_before(round_ + 1)
    return {"applied": not done, "keys": n_keys}, []


def applied(tensors: list, args: dict, arrays: list[np.ndarray]) -> tuple[dict, list[np.ndarray]]:
    """tensors = [ledger]: this shard's applied batch ids (sorted) and their tags.

    With args {round}: only that batch's entry (none or one) and, as "latest", the highest
    applied id; the driver asks this every micro-batch, and the whole ledger (one id per
    batch ever learned) would grow the answer without bound.
    """
    (ledger,) = _tensors("applied", tensors, ("ledger",))
    one = isinstance(args, dict) and "round" in args
    (round_,) = _ints("applied", args, ("round",)) if one else (0,)
    with ledger.lock:
        keys = np.array(ledger.store.all_keys(), dtype=np.int64)
        count, latest = int(keys.size), int(keys.max()) if keys.size else None
        if one:
            hit = ledger.store.locate(np.array([round_], dtype=np.int64))[0] >= 0
            keys = np.array([round_] if hit else [], dtype=np.int64)
        tags = np.array(ledger.store.gather(keys), dtype=np.int64).reshape(-1)
    order = np.argsort(keys)
    return {"count": count, "latest": latest}, [keys[order], tags[order]]


def discard(tensors: list, args: dict, arrays: list[np.ndarray]) -> tuple[dict, list[np.ndarray]]:
    """tensors = [state]: forget the pending contributions of one round (a failed batch)."""
    (state,) = _tensors("discard", tensors, ("state",))
    (round_,) = _ints("discard", args, ("round",))
    with state.lock:
        state.contributions.drop(round_)
    return {}, []


def footprint(tensors: list, args: dict, arrays: list[np.ndarray]) -> tuple[dict, list[np.ndarray]]:
    """tensors = [state]: rows held and bytes used on this shard."""
    (state,) = _tensors("footprint", tensors, ("state",))
    with state.lock:
        return {"rows": int(state.store.num_rows), "nbytes": int(state.store.nbytes)}, []


SERVER_FUNCTIONS = {
    "commit": commit,
    "applied": applied,
    "discard": discard,
    "footprint": footprint,
}
# Reads, not mutations: with replication they must not queue behind the replica's mutation
# lock nor cost a forward to the backup (they did: the learner reads the ledger every batch),
# and an answer holding allocated bytes is no replica-divergence check.
READ_ONLY = ("applied", "footprint")
