"""The benches run at a tiny size in CI so they cannot rot (their figures are not checked:
speed lives in the benches' own output, not in tests)."""

from __future__ import annotations

import pytest

from bench import lr as bench_lr


@pytest.mark.slow
def test_lr_bench_prints_the_fit_against_its_compute_floor(spark, capsys):
    rows = bench_lr.main(
        [
            "--impl", "mllib,sparkps", "--datasets", "synthetic", "--log2-dims", "12",
            "--rows", "3000", "--nnz", "8", "--max-iter", "5", "--no-warmup", "--refit",
        ]
    )  # fmt: skip
    out = capsys.readouterr().out
    ours = next(r for r in rows if r["impl"] == "sparkps")
    assert ours["status"] == "ok", ours
    # the floor is one Arrow pass plus the fit's own evaluations at the measured kernel time
    assert ours["floor s"] > 0 and ours["fit/floor"] == pytest.approx(
        ours["fit s"] / ours["floor s"]
    )
    assert "x the floor; costs (s):" in out and "worker pull" in out
    assert "| fit/floor |" in out
    # the refit reads the first fit's saved parses and reaches the same loss
    assert ours["refit/floor"] == pytest.approx(ours["refit s"] / ours["floor s"])
    assert "refit" in out and "the floor (final loss" in out
    mllib = next(r for r in rows if r["impl"] == "mllib")
    assert mllib["status"] == "ok" and mllib.get("floor s") is None
