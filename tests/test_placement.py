"""Placement of partitions on hosts (ps_server.coordinator.placement): a pure function,
checked exactly."""

from __future__ import annotations

from collections import Counter

import pytest

from ps_server.coordinator.placement import DEFAULT_SLACK, Slot, capacity, choose, place, rank


def _hosts(n: int, weight: float = 1.0) -> dict[str, float]:
    return {f"10.0.0.{10 + i}": weight for i in range(n)}


def _load(slots: list[Slot]) -> Counter:
    return Counter(s.primary for s in slots) + Counter(s.backup for s in slots if s.backup)


@pytest.mark.parametrize("num_partitions, num_hosts", [(6, 3), (64, 3), (600, 4), (97, 7)])
def test_every_host_stays_within_its_bound(num_partitions, num_hosts):
    hosts = _hosts(num_hosts)
    load = _load(place(num_partitions, hosts))
    fair = num_partitions / num_hosts
    assert max(load.values()) <= -(-DEFAULT_SLACK * fair // 1), load
    assert sum(load.values()) == num_partitions
    if num_partitions >= 100 * num_hosts:  # only the maximum is bounded; many even out
        assert min(load[h] for h in hosts) >= 0.7 * fair, load


@pytest.mark.parametrize("num_hosts, per_host", [(3, 2), (4, 2), (3, 3), (5, 1)])
def test_a_few_partitions_per_host_spread_evenly(num_hosts, per_host):
    slots = place(num_hosts * per_host, _hosts(num_hosts))
    assert set(Counter(s.primary for s in slots).values()) == {per_host}


def test_weights_are_respected():
    weights = {"small-a": 1.0, "small-b": 1.0, "big": 2.0}
    load = _load(place(900, weights))
    assert 0.45 <= load["big"] / 900 <= 0.55, load
    assert 0.2 <= load["small-a"] / 900 <= 0.3, load
    assert capacity(weights, 900) == {"small-a": 281, "small-b": 281, "big": 562}


@pytest.mark.parametrize("num_hosts", [3, 4, 9])
def test_a_joining_host_moves_about_one_nth_of_the_partitions(num_hosts):
    before = _hosts(num_hosts)
    after = {**before, "newcomer": 1.0}
    old, new = place(1200, before), place(1200, after)
    moved = [p for p, (a, b) in enumerate(zip(old, new, strict=True)) if a.primary != b.primary]
    share = 1 / (num_hosts + 1)
    assert 0.8 * share <= len(moved) / 1200 <= 1.15 * share, (len(moved), share)
    # those moved to the newcomer, not between old hosts
    assert sum(new[p].primary == "newcomer" for p in moved) >= 0.95 * len(moved)


def test_backups_never_share_their_primarys_host_and_spread_too():
    for n in (2, 3, 5):
        slots = place(300, _hosts(n), replicas=2)
        assert all(s.backup and s.backup != s.primary for s in slots)
        load, primaries = _load(slots), Counter(s.primary for s in slots)
        assert max(load.values()) <= -(-DEFAULT_SLACK * 600 / n // 1), load
        assert max(primaries.values()) <= -(-DEFAULT_SLACK * 300 / n // 1), primaries


def test_a_single_host_gets_no_backup():
    slots = place(4, {"only": 1.0}, replicas=2)
    assert slots == [Slot("only", "")] * 4


def test_placement_is_deterministic_and_independent_of_host_order():
    hosts = _hosts(5)
    shuffled = dict(reversed(list(hosts.items())))
    assert place(50, hosts, 2) == place(50, shuffled, 2) == place(50, dict(hosts), 2)
    assert rank(7, hosts) == rank(7, shuffled)


def test_a_lost_hosts_partitions_go_to_their_next_choice():
    hosts = _hosts(4)
    gone = rank(0, hosts)[0]
    alive = {h: w for h, w in hosts.items() if h != gone}
    caps = capacity(alive, 8)
    assert choose(0, alive, {}, caps) == rank(0, hosts)[1]
    second = rank(0, alive)[0]
    assert choose(0, alive, {}, caps, exclude=(second,)) == rank(0, alive)[1]
    full = {h: caps[h] for h in alive}
    assert choose(0, alive, full, caps) == second  # every host full: the first choice
    assert choose(0, {"x": 1.0}, {}, {"x": 1}, exclude=("x",)) == ""


@pytest.mark.parametrize(
    "args, message",
    [
        ((0, {"a": 1.0}), "num_partitions must be >= 1, got 0"),
        ((3, {}), "no hosts"),
        ((3, {"a": 1.0}, 3), "replicas must be 1 or 2, got 3"),
        ((3, {"a": 0.0, "b": 1.0}), "{'a': 0.0}"),
    ],
)
def test_bad_arguments_are_named(args, message):
    with pytest.raises(ValueError, match=message.replace("{", r"\{").replace("}", r"\}")):
        place(*args)
