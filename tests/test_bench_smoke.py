"""The benches run at a tiny size in CI so they cannot rot (their figures are not checked:
speed lives in the benches' own output, not in tests)."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from bench import lr as bench_lr
from bench.common import ProcessCPU
from bench.floor import floor_row


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
    assert "sparkps synthetic 2^12 fit" in out and "% busy)" in out  # the fit's CPU split
    assert "(fastest of [" in out  # the floor's Arrow pass, with every pass it took
    assert "solver algebra" in out and "outside the phases" in out
    assert "| fit/floor |" in out
    # the refit reads the first fit's saved parses and reaches the same loss
    assert ours["refit/floor"] == pytest.approx(ours["refit s"] / ours["floor s"])
    assert "refit" in out and "the floor (final loss" in out
    mllib = next(r for r in rows if r["impl"] == "mllib")
    assert mllib["status"] == "ok" and mllib.get("floor s") is None


@pytest.mark.slow
def test_lr_bench_repeats_a_fit_and_keeps_the_median_one(spark, capsys):
    rows = bench_lr.main(
        [
            "--impl", "sparkps", "--datasets", "synthetic", "--log2-dims", "12",
            "--rows", "3000", "--nnz", "8", "--max-iter", "5", "--no-warmup", "--repeat", "2",
        ]
    )  # fmt: skip
    (ours,) = rows
    assert ours["status"] == "ok", ours
    times = [float(t) for t in ours["fits s"].split(" / ")]
    assert len(times) == 2 and ours["fit s"] == pytest.approx(min(times), abs=0.006)
    assert capsys.readouterr().out.count("sparkps synthetic 2^12 fit ") == 2
    assert ours["fit/floor"] == pytest.approx(ours["fit s"] / ours["floor s"])


def test_lr_bench_refuses_repeated_first_fits_with_a_refit():
    with pytest.raises(SystemExit):  # every fit after the first would read the saved parses
        bench_lr.parse_args(["--repeat", "2", "--refit"])
    with pytest.raises(SystemExit):
        bench_lr.parse_args(["--repeat", "0"])
    assert bench_lr.parse_args(["--repeat", "3"]).repeat == 3


def test_a_fit_that_ran_out_of_heap_says_how_to_give_it_more():
    """MLlib at 2^24 needs more than the default driver heap: the status says which flag."""
    oom = RuntimeError(
        "An error occurred while calling o123.fit.\n: java.lang.OutOfMemoryError: Java heap space"
    )
    status = bench_lr._failure(oom)
    assert status.startswith("failed: RuntimeError: An error occurred while calling o123.fit.")
    assert status.endswith(bench_lr.HEAP_HINT) and "--driver-memory" in status
    assert bench_lr._failure(ValueError("bad label 3.0 in row 7")) == (
        "failed: ValueError: bad label 3.0 in row 7"
    )
    metaspace = RuntimeError("o9.fit\n: java.lang.OutOfMemoryError: Metaspace")
    assert "--driver-memory" not in bench_lr._failure(metaspace)  # more heap would not help


def test_the_floor_row_lists_the_solver_and_what_lies_outside_the_phases():
    """Every second of a fit is in the floor or a listed cost: the solver's own work is
    the first objective and the iterations less the evaluations; what the phases do not
    span is the fit's time less all of them."""
    phases = {
        "job start + read": 1.0, "key numbering": 0.2, "statistics": 0.4,
        "solver vectors": 0.05, "first objective": 0.25, "iterations": 5.0,
        "coefficients": 0.1, "eval offset": 0.1, "eval round": 4.0, "eval reduce": 0.2,
        "eval finish": 0.2, "worker pull": 0.3, "worker compute": 3.2,
        "worker push+contribute": 0.2, "evaluations": 20,
    }  # fmt: skip
    row = floor_row(7.25, phases, {"arrow pass s": 1.5, "eval s": 0.15})
    assert row["floor s"] == pytest.approx(1.5 + 20 * 0.15)
    costs = row["costs"]
    assert costs["solver algebra"] == pytest.approx(0.25 + 5.0 - (0.1 + 4.0 + 0.2 + 0.2))
    assert costs["outside the phases"] == pytest.approx(7.25 - 7.0)
    assert costs["rounds beyond compute"] == pytest.approx(4.0 - 3.2 - 0.3 - 0.2)


