"""The status page's HTML (``ps_server.coordinator.ui``): tables and inline SVG curves, no scripts.

The page reloads itself; its data also sits in it as JSON (``<script
type="application/json" id="ps-status">``) for tools that read the page.
"""

from __future__ import annotations

import json
import math
import time
import urllib.parse
from html import escape

__all__ = ["render"]

_STYLE = """
body{font:14px system-ui,sans-serif;margin:1.5em;color:#222}
h1{font-size:1.3em}h2{font-size:1.1em;margin-top:1.5em}
table{border-collapse:collapse}td,th{padding:2px 10px;border-bottom:1px solid #ddd;
text-align:right}th{background:#f4f4f4}td:first-child,th:first-child{text-align:left}
.bad{color:#b00}.ok{color:#070}.fit{display:inline-block;margin:0 1.5em 1em 0}
svg{background:#fafafa;border:1px solid #ddd}.muted{color:#777}
"""
_W, _H, _PAD = 360, 140, 28


def render(snap: dict, query: str, refresh: int) -> str:
    token = urllib.parse.parse_qs(query).get("token", [""])[0]
    again = "?" + urllib.parse.urlencode({"token": token}) if token else ""
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(snap["time"]))
    parts = [
        "<!DOCTYPE html><html><head><meta charset='utf-8'>",
        f"<meta http-equiv='refresh' content='{refresh}; url={escape(again or './')}'>",
        f"<title>spark-ps {escape(snap['coordinator'])}</title><style>{_STYLE}</style>",
        "</head><body>",
        f"<h1>spark-ps at {escape(snap['coordinator'])}</h1>",
        f"<p class='muted'>as of {stamp}; epoch {snap['epoch']}, shard restarts "
        f"{snap['counters'].get('restart', 0)}, {_mb(snap['bytes'])} held, "
        f"{snap.get('waiting', 0)} calls waiting. "
        "<a href='status.json'>status.json</a> · <a href='metrics'>metrics</a></p>",
        _fits(snap.get("fits", [])),
        _hosts(snap["hosts"]),
        _shards(snap["partitions"]),
        _models(snap["models"]),
        _requests(snap.get("requests", {})),
        _counters(snap["counters"]),
        f"<script type='application/json' id='ps-status'>{_json(snap)}</script>",
        "</body></html>",
    ]
    return "\n".join(p for p in parts if p)


def _json(snap: dict) -> str:
    # inside <script>: "</" must not appear
    return json.dumps(snap).replace("</", "<\\/")


def _mb(n: float | None) -> str:
    return "-" if n is None else f"{n / 1e6:.1f} MB"


def _table(title: str, head: list[str], rows: list[list], table_id: str) -> str:
    if not rows:
        return ""
    th = "".join(f"<th>{escape(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>" for r in rows)
    return f"<h2>{escape(title)}</h2><table id='{table_id}'><tr>{th}</tr>{body}</table>"


def _hosts(hosts: list[dict]) -> str:
    rows = [
        [
            escape(h["id"]),
            escape(h["address"]),
            _yes(h["alive"])
            + (" draining" if h["draining"] else "")
            + (" retired" if h["retired"] else ""),
            f"{h['seconds_since_heartbeat']:.1f}s",
            h["shards"],
            ", ".join(map(str, h["primaries"])) or "-",
            ", ".join(map(str, h["backups"])) or "-",
        ]
        for h in hosts
    ]
    head = ["host", "address", "alive", "heartbeat", "shards", "primaries", "backups"]
    return _table("Hosts", head, rows, "hosts")


def _shards(parts: list[dict]) -> str:
    rows = []
    for p in parts:
        calls = sum(r["calls"] for r in p.get("requests", {}).values())
        state = (
            f"<span class='bad'>lost: {escape(p['lost'])}</span>"
            if p["lost"]
            else _yes("rss_bytes" in p)
        )
        err = p.get("error") or p.get("report_error")
        rows.append(
            [
                p["index"],
                escape(p["address"]),
                escape(p["host"] or "this host"),
                escape(p["backup"] or "-"),
                state + (f" <span class='bad'>{escape(err)}</span>" if err else ""),
                p.get("pid", "-"),
                _mb(p.get("rss_bytes")),
                _mb(p.get("bytes")),
                len(p.get("models", {})),
                calls,
            ]
        )
    head = [
        "shard",
        "address",
        "host",
        "backup",
        "serving",
        "pid",
        "RSS",
        "models' bytes",
        "models",
        "requests",
    ]
    return _table("Shards", head, rows, "shards")


