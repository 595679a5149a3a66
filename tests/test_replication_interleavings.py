"""The replication protocol under every interleaving of small scenarios
(``tests/protocol_harness.py``: the real Replica, coordinator and supervisor steps in one
thread, each wait a point where the other party may act, each message delivered, lost,
or answered into the void). One test per race the review of issue 26 found; the last
tests run the same exploration with the fencing steps replaced by the rules the code
had before them, and check that it then finds the lost updates."""

from __future__ import annotations

import pytest

from ps_server import fencing
from ps_server.fencing import ReplicaState
from ps_server.wire import RequestError
from tests.protocol_harness import World, explore, report

pytestmark = pytest.mark.timeout(120)


def _pair(w: World, pids: tuple[int, int] = (101, 102)) -> None:
    """Primary A with backup B seeded and attached."""
    w.replica("A", "primary", pids[0])
    w.replica("B", "backup", pids[1])
    assert w.seed("B"), w.trace


def _retry_unacked(w: World, rids: list[str]) -> None:
    """The client retries what was not acknowledged (same request id) at the map's primary."""
    for rid in rids:
        if rid not in w.acked:
            w.write(w.coord.addresses[0], rid)


def _promotion_while_the_primary_still_runs(pids: tuple[int, int]):
    def scenario(w: World) -> None:
        _pair(w, pids)
        w.later("client writes w1 at A", lambda: w.write("A", "w1"))
        w.later("client writes w2 at A", lambda: w.write("A", "w2"))
        w.begin()
        w.fail_over("B")  # A's host lost its lease; A still runs and takes writes
        w.finish()
        w.dead.add("A")  # its host's supervisor stops it when it reports again
        _retry_unacked(w, ["w1", "w2"])

    return scenario


def _writes_while_the_backup_is_promoted(w: World) -> None:
    _pair(w)
    w.later("supervisor promotes B", lambda: w.fail_over("B"))
    w.begin()
    w.write("A", "w1")
    w.write("A", "w2")
    w.finish()
    w.dead.add("A")
    _retry_unacked(w, ["w1", "w2"])


def test_a_deposed_primary_acknowledges_nothing_the_promoted_backup_lacks():
    """A's host lost its lease while A still serves a client with the old map; B is
    promoted. Whatever A's forwards and drops meet (B still a backup, B promoted, the
    drop before or after the coordinator's promote), no acknowledged write is missing
    on the primary the map names."""
    runs, bad = explore(_promotion_while_the_primary_still_runs((101, 102)), steps=2)
    assert runs > 100 and not bad, report(bad)
    runs, bad = explore(_writes_while_the_backup_is_promoted, steps=1)
    assert runs > 30 and not bad, report(bad)


def test_a_deposed_primary_sharing_the_new_primarys_pid_is_still_fenced():
    """Two hosts can give the old and the new primary one process id: the term, not the
    pid, tells them apart."""
    runs, bad = explore(_promotion_while_the_primary_still_runs((101, 101)), steps=2)
    assert runs > 100 and not bad, report(bad)


def _seed_with_a_write_in_between(w: World) -> None:
    w.replica("A", "primary", 101)
    w.replica("C", "backup", 103)
    w.later("client writes w1 at A", lambda: w.write("A", "w1"))
    w.begin()
    w.seed("C")
    w.finish()
    w.dead.add("A")  # A dies: C is promoted only if it is current
    w.fail_over("C")
    _retry_unacked(w, ["w1"])


def test_a_backup_dropped_before_its_attach_is_never_promoted():
    """The supervisor seeds C, a forward to C fails before the attach, A drops C: C must
    not be attached, hence not promoted without w1."""
    runs, bad = explore(_seed_with_a_write_in_between, steps=1)
    assert runs > 30 and not bad, report(bad)


def _unreachable_coordinator(w: World) -> None:
    _pair(w)
    w.begin()
    w.write("A", "w1")  # its forward and its drop may be lost
    w.write("A", "w1")  # the client's retry
    w.write("A", "w2")
    w.dead.add("A")
    w.fail_over("B")
    _retry_unacked(w, ["w1", "w2"])


def test_a_primary_that_cannot_reach_the_coordinator_acknowledges_nothing_and_loses_nothing():
    """A forward fails and the drop cannot reach the coordinator: A acknowledges neither
    that write, nor its retry, nor the next; after A dies B is promoted and the retries
    are applied there exactly once."""
    runs, bad = explore(_unreachable_coordinator, steps=0)
    assert runs == len(("deliver", "lose", "lose-answer")) * 2 and not bad, report(bad)


