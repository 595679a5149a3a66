"""What a shard process has served: calls, errors and latency per RPC, updates per model.

`RequestStatsInterceptor` times every unary call of the shard's gRPC server into the
process's `STATS`; the status page reads them through the ``status.report`` server
function (``ps_server.functions.status``). Counting costs a lock and a few additions per
request (a request costs ~0.5 ms of gRPC), never anything per key.
"""

from __future__ import annotations

import bisect
import inspect
import threading
import time

import grpc

__all__ = ["BUCKETS", "STATS", "RequestStats", "RequestStatsInterceptor"]

#: Upper bounds (seconds) of the latency histogram's buckets; the last one is +Inf.
BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
#: RPCs whose successful calls count as updates of their request's `model`.
_UPDATES = ("Push", "Reduce")


class RequestStats:
    """Per RPC: calls, errors, summed seconds, latency histogram; per model: updates."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._rpcs: dict[str, list] = {}  # rpc -> [calls, errors, seconds, bucket counts]
        self._updates: dict[str, int] = {}

    def record(self, rpc: str, seconds: float, ok: bool, model: str = "") -> None:
        i = bisect.bisect_left(BUCKETS, seconds)
        with self._lock:
            row = self._rpcs.get(rpc)
            if row is None:
                row = self._rpcs[rpc] = [0, 0, 0.0, [0] * (len(BUCKETS) + 1)]
            row[0] += 1
            row[1] += not ok
            row[2] += seconds
            row[3][i] += 1
            if ok and model and rpc in _UPDATES:
                self._updates[model] = self._updates.get(model, 0) + 1

    def snapshot(self) -> dict:
        """``{"rpcs": {rpc: {calls, errors, seconds, buckets}}, "updates": {model: n}}``;
        ``buckets`` counts per bucket of `BUCKETS` (+Inf last), not cumulative."""
        with self._lock:
            rpcs = {
                rpc: {"calls": c, "errors": e, "seconds": s, "buckets": list(b)}
                for rpc, (c, e, s, b) in self._rpcs.items()
            }
            return {"rpcs": rpcs, "updates": dict(self._updates)}


#: This process's statistics (one shard per process).
STATS = RequestStats()


class RequestStatsInterceptor(grpc.ServerInterceptor):
    """Times each unary-unary call into `stats` (streams pass through uncounted)."""

    def __init__(self, stats: RequestStats = STATS):
        self.stats = stats

    def intercept_service(self, continuation, handler_call_details):
        handler = continuation(handler_call_details)
        if handler is None or handler.unary_unary is None:
            return handler
        serve, stats = handler.unary_unary, self.stats
        rpc = handler_call_details.method.rsplit("/", 1)[-1]
        if inspect.iscoroutinefunction(serve):
            return handler  # the shards' servers are synchronous

        def behavior(request, context):
            if rpc == "Call" and request.function == "status.report":
                return serve(request, context)  # the status page's own look: not counted
            t, ok = time.perf_counter(), False
            try:
                out = serve(request, context)
                ok = True
                return out
            finally:
                stats.record(rpc, time.perf_counter() - t, ok, getattr(request, "model", ""))

        return grpc.unary_unary_rpc_method_handler(
            behavior,
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )
