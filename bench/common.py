"""Shared benchmark plumbing: a Spark session, timers, memory probes, AUC and a table printer.

Every benchmark script prints one markdown table per dataset so the output can be pasted
into bench/README.md as it is. All JVM access of the benchmarks lives in
:func:`jvm_heap_used`, so a Spark upgrade touches one function.
"""

from __future__ import annotations

import functools
import importlib
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "REPO_ROOT",
    "Timer",
    "PeakMemory",
    "ProcessCPU",
    "auc",
    "bench_session",
    "fmt_ratio",
    "import_sparkps",
    "jvm_heap_used",
    "load_note",
    "markdown_table",
    "model_auc",
    "parse_impls",
    "python_rss",
    "run_guarded",
    "spark_home",
]

REPO_ROOT = Path(__file__).resolve().parents[1]


def spark_home() -> str:
    """Return a SPARK_HOME made of symlinks into pyspark (used by the tests and benches).

    Spark writes work dirs under SPARK_HOME; a folder of its own keeps site-packages clean.
    """
    import pyspark

    src = Path(pyspark.__file__).parent
    home = REPO_ROOT / ".spark_home"
    home.mkdir(exist_ok=True)
    for name in ("bin", "jars", "sbin", "python"):
        link = home / name
        if not link.exists():
            link.symlink_to(src / name)
    return str(home)


def bench_session(
    driver_memory: str = "4g",
    *,
    master: str = "local[2]",
    app: str = "spark-ps-bench",
    conf: dict[str, str] | None = None,
):
    """Build (or get) the SparkSession used by the benchmarks.

    Parameters
    ----------
    driver_memory : str
        JVM heap of the driver; in local mode the driver is also the executor, so this caps
        cached data, task memory and MLlib's dense gradient arrays alike.
    master : str
        Spark master; local[2] matches the 2-core benchmark machine.
    conf : dict, optional
        Extra Spark settings, applied last.
    """
    os.environ.setdefault("SPARK_HOME", spark_home())
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    builder = (
        SparkSession.builder.master(master)
        .appName(app)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.memory", driver_memory)
        .config("spark.driver.maxResultSize", "4g")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config("spark.python.worker.reuse", "true")
        # every timed fit reads its rows, as MLlib's does: a warm-up or an earlier fit on
        # the same cached DataFrame would otherwise leave parses that later fits read
        # (bench/lr.py --refit turns them on to time exactly that)
        .config("spark.ps.parseCache", "false")
    )
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


class Timer:
    """Wall-clock timer usable as a context manager; ``elapsed`` is in seconds."""

    def __init__(self) -> None:
        self.start = 0.0
        self.elapsed = 0.0

    def __enter__(self) -> Timer:
        self.start = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.elapsed = time.perf_counter() - self.start


def jvm_heap_used(spark: Any, *, gc: bool = False) -> int:
    """Bytes of heap the driver JVM uses now (MemoryMXBean), optionally after a System.gc().

    The only py4j access of the benchmarks. Running a GC first gives a baseline of live
    data instead of live data plus uncollected garbage.
    """
    jvm = spark.sparkContext._jvm
    if gc:
        jvm.java.lang.System.gc()
    bean = jvm.java.lang.management.ManagementFactory.getMemoryMXBean()
    return int(bean.getHeapMemoryUsage().getUsed())


def python_rss() -> int:
    """Resident set size of this Python process in bytes (psutil, else ru_maxrss)."""
    try:
        import psutil

        return int(psutil.Process().memory_info().rss)
    except ImportError:  # pragma: no cover - psutil is a project dependency
        return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


@dataclass
class PeakMemory:
    """Sample driver JVM heap and Python RSS in a background thread; keep the peaks.

    Why sampling: the JVM's per-pool peak counters include the young generation's full
    size, which says more about GC tuning than about the algorithm. Sampled heap-used
    (every ``interval`` s) catches the large, long-lived arrays (MLlib's dense gradients)
    that matter here, though it may miss spikes shorter than the interval.
    """

    spark: Any
    interval: float = 0.05
    jvm_peak: int = 0
    jvm_base: int = 0
    py_peak: int = 0
    _stop: threading.Event = field(default_factory=threading.Event, repr=False)
    _thread: threading.Thread | None = field(default=None, repr=False)

    def _sample(self) -> None:
        self.jvm_peak = max(self.jvm_peak, jvm_heap_used(self.spark))
        self.py_peak = max(self.py_peak, python_rss())

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self._sample()
            except Exception:  # the JVM may be gone (e.g. after an OOM); stop sampling
                return

    def __enter__(self) -> PeakMemory:
        self.jvm_base = jvm_heap_used(self.spark, gc=True)
        self.jvm_peak = self.jvm_base
        self.py_peak = python_rss()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        try:
            self._sample()
        except Exception:
            pass

    @property
    def jvm_mib(self) -> float:
        """Peak sampled driver heap in MiB."""
        return self.jvm_peak / 2**20

    @property
    def py_mib(self) -> float:
        """Peak sampled Python driver RSS in MiB."""
        return self.py_peak / 2**20


