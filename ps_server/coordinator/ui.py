"""The status page: the coordinator's HTTP server (``--ui-port`` / ``spark.ps.uiPort``).

Three pages, served by a thread of the coordinator process and bound to its address:

``/``             one self-contained HTML page (no scripts, no outside assets; it reloads
                  itself every few seconds): hosts, shards, models, requests, and each
                  fit's curves (loss per iteration, ...) drawn as inline SVG
``/status.json``  what ``spark-ps-server status`` prints, plus per shard its memory and
                  requests, per model its updates, the request rates and the fits' points
``/metrics``      the same figures in Prometheus' text format (``prometheus_client``)

With TLS (``--tls-cert``) the pages are served over HTTPS with the same certificate.
When the service has a token, every page asks for it, as ``Authorization: Bearer TOKEN``
or ``?token=TOKEN`` (401 otherwise), like the gRPC calls. The figures are gathered from
the coordinator and each primary shard at most once a second, whatever the number of
readers.
"""

from __future__ import annotations

import hmac
import json
import logging
import os
import ssl
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import grpc
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from ps_server import tls
from ps_server.coordinator import status
from ps_server.proto import ps_pb2 as pb
from ps_server.proto import ps_pb2_grpc as pb_grpc
from ps_server.requests import BUCKETS
from ps_server.wire import TOKEN_KEY

__all__ = ["StatusPage", "collect"]

log = logging.getLogger("ps_server.coordinator.ui")
#: Seconds a gathered snapshot is served again before it is gathered anew.
_FRESH_SECONDS = 1.0
_REFRESH_SECONDS = 5


def collect(address: str, token: str, coordinator=None, timeout: float = 5.0) -> dict:
    """`status.status` of the service at `address`, with each primary's memory and
    requests (``status.report``), models' updates, and, given the coordinator's servicer
    (same process), its fits and waiting calls."""
    out = status.status(address, token, timeout)
    md = ((TOKEN_KEY, token),)
    updates: dict[str, int] = {}
    for part in out["partitions"]:
        if part["address"] and not part["lost"] and "error" not in part:
            part.update(_shard_report(part["address"], md, timeout))
        for model, n in part.get("updates", {}).items():
            updates[model] = updates.get(model, 0) + n
    for name, m in out["models"].items():
        m["updates"] = updates.get(name, 0)
    if coordinator is not None:
        out["fits"] = coordinator.fits.snapshot()
        out["waiting"] = len(coordinator.waiters)
    out["time"] = time.time()
    return out


def _shard_report(address: str, md, timeout: float) -> dict:
    try:
        with tls.open_channel(address, tls.env_ca()) as ch:
            r = pb_grpc.ShardStub(ch).Call(
                pb.CallRequest(function="status.report"), metadata=md, timeout=timeout
            )
    except grpc.RpcError as e:
        return {"report_error": f"{e.code().name}: {e.details()}"}
    rep = json.loads(r.result)
    return {
        "pid": rep["pid"],
        "rss_bytes": rep["rss_bytes"],
        "requests": rep["rpcs"],
        "updates": rep["updates"],
    }


def _request_totals(snap: dict) -> dict[str, dict]:
    """Per RPC over every shard: calls, errors, seconds, buckets."""
    totals: dict[str, dict] = {}
    for part in snap["partitions"]:
        for rpc, r in part.get("requests", {}).items():
            t = totals.setdefault(
                rpc, {"calls": 0, "errors": 0, "seconds": 0.0, "buckets": [0] * len(r["buckets"])}
            )
            t["calls"] += r["calls"]
            t["errors"] += r["errors"]
            t["seconds"] += r["seconds"]
            t["buckets"] = [a + b for a, b in zip(t["buckets"], r["buckets"], strict=True)]
    return totals


def _quantile(buckets: list[int], q: float) -> float | None:
    """The upper bound of the bucket holding quantile `q` (None: no calls, or +Inf)."""
    n = sum(buckets)
    if not n:
        return None
    seen = 0
    for bound, c in zip(BUCKETS, buckets, strict=False):  # past the last: +Inf, None
        seen += c
        if seen >= q * n:
            return bound
    return None


