"""PSContext: find or start the PS, and own its lifecycle.

With no configuration, `PSContext.getOrCreate(spark)` starts an embedded PS (a
coordinator plus one shard process per core, a random token) that stops with
`ps.stop()`, with `SparkContext.stop()`, or when this process exits. It binds loopback
with a local master, and `spark.driver.host` with a cluster master (``spark://``,
``yarn``, ``k8s://``), so that executors on other hosts reach it; its address and token
travel to them inside the fit's task closures. With `spark.ps.address` set it connects
to a running `spark-ps-server` instead. An executor that cannot reach the PS fails the
fit within seconds (``spark_ps.client.reach``), naming the address and these settings.

Configuration (Spark conf keys, or the keyword arguments of `getOrCreate`):

=========================  ==========================================================
``spark.ps.address``       ``host:port`` of a running service (default: embedded PS)
``spark.ps.token``         auth token of that service (env ``SPARK_PS_TOKEN`` too)
``spark.ps.numShards``     embedded shards (default: one per core)
``spark.ps.host``          embedded bind address (default ``127.0.0.1`` with a local
                           master, ``spark.driver.host`` with a cluster master)
``spark.ps.checkpointDir`` where checkpoints go and restarted shards restore from;
                           fits checkpoint there every ``checkpointInterval`` iterations
                           (unset: fits survive a shard restart from state the driver
                           holds, see ``spark_ps.ml._recovery``; an embedded loopback PS
                           keeps online models' snapshots in a temp dir of its own)
``spark.ps.checkpointKeep`` sealed checkpoint versions kept (default 2; 0 keeps all)
``spark.ps.replicas``      embedded processes per shard: 2 adds a synchronous backup
                           that takes over when its primary dies (default 1)
``spark.ps.startTimeout``  seconds to wait for an embedded PS (default 60), or in
                           executors mode for every partition to register (default 180)
``spark.ps.rpcTimeout``    seconds per PS call (default 120)
``spark.ps.maxMessageMB``  requests above this are chunked (default 4)
``spark.ps.maxRequestMB``  embedded shards refuse larger requests (default 256)
``spark.ps.shardMemoryMB`` embedded shards' memory budget over all models (default 0: none)
``spark.ps.tls.cert``      PEM certificate: the embedded PS serves TLS (with tls.key)
``spark.ps.tls.key``       PEM private key of tls.cert
``spark.ps.tls.ca``        PEM CA clients trust (default: tls.cert, i.e. self-signed)
``spark.ps.mode``          ``executors``: shards beside the executors and the
                           coordinator beside the driver, started by the bridge plugin
                           (``io.sparkps.bridge.PSPlugin``, which also reads
                           its keys ``executorShards`` and ``joinWait``);
                           ``getOrCreate`` then waits until every partition registered
                           (default ``embedded``: the PS in this process's children)
``spark.ps.numHosts``      executors mode: executors the coordinator waits for before
                           it places partitions (default: N of ``local-cluster[N,..]``,
                           ``spark.executor.instances``, or ``spark.cores.max`` over
                           ``spark.executor.cores``; else those joining within the
                           plugin's ``joinWait``)
``spark.ps.uiPort``        the embedded coordinator serves its status page (HTML, and
                           ``/status.json``, Prometheus ``/metrics``) on this port of
                           its address (0: any free port; default: none); the URL is
                           logged and kept in ``PSContext.ui_url`` (also the URL of an
                           external service's page, ``spark-ps-server --ui-port``)
``spark.ps.progress``      ``false`` hides a fit's progress bar, ``true`` shows it even when
                           stderr is not a terminal (default ``auto``: in a terminal or a
                           notebook); read from the session's conf at each fit
``spark.ps.logDir``        each fit writes its curves (loss per iteration, ...) as
                           TensorBoard event files into ``<logDir>/<fit id>/`` (needs the
                           ``[tensorboard]`` extra; default: none); read at each fit
``spark.ps.workerDaemon``  ``false``: local-mode Python workers fork from pyspark's own
                           daemon instead of ``spark_ps.worker_daemon`` (default true)
``spark.ps.parseCache``    ``false``: fits on a persisted DataFrame neither save their
                           workers' parsed rows nor read saved ones (default true: a
                           refit on the same cached input skips the Arrow pass, see
                           ``spark_ps.ml.parse_cache``); session conf only, read at
                           each fit
``spark.ps.parseCache.maxMB`` parsed rows kept per executor, in its Spark local
                           directory; the least recently used go first (default 8192)
=========================  ==========================================================
"""

