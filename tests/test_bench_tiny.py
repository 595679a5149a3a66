"""Every bench runs once at a tiny size, as its own process, so none can rot: its options,
imports, data loading and table still work. The figures are not checked (speed lives in
the benches' own output, not in tests); what is checked is that each printed its table
and that no implementation in it failed.

`bench.lr`, `bench.ps`, `bench.hosts`, `bench.chaos` and `bench.load` have their own tests
(tests/test_bench_smoke.py, test_dataplane.py, test_bench_hosts.py, test_chaos.py,
test_ps_service.py).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: bench -> (tiny arguments, a line its output must contain)
BENCHES = {
    "fm": (
        "--log2-dims 10 --rows 2000 --nnz 5 --factors 2 --iters 2 --driver-memory 1g",
        r"^\| 2\^10 +\| sparkps .*\| ok +\|$",
    ),
    "gbt": (
        "--impl mllib,sparkps --configs 2x2 --rows 2000 --no-warmup --driver-memory 1g "
        "--dataset dense80 --refit --profile",
        # --refit: the refit read the saved parses (True) and grew the same trees (True)
        r"^\| 2x2 .*\| sparkps .*\| True +\| True +\| ok +\|$",
    ),
    "multinomial": (
        "--log2-dim 10 --classes 3 --rows 1000 --tokens 5 --vocab 500 --max-iter 2 "
        "--driver-memory 1g",
        r"^\| spark-ps +\| [0-9.]+ +\|",
    ),
    "linear": ("--rows 2000 --max-iter 3", r"^\| LinearSVC +\| 2000 +\| [0-9.]+ +\| [0-9.]+ "),
    "score": (
        "--rows 2000 --log2 12 --nnz 5 --fit-iter 2 --compress-rows 2000 --compress-log2 10 "
        "--compress-iter 2 --flights-fraction 0.01 --driver-memory 1g",
        r"^### LR compression$",
    ),
    "journal": ("--calls 50 --repeats 1", r"^\| 0 \| [0-9]+ us \| [0-9]+ us \|"),
    "waiters": ("--waiters 10,50", r"^\| 50 +\|"),
    "replication": ("--keys 10000 --repeat 1", r"^\| sparse push +\| [0-9]"),
    "handover": ("--repeat 1 --rows 2000", r"^\| packed uncapped +\| 2000 +\|"),
    "recovery": (
        "--rows 2000 --log2-dim 10 --max-iter 4 --interval 2 --kill-at 2",
        r"^\| every 2 \+ kill at 2 .*\| True +\|$",  # the bench's own check
    ),
    "ft_cost": (
        "--lr-log2 10 --lr-rows 2000 --lr-iters 3 --gbt-trees 2 --gbt-depth 2 --repeats 1 "
        "--driver-memory 1g",
        r"^\| GBT nycflights 2x2 +\| [0-9.]+ +\|",
    ),
    "scale": ("--keys 20000 --shards 2 --warmup 0.5", r"every pushed update was there at the end"),
}

#: needs root (network namespaces), as the hosts tests do
_NEEDS_ROOT = {"scale"}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(BENCHES))
def test_the_bench_runs_at_a_tiny_size_and_prints_its_table(name):
    if name in _NEEDS_ROOT and os.geteuid() != 0:
        pytest.skip("network namespaces need root")
    args, expected = BENCHES[name]
    proc = subprocess.run(
        [sys.executable, "-m", f"bench.{name}", *args.split()],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    tail = (proc.stdout[-3000:], proc.stderr[-3000:])
    assert proc.returncode == 0, tail
    assert re.search(expected, proc.stdout, re.M), tail
    # no implementation in its tables failed or was skipped
    rows = [line for line in proc.stdout.splitlines() if line.startswith("|")]
    assert rows, tail
    assert not [r for r in rows if re.search(r"\bfailed\b|\berror\b|skipped", r, re.I)], tail
