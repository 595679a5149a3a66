"""The coordinator's journal (``ps_server.coordinator.journal``): its file format (replay, a
torn last record, corruption, an unknown version) and the state a replay rebuilds, read back from a
real coordinator served over gRPC and a real host table. The kill and restart of a
`spark-ps-server coordinator` under a running fit is in ``tests/test_coordinator_restart.py``.
"""

from __future__ import annotations

import os
import struct

import numpy as np
import pytest

from ps_server.coordinator import journal, placement
from ps_server.coordinator.host_service import HostService
from ps_server.coordinator.hosts import LOST_CODE, HostTable
from ps_server.proto import ps_pb2 as pb
from spark_ps.client import PSClient
from spark_ps.client.spec import TensorSpec

pytestmark = pytest.mark.timeout(60)
TOKEN = "journal-test-token"


def _journal(tmp_path, records=(), **kw) -> journal.Journal:
    j = journal.Journal(str(tmp_path / "j"), **kw)
    j.start(list(records))
    return j


def test_records_replay_in_order_and_a_fresh_start_replaces_them(tmp_path):
    j = _journal(tmp_path, [{"t": "config", "partitions": 2, "replicas": 1}])
    for i in range(5):
        j.append({"t": "post", "topic": "a", "round": i, "payload": "é" * i}, sync=i == 4)
    j.close()
    again = journal.Journal(j.directory)
    got = again.read()
    assert [r.get("round") for r in got] == [None, 0, 1, 2, 3, 4]
    assert got[-1]["payload"] == "éééé"
    again.start(got[:2])  # a snapshot replaces the file atomically
    assert again.read() == got[:2]
    assert not os.path.exists(again.path + ".tmp")
    again.close(remove=True)
    assert journal.Journal(j.directory).read() == []


@pytest.mark.parametrize("cut", ["frame", "body", "checksum"])
def test_a_torn_last_record_is_cut_off_and_the_journal_goes_on(tmp_path, cut):
    j = _journal(tmp_path, [{"t": "config", "partitions": 1, "replicas": 1}])
    j.append({"t": "post", "topic": "x", "round": 1, "payload": "kept"})
    j.close()
    good = os.path.getsize(j.path)
    frame = journal._frame({"t": "post", "topic": "x", "round": 2, "payload": "torn"})
    with open(j.path, "ab") as f:
        if cut == "frame":
            f.write(frame[:5])  # not even a whole length and checksum
        elif cut == "body":
            f.write(frame[:-3])
        else:  # whole, but the last bytes never reached the disk as written
            f.write(frame[:-1] + b"?")
    again = journal.Journal(j.directory)
    assert [r.get("payload") for r in again.read()] == [None, "kept"]
    assert os.path.getsize(j.path) == good  # cut off
    again.start(again.read())
    again.append({"t": "post", "topic": "x", "round": 3, "payload": "after"})
    assert again.read()[-1]["payload"] == "after"
    again.close()


def test_corruption_before_the_end_and_unknown_versions_are_errors_naming_the_file(tmp_path):
    j = _journal(tmp_path, [{"t": "config", "partitions": 1, "replicas": 1}])
    j.append({"t": "post", "topic": "x", "round": 1, "payload": "a"})
    j.append({"t": "post", "topic": "x", "round": 2, "payload": "b"})
    j.close()
    data = bytearray(open(j.path, "rb").read())
    first = len(journal._HEADER)
    data[first + 12] ^= 0xFF  # inside the first record; two more follow
    open(j.path, "wb").write(bytes(data))
    with pytest.raises(journal.JournalError, match=rf"{j.path}: record at byte {first} is corrupt"):
        journal.Journal(j.directory).read()

    newer = journal.MAGIC + struct.pack("<I", 7)
    open(j.path, "wb").write(newer + bytes(data[first:]))
    with pytest.raises(journal.JournalError, match=r"is journal format version 7; .* version 1"):
        journal.Journal(j.directory).read()
    open(j.path, "wb").write(b"PK\x03\x04 something else entirely")
    with pytest.raises(journal.JournalError, match="is not a spark-ps coordinator journal"):
        journal.Journal(j.directory).read()
    with pytest.raises(journal.JournalError, match="unknown journal record type 'nope'"):
        journal.replay([{"t": "nope"}], HostService(partitions=1).coordinator, HostTable())


def test_only_a_local_checkpoint_dir_holds_a_journal(tmp_path):
    assert journal.journal_dir("") is None
    assert journal.journal_dir("s3://bucket/ckpt") is None
    assert journal.journal_dir(f"file://{tmp_path}") == str(tmp_path / "coordinator-journal")
    assert journal.journal_dir(str(tmp_path)) == str(tmp_path / "coordinator-journal")


@pytest.fixture
def coordinator(tmp_path):
    """A coordinator across hosts with a journal, served over gRPC (no hosts join)."""
    svc = HostService(partitions=2, token=TOKEN, checkpoint_dir=str(tmp_path))
    svc._resize(2)
    svc.table.slots = [placement.Slot("unplaced")] * 2  # served as placed and registered
    svc.coordinator.addresses = ["127.0.0.1:1", "127.0.0.1:2"]  # (GetShardMap)
    svc._start_journal()
    svc.server.start()
    client = PSClient(svc.address, TOKEN, retry_seconds=5, timeout=10)
    try:
        yield svc, client
    finally:
        client.close()
        svc.server.stop()
        svc.journal.close()  # as a SIGKILL leaves it: not removed


def _rebuilt(svc: HostService) -> HostService:
    records = journal.Journal(svc.journal.directory).read()
    fresh = HostService(partitions=2)
    fresh._resize(2)
    fresh.table.next_number = 1  # as if the clock had gone back: the journal's numbers rule
    assert journal.replay(records, fresh.coordinator, fresh.table)["partitions"] == 2
    fresh.server.stop()
    return fresh