from __future__ import annotations

import atexit
import logging
import os
import queue
import re
import shutil
import subprocess
import sys
import tempfile
import threading

from ps_server.auth import is_loopback, new_token
from ps_server.coordinator.service import READY_PREFIX, UI_PREFIX
from ps_server.tls import read_pem
from spark_ps.client import PSClient
from spark_ps.models.tensors import use_active_context

__all__ = ["PSContext"]

log = logging.getLogger("spark_ps.context")

_LOOPBACK = "127.0.0.1"
_DEFAULTS = {
    "numShards": str(os.cpu_count() or 1),
    "checkpointDir": "",
    "checkpointKeep": "2",
    "replicas": "1",
    "startTimeout": "60",
    "rpcTimeout": "120",
    "maxMessageMB": "4",
    "maxRequestMB": "256",
    "shardMemoryMB": "0",
}


def _conf(spark, key: str, overrides: dict) -> str:
    if key in overrides and overrides[key] is not None:
        return str(overrides[key])
    if spark is not None:
        value = spark.sparkContext.getConf().get(f"spark.ps.{key}", None)
        if value is not None:
            return value
    env = {"address": "SPARK_PS_ADDRESS", "token": "SPARK_PS_TOKEN"}.get(key)
    if env and os.environ.get(env):
        return os.environ[env]
    return _DEFAULTS.get(key, "")


def _context_kw(spark, conf: dict) -> dict:
    """PSContext keyword arguments from `conf` / the Spark conf."""
    return dict(
        checkpoint_dir=_conf(spark, "checkpointDir", conf),
        checkpoint_keep=int(_conf(spark, "checkpointKeep", conf)),
        rpc_timeout=float(_conf(spark, "rpcTimeout", conf)),
        max_message_mb=float(_conf(spark, "maxMessageMB", conf)),
        tls_ca=read_pem(_conf(spark, "tls.ca", conf) or _conf(spark, "tls.cert", conf)),
    )


def _is_local(master: str) -> bool:
    """Does `master` run every executor on the driver's host (``local``, ``local[N]``,
    ``local-cluster[...]``)?"""
    return master.startswith("local")


def _embedded_host(spark, conf: dict) -> str:
    """Where an embedded PS binds: ``spark.ps.host`` if set; else, with a cluster master,
    ``spark.driver.host`` (the address the executors already reach the driver at; Spark
    sets it when the context starts); else loopback. A non-loopback bind is safe because
    an embedded PS always has a token."""
    host = _conf(spark, "host", conf)
    master = spark.sparkContext.master if spark is not None else "local"
    if host:
        if not _is_local(master) and is_loopback(host):
            log.warning(
                "spark.ps.host=%s is a loopback address but the master is %s: executors on "
                "other hosts cannot reach the embedded PS (unset spark.ps.host to bind "
                "spark.driver.host)",
                host,
                master,
            )
        return host
    if _is_local(master):
        return _LOOPBACK
    driver = spark.sparkContext.getConf().get("spark.driver.host", None)
    if not driver:
        raise ValueError(
            f"master {master} runs executors on other hosts, but spark.driver.host is not "
            "set: set spark.ps.host to an address of this host that the executors can reach"
        )
    return driver


_EXECUTORS_WAIT = "180"  # seconds for executors to start and join, unless startTimeout is set
_NO_PLUGIN = (
    "spark.ps.mode=executors runs the PS shards beside the executors, started by the spark-ps "
    "bridge's plugin, which this application has not loaded: start it with --conf "
    "spark.plugins=io.sparkps.bridge.PSPlugin and --jars {jar} (spark-submit), or the same "
    "keys spark.plugins and spark.jars in SparkSession.builder.config(...) (a plugin added "
    "after the session started does not load)"
)


