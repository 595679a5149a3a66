"""The coordinator's task queue with real worker processes: a dead worker's data shard is
redone by another worker, and every shard becomes DONE exactly once."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from spark_ps import PSContext
from spark_ps.client import PSClient, PSError

ROOT = Path(__file__).resolve().parents[1]

_WORKER = textwrap.dedent(
    """
    import json, sys, time
    from pathlib import Path
    from spark_ps.client import PSClient

    address, queue, name, out, hang = sys.argv[1:6]
    out = Path(out)
    tag = name.replace("/", "_").replace(":", "-")
    client = PSClient(address, __import__("os").environ["SPARK_PS_TOKEN"])
    while True:
        lease = client.get_task(queue, name, timeout=1.0)
        if lease.drained:
            break
        if lease.task_id < 0:
            continue
        if hang == "1":  # hold the lease and wait to be SIGKILLed
            (out / f"holding-{tag}").write_text(str(lease.task_id))
            time.sleep(600)
        client.heartbeat(queue, name)
        (out / f"data-{lease.task}").write_text(name)  # the work: one output per shard
        first = client.finish_task(queue, name, lease.task_id)
        with open(out / f"log-{tag}", "a") as f:
            f.write(json.dumps([lease.task_id, lease.task, lease.attempt, first]) + "\\n")
    """
)


@pytest.fixture(scope="module")
def own_ps():
    ps = PSContext.start(numShards=1)
    yield ps
    ps.stop()


def _worker(ps, queue: str, name: str, out: Path, hang: bool) -> subprocess.Popen:
    env = dict(os.environ, SPARK_PS_TOKEN=ps.token, PYTHONPATH=str(ROOT))
    cmd = [sys.executable, "-c", _WORKER, ps.address, queue, name, str(out), "1" if hang else "0"]
    return subprocess.Popen(cmd, env=env)


def _wait_for(path: Path, timeout: float = 60.0) -> str:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)
    time.sleep(0.05)
    return path.read_text()


@pytest.mark.timeout(180)
def test_killed_workers_shards_are_redone_and_each_is_done_once(own_ps, tmp_path):
    client = own_ps.client
    before = client.metrics()
    shards = [f"part-{i:03d}.parquet" for i in range(8)]
    assert client.add_tasks("files", shards, lease_seconds=1.5) == 8
    # two workers lease a shard each and die holding it (SIGKILL, no goodbye)
    lost = _worker(own_ps, "files", "executor:9/w0", tmp_path, hang=True)
    silent = _worker(own_ps, "files", "executor:5/w1", tmp_path, hang=True)
    held = {int(_wait_for(tmp_path / f"holding-{n}")) for n in ("executor-9_w0", "executor-5_w1")}
    for p in (lost, silent):
        os.kill(p.pid, signal.SIGKILL)
        p.wait()
    # executor 9's loss is reported (as the JVM listener does); executor 5's lease lapses
    client.remove_worker("*", "executor:9")
    healthy = [_worker(own_ps, "files", f"executor:{i}/w", tmp_path, hang=False) for i in (1, 2)]
    for p in healthy:
        assert p.wait(timeout=120) == 0
    logs = [
        json.loads(line)
        for tag in ("executor-1_w", "executor-2_w")
        if (tmp_path / f"log-{tag}").exists()
        for line in (tmp_path / f"log-{tag}").read_text().splitlines()
    ]
    done = sorted(task for _, task, _, first in logs if first)
    assert done == shards  # every shard DONE exactly once
    assert all(first for *_, first in logs)  # no shard finished twice
    redone = {tid for tid, _, attempt, _ in logs if attempt > 0}
    assert redone == held  # exactly the dead workers' shards were leased again
    assert {p.name for p in tmp_path.glob("data-*")} == {f"data-{s}" for s in shards}
    after = client.metrics()
    assert after["task_requeued"] - before["task_requeued"] == 2
    assert after["worker_lost"] - before["worker_lost"] == 1
    drained = client.get_task("files", "late", timeout=0)
    assert drained.task_id == -1 and drained.drained
    with pytest.raises(PSError, match="'executor:9/w0' was removed"):  # its leases went back
        client.get_task("files", "executor:9/w0", timeout=0)


def test_a_removed_worker_may_neither_lease_nor_finish(own_ps):
    """Removing a worker gives its lease back; it may not finish that task (another worker
    holds it now) nor lease another one."""
    client = own_ps.client
    client.add_tasks("q-removed", ["a", "b"])
    lease = client.get_task("q-removed", "w-gone", timeout=0)
    client.remove_worker("q-removed", "w-gone")
    with pytest.raises(PSError, match="FinishTask on 'q-removed': worker 'w-gone' was removed"):
        client.finish_task("q-removed", "w-gone", lease.task_id)
    with pytest.raises(PSError, match="GetTask on 'q-removed': worker 'w-gone' was removed"):
        client.get_task("q-removed", "w-gone", timeout=0)
    again = client.get_task("q-removed", "w-new", timeout=0)
    assert (again.task_id, again.attempt) == (lease.task_id, 1)  # requeued, leased anew
    assert client.finish_task("q-removed", "w-new", again.task_id) is True


def test_task_queue_bad_requests_name_what_is_wrong(own_ps):
    client = PSClient(own_ps.address, own_ps.token)
    try:
        with pytest.raises(PSError, match="unknown task queue 'nope'"):
            client.get_task("nope", "w", timeout=0)
        with pytest.raises(PSError, match="lease_seconds must be >= 0, got -1"):
            client.add_tasks("q-bad", ["a"], lease_seconds=-1)
        client.add_tasks("q-bad", ["a"])
        with pytest.raises(PSError, match="no task 5 \\(it has 1\\)"):
            client.finish_task("q-bad", "w", 5)
        with pytest.raises(PSError, match="empty worker"):
            client.get_task("q-bad", "", timeout=0)
        lease = client.get_task("q-bad", "w", timeout=0)
        assert (lease.task_id, lease.task, lease.attempt) == (0, "a", 0)
        assert client.finish_task("q-bad", "w", 0) is True
        assert client.finish_task("q-bad", "w", 0) is False  # already DONE: not twice
        n = client.metrics().get("promotions", 0)
        assert client.count("promotions", 2) == n + 2  # the hook other subsystems use
    finally:
        client.close()


@pytest.mark.timeout(180)
def test_spark_tasks_drain_a_queue_under_executor_names(spark, own_ps):
    """Executors lease shards with `leased_tasks` under `executor:<id>/...` names."""
    from spark_ps.tasks import leased_tasks, worker_name

    shards = [f"s3://bucket/day={d:02d}" for d in range(7)]
    own_ps.client.add_tasks("days", shards)
    address, token = own_ps.address, own_ps.token

    def work(index, _rows):
        client = PSClient(address, token)
        name = worker_name(f"p{index}")
        try:
            yield from ((name, task) for _, task in leased_tasks(client, "days", name))
        finally:
            client.close()

    out = spark.sparkContext.parallelize(range(2), 2).mapPartitionsWithIndex(work).collect()
    assert sorted(task for _, task in out) == shards  # each shard once
    assert {name for name, _ in out} <= {"executor:driver/p0", "executor:driver/p1"}
    assert own_ps.client.get_task("days", "x", timeout=0).drained


def test_queue_expiry_counts_a_workers_newest_lease_and_requeues_in_id_order():
    """The queue alone (no coordinator): a worker that just leased is alive and keeps its
    older lease; a silent one's leases come back next, in id order."""
    from ps_server.coordinator.tasks import TaskQueue

    q = TaskQueue("unit", lease_seconds=60.0)
    q.add([f"t{i}" for i in range(5)], 0)
    never = lambda w: -1e18  # noqa: E731 - no heartbeats at all
    assert q.lease("a", 0.0)[0] == 0 and q.lease("b", 0.0)[0] == 1
    assert q.lease("b", 5.0)[0] == 2 and q.lease("a", 50.0)[0] == 3
    assert q.expire(70.0, never) == 2  # b (silent since 5 s) loses 1 and 2; a keeps 0 and 3
    assert sorted(q.doing) == [0, 3] and list(q.todo) == [1, 2, 4]
    assert q.lease("c", 70.0)[1:] == ("t1", 1)  # the requeued task first, its 2nd lease
    assert q.expire(70.0, lambda w: 69.0) == 0  # heartbeats keep every lease
    assert q.expire(111.0, never) == 2 and list(q.todo) == [0, 3, 2, 4]  # a: silent 61 s


