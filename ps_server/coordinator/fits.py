"""The fits that report their progress to the coordinator, for the status page.

Each fit (``spark_ps.ml._progress.Progress``) sends one `ReportProgress` per iteration,
epoch or tree: how far it is and its metrics (loss, ...). The board keeps every fit's
points, a bounded number of fits (the oldest finished ones go first) and of points per
fit, so a long-running service holds a few megabytes at most.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict

from ps_server.proto import ps_pb2 as pb

__all__ = ["FitBoard", "MAX_FITS", "MAX_POINTS"]

#: Fits kept (running ones are never dropped while finished ones remain).
MAX_FITS = 20
#: Points kept per fit: past it every other point is dropped, so the curve keeps its shape.
MAX_POINTS = 2000


class FitBoard:
    """Fit id -> what it reported; safe to use from any thread."""

    def __init__(self, max_fits: int = MAX_FITS, max_points: int = MAX_POINTS):
        self.max_fits, self.max_points = max_fits, max_points
        self._fits: OrderedDict[str, dict] = OrderedDict()
        self._lock = threading.Lock()

    def report(self, p: pb.FitProgress) -> None:
        now = time.time()
        with self._lock:
            fit = self._fits.get(p.fit)
            if fit is None:
                fit = self._fits[p.fit] = {
                    "fit": p.fit,
                    "name": p.name,
                    "unit": p.unit,
                    "total": p.total,
                    "started": now,
                    "points": [],
                    "finished": False,
                }
                self._trim()
            fit.update(total=p.total, updated=now, done=p.done)
            fit["finished"] = fit["finished"] or p.finished
            if p.metrics:
                points = fit["points"]
                points.append({"done": p.done, "seconds": round(now - fit["started"], 3)})
                points[-1].update({k: float(v) for k, v in sorted(p.metrics.items())})
                if len(points) > self.max_points:
                    del points[1:-1:2]

    def _trim(self) -> None:
        while len(self._fits) > self.max_fits:
            victim = next((k for k, f in self._fits.items() if f["finished"]), None)
            self._fits.pop(victim if victim is not None else next(iter(self._fits)))

    def snapshot(self) -> list[dict]:
        """Every fit kept, oldest first, as plain data (copies)."""
        with self._lock:
            return [{**f, "points": [dict(x) for x in f["points"]]} for f in self._fits.values()]
