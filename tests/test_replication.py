"""Shard replication: real primary/backup shard processes, real SIGKILLs, exact checks.

The service runs in this process (so its coordinator's counters can be read); its
shards are real processes over loopback gRPC.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import grpc
import numpy as np
import pytest

from ps_server.coordinator.service import Service
from ps_server.proto import ps_pb2 as pb
from ps_server.proto import ps_pb2_grpc as pb_grpc
from ps_server.shard.direct import DirectError, DirectLink
from ps_server.shard.replica import REQUEST_ID_KEY
from ps_server.wire import TOKEN_KEY, to_array
from spark_ps.client import PSClient, PSError
from spark_ps.client.spec import TensorSpec

pytestmark = pytest.mark.timeout(180)

TOKEN = "replica-test-token"


@pytest.fixture(scope="module")
def service():
    """A replicated service (2 shards x primary + backup), supervised, stopped at the end."""
    svc = Service(num_shards=2, token=TOKEN, replicas=2)
    svc.start()
    supervisor = threading.Thread(target=svc.supervise, daemon=True)
    supervisor.start()
    client = PSClient(svc.address, TOKEN, retry_seconds=60)
    yield svc, client
    client.close()
    svc.stop_event.set()
    supervisor.join(30)
    assert all(p.poll() is not None for p in svc.procs + svc.backups if p is not None)


def _spec(name: str, kind: str = "dense", dim: int = 100, cols: int = 1, **kw) -> TensorSpec:
    return TensorSpec(name=name, kind=kind, dim=dim, cols=cols, num_shards=2, **kw)


def _in_sync(client: PSClient, timeout: float = 60.0) -> list:
    """Wait until every shard has a seeded backup; returns the (primary, backup) digests."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            pairs = client.replica_digests()
        except grpc.RpcError as e:  # a backup died and is being replaced: the map catches up
            if e.code() != grpc.StatusCode.UNAVAILABLE or time.monotonic() > deadline:
                raise
            time.sleep(0.2)
            continue
        if all(b is not None for _, b in pairs):
            return pairs
        assert time.monotonic() < deadline, f"no seeded backup in {timeout:.0f} s: {pairs}"
        time.sleep(0.2)


def _assert_identical(client: PSClient) -> None:
    for i, (p, b) in enumerate(_in_sync(client)):
        assert b is not None, f"shard {i} has no backup"
        assert (p.role, b.role) == ("primary", "backup")
        assert p.digest == b.digest, f"shard {i}: replicas differ"


def _raw_push(client, shard: int, spec: TensorSpec, keys, values, rid: str) -> pb.Ack:
    """One Push straight to the current primary of `shard` with a chosen request id."""
    client.refresh()
    req = pb.PushRequest(model=spec.name, keys=to_array(keys), values=to_array(values))
    md = ((TOKEN_KEY, TOKEN), (REQUEST_ID_KEY, rid))
    return client.shards[shard].Push(req, metadata=md, timeout=30)


def test_every_kind_of_update_reaches_both_replicas_identically(service, tmp_path):
    _, c = service
    adam = _spec("r-adam", "sparse", 2**40, optimizer="adam", opt_params=(("lr", 0.1),))
    dense, other = _spec("r-x", dim=1001), _spec("r-y", dim=1001)
    emb = _spec(
        "r-emb", "sparse", 2**50, cols=4, init="normal", init_scale=0.1, seed=3, create_on_pull=True
    )
    for s in (adam, dense, other, emb):
        c.create(s)
    rng = np.random.default_rng(0)
    keys = rng.choice(2**40, 500, replace=False)
    c.push(adam, keys, rng.normal(size=500), "step")
    c.push(dense, np.arange(1001), rng.normal(size=1001), "set")
    c.push(other, np.arange(0, 1001, 3), np.ones(334), "add")
    c.push(dense, np.arange(10), np.ones(10), round=1, part=1)
    c.push(dense, np.arange(5, 20), np.ones(15), round=1, part=0)
    c.reduce(dense, 1, op="add")
    c.vector_op("axpy", [dense, other], alpha=-0.5)
    c.vector_op("scale", [other], alpha=3.0)
    c.call("linalg.lincomb", [other, dense, other], {"coeffs": [0.25, 2.0]})
    c.pull(emb, np.array([7, 2**49, 7]))  # creates rows: a mutation on both replicas
    version_dir = str(tmp_path / "ckpt")
    c.checkpoint(version_dir, 1)
    c.push(adam, keys[:10], np.ones(10), "step")
    c.restore(version_dir, 1)
    _assert_identical(c)
    before = c.pull(dense, np.arange(1001))
    assert c.vector_op("dot", [dense, dense]) == pytest.approx(before @ before, rel=1e-12)
    c.drop(other)
    pairs = _in_sync(c)
    assert all(p.applied == b.applied and p.digest == b.digest for p, b in pairs)


