"""A fit's progress: a bar in a terminal or a notebook, the PS's page, TensorBoard curves.

Where each step of a fit goes:

- a ``tqdm.auto`` bar on stderr (one refreshing line in a terminal; a widget in Jupyter
  when ``ipywidgets`` is installed): shown when stderr is a terminal or an IPython kernel
  runs us. ``spark.ps.progress`` (the session's conf, read at each fit) ``false`` hides
  it, ``true`` shows it on any stderr; unset, ``SPARK_PS_PROGRESS=0``/``1`` does the same;
- the ``spark_ps.progress`` logger, at INFO, always;
- the coordinator of the PS the fit trains on (``ReportProgress``), whose status page
  (``spark.ps.uiPort``, ``ps_server.coordinator.ui``) draws the fit's curves;
- with ``spark.ps.logDir`` set, TensorBoard event files (``tensorboardX``, the ``[tensorboard]``
  extra) in ``<logDir>/<fit id>/``: one scalar per metric per step.
"""

from __future__ import annotations

import logging
import math
import os
import sys
import time
import uuid

__all__ = ["Progress", "progress_setting"]

log = logging.getLogger("spark_ps.progress")

_SHOW = {"true": True, "1": True, "false": False, "0": False, "auto": None, "": None}


def _session_conf(key: str) -> str:
    """`key` from the active SparkSession's conf ('' without a session or the key)."""
    try:
        from pyspark.sql import SparkSession

        session = SparkSession.getActiveSession() or SparkSession._instantiatedSession
        if session is None:
            return ""
        return (session.conf.get(key, None) or "").strip()
    except Exception:  # noqa: BLE001 - no JVM (a stopped context): nothing configured
        return ""


def progress_setting() -> bool | None:
    """``spark.ps.progress`` (else ``SPARK_PS_PROGRESS``): True show, False hide, None auto."""
    value = _session_conf("spark.ps.progress")
    where = "spark.ps.progress"
    if not value:
        value, where = os.environ.get("SPARK_PS_PROGRESS", "").strip(), "SPARK_PS_PROGRESS"
    if value.lower() not in _SHOW:
        raise ValueError(f"{where} must be true, false or auto, got {value!r}")
    return _SHOW[value.lower()]


def _interactive() -> bool:
    show = progress_setting()
    if show is not None:
        return show
    return sys.stderr.isatty() or "ipykernel" in sys.modules


def _active_client():
    """The active PSContext's client (None: no PS yet, or stopped)."""
    from spark_ps.context import PSContext

    try:
        return PSContext.active().client
    except RuntimeError:
        return None


def _event_writer(log_dir: str, fit: str):
    """A TensorBoard event writer into `log_dir`/`fit`, or ImportError naming the extra."""
    try:
        from tensorboardX import SummaryWriter
    except ImportError as e:
        raise ImportError(
            f"spark.ps.logDir={log_dir!r} asks for TensorBoard event files, which need "
            "tensorboardX: pip install 'spark-ps[tensorboard]'"
        ) from e
    return SummaryWriter(logdir=os.path.join(log_dir, fit), flush_secs=5)


class Progress:
    """``Progress("LogisticRegression", total=20)``; ``update(i, loss=...)``; ``close()``.

    `client`: the ``PSClient`` whose coordinator hears of each step (default: the active
    PSContext's, if any). `total` 0: no end known (a stream's micro-batches). `bar` False:
    no terminal/notebook bar (a streaming query shows its own progress).
    """

    def __init__(
        self, name: str, total: int, unit: str = "iteration", client=None, bar: bool = True
    ):
        self.name, self.total, self.unit = name, total, unit
        self.start = time.perf_counter()
        self.client = client if client is not None else _active_client()
        self.fit = f"{name.split()[-1].strip('()')}-{uuid.uuid4().hex[:8]}"
        self.done, self._failures = 0, 0
        self._bar = self._new_bar() if bar and _interactive() else None
        log_dir = _session_conf("spark.ps.logDir")
        self.events = _event_writer(log_dir, self.fit) if log_dir else None
        #: Where this fit's event files go (None: spark.ps.logDir is not set)
        self.log_dir = os.path.join(log_dir, self.fit) if log_dir else None
        self._report(0, {}, False)

    def _new_bar(self):
        from tqdm.auto import tqdm

        return tqdm(
            total=self.total,
            desc=self.name,
            unit=self.unit,
            file=sys.stderr,
            leave=True,
            dynamic_ncols=True,
            mininterval=0.2,
        )

    def update(self, done: int, **metrics: float) -> None:
        secs = time.perf_counter() - self.start
        extra = "  ".join(f"{k} {v:.6g}" for k, v in metrics.items())
        log.info("%s: %s %d/%d  %s  %.1fs", self.name, self.unit, done, self.total, extra, secs)
        if self._bar is not None:
            self._bar.set_postfix({k: f"{v:.6g}" for k, v in metrics.items()}, refresh=False)
            self._bar.n = done  # a fit that rolls back after a shard restart counts down too
            self._bar.refresh()
        if self.events is not None:
            for k, v in metrics.items():
                self.events.add_scalar(k, float(v), global_step=done)
        self.done = done
        self._report(done, metrics, False)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        if self.events is not None:
            self.events.close()
            self.events = None
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
