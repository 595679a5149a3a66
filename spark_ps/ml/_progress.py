"""A one-line progress display for fits, in a terminal or a notebook.

Shown when stderr is a terminal or an IPython kernel runs us, unless SPARK_PS_PROGRESS=0;
always logged at INFO on ``spark_ps.progress`` too.
"""

from __future__ import annotations

import logging
import os
import sys
import time

__all__ = ["Progress"]

log = logging.getLogger("spark_ps.progress")


def _interactive() -> bool:
    if os.environ.get("SPARK_PS_PROGRESS", "") == "0":
        return False
    if os.environ.get("SPARK_PS_PROGRESS", "") == "1":
        return True
    return sys.stderr.isatty() or "ipykernel" in sys.modules


class Progress:
    """``Progress("LogisticRegression", total=20)``; ``update(i, loss=...)``; ``close()``."""

    def __init__(self, name: str, total: int, unit: str = "iteration"):
        self.name, self.total, self.unit = name, total, unit
        self.start = time.perf_counter()
        self.show = _interactive()

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

    def close(self) -> None:
        if self.show:
            sys.stderr.write("\n")
            sys.stderr.flush()