def test_a_retried_request_id_is_applied_once_on_both_replicas(service):
    _, c = service
    spec = _spec("r-retry", "sparse", 2**40)
    c.create(spec)
    keys, ones = np.array([3, 2**39 + 1]), np.ones(2)
    for shard in range(2):
        owned = keys[spec.shard_of(keys) == shard]
        first = _raw_push(c, shard, spec, owned, np.ones(owned.size), "retry-test-1")
        again = _raw_push(c, shard, spec, owned, np.ones(owned.size), "retry-test-1")
        assert first.value == again.value == owned.size
    np.testing.assert_array_equal(c.pull(spec, keys), ones)  # not 2
    c.push(spec, keys, ones)  # fresh ids: applied
    np.testing.assert_array_equal(c.pull(spec, keys), 2 * ones)
    _assert_identical(c)


def test_a_push_on_the_direct_lane_is_replicated_and_its_retry_applied_once(service):
    """A push sent on a primary's direct lane runs the same replicated handler: the backup
    applies it before it is acknowledged, and a resend with the same request id (on the
    lane, or on gRPC after a broken lane) gets the first answer without applying it."""
    _, c = service
    spec = _spec("r-lane", "sparse", 2**40)
    c.create(spec)
    c.refresh()
    keys = np.array([11, 2**39 + 5])
    for shard in range(2):
        owned = keys[spec.shard_of(keys) == shard]
        port = c.health()[shard].direct_port
        assert port > 0
        link = DirectLink(c.addresses[shard].rsplit(":", 1)[0], port, TOKEN, timeout=30)
        req = pb.PushRequest(model=spec.name, keys=to_array(owned), values=to_array(np.ones(1)))
        for _ in range(2):
            link.send(req, "Push", f"lane-retry-{shard}")
            assert link.receive(pb.Ack).value == owned.size
        link.close()
        again = _raw_push(c, shard, spec, owned, np.ones(owned.size), f"lane-retry-{shard}")
        assert again.value == owned.size
    np.testing.assert_array_equal(c.pull(spec, keys), np.ones(2))  # once, not 3 times
    dense = _spec("r-lane-dense", dim=1001)
    c.create(dense)
    c.push(dense, np.arange(1001), np.arange(1001.0))  # a range push, on the lanes
    c.push(dense, np.array([3, 900, 3]), np.ones(3))
    expected = np.arange(1001.0)
    expected[[3, 900]] += [2.0, 1.0]
    np.testing.assert_array_equal(c.pull(dense, np.arange(1001)), expected)
    _assert_identical(c)


