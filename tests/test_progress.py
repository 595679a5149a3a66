"""A fit's progress: the bar a person sees in a terminal or notebook, silenced by the key,
TensorBoard event files with the fit's losses, and ``summary.plot()``."""

from __future__ import annotations

import glob
import os
import struct

import numpy as np
import pytest

from spark_ps.ml._progress import Progress, progress_setting


def test_progress_bar_shows_count_and_metrics(monkeypatch, capsys):
    monkeypatch.setenv("SPARK_PS_PROGRESS", "1")
    bar = Progress("spark-ps GBT", 4, unit="tree")
    bar.update(1, **{"train loss": 0.5})
    bar.update(4, **{"train loss": 0.25})
    bar.close()
    err = capsys.readouterr().err
    assert "\rspark-ps GBT:  25%|" in err and "| 1/4 [" in err and "train loss=0.5]" in err
    assert "| 4/4 [" in err and "train loss=0.25]" in err and err.endswith("\n")


def test_progress_is_silent_when_turned_off(monkeypatch, capsys):
    monkeypatch.setenv("SPARK_PS_PROGRESS", "0")
    bar = Progress("x", 2)
    bar.update(1, loss=1.0)
    bar.close()
    assert capsys.readouterr().err == ""


def test_a_bad_progress_setting_names_its_source(monkeypatch):
    monkeypatch.setenv("SPARK_PS_PROGRESS", "sometimes")
    with pytest.raises(ValueError, match="SPARK_PS_PROGRESS must be true, false or auto, got"):
        progress_setting()


def _events(directory: str) -> list[tuple[int, str, float]]:
    """(step, tag, value) of every scalar in the TFRecord event files of `directory`,
    each record's length and data checked against their masked CRC-32C."""
    from tensorboardX.crc32c import crc32c
    from tensorboardX.proto.event_pb2 import Event

    def masked(data: bytes) -> int:
        crc = crc32c(data)
        return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF

    out = []
    (path,) = glob.glob(os.path.join(directory, "events.out.tfevents.*"))
    data = open(path, "rb").read()
    pos = 0
    while pos < len(data):
        head = data[pos : pos + 8]
        (n,) = struct.unpack("<Q", head)
        assert struct.unpack("<I", data[pos + 8 : pos + 12])[0] == masked(head)
        body = data[pos + 12 : pos + 12 + n]
        assert struct.unpack("<I", data[pos + 12 + n : pos + 16 + n])[0] == masked(body)
        pos += 16 + n
        event = Event.FromString(body)
        out += [(event.step, v.tag, v.simple_value) for v in event.summary.value]
    return out


@pytest.fixture(scope="module")
def lr_data(spark):
    from pyspark.ml.linalg import Vectors

    rng = np.random.default_rng(3)
    X = rng.normal(size=(300, 4))
    y = (X @ [1.0, -1.0, 0.5, 0.0] + rng.normal(size=300) > 0).astype(float)
    return spark.createDataFrame(
        [(float(y[i]), Vectors.dense(X[i])) for i in range(300)], ["label", "features"]
    )


@pytest.fixture
def session_conf(spark):
    """Set runtime conf keys for one test; they are unset after it."""
    keys = []

    def set_(key: str, value: str) -> None:
        keys.append(key)
        spark.conf.set(key, value)

    yield set_
    for key in keys:
        spark.conf.unset(key)


def test_a_fit_shows_its_bar_and_writes_tensorboard_events(
    spark_ps, lr_data, session_conf, monkeypatch, capsys, tmp_path
):
    from spark_ps.ml.classification import LogisticRegression

    monkeypatch.setenv("SPARK_PS_PROGRESS", "0")  # the key wins over the environment
    session_conf("spark.ps.progress", "true")
    session_conf("spark.ps.logDir", str(tmp_path))
    model = LogisticRegression(maxIter=6, regParam=0.01).fit(lr_data)
    history = model.summary.objectiveHistory
    n = model.summary.totalIterations
    err = capsys.readouterr().err
    assert f"| {n}/6 [" in err and f"loss={history[-1]:.6g}]" in err, err
    assert "spark-ps LogisticRegression:" in err and err.endswith("\n")
    # one directory per fit, one scalar per iteration: the objective history past its start
    (fit_dir,) = glob.glob(str(tmp_path / "LogisticRegression-*"))
    events = _events(fit_dir)
    assert [step for step, _, _ in events] == list(range(1, n + 1))
    assert {tag for _, tag, _ in events} == {"loss"}
    # event files hold float32
    np.testing.assert_allclose([v for *_, v in events], history[1:], rtol=1e-6)


def test_the_key_silences_a_fit(spark_ps, lr_data, session_conf, monkeypatch, capsys):
    from spark_ps.ml.classification import LogisticRegression

    monkeypatch.setenv("SPARK_PS_PROGRESS", "1")
    session_conf("spark.ps.progress", "false")
    model = LogisticRegression(maxIter=3, regParam=0.01).fit(lr_data)
    assert model.summary.totalIterations >= 1
    assert capsys.readouterr().err == ""


