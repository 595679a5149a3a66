"""One switch, ``SPARK_PS_NO_JIT``, turns off every numba pass: the key passes, the
shards' split search and the workers' tree kernels all ask ``ps_server.jit.jit_wanted``."""

from __future__ import annotations

import json
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


@pytest.mark.skipif(not jit_wanted(), reason="numba switched off")
def test_a_shard_warm_up_loads_every_compiled_pass_its_requests_run():
    """A fresh process: after the shard's warm-up, the stores' key passes and the GBT split
    search are loaded (so a fit's first request does not pay for it), and nothing else of
    a shard was started."""
    probe = (
        "import json, threading\n"
        "from ps_server import _keys_kernels as K\n"
        "from ps_server.functions import gbt_jit\n"
        "from ps_server.shard import server\n"
        "names = ('lookup', 'insert', 'scatter_add', 'gather')\n"
        "before = {n: len(getattr(K, n).signatures) for n in names}\n"
        "server.warm_up()\n"
        "after = {n: len(getattr(K, n).signatures) for n in before}\n"
        "print(json.dumps({'before': before, 'after': after,\n"
        "    'search': len(gbt_jit.kernel().signatures), 'threads': threading.active_count()}))\n"
    )  # fmt: skip
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=120
    )
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert set(got["before"].values()) == {0}
    assert all(n >= 1 for n in got["after"].values()), got
    assert got["after"]["scatter_add"] >= 2 and got["after"]["gather"] >= 2  # float64, int64
    assert got["search"] == 1 and got["threads"] == 1