def test_calls_vector_ops_and_reduces_on_the_lane_are_replicated_and_applied_once(service):
    """Writes other than pushes travel the direct lane too (a server function that is not
    read-only, a vector op, a reduce): the same replicated handler runs them, and a resend
    with the same request id, on the lane or on gRPC, gets the first answer unapplied."""
    from ps_server.shard.direct import Payload

    _, c = service
    x, y = _spec("r-lane-x", dim=1001), _spec("r-lane-y", dim=1001)
    for s in (x, y):
        c.create(s)
    c.push(x, np.arange(1001), np.arange(1001.0))
    c.push(y, np.arange(1001), np.ones(1001))
    c.push(y, np.arange(1001), np.full(1001, 2.0), round=7, part=0)
    c.refresh()
    # x = x + y, x = x + 0.5 * y (axpy), y = 2 (the round's sum): none may run twice
    lincomb = pb.CallRequest(
        function="linalg.lincomb", models=[x.name, x.name, y.name], args='{"coeffs": [1.0, 1.0]}'
    )
    axpy = pb.VectorOpRequest(op="axpy", models=[y.name, x.name], alpha=0.5)
    reduce = pb.ReduceRequest(model=y.name, round=7, op=pb.ADD, zero_first=True)
    writes = [
        (Payload(lincomb, arrays=[]), "Call", pb.CallResponse),
        (axpy, "VectorOp", pb.Scalar),
        (reduce, "Reduce", pb.Ack),
    ]
    for shard in range(2):
        port = c.health()[shard].direct_port
        link = DirectLink(c.addresses[shard].rsplit(":", 1)[0], port, TOKEN, timeout=30)
        try:
            for n, (request, rpc, answer) in enumerate(writes):
                for _ in range(2):
                    link.send(request, rpc, f"lane-write-{shard}-{n}")
                    link.receive(answer)
        finally:
            link.close()
        md = ((TOKEN_KEY, TOKEN), (REQUEST_ID_KEY, f"lane-write-{shard}-0"))
        c.shards[shard].Call(lincomb, metadata=md, timeout=30)  # the retry through gRPC
    expected = np.arange(1001.0) + 1.0 + 0.5
    np.testing.assert_array_equal(c.pull(x, np.arange(1001)), expected)
    np.testing.assert_array_equal(c.pull(y, np.arange(1001)), np.full(1001, 2.0))
    _assert_identical(c)


def test_a_backup_refuses_clients_and_bad_input_changes_no_replica(service):
    svc, c = service
    lost = svc.coordinator.counters.get("backup_lost", 0)
    spec = _spec("r-bad", dim=50)
    c.create(spec)
    c.push(spec, np.arange(50), np.ones(50))
    before = _in_sync(c)
    stub = pb_grpc.ShardStub(c._channel(c.backups[0]))
    with pytest.raises(grpc.RpcError) as e:
        stub.Pull(
            pb.PullRequest(model=spec.name, keys=to_array(np.arange(3))),
            metadata=((TOKEN_KEY, TOKEN),),
            timeout=10,
        )
    assert e.value.code() == grpc.StatusCode.UNAVAILABLE and "backup" in e.value.details()
    port = stub.Health(pb.Empty(), metadata=((TOKEN_KEY, TOKEN),), timeout=10).direct_port
    lane = DirectLink(c.backups[0].rsplit(":", 1)[0], port, TOKEN, timeout=10)
    for rpc, request in [
        ("Pull", pb.PullRequest(model=spec.name, keys=to_array(np.arange(3)))),
        ("Pull", pb.PullRequest(model=spec.name, by_range=True, start=0, stop=3)),
        (
            "Push",
            pb.PushRequest(
                model=spec.name, keys=to_array(np.arange(3)), values=to_array(np.ones(3))
            ),
        ),
    ]:  # the lane refuses as gRPC does
        lane.send(request, rpc, "backup-lane")
        with pytest.raises(DirectError) as e:
            lane.receive(pb.PullResponse if rpc == "Pull" else pb.Ack)
        assert e.value.code == "UNAVAILABLE" and "backup" in str(e.value), (rpc, str(e.value))
    lane.close()
    bad = np.ones(25)  # keys 25..49 all live on shard 1; the client would refuse it itself
    bad[6] = np.nan
    with pytest.raises(grpc.RpcError, match="non-finite value nan at row 6"):
        c.shards[1].Push(
            pb.PushRequest(model=spec.name, keys=to_array(np.arange(25, 50)), values=to_array(bad)),
            metadata=((TOKEN_KEY, TOKEN),),
            timeout=10,
        )
    with pytest.raises(PSError, match="unknown vector op 'axpyy'"):
        c.vector_op("axpyy", [spec, spec])
    after = _in_sync(c)
    assert [(p.digest, p.applied, b.digest, b.applied) for p, b in after] == [
        (p.digest, p.applied, b.digest, b.applied) for p, b in before
    ]
    assert svc.coordinator.counters.get("backup_lost", 0) == lost  # both refused alike


