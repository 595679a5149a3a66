"""A fit's progress: a one-line display in a terminal or a notebook, and the PS's page.

The line is shown when stderr is a terminal or an IPython kernel runs us, unless
SPARK_PS_PROGRESS=0; always logged at INFO on ``spark_ps.progress`` too. Each step is
also reported to the coordinator of the PS the fit trains on (``ReportProgress``), whose
status page (``spark.ps.uiPort``, ``ps_server.ui``) draws the fit's curves.
"""

from __future__ import annotations

import logging
import math
import os
import sys
import time
import uuid

__all__ = ["Progress"]

log = logging.getLogger("spark_ps.progress")


def _interactive() -> bool:
    if os.environ.get("SPARK_PS_PROGRESS", "") == "0":
        return False
    if os.environ.get("SPARK_PS_PROGRESS", "") == "1":
        return True
    return sys.stderr.isatty() or "ipykernel" in sys.modules


def _active_client():
    """The active PSContext's client (None: no PS yet, or stopped)."""
    from spark_ps.context import PSContext

    try:
        return PSContext.active().client
    except RuntimeError:
        return None


class Progress:
    """``Progress("LogisticRegression", total=20)``; ``update(i, loss=...)``; ``close()``.

    `client`: the ``PSClient`` whose coordinator hears of each step (default: the active
    PSContext's, if any).
    """

    def __init__(self, name: str, total: int, unit: str = "iteration", client=None):
        self.name, self.total, self.unit = name, total, unit
        self.start = time.perf_counter()
        self.show = _interactive()
        self.client = client if client is not None else _active_client()
        self.fit = f"{name.split()[-1].strip('()')}-{uuid.uuid4().hex[:8]}"
        self.done, self._failures = 0, 0
        self._report(0, {}, False)

    def update(self, done: int, **metrics: float) -> None:
        secs = time.perf_counter() - self.start
        width = 20
        filled = int(width * min(done, self.total) / max(self.total, 1))
        bar = "#" * filled + "-" * (width - filled)
        extra = "  ".join(f"{k} {v:.6g}" for k, v in metrics.items())
        line = f"{self.name} [{bar}] {self.unit} {done}/{self.total}  {extra}  {secs:.1f}s"
        log.info(line)
        if self.show:
            sys.stderr.write("\r" + line)
            sys.stderr.flush()
        self.done = done
        self._report(done, metrics, False)

    def close(self) -> None:
        if self.show:
            sys.stderr.write("\n")
            sys.stderr.flush()
        self._report(self.done, {}, True)

    def _report(self, done: int, metrics: dict, finished: bool) -> None:
        if self.client is None:
            return
        try:
            finite = {k: float(v) for k, v in metrics.items() if math.isfinite(v)}
            self.client.report_progress(
                self.fit, self.name, done, self.total, self.unit, finite, finished
            )
        except Exception as e:  # noqa: BLE001 - the page misses a point; the fit goes on
            log.debug("progress of %s not reported: %s", self.fit, e)
            self._failures += 1
            if self._failures >= 3:  # an unreachable or older coordinator: stop asking it
                self.client = None
        else:
            self._failures = 0
