"""Every timeout and retention of the PS, in one table, with the relations between them.

The settable ones come from the environment (the README's table lists them) and are
read when a component starts, so a service or a test sets them first; a value that is
not a number of seconds above zero is refused with the variable's name, and one that
breaks a relation below is logged as a warning (tests shorten them on purpose). The
others are constants here, each derived from what it must outlast.

Relations (each checked by ``tests/test_timeouts.py``):

* a client's blocking call waits at most :data:`MAX_WAIT_SECONDS`; its gRPC deadline is
  its wait plus :data:`DEADLINE_MARGIN_SECONDS`, so the coordinator answers first;
* the coordinator keeps an idle entry for ``SPARK_PS_COORDINATOR_TTL`` > the longest
  wait, so nothing is dropped under a call still waiting on it;
* a shard's rendezvous topic idles for ``SPARK_PS_RENDEZVOUS_TTL`` > its longest wait;
* a replica remembers answers for ``SPARK_PS_RETRY_HORIZON`` >= a client's default
  rpcTimeout plus its retry window (:data:`CLIENT_RETRY_WINDOW`), so a retry is answered
  from memory, never applied again;
* a forward waits as long as its client does (the client's deadline), or
  :data:`FORWARD_SECONDS` when it set none; a seed's deadline grows with its bytes
  (:func:`seed_seconds`), and the supervisor's Configure waits for the longest seed a
  shard's memory budget allows (:func:`configure_seconds`).
"""

from __future__ import annotations

import logging
import os

__all__ = [
    "ENV",
    "MAX_WAIT_SECONDS",
    "DEFAULT_WAIT_SECONDS",
    "DEADLINE_MARGIN_SECONDS",
    "CLIENT_RPC_TIMEOUT",
    "CLIENT_RETRY_WINDOW",
    "FORWARD_SECONDS",
    "DROP_CONFIRM_SECONDS",
    "SEED_BYTES_PER_SECOND",
    "CUT_SECONDS",
    "REGISTER_CALL_SECONDS",
    "REGISTER_SECONDS",
    "TASK_LEASE_SECONDS",
    "QUICK_DEATH_SECONDS",
    "HOST_LEASE_SECONDS",
    "RENDEZVOUS_MAX_WAIT_SECONDS",
    "seconds",
    "retry_horizon",
    "coordinator_ttl",
    "rendezvous_ttl",
    "handshake_timeout",
    "connect_timeout",
    "seed_seconds",
    "configure_seconds",
]

log = logging.getLogger("ps_server.timeouts")

# ------------------------------------------------------------------ constants
#: The longest any blocking coordinator call waits, whatever its request asks.
MAX_WAIT_SECONDS = 3600.0
#: What the client's blocking calls (barrier, clock, wait, collect) ask for by default.
DEFAULT_WAIT_SECONDS = 600.0
#: The client's gRPC deadline for a blocking call is its `timeout` plus this.
DEADLINE_MARGIN_SECONDS = 10.0
#: A client's defaults: seconds per PS call (``spark.ps.rpcTimeout``) and how long it
#: retries an unavailable PS (``PSClient(retry_seconds=)``).
CLIENT_RPC_TIMEOUT = 120.0
CLIENT_RETRY_WINDOW = 90.0
#: A forward's deadline when its client set none (else the client's own: a backup is
#: dropped, and replaced, only when it is slower than the client is willing to wait).
FORWARD_SECONDS = 60.0
#: One attempt to have the coordinator forget a dropped backup (the client's retries
#: drive the next ones; the mutation lock is held meanwhile, so it is short).
DROP_CONFIRM_SECONDS = 2.0
#: A seed's deadline grows by one second per this many bytes (beyond FORWARD_SECONDS).
SEED_BYTES_PER_SECOND = 10e6
#: The supervisor's Configure (which seeds a backup) waits at least this long.
_CONFIGURE_FLOOR_SECONDS = 300.0
#: A checkpoint waits this long for the mutations in flight to finish (its cut).
CUT_SECONDS = 300.0
#: A shard's RegisterShard call, and how long it keeps retrying one.
REGISTER_CALL_SECONDS = 5.0
REGISTER_SECONDS = 30.0
#: A task-queue lease lapses after this long without the worker finishing or renewing.
TASK_LEASE_SECONDS = 60.0
#: A shard that dies within this long of starting, twice in a row, is restarted with
#: back-off.
QUICK_DEATH_SECONDS = 10.0
#: A host that has not reported for this long is lost (``--host-timeout``'s default).
HOST_LEASE_SECONDS = 10.0
#: The longest one rendezvous step waits on a shard.
RENDEZVOUS_MAX_WAIT_SECONDS = 60.0

