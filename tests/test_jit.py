"""One switch, ``SPARK_PS_NO_JIT``, turns off every numba pass: the key passes, the
shards' split search and the workers' tree kernels all ask ``ps_server.jit.jit_wanted``."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from ps_server import keys_jit
from ps_server.functions import gbt_jit
from ps_server.jit import jit_wanted

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize(
    ("value", "wanted"), [(None, True), ("", True), ("0", True), ("1", False), ("yes", False)]
)
def test_jit_wanted_reads_the_switch(monkeypatch, value, wanted):
    if value is None:
        monkeypatch.delenv("SPARK_PS_NO_JIT", raising=False)
    else:
        monkeypatch.setenv("SPARK_PS_NO_JIT", value)
    assert jit_wanted() is wanted


def test_the_switch_turns_off_the_key_passes_and_the_split_search(monkeypatch):
    monkeypatch.setenv("SPARK_PS_NO_JIT", "1")
    assert keys_jit._compile() is None
    assert gbt_jit._compile() is None
    from ps_server.jit import compiled
    from spark_ps.ml.lr import row_blocks

    assert compiled(row_blocks._matvec, row_blocks._rmatvec) is None  # LR's row blocks


def test_the_switch_turns_off_the_tree_kernels_in_a_fresh_worker():
    probe = "import spark_ps.ml.tree.kernels as k; print(k.HAVE_JIT)"
    off = subprocess.run(
        [sys.executable, "-c", probe],
        env={**os.environ, "SPARK_PS_NO_JIT": "1"},
        capture_output=True,
        text=True,
        check=True,
    )
    assert off.stdout.strip() == "False"
