"""The fit progress line: what a person sees in a terminal or notebook."""

from __future__ import annotations

from spark_ps.ml._progress import Progress


def test_progress_line_shows_bar_count_and_metrics(monkeypatch, capsys):
    monkeypatch.setenv("SPARK_PS_PROGRESS", "1")
    bar = Progress("spark-ps GBT", 4, unit="tree")
    bar.update(1, **{"train loss": 0.5})
    bar.update(4, **{"train loss": 0.25})
    bar.close()
    err = capsys.readouterr().err
    assert "\rspark-ps GBT [#####---------------] tree 1/4  train loss 0.5" in err
    assert "[####################] tree 4/4  train loss 0.25" in err and err.endswith("\n")


def test_progress_is_silent_when_turned_off(monkeypatch, capsys):
    monkeypatch.setenv("SPARK_PS_PROGRESS", "0")
    bar = Progress("x", 2)
    bar.update(1, loss=1.0)
    bar.close()
    assert capsys.readouterr().err == ""
