"""The status page in a real headless Chromium (Debian's ``chromium``) during a real fit.

An embedded PS with ``spark.ps.uiPort=0`` (two shard processes), an LR fit on local[2]
Spark held at its third iteration (its driver thread waits in the progress callback, the
workers wait on the PS's round board), and Chromium loading the page meanwhile: the DOM
it built must hold the shards table and the running fit's loss curve with its points,
and its screenshot is kept under ``ci-artifacts/`` (``SPARK_PS_ARTIFACTS`` to move it).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import threading
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = "/usr/bin/chromium"
ARTIFACTS = Path(os.environ.get("SPARK_PS_ARTIFACTS", ROOT / "ci-artifacts"))
HELD_AT = 3  # the iteration the fit waits at while the browser looks

pytestmark = pytest.mark.skipif(
    not os.path.exists(CHROMIUM),
    reason=f"{CHROMIUM} is absent: apt-get install chromium (scripts/setup.sh does)",
)


def _chromium(url: str, profile: Path, *args: str) -> str:
    """Run headless Chromium on `url` with `args`; its stdout (the DOM for --dump-dom)."""
    cmd = [
        CHROMIUM,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--hide-scrollbars",
        f"--user-data-dir={profile}",
        *args,
        url,
    ]
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        start_new_session=True,  # its helper processes go with it
    )
    try:
        out, err = proc.communicate(timeout=90)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"chromium did not finish in 90 s: {err[-2000:]}")
    assert proc.returncode == 0, f"chromium exit {proc.returncode}: {err[-2000:]}"
    return out


class _Dom(HTMLParser):
    """The dumped DOM's shards table rows and its SVG curves (metric -> polyline points)."""

    def __init__(self):
        super().__init__()
        self.shard_rows: list[list[str]] = []
        self.curves: dict[str, list[tuple[float, float]]] = {}
        self.fits: list[str] = []
        self._in_shards = self._in_cell = self._in_fit = False
        self._metric: str | None = None
        self._status_json = False
        self.status_json = ""

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "table":
            self._in_shards = a.get("id") == "shards"
        elif tag == "tr" and self._in_shards:
            self.shard_rows.append([])
        elif tag == "td" and self._in_shards:
            self._in_cell = True
            self.shard_rows[-1].append("")
        elif tag == "div" and "fit" in (a.get("class") or "").split():
            self.fits.append("")
            self._in_fit = True
        elif tag == "svg" and "curve" in (a.get("class") or "").split():
            self._metric = a.get("data-metric")
        elif tag == "polyline" and self._metric is not None:
            pairs = (a.get("points") or "").split()
            self.curves[self._metric] = [tuple(map(float, p.split(","))) for p in pairs]
        elif tag == "script" and a.get("id") == "ps-status":
            self._status_json = True

    def handle_endtag(self, tag):
        if tag == "table":
            self._in_shards = False
        elif tag == "td":
            self._in_cell = False
        elif tag == "svg":
            self._metric = None
        elif tag == "div":
            self._in_fit = False
        elif tag == "script":
            self._status_json = False

    def handle_data(self, data):
        if self._in_cell and self.shard_rows and self.shard_rows[-1]:
            self.shard_rows[-1][-1] += data
        if self._in_fit and self._metric is None:
            self.fits[-1] += data
        if self._status_json:
            self.status_json += data


def _jobs(sc) -> list[tuple[str, str]]:
    """(status, description) of every job, from the store behind the Spark UI's REST API
    (``/api/v1/applications/<app>/jobs``): it is kept with the UI off too."""
    jobs = sc._jsc.sc().statusStore().jobsList(None)
    out = []
    for i in range(jobs.size()):
        job = jobs.apply(i)
        desc = job.description()
        out.append((job.status().toString(), desc.get() if desc.isDefined() else ""))
    return out


@pytest.fixture
def held_fit(monkeypatch):
    """Progress.update on the driver waits at iteration HELD_AT until released."""
    from spark_ps.ml import _progress

    reached, release = threading.Event(), threading.Event()
    original = _progress.Progress.update

    def update(self, done, **metrics):
        original(self, done, **metrics)
        if done == HELD_AT and "LogisticRegression" in self.name:
            reached.set()
            release.wait(120)

    monkeypatch.setattr(_progress.Progress, "update", update)
    yield reached, release
    release.set()


