"""``status.report``: what this shard process is and has served, for the status page.

Its memory (resident set), pid, and the request statistics of ``ps_server.requests``
(calls, errors and latency per RPC, updates per model). Changes no state.
"""

from __future__ import annotations

import os

import numpy as np
import psutil

from ps_server.requests import BUCKETS, STATS

__all__ = ["SERVER_FUNCTIONS", "READ_ONLY", "report"]


def report(tensors, args: dict, arrays: list[np.ndarray]):
    out = STATS.snapshot()
    out.update(pid=os.getpid(), rss_bytes=psutil.Process().memory_info().rss, buckets=BUCKETS)
    return out, []


SERVER_FUNCTIONS = {"report": report}
READ_ONLY = ("report",)