def test_queue_operations_stay_constant_time_per_task():
    """50k tasks leased and finished: was O(n) per call (list.pop(0), `in` on the TODO list)
    under the coordinator's lock, ~17 s of CPU; now well under a second."""
    from ps_server.coordinator.tasks import TaskQueue

    n = 50_000
    q = TaskQueue("big")
    q.add([f"s{i}" for i in range(n)], 0)
    t0 = time.process_time()
    while (got := q.lease("w", 0.0)) is not None:
        assert q.finish(got[0], "w")
    assert q.drained and len(q.done) == n
    assert time.process_time() - t0 < 3.0


class _FlakyHeartbeats(PSClient):
    """A real client whose first heartbeat fails, as when the coordinator is briefly away."""

    failed = 0

    def heartbeat(self, group: str, worker: str) -> None:
        if not self.failed:
            self.failed += 1
            raise PSError("coordinator unavailable (injected)", rpc="Heartbeat")
        super().heartbeat(group, worker)


@pytest.mark.timeout(60)
def test_a_failed_heartbeat_does_not_let_a_live_workers_lease_lapse(own_ps):
    from spark_ps.tasks import leased_tasks

    own_ps.client.add_tasks("beats", ["only"], lease_seconds=2.5)
    client = _FlakyHeartbeats(own_ps.address, own_ps.token)
    other = PSClient(own_ps.address, own_ps.token)
    try:
        leases = leased_tasks(client, "beats", "slow-worker", heartbeat_seconds=0.3)
        assert next(leases)[1] == "only"
        time.sleep(4.0)  # working for longer than the lease time, beating (after one failure)
        assert client.failed == 1
        stolen = other.get_task("beats", "eager-worker", timeout=0)
        assert stolen.task_id == -1 and not stolen.drained  # still ours
        assert list(leases) == []  # finishes it; the queue is drained
        assert other.get_task("beats", "eager-worker", timeout=0).drained
    finally:
        client.close()
        other.close()