#: What a process of this benchmark's own tree is, by its command line (the first kind
#: whose words it holds); a JVM is known by its executable's name first, since PySpark puts
#: Spark confs (module names among them) on its command line.
_CPU_KINDS = (
    ("PS", ("ps_server",)),
    ("Python workers", ("pyspark.daemon", "pyspark.worker", "spark_ps.worker_daemon")),
)


def _cpu_by_process() -> dict[tuple[int, float], tuple[str, float]]:
    """{(pid, start time): (kind, user + system CPU seconds so far)} of every process this
    user can see: this one is "driver", its descendants "JVM", "PS", "Python workers" or
    "ours, other", and every process outside its tree "other" (the machine's other load)."""
    import psutil

    me = psutil.Process()
    ours = {p.pid for p in me.children(recursive=True)}
    out = {}
    for proc in psutil.process_iter(["name", "cmdline", "cpu_times", "create_time"]):
        info, times = proc.info, proc.info["cpu_times"]
        if times is None:
            continue
        if proc.pid == me.pid:
            kind = "driver"
        elif proc.pid not in ours:
            kind = "other"
        elif (info["name"] or "").startswith("java"):
            kind = "JVM"
        else:
            cmd = " ".join(info["cmdline"] or ())
            kind = next((k for k, w in _CPU_KINDS if any(x in cmd for x in w)), "ours, other")
        out[(proc.pid, info["create_time"] or 0.0)] = (kind, times.user + times.system)
    return out


