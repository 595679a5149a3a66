"""TLS on the PS with a user-given cert/key, tested over real channels."""

from __future__ import annotations

import shutil
import subprocess

import grpc
import numpy as np
import pytest

from ps_server.proto import ps_pb2 as pb
from ps_server.proto import ps_pb2_grpc as pb_grpc
from ps_server.wire import TOKEN_KEY
from spark_ps import PSContext, PSVector
from spark_ps.client import get_client

SAN = "subjectAltName=IP:127.0.0.1,DNS:localhost"


@pytest.fixture(scope="module")
def tls_ps(tmp_path_factory):
    if shutil.which("openssl") is None:
        pytest.skip("openssl is needed to make a test certificate")
    d = tmp_path_factory.mktemp("tls")
    cert, key = d / "cert.pem", d / "key.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=localhost",
            "-addext",
            SAN,
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
    )
    ps = PSContext.start(
        **{"numShards": 2, "tls.cert": str(cert), "tls.key": str(key), "uiPort": "0"}
    )
    yield ps
    ps.stop()


def test_tls_round_trip_and_server_side_ops(tls_ps):
    w = PSVector.dense(10, context=tls_ps)
    w.increment(np.arange(10), np.arange(10.0))
    np.testing.assert_array_equal(w.pull(), np.arange(10.0))
    assert w.nrm2() == pytest.approx(np.linalg.norm(np.arange(10.0)))
    assert w.tls_ca is not None  # handles carry the CA into executor closures


def test_plaintext_client_cannot_talk_to_a_tls_server(tls_ps):
    with grpc.insecure_channel(tls_ps.address) as ch:
        with pytest.raises(grpc.RpcError) as e:
            pb_grpc.CoordinatorStub(ch).GetShardMap(
                pb.Empty(), metadata=((TOKEN_KEY, tls_ps.token),), timeout=5
            )
    assert e.value.code() == grpc.StatusCode.UNAVAILABLE


def test_executors_push_through_tls(spark, tls_ps):
    w = PSVector.sparse(2**40, context=tls_ps)

    def work(rows):
        w.increment(np.array([7, 2**39]), np.array([1.0, 2.0]))
        yield 1

    assert spark.sparkContext.parallelize(range(4), 4).mapPartitions(work).sum() == 4
    np.testing.assert_array_equal(w.pull(np.array([7, 2**39])), [4.0, 8.0])


def test_tls_shards_open_no_plaintext_direct_lane(tls_ps):
    client = get_client(tls_ps.address, tls_ps.token, tls_ca=tls_ps.tls_ca)
    assert [h.direct_port for h in client.health()] == [0, 0]
    args = {"topic": "tls-lane", "step": 0, "part": 0, "n_parts": 1, "wait": 5.0}
    ((meta, arrays),) = client.call(
        "rendezvous.gather", [], args, [[np.ones(2)]], shards=[0], direct=True
    )
    assert meta == {"pending": False} and arrays[0].tolist() == [[1.0, 1.0]]
    assert not client._links.__dict__.get("links")  # gRPC (TLS) carried it


def test_status_page_is_served_over_https_with_the_same_certificate(tls_ps):
    import ssl
    import urllib.error
    import urllib.request

    assert tls_ps.ui_url.startswith("https://127.0.0.1:")
    trust = ssl.create_default_context(cadata=tls_ps.tls_ca.decode())
    req = urllib.request.Request(
        tls_ps.ui_url + "metrics", headers={"Authorization": f"Bearer {tls_ps.token}"}
    )
    with urllib.request.urlopen(req, timeout=30, context=trust) as r:
        assert r.status == 200 and b"spark_ps_partitions 2.0" in r.read()
    with pytest.raises(urllib.error.URLError, match="CERTIFICATE_VERIFY_FAILED"):
        urllib.request.urlopen(req, timeout=30, context=ssl.create_default_context())
    plain = tls_ps.ui_url.replace("https://", "http://") + "metrics"
    with pytest.raises((urllib.error.URLError, ConnectionError, OSError)):
        urllib.request.urlopen(plain, timeout=10)
