"""``envpool serve`` reports to its EnvPool's ``status.pool`` on the real API server.

The pool server runs as a subprocess (``python -m remote_env.cli.serve``) exactly
as the head pod's sidecar would: the config file is the operator's ConfigMap
document, ``ENVPOOL_POOL_NAMESPACE``/``ENVPOOL_POOL_NAME`` are set, and its only
credential is a token of the ServiceAccount the operator's builders create
(least privilege: get/patch of that one EnvPool's status). Ray is a real local
Ray; no operator runs, so whatever lands in ``status.pool`` came from the server.
"""

from __future__ import annotations

import datetime
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import ray

from envpool_operator import access, builders, names
from remote_env import spec

pytestmark = [pytest.mark.e2e]

REPO = Path(__file__).resolve().parents[2]
CRD = REPO / "manifests" / "crd" / "envpool.dev_envpools.yaml"


@pytest.fixture
def local_ray() -> Iterator[str]:
    ray.shutdown()
    # "local": a bare ray.init() joins the last cluster recorded in /tmp/ray
    ctx = ray.init(address="local", num_cpus=2, include_dashboard=False)
    try:
        yield str(ctx.address_info["gcs_address"])
    finally:
        ray.shutdown()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _token_kubeconfig(kube: Any, sa: str, ns: str, path: Path) -> Path:
    token = kube.kubectl("create", "token", sa, "-n", ns, "--duration=1h").stdout.strip()
    admin = json.loads(kube.kubectl("config", "view", "--raw", "--minify", "-o", "json").stdout)
    doc = {
        "apiVersion": "v1", "kind": "Config", "current-context": "sa",
        "clusters": [{"name": "c", "cluster": admin["clusters"][0]["cluster"]}],
        "users": [{"name": sa, "user": {"token": token}}],
        "contexts": [{"name": "sa", "context": {"cluster": "c", "user": sa}}],
    }
    path.write_text(json.dumps(doc))
    path.chmod(0o600)
    return path


def _status(port: int) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/status", timeout=5) as resp:
        doc: dict[str, Any] = json.load(resp)
    return doc


def _envpool(name: str, ns: str, replicas: int) -> dict[str, Any]:
    return {"apiVersion": spec.API_VERSION, "kind": spec.KIND,
            "metadata": {"name": name, "namespace": ns},
            "spec": {"env": {"id": "CartPole-v1"}, "replicas": replicas, "envsPerActor": 1,
                     "faultTolerance": {"restartBackoffSeconds": 0}}}


def test_serve_patches_only_its_own_envpool_status(
    kube_cluster: Any, namespace: str, local_ray: str, tmp_path: Path
) -> None:
    kube = kube_cluster
    kube.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CRD))
    kube.kubectl("wait", "--for=condition=Established", "crd/envpools.envpool.dev",
                 "--timeout=60s")
    doc = _envpool("reported", namespace, replicas=2)
    pool = spec.parse_spec(doc["spec"], name="reported", namespace=namespace)
    kube.apply([doc, _envpool("bystander", namespace, replicas=1),
                access.build_service_account(pool), access.build_role(pool),
                access.build_role_binding(pool)])
    kubeconfig = _token_kubeconfig(kube, names.service_account_name("reported"), namespace,
                                   tmp_path / "sa.kubeconfig")
    config = tmp_path / names.CONFIG_KEY

    config.write_text(builders.build_config_map(pool)["data"][names.CONFIG_KEY])
    env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
    env.update(KUBECONFIG=str(kubeconfig), ENVPOOL_POOL_NAMESPACE=namespace,
               ENVPOOL_POOL_NAME="reported")
    log = tmp_path / "serve.log"
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "remote_env.cli.serve", "--config", str(config),
         "--address", local_ray, "--http-port", str(port), "--health-interval", "0.3",
         "--destroy-on-exit"],
        stdout=log.open("ab"), stderr=subprocess.STDOUT, env=env, cwd=REPO,
    )

    def report(name: str = "reported") -> dict[str, Any]:
        obj = kube.kubectl_json("get", "envpool", name, "-n", namespace)
        pool_status: dict[str, Any] = (obj.get("status") or {}).get("pool") or {}
        return pool_status

    try:
        got = kube.wait_until(lambda: (r := report()).get("readyEnvs") == 2 and r,
                              timeout=120, interval=0.5, what=f"status.pool (log: {log})")
        assert got["desiredEnvs"] == 2 and got["restarts"] == 0 and got["lastError"] == ""
        when = datetime.datetime.strptime(got["updatedAt"], "%Y-%m-%dT%H:%M:%SZ").replace(
            tzinfo=datetime.timezone.utc)
        assert abs((datetime.datetime.now(datetime.timezone.utc) - when).total_seconds()) < 60

        # kubectl scale reaches the server through its watch of the EnvPool, not the
        # (kubelet-synced, here untouched) config file: within 2 s
        t0 = time.monotonic()
        kube.kubectl("scale", "envpool/reported", "-n", namespace, "--replicas=3")
        kube.wait_until(lambda: _status(port)["spec"]["replicas"] == 3, timeout=10,
                        interval=0.02, what=f"the server seeing replicas=3 (log: {log})")
        took = time.monotonic() - t0
        print(f"kubectl scale -> pool server spec: {took:.2f}s")
        assert took < 2.0, f"kubectl scale took {took:.2f}s to reach the pool server"
        kube.wait_until(lambda: report().get("readyEnvs") == report().get("desiredEnvs") == 3,
                        timeout=120, interval=0.5, what=f"report after scaling (log: {log})")
        assert report("bystander") == {}  # never touched
        # and the token cannot touch it either
        refused = subprocess.run(
            [str(kube.kubectl_path), "--kubeconfig", str(kubeconfig), "patch", "envpool",
             "bystander", "-n", namespace, "--subresource=status", "--type=merge",
             "-p", '{"status": {"pool": {"readyEnvs": 99}}}'],
            capture_output=True, text=True, timeout=60,
            env={k: v for k, v in os.environ.items() if k != "KUBECONFIG"},
        )
        assert refused.returncode != 0 and "forbidden" in refused.stderr.lower(), refused.stderr

        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0, log.read_text()[-3000:]
        # --destroy-on-exit: nothing of the pool is left on the Ray cluster
        kube.wait_until(lambda: not [a for a in ray.util.list_named_actors(all_namespaces=True)
                                     if a["namespace"] == "envpool-reported"],
                        timeout=30, interval=0.2, what="the pool's actors gone")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
