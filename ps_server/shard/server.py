"""One PS shard: a gRPC server holding slices of models (the data plane).

Run as `python -m ps_server.shard --index I --coordinator HOST:PORT`; the token
comes from the SPARK_PS_TOKEN environment variable, never from argv.
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
import threading
import time
from collections.abc import Callable
from concurrent import futures

import grpc
import numpy as np

from ps_server import checkpoint, lifecycle, timeouts, tls
from ps_server.auth import TokenInterceptor, is_loopback
from ps_server.proto import ps_pb2 as pb
from ps_server.proto import ps_pb2_grpc as pb_grpc
from ps_server.requests import STATS, RequestStatsInterceptor
from ps_server.shard import snapshot, storage
from ps_server.shard.cut import Cut
from ps_server.shard.direct import DirectServer, Payload
from ps_server.shard.replica import MUTATIONS, REQUEST_ID_KEY, Replica, digest, request_id
from ps_server.shard.tensors import ShardMemory, Tensor
from ps_server.wire import (
    DEFAULT_MAX_REQUEST_MB,
    RequestError,
    RequestLimitInterceptor,
    from_array,
    guard,
    server_options,
    to_array,
)

__all__ = ["ShardServicer", "serve_shard", "main"]

log = logging.getLogger("ps_server.shard.server")

_guard = guard(lambda self: f"shard {self.index}")
#: Seconds a checkpoint waits for the mutations in flight to end before it gives up.
CUT_TIMEOUT = timeouts.CUT_SECONDS
_HANDLERS: dict[str, Callable] = {}  # undecorated handlers of MUTATIONS, for backups


def _always(self, request) -> bool:
    return True


def _never(self, request) -> bool:
    return False


def _replicated(mutates: Callable[[object, object], bool] = _always) -> Callable:
    """Route a client RPC through the shard's Replica (when replication is on).

    A backup refuses it; a request for which `mutates(self, request)` holds is applied
    once per request id and forwarded to the backup before it is answered.
    """

    def decorate(method: Callable) -> Callable:
        name = method.__name__
        if name in MUTATIONS:
            _HANDLERS[name] = method

        def wrapper(self, request, context):
            rep = self.replica
            if rep is not None:
                rep.check_serving()
            if not mutates(self, request):
                return method(self, request, context)
            with self.cut.shared():  # no snapshot sees it half applied
                rep = self.replica  # again: a solo shard may have turned primary meanwhile
                if rep is None:
                    return method(self, request, context)
                run = lambda: method(self, request, context)  # noqa: E731
                left = context.time_remaining() if context is not None else None
                return rep.apply(name, request, request_id(context), run, left)

        wrapper.__name__ = name
        return wrapper

    return decorate


def _creates_on_pull(self, name: str) -> bool:
    t = self.models.get(name)
    return t is not None and t.spec.create_on_pull


def _pull_creates_rows(self, request) -> bool:
    return _creates_on_pull(self, request.model) and not request.by_range


_READ_ONLY_VECTOR_OPS = ("dot", "nrm2", "sum")


def _vector_op_writes(self, request) -> bool:
    return request.op not in _READ_ONLY_VECTOR_OPS


def _call_writes(self, request) -> bool:
    module, _, fn = request.function.partition(".")
    if not module.isidentifier():
        return True  # let the call itself report the bad name
    try:
        return fn not in getattr(_server_module(module), "READ_ONLY", ())
    except RequestError:
        return True  # let the call itself report the bad name


class _LaneContext:
    """What a handler reads of its gRPC context, for a request from the direct lane."""

    def __init__(self, request_id: str) -> None:
        self._metadata = ((REQUEST_ID_KEY, request_id),) if request_id else ()

    def invocation_metadata(self):
        return self._metadata

    def time_remaining(self) -> None:
        return None  # the lane carries no deadline: the client waits on its socket

    def abort(self, code: grpc.StatusCode, details: str):
        raise RequestError(code.name, details)


class ShardServicer(pb_grpc.ShardServicer):
    """Serves pull/push/reduce/vector ops for the model slices this shard owns."""

    def __init__(self, index: int = 0, memory_budget: int = 0):
        self.index = index
        self.models: dict[str, Tensor] = {}
        self.memory = ShardMemory(index, memory_budget, lambda: self.models)
        self._lock = threading.Lock()
        self.cut = Cut()  # mutations share it; a checkpoint's copy excludes them
        #: Where Checkpoint/Restore may write/read (None: anywhere; see main())
        self.checkpoint_roots: list[str] | None = None
        self.replica: Replica | None = None  # set when the service runs with --replicas 2
        #: Across hosts, a solo shard's Replica-to-be: made when it is first configured (a
        #: move seeds a copy from it, ps_server.coordinator.migrate); until then it runs as solo.
        self.become_primary: Callable[[], Replica] | None = None
        self.direct: DirectServer | None = None  # the direct lane (see serve_shard)

    @property
    def direct_port(self) -> int:
        """The direct lane's port (0: none, clients use gRPC only)."""
        return self.direct.port if self.direct is not None else 0

    def adopt(self, models: dict[str, Tensor]) -> None:
        """Take restored models in (they count against this shard's memory budget)."""
        for t in models.values():
            t.memory = self.memory
        self.models.update(models)

    def tensor(self, name: str) -> Tensor:
        t = self.models.get(name)
        if t is None:
            raise RequestError(
                "NOT_FOUND",
                f"shard {self.index}: unknown model {name!r} "
                f"(known: {', '.join(sorted(self.models)) or 'none'})",
            )
        return t

    @_guard
    @_replicated()
    def CreateModel(self, request, context):
        spec = request.spec
        with self._lock:
            old = self.models.get(spec.name)
            if old is not None:
                if request.exist_ok and old.spec == spec:
                    return old.info()
                raise RequestError(
                    "ALREADY_EXISTS",
                    f"shard {self.index}: model {spec.name!r} exists with kind={old.spec.kind} "
                    f"dim={old.spec.dim} cols={old.spec.cols} dtype={old.spec.dtype}; "
                    f"asked for kind={spec.kind} dim={spec.dim} cols={spec.cols} "
                    f"dtype={spec.dtype}",
                )
            t = Tensor.create(spec, self.memory)
            self.models[spec.name] = t
            return t.info()

    @_guard
    @_replicated()
    def DropModel(self, request, context):
        with self._lock:
            return pb.Ack(value=int(self.models.pop(request.name, None) is not None))

    @_guard
    @_replicated(_never)
    def ListModels(self, request, context):
        return pb.ModelList(models=[t.info() for t in list(self.models.values())])

    @_guard
    @_replicated(_pull_creates_rows)
    def Pull(self, request, context):
        keys, values = self._pull(request)
        answer = pb.PullResponse(values=to_array(values))
        if keys is not None:
            answer.keys.CopyFrom(to_array(keys))
        return answer

    def _pull(self, request: pb.PullRequest) -> tuple[np.ndarray | None, np.ndarray]:
        """(keys when the shard chose them (a sparse by-range pull) else None, values)."""
        t = self.tensor(request.model)
        if request.by_range:
            return t.pull_range(request.start, request.stop, request.slot)
        what = f"Pull from {t.where} on shard {self.index}"
        keys = t.check_keys(from_array(request.keys, what), what)
        return None, t.pull(keys, request.slot)

    @_guard
    @_replicated()
    def Push(self, request, context):
        t = self.tensor(request.model)
        what = f"Push to {t.where} on shard {self.index}"
        if request.by_range:
            if request.aggregate:
                raise RequestError("INVALID_ARGUMENT", f"{what}: a contribution needs keys")
            values = from_array(request.values, f"values of {what}")
            return pb.Ack(value=t.push_range(request.start, values, request.op, what))
        keys, values = t.check_push(
            from_array(request.keys, f"keys of {what}"),
            from_array(request.values, f"values of {what}"),
            what,
        )
        if request.aggregate:
            return pb.Ack(
                value=t.contribute(request.round, request.part, request.chunk, keys, values)
            )
        return pb.Ack(value=t.push(keys, values, request.op))

    @_guard
    @_replicated()
    def Reduce(self, request, context):
        t = self.tensor(request.model)
        return pb.Ack(value=t.reduce(request.round, request.op, request.zero_first, request.how))

    @_guard
    @_replicated(_vector_op_writes)
    def VectorOp(self, request, context):
        tensors = [self.tensor(n) for n in request.models]
        return pb.Scalar(value=vector_op(request, tensors))

    @_guard
    @_replicated(_call_writes)
    def Call(self, request, context):
        return self._call(request)

    def direct_call(self, request: pb.CallRequest) -> pb.CallResponse:
        """A plain ``Call`` frame from the direct lane (:mod:`ps_server.shard.direct`), which
        carries no request id: the same answer, for functions that change no model state
        only (nothing to replicate or deduplicate): a module's READ_ONLY functions, on
        models whose reads create no rows."""
        if not self._reads_only(request):
            raise RequestError(
                "FAILED_PRECONDITION",
                f"shard {self.index}: the direct lane serves only read-only functions on "
                f"models whose reads create no rows; call {request.function!r} through gRPC",
            )
        return self._call(request)

    def _reads_only(self, request: pb.CallRequest) -> bool:
        """Whether a call changes no state (checked as a read is: a backup refuses it, an
        unknown function is NOT_FOUND, as on gRPC)."""
        if self.replica is not None:
            self.replica.check_serving()
        _server_function(request.function)
        creates = any(_creates_on_pull(self, n) for n in request.models)
        return not creates and not _call_writes(self, request)

    def direct_rpc(self, rpc: str, request, request_id: str):
        """A typed frame from the direct lane (:data:`ps_server.shard.direct.RPCS`): the
        gRPC handler itself runs what may write (the same checks, replication and
        remembered answers under `request_id`); a pull that changes nothing answers its
        arrays raw (:class:`Payload`), and a read-only call runs as on gRPC."""
        t, ok = time.perf_counter(), False
        try:
            if rpc == "Pull" and not _pull_creates_rows(self, request):  # a read: raw answer
                if self.replica is not None:
                    self.replica.check_serving()
                keys, values = self._pull(request)
                arrays = {"values": values} if keys is None else {"values": values, "keys": keys}
                answer = Payload(pb.PullResponse(), **arrays)
            elif rpc == "Call" and self._reads_only(request):
                answer = self._call(request)
            else:
                answer = getattr(self, rpc)(request, _LaneContext(request_id))
            ok = True
            return answer
        finally:
            STATS.record(rpc, time.perf_counter() - t, ok, getattr(request, "model", ""))

    def _call(self, request: pb.CallRequest) -> pb.CallResponse:
        fn = _server_function(request.function)
        tensors = [self.tensor(n) for n in request.models]
        arrays = [
            from_array(a, f"array {i} of Call {request.function}")
            for i, a in enumerate(request.arrays)
        ]
        try:
            args = json.loads(request.args) if request.args else {}
        except json.JSONDecodeError as e:
            raise RequestError(
                "INVALID_ARGUMENT", f"Call {request.function}: bad JSON: {e}"
            ) from None
        result, out = fn(tensors, args, arrays)
        return pb.CallResponse(result=json.dumps(result), arrays=[to_array(a) for a in out])

    @_guard
    @_replicated(_never)
    def Checkpoint(self, request, context):
        checkpoint.check_under_roots(request.uri, self.checkpoint_roots, f"shard {self.index}")
        with self.cut.exclusive(CUT_TIMEOUT, f"shard {self.index}: checkpoint"):
            with self._lock:
                models = {n: t for n, t in self.models.items() if n.startswith(request.prefix)}
            arrays = snapshot.model_arrays(models)  # copies: written with no lock held
        path, nbytes = checkpoint.save_arrays(request.uri, request.version, self.index, arrays)
        return pb.CheckpointResponse(path=path, nbytes=nbytes, num_models=len(models))

    @_guard
    @_replicated()
    def Restore(self, request, context):
        checkpoint.check_under_roots(request.uri, self.checkpoint_roots, f"shard {self.index}")
        models = snapshot.load_shard(request.uri, request.version, self.index)
        if request.prefix:
            models = {n: t for n, t in models.items() if n.startswith(request.prefix)}
        with self._lock:  # models created since the snapshot are kept
            self.adopt(models)
        return pb.CheckpointResponse(num_models=len(models))

    @_guard
    def Health(self, request, context):
        models = list(self.models.values())
        return pb.HealthResponse(
            index=self.index,
            num_models=len(models),
            nbytes=sum(t.store.nbytes for t in models),
            pid=os.getpid(),
            direct_port=self.direct_port,
        )

    @_guard
    def Replicate(self, request, context):
        return self._replica().replicate(request, _HANDLERS)

    @_guard
    def ReplicateBatch(self, request, context):
        rep = self._replica()
        for r in request.requests:
            rep.replicate(r, _HANDLERS)
        return pb.Ack(value=len(request.requests))

    @_guard
    def Seed(self, request_iterator, context):
        return pb.Ack(value=self._replica().seed(request_iterator))

    @_guard
    def Configure(self, request, context):
        if self.replica is None and self.become_primary is not None:
            try:  # after the mutations in flight: every later one goes through the Replica
                with self.cut.exclusive(60.0, f"shard {self.index}: turning primary"):
                    if self.replica is None:
                        self.replica = self.become_primary()
            except TimeoutError as e:
                raise RequestError("UNAVAILABLE", str(e)) from None
        return self._replica().configure(request)

    @_guard
    def Digest(self, request, context):
        if self.replica is None:
            return pb.DigestResponse(digest=digest(self.models), role="solo")
        return self.replica.describe()

    def _replica(self) -> Replica:
        if self.replica is None:
            raise RequestError(
                "FAILED_PRECONDITION", f"shard {self.index}: replication is off (--replicas 1)"
            )
        return self.replica


