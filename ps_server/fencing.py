"""The replication protocol's step logic: terms, sequence numbers, and who may do what.

Pure: no I/O, no clock, no locks (the supervisor steps at the end are handed the one
call they make, Configure). ``ps_server.shard.replica`` (a shard's side) and
``ps_server.coordinator.servicer`` (the map) call these steps under their own locks, the
supervisors (``ps_server.coordinator.service``) call the last two, and
``tests/test_replication_interleavings.py`` drives them all through every interleaving
of small scenarios. docs/replication.md is the protocol written out; in short:

State. The coordinator keeps, per index, the *term* of its current primary (a value of
its epoch, so unique and increasing), the attached backup and the term and sequence
number it was attached at. A replica keeps its role, the term it is in, and ``seq``:
how many mutations it has applied in its history (a seeded backup starts at its
primary's ``seq`` at the cut).

Messages. ``Configure(term, expect_term, min_seq)`` (supervisor → shard),
``Seed(term, seq)`` and ``Replicate(term, seq)`` (primary → backup),
``DropReplica(term, seq)`` (primary → coordinator) and ``attach(term, seq)``,
``fence``, ``promote(term)`` (supervisor → coordinator).

Invariants, each kept by one step below:

* F1 *A term is fenced before its successor acts.* ``fence`` moves the index to a new
  term before the backup is told to be primary; from then on the coordinator refuses the
  old primary's drop (:func:`drop_refusal`), and the promoted replica refuses its
  forwards (:meth:`ReplicaState.check_replicate`), so it can acknowledge nothing.
* F2 *A backup is gapless in its term.* It applies a forward only at ``seq = own + 1``
  and in the term it was seeded in; so having ``seq >= n`` in term ``t`` means it applied
  every mutation its term-``t`` primary applied up to ``n``.
* F3 *Only a provably current backup is promoted.* The primary acknowledges mutation
  ``n`` only after its attached backup applied ``n`` (or after the coordinator confirmed
  the drop, which detaches it: it is then never promoted). ``fence`` offers only the
  backup attached in the current term, and the backup turns primary only if its term is
  that term and its ``seq`` is at least the one it was attached at
  (:meth:`ReplicaState.configure`); by F2 it then holds every acknowledged mutation.
* F4 *A deposed primary never acknowledges again.* Told of a newer term (a forward or
  a drop refused as fenced), it turns ``deposed``, which serves nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ps_server.wire import RequestError

__all__ = [
    "FENCED",
    "ReplicaState",
    "Promotion",
    "drop_refusal",
    "attach_refusal",
    "promotion",
    "is_fenced",
    "seed_and_attach",
    "promote_backup",
]

#: Opens the details of every refusal that means "a newer term exists": a primary that
#: reads it on a forward's or a drop's refusal steps down (F4).
FENCED = "fenced:"


def is_fenced(details: str | None) -> bool:
    """Whether a refusal's details say that a newer term exists."""
    return bool(details) and FENCED in details


def _fenced(why: str) -> RequestError:
    return RequestError("FAILED_PRECONDITION", f"{FENCED} {why}")


@dataclass
class ReplicaState:
    """One replica's protocol state; every step raises RequestError to refuse."""

    role: str  # "primary", "backup" (serves no client) or "deposed" (serves nothing)
    term: int = 0
    seq: int = 0
    seeded: bool = False

    # -------------------------------------------------------------- primary side
    def forward(self) -> tuple[int, int]:
        """(term, seq) of the next mutation's forward."""
        return self.term, self.seq + 1

    def applied(self) -> None:
        """A mutation succeeded here (on a primary, or a backup's replay of one)."""
        self.seq += 1

    def refused(self, details: str) -> bool:
        """A forward or a drop was refused with `details`: step down if fenced (F4)."""
        if is_fenced(details):
            self.role = "deposed"
            return True
        return False

    def configure(self, term: int, expect_term: int = 0, min_seq: int = 0) -> bool:
        """`Configure` from the supervisor: a backup is promoted if provably current (F3);
        a primary adopts `term`. True if this promoted a backup."""
        if self.role == "deposed":
            raise _fenced(f"deposed in term {self.term}; configure refused")
        if term < self.term:
            raise _fenced(f"configure for term {term}, but this replica is in term {self.term}")
        if self.role == "primary":
            self.term = term
            return False
        if not self.seeded:
            raise RequestError("FAILED_PRECONDITION", "not seeded, cannot be promoted")
        if self.term != expect_term or self.seq < min_seq:
            raise RequestError(
                "FAILED_PRECONDITION",
                f"not provably current: seeded in term {self.term} with {self.seq} mutations "
                f"applied; the promotion needs term {expect_term} and at least {min_seq}",
            )
        self.role, self.term = "primary", term
        return True

    # -------------------------------------------------------------- backup side
    def check_seed(self, term: int) -> None:
        if term < self.term:
            raise _fenced(f"seed from term {term}, but this replica is in term {self.term}")
        if self.role != "backup":
            raise RequestError("FAILED_PRECONDITION", "only a backup is seeded")

    def seeded_at(self, term: int, seq: int) -> None:
        """The snapshot taken by the primary of `term` at its `seq` is loaded."""
        self.check_seed(term)
        self.term, self.seq, self.seeded = term, seq, True

    def check_replicate(self, term: int, seq: int) -> None:
        """May this backup apply the forward (`term`, `seq`)? (F1, F2)"""
        if term < self.term:
            raise _fenced(f"forward from term {term}, but this replica is in term {self.term}")
        if self.role != "backup":
            raise RequestError("FAILED_PRECONDITION", f"not a backup (role {self.role})")
        if not self.seeded:
            raise RequestError("FAILED_PRECONDITION", "not seeded yet")
        if term != self.term:
            raise RequestError(
                "FAILED_PRECONDITION", f"seeded in term {self.term}, not by the primary of {term}"
            )
        if seq != self.seq + 1:
            raise RequestError(
                "FAILED_PRECONDITION",
                f"forward {seq} out of order: {self.seq} applied (a forward was lost)",
            )


