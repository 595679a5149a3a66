"""Timeouts come from one place (ps_server/timeouts.py): the README's environment table
and that module agree, no other module reads those variables, bad values are refused
with the variable's name, and the relations the module states hold for its defaults."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest

from ps_server import timeouts
from ps_server.coordinator.servicer import CoordinatorServicer
from ps_server.functions.rendezvous import Rendezvous
from ps_server.shard.direct import handshake_timeout
from ps_server.shard.replica import Replica
from ps_server.shard.server import ShardServicer
from spark_ps.client.reach import connect_timeout

ROOT = Path(__file__).resolve().parents[1]
_TIMEOUT_VARS = re.compile(r"SPARK_PS_\w*(?:TIMEOUT|TTL|HORIZON)\b")


def _readme_table() -> dict[str, str]:
    rows = re.findall(
        r"^\| `(SPARK_PS_\w+)` \|.*\| ([^|]+) \|$", (ROOT / "README.md").read_text(), re.M
    )
    return {name: default.strip() for name, default in rows}


def test_the_readme_table_and_the_module_list_the_same_timeouts_and_defaults():
    table = {k: v for k, v in _readme_table().items() if _TIMEOUT_VARS.fullmatch(k)}
    assert set(table) == set(timeouts.ENV), (sorted(table), sorted(timeouts.ENV))
    for name, default in table.items():
        assert float(default) == timeouts.ENV[name][0], name


def test_no_other_module_reads_a_timeout_variable():
    readers = []
    for path in [*(ROOT / "ps_server").rglob("*.py"), *(ROOT / "spark_ps").rglob("*.py")]:
        if path.name == "timeouts.py":
            continue
        for line in path.read_text().splitlines():
            if "environ" in line and _TIMEOUT_VARS.search(line):
                readers.append(f"{path.relative_to(ROOT)}: {line.strip()}")
    assert not readers, readers


@pytest.mark.parametrize("name", sorted(timeouts.ENV))
@pytest.mark.parametrize("raw", ["soon", "0", "-5", "nan"])
def test_a_bad_value_is_refused_naming_the_variable(monkeypatch, name, raw):
    monkeypatch.setenv(name, raw)
    with pytest.raises(ValueError, match=rf"{name}='{raw}'"):
        timeouts.seconds(name)


def test_a_value_below_what_it_must_outlast_is_used_with_a_warning(monkeypatch, caplog):
    monkeypatch.setenv("SPARK_PS_RETRY_HORIZON", "30")
    with caplog.at_level(logging.WARNING, logger="ps_server.timeouts"):
        assert timeouts.retry_horizon() == 30.0
    assert "SPARK_PS_RETRY_HORIZON=30 is not above 210" in caplog.text
    caplog.clear()
    monkeypatch.setenv("SPARK_PS_RETRY_HORIZON", "400")
    with caplog.at_level(logging.WARNING, logger="ps_server.timeouts"):
        assert timeouts.retry_horizon() == 400.0
    assert not caplog.text


def test_the_defaults_keep_the_relations():
    for name, (default, floor, why) in timeouts.ENV.items():
        assert default > floor, (name, why)
    assert timeouts.DEFAULT_WAIT_SECONDS < timeouts.MAX_WAIT_SECONDS
    assert timeouts.DROP_CONFIRM_SECONDS < timeouts.FORWARD_SECONDS
    budget = 8 << 30  # a shard that may hold 8 GiB is given the time to seed 8 GiB
    assert timeouts.configure_seconds(budget) >= timeouts.seed_seconds(budget) > 800
    assert timeouts.configure_seconds(0) == 300.0


def test_every_component_takes_its_timeout_from_the_environment(monkeypatch):
    for name, value in [
        ("SPARK_PS_RETRY_HORIZON", "301"),
        ("SPARK_PS_COORDINATOR_TTL", "7201"),
        ("SPARK_PS_RENDEZVOUS_TTL", "3601"),
        ("SPARK_PS_HANDSHAKE_TIMEOUT", "11"),
        ("SPARK_PS_CONNECT_TIMEOUT", "12"),
    ]:
        monkeypatch.setenv(name, value)
    assert Replica(ShardServicer(0), "primary").horizon == 301.0
    assert CoordinatorServicer(1).last_use.ttl == 7201.0
    assert Rendezvous()._ttl == 3601.0
    assert handshake_timeout() == 11.0
    assert connect_timeout() == 12.0