def vector_op(request: pb.VectorOpRequest, tensors: list[Tensor]) -> float:
    """Element-wise/reduction ops over co-located dense slices; returns this shard's partial."""
    op = request.op
    arity = {"axpy": 2, "copy": 2, "dot": 2, "scale": 1, "nrm2": 1, "sum": 1, "fill": 1}
    if op != "kernel" and len(tensors) != arity.get(op, -1):
        if op not in arity:
            raise RequestError("INVALID_ARGUMENT", f"unknown vector op {op!r}")
        raise RequestError("INVALID_ARGUMENT", f"{op} takes {arity[op]} models, got {len(tensors)}")
    first = tensors[0].spec if tensors else None
    for t in tensors:
        if (t.spec.dim, t.spec.cols, t.spec.offset) != (first.dim, first.cols, first.offset):
            raise RequestError(
                "INVALID_ARGUMENT",
                f"{op}: {t.where} (dim {t.spec.dim}, cols {t.spec.cols}) is not co-located with "
                f"{tensors[0].where} (dim {first.dim}, cols {first.cols})",
            )
    arrs = [t.dense_values() for t in tensors]
    a = request.alpha
    if op == "axpy":
        arrs[1] += a * arrs[0]
    elif op == "copy":
        arrs[0][...] = arrs[1]
    elif op == "scale":
        arrs[0] *= a
    elif op == "fill":
        arrs[0][...] = a
    elif op in ("dot", "nrm2"):  # the bits linalg's dot products give the same pair
        from ps_server.functions.linalg import pair_dots

        return pair_dots(arrs, [(0, len(arrs) - 1)])[0]
    elif op == "sum":
        return float(arrs[0].sum())
    else:
        from ps_server.functions import stats, vector

        kernels = {**vector.KERNELS, **stats.KERNELS}
        kernel = kernels.get(request.kernel)
        if kernel is None:
            raise RequestError(
                "INVALID_ARGUMENT",
                f"unknown kernel {request.kernel!r} (known: {', '.join(sorted(kernels))})",
            )
        return float(kernel(*arrs, **dict(request.kwargs)))
    return 0.0


