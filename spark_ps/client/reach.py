"""Can this process reach the PS? A TCP probe that fails in seconds, with what to change.

Why: a client retries an unavailable PS for ``retry_seconds`` (90 s), which is right for a
shard or coordinator that restarts, and wrong for one that was never reachable: an
executor on another host than an embedded PS bound to the driver's loopback spent two
minutes in ``GetShardMap`` before failing with gRPC's "failed to connect to all
addresses". A process's first client of a PS (:func:`spark_ps.client.get_client`) probes
the coordinator and every shard with plain TCP connects instead: a refusal or a timeout is
retried for :func:`connect_timeout` seconds (re-reading the shard map: a restarted shard
has a new port), then :class:`PSUnreachable` names the address, this host, and the
settings to change. The driver relaunches a worker job that failed so only when it cannot
reach the PS either (the PS is restarting, not out of the executors' reach).

The probe is a TCP handshake only: it needs no token and speaks no TLS, so it tells
"nothing listens there, or the network does not let us in" apart from the errors that
the RPCs report themselves.
"""

from __future__ import annotations

import re
import socket
import time
from collections.abc import Callable, Iterable

from ps_server import timeouts

__all__ = [
    "PSUnreachable",
    "check_reachable",
    "connect_timeout",
    "reaches",
    "unreachable_in",
    "unreachable_message",
]

#: Seconds a never-reached PS address is retried before :class:`PSUnreachable`;
#: the environment variable overrides it (on executors: ``spark.executorEnv.<it>``).
CONNECT_TIMEOUT_ENV = "SPARK_PS_CONNECT_TIMEOUT"
_PREFIX = "spark-ps: cannot reach the PS"
_LINE = re.compile(re.escape(_PREFIX) + r"[^\n]*")


class PSUnreachable(ConnectionError):
    """This process cannot open a TCP connection to a PS address (coordinator or shard)."""


def connect_timeout() -> float:
    """Seconds to keep trying an address never reached (``SPARK_PS_CONNECT_TIMEOUT``, 10;
    read in ``ps_server.timeouts`` with the PS's other timeouts)."""
    return timeouts.connect_timeout()


def _split(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"PS address {address!r} is not host:port")
    return host.strip("[]"), int(port)


def _this_host(host: str, port: int) -> str:
    """How other hosts name this one: the local address of the route to (host, port), or,
    for a loopback target, this host's non-loopback IPv4 addresses."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((host, port))  # UDP: picks a route, sends nothing
            local = s.getsockname()[0]
        if not local.startswith("127."):
            return local
    except OSError:
        pass
    import psutil

    addresses = [
        a.address
        for nic in psutil.net_if_addrs().values()
        for a in nic
        if a.family == socket.AF_INET and not a.address.startswith("127.")
    ]
    return ", ".join(addresses[:3]) or socket.gethostname()


def check_reachable(
    addresses: Iterable[str],
    timeout: float | None = None,
    refresh: Callable[[], Iterable[str]] | None = None,
) -> None:
    """Open (and close) a TCP connection to every ``host:port``, retrying a refusal or a
    timeout until `timeout` seconds (default :func:`connect_timeout`) have passed.

    `refresh`, if given, is called after each failed attempt for the addresses to probe
    from then on (a shard map re-read: a restarted shard has a new address).

    Raises
    ------
    PSUnreachable
        Naming the address that never accepted, this host, and the settings.
    """
    timeout = connect_timeout() if timeout is None else timeout
    deadline = time.monotonic() + timeout
    pending = list(dict.fromkeys(addresses))
    while pending:
        host, port = _split(pending[0])
        left = deadline - time.monotonic()
        try:
            socket.create_connection((host, port), timeout=max(0.2, min(left, 3.0))).close()
            pending.pop(0)
            continue
        except OSError as e:
            if time.monotonic() + 0.2 >= deadline:
                raise PSUnreachable(unreachable_message(pending[0], e, timeout)) from None
        time.sleep(0.2)
        if refresh is not None:
            pending = list(dict.fromkeys(refresh()))


def reaches(addresses: Iterable[str], timeout: float = 2.0) -> bool:
    """Does this process reach every address within `timeout` seconds?"""
    try:
        check_reachable(addresses, timeout)
    except PSUnreachable:
        return False
    return True


def unreachable_message(address: str, error: BaseException, timeout: float) -> str:
    """One line: the address, who could not reach it, why, and what to set."""
    host, port = _split(address)
    return (
        f"{_PREFIX} at {address} from host {_this_host(host, port)} "
        f"({error or type(error).__name__}; tried for {timeout:.0f} s). An embedded PS "
        "binds spark.ps.host (default: loopback with a local master, spark.driver.host "
        "with a cluster master): set spark.ps.host to an address of the driver that every "
        "executor can reach, or point spark.ps.address at a PS service they can reach "
        "(and let its ports through any firewall)"
    )


def unreachable_in(text: str) -> str | None:
    """The :class:`PSUnreachable` line inside `text` (e.g. a Spark job's error), or None."""
    found = _LINE.search(text)
    return found.group(0) if found else None