@pytest.mark.slow  # a fit and two browser runs: ~30 s on a loaded 2-core machine
@pytest.mark.timeout(240)
def test_chromium_renders_shards_and_the_running_fits_loss_curve(spark, held_fit, tmp_path):
    from pyspark.ml.linalg import Vectors

    from spark_ps import PSContext
    from spark_ps.ml.classification import LogisticRegression

    reached, release = held_fit
    own = PSContext.start(spark, numShards=2, uiPort="0")
    previous, PSContext._active = PSContext._active, own
    result: dict = {}
    try:
        rng = np.random.default_rng(1)
        X = rng.normal(size=(400, 5))
        y = (X @ [1.0, -2.0, 0.5, 0.0, 1.5] + rng.normal(size=400) > 0).astype(float)
        df = spark.createDataFrame(
            [(float(y[i]), Vectors.dense(X[i])) for i in range(400)], ["label", "features"]
        )
        lr = LogisticRegression(maxIter=10, regParam=0.01, tol=0.0)

        def fit():
            try:
                result["model"] = lr.fit(df)
            except BaseException as e:  # noqa: BLE001 - re-raised by the test below
                result["error"] = e

        thread = threading.Thread(target=fit, daemon=True)
        thread.start()
        assert reached.wait(180), f"the fit did not reach iteration {HELD_AT}: {result}"

        # the Spark UI links to the page: the running fit's job names its URL (no token)
        running = [d for status, d in _jobs(spark.sparkContext) if status == "RUNNING"]
        assert running == [
            f"spark-ps LogisticRegression(maxIter=10): worker loop · PS status page {own.ui_url}"
        ]
        assert own.token not in running[0]
        url = f"{own.ui_url}?token={own.token}"
        dom = _chromium(url, tmp_path / "profile", "--dump-dom")
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        shot = ARTIFACTS / "status_page.png"
        shot.unlink(missing_ok=True)
        _chromium(url, tmp_path / "profile", f"--screenshot={shot}", "--window-size=1280,1100")
        release.set()
        thread.join(180)
        assert not thread.is_alive(), "the fit did not finish once released"
        if "error" in result:
            raise result["error"]

        page = _Dom()
        page.feed(dom)
        # the shards table: a header row and one row per shard process, each serving
        header, *rows = page.shard_rows
        assert header == [] and len(rows) == 2 == own.num_shards, page.shard_rows
        assert [r[0] for r in rows] == ["0", "1"]
        assert all(r[4].startswith("yes") for r in rows), rows
        assert {r[1] for r in rows} == set(own.client.addresses), rows
        # the running fit's loss curve: one point per iteration reported so far
        (fit_text,) = [t for t in page.fits if "LogisticRegression" in t]
        assert f"running, iteration {HELD_AT}/10" in fit_text, fit_text
        loss = page.curves["loss"]
        assert len(loss) >= 3, loss
        xs = [x for x, _ in loss]
        assert xs == sorted(xs) and len(set(xs)) == len(xs)
        # the drawn points are the fit's objective values: SVG's y grows downwards, so the
        # points ordered by height are the values ordered from the highest
        history = result["model"].summary.objectiveHistory
        drawn = history[1 : HELD_AT + 1]
        assert len(loss) == len(drawn) == HELD_AT
        ys = [y for _, y in loss]
        assert np.argsort(ys).tolist() == np.argsort(drawn).tolist()[::-1] or np.allclose(
            drawn, drawn[0]
        )
        data = json.loads(page.status_json)
        (reported,) = [f for f in data["fits"] if "LogisticRegression" in f["name"]]
        assert np.allclose([p["loss"] for p in reported["points"]], drawn, rtol=1e-12)
        assert not reported["finished"]
        # the screenshot: a PNG of the whole window
        png = shot.read_bytes()
        assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
        width, height = int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")
        assert (width, height) == (1280, 1100)
        print(f"status page screenshot: {shot}")
    finally:
        release.set()
        PSContext._active = previous
        own.stop()
        shutil.rmtree(tmp_path / "profile", ignore_errors=True)


def test_the_loss_polyline_parser_reads_what_ui_page_draws():
    """The parser above against ``ui_page`` directly: a broken parser fails here first."""
    from ps_server.coordinator.ui_page import _curve

    page = _Dom()
    page.feed(_curve("loss", [(1, 0.7), (2, 0.5), (3, 0.45)]))
    assert len(page.curves["loss"]) == 3
    (x0, y0), (x1, y1), (x2, y2) = page.curves["loss"]
    assert x0 < x1 < x2 and y0 < y1 < y2  # a falling loss goes down the plot: SVG y grows