def _models(models: dict[str, dict]) -> str:
    rows = [
        [
            escape(name),
            escape(m["kind"]),
            f"{m['dim']} × {m['cols']}",
            m["rows"],
            _mb(m["bytes"]),
            m.get("updates", 0),
        ]
        for name, m in sorted(models.items())
    ]
    head = ["model", "kind", "shape", "rows", "bytes", "version (updates applied)"]
    return _table("Models", head, rows, "models")


def _requests(reqs: dict[str, dict]) -> str:
    def num(x, fmt="{:.2f}"):
        return "-" if x is None else fmt.format(x)

    rows = [
        [
            escape(rpc),
            r["calls"],
            r["errors"],
            num(r["per_second"], "{:.1f}"),
            num(r["mean_ms"]),
            num(r["p50_ms_at_most"], "≤ {:g}"),
            num(r["p99_ms_at_most"], "≤ {:g}"),
        ]
        for rpc, r in reqs.items()
    ]
    head = ["RPC (all shards)", "calls", "errors", "per s", "mean ms", "p50 ms", "p99 ms"]
    return _table("Requests", head, rows, "requests")


def _counters(counters: dict[str, int]) -> str:
    rows = [[escape(k), v] for k, v in sorted(counters.items())]
    return _table("Recovery counters", ["event", "count"], rows, "counters")


def _yes(ok: bool) -> str:
    return "<span class='ok'>yes</span>" if ok else "<span class='bad'>no</span>"


def _fits(fits: list[dict]) -> str:
    if not fits:
        return "<h2>Fits</h2><p class='muted'>no fit has reported yet</p>"
    out = ["<h2>Fits</h2>"]
    for f in reversed(fits):  # the newest first
        state = "finished" if f["finished"] else "running"
        out.append(
            f"<div class='fit' data-fit='{escape(f['fit'])}'><b>{escape(f['name'])}</b> "
            f"<span class='muted'>{state}, {escape(f['unit'])} {f.get('done', 0)}"
            f"{'/' + str(f['total']) if f['total'] else ''}</span><br>"
        )
        names = sorted({k for p in f["points"] for k in p} - {"done", "seconds"})
        for metric in names:
            pts = [(p["done"], p[metric]) for p in f["points"] if metric in p]
            out.append(_curve(metric, pts))
        out.append("</div>")
    return "".join(out)


def _curve(metric: str, pts: list[tuple[float, float]]) -> str:
    """An SVG line of `pts` (x: iteration, y: value) with its range written on it."""
    pts = [(x, y) for x, y in pts if math.isfinite(y)]
    if not pts:
        return ""
    xs, ys = [x for x, _ in pts], [y for _, y in pts]
    x0, x1, y0, y1 = min(xs), max(xs), min(ys), max(ys)
    sx = (_W - 2 * _PAD) / ((x1 - x0) or 1)
    sy = (_H - 2 * _PAD) / ((y1 - y0) or 1)
    coords = " ".join(f"{_PAD + (x - x0) * sx:.1f},{_H - _PAD - (y - y0) * sy:.1f}" for x, y in pts)
    return (
        f"<svg class='curve' data-metric='{escape(metric)}' data-points='{len(pts)}' "
        f"width='{_W}' height='{_H}' viewBox='0 0 {_W} {_H}'>"
        f"<text x='{_PAD}' y='16' font-size='12'>{escape(metric)}: last {ys[-1]:.6g}</text>"
        f"<text x='{_W - _PAD}' y='16' font-size='11' text-anchor='end' fill='#777'>"
        f"{y0:.4g} … {y1:.4g}</text>"
        f"<text x='{_PAD}' y='{_H - 8}' font-size='11' fill='#777'>{x0:g}</text>"
        f"<text x='{_W - _PAD}' y='{_H - 8}' font-size='11' fill='#777' "
        f"text-anchor='end'>{x1:g}</text>"
        f"<polyline fill='none' stroke='#1f77b4' stroke-width='2' points='{coords}'/></svg>"
    )
