"""The Kubernetes manifests under deploy/kubernetes: valid resources, and commands that start
a working PS.

Validation is offline (`kubernetes-validate`'s bundled schemas, strict: an unknown field
fails). The containers' commands are then run as written on loopback, with what Kubernetes
would substitute (the pod's IP and name, the coordinator's Service name) and one shard slot
per host instead of four, so three hosts fit in a test: the coordinator places every
partition with its backup on another host.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from ps_server.lifecycle import stop_processes

ROOT = Path(__file__).resolve().parents[1]
MANIFESTS = sorted((ROOT / "deploy" / "kubernetes").glob("*.yaml"))
TOKEN = "deploy-test-token"


def _resources() -> dict[tuple[str, str], dict]:
    out = {}
    for path in MANIFESTS:
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                out[(doc["kind"], doc["metadata"]["name"])] = doc
    return out


def _container(resources: dict, name: str) -> dict:
    (container,) = resources[("StatefulSet", name)]["spec"]["template"]["spec"]["containers"]
    return container


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_manifests_are_valid_kubernetes_resources(path):
    for doc in yaml.safe_load_all(path.read_text()):
        kubernetes_validate.validate(doc, kubernetes_validate.latest_version(), strict=True)


def test_every_pod_takes_the_token_from_the_secret_and_mounts_what_it_names():
    resources = _resources()
    secret = resources[("Secret", "spark-ps-token")]
    for name in ("spark-ps-coordinator", "spark-ps-shards"):
        c = _container(resources, name)
        (token,) = [e for e in c["env"] if e["name"] == "SPARK_PS_TOKEN"]
        ref = token["valueFrom"]["secretKeyRef"]
        assert ref["name"] == secret["metadata"]["name"] and ref["key"] in secret["stringData"]
        assert "--token" not in c["args"]  # never in argv: `ps` shows it to every user
        claims = {
            v["persistentVolumeClaim"]["claimName"]
            for v in resources[("StatefulSet", name)]["spec"]["template"]["spec"]["volumes"]
        }
        assert claims == {"spark-ps-checkpoints"}
    assert ("PersistentVolumeClaim", "spark-ps-checkpoints") in resources
    service = resources[("Service", "spark-ps-coordinator")]
    port = service["spec"]["ports"][0]["port"]
    shards = _container(resources, "spark-ps-shards")["args"]
    assert shards[shards.index("--join") + 1] == f"spark-ps-coordinator:{port}"


def _as_run(args: list[str], subs: dict[str, str]) -> list[str]:
    out = []
    for a in args:
        for k, v in subs.items():
            a = a.replace(k, v)
        out.append(a)
    return out


@pytest.mark.timeout(180)
def test_the_manifests_commands_start_a_replicated_ps_on_three_hosts(tmp_path):
    resources = _resources()
    coord, shards = (_container(resources, n) for n in ("spark-ps-coordinator", "spark-ps-shards"))
    ckpt = tmp_path / "checkpoints"
    ckpt.mkdir()
    env = dict(os.environ, SPARK_PS_TOKEN=TOKEN)
    server = [sys.executable, "-m", "ps_server"]
    procs: list[subprocess.Popen] = []
    try:
        args = _as_run(coord["args"], {"$(POD_IP)": "127.0.0.1", "/checkpoints": str(ckpt)})
        args[args.index("--port") + 1] = "0"  # the container's 7070 may be taken here
        log = open(tmp_path / "coordinator.log", "w")
        procs.append(
            subprocess.Popen(
                [*server, *coord["command"][1:], *args],
                env=env,
                stdout=subprocess.PIPE,
                stderr=log,
                text=True,
            )
        )
        address = ""
        for line in procs[0].stdout:
            if line.startswith("SPARK_PS_LISTENING "):
                address = line.split()[1]
                break
        assert address, (tmp_path / "coordinator.log").read_text()[-2000:]
        min_hosts = int(args[args.index("--min-hosts") + 1])
        for i in range(min_hosts):
            subs = {
                "$(POD_IP)": "127.0.0.1",
                "$(POD_NAME)": f"spark-ps-shards-{i}",
                "spark-ps-coordinator:7070": address,
            }
            a = _as_run(shards["args"], subs)
            a[a.index("--shards") + 1] = "1"
            with open(tmp_path / f"host{i}.log", "w") as hlog:
                procs.append(
                    subprocess.Popen(
                        [*server, *shards["command"][1:], *a], env=env, stdout=hlog, stderr=hlog
                    )
                )
        deadline, state = time.monotonic() + 120, {}
        while time.monotonic() < deadline:
            got = subprocess.run(
                [*server, "status", address], env=env, capture_output=True, text=True, timeout=60
            )
            if got.returncode == 0:
                state = json.loads(got.stdout)
                parts = state["partitions"]
                if parts and all(p["address"] and p["backup"] for p in parts):
                    break
            time.sleep(0.5)
        hosts = {h["id"] for h in state.get("hosts", []) if h["alive"]}
        assert hosts == {f"spark-ps-shards-{i}" for i in range(min_hosts)}, state
        assert len(state["partitions"]) == min_hosts  # one slot per host
        for p in state["partitions"]:
            assert p["backup"] and p["backup_host"] != p["host"], p
    finally:
        if procs:
            procs[0].terminate()  # the hosts stop their shards at their next heartbeat
            try:
                procs[0].wait(10)
            except subprocess.TimeoutExpired:
                pass
        stop_processes(procs, grace=10)
