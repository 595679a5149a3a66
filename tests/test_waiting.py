"""`ps_server.coordinator.waiting.Waiters`: a coroutine parked on a key is woken by a notify from
another thread (the service's supervisors change coordinator state from threads)."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from ps_server.coordinator.waiting import MAX_WAIT_SECONDS, Waiters, wait_deadline

pytestmark = pytest.mark.timeout(30)


def test_waiters_wake_when_another_thread_changes_state():
    async def scenario() -> float:
        waiters, loop = Waiters(), asyncio.get_running_loop()
        parked = asyncio.ensure_future(waiters.park([("board", "t")], time.monotonic() + 20))
        await asyncio.sleep(0.05)
        other = threading.Thread(target=waiters.notify, args=(("board", "t"),))
        t = loop.time()
        other.start()
        await asyncio.wait_for(parked, 5)
        other.join()
        assert len(waiters) == 0
        return loop.time() - t

    assert asyncio.run(scenario()) < 1.0


def test_a_parked_waiter_wakes_at_its_deadline_and_is_forgotten():
    async def scenario() -> float:
        waiters, t = Waiters(), time.monotonic()
        await waiters.park([("clock", "g")], t + 0.2)
        assert len(waiters) == 0
        return time.monotonic() - t

    assert 0.15 < asyncio.run(scenario()) < 2.0


def test_a_wait_ends_by_the_request_timeout_or_the_calls_deadline():
    now = time.monotonic()
    assert wait_deadline(5.0, None) - now == pytest.approx(5.0, abs=0.5)
    assert wait_deadline(5.0, 1.0) - now == pytest.approx(1.0, abs=0.5)
    assert wait_deadline(0.0, None) - now == pytest.approx(MAX_WAIT_SECONDS, abs=0.5)
