"""Reaching the PS from another host: the bind address an embedded PS picks, and the
probe that fails in seconds (with the address and the settings) when a PS is out of reach.
The whole path on real separate hosts is in tests/test_cluster.py."""

from __future__ import annotations

import socket
import time

import pytest

from spark_ps.client.reach import PSUnreachable, check_reachable, unreachable_in
from spark_ps.context import _embedded_host


class _Conf(dict):
    def get(self, key, default=None):
        return super().get(key, default)


class _Spark:
    """What `_embedded_host` reads of a SparkSession: the master and the live conf."""

    def __init__(self, master: str, **conf: str):
        conf = _Conf(conf)
        self.sparkContext = type("SC", (), {"master": master, "getConf": lambda _self: conf})()


@pytest.mark.parametrize(
    "master, conf, host",
    [
        ("local[2]", {"spark.driver.host": "10.0.0.5"}, "127.0.0.1"),
        ("local-cluster[2,1,1024]", {"spark.driver.host": "10.0.0.5"}, "127.0.0.1"),
        ("spark://10.0.0.9:7077", {"spark.driver.host": "10.0.0.5"}, "10.0.0.5"),
        ("yarn", {"spark.driver.host": "10.0.0.5"}, "10.0.0.5"),
        (
            "spark://10.0.0.9:7077",
            {"spark.driver.host": "10.0.0.5", "spark.ps.host": "0.0.0.0"},
            "0.0.0.0",
        ),
    ],
)
def test_embedded_ps_binds_loopback_locally_and_the_driver_host_on_a_cluster(master, conf, host):
    assert _embedded_host(_Spark(master, **conf), {}) == host


def test_explicit_loopback_on_a_cluster_is_kept_with_a_warning(caplog):
    spark = _Spark("spark://10.0.0.9:7077", **{"spark.driver.host": "10.0.0.5"})
    assert _embedded_host(spark, {"host": "127.0.0.1"}) == "127.0.0.1"
    assert "cannot reach the embedded PS" in caplog.text and "spark.ps.host" in caplog.text


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again when the block ends: nothing listens


def test_unreachable_address_fails_after_the_connect_timeout_naming_it_and_the_settings():
    address = f"127.0.0.1:{_closed_port()}"
    t0 = time.monotonic()
    with pytest.raises(PSUnreachable) as info:
        check_reachable([address], timeout=1.0)
    took = time.monotonic() - t0
    assert 0.8 <= took < 3.0  # retried for the timeout (a restarting server), not longer
    message = str(info.value)
    assert f"cannot reach the PS at {address} from host " in message
    assert "spark.ps.host" in message and "spark.ps.address" in message
    # the driver finds the executor's line inside Spark's error text
    assert unreachable_in(f"Job aborted...\n  {message}\n  at org.apache...") == message


def test_listening_address_passes_at_once():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        t0 = time.monotonic()
        check_reachable([f"127.0.0.1:{s.getsockname()[1]}"], timeout=5.0)
        assert time.monotonic() - t0 < 1.0


def test_a_stale_shard_address_is_re_read_until_the_restarted_shard_answers():
    """A shard that restarted on a new port: the probe re-reads the map and passes."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        maps = iter([[f"127.0.0.1:{_closed_port()}"], [f"127.0.0.1:{s.getsockname()[1]}"]])
        stale = next(maps)
        check_reachable(stale, timeout=5.0, refresh=lambda: next(maps))


def test_a_failed_worker_job_is_relaunched_unless_the_executor_alone_cannot_reach_the_ps(ps):
    """An executor's PSUnreachable stops the relaunches only when the address it named is
    still in the shard map and the driver reaches it (a network or setting problem). An
    address the map no longer holds is a shard that moved (its host was lost with its
    executor): the relaunched tasks read the new map."""
    from spark_ps.client.reach import unreachable_message
    from spark_ps.ml._job import PSJob

    job = object.__new__(PSJob)  # only its decision: the real embedded PS answers
    job.ps = ps

    def failure(address: str) -> Exception:
        line = unreachable_message(address, ConnectionRefusedError("refused"), 10)
        return RuntimeError(f"Could not recover from a failed barrier ResultStage.\n{line}")

    current = ps.client.addresses[1]
    assert job._unreachable(failure(current)) is True  # the driver reaches it: no relaunch
    moved = f"127.0.0.1:{_closed_port()}"
    assert job._unreachable(failure(moved)) is False  # not in the map any more: relaunch
    assert job._unreachable(RuntimeError("ExecutorLostFailure")) is False