def _cores() -> int:
    """The cores this process may run on (its affinity, where the OS reports one)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


class ProcessCPU:
    """CPU seconds the machine's processes spent while the block ran, by kind (this
    process, and of its descendants the JVM, PS, Python workers; every other process as
    "other"), beside what the cores could give (wall x cores).

    Why: where the workers, the PS shards and the JVM share the cores, every second the
    shards or the JVM spend is taken from the workers, so a fit cannot reach a floor that
    gives the workers every core; this shows how much was taken, and how near the machine
    ran to full. A process that exited inside the block is not counted.
    """

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.capacity = 0.0
        self._before: dict[tuple[int, float], tuple[str, float]] = {}
        self._t0 = 0.0

    def __enter__(self) -> ProcessCPU:
        self._before = _cpu_by_process()
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        wall = time.perf_counter() - self._t0
        self.capacity = wall * _cores()
        seconds: dict[str, float] = {}
        for key, (kind, cpu) in _cpu_by_process().items():
            spent = cpu - self._before.get(key, (kind, 0.0))[1]
            seconds[kind] = seconds.get(kind, 0.0) + spent
        self.seconds = {k: round(v, 2) for k, v in sorted(seconds.items(), key=lambda kv: -kv[1])}

    def line(self) -> str:
        """``CPU s: {kind: seconds} of <capacity> (x% busy)``."""
        used = sum(self.seconds.values())
        busy = 100.0 * used / self.capacity if self.capacity else 0.0
        return f"CPU s: {self.seconds} of {self.capacity:.2f} ({busy:.0f}% busy)"


def auc(labels: np.ndarray, scores: np.ndarray) -> float:
    """Area under the ROC curve by the rank-sum (Mann-Whitney) formula; ties get mid-ranks.

    Matches MLlib's BinaryClassificationEvaluator up to its binning, and sklearn's
    roc_auc_score exactly.
    """
    y = np.asarray(labels, dtype=np.float64).ravel()
    s = np.asarray(scores, dtype=np.float64).ravel()
    if y.shape != s.shape:
        raise ValueError(f"auc: labels has {y.size} rows but scores has {s.size}")
    if not np.isin(y, (0.0, 1.0)).all():
        bad = np.unique(y[~np.isin(y, (0.0, 1.0))])[:5]
        raise ValueError(f"auc: labels must be 0 or 1, found {bad.tolist()}")
    n_pos = float(y.sum())
    n_neg = float(y.size - n_pos)
    if n_pos == 0 or n_neg == 0:
        raise ValueError(
            f"auc: need both classes, got {n_pos:.0f} positives, {n_neg:.0f} negatives"
        )
    order = np.argsort(s, kind="mergesort")
    sorted_s = s[order]
    # Mid-rank of each tie group: groups start where the sorted score changes.
    starts = np.flatnonzero(np.r_[True, sorted_s[1:] != sorted_s[:-1]])
    ends = np.r_[starts[1:], s.size]
    mid = (starts + ends + 1) / 2.0  # 1-based mean rank of positions [start, end)
    ranks = np.empty(s.size)
    ranks[order] = np.repeat(mid, ends - starts)
    return float((ranks[y == 1.0].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def model_auc(model: Any, test: Any, label_col: str = "label") -> float:
    """Test AUC of a fitted Spark classification model, from ``rawPrediction[1]``.

    Only two doubles per row reach the driver (via Arrow), so scoring a few hundred
    thousand rows costs little next to the fit.
    """
    from pyspark.ml.functions import vector_to_array

    raw = vector_to_array(model.getOrDefault("rawPredictionCol"))[1].alias("score")
    table = model.transform(test).select(label_col, raw).toArrow()
    return auc(table.column(label_col).to_numpy(), table.column("score").to_numpy())


def parse_impls(text: str, known: Sequence[str]) -> list[str]:
    """Split a comma list of implementation names and check each against ``known``."""
    impls = [t.strip().lower() for t in text.split(",") if t.strip()]
    bad = [t for t in impls if t not in known]
    if bad:
        raise ValueError(f"--impl: unknown {bad}; choose from {list(known)}")
    return impls


@functools.cache
def import_sparkps(name: str) -> Any | None:
    """Return ``spark_ps.ml.classification.<name>``, or None with a note (printed once)."""
    try:
        module = importlib.import_module("spark_ps.ml.classification")
        return getattr(module, name)
    except Exception as exc:  # ImportError, AttributeError, or a broken module
        print(f"note: spark-ps {name} not available ({type(exc).__name__}: {exc}); skipped")
        return None


def load_note() -> str:
    """One line on machine load: timings taken on a busy shared machine are not comparable."""
    one, five, fifteen = os.getloadavg()
    cores = os.cpu_count() or 1
    note = f"machine: {cores} cores, load average {one:.1f} / {five:.1f} / {fifteen:.1f}"
    if one > cores:
        note += " -- busy: expect slow, noisy timings"
    return note


def fmt_ratio(num: float | None, den: float | None) -> str:
    """``num/den`` as 'x.xx', or 'n/a' when either side is missing or zero."""
    if num is None or den is None or not np.isfinite(num) or not np.isfinite(den) or den == 0:
        return "n/a"
    return f"{num / den:.2f}"


def _cell(value: Any) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, float):
        if not np.isfinite(value):
            return "n/a"
        return f"{value:.4g}" if abs(value) < 1e5 else f"{value:.3e}"
    return str(value)


def markdown_table(rows: Sequence[dict[str, Any]], columns: Sequence[str] | None = None) -> str:
    """Render dicts as a GitHub markdown table; missing cells print 'n/a'."""
    if not rows:
        return "(no rows)"
    cols = list(columns) if columns else list(dict.fromkeys(k for r in rows for k in r))
    body = [[_cell(r.get(c)) for c in cols] for r in rows]
    widths = [max(len(c), *(len(b[i]) for b in body)) for i, c in enumerate(cols)]
    line = "| " + " | ".join(c.ljust(w) for c, w in zip(cols, widths, strict=True)) + " |"
    sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    out = [line, sep]
    out += [
        "| " + " | ".join(v.ljust(w) for v, w in zip(b, widths, strict=True)) + " |" for b in body
    ]
    return "\n".join(out)


def _tree_rss(proc: Any) -> int:
    """RSS of a psutil process and all its descendants (shared pages counted twice)."""
    import psutil

    total = 0
    for p in [proc, *proc.children(recursive=True)]:
        try:
            total += p.memory_info().rss
        except psutil.Error:
            pass
    return total


def _kill_tree(proc: Any) -> None:
    import psutil

    family = [*proc.children(recursive=True), proc]
    for p in family:
        try:
            p.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(family, timeout=10)


def run_guarded(
    argv: list[str], *, cwd: str | Path, mem_limit_gb: float, timeout: float
) -> tuple[int | None, str, str]:
    """Run ``argv`` with a watchdog on the RSS of its whole process tree.

    Why: a case that is expected to fail by running out of memory (MLlib at 2**30, or an
    implementation that densifies a huge model) must not push a shared machine into the
    kernel's OOM killer. The tree (child Python, its JVM, PS shards) is killed as soon as
    its summed RSS passes ``mem_limit_gb`` or ``timeout`` seconds pass.

    Returns (exit code or None if killed, combined output, reason: '' / 'memory' / 'timeout').
    """
    import psutil

    limit = mem_limit_gb * 2**30
    with tempfile.TemporaryFile("w+") as log:
        child = subprocess.Popen(argv, cwd=cwd, stdout=log, stderr=subprocess.STDOUT, text=True)
        proc = psutil.Process(child.pid)
        start, reason = time.monotonic(), ""
        while child.poll() is None:
            if _tree_rss(proc) > limit:
                reason = "memory"
            elif time.monotonic() - start > timeout:
                reason = "timeout"
            if reason:
                _kill_tree(proc)
                break
            time.sleep(0.1)
        child.wait()
        log.seek(0)
        return (None if reason else child.returncode), log.read(), reason