def _online_state(c: PSClient, name: str) -> tuple[TensorSpec, TensorSpec]:
    """An online learner's FTRL state (sparse, 2 cols) with rows on both shards, + ledger."""
    state = _spec(f"{name}/state", "sparse", 2**40, cols=2)
    ledger = _spec(f"{name}/ledger", "sparse", 2**63 - 1, dtype="int64")
    c.create(state)
    c.create(ledger)
    keys = np.random.default_rng(7).choice(2**40, 3000, replace=False)
    c.push(state, keys, np.ones((keys.size, 2)))
    return state, ledger


def test_online_reads_are_not_mutations(service):
    """online.footprint/applied skip the mutation lock and the backup (counted by `applied`)."""
    _, c = service
    state, ledger = _online_state(c, "r-online-reads")
    before = _in_sync(c)
    assert sum(r["rows"] for r, _ in c.call("online.footprint", [state])) == 3000
    c.call("online.applied", [ledger])
    after = _in_sync(c)
    counts = [(p.applied, b.applied) for p, b in after]
    assert counts == [(p.applied, b.applied) for p, b in before]


def test_a_snapshot_carries_a_full_answer_window_exactly_and_cheaply():
    """The remembered answers a new backup is seeded with (a retry after a failover is
    answered from them): every one back, in order, as one array, not 4,096 npz entries
    (that cost ~1.2 s of CPU here, the primary's mutations waiting for part of it)."""
    from collections import OrderedDict

    from ps_server.shard.replica import restore_snapshot, snapshot

    answers = OrderedDict()
    for i in range(4096):
        method, answer = [
            ("Push", pb.Ack(value=i)),
            ("VectorOp", pb.Scalar(value=i / 7)),
            ("Call", pb.CallResponse(result=f'{{"i": {i}}}', arrays=[to_array(np.arange(i % 5))])),
        ][i % 3]
        answers[f"client-{i}"] = (method, answer)
    t0 = time.process_time()
    models, back = restore_snapshot(snapshot({}, answers))
    assert time.process_time() - t0 < 0.5
    assert models == {} and list(back) == list(answers)
    assert all(back[k] == answers[k] for k in answers)
    assert restore_snapshot(snapshot({}, OrderedDict()))[1] == OrderedDict()


def test_replica_count_is_checked():
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-m", "ps_server", "--replicas", "3"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2 and "--replicas: invalid choice: 3" in out.stderr
    with pytest.raises(ValueError, match="replicas must be 1 .* got 3"):
        Service(num_shards=1, replicas=3)
    from spark_ps import PSContext

    with pytest.raises(ValueError, match=r"spark.ps.replicas must be 1 or 2, got '3'"):
        PSContext.start(numShards=1, replicas=3)


def _kill_primary(c: PSClient, shard: int) -> int:
    pid = c.health()[shard].pid
    os.kill(pid, signal.SIGKILL)
    return pid


@pytest.mark.slow
def test_killing_primaries_mid_pushes_loses_and_doubles_no_update(service):
    svc, c = service
    counts = dict(svc.coordinator.counters)
    dense, sparse = _spec("r-kd", dim=10_000), _spec("r-ks", "sparse", 2**40)
    c.create(dense)
    c.create(sparse)
    rng = np.random.default_rng(5)
    skeys = rng.choice(2**40, 5000, replace=False)
    rounds, kill_after = 60, {15: 0, 35: 1}  # round -> shard whose primary dies then
    go = {r: threading.Event() for r in kill_after}
    errors: list[Exception] = []

    def pusher():
        own = PSClient(svc.address, TOKEN, retry_seconds=60)
        try:
            for r in range(rounds):
                if r in go:  # let the main thread line up a kill, which lands mid-round
                    go[r].wait(60)
                own.push(dense, np.arange(10_000), np.full(10_000, 1.0))
                own.push(sparse, skeys, np.full(5000, 0.5))
                own.push(dense, np.arange(100), np.ones(100), round=r + 1, part=0)
                own.reduce(dense, r + 1, op="add")
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)
        finally:
            own.close()

    t = threading.Thread(target=pusher)
    t.start()
    for r, shard in kill_after.items():
        _in_sync(c)  # the previous promotion's new backup is seeded
        pid = c.health()[shard].pid
        go[r].set()
        os.kill(pid, signal.SIGKILL)
    t.join(120)
    assert not errors, errors
    want = np.full(10_000, float(rounds))
    want[:100] += rounds
    np.testing.assert_array_equal(c.pull(dense, np.arange(10_000)), want)
    np.testing.assert_array_equal(c.pull(sparse, skeys), np.full(5000, 0.5 * rounds))
    _assert_identical(c)
    got = svc.coordinator.counters
    assert got["promotion"] - counts.get("promotion", 0) == 2
    assert got["resync"] - counts.get("resync", 0) >= 2
    assert got.get("restart", 0) == counts.get("restart", 0) == 0


