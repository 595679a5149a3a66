"""The chaos soak at CI size: fits under random shard and executor-JVM SIGKILLs.

``bench/chaos.py`` runs LR (L-BFGS), GBT and FTRL fits on ``local-cluster[2,1,1024]`` with
default settings while a killer SIGKILLs a random PS shard or executor JVM at random
moments; every fit must end with its clean twin's answer (LR/FTRL AUC within 0.002, GBT
trees identical) and nothing the run started may outlive it (processes, temp files,
shared memory). The full soak (>= 30 kills) is the bench: ``python -m bench.chaos``.
"""

from __future__ import annotations

import pytest

from bench import chaos


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_small_chaos_soak_finishes_every_fit_with_its_clean_answer_and_leaks_nothing(capsys):
    args = ["--minutes", "0.8", "--min-kills", "3", "--rows", "6000"]
    rc = chaos.main([*args, "--min-pause", "2", "--max-pause", "4"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "chaos: ok" in out and "FAILED" not in out
