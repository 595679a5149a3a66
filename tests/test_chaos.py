"""The chaos soak at its CI size: LR, GBT and FTRL fits with default settings finish with
their clean twins' answers while shards and executor JVMs are SIGKILLed at random moments,
and nothing the run started outlives it (bench/chaos.py does the work and the checks)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
@pytest.mark.cluster
@pytest.mark.timeout(600)
def test_small_chaos_soak_recovers_every_fit_and_leaks_nothing():
    cmd = [sys.executable, "-m", "bench.chaos", "--minutes", "1.2", "--min-kills", "4"]
    cmd += ["--rows", "6000", "--min-pause", "2", "--max-pause", "5"]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=540)
    report = done.stdout[-6000:]
    print(report)
    assert done.returncode == 0, report + done.stderr[-3000:]
    assert "chaos: ok" in report
    assert "| LR " in report and "| GBT " in report and "| FTRL " in report
