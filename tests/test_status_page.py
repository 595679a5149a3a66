"""The coordinator's status page (`--ui-port` / `spark.ps.uiPort`): real PS processes,
real HTTP, figures checked against what the PS itself says."""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from ps_server.coordinator import status
from ps_server.coordinator.service import READY_PREFIX, UI_PREFIX
from spark_ps.client import PSClient, TensorSpec

ROOT = Path(__file__).resolve().parents[1]
TOKEN = "status-page-token"
DIM = 1000  # a dense float64 vector over both shards: 8000 bytes
PUSHES = 5


def _get(url: str, token: str | None = None, header: bool = True) -> tuple[int, bytes, str]:
    if token is not None and not header:
        url += ("&" if "?" in url else "?") + f"token={token}"
    req = urllib.request.Request(url)
    if token is not None and header:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.read(), r.headers.get("Content-Type", "")
    except urllib.error.HTTPError as e:
        return e.code, e.read(), e.headers.get("Content-Type", "")


@pytest.fixture(scope="module")
def service():
    """`python -m ps_server --shards 2 --ui-port 0` with a token; a model pushed to."""
    env = dict(os.environ, SPARK_PS_TOKEN=TOKEN, PYTHONPATH=str(ROOT))
    cmd = [sys.executable, "-m", "ps_server", "--shards", "2", "--ui-port", "0"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True)
    ui = address = None
    try:
        for line in proc.stdout:
            if line.startswith(UI_PREFIX):
                ui = line[len(UI_PREFIX) :].strip()
            if line.startswith(READY_PREFIX):
                address = line[len(READY_PREFIX) :].strip()
                break
        assert ui and address, f"the service printed no UI/ready line (code {proc.poll()})"
        client = PSClient(address, TOKEN)
        spec = TensorSpec("status/w", "dense", DIM, 1, client.num_shards)
        client.create(spec)
        keys = np.arange(DIM, dtype=np.int64)
        for _ in range(PUSHES):
            client.push(spec, keys, np.ones(DIM), "add")
        yield {"ui": ui, "address": address, "client": client, "proc": proc}
        client.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        proc.stdout.close()


def test_every_page_asks_for_the_token(service):
    ui = service["ui"]
    assert ui.startswith("http://127.0.0.1:")
    for page in ("", "status.json", "metrics"):
        assert _get(ui + page)[0] == 401
        assert _get(ui + page, "wrong")[0] == 401
        assert _get(ui + page, "wrong", header=False)[0] == 401
        assert _get(ui + page, TOKEN)[0] == 200
        assert _get(ui + page, TOKEN, header=False)[0] == 200
    assert _get(ui + "nothing-here", TOKEN)[0] == 404


_SAMPLE = re.compile(
    r'^[a-zA-Z_:][a-zA-Z0-9_:]*(\{([a-zA-Z_][a-zA-Z0-9_]*="([^"\\]|\\.)*",?)*\})? '
    r"[-+]?([0-9.]+(e[-+]?[0-9]+)?|Inf|NaN)$"
)


def _metrics(service) -> dict[tuple[str, tuple], float]:
    code, body, ctype = _get(service["ui"] + "metrics", TOKEN)
    assert code == 200 and ctype.startswith("text/plain")
    text = body.decode()
    for line in text.splitlines():
        assert line.startswith(("# HELP ", "# TYPE ")) or _SAMPLE.match(line), line
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }


def test_metrics_parse_and_match_the_ps(service):
    client = service["client"]
    m = _metrics(service)
    assert m[("spark_ps_partitions", ())] == 2 == client.num_shards
    assert m[("spark_ps_partitions_serving", ())] == 2
    assert m[("spark_ps_shard_restarts_total", ())] == client.metrics()["restart"] == 0
    truth = status.status(service["address"], TOKEN)
    assert (
        m[("spark_ps_model_bytes", (("model", "status/w"),))]
        == (truth["models"]["status/w"]["bytes"])
    )
    assert truth["models"]["status/w"]["bytes"] == DIM * 8
    # every push reaches both shards (the vector spans them): one update on each
    assert m[("spark_ps_model_updates_total", (("model", "status/w"),))] == 2 * PUSHES
    pushes = [
        v
        for (name, lab), v in m.items()
        if name == "spark_ps_requests_total" and dict(lab)["rpc"] == "Push"
    ]
    assert sorted(pushes) == [PUSHES, PUSHES]
    for shard in ("0", "1"):
        lab = (("rpc", "Push"), ("shard", shard))
        assert m[("spark_ps_request_seconds_count", lab)] == PUSHES
        assert m[("spark_ps_request_seconds_bucket", (("le", "+Inf"), *lab))] == PUSHES
        assert 0 < m[("spark_ps_request_seconds_sum", lab)] < 60
        assert m[("spark_ps_shard_rss_bytes", (("shard", shard),))] > 10e6