class StatusPage:
    """The HTTP server of `service` (a ``ps_server.coordinator.service.Service``) on `port`
    (0: any)."""

    def __init__(self, service, host: str, port: int = 0):
        self.service, self.token = service, service.token
        self._lock = threading.Lock()
        self._snap: dict | None = None
        self._prev: tuple[float, dict] | None = None  # (time, request totals) of the last look
        page = self

        class Handler(_Handler):
            ui = page

        self.httpd = ThreadingHTTPServer((host, port), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        scheme = "http"
        if tls.configured():  # the RPCs' certificate: the token never crosses in clear
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.load_cert_chain(os.environ[tls.ENV_CERT], os.environ[tls.ENV_KEY])
            # the handshake happens in the request's thread, not in the accepting one
            self.httpd.socket = ctx.wrap_socket(
                self.httpd.socket, server_side=True, do_handshake_on_connect=False
            )
            scheme = "https"
        self.url = f"{scheme}://{_url_host(host)}:{self.port}/"
        self._thread = threading.Thread(
            target=self.httpd.serve_forever, name="ps status page", daemon=True
        )
        self._thread.start()

    def snapshot(self) -> dict:
        """The figures, gathered at most once per `_FRESH_SECONDS`."""
        with self._lock:
            if self._snap is not None and time.time() - self._snap["time"] < _FRESH_SECONDS:
                return self._snap
            snap = collect(self.service.address, self.token, self.service.coordinator)
            totals = _request_totals(snap)
            rates = {}
            if self._prev is not None and snap["time"] > self._prev[0]:
                dt = snap["time"] - self._prev[0]
                for rpc, t in totals.items():
                    before = self._prev[1].get(rpc, {}).get("calls", 0)
                    rates[rpc] = max(t["calls"] - before, 0) / dt
            self._prev = (snap["time"], totals)
            snap["requests"] = {
                rpc: {
                    "calls": t["calls"],
                    "errors": t["errors"],
                    "mean_ms": 1e3 * t["seconds"] / t["calls"] if t["calls"] else 0.0,
                    "p50_ms_at_most": _ms(_quantile(t["buckets"], 0.5)),
                    "p99_ms_at_most": _ms(_quantile(t["buckets"], 0.99)),
                    "per_second": rates.get(rpc),
                }
                for rpc, t in sorted(totals.items())
            }
            self._snap = snap
            return snap

    def authorized(self, header: str | None, query: str) -> bool:
        if not self.token:
            return True
        given = ""
        if header and header.startswith("Bearer "):
            given = header[len("Bearer ") :].strip()
        else:
            given = urllib.parse.parse_qs(query).get("token", [""])[0]
        return hmac.compare_digest(given.encode(), self.token.encode())

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else 1e3 * seconds


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


class _Handler(BaseHTTPRequestHandler):
    ui: StatusPage
    server_version = "spark-ps"
    timeout = 30  # seconds a silent connection may hold its thread

    def log_message(self, format, *args):  # noqa: A002 - the base class's name
        log.debug("%s " + format, self.address_string(), *args)

    def do_GET(self):  # noqa: N802 - http.server's name
        url = urllib.parse.urlsplit(self.path)
        if not self.ui.authorized(self.headers.get("Authorization"), url.query):
            self._send(
                401,
                "text/plain; charset=utf-8",
                b"spark-ps status page: this PS has a token; send it as "
                b"'Authorization: Bearer TOKEN' or ?token=TOKEN\n",
                {"WWW-Authenticate": 'Bearer realm="spark-ps"'},
            )
            return
        pages = {"/": self._html, "/status.json": self._json, "/metrics": self._metrics}
        if url.path not in pages:
            self._send(
                404, "text/plain; charset=utf-8", b"not found: try /, /status.json or /metrics\n"
            )
            return
        try:
            snap = self.ui.snapshot()
        except grpc.RpcError as e:
            msg = f"spark-ps: the coordinator did not answer: {e.code().name}: {e.details()}\n"
            self._send(503, "text/plain; charset=utf-8", msg.encode())
            return
        ctype, body = pages[url.path](snap, url.query)
        self._send(200, ctype, body)

    def _send(self, code: int, ctype: str, body: bytes, headers: dict | None = None) -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)

    def _json(self, snap: dict, query: str) -> tuple[str, bytes]:
        return "application/json", json.dumps(snap, indent=1).encode()

    def _metrics(self, snap: dict, query: str) -> tuple[str, bytes]:
        registry = CollectorRegistry(auto_describe=False)
        registry.register(_Snapshot(snap))
        return CONTENT_TYPE_LATEST, generate_latest(registry)

    def _html(self, snap: dict, query: str) -> tuple[str, bytes]:
        from ps_server.coordinator.ui_page import render

        return "text/html; charset=utf-8", render(snap, query, _REFRESH_SECONDS).encode()


