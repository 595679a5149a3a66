"""Process plumbing shared by the service and its shards: no orphans, clean stops."""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import subprocess
import time
from collections.abc import Iterable

import grpc

from ps_server import timeouts
from ps_server.proto import ps_pb2 as pb
from ps_server.proto import ps_pb2_grpc as pb_grpc
from ps_server.wire import TOKEN_KEY

__all__ = [
    "StopSignals",
    "die_with_parent",
    "keep_freed_memory",
    "huge_page_advice",
    "huge_page_advice_on",
    "register_with_coordinator",
    "shard_env",
    "stop_processes",
    "wait_for_parent_or_stop",
]

log = logging.getLogger("ps_server")
_PR_SET_PDEATHSIG = 1

# One shard per core: BLAS-1 vector ops are memory-bound, and OpenBLAS's own threads
# (spinning between calls) cost ~10x the CPU of the work on a busy machine (a shard's
# 66 dot products over 556k entries: ~280 ms CPU threaded vs ~30 ms single-threaded).
_BLAS_THREAD_VARS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


def shard_env(token: str) -> dict[str, str]:
    """The environment a shard process starts with (``python -m ps_server.shard``, from
    the coordinator's service or a host supervisor): this one, the token (never in argv)
    and single-threaded BLAS unless the operator chose otherwise."""
    env = dict(os.environ, SPARK_PS_TOKEN=token)
    for var in _BLAS_THREAD_VARS:
        env.setdefault(var, "1")
    return env


def stop_processes(procs: Iterable[subprocess.Popen], grace: float = 5.0) -> None:
    """SIGTERM every live process, then SIGKILL those still alive after `grace` seconds;
    returns once all have exited (all are asked at once, so stopping N costs one grace)."""
    procs = list(procs)
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def die_with_parent() -> None:
    """Ask Linux to SIGTERM us when our parent dies (the watch loop covers other OSes)."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except OSError:
        pass


_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc mallopt parameters
MALLOC_ENV = "SPARK_PS_MALLOC"  # "default" leaves glibc's policy alone


def keep_freed_memory(mmap_mb: int = 32, trim_mb: int = 256) -> bool:
    """Let glibc reuse freed message buffers instead of returning them to the kernel.

    Why: every request and answer allocates and frees buffers of hundreds of KB to MBs.
    By default glibc serves those with fresh ``mmap``s (or trims the heap top after a
    free), so the next message page-faults its memory in again: on this project's VMs
    that tripled the cost of a 1.5 MB gRPC round trip (13.3 ms vs 5.9 ms). Blocks up to
    `mmap_mb` now come from the heap, and up to `trim_mb` of free heap top is kept.
    Returns whether the policy was set (glibc only; ``SPARK_PS_MALLOC=default`` opts out).
    """
    if os.environ.get(MALLOC_ENV, "") == "default":
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
        ok = libc.mallopt(_M_MMAP_THRESHOLD, int(mmap_mb) << 20)
        return bool(ok and libc.mallopt(_M_TRIM_THRESHOLD, int(trim_mb) << 20))
    except (OSError, AttributeError):
        return False


HUGEPAGE_ENV = "NUMPY_MADVISE_HUGEPAGE"  # numpy's own switch: when set, numpy's choice stands


def huge_page_advice(enabled: bool) -> bool | None:
    """Whether numpy asks the kernel for transparent huge pages on its large arrays; returns
    the setting before, or None when left alone (an operator who set
    ``NUMPY_MADVISE_HUGEPAGE`` keeps numpy's choice; a numpy without the switch).

    Why off in workers and shards: numpy advises huge pages (``MADV_HUGEPAGE``) on every
    array of 4 MB or more, and under the kernel's default ``defrag=madvise`` the first
    touch of such memory compacts memory on the spot when no huge page is free. A fit's big
    arrays are fresh ``mmap``s (a partition's rows and key ids, a shard's dense key set),
    so once the machine's memory is fragmented each read stalls: a 64 MB fill took 0.15 s
    against 0.025 s with 4 KB pages, and a 2^24-feature LR fit on 1M rows read its rows in
    1.61 s against 1.91 s (medians of five alternating fits; one with the advice spent
    2.2 s instead of 0.2 s numbering a partition's keys). GBT fits took the same time.
    """
    if os.environ.get(HUGEPAGE_ENV) is not None:
        return None
    setter = getattr(_multiarray(), "_set_madvise_hugepage", None)
    return None if setter is None else bool(setter(bool(enabled)))


def huge_page_advice_on() -> bool | None:
    """Whether numpy advises huge pages on its big arrays now (None: this numpy has no
    such switch); what :func:`huge_page_advice` changes."""
    getter = getattr(_multiarray(), "_get_madvise_hugepage", None)
    return None if getter is None else bool(getter())


def _multiarray():
    try:
        from numpy._core import multiarray
    except ImportError:  # numpy 1.x
        from numpy.core import multiarray
    return multiarray


def register_with_coordinator(
    address: str,
    token: str,
    index: int,
    own: str,
    timeout: float = timeouts.REGISTER_SECONDS,
    backup: bool = False,
    launch: tuple[str, int] = ("", 0),
) -> None:
    """Tell the coordinator where shard `index` (or a backup of it) listens; retried.

    `launch`: (host id, launch number) of a shard a host's supervisor started.
    """
    host_id, incarnation = launch
    deadline = time.monotonic() + timeout
    from ps_server.tls import env_ca, open_channel

    with open_channel(address, env_ca()) as ch:
        stub = pb_grpc.CoordinatorStub(ch)
        while True:
            try:
                stub.RegisterShard(
                    pb.RegisterShardRequest(
                        index=index,
                        address=own,
                        pid=os.getpid(),
                        backup=backup,
                        host_id=host_id,
                        incarnation=incarnation,
                    ),
                    metadata=((TOKEN_KEY, token),),
                    timeout=timeouts.REGISTER_CALL_SECONDS,
                )
                return
            except grpc.RpcError as e:  # a superseded launch is refused for good
                if e.code() == grpc.StatusCode.FAILED_PRECONDITION:
                    raise
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)


class StopSignals:
    """SIGTERM/SIGINT, recorded without taking a lock; the main loop polls :meth:`__bool__`.

    Why not ``threading.Event.set`` in the handler: Python runs a handler on the main
    thread between two bytecodes, possibly inside that same Event's lock (in the ``set``
    a previous signal's handler was running), and the lock is not reentrant. A service
    orphaned by a SIGKILLed parent was seen stuck exactly so, three handlers deep, its
    shards alive for good (CI, test_embedded_ps_leaves_no_process_behind[kill]).
    """

    def __init__(self) -> None:
        self.received: list[int] = []

    def install(self) -> StopSignals:
        """Handle SIGTERM and SIGINT from now on (call from the main thread)."""
        signal.signal(signal.SIGTERM, self.handle)
        signal.signal(signal.SIGINT, self.handle)
        return self

    def handle(self, signum, frame) -> None:
        self.received.append(signum)  # a list append takes no lock a handler could wait on

    def __bool__(self) -> bool:
        return bool(self.received)


def wait_for_parent_or_stop(server: grpc.Server) -> None:
    """Serve until SIGTERM/SIGINT or our parent process goes away."""
    parent = os.getppid()
    signals = StopSignals().install()
    while not signals:
        time.sleep(0.2)
        if os.getppid() != parent:
            log.info("parent %d is gone; stopping", parent)
            break
    server.stop(grace=1).wait()