def _in_executors(spark, conf: dict) -> bool:
    """``spark.ps.mode=executors`` on a master with executors of their own (``local`` and
    ``local[N]`` keep the embedded PS: their tasks run in the driver's JVM)."""
    mode = _conf(spark, "mode", conf).strip().lower() or "embedded"
    if mode not in ("embedded", "executors"):
        raise ValueError(f"spark.ps.mode must be embedded or executors, got {mode!r}")
    master = spark.sparkContext.master if spark is not None else "local"
    if mode == "executors" and (master == "local" or master.startswith("local[")):
        log.info("spark.ps.mode=executors with master %s: using an embedded PS", master)
        return False
    if mode == "executors" and _conf(spark, "address", conf) and spark is not None:
        plugins = spark.sparkContext.getConf().get("spark.plugins", "")
        if "io.sparkps.bridge.PSPlugin" not in plugins:
            return False  # an external service named by spark.ps.address
    return mode == "executors"


def _wait_for_shards(address: str, token: str, tls_ca: bytes | None, timeout: float) -> None:
    """Wait until the coordinator at `address` placed its partitions on the executors that
    joined and every primary registered; raise naming who joined and the settings."""
    import time

    import grpc

    from ps_server import tls
    from ps_server.proto import ps_pb2 as pb
    from ps_server.proto import ps_pb2_grpc as pb_grpc
    from ps_server.wire import TOKEN_KEY

    deadline, smap = time.monotonic() + timeout, None
    with tls.open_channel(address, tls_ca) as channel:
        stub = pb_grpc.CoordinatorStub(channel)
        while time.monotonic() < deadline:
            try:
                smap = stub.GetShardMap(pb.Empty(), metadata=((TOKEN_KEY, token),), timeout=10)
            except grpc.RpcError as e:
                if e.code() != grpc.StatusCode.UNAVAILABLE:
                    raise RuntimeError(
                        f"PS coordinator {address}: {e.code().name}: {e.details()}"
                    ) from None
            if smap is not None and smap.addresses and all(smap.addresses):
                log.info(
                    "PS shards on executors: %d partitions on %s",
                    len(smap.addresses),
                    ", ".join(h.id for h in smap.hosts),
                )
                return
            time.sleep(0.2)
    joined = [h.id for h in smap.hosts] if smap is not None else []
    raise RuntimeError(
        f"spark.ps.mode=executors: the PS at {address} has no shards after {timeout:g}s "
        f"(spark.ps.startTimeout); executors joined: {joined or 'none'}. The coordinator "
        "waits for spark.ps.numHosts executors (default: spark.executor.instances, or "
        "spark.cores.max / spark.executor.cores): lower it, or check the executors' stderr "
        "for the shard supervisor's errors (the executors' Python needs spark-ps)"
    )


def _log_status_page(ui_url: str | None) -> None:
    """Name the PS's status page (never the token) in the log, when it serves one."""
    if ui_url:
        log.warning(
            "spark-ps status page: %s (it asks for the PS token: PSContext.token, as "
            "?token=... or 'Authorization: Bearer ...')",
            ui_url,
        )


def _launch(cmd: list[str], env: dict) -> subprocess.Popen:
    """Start the service from a thread that lives as long as this process.

    The service asks Linux to kill it when its parent *thread* exits
    (PR_SET_PDEATHSIG), so it must not be started from a short-lived thread.
    """
    global _KEEPER
    if _KEEPER is None:
        _KEEPER = _Keeper()
    return _KEEPER.run(lambda: subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True))


class _Keeper:
    def __init__(self):
        self.jobs: queue.Queue = queue.Queue()
        threading.Thread(target=self._loop, name="spark-ps-keeper", daemon=True).start()

    def _loop(self):
        while True:
            fn, box, done = self.jobs.get()
            try:
                box.append(fn())
            except BaseException as e:  # noqa: BLE001 - handed back to the caller
                box.append(e)
            done.set()

    def run(self, fn):
        box, done = [], threading.Event()
        self.jobs.put((fn, box, done))
        done.wait()
        if isinstance(box[0], BaseException):
            raise box[0]
        return box[0]


_KEEPER: _Keeper | None = None