@pytest.mark.slow
def test_a_request_whose_answer_was_lost_is_not_applied_again_by_the_new_primary(service):
    svc, c = service
    spec = _spec("r-lost", "sparse", 2**40)
    c.create(spec)
    _in_sync(c)
    key = np.array([12345])
    shard = int(spec.shard_of(key)[0])
    _raw_push(c, shard, spec, key, np.ones(1), "lost-ack-1")  # applied on both replicas
    c.refresh()
    backup, promotions = c.backups[shard], svc.coordinator.counters["promotion"]
    assert backup, "the shard has a seeded backup"
    _kill_primary(c, shard)
    # The map moves on twice: at the fence (a new term, same address) and when the backup
    # is the primary; the retry must reach the promoted backup (a restarted, empty primary
    # would apply it once too), so wait for the backup's address in the primary's place.
    deadline = time.monotonic() + 30
    while c.addresses[shard] != backup and time.monotonic() < deadline:
        time.sleep(0.1)
        c.refresh()
    assert c.addresses[shard] == backup, "the backup was not promoted"
    assert svc.coordinator.counters["promotion"] == promotions + 1
    again = _raw_push(c, shard, spec, key, np.ones(1), "lost-ack-1")  # the client's retry
    assert again.value == 1
    np.testing.assert_array_equal(c.pull(spec, key), [1.0])  # once, not twice
    _assert_identical(c)


@pytest.mark.slow
def test_a_killed_backup_is_replaced_and_resynced_while_the_primary_serves(service):
    svc, c = service
    spec = _spec("r-kb", dim=1000)
    c.create(spec)
    _in_sync(c)  # (an earlier test's replacement backup is resynced before counting)
    counts = dict(svc.coordinator.counters)
    c.push(spec, np.arange(1000), np.ones(1000))
    os.kill(svc.backups[1].pid, signal.SIGKILL)
    for _ in range(20):  # the primary keeps answering while its backup is replaced
        c.push(spec, np.arange(1000), np.ones(1000))
    np.testing.assert_array_equal(c.pull(spec, np.arange(1000)), np.full(1000, 21.0))
    _assert_identical(c)
    got = svc.coordinator.counters
    assert got["backup_lost"] - counts.get("backup_lost", 0) == 1
    assert got["resync"] - counts.get("resync", 0) == 1
    assert got["promotion"] == counts.get("promotion", 0)


@pytest.mark.slow
def test_a_reseeded_backup_carries_the_pending_contributions_through_a_failover(service):
    """Contributions of an open round are state too: a backup seeded while they wait must
    get them, so that when its primary dies next the round still sums exactly."""
    svc, c = service
    spec = _spec("r-pending", dim=200)
    c.create(spec)
    _in_sync(c)
    c.push(spec, np.arange(200), np.ones(200), round=7, part=0)
    os.kill(svc.backups[1].pid, signal.SIGKILL)
    _assert_identical(c)  # the new backup is seeded; digests cover pending contributions
    c.push(spec, np.arange(200), np.full(200, 2.0), round=7, part=1)
    _kill_primary(c, 1)  # the reseeded backup takes over shard 1
    c.reduce(spec, 7, op="add")
    np.testing.assert_array_equal(c.pull(spec, np.arange(200)), np.full(200, 3.0))
    _assert_identical(c)


