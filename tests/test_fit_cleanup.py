"""A fit's clean-up (dropping its rendezvous steps, stopping its worker job) never hides the
fit's own outcome. Real Spark and a real PS; only the clean-up RPCs are made to fail, as
they would with the PS gone (a PS that is really gone fails the fit itself first)."""

from __future__ import annotations

import logging

import grpc
import numpy as np
import pytest
from pyspark.ml.linalg import Vectors

from spark_ps.client import PSError
from spark_ps.ml import _job
from spark_ps.ml.classification import GBTClassifier

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def data(spark):
    rng = np.random.default_rng(3)
    X = np.round(rng.normal(size=(200, 3)), 1)
    y = (X[:, 0] + X[:, 1] > 0).astype(float)
    rows = [(float(y[i]), Vectors.dense(X[i])) for i in range(len(y))]
    return spark.createDataFrame(rows, ["label", "features"]).cache()


@pytest.fixture
def drop_fails(spark_ps, monkeypatch, caplog):
    """`rendezvous.drop` fails as against a dead PS; every other call is the real one.
    Yields the list of failed drops."""
    _, ps = spark_ps
    real, failed = ps.client.call, []

    def call(function, *args, **kw):
        if function == "rendezvous.drop":
            failed.append(args[1]["topic"])
            raise PSError("connection refused", code=grpc.StatusCode.UNAVAILABLE, rpc="Call")
        return real(function, *args, **kw)

    monkeypatch.setattr(ps.client, "call", call)
    caplog.set_level(logging.WARNING, logger="spark_ps.job")
    return failed


def test_the_fits_error_is_what_the_user_sees_when_the_clean_up_fails(
    spark_ps, data, drop_fails, tmp_path, caplog, monkeypatch
):
    _, ps = spark_ps
    real_post = ps.client.post

    def post(topic, round_, payload, *args, **kw):  # the job's "stop" command fails too
        if isinstance(payload, dict) and payload.get("op") == "stop":
            raise PSError("connection refused", code=grpc.StatusCode.UNAVAILABLE, rpc="Post")
        return real_post(topic, round_, payload, *args, **kw)

    monkeypatch.setattr(ps.client, "post", post)
    # every attempt of partition 0 fails at its first histogram (the marker cannot be
    # written), so the worker job fails for real once Spark gives up retrying
    _job.inject_failure_once("hist", nth=0, part=0, marker=str(tmp_path / "no-dir" / "mark"))
    try:
        with pytest.raises(RuntimeError, match="the worker job failed") as err:
            GBTClassifier(maxIter=2, maxDepth=2).fit(data)
    finally:
        _job.clear_failures()
    assert not isinstance(err.value, PSError) and "connection refused" not in str(err.value)
    assert len(drop_fails) == 1 and drop_fails[0].startswith("job-")
    assert f"dropping the rendezvous steps of {drop_fails[0]} failed (ignored)" in caplog.text
    assert "stopping the worker job failed (ignored)" in caplog.text


def test_a_failed_drop_after_a_good_fit_is_only_logged(data, drop_fails, caplog):
    model = GBTClassifier(maxIter=2, maxDepth=2).fit(data)
    assert model.getNumTrees == 2 and len(drop_fails) == 1
    assert model.transform(data).filter("prediction = label").count() > 150
    assert "dropping the rendezvous steps" in caplog.text and "connection refused" in caplog.text


def test_lr_fit_survives_a_failed_release_of_its_solver_vectors(
    spark_ps, data, monkeypatch, caplog
):
    from spark_ps.ml.classification import LogisticRegression
    from spark_ps.ml.lr.ps_space import PSVecSpace

    def release_all(self):
        raise PSError("connection refused", code=grpc.StatusCode.UNAVAILABLE, rpc="Drop")

    monkeypatch.setattr(PSVecSpace, "release_all", release_all)
    caplog.set_level(logging.WARNING, logger="spark_ps.job")
    model = LogisticRegression(maxIter=5).fit(data)
    assert model.summary.totalIterations > 0
    assert "releasing the solver's PS vectors failed (ignored)" in caplog.text
