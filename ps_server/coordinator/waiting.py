"""Waiting that costs no thread, and the one place the coordinator's wait limits live.

A blocked coordinator call (Barrier, Clock, Wait, Collect, GetTask) is a coroutine parked
on a future in :class:`Waiters`, not a thread sleeping on a condition variable: 10,000
waiting workers cost 10,000 small futures, and the calls that change state (Post,
RemoveWorker, ...) are answered at once however many wait.

Why this design rather than the others the problem allows:

- *A bigger thread pool* moves the cliff (one thread per waiter, each with its own stack
  and a slot in a fixed pool), and a sync gRPC server queues the 129th call behind the
  waiters, so the call that would release them is never served.
- *Long polls with notification* on the same sync server still hold a thread per poll.
- *A watch stream per client* changes the wire and every caller.

gRPC's asyncio server (``grpc.aio``) keeps the same unary RPCs, so clients, the proto and
the interceptors' contracts stay as they are; only the waiting changes.

Wait limits: a blocking call waits at most its request's ``timeout`` (0 = no limit of its
own), never past the call's gRPC deadline and never longer than :data:`MAX_WAIT_SECONDS`.
The client asks for :data:`DEFAULT_WAIT_SECONDS` unless told otherwise and gives its gRPC
deadline :data:`DEADLINE_MARGIN_SECONDS` more, so that the coordinator's own
DEADLINE_EXCEEDED, which names what was awaited, arrives before the transport's.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Hashable, Iterable

# the waits' limits live with every other timeout (re-exported: clients import them here)
from ps_server.timeouts import DEADLINE_MARGIN_SECONDS, DEFAULT_WAIT_SECONDS, MAX_WAIT_SECONDS

__all__ = [
    "Waiters",
    "MAX_WAIT_SECONDS",
    "DEFAULT_WAIT_SECONDS",
    "DEADLINE_MARGIN_SECONDS",
    "RELEASE_BATCH",
    "WAITING_SERVER_OPTIONS",
    "wait_deadline",
]

#: Waiters woken per event-loop step: releasing a crowd never delays other calls by more.
#: 10,000 waiters released on a busy 2-core machine (bench.waiters, 3 runs each): with 256
#: per step a GetShardMap sent meanwhile took 540-690 ms, with 16 9-19 ms; the whole
#: release took 0.5-0.6 s and 0.5-1.2 s.
RELEASE_BATCH = 16
#: Calls gRPC core may hold before the server takes them. Its defaults (1,000, then 3,000
#: hard) cancel calls at random beyond them, and thousands of workers arriving at a
#: barrier at once is the coordinator's normal case (seen: CANCELLED Waits at 1,500).
MAX_PENDING_CALLS = 1 << 20
#: Options of a server whose calls wait (the coordinator's).
WAITING_SERVER_OPTIONS = [
    ("grpc.server.max_pending_requests", MAX_PENDING_CALLS),
    ("grpc.server.max_pending_requests_hard_limit", MAX_PENDING_CALLS),
]


def wait_deadline(requested: float, remaining: float | None) -> float:
    """The monotonic time a blocking call gives up: its request's `requested` seconds
    (<= 0: no limit of its own), capped by MAX_WAIT_SECONDS and by `remaining`, the
    seconds left of the call's gRPC deadline (None: none)."""
    limit = min(requested if requested > 0 else MAX_WAIT_SECONDS, MAX_WAIT_SECONDS)
    if remaining is not None:
        limit = min(limit, max(remaining, 0.0))
    return time.monotonic() + limit


def _settle(fut: asyncio.Future) -> None:
    if not fut.done():
        fut.set_result(None)


class Waiters:
    """Futures parked by key on one event loop, woken by :meth:`notify` from any thread.

    A caller checks its condition and parks in one step of the loop (no ``await`` in
    between), and whoever changes state notifies its key afterwards. A change made on the
    loop cannot come between the check and the park; one made on another thread reaches
    the loop as a callback that runs after the park. So no wake-up is lost.

    Woken futures are settled :data:`RELEASE_BATCH` per loop step, so releasing 10,000
    waiters at once leaves the loop free between batches for other calls.
    """

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._parked: dict[Hashable, set[asyncio.Future]] = {}
        self._due: deque[asyncio.Future] = deque()
        self._releasing = False
        self._waiting = 0

    def __len__(self) -> int:
        """Calls parked now."""
        return self._waiting

    async def park(self, keys: Iterable[Hashable], until: float) -> None:
        """Return once any of `keys` is notified or monotonic time `until` is reached."""
        loop = asyncio.get_running_loop()
        if self._loop is None:
            self._loop = loop
        elif self._loop is not loop:
            raise RuntimeError("Waiters are bound to another event loop")
        fut = loop.create_future()
        keys = tuple(keys)
        for key in keys:
            self._parked.setdefault(key, set()).add(fut)
        timer = loop.call_later(max(until - time.monotonic(), 0.0), _settle, fut)
        self._waiting += 1
        try:
            await fut
        finally:  # woken, timed out, or the call was cancelled
            self._waiting -= 1
            timer.cancel()
            for key in keys:
                parked = self._parked.get(key)
                if parked is not None:
                    parked.discard(fut)
                    if not parked:
                        del self._parked[key]

    def notify(self, *keys: Hashable) -> None:
        """Wake everything parked on `keys`; safe from any thread."""
        loop = self._loop
        if loop is None or not keys:  # nothing ever parked
            return
        try:
            on_loop = asyncio.get_running_loop() is loop
        except RuntimeError:
            on_loop = False
        if on_loop:
            self._wake(keys)
            return
        try:
            loop.call_soon_threadsafe(self._wake, keys)
        except RuntimeError:  # the loop is closed: the server stopped, nobody waits
            pass

    def _wake(self, keys: tuple[Hashable, ...]) -> None:
        for key in keys:
            self._due.extend(self._parked.pop(key, ()))
        if self._due and not self._releasing:
            self._releasing = True
            self._release()

    def _release(self) -> None:
        for _ in range(min(RELEASE_BATCH, len(self._due))):
            _settle(self._due.popleft())
        if self._due:
            self._loop.call_soon(self._release)
        else:
            self._releasing = False