def _server_function(name: str) -> Callable:
    """Resolve "module.function" to a function a module in ps_server.functions exports.

    Only names listed in that module's SERVER_FUNCTIONS can be called.
    """
    module, _, fn = name.partition(".")
    if not module.isidentifier() or not fn:
        raise RequestError("INVALID_ARGUMENT", f"bad server function name {name!r}")
    mod = _server_module(module)
    table = getattr(mod, "SERVER_FUNCTIONS", {})
    if fn not in table:
        raise RequestError(
            "NOT_FOUND", f"unknown server function {name!r} (known: {', '.join(sorted(table))})"
        )
    return table[fn]


def _server_module(module: str):
    try:
        return importlib.import_module(f"ps_server.functions.{module}")
    except ImportError:
        raise RequestError("NOT_FOUND", f"no server function module {module!r}") from None


def serve_shard(
    index: int,
    host: str,
    port: int,
    token: str,
    workers: int = 64,
    max_request_bytes: int = DEFAULT_MAX_REQUEST_MB << 20,
    memory_budget: int = 0,
) -> tuple[grpc.Server, int, ShardServicer]:
    """Start a shard server; returns (server, bound port, servicer). Port 0 picks a free one.

    Requests over `max_request_bytes` are refused; `memory_budget` (bytes, 0 = none)
    caps what all models on this shard may hold. `workers` threads: rendezvous calls
    (ps_server.functions.rendezvous) hold one each while they wait for the other partitions
    of a job, so keep it above the number of workers.
    """
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=workers),
        interceptors=[
            TokenInterceptor(token),
            RequestLimitInterceptor(max_request_bytes, f"shard {index}"),
            RequestStatsInterceptor(),  # calls and latency per RPC, for the status page
        ],
        options=server_options(max_request_bytes),
    )
    servicer = ShardServicer(index, memory_budget)
    pb_grpc.add_ShardServicer_to_server(servicer, server)
    bound = tls.bind(server, f"{host}:{port}")
    if bound == 0:
        raise OSError(f"shard {index}: cannot bind {host}:{port}")
    if not tls.configured():  # the lane is plaintext: with TLS, clients stay on gRPC
        servicer.direct = DirectServer(
            host,
            token,
            servicer.direct_call,
            max_request_bytes,
            f"shard {index}",
            serve=servicer.direct_rpc,
        )
    server.start()
    return server, bound, servicer