def test_status_json_matches_the_status_command(service):
    env = dict(os.environ, SPARK_PS_TOKEN=TOKEN, PYTHONPATH=str(ROOT))
    out = subprocess.run(
        [sys.executable, "-m", "ps_server", "status", service["address"]],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    cli = json.loads(out.stdout)
    code, body, ctype = _get(service["ui"] + "status.json", TOKEN, header=False)
    assert code == 200 and ctype == "application/json"
    page = json.loads(body)
    for key in ("coordinator", "epoch", "restarts", "hosts", "bytes", "counters", "moves"):
        assert page[key] == cli[key], key
    assert {
        n: {k: v for k, v in m.items() if k != "updates"} for n, m in page["models"].items()
    } == (cli["models"])
    for ours, theirs in zip(page["partitions"], cli["partitions"], strict=True):
        assert {k: ours[k] for k in theirs} == theirs
        assert ours["rss_bytes"] > 0 and ours["requests"]["Push"]["calls"] == PUSHES


def test_killed_shard_shows_as_a_restart(service):
    client = service["client"]
    pid = json.loads(_get(service["ui"] + "status.json", TOKEN)[1])["partitions"][1]["pid"]
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        time.sleep(1.1)  # past the page's one-second cache
        m = _metrics(service)
        if (
            m[("spark_ps_shard_restarts_total", ())] >= 1
            and m[("spark_ps_partitions_serving", ())] == 2
        ):
            break
    assert m[("spark_ps_shard_restarts_total", ())] == client.metrics()["restart"] == 1
    snap = json.loads(_get(service["ui"] + "status.json", TOKEN)[1])
    assert snap["partitions"][1]["pid"] != pid


@pytest.mark.slow
def test_an_external_service_s_page_is_named_in_the_shard_map_and_the_job(service, caplog):
    """A context on an external service (`--ui-port`) knows its page from the shard map, logs
    it, and a fit's Spark job description links to it (without the token)."""
    from spark_ps import PSContext
    from spark_ps.ml._job import job_description

    previous, PSContext._active = PSContext._active, None
    with caplog.at_level(logging.WARNING, logger="spark_ps.context"):
        ctx = PSContext.getOrCreate(address=service["address"], token=TOKEN)
    try:
        assert ctx.ui_url == service["ui"] and not ctx.embedded
        assert f"spark-ps status page: {service['ui']} (" in caplog.text
        assert TOKEN not in caplog.text
        text = job_description("LogisticRegression(maxIter=3)", ctx)
        assert text.endswith(f"PS status page {service['ui']}") and TOKEN not in text
        assert _get(ctx.ui_url, TOKEN)[0] == 200
    finally:
        PSContext._active = previous
        ctx.stop()
        ctx.client.close()


def test_a_page_on_every_interface_is_named_with_the_host_the_client_dialled():
    from spark_ps.client.client import _dialled

    assert _dialled("http://0.0.0.0:4041/", "10.1.2.3:7077") == "http://10.1.2.3:4041/"
    assert _dialled("http://[::]:4041/", "[fd00::5]:7077") == "http://[fd00::5]:4041/"
    assert _dialled("http://10.9.9.9:4041/", "10.1.2.3:7077") == "http://10.9.9.9:4041/"
    assert _dialled("", "10.1.2.3:7077") == ""


def test_page_draws_a_fits_loss_curve(spark):
    """An embedded PS with spark.ps.uiPort=0; an LR fit; its objective history on the page."""
    from pyspark.ml.linalg import Vectors

    from spark_ps import PSContext
    from spark_ps.ml.classification import LogisticRegression

    own = PSContext.start(spark, numShards=2, uiPort="0")
    previous, PSContext._active = PSContext._active, own
    try:
        assert own.ui_url and own.ui_url.startswith("http://127.0.0.1:")
        rng = np.random.default_rng(0)
        X = rng.normal(size=(300, 4))
        y = (X @ [1.0, -2.0, 0.5, 0.0] + rng.normal(size=300) > 0).astype(float)
        df = spark.createDataFrame(
            [(float(y[i]), Vectors.dense(X[i])) for i in range(300)], ["label", "features"]
        )
        model = LogisticRegression(maxIter=8, regParam=0.01).fit(df)
        history = model.summary.objectiveHistory
        assert _get(own.ui_url)[0] == 401
        code, body, _ = _get(own.ui_url, own.token, header=False)
        assert code == 200
        html = body.decode()
        data = re.search(r"<script type='application/json' id='ps-status'>(.*?)</script>", html)
        fits = [f for f in json.loads(data.group(1))["fits"] if "LogisticRegression" in f["name"]]
        assert len(fits) == 1 and fits[0]["finished"]
        losses = [p["loss"] for p in fits[0]["points"]]
        assert len(losses) >= 3
        # each reported loss is one of the fit's objective values, in order
        assert np.allclose(losses, history[-len(losses) :], rtol=1e-12)
        curve = re.search(r"<svg class='curve' data-metric='loss' data-points='(\d+)'", html)
        assert curve and int(curve.group(1)) == len(losses)
        assert re.search(r"<polyline [^>]*points='([\d.]+,[\d.]+ ){2,}", html)
        assert "status/w" not in html and "<table id='shards'>" in html
    finally:
        PSContext._active = previous
        own.stop()


def test_a_bad_ui_port_is_refused_naming_the_key():
    from spark_ps import PSContext

    with pytest.raises(ValueError, match=r"spark.ps.uiPort must be a port number.*'http'"):
        PSContext.start(numShards=1, uiPort="http")


def test_the_fit_board_stays_bounded_and_keeps_running_fits():
    from ps_server.coordinator.fits import FitBoard
    from ps_server.proto import ps_pb2 as pb

    board = FitBoard(max_fits=3, max_points=10)
    board.report(pb.FitProgress(fit="running", name="LR", total=100))
    for i in range(100):
        board.report(pb.FitProgress(fit="running", done=i + 1, total=100, metrics={"loss": i}))
    for k in range(4):
        board.report(pb.FitProgress(fit=f"done{k}", name="GBT", done=1, metrics={"loss": 1.0}))
        board.report(pb.FitProgress(fit=f"done{k}", done=1, finished=True))
    fits = {f["fit"]: f for f in board.snapshot()}
    assert set(fits) == {"running", "done2", "done3"}  # the oldest finished ones went
    points = fits["running"]["points"]
    assert len(points) <= 10 and points[0]["done"] == 1 and points[-1]["done"] == 100
    assert [p["done"] for p in points] == sorted(p["done"] for p in points)
    assert fits["running"]["done"] == 100 and not fits["running"]["finished"]
    assert fits["done3"]["finished"] and fits["done3"]["points"] == [
        {"done": 1, "seconds": fits["done3"]["points"][0]["seconds"], "loss": 1.0}
    ]


@pytest.mark.timeout(120)
def test_across_hosts_the_page_lists_the_hosts():
    """`spark-ps-server coordinator --ui-port 0` and one `shards --join` host, on loopback."""
    env = dict(os.environ, SPARK_PS_TOKEN=TOKEN, PYTHONPATH=str(ROOT))
    coord = subprocess.Popen(
        [sys.executable, "-m", "ps_server", "coordinator", "--partitions", "2", "--ui-port", "0"],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    host = None
    try:
        address = coord.stdout.readline().split()[-1]  # LISTENING_PREFIX address
        join = ["shards", "--join", address, "--host", "127.0.0.1", "--host-id", "loop-host"]
        host = subprocess.Popen(
            [sys.executable, "-m", "ps_server", *join, "--shards", "2"],
            env=env,
            stdin=subprocess.DEVNULL,
        )
        ui = None
        for line in coord.stdout:
            if line.startswith(UI_PREFIX):
                ui = line[len(UI_PREFIX) :].strip()
            if line.startswith(READY_PREFIX):
                break
        assert ui, f"no status page line (coordinator code {coord.poll()})"
        deadline = time.monotonic() + 60
        while True:  # ready = placed; the primaries register a moment later
            snap = json.loads(_get(ui + "status.json", TOKEN)[1])
            if all(p["address"] for p in snap["partitions"]) or time.monotonic() > deadline:
                break
            time.sleep(1.1)
        (h,) = snap["hosts"]
        assert h["id"] == "loop-host" and h["alive"] and h["primaries"] == [0, 1]
        assert [p["host"] for p in snap["partitions"]] == ["loop-host", "loop-host"]
        time.sleep(1.1)
        m = _metrics({"ui": ui})
        assert m[("spark_ps_host_alive", (("host", "loop-host"),))] == 1
        assert m[("spark_ps_partitions_serving", ())] == 2
        html = _get(ui, TOKEN)[1].decode()
        assert "<table id='hosts'>" in html and "loop-host" in html
        client = PSClient(address, TOKEN)
        try:
            assert client.ui_url == ui  # the page, named in the shard map
        finally:
            client.close()
    finally:
        coord.send_signal(signal.SIGTERM)
        for p in (coord, host):
            if p is None:
                continue
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        coord.stdout.close()