# ---------------------------------------------------------------- the steps themselves
def test_a_backup_refuses_forwards_from_an_older_term_and_out_of_order():
    b = ReplicaState("backup")
    b.seeded_at(term=5, seq=10)
    with pytest.raises(RequestError, match=fencing.FENCED):
        b.check_replicate(term=4, seq=11)  # a deposed primary's forward
    with pytest.raises(RequestError, match="out of order"):
        b.check_replicate(term=5, seq=12)  # seq 11 was lost
    with pytest.raises(RequestError, match="seeded in term 5"):
        b.check_replicate(term=6, seq=11)  # not the primary that seeded it
    b.check_replicate(term=5, seq=11)
    with pytest.raises(RequestError, match=fencing.FENCED):
        b.seeded_at(term=4, seq=0)  # an older primary may not seed it either


def test_only_a_provably_current_backup_turns_primary():
    b = ReplicaState("backup")
    with pytest.raises(RequestError, match="not seeded"):
        b.configure(term=7, expect_term=5, min_seq=0)
    b.seeded_at(term=5, seq=10)
    with pytest.raises(RequestError, match="not provably current"):
        b.configure(term=7, expect_term=5, min_seq=11)  # it missed the catch-up
    with pytest.raises(RequestError, match="not provably current"):
        b.configure(term=7, expect_term=4, min_seq=10)  # attached in another term
    assert b.configure(term=7, expect_term=5, min_seq=10) and b.role == "primary"
    with pytest.raises(RequestError, match=fencing.FENCED):
        b.configure(term=6)  # a supervisor's stale order
    assert b.refused(f"{fencing.FENCED} newer term") and b.role == "deposed"
    with pytest.raises(RequestError, match=fencing.FENCED):
        b.configure(term=9)  # deposed for good


def test_the_coordinator_fences_before_it_promotes_and_attaches_only_in_the_current_term():
    w = World()
    _pair(w)
    old = w.coord.terms[0]
    offer = w.coord.fence(0)
    assert offer is not None and offer.address == "B" and offer.expect_term == old
    assert w.coord.terms[0] == offer.term > old
    with pytest.raises(RequestError, match=fencing.FENCED):  # the old primary's drop
        w.coord.drop_replica(_drop_request("B", term=old))
    assert w.coord.promote(0, 102, term=old) == ""  # a promotion of another term
    assert w.coord.promote(0, 102, term=offer.term) == "B" and w.coord.addresses[0] == "B"
    assert w.coord.fence(0) is None  # no backup attached now: nothing to promote
    assert not w.coord.attach_backup(0, "C", old, 0)  # seeded by the deposed primary
    assert w.coord.attach_backup(0, "C", offer.term, 3)
    assert w.coord.attached[0] == (offer.term, 3)


def _drop_request(address: str, term: int):
    from ps_server.proto import ps_pb2 as pb

    return pb.RegisterShardRequest(index=0, address=address, pid=101, term=term)


# ---------------------------------------------------------------- the harness can fail
def _without_fencing(monkeypatch) -> None:
    """The rules before terms: a drop is refused only to another pid, a backup applies any
    forward while it is a backup, a seeded backup is promoted whatever it holds, and the
    supervisor configures it before the coordinator knows (ps_server/coordinator/service.py
    had it)."""

    def drop_refusal(current_term, current_pid, term, pid):
        return None if not pid or pid == current_pid else "no longer the primary"

    def check_replicate(self, term, seq):
        if self.role != "backup" or not self.seeded:
            raise RequestError("FAILED_PRECONDITION", "not a seeded backup")

    def configure(self, term, expect_term=0, min_seq=0):
        if self.role == "backup":
            if not self.seeded:
                raise RequestError("FAILED_PRECONDITION", "not seeded")
            self.role = "primary"
            return True
        return False

    def promote_backup(coordinator, index, backup, pid, configure):
        if coordinator.backups[index] != backup:
            return False
        configure(backup, "", 0)
        coordinator.promote(index, pid, coordinator.terms[index])  # its answer was not read
        return True

    monkeypatch.setattr(fencing, "drop_refusal", drop_refusal)
    monkeypatch.setattr(fencing, "promote_backup", promote_backup)
    monkeypatch.setattr(ReplicaState, "check_replicate", check_replicate)
    monkeypatch.setattr(ReplicaState, "configure", configure)


def test_without_fencing_the_harness_finds_the_races(monkeypatch):
    """The scenarios above, under the rules the code had before terms: a drop that
    reaches the coordinator between the backup's promotion and the map's change leaves
    the map naming the old primary (clients wait on a dead address); with one pid for
    both, the deposed primary acknowledges writes the new primary never gets."""
    _without_fencing(monkeypatch)
    _, bad = explore(_promotion_while_the_primary_still_runs((101, 102)), steps=2)
    assert any("serves no client" in v for w in bad for v in w.violations()), report(bad)
    _, bad = explore(_promotion_while_the_primary_still_runs((101, 101)), steps=2)
    assert any("missing on primary" in v for w in bad for v in w.violations()), report(bad)