#: The settable ones: environment variable -> (default seconds, what it must exceed, why).
ENV: dict[str, tuple[float, float, str]] = {
    "SPARK_PS_RETRY_HORIZON": (
        300.0,
        CLIENT_RPC_TIMEOUT + CLIENT_RETRY_WINDOW,
        "a client's default rpcTimeout plus its retry window",
    ),
    "SPARK_PS_COORDINATOR_TTL": (
        7200.0,
        MAX_WAIT_SECONDS,
        "the longest wait a coordinator call may ask for",
    ),
    "SPARK_PS_RENDEZVOUS_TTL": (
        3600.0,
        RENDEZVOUS_MAX_WAIT_SECONDS,
        "the longest wait of a rendezvous step",
    ),
    "SPARK_PS_HANDSHAKE_TIMEOUT": (10.0, 0.0, "no relation"),
    "SPARK_PS_CONNECT_TIMEOUT": (10.0, 0.0, "no relation"),
}


def seconds(name: str) -> float:
    """The value of the settable timeout `name` (a key of :data:`ENV`): its environment
    variable, or its default. ValueError naming the variable if it is not a number of
    seconds above zero; a warning if it is not above what it must exceed."""
    default, floor, why = ENV[name]
    raw = os.environ.get(name, "")
    if not raw.strip():
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not a number of seconds") from None
    if not value > 0:
        raise ValueError(f"{name}={raw!r}: must be more than 0 seconds (default {default:g})")
    if not value > floor:
        log.warning(
            "%s=%s is not above %g seconds (%s; default %g): see ps_server/timeouts.py",
            name,
            raw,
            floor,
            why,
            default,
        )
    return value


def retry_horizon() -> float:
    """Seconds a replica remembers each answer ($SPARK_PS_RETRY_HORIZON)."""
    return seconds("SPARK_PS_RETRY_HORIZON")


def coordinator_ttl() -> float:
    """Seconds an unused coordinator entry is kept ($SPARK_PS_COORDINATOR_TTL)."""
    return seconds("SPARK_PS_COORDINATOR_TTL")


def rendezvous_ttl() -> float:
    """Seconds a rendezvous topic may sit idle on a shard ($SPARK_PS_RENDEZVOUS_TTL)."""
    return seconds("SPARK_PS_RENDEZVOUS_TTL")


def handshake_timeout() -> float:
    """Seconds a direct-lane connection has to send its first frame
    ($SPARK_PS_HANDSHAKE_TIMEOUT)."""
    return seconds("SPARK_PS_HANDSHAKE_TIMEOUT")


def connect_timeout() -> float:
    """Seconds a client keeps trying a PS address it never reached
    ($SPARK_PS_CONNECT_TIMEOUT)."""
    return seconds("SPARK_PS_CONNECT_TIMEOUT")


def seed_seconds(nbytes: int) -> float:
    """A seed's deadline for a snapshot of `nbytes`."""
    return FORWARD_SECONDS + nbytes / SEED_BYTES_PER_SECOND


def configure_seconds(memory_budget_bytes: int = 0) -> float:
    """The supervisor's Configure deadline: the seed of a shard as large as its memory
    budget (``--shard-memory-mb``; 0 = none: the floor of 300 s)."""
    return max(_CONFIGURE_FLOOR_SECONDS, seed_seconds(memory_budget_bytes))
