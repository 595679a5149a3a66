"""The coordinator's host table (ps_server.coordinator.hosts) on its own: reports, leases, launches,
registrations and the map it annotates, driven as supervisors and shards drive it."""

from __future__ import annotations

import time

import pytest

from ps_server.coordinator.hosts import LOST_CODE, HostTable, RemoteShard
from ps_server.proto import ps_pb2 as pb
from ps_server.wire import RequestError


def _report(table: HostTable, host: str, *procs: pb.ShardProcess) -> pb.HostAssignment:
    info = pb.HostInfo(id=host, address=f"addr-{host}", shards=2, run_id=f"run-{host}")
    return table.report(pb.HostReport(host=info, processes=procs))


def _register(table: HostTable, launch, address: str) -> None:
    table.check_registration(
        pb.RegisterShardRequest(
            index=launch.partition,
            address=address,
            pid=1000 + launch.number,
            backup=launch.role == "backup",
            host_id=launch.host,
            incarnation=launch.number,
        )
    )


@pytest.fixture
def table() -> HostTable:
    t = HostTable(timeout=0.5, replicas=2)
    for h in ("a", "b", "c"):
        _report(t, h)
    t.place_all(6)
    return t


def test_each_host_is_told_only_its_own_launches(table):
    launches = [table.launch(p, role) for p in range(6) for role in ("primary", "backup")]
    for h in ("a", "b", "c"):
        mine = {x.incarnation for x in _report(table, h).launches}
        assert mine == {x.number for x in launches if x.host == h}
    assert all(table.slots[x.partition].primary != x.host for x in launches[1::2])


def test_a_dead_process_leaves_the_assignment_and_reads_as_exited(table):
    launch = table.launch(0, "primary")
    proc = RemoteShard(table, launch)
    assert proc.poll() is None
    dead = pb.ShardProcess(incarnation=launch.number, pid=77, exited=True, exit_code=-11)
    assignment = _report(table, launch.host, dead)
    assert launch.number not in {x.incarnation for x in assignment.launches}
    assert (proc.poll(), proc.pid) == (-11, 77)


def test_a_silent_host_loses_its_processes_and_its_partitions_go_elsewhere(table):
    launch = table.launch(2, "primary")
    other = table.launch(2, "backup", avoid=launch.host)
    proc = RemoteShard(table, launch)
    deadline = time.monotonic() + 0.8
    while time.monotonic() < deadline:  # every host but launch.host keeps reporting
        for h in {"a", "b", "c"} - {launch.host}:
            _report(table, h)
        time.sleep(0.1)
    assert proc.poll() == LOST_CODE
    assert launch.host not in table.live_weights()
    again = table.launch(2, "primary", avoid=other.host)
    assert again.host not in (launch.host, other.host)
    assert table.launch(2, "primary", avoid="") is not None


def test_only_a_current_launch_may_register(table):
    launch = table.launch(1, "backup")
    bad = [
        pb.RegisterShardRequest(index=1, host_id=launch.host, incarnation=launch.number + 99),
        pb.RegisterShardRequest(index=2, host_id=launch.host, incarnation=launch.number),
        pb.RegisterShardRequest(index=1, host_id="elsewhere", incarnation=launch.number),
        pb.RegisterShardRequest(index=1, host_id=launch.host, incarnation=launch.number),
    ]  # the last one claims to be a primary
    for request in bad:
        with pytest.raises(RequestError, match="is not a current launch") as e:
            table.check_registration(request)
        assert e.value.code == "FAILED_PRECONDITION"
    _register(table, launch, "addr:1")
    RemoteShard(table, launch).terminate()  # superseded: refused from now on
    with pytest.raises(RequestError, match=f"launch {launch.number}"):
        _register(table, launch, "addr:1")


def test_the_map_names_hosts_replicas_and_lost_partitions(table):
    primary, backup = table.launch(0, "primary"), table.launch(0, "backup")
    _register(table, primary, "p:1")
    _register(table, backup, "b:1")
    table.lose(1, "partition 1 is lost: why")
    smap = pb.ShardMap(addresses=["p:1", ""], backups=["b:1", ""])
    table.annotate(smap)
    assert list(smap.primary_hosts) == [primary.host, ""]
    assert list(smap.backup_hosts) == [backup.host, ""]
    assert list(smap.lost) == ["", "partition 1 is lost: why"]
    assert sorted(h.id for h in smap.hosts) == ["a", "b", "c"]
    assert all(h.alive and h.seconds_since_heartbeat < 0.5 for h in smap.hosts)


def test_bad_and_duplicate_hosts_are_refused_by_name(table):
    with pytest.raises(RequestError, match="shards >= 1.*id='x' address='y' shards=0"):
        table.report(pb.HostReport(host=pb.HostInfo(id="x", address="y", shards=0)))
    twin = pb.HostInfo(id="a", address="elsewhere", shards=2, run_id="another run")
    with pytest.raises(RequestError, match="host id 'a' \\(address elsewhere\\) is held") as e:
        table.report(pb.HostReport(host=twin))
    assert e.value.code == "ALREADY_EXISTS"


def test_dead_launches_are_forgotten_beyond_a_bound(table):
    procs = []
    for _ in range(60):
        launch = table.launch(0, "primary")
        procs.append(RemoteShard(table, launch))
        dead = pb.ShardProcess(incarnation=launch.number, exited=True, exit_code=1)
        _report(table, launch.host, dead)
    assert len(table.launches) <= 4 * 6 + 1
    assert procs[0].poll() == LOST_CODE  # long forgotten: reads as lost, not an error
    assert procs[-1].poll() == 1