def _spin(seconds: float) -> None:
    start = time.process_time()
    while time.process_time() - start < seconds:
        pass


def test_process_cpu_splits_the_machines_cpu_by_kind_of_process():
    """A child whose command line names ps_server counts as PS, this process as the driver;
    both spin 0.3 CPU seconds inside the block (CPU time is counted in 10 ms ticks), so
    neither may show much more than that, nor more than the cores could give."""
    code = (
        "import sys, time\n"
        "t = time.process_time()\n"
        "while time.process_time() - t < 0.3: pass\n"
        "print('spun', flush=True)\n"
        "sys.stdin.read()\n"
    )
    child = None
    try:
        with ProcessCPU() as cpu:
            child = subprocess.Popen(
                [sys.executable, "-c", code, "ps_server"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
            _spin(0.3)
            assert child.stdout.readline().strip() == "spun"
        assert 0.25 <= cpu.seconds["PS"] <= 0.5, cpu.seconds  # the baseline is subtracted
        assert 0.25 <= cpu.seconds["driver"] <= cpu.capacity + 0.05, cpu.seconds
        assert cpu.capacity >= 0.3 and "% busy)" in cpu.line()
    finally:
        if child is not None:
            child.communicate("")  # it exits once its stdin closes


@pytest.mark.slow
def test_the_floor_reads_the_input_as_the_fit_does(spark):
    """A small dense vector column reaches an L-BFGS fit's workers packed, read as one
    matrix: the floor's Arrow pass reads it so too (as CSR it was 2-3x the fit's own read,
    a floor above the fit); sparse rows stay CSR in both."""
    from pyspark.ml.linalg import Vectors

    from bench.floor import measure_floor

    dense = spark.createDataFrame(
        [(float(i % 2), Vectors.dense([float(i), 1.0, -0.5 * i])) for i in range(40)],
        ["label", "features"],
    ).repartition(2)
    sparse = spark.createDataFrame(
        [(float(i % 2), Vectors.sparse(1000, [i, 500], [1.0, 2.0])) for i in range(40)],
        ["label", "features"],
    ).repartition(2)
    floors = {
        name: measure_floor(df, "features", reps=1, passes=1)
        for name, df in (("dense", dense), ("sparse", sparse))
    }
    assert floors["dense"]["read as"] == "DenseBatch"  # what the tasks' reads made
    assert floors["sparse"]["read as"] == "CSRBatch"
    for f in floors.values():
        assert f["rows"] == 40 and f["partitions"] == 2
        assert f["arrow pass s"] > 0 and f["eval s"] > 0


@pytest.mark.slow
def test_the_lr_warm_up_fits_each_kind_of_data_the_run_fits(spark, capsys):
    """A run with the dense case warms dense fits too (a session's first dense fit warms
    the packed read of dense rows); a run without it warms sparse rows only."""
    both = bench_lr.parse_args(["--datasets", "synthetic,dense", "--dense-features", "5"])
    fitted = bench_lr.warmup(spark, ["sparkps"], both)  # models of 2^12 and of 5 features
    assert fitted == [("synthetic", "sparkps", 2**12), ("dense", "sparkps", 5)]
    sparse = bench_lr.parse_args(["--datasets", "synthetic"])
    assert bench_lr.warmup(spark, ["sparkps"], sparse) == [("synthetic", "sparkps", 2**12)]
    out = capsys.readouterr().out
    assert "warm-up (synthetic, dense): " in out and "warm-up (synthetic): " in out