@pytest.mark.parametrize("compact", [False, True])
def test_a_replay_rebuilds_models_board_contributions_clocks_queues_and_counters(
    coordinator, compact
):
    svc, c = coordinator
    spec = TensorSpec("w", "sparse", 2**40, 3, 2, dtype="float32")
    c._coord("RegisterModel", spec.global_spec())
    c._coord("RegisterModel", TensorSpec("gone", "dense", 10, 1, 2).global_spec())
    c._coord("UnregisterModel", pb.ModelRef(name="gone"))
    c.post("job/cmd", 3, {"op": "grad", "iteration": 2})
    c.post("job/cmd", 4, {"op": "grad", "iteration": 3})
    c.contribute("job/out", 3, 0, np.array([1.5, -2.0]))
    c.contribute("job/out", 3, 1, np.array([0.25, 4.0]))
    np.testing.assert_array_equal(c.collect("job/out", 3, 2, timeout=5), [1.75, 2.0])
    c.contribute("job/out", 4, 1, np.array([7.0, 8.0]))
    c.clock("ssp", "w0", 5, staleness=9, num_workers=1)
    c.clock("ssp", "w1", 2, staleness=9, num_workers=2)
    c.remove_worker("ssp", "w1")
    c.add_tasks("q", ["f0", "f1", "f2"], lease_seconds=30)
    first = c.get_task("q", "p0", timeout=1)
    second = c.get_task("q", "p0", timeout=1)
    assert c.finish_task("q", "p0", second.task_id)
    c.count("checkpoint", 3)
    if compact:  # the snapshot alone must rebuild the same
        svc.journal.compact_bytes = 1
        assert svc.journal.wants_compaction
        svc._start_journal()
        assert len(journal.Journal(svc.journal.directory).read()) < 30

    old, new = svc.coordinator, _rebuilt(svc).coordinator
    assert new.models == old.models and list(new.models) == ["w"]
    assert new.board == old.board == {"job/cmd": (4, '{"op": "grad", "iteration": 3}')}
    assert list(new.parts) == [("job/out", 4)]
    np.testing.assert_array_equal(new.parts[("job/out", 4)][1], [7.0, 8.0])
    assert new.collected["job/out"][0] == 3  # a retried collect of round 3 is answered again
    assert dict(new.clocks) == {"ssp": {"w0": 5, "w1": 2}} and new.removed["ssp"] == {"w1"}
    q = new.queues["q"]
    assert q.tasks == ["f0", "f1", "f2"] and q.lease_seconds == 30
    assert q.done == {second.task_id} and not q.doing  # the open lease went back to TODO
    assert list(q.todo) == sorted({0, 1, 2} - {second.task_id}) and first.task_id in q.todo
    assert new.counters["checkpoint"] == 3 and dict(new.counters) == dict(old.counters)
    assert {("board", "job/cmd"), ("parts", "job/out"), ("queue", "q")} <= set(
        new.last_use._at
    )  # forgotten when idle, as before the restart


def _host(table: HostTable, host: str, run: str, processes=()) -> pb.HostAssignment:
    info = pb.HostInfo(id=host, address="127.0.0.1", shards=2, run_id=run)
    return table.report(pb.HostReport(host=info, processes=list(processes)))


def test_launches_and_the_shard_map_replay_and_a_rejoining_host_reports_its_dead(coordinator):
    svc, c = coordinator
    table = svc.table
    _host(table, "a", "run-a")
    _host(table, "b", "run-b")
    table.place_all(2)
    launches = [table.launch(i, "solo") for i in range(2)]
    first = launches[0].number
    for x in launches:
        request = pb.RegisterShardRequest(
            index=x.partition, address=f"127.0.0.1:{7000 + x.partition}", pid=100 + x.number,
            host_id=x.host, incarnation=x.number,
        )  # fmt: skip
        c._coord("RegisterShard", request)
    c._coord("RegisterShard", request)  # a retried registration is not another start
    smap = c._coord("GetShardMap", pb.Empty())
    assert smap.restarts == 2

    fresh = _rebuilt(svc)
    t = fresh.table
    assert fresh.coordinator.addresses == list(smap.addresses)
    assert (fresh.coordinator.epoch, fresh.coordinator.restarts) == (smap.epoch, 2)
    assert sorted(t.launches) == [x.number for x in launches]
    assert t.next_number == launches[-1].number + 1  # numbers stay unique
    assert {n: (x.address, x.pid, x.returncode) for n, x in t.launches.items()} == {
        x.number: (f"127.0.0.1:{7000 + x.partition}", 100 + x.number, None) for x in launches
    }
    assert {h: x.info.run_id for h, x in t.hosts.items()} == {"a": "run-a", "b": "run-b"}

    t.rejoining = {h: {x.number for x in launches if x.host == h} for h in ("a", "b")}
    by_host = {x.host: x.number for x in launches}
    if len(by_host) == 2:  # each host runs one: "a" lists its own, "b" restarted
        keep = pb.ShardProcess(incarnation=by_host["a"], pid=100 + by_host["a"])
        assert [x.incarnation for x in _host(t, "a", "run-a", [keep]).launches] == [by_host["a"]]
        assert _host(t, "b", "run-b2").launches == []  # a new supervisor: its shards died
        assert t.launches[by_host["b"]].returncode == LOST_CODE
        assert t.launches[by_host["a"]].returncode is None
    else:  # both on one host, which lists only the first
        (h,) = by_host
        keep = pb.ShardProcess(incarnation=first, pid=100 + first)
        assert [x.incarnation for x in _host(t, h, f"run-{h}", [keep]).launches] == [first]
        assert t.launches[launches[1].number].returncode == LOST_CODE