def checkpoint_roots(host: str, checkpoint_dir: str) -> list[str] | None:
    """Where a shard bound to `host` may checkpoint: anywhere on loopback (an embedded PS,
    its own user's), else only under the service's checkpoint directory (none without
    one): the URI comes from the network and the shard writes with its own credentials."""
    if is_loopback(host):
        return None
    return [checkpoint_dir] if checkpoint_dir else []


def warm_up() -> None:
    """Load the compiled passes a shard's requests run: its stores' key passes, the GBT
    split search and the solvers' linear combinations (0.2-0.5 s each in a fresh process,
    measured, else paid by a request)."""
    from ps_server.functions import gbt, linalg

    storage.warm_up()
    gbt.warm_up()
    linalg.warm_up()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(
        prog="python -m ps_server.shard",
        description="One spark-ps shard (started by spark-ps-server).",
    )
    p.add_argument("--index", type=int, required=True)
    p.add_argument("--coordinator", required=True, help="host:port of the coordinator")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    p.add_argument(
        "--restore",
        default="",
        help="the checkpoint directory: a primary restores from it, and a shard serving other "
        "hosts (not bound to loopback) checkpoints only under it",
    )
    p.add_argument("--max-request-mb", type=float, default=DEFAULT_MAX_REQUEST_MB)
    p.add_argument("--memory-mb", type=float, default=0, help="shard memory budget (0 = none)")
    p.add_argument(
        "--role",
        choices=("solo", "primary", "backup"),
        default="solo",
        help="solo: no replication; primary/backup: one of two replicas of this index",
    )
    p.add_argument("--host-id", default="", help="the host whose supervisor started us")
    p.add_argument("--incarnation", type=int, default=0, help="that supervisor's launch number")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    lifecycle.die_with_parent()
    lifecycle.keep_freed_memory()
    lifecycle.huge_page_advice(False)  # a dense key set's first touch must not compact memory
    token = os.environ.get("SPARK_PS_TOKEN", "")
    server, port, servicer = serve_shard(
        args.index,
        args.host,
        args.port,
        token,
        max_request_bytes=int(args.max_request_mb * (1 << 20)),
        memory_budget=int(args.memory_mb * (1 << 20)),
    )
    servicer.checkpoint_roots = checkpoint_roots(args.host, args.restore)
    limit = int(args.max_request_mb * (1 << 20))
    if args.role != "solo":
        servicer.replica = Replica(servicer, args.role, args.coordinator, token, limit)
    elif args.host_id:  # across hosts: a partition may move, by way of a copy seeded here
        servicer.become_primary = lambda: Replica(
            servicer, "primary", args.coordinator, token, limit
        )
    if args.restore and args.role != "backup":
        restored = snapshot.restore_latest(args.restore, args.index)
        if restored is not None:
            models, version = restored
            servicer.adopt(models)
            log.info(
                "shard %d restored %d models from version %d",
                args.index,
                len(servicer.models),
                version,
            )
    lifecycle.register_with_coordinator(
        args.coordinator,
        token,
        args.index,
        f"{args.host}:{port}",
        backup=args.role == "backup",
        launch=(args.host_id, args.incarnation),
    )
    # once registered (the imports hold the GIL): the compiled passes load while the
    # driver starts its job, not in the first fit's first request
    threading.Thread(target=warm_up, name="spark-ps-warm-up", daemon=True).start()
    lifecycle.wait_for_parent_or_stop(server)
