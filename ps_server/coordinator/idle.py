"""What the coordinator forgets: control-plane state nobody used for a long while.

Every fit leaves entries behind (its board topics, among them a GBT fit's trees, its
barriers, clock groups, heartbeats, contributions and task queues), and a fit whose
driver died cannot clean up after itself. So each entry records when it was last used,
and whatever has been idle for ``ttl`` seconds is dropped: a service that runs for months
holds what its recent fits use, not everything every fit ever posted.

The ttl ($SPARK_PS_COORDINATOR_TTL, default 7200 s) is kept above the longest wait a call
may ask for (``ps_server.timeouts.MAX_WAIT_SECONDS``), so nothing is dropped under a call
that still waits on it.
"""

from __future__ import annotations

import time
from collections.abc import Hashable

from ps_server import timeouts

__all__ = ["LastUse", "idle_ttl"]


def idle_ttl() -> float:
    """Seconds an unused coordinator entry is kept ($SPARK_PS_COORDINATOR_TTL)."""
    return timeouts.coordinator_ttl()


class LastUse:
    """When each (kind, key) was last used; :meth:`expired` hands out the idle ones."""

    def __init__(self, ttl: float):
        if ttl <= 0:
            raise ValueError(f"coordinator ttl must be > 0 seconds, got {ttl}")
        self.ttl = ttl
        self._at: dict[tuple[str, Hashable], float] = {}
        self._next_sweep = time.monotonic() + self._period

    @property
    def _period(self) -> float:
        return min(max(self.ttl / 4, 0.05), 60.0)  # a sweep is O(entries): not every call

    def touch(self, kind: str, key: Hashable) -> None:
        self._at[(kind, key)] = time.monotonic()

    def expired(self) -> list[tuple[str, Hashable]]:
        """The entries idle for the ttl (forgotten here), at most once per sweep period;
        [] in between."""
        now = time.monotonic()
        if now < self._next_sweep:
            return []
        self._next_sweep = now + self._period
        gone = [k for k, at in self._at.items() if now - at > self.ttl]
        for k in gone:
            del self._at[k]
        return gone

    def __len__(self) -> int:
        return len(self._at)
