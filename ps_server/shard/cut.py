"""Consistent cuts of a shard's state: mutations share, a snapshot excludes them.

A mutation may touch several models at once (an online commit adds a batch to the FTRL
state and records it in the ledger), so locking models one at a time while a checkpoint
copies them does not give a state that ever existed: the ledger may be copied before a
commit and the state after it, and a restore would then apply that batch twice.

Every mutating request holds the shard's :class:`Cut` shared for its whole run, and a
snapshot holds it exclusively while it copies the models; the copy is then written with
no lock held. Mutations never block while holding it (blocking rendezvous calls are
read-only), and a waiting snapshot stops new mutations from starting, so it cannot starve.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["Cut"]


class Cut:
    """A shared/exclusive lock, writer-preferring (the exclusive side is the snapshot)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._shared = 0
        self._exclusive = False
        self._waiting = 0  # snapshots waiting: new mutations wait behind them

    @contextmanager
    def shared(self) -> Iterator[None]:
        """Held by a mutation for its whole run (many at once)."""
        with self._cond:
            while self._exclusive or self._waiting:
                self._cond.wait()
            self._shared += 1
        try:
            yield
        finally:
            with self._cond:
                self._shared -= 1
                if not self._shared:
                    self._cond.notify_all()

    @contextmanager
    def exclusive(self, timeout: float, what: str) -> Iterator[None]:
        """Held while a snapshot copies the models: no mutation runs meanwhile. Raises
        TimeoutError naming `what` if the mutations in flight do not end in `timeout`."""
        with self._cond:
            self._waiting += 1
            try:
                if not self._cond.wait_for(
                    lambda: not self._exclusive and not self._shared, timeout
                ):
                    raise TimeoutError(
                        f"{what}: {self._shared} mutations still running after {timeout}s"
                    )
                self._exclusive = True
            finally:
                self._waiting -= 1
                self._cond.notify_all()
        try:
            yield
        finally:
            with self._cond:
                self._exclusive = False
                self._cond.notify_all()