class PSContext:
    """The PS this application trains on. Use `getOrCreate`, not the constructor."""

    _active: PSContext | None = None
    _lock = threading.Lock()

    def __init__(
        self,
        address: str,
        token: str,
        *,
        process: subprocess.Popen | None = None,
        checkpoint_dir: str = "",
        rpc_timeout: float = 120.0,
        max_message_mb: float = 4.0,
        tls_ca: bytes | None = None,
        checkpoint_keep: int = 2,
    ):
        self.address, self.token, self.process = address, token, process
        self.tls_ca = tls_ca
        self.checkpoint_dir = checkpoint_dir
        self.client = PSClient(
            address,
            token,
            timeout=rpc_timeout,
            max_message_bytes=int(max_message_mb * (1 << 20)),
            tls_ca=tls_ca,
            checkpoint_keep=checkpoint_keep,
        )
        self.num_shards = self.client.num_shards
        self._version = 0
        self._fit_lock = threading.Lock()
        self._fits: set = set()
        self._requests: dict[str, list] = {}  # uri -> [event, version once written]
        self._scratch: str | None = None  # recovery_dir's temp dir, removed by stop()
        self._stopped = False
        #: The status page's URL (``spark.ps.uiPort`` or the service's ``--ui-port``; None:
        #: the PS serves none), as the coordinator names it in its shard map
        self.ui_url: str | None = self.client.ui_url or None

    @property
    def embedded(self) -> bool:
        return self.process is not None

    @classmethod
    def getOrCreate(cls, spark=None, **conf) -> PSContext:
        """The active context, or a new one from `conf` / the Spark conf (see module doc)."""
        with cls._lock:
            if cls._active is not None and not cls._active._stopped:
                asked = conf.get("address")
                if asked and asked != cls._active.address:
                    log.warning(
                        "PSContext.getOrCreate(address=%r): a PSContext is already active at "
                        "%s and is returned; stop it first to use another PS",
                        asked,
                        cls._active.address,
                    )
                if spark is not None:
                    cls._active._stop_with(spark.sparkContext)
                return cls._active
            address = _conf(spark, "address", conf)
            token = _conf(spark, "token", conf)
            kw = _context_kw(spark, conf)
            in_executors = _in_executors(spark, conf)
            if in_executors and not address:
                from spark_ps._jvm import bridge_jar

                raise ValueError(_NO_PLUGIN.format(jar=bridge_jar()))
            if address:
                if in_executors:  # the plugin's coordinator: wait for the executors' shards
                    timeout = conf.get("startTimeout") or spark.sparkContext.getConf().get(
                        "spark.ps.startTimeout", _EXECUTORS_WAIT
                    )
                    _wait_for_shards(address, token, kw["tls_ca"], float(timeout))
                ctx = cls(address, token, **kw)
                _log_status_page(ctx.ui_url)  # the service's --ui-port, from its shard map
            else:
                ctx = cls._start_embedded(spark, conf, token or new_token(), kw)
            cls._active = ctx
            if spark is not None:
                ctx._stop_with(spark.sparkContext)
            return ctx

    @classmethod
    def start(cls, spark=None, **conf) -> PSContext:
        """A new embedded PS that is not the active one (several PSs in one process).

        Its handles are made with ``context=``; `getOrCreate` is what most code wants.
        """
        kw = _context_kw(spark, conf)
        return cls._start_embedded(spark, conf, _conf(spark, "token", conf) or new_token(), kw)

    @classmethod
    def active(cls) -> PSContext:
        """The current context; raises if none was created in this process."""
        if cls._active is None or cls._active._stopped:
            raise RuntimeError("no active PSContext: call PSContext.getOrCreate(spark) first")
        return cls._active

    @classmethod
    def _start_embedded(cls, spark, conf: dict, token: str, kw: dict) -> PSContext:
        shards = int(_conf(spark, "numShards", conf))
        replicas = _conf(spark, "replicas", conf)
        if replicas not in ("1", "2"):
            raise ValueError(f"spark.ps.replicas must be 1 or 2, got {replicas!r}")
        host = _embedded_host(spark, conf)
        cmd = [
            sys.executable,
            "-m",
            "ps_server",
            "--host",
            host,
            "--port",
            "0",
            "--shards",
            str(shards),
            "--replicas",
            replicas,
            "--log-level",
            "WARNING",
        ]
        if kw["checkpoint_dir"]:
            cmd += ["--checkpoint-dir", kw["checkpoint_dir"]]
        cmd += ["--max-request-mb", str(float(_conf(spark, "maxRequestMB", conf)))]
        cmd += ["--shard-memory-mb", str(float(_conf(spark, "shardMemoryMB", conf)))]
        ui_port = _conf(spark, "uiPort", conf).strip()
        if ui_port:
            if not ui_port.isdigit() or int(ui_port) > 65535:
                raise ValueError(f"spark.ps.uiPort must be a port number (0: any), got {ui_port!r}")
            cmd += ["--ui-port", ui_port]
        for flag, key in (
            ("--tls-cert", "tls.cert"),
            ("--tls-key", "tls.key"),
            ("--tls-ca", "tls.ca"),
        ):
            if _conf(spark, key, conf):
                cmd += [flag, _conf(spark, key, conf)]
        env = dict(os.environ, SPARK_PS_TOKEN=token)
        proc = _launch(cmd, env)
        address, ui_url = _read_ready(proc, float(_conf(spark, "startTimeout", conf)))
        ctx = cls(address, token, process=proc, **kw)
        ctx.ui_url = ui_url
        atexit.register(ctx.stop)
        log.info("embedded PS with %d shards at %s (pid %d)", shards, address, proc.pid)
        _log_status_page(ui_url)
        return ctx

    def _stop_with(self, sc) -> None:
        """Stop this PS when the SparkContext stops (wraps that instance's stop), and
        register the JVM bridge's executor listener with it."""
        original = sc.stop
        if getattr(original, "_spark_ps", False):
            return
        self._attach_listener(sc)

        def stop(*args, **kwargs):
            try:
                self.stop()
            finally:
                original(*args, **kwargs)

        stop._spark_ps = True
        sc.stop = stop
        self._use_worker_daemon(sc)

    @staticmethod
    def _use_worker_daemon(sc) -> None:
        """Fresh Python workers fork with spark-ps loaded (see ``spark_ps.worker_daemon``)."""
        if sc.getConf().get("spark.ps.workerDaemon", "true").strip().lower() == "false":
            return

        def use() -> None:
            try:
                from spark_ps.worker_daemon import install

                if install(sc):
                    log.info("Python workers fork from spark_ps.worker_daemon (preloaded)")
            except Exception as e:  # noqa: BLE001 - an optimisation: never fail the context
                log.info("spark-ps worker daemon not used: %s", e)

        # in the background: install() starts the workers' Python once to look for the module
        threading.Thread(target=use, name="spark-ps worker daemon", daemon=True).start()

    def _attach_listener(self, sc) -> None:
        """Lost executors reach the coordinator (needs the bridge jar; skipped without it)."""
        from pyspark.sql import SparkSession

        try:
            from spark_ps._jvm import add_executor_listener

            spark = (
                SparkSession(sc)
                if SparkSession.getActiveSession() is None
                else SparkSession.getActiveSession()
            )
            if add_executor_listener(spark, self.address, self.token):
                log.info("executor listener registered with the PS coordinator")
        except Exception as e:  # noqa: BLE001 - the PS works without the listener
            log.warning("spark-ps executor listener not registered: %s", e)

    def stop(self) -> None:
        """Stop an embedded PS and its shards (a no-op for an external service)."""
        if self._stopped:
            return
        self._stopped = True
        if self.process is not None and self.process.poll() is None:
            try:
                self.client.shutdown()
                self.process.wait(timeout=15)
            except Exception:  # noqa: BLE001 - fall back to signals
                self.process.terminate()
                try:
                    self.process.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    self.process.kill()
                    self.process.wait()
        if self.process is not None and self.process.stdout is not None:
            self.process.stdout.close()
        self.client.close()
        if self._scratch is not None:
            shutil.rmtree(self._scratch, ignore_errors=True)
        with PSContext._lock:
            if PSContext._active is self:
                PSContext._active = None

    def recovery_dir(self, name: str) -> str | None:
        """Where `name` keeps the snapshots it recovers from after a shard restart:
        ``spark.ps.checkpointDir`` when set (None is returned: use it); else, for an
        embedded PS on loopback, a directory under a temp dir of this context (owner-only,
        removed by `stop()`); else None (the shards may not write outside a checkpoint
        directory, or run on other hosts)."""
        if self.checkpoint_dir or not self.embedded:
            return None
        from ps_server.auth import is_loopback

        if not is_loopback(self.address.rsplit(":", 1)[0]):
            return None
        with self._fit_lock:
            if self._scratch is None:
                self._scratch = tempfile.mkdtemp(prefix="spark-ps-recovery-")
        return os.path.join(self._scratch, re.sub(r"[^A-Za-z0-9._-]", "_", name))

    def checkpoint(self, uri: str | None = None, timeout: float = 600.0) -> int:
        """Snapshot every model (weights and optimizer state); returns the version written.

        While a fit that checkpoints to `uri` runs, the snapshot is taken by that fit at
        its next consistent point (an iteration or tree boundary), with the fit's own
        state in the manifest; this call waits for it (at most `timeout` seconds).
        """
        uri = uri or self.checkpoint_dir
        if not uri:
            raise ValueError("no checkpoint directory: pass uri or set spark.ps.checkpointDir")
        with self._fit_lock:
            waiting = any(f.uri == uri for f in self._fits)
            if waiting:
                request = self._requests.setdefault(uri, [threading.Event(), None])
        if waiting and request[0].wait(timeout) and request[1] is not None:
            return request[1]
        with self._fit_lock:  # no fit took it (it ended first): snapshot now
            self._requests.pop(uri, None)
        version = self.next_version(uri)
        self.client.checkpoint(uri, version)
        return version

    def next_version(self, uri: str) -> int:
        """A checkpoint version number above every one under `uri`."""
        from ps_server.checkpoint import latest_version

        with self._fit_lock:
            self._version = max(self._version, (latest_version(uri) or 0)) + 1
            return self._version

    def metrics(self) -> dict[str, int]:
        """The coordinator's recovery counters: ``restart`` (shards restarted from a
        checkpoint), ``promotion`` (backups that took over), ``restore`` (fits rolled back),
        ``checkpoint``, ``iteration_lost`` (iterations/trees redone), ``task_requeued``,
        ``worker_lost`` and any other counted event (see
        ``ps_server.coordinator.servicer.COUNTERS``)."""
        return self.client.metrics()

    # --- fits that checkpoint (spark_ps.ml._recovery.FitRecovery) ---
    def fit_started(self, fit) -> None:
        with self._fit_lock:
            self._fits.add(fit)

    def fit_ended(self, fit) -> None:
        with self._fit_lock:
            self._fits.discard(fit)
            if not any(f.uri == fit.uri for f in self._fits) and fit.uri in self._requests:
                self._requests.pop(fit.uri)[0].set()  # the caller snapshots by itself

    def take_checkpoint_request(self, uri: str) -> bool:
        """Is a `checkpoint(uri)` call waiting for a fit to write one?"""
        with self._fit_lock:
            return uri in self._requests

    def checkpoint_taken(self, uri: str, version: int) -> None:
        """A fit sealed `version` under `uri`: it answers a waiting `checkpoint(uri)`."""
        with self._fit_lock:
            request = self._requests.pop(uri, None)
        if request is not None:
            request[1] = version
            request[0].set()

    def recover(self, uri: str | None = None, version: int | None = None) -> int:
        """Restore every shard from the newest sealed checkpoint (or `version`)."""
        uri = uri or self.checkpoint_dir
        from ps_server.checkpoint import latest_version

        version = version if version is not None else latest_version(uri or "")
        if version is None:
            raise FileNotFoundError(f"no complete checkpoint under {uri!r}")
        self.client.restore(uri, version)
        return version

    def __repr__(self) -> str:
        kind = "embedded" if self.embedded else "external"
        return f"PSContext({kind}, address={self.address!r}, shards={self.num_shards})"


def _read_ready(proc: subprocess.Popen, timeout: float) -> tuple[str, str | None]:
    """The service's address, and its status page's URL (None: it serves none)."""
    box: list[str] = []
    ui: list[str] = []

    def reader():
        for line in proc.stdout:
            if line.startswith(UI_PREFIX):
                ui.append(line[len(UI_PREFIX) :].strip())
            if line.startswith(READY_PREFIX):
                box.append(line[len(READY_PREFIX) :].strip())
                return

    t = threading.Thread(target=reader, daemon=True)
    t.start()
    t.join(timeout)
    if not box:
        proc.kill()
        proc.wait()
        raise RuntimeError(
            f"embedded PS did not start within {timeout}s "
            f"(exit code {proc.returncode}); see its stderr above"
        )
    return box[0], (ui[0] if ui else None)


# handles made without context= use the active PSContext
use_active_context(PSContext.active)
