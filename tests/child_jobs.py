"""Jobs run in a child process, as a pipeline would run them: `spark-submit`, or a fresh
Python. A job reports back by printing one ``RESULT <json>`` line; tests read the last."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_TAG = "RESULT "


def spark_submit(
    app: Path,
    *args: object,
    master: str = "local-cluster[2,1,1024]",
    conf: dict[str, str] | None = None,
    jars: tuple[Path, ...] = (),
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    timeout: float = 540,
) -> subprocess.CompletedProcess:
    """`spark-submit` `app` (SPARK_HOME's launcher); fails the test, with the job's output,
    unless it exits 0."""
    cmd = [str(Path(os.environ["SPARK_HOME"]) / "bin" / "spark-submit"), "--master", master]
    if jars:
        cmd += ["--jars", ",".join(str(j) for j in jars)]
    for key, value in (conf or {}).items():
        cmd += ["--conf", f"{key}={value}"]
    cmd += [str(app), *(str(a) for a in args)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=cwd)
    assert done.returncode == 0, f"job failed:\n{done.stdout}\n{done.stderr[-6000:]}"
    return done


def run_script(script: str, *args: str, timeout: float = 300) -> dict:
    """Run `script` in a fresh Python (from the repo root) and return its RESULT."""
    done = subprocess.run(
        [sys.executable, "-c", script, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=str(ROOT),
    )
    assert done.returncode == 0, f"script failed:\n{done.stdout}\n{done.stderr[-4000:]}"
    return result_of(done)


def result_of(done: subprocess.CompletedProcess) -> dict:
    """The JSON of the last ``RESULT`` line the job printed."""
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith(_TAG)]
    assert lines, f"the job printed no {_TAG!r} line:\n{done.stdout}\n{done.stderr[-4000:]}"
    return json.loads(lines[-1][len(_TAG) :])


class LogLines(logging.Handler):
    """The messages of the loggers it is added to (a child job reads what a fit logged)."""

    def __init__(self, *loggers: str) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []
        for name in loggers:
            logger = logging.getLogger(name)
            logger.addHandler(self)
            logger.setLevel(logging.INFO)

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())
