"""bench/hosts.py at a tiny size, so that the multi-host bench cannot rot unnoticed:
1 and 2 hosts with capped links, a second of traffic each, a 2-iteration LR fit."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from bench.hosts import COLUMNS, rate_mb
from bench.netns import unavailable

_WHY = unavailable()
ROOT = Path(__file__).resolve().parents[1]


def _table(out: str) -> list[dict[str, str]]:
    """The rows of the markdown table that `out` ends with."""
    lines = [ln for ln in out.splitlines() if ln.startswith("|")]
    head = [c.strip() for c in lines[0].strip("|").split("|")]
    return [dict(zip(head, (c.strip() for c in ln.strip("|").split("|")), strict=True))
            for ln in lines[2:]]  # fmt: skip


@pytest.mark.skipif(bool(_WHY), reason=_WHY or "-")
@pytest.mark.slow
@pytest.mark.timeout(120)
def test_the_hosts_bench_prints_positive_figures_for_1_and_2_hosts():
    cmd = [sys.executable, "-m", "bench.hosts", "--hosts", "1,2", "--rate", "100mbit",
           "--keys", "50000", "--clients", "2", "--seconds", "0.3", "--repeat", "1",
           "--lr-rows", "2000", "--lr-log2-dim", "12", "--lr-iter", "2", "--no-warmup"]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=110, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = _table(done.stdout)
    assert [(r["hosts"], r["link cap"]) for r in rows] == [
        ("1", "100mbit"), ("2", "none"), ("2", "100mbit")
    ]  # fmt: skip
    assert list(rows[0]) == COLUMNS
    for r in rows:
        for col in ("push MB/s", "pull MB/s", "push Mkeys/s", "pull Mkeys/s"):
            assert float(r[col]) > 0, (col, r)
    for r in (rows[0], rows[2]):
        assert float(r["LR s/iter"]) > 0, r
        assert float(r["push MB/s"]) < 2 * int(r["hosts"]) * rate_mb("100mbit"), r  # capped
    assert rows[2]["partitions per host"] == "1/1"  # the model spans both hosts
    assert float(rows[2]["push vs 1 host"]) > 1.2  # two capped links carry more than one


def test_rates_are_read_as_tc_writes_them():
    assert rate_mb("200mbit") == 25.0
    assert rate_mb("1gbit") == 125.0
    with pytest.raises(ValueError, match="--rate must look like 200mbit.*got '200mb'"):
        rate_mb("200mb")