def _other_fit(kind: str, max_iter: int):
    """(estimator, its bar's name) of a fit other than LogisticRegression."""
    from spark_ps.ml.classification import FMClassifier, LinearSVC
    from spark_ps.ml.regression import LinearRegression

    return {
        "LinearRegression": LinearRegression(maxIter=max_iter, regParam=0.1, solver="l-bfgs"),
        "LinearSVC": LinearSVC(maxIter=max_iter, regParam=0.01),
        "FMClassifier": FMClassifier(maxIter=max_iter, stepSize=0.5, seed=1),
    }[kind], f"spark-ps {kind}"


def _history(model) -> list[float]:
    """The fit's objective history (LinearSVC's and FM's summary is a method, as MLlib's)."""
    summary = model.summary() if callable(model.summary) else model.summary
    return summary.objectiveHistory


@pytest.mark.parametrize("kind", ["LinearRegression", "LinearSVC", "FMClassifier"])
def test_linear_and_fm_fits_show_a_bar_and_write_each_iterations_loss(
    spark_ps, lr_data, session_conf, capsys, tmp_path, kind
):
    session_conf("spark.ps.progress", "true")
    session_conf("spark.ps.logDir", str(tmp_path))
    est, name = _other_fit(kind, 6)
    model = est.fit(lr_data)
    history = _history(model)
    n = len(history) - 1  # MLlib's totalIterations: the first value is the start point's
    assert n >= 2
    err = capsys.readouterr().err
    assert f"{name}:" in err and f"| {n}/6 [" in err and f"loss={history[-1]:.6g}]" in err, err
    (fit_dir,) = glob.glob(str(tmp_path / f"{kind}-*"))
    events = _events(fit_dir)
    assert [step for step, _, _ in events] == list(range(1, n + 1))
    assert {tag for _, tag, _ in events} == {"loss"}
    np.testing.assert_allclose([v for *_, v in events], history[1:], rtol=1e-6)


@pytest.mark.parametrize("kind", ["LinearRegression", "LinearSVC", "FMClassifier"])
def test_the_key_silences_linear_and_fm_fits(
    spark_ps, lr_data, session_conf, monkeypatch, capsys, kind
):
    monkeypatch.setenv("SPARK_PS_PROGRESS", "1")
    session_conf("spark.ps.progress", "false")
    est, _ = _other_fit(kind, 3)
    assert len(_history(est.fit(lr_data))) >= 2
    assert capsys.readouterr().err == ""


def test_a_bad_key_fails_the_fit_naming_it(spark_ps, lr_data, session_conf):
    from spark_ps.ml.classification import LogisticRegression

    session_conf("spark.ps.progress", "loud")
    with pytest.raises(
        ValueError, match=r"spark.ps.progress must be true, false or auto, got 'loud'"
    ):
        LogisticRegression(maxIter=2).fit(lr_data)


def test_summary_plot_draws_the_history_and_roc(spark_ps, lr_data):
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    from spark_ps.ml.classification import LogisticRegression

    summary = LogisticRegression(maxIter=5, regParam=0.01).fit(lr_data).summary
    fig = summary.plot()
    assert isinstance(fig, Figure)
    history_ax, roc_ax = fig.axes
    (line,) = history_ax.get_lines()
    x, y = line.get_data()
    assert list(x) == list(range(len(summary.objectiveHistory)))
    assert list(y) == summary.objectiveHistory and len(y) >= 3
    roc_line = roc_ax.get_lines()[0]
    roc = summary.roc.collect()
    assert list(roc_line.get_xdata()) == [r["FPR"] for r in roc]
    assert list(roc_line.get_ydata()) == [r["TPR"] for r in roc]
    assert f"AUC {summary.areaUnderROC:.4f}" in [t.get_text() for t in roc_ax.get_legend().texts]
    fig.canvas.draw()  # it renders
    # into an Axes of the caller's: the history only
    fig2 = Figure()
    ax = fig2.add_subplot()
    assert summary.plot(ax=ax) is fig2 and len(ax.get_lines()) == 1


def test_a_regression_summary_plots_its_history_alone(spark_ps, lr_data):
    import matplotlib

    matplotlib.use("Agg")
    from spark_ps.ml.regression import LinearRegression

    summary = LinearRegression(maxIter=5, regParam=0.1, solver="l-bfgs").fit(lr_data).summary
    fig = summary.plot()
    (ax,) = fig.axes  # no ROC for a regression
    (line,) = ax.get_lines()
    assert list(line.get_ydata()) == summary.objectiveHistory and len(line.get_ydata()) >= 2


def test_summary_plot_without_matplotlib_says_what_to_install(monkeypatch):
    import builtins

    from spark_ps.ml._plot import plot_summary

    real_import = builtins.__import__

    def no_matplotlib(name, *args, **kwargs):
        if name.startswith("matplotlib"):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)

    class Summary:
        objectiveHistory = [1.0, 0.5]

    with pytest.raises(ImportError, match=r"pip install 'spark-ps\[plot\]'"):
        plot_summary(Summary())
