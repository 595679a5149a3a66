"""A Spark standalone cluster across hosts on one machine, for tests and benches.

Why: ``local[N]`` and ``local-cluster`` run every executor on the driver's host, so they
cannot show what breaks when executors live elsewhere (a PS bound to the driver's
loopback, an example that forces its master). Here the Master and each Worker run on a
host of their own (a network namespace, :mod:`bench.netns`), and the driver runs in the
root namespace at the bridge's address, as a laptop or edge node would::

    with StandaloneCluster(workers=2) as cluster:
        done = cluster.submit(["examples/flights_lr.py", "--fraction", "0.02"])
        cluster.master_url                    # "spark://10.213.x.10:7077"
        cluster.task_hosts()                  # {"10.213.x.11", "10.213.x.12"}

The pip wheel of pyspark has no ``sbin`` scripts: the daemons are started with
``bin/spark-class org.apache.spark.deploy.master.Master`` / ``...worker.Worker``. Leaving
the ``with`` block SIGKILLs every process of every host (Master, Workers, executors, their
Python workers) and the driver's process group, also when the body failed.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from bench.common import REPO_ROOT, spark_home
from bench.netns import Hosts
from bench.netns import unavailable as netns_unavailable

__all__ = ["StandaloneCluster", "unavailable"]

MASTER_PORT = 7077  # each host has its own port space: no collision with anything else
_MASTER = "org.apache.spark.deploy.master.Master"
_WORKER = "org.apache.spark.deploy.worker.Worker"
_MASTER_READY = "I have been elected leader"
_WORKER_READY = "Successfully registered with master"
# an executor's log line for each task it starts (log4j's default INFO profile)
_TASK_LINE = re.compile(r"Executor: Running task ")


def unavailable() -> str:
    """Why a standalone cluster cannot be made here ("" when it can)."""
    why = netns_unavailable()
    if why:
        return why
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        return "no java on PATH (and no JAVA_HOME): Spark's daemons need a JVM"
    return ""


class StandaloneCluster:
    """A Master on host 0 and `workers` Workers on hosts 1..n, each offering `cores` and
    `memory`; the driver (``submit``) runs in the root namespace. A context manager."""

    def __init__(
        self,
        workers: int = 2,
        *,
        cores: int = 1,
        memory: str = "1g",
        start_timeout: float = 120.0,
        python: str | None = None,
    ):
        why = unavailable()
        if why:
            raise RuntimeError(f"standalone cluster: {why}")
        if workers < 1:
            raise ValueError(f"standalone cluster: workers must be >= 1, got {workers}")
        self.workers, self.cores, self.memory = workers, cores, memory
        self.start_timeout = start_timeout
        self.python = python or sys.executable
        self.hosts = Hosts(workers + 1)
        self.dir = Path(tempfile.mkdtemp(prefix="spark-ps-standalone-"))
        self.spark_home = os.environ.get("SPARK_HOME") or spark_home()
        self._daemons: list[subprocess.Popen] = []
        self._drivers: list[subprocess.Popen] = []

    # ------------------------------------------------------------------ addresses
    @property
    def master_url(self) -> str:
        return f"spark://{self.hosts.address(0)}:{MASTER_PORT}"

    @property
    def driver_host(self) -> str:
        """The root namespace's address: where a driver started by :meth:`submit` lives."""
        return self.hosts.bridge_address

    def worker_address(self, w: int) -> str:
        """Worker `w`'s (0-based) host address."""
        return self.hosts.address(w + 1)

    def work_dir(self, w: int) -> Path:
        """Worker `w`'s work dir: one ``app-*/<executor id>/stderr`` per executor it ran."""
        return self.dir / f"worker{w}"

    # ------------------------------------------------------------------ lifecycle
    def __enter__(self) -> StandaloneCluster:
        try:
            self.hosts.__enter__()
            self._start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _env(self, address: str) -> dict[str, str]:
        return dict(
            os.environ,
            SPARK_HOME=self.spark_home,
            SPARK_LOCAL_IP=address,  # never the hostname's address: namespaces share it
            SPARK_DAEMON_MEMORY="256m",
            SPARK_NO_DAEMONIZE="1",
        )

    def _daemon(self, host: int, name: str, args: Sequence[str]) -> Path:
        log = self.dir / f"{name}.log"
        cmd = [os.path.join(self.spark_home, "bin", "spark-class"), *args]
        with open(log, "wb") as out:
            self._daemons.append(
                self.hosts.popen(
                    host, cmd, env=self._env(self.hosts.address(host)), stdout=out, stderr=out
                )
            )
        return log

    def _start(self) -> None:
        master = self.hosts.address(0)
        args = [_MASTER, "--host", master, "--port", str(MASTER_PORT), "--webui-port", "0"]
        self._wait_for(self._daemon(0, "master", args), _MASTER_READY, "the Master")
        logs = []
        for w in range(self.workers):
            self.work_dir(w).mkdir()
            args = [
                _WORKER,
                "--host", self.worker_address(w),
                "--cores", str(self.cores),
                "--memory", self.memory,
                "--work-dir", str(self.work_dir(w)),
                "--webui-port", "0",
                self.master_url,
            ]  # fmt: skip
            logs.append(self._daemon(w + 1, f"worker{w}", args))
        for w, log in enumerate(logs):
            self._wait_for(log, _WORKER_READY, f"Worker {w}")

    def _wait_for(self, log: Path, line: str, what: str) -> None:
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            if line in log.read_text(errors="replace"):
                return
            dead = [p for p in self._daemons if p.poll() is not None]
            if dead:
                break
            time.sleep(0.2)
        tail = log.read_text(errors="replace")[-3000:]
        raise RuntimeError(f"standalone cluster: {what} did not start ({log}):\n{tail}")

    def close(self) -> None:
        """SIGKILL the drivers' process groups and every process of every host; remove
        the namespaces and the cluster's directory. Safe to call twice."""
        for p in self._drivers:
            _kill_group(p)
        self._drivers = []
        self.hosts.close()  # Master, Workers, executors and their Python workers
        for p in self._daemons:
            p.wait()
        self._daemons = []
        shutil.rmtree(self.dir, ignore_errors=True)

    # ------------------------------------------------------------------ applications
    def driver_conf(self) -> dict[str, str]:
        """Spark settings of a driver in the root namespace that executors can reach."""
        return {
            "spark.driver.host": self.driver_host,
            "spark.driver.bindAddress": self.driver_host,
            "spark.ui.enabled": "false",
            "spark.executor.memory": "768m",  # below the Worker's offer, daemon included
            "spark.executor.cores": str(self.cores),
        }

    def submit(
        self,
        args: Sequence[str],
        *,
        master: str | None = None,
        conf: Mapping[str, str] | None = None,
        env: Mapping[str, str] | None = None,
        timeout: float = 300.0,
    ) -> subprocess.CompletedProcess:
        """``spark-submit --master <this cluster> [--conf ...] *args`` from the root
        namespace, waited for; on timeout its process group is killed and the output so far
        returned with returncode None. `master` overrides the cluster's (e.g. local[2])."""
        cmd = [os.path.join(self.spark_home, "bin", "spark-submit")]
        cmd += ["--master", master or self.master_url]
        for key, value in {**self.driver_conf(), **(conf or {})}.items():
            cmd += ["--conf", f"{key}={value}"]
        cmd += list(args)
        full_env = dict(
            os.environ,
            SPARK_HOME=self.spark_home,
            PYSPARK_PYTHON=self.python,
            PYSPARK_DRIVER_PYTHON=self.python,
            SPARK_LOCAL_IP=self.driver_host,
            **(env or {}),
        )
        proc = subprocess.Popen(
            cmd,
            env=full_env,
            cwd=REPO_ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
            start_new_session=True,  # its own process group: the driver's Python child too
        )
        self._drivers.append(proc)
        try:
            out, err = proc.communicate(timeout=timeout)
            code: int | None = proc.returncode
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            out, err = proc.communicate()
            code = None
        finally:
            _kill_group(proc)  # what the driver left behind (an orphaned PS, a worker)
            self._drivers.remove(proc)
        return subprocess.CompletedProcess(cmd, code, out, err)

    def task_hosts(self, app_id: str = "app-*") -> dict[str, int]:
        """Tasks run per Worker address by application `app_id` (default: all of them),
        counted in the logs its executors wrote in the Workers' work dirs."""
        counts: dict[str, int] = {}
        for w in range(self.workers):
            n = sum(
                len(_TASK_LINE.findall(p.read_text(errors="replace")))
                for p in self.work_dir(w).glob(f"{app_id}/*/stderr")
            )
            if n:
                counts[self.worker_address(w)] = n
        return counts


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()