@pytest.mark.slow
def test_losing_both_replicas_falls_back_to_a_restart_with_a_new_backup(service):
    """Runs last: shard 0 comes back empty (this service has no checkpoint directory)."""
    svc, c = service
    _in_sync(c)
    counts = dict(svc.coordinator.counters)
    os.kill(svc.backups[0].pid, signal.SIGKILL)  # the backup first: it cannot be promoted
    _kill_primary(c, 0)
    spec = _spec("r-after-both", dim=10)
    deadline = time.monotonic() + 60
    while svc.coordinator.counters.get("restart", 0) == counts.get("restart", 0):
        assert time.monotonic() < deadline, "the shard was not restarted"
        time.sleep(0.1)
    c.create(spec)  # retried until the restarted primary registers
    c.push(spec, np.arange(10), np.arange(10.0))
    np.testing.assert_array_equal(c.pull(spec, np.arange(10)), np.arange(10.0))
    _assert_identical(c)
    assert svc.coordinator.counters["promotion"] == counts.get("promotion", 0)


@pytest.mark.slow
def test_a_backup_is_seeded_under_a_small_request_limit():
    """Seed chunks follow --max-request-mb: a 6 MB model reaches a new backup of a 0.5 MB PS."""
    svc = Service(num_shards=1, token=TOKEN, replicas=2, max_request_mb=0.5)
    svc.start()
    supervisor = threading.Thread(target=svc.supervise, daemon=True)
    supervisor.start()
    client = PSClient(svc.address, TOKEN, retry_seconds=60)
    try:
        spec = TensorSpec(name="r-big", kind="dense", dim=750_000, cols=1, num_shards=1)
        client.create(spec)
        values = np.arange(750_000, dtype=np.float64)
        client.push(spec, np.arange(750_000), values)  # chunked by the client below 0.5 MB
        os.kill(svc.backups[0].pid, signal.SIGKILL)
        deadline = time.monotonic() + 60
        while svc.coordinator.counters.get("resync", 0) == 0:
            assert time.monotonic() < deadline, "the new backup was never seeded"
            time.sleep(0.1)
        _assert_identical(client)
        np.testing.assert_array_equal(client.pull(spec, np.arange(750_000)), values)
    finally:
        client.close()
        svc.stop_event.set()
        supervisor.join(30)


@pytest.mark.slow
def test_a_hung_shard_does_not_delay_another_shards_promotion():
    """Shard 0's primary hangs (SIGSTOP) while its backup must be replaced, so supervising
    index 0 blocks in Configure; shard 1's primary dies meanwhile and its backup is
    promoted at once, not after index 0's call times out (up to 300 s)."""
    svc = Service(num_shards=2, token=TOKEN, replicas=2)
    svc.start()
    supervisor = threading.Thread(target=svc.supervise, daemon=True)
    supervisor.start()
    client = PSClient(svc.address, TOKEN, retry_seconds=60)
    hung = svc.procs[0].pid
    try:
        spec = _spec("r-hung", dim=1000)
        client.create(spec)
        client.push(spec, np.arange(1000), np.ones(1000))
        _in_sync(client)
        os.kill(hung, signal.SIGSTOP)
        os.kill(svc.backups[0].pid, signal.SIGKILL)  # index 0 must detach it: Configure hangs
        time.sleep(1.0)
        t0 = time.monotonic()
        os.kill(svc.procs[1].pid, signal.SIGKILL)
        while svc.coordinator.counters.get("promotion", 0) == 0:
            assert time.monotonic() - t0 < 15, "shard 1 was not promoted while shard 0 hung"
            time.sleep(0.05)
        os.kill(hung, signal.SIGCONT)
        hung = None
        _in_sync(client)  # both indexes have a seeded backup again
        np.testing.assert_array_equal(client.pull(spec, np.arange(1000)), np.ones(1000))
        _assert_identical(client)
        assert svc.coordinator.counters.get("restart", 0) == 0
    finally:
        if hung is not None:
            os.kill(hung, signal.SIGCONT)
        client.close()
        svc.stop_event.set()
        supervisor.join(30)
    assert not supervisor.is_alive()
    assert all(p.poll() is not None for p in svc.procs + svc.backups if p is not None)
