"""A ``grpc.aio`` server on an event-loop thread of its own, driven from synchronous code.

The coordinator's handlers are coroutines (see ``ps_server.coordinator.waiting`` for why), while the
service around it is synchronous: its main thread supervises shard processes and the
tests run it in-process. This class owns the loop thread and gives the synchronous side
what ``grpc.server`` gave it: the bound port, ``start`` and ``stop``.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

import grpc

from ps_server import tls

__all__ = ["LoopServer"]

#: Seconds a start or bind on the loop thread may take before the caller gives up.
_CALL_SECONDS = 30.0


class LoopServer:
    """Serve what `setup(server)` registers on `address` (TLS as ``tls.bind`` decides);
    `port` is the bound port, 0 if `address` could not be bound."""

    def __init__(
        self,
        setup: Callable[[grpc.aio.Server], None],
        address: str,
        *,
        interceptors: Sequence[grpc.aio.ServerInterceptor] = (),
        options: Sequence[tuple[str, Any]] = (),
        name: str = "grpc",
    ):
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name=f"{name} event loop", daemon=True
        )
        self._thread.start()
        self._stopped = False
        try:
            self.server, self.port = self._run(
                self._create(setup, address, list(interceptors), list(options))
            )
        except BaseException:
            self._end_loop()
            raise

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return self._loop

    def _run(self, coro: Coroutine, timeout: float = _CALL_SECONDS):
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    @staticmethod
    async def _create(setup, address, interceptors, options) -> tuple[grpc.aio.Server, int]:
        server = grpc.aio.server(interceptors=interceptors, options=options)
        setup(server)
        try:
            return server, tls.bind(server, address)
        except RuntimeError:  # grpc.aio raises where grpc.server returns 0: keep the latter
            return server, 0

    def start(self) -> None:
        self._run(self.server.start())

    def stop(self, grace: float | None = None) -> None:
        """Stop serving (calls in flight get `grace` seconds), then end the loop thread."""
        if self._stopped:
            return
        self._stopped = True
        try:
            self._run(self.server.stop(grace), timeout=(grace or 0) + _CALL_SECONDS)
        finally:
            self._end_loop()

    def _end_loop(self) -> None:
        async def cancel_the_rest() -> None:
            rest = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in rest:
                t.cancel()
            await asyncio.gather(*rest, return_exceptions=True)

        try:
            self._run(cancel_the_rest(), timeout=5)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
            if not self._thread.is_alive():
                self._loop.close()