class _Snapshot:
    """A prometheus_client collector over one snapshot."""

    def __init__(self, snap: dict):
        self.snap = snap

    def collect(self):
        s = self.snap
        parts = s["partitions"]
        yield _gauge("spark_ps_partitions", "Partitions (shards) of the PS", len(parts))
        alive = sum(1 for p in parts if p["address"] and not p["lost"] and "rss_bytes" in p)
        yield _gauge("spark_ps_partitions_serving", "Partitions whose primary answered", alive)
        yield _gauge(
            "spark_ps_epoch", "Shard map epoch (moves on at each (re)registration)", s["epoch"]
        )
        c = CounterMetricFamily(
            "spark_ps_shard_restarts", "Shard processes started again after they died"
        )
        c.add_metric([], s["counters"].get("restart", 0))
        yield c
        c = CounterMetricFamily(
            "spark_ps_primary_starts",
            "Primaries started with a checkpoint's or no state (first starts included)",
        )
        c.add_metric([], s["restarts"])
        yield c
        ev = CounterMetricFamily("spark_ps_events", "Coordinator counters", labels=["event"])
        for name, n in sorted(s["counters"].items()):
            ev.add_metric([name], n)
        yield ev
        if "waiting" in s:
            yield _gauge("spark_ps_waiting_calls", "Calls waiting at the coordinator", s["waiting"])
        hosts = GaugeMetricFamily("spark_ps_host_alive", "Hosts heartbeating", labels=["host"])
        for h in s["hosts"]:
            hosts.add_metric([h["id"]], int(h["alive"]))
        yield hosts
        yield from _shard_metrics(parts)
        yield from _model_metrics(s["models"])
        yield from _fit_metrics(s.get("fits", []))


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, value=value)


def _shard_metrics(parts: list[dict]):
    rss = GaugeMetricFamily("spark_ps_shard_rss_bytes", "Shard resident memory", labels=["shard"])
    held = GaugeMetricFamily("spark_ps_shard_bytes", "Model bytes held", labels=["shard"])
    calls = CounterMetricFamily("spark_ps_requests", "Requests served", labels=["shard", "rpc"])
    errs = CounterMetricFamily(
        "spark_ps_request_errors", "Requests that failed", labels=["shard", "rpc"]
    )
    lat = HistogramMetricFamily(
        "spark_ps_request_seconds", "Request latency on the shard", labels=["shard", "rpc"]
    )
    for p in parts:
        shard = str(p["index"])
        if "rss_bytes" in p:
            rss.add_metric([shard], p["rss_bytes"])
        if "bytes" in p:
            held.add_metric([shard], p["bytes"])
        for rpc, r in sorted(p.get("requests", {}).items()):
            calls.add_metric([shard, rpc], r["calls"])
            errs.add_metric([shard, rpc], r["errors"])
            cum, acc = [], 0
            for bound, n in zip((*map(str, BUCKETS), "+Inf"), r["buckets"], strict=True):
                acc += n
                cum.append((bound, acc))
            lat.add_metric([shard, rpc], cum, r["seconds"])
    yield from (rss, held, calls, errs, lat)


def _model_metrics(models: dict[str, dict]):
    nbytes = GaugeMetricFamily("spark_ps_model_bytes", "Model bytes on the PS", labels=["model"])
    rows = GaugeMetricFamily("spark_ps_model_rows", "Model rows materialised", labels=["model"])
    ups = CounterMetricFamily(
        "spark_ps_model_updates", "Push/Reduce requests applied to the model", labels=["model"]
    )
    for name, m in sorted(models.items()):
        nbytes.add_metric([name], m["bytes"])
        rows.add_metric([name], m["rows"])
        ups.add_metric([name], m.get("updates", 0))
    yield from (nbytes, rows, ups)


def _fit_metrics(fits: list[dict]):
    done = GaugeMetricFamily(
        "spark_ps_fit_done", "Iterations/epochs/trees a fit has done", labels=["fit", "name"]
    )
    last = GaugeMetricFamily(
        "spark_ps_fit_metric", "A fit's last reported metric", labels=["fit", "metric"]
    )
    for f in fits:
        done.add_metric([f["fit"], f["name"]], f.get("done", 0))
        if f["points"]:
            for k, v in f["points"][-1].items():
                if k not in ("done", "seconds"):
                    last.add_metric([f["fit"], k], v)
    yield from (done, last)