# ------------------------------------------------------------------ coordinator side
def drop_refusal(current_term: int, current_pid: int, term: int, pid: int) -> str | None:
    """Why the coordinator refuses a primary's `DropReplica`, or None (F1). A drop without
    a term (a primary never configured) falls back to comparing process ids."""
    if term:
        if term < current_term:
            return f"{FENCED} the drop is from term {term}; the index is in term {current_term}"
        return None
    if pid and pid != current_pid:
        return f"{FENCED} process {pid} is no longer the primary (process {current_pid} is)"
    return None


def attach_refusal(current_term: int, term: int, dropped: bool) -> str | None:
    """Why a seeded backup is not attached, or None: its primary dropped it, or it was
    seeded in another term than the index's (its primary was replaced meanwhile)."""
    if dropped:
        return "its primary dropped it before it was attached (it missed an update)"
    if term != current_term:
        return f"it was seeded in term {term}, but the index is in term {current_term}"
    return None


@dataclass(frozen=True)
class Promotion:
    """What `fence` decided: promote `address` into `term` if it proves current."""

    address: str
    term: int
    expect_term: int
    min_seq: int


def promotion(
    backup: str, attached: tuple[int, int] | None, current_term: int, new_term: int
) -> Promotion | None:
    """The promotion `fence` may offer (F3): only the backup attached in the current term,
    which must still be in that term and at its attach `seq` or later."""
    if not backup or attached is None or attached[0] != current_term:
        return None
    return Promotion(backup, new_term, attached[0], attached[1])


# ------------------------------------------------------------------ supervisor steps
#: ``configure(address, backup, term, expect_term, min_seq) -> Ack``: the supervisor's
#: Configure call to one shard; raises (grpc.RpcError) when the shard refuses or is gone.
Configure = Callable[..., Any]


def seed_and_attach(
    coordinator: Any, index: int, backup: str, configure: Configure, resync: bool = True
) -> Any | None:
    """Have the primary of `index` seed `backup` and forward to it, then attach it at the
    term and sequence number the seed happened in. The Configure's answer (bytes seeded,
    seq), or None if the coordinator refused the attach (``attach_refusal``). Used by the
    supervisors for a new backup, and for a replica seeded on another host to hand over to."""
    with coordinator.cond:
        target, term = coordinator.addresses[index], coordinator.terms[index]
    ack = configure(target, backup, term)
    return ack if coordinator.attach_backup(index, backup, term, ack.seq, resync) else None


def promote_backup(
    coordinator: Any,
    index: int,
    backup: str,
    pid: int,
    configure: Configure,
    min_seq: int = 0,
    planned: bool = False,
) -> bool:
    """Promote `backup` (process `pid`) to primary of `index`: fence the old term first
    (F1), then have the backup prove it is current and turn primary (F3), then name it in
    the map. False if `backup` is not the promotable one; raises if it refused. A planned
    hand-over (a move) passes the seq at which the live primary stepped down as `min_seq`:
    the copy must have every update that primary acknowledged."""
    offer = coordinator.fence(index)
    if offer is None or offer.address != backup:
        return False
    configure(backup, "", offer.term, offer.expect_term, max(offer.min_seq, min_seq))
    return bool(coordinator.promote(index, pid, offer.term, planned=planned))
