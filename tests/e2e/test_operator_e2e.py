"""The EnvPool operator on the real control plane with the real KubeRay operator.

The operator runs as a subprocess through the real entry point (``envpool
operator``) with the cluster's kubeconfig. Pods are kwok's (fake): kwok marks
them Running and Ready, so KubeRay's HeadPodReady/RayClusterProvisioned
conditions drive the EnvPool to Ready without a pool server. Where a test needs
the pool server's own report it writes ``status.pool`` exactly as the pool
server does (a merge patch of the status subresource).
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from envpool_operator import names as names_mod
from remote_env import spec

pytestmark = [pytest.mark.e2e]

REPO = Path(__file__).resolve().parents[2]
CRD = REPO / "manifests" / "crd" / "envpool.dev_envpools.yaml"
EXAMPLES = sorted((REPO / "manifests" / "examples").glob("*.yaml"))
ENVPOOL = Path(sys.executable).with_name("envpool")
NS_PREFIX = "e2e-op-"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass
class Operator:
    """The operator subprocess (``envpool operator``); restartable."""

    kube: Any
    log_path: Path
    env: dict[str, str]
    proc: subprocess.Popen[bytes] | None = None
    metrics_port: int = 0
    health_port: int = 0
    #: The namespaces it watches (a glob): each module that runs one has its own prefix.
    namespaces: str = f"{NS_PREFIX}*"

    def start(self, **env_over: str) -> None:
        """Start it; ``env_over`` adds settings for this run only."""
        self.metrics_port, self.health_port = _free_port(), _free_port()
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                # Only this module's namespaces: other tests may run their own
                # operator on the same cluster at the same time.
                [str(ENVPOOL), "operator", "--namespace", self.namespaces, "--standalone",
                 "--metrics-port", str(self.metrics_port),
                 "--liveness", f"http://127.0.0.1:{self.health_port}/healthz"],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env={**self.env, **env_over}, cwd=REPO,
            )
        self.kube.wait_until(self.healthy, timeout=60, interval=0.2, what="operator liveness")

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def healthy(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            pytest.fail(f"operator exited with {self.proc.returncode}:\n{self.log_tail()}")
        try:
            with urllib.request.urlopen(
                    f"http://127.0.0.1:{self.health_port}/healthz", timeout=2) as resp:
                return bool(resp.status == 200)
        except OSError:
            return False

    def metrics(self) -> str:
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as resp:
            text: str = resp.read().decode()
            return text

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(timeout=30)
        self.proc = None

    def log_tail(self, lines: int = 60) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])


def install_crd(kube: Any) -> None:
    kube.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CRD))
    kube.kubectl("wait", "--for=condition=Established", "crd/envpools.envpool.dev",
                 "--timeout=60s")


@pytest.fixture(scope="module")
def operator_process(kube_cluster: Any,
                     tmp_path_factory: pytest.TempPathFactory) -> Iterator[Operator]:
    install_crd(kube_cluster)
    env = {**kube_cluster.env, "ENVPOOL_IMAGE": "registry.example/envpool:e2e",
           # short so that the retry and resync paths run within a test's timeout
           "ENVPOOL_RESYNC_SECONDS": "30", "ENVPOOL_MAX_RETRY_SECONDS": "3",
           "PYTHONUNBUFFERED": "1"}
    op = Operator(kube_cluster, tmp_path_factory.mktemp("operator") / "operator.log", env)
    op.start()
    yield op
    op.stop()
    print(f"\n[operator log tail]\n{op.log_tail(30)}")


@pytest.fixture
def operator(operator_process: Operator) -> Operator:
    """The module's operator, running at the start of every test: a test that
    stops it and fails before starting it again must not fail the tests after it."""
    if not operator_process.running:
        operator_process.stop()
        operator_process.start()
    return operator_process


def watched_namespace(kube: Any, request: pytest.FixtureRequest,
                      prefix: str = NS_PREFIX) -> Iterator[str]:
    """A fresh namespace for one test, named for an operator watching ``prefix*``."""
    base = request.node.name.removeprefix("test_").replace("_", "-")[:30].strip("-")
    name = f"{prefix}{base}-{secrets.token_hex(3)}"
    kube.kubectl("create", "namespace", name)
    kube.wait_until(lambda: kube.kubectl("get", "serviceaccount", "default", "-n", name,
                                         check=False).returncode == 0,
                    timeout=30, what=f"serviceaccount default in {name}")
    yield name
    # Not waited for (~10 s each): every test has its own namespace.
    kube.kubectl("delete", "namespace", name, "--wait=false", "--ignore-not-found", check=False)


@pytest.fixture
def namespace(kube_cluster: Any, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace per test (overrides conftest's), named for the operator's watch."""
    yield from watched_namespace(kube_cluster, request)


@pytest.fixture(scope="module")
def shared_namespace(kube_cluster: Any) -> Iterator[str]:
    """One namespace for the many API-server rejections (a namespace each costs seconds)."""
    install_crd(kube_cluster)
    name = f"e2e-operator-bad-input-{secrets.token_hex(3)}"
    kube_cluster.kubectl("create", "namespace", name)
    yield name
    kube_cluster.kubectl("delete", "namespace", name, "--wait=false", "--ignore-not-found",
                         check=False)


# --------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------


def _get(kube: Any, kind: str, name: str, ns: str) -> Any:
    return kube.kubectl_json("get", kind, name, "-n", ns, check=False)


def _items(kube: Any, kind: str, ns: str, selector: str | None = None) -> list[dict[str, Any]]:
    args = ["get", kind, "-n", ns] + (["-l", selector] if selector else [])
    items: list[dict[str, Any]] = kube.kubectl_json(*args)["items"]
    return items


def _pool_spec(doc: dict[str, Any], ns: str) -> spec.PoolSpec:
    return spec.parse_spec(doc["spec"], name=doc["metadata"]["name"], namespace=ns)


def _report(kube: Any, ns: str, name: str, ready: int, desired: int,
            error: str | None = None) -> None:
    """What the pool server writes: status.pool on the status subresource."""
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    report: dict[str, Any] = {"readyEnvs": ready, "desiredEnvs": desired, "restarts": 0,
                              "updatedAt": now}
    if error:
        report["lastError"] = error
    kube.kubectl("patch", "envpool", name, "-n", ns, "--subresource=status", "--type=merge",
                 "-p", json.dumps({"status": {"pool": report}}))


def _condition(pool: dict[str, Any], ctype: str) -> dict[str, Any]:
    for c in (pool.get("status") or {}).get("conditions") or ():
        if c["type"] == ctype:
            return dict(c)
    return {}


def _status(kube: Any, ns: str, name: str) -> dict[str, Any]:
    got = _get(kube, "envpool", name, ns)
    st: dict[str, Any] = (got or {}).get("status") or {}
    return st


def _phase(kube: Any, ns: str, name: str) -> str | None:
    phase: str | None = _status(kube, ns, name).get("phase")
    return phase


def _worker_replicas(kube: Any, ns: str, name: str) -> int | None:
    rc = _get(kube, "raycluster", name, ns)
    if not rc:
        return None
    value: int = rc["spec"]["workerGroupSpecs"][0]["replicas"]
    return value


def _pods(kube: Any, ns: str, pool: str, component: str | None = None) -> list[dict[str, Any]]:
    sel = f"envpool.dev/pool={pool}" + (f",app.kubernetes.io/component={component}"
                                        if component else "")
    return [p for p in _items(kube, "pods", ns, sel)
            if not p["metadata"].get("deletionTimestamp")]


def _children(kube: Any, ns: str) -> dict[str, set[str]]:
    """Children of any EnvPool in ``ns`` by kind (label envpool.dev/pool)."""
    out: dict[str, set[str]] = {}
    for kind in ("rayclusters", "configmaps", "serviceaccounts", "roles", "rolebindings"):
        out[kind] = {i["metadata"]["name"] for i in _items(kube, kind, ns, "envpool.dev/pool")}
    return out


def _cartpole(name: str = "cartpole", **spec_over: Any) -> dict[str, Any]:
    """The example pool, without GCS fault tolerance: on kwok nodes there is no Redis or
    GCS to keep, and KubeRay's finalizer for it (a Redis cleanup Job on deletion) and its
    update of the RayCluster that adds it would be what these tests measure.
    test_head_loss_real_node.py runs fault tolerance on the real node."""
    doc: dict[str, Any] = yaml.safe_load(
        (REPO / "manifests" / "examples" / "cartpole.yaml").read_text())
    doc["metadata"]["name"] = name
    doc["spec"]["headFaultTolerance"] = {"enabled": False}
    doc["spec"].update(spec_over)
    return doc


def _apply(kube: Any, ns: str, *docs: dict[str, Any]) -> None:
    body = {"apiVersion": "v1", "kind": "List", "items": list(docs)}
    kube.kubectl("apply", "-n", ns, "-f", "-", input=json.dumps(body))


# --------------------------------------------------------------------------
# the happy path
# --------------------------------------------------------------------------


def test_every_example_reconciles_to_ready(kube_cluster: Any, operator: Operator,
                                          namespace: str) -> None:
    kube = kube_cluster
    kube.kubectl("apply", "-n", namespace, "-f", str(REPO / "manifests" / "examples"))
    docs = [yaml.safe_load(p.read_text()) for p in EXAMPLES]
    assert len(docs) >= 5
    for doc in docs:
        name = doc["metadata"]["name"]
        pool = _pool_spec(doc, namespace)

        rc = kube.wait_until(lambda n=name: _get(kube, "raycluster", n, namespace),
                             timeout=60, what=f"RayCluster {name}")
        groups = rc["spec"]["workerGroupSpecs"]
        assert [g["groupName"] for g in groups] == ["envs"]
        assert groups[0]["replicas"] == pool.workers
        head = rc["spec"]["headGroupSpec"]["template"]["spec"]
        assert [c["name"] for c in head["containers"]] == ["ray-head", "pool-server"]
        assert head["containers"][1]["command"] == [
            "envpool", "serve", "--config", "/etc/envpool/pool.yaml", "--env-resource"]
        assert head["containers"][1]["ports"] == [
            {"name": "metrics", "containerPort": pool.metrics_port, "protocol": "TCP"}]
        owners = rc["metadata"]["ownerReferences"]
        assert [(o["kind"], o["name"], o["controller"]) for o in owners] == [
            ("EnvPool", name, True)]

        cm = _get(kube, "configmap", names_mod.config_map_name(name), namespace)
        doc_in_cm = yaml.safe_load(cm["data"]["pool.yaml"])
        assert doc_in_cm["spec"] == pool.to_manifest()

        # KubeRay's pods appear (kwok runs them): one head, `workers` workers
        kube.wait_until(
            lambda n=name, w=pool.workers: len(_pods(kube, namespace, n, "head")) == 1
            and len(_pods(kube, namespace, n, "worker")) == w,
            timeout=90, what=f"pods of {name}")
        head_pod = _pods(kube, namespace, name, "head")[0]
        assert head_pod["metadata"]["labels"]["envpool.dev/metrics"] == "true"
        assert head_pod["spec"]["serviceAccountName"] == f"{name}-pool-server"

    for doc in docs:
        name = doc["metadata"]["name"]
        pool = _pool_spec(doc, namespace)
        expected = "Suspended" if pool.suspend else "Ready"
        kube.wait_until(lambda n=name, e=expected: _phase(kube, namespace, n) == e,
                        timeout=90, what=f"{name} phase {expected}")
        got = _get(kube, "envpool", name, namespace)
        st = got["status"]
        assert st["readyEnvs"] == (0 if pool.suspend else pool.replicas)
        assert st["endpoint"] == f"ray://{name}-head-svc.{namespace}.svc:10001"
        assert st["observedGeneration"] == got["metadata"]["generation"]
        assert _condition(got, "SpecValid")["status"] == "True"
        if not pool.suspend:
            assert _condition(got, "RayClusterReady")["status"] == "True"
            assert _condition(got, "PoolServerReady")["reason"] == "NoReport"

    table = kube.kubectl("get", "epool", "-n", namespace).stdout
    header = table.splitlines()[0].split()
    # LEASED, FREE, UPDATED and OUTDATED come from the pool server's report: blank
    # without one (kwok pods)
    assert header == ["NAME", "PHASE", "READY", "LEASED", "FREE", "DESIRED", "UPDATED", "OUTDATED",
                      "RAYCLUSTER", "AGE"], table
    rows = {line.split()[0]: line.split() for line in table.splitlines()[1:]}
    assert rows["cartpole"][1:5] == ["Ready", "16", "16", "cartpole"], table
    assert rows["cartpole-suspended"][1:4] == ["Suspended", "0", "128"], table
    wide = kube.kubectl("get", "epool", "-n", namespace, "-o", "wide").stdout
    assert wide.splitlines()[0].split() == [
        "NAME", "PHASE", "READY", "LEASED", "FREE", "DESIRED", "UPDATED", "OUTDATED", "REVISION",
        "WORKERS", "RAYCLUSTER", "ENDPOINT", "MESSAGE", "AGE"], wide
    # the category: kubectl get all lists EnvPools too
    assert "envpool.envpool.dev/cartpole" in kube.kubectl("get", "all", "-n", namespace).stdout

    # The pool server's report refines readiness: 10 of 16 envs up is not Ready.
    _report(kube, namespace, "cartpole", 10, 16, error="actor 1 died: exit code 137")
    kube.wait_until(lambda: _phase(kube, namespace, "cartpole") == "Degraded", timeout=30,
                    what="cartpole Degraded on the pool server's report")
    st = _status(kube, namespace, "cartpole")
    assert st["readyEnvs"] == 10
    assert "10/16 envs ready; last error: actor 1 died" in st["message"]
    _report(kube, namespace, "cartpole", 16, 16)
    kube.wait_until(lambda: _phase(kube, namespace, "cartpole") == "Ready", timeout=30,
                    what="cartpole Ready again")
    assert _condition(_get(kube, "envpool", "cartpole", namespace),
                      "PoolServerReady")["reason"] == "AllEnvsReady"

    # the operator's /metrics: reconciles by result and every pool's phase
    text = operator.metrics()
    assert f'envpool_pool_phase{{namespace="{namespace}",phase="Ready",pool="cartpole"}} 1.0' in (
        text), text
    assert (f'envpool_pool_phase{{namespace="{namespace}",phase="Suspended",'
            f'pool="cartpole-suspended"}} 1.0') in text
    assert _metric(text, 'result="success"') >= len(docs)


def test_scale_changes_worker_replicas_without_new_cluster(
        kube_cluster: Any, operator: Operator, namespace: str) -> None:
    kube = kube_cluster
    _apply(kube, namespace, _cartpole())
    rc = kube.wait_until(lambda: _get(kube, "raycluster", "cartpole", namespace), timeout=60,
                         what="RayCluster")
    kube.wait_until(lambda: len(_pods(kube, namespace, "cartpole", "head")) == 1, timeout=60,
                    what="head pod")
    head = _pods(kube, namespace, "cartpole", "head")[0]["metadata"]["uid"]

    kube.kubectl("scale", "epool/cartpole", "--replicas=200", "-n", namespace)
    kube.wait_until(lambda: _worker_replicas(kube, namespace, "cartpole") == 4, timeout=60,
                    what="4 workers for 200 envs")
    kube.wait_until(lambda: len(_pods(kube, namespace, "cartpole", "worker")) == 4, timeout=90,
                    what="4 worker pods")
    cm = _get(kube, "configmap", "cartpole-pool", namespace)
    assert yaml.safe_load(cm["data"]["pool.yaml"])["spec"]["replicas"] == 200
    assert _get(kube, "raycluster", "cartpole", namespace)["metadata"]["uid"] == rc[
        "metadata"]["uid"]
    assert _pods(kube, namespace, "cartpole", "head")[0]["metadata"]["uid"] == head
    kube.wait_until(lambda: _status(kube, namespace, "cartpole").get("readyEnvs") == 200,
                    timeout=60, what="200 envs ready")

    kube.kubectl("scale", "epool/cartpole", "--replicas=8", "-n", namespace)
    kube.wait_until(lambda: _worker_replicas(kube, namespace, "cartpole") == 1, timeout=60,
                    what="1 worker for 8 envs")
    kube.wait_until(lambda: len(_pods(kube, namespace, "cartpole", "worker")) == 1, timeout=90,
                    what="workers scaled down to 1")
    # below envsPerActor=8: the API server's CEL rule refuses it, nothing changes
    bad = kube.kubectl("scale", "epool/cartpole", "--replicas=4", "-n", namespace, check=False)
    assert bad.returncode != 0 and "envsPerActor must be <= replicas" in bad.stderr, bad.stderr

    # the scale subresource reports the running pool's size and selector
    path = f"/apis/envpool.dev/v1alpha1/namespaces/{namespace}/envpools/cartpole/scale"
    scale = kube.wait_until(
        lambda: (s := json.loads(kube.kubectl("get", "--raw", path).stdout))
        and s["status"].get("replicas") == 8 and s,
        timeout=30, what="scale subresource status")
    assert scale["spec"]["replicas"] == 8
    assert scale["status"]["selector"] == "envpool.dev/pool=cartpole"
    assert _get(kube, "raycluster", "cartpole", namespace)["metadata"]["uid"] == rc[
        "metadata"]["uid"]


def test_suspend_and_resume(kube_cluster: Any, operator: Operator, namespace: str) -> None:
    kube = kube_cluster
    _apply(kube, namespace, _cartpole(replicas=128, envsPerActor=16))
    kube.wait_until(lambda: len(_pods(kube, namespace, "cartpole", "worker")) == 2, timeout=90,
                    what="2 workers")
    head = _pods(kube, namespace, "cartpole", "head")[0]["metadata"]["uid"]
    kube.kubectl("patch", "epool", "cartpole", "-n", namespace, "--type=merge",
                 "-p", '{"spec":{"suspend":true}}')
    kube.wait_until(lambda: not _pods(kube, namespace, "cartpole", "worker"), timeout=90,
                    what="workers scaled to zero")
    # the head (and its pool server) stays: same pod
    assert [p["metadata"]["uid"] for p in _pods(kube, namespace, "cartpole", "head")] == [head]
    kube.wait_until(lambda: _phase(kube, namespace, "cartpole") == "Suspended", timeout=30,
                    what="phase Suspended")
    kube.kubectl("patch", "epool", "cartpole", "-n", namespace, "--type=merge",
                 "-p", '{"spec":{"suspend":false}}')
    kube.wait_until(lambda: len(_pods(kube, namespace, "cartpole", "worker")) == 2, timeout=90,
                    what="workers back")
    kube.wait_until(lambda: _phase(kube, namespace, "cartpole") == "Ready", timeout=60,
                    what="Ready after resume")


def test_a_fault_tolerant_pool_costs_kuberay_no_second_generation(
        kube_cluster: Any, operator: Operator, namespace: str) -> None:
    """GCS fault tolerance on (issue 31): KubeRay adds its Redis-cleanup finalizer with a
    full Update of the RayCluster, which re-serializes the spec through its Go types. A
    field those drop (an empty ``workersToDelete``, once) came back with the operator's
    next apply: generation 3 where KubeRay had observed 2, and the pool waited for
    KubeRay. The spec the operator applies is KubeRay's own serialization now: the
    RayCluster keeps generation 1 through the finalizer and the operator's resyncs, and
    the pool turns Ready."""
    kube = kube_cluster
    _apply(kube, namespace, _cartpole(headFaultTolerance={"enabled": True}))
    rc = kube.wait_until(
        lambda: (r := _get(kube, "raycluster", "cartpole", namespace))
        and "ray.io/gcs-ft-redis-cleanup-finalizer" in (r["metadata"].get("finalizers") or ())
        and r, timeout=60, what="KubeRay's GCS fault-tolerance finalizer on the RayCluster")
    assert rc["spec"]["gcsFaultToleranceOptions"]["redisAddress"] == (
        f"cartpole-redis.{namespace}.svc:6379")
    assert _get(kube, "deployment", "cartpole-redis", namespace)
    kube.wait_until(lambda: len(_pods(kube, namespace, "cartpole", "worker")) == 1, timeout=90,
                    what="the worker pod")
    # the operator applies the RayCluster again on its resync (30 s here): twice
    time.sleep(65)
    _report(kube, namespace, "cartpole", 16, 16)
    kube.wait_until(lambda: _phase(kube, namespace, "cartpole") == "Ready", timeout=60,
                    what="cartpole Ready with GCS fault tolerance")
    rc = _get(kube, "raycluster", "cartpole", namespace)
    managers = [(m["manager"], m["operation"], m.get("subresource"))
                for m in rc["metadata"].get("managedFields") or ()]
    assert rc["metadata"]["generation"] == 1, (rc["metadata"]["generation"], managers,
                                               rc["spec"]["workerGroupSpecs"][0])
    assert rc["status"].get("observedGeneration") == 1, rc["status"]


def test_image_update_rolls_the_pods_settings_do_not(
        kube_cluster: Any, operator: Operator, namespace: str) -> None:
    kube = kube_cluster
    _apply(kube, namespace, _cartpole())
    kube.wait_until(lambda: _phase(kube, namespace, "cartpole") == "Ready", timeout=90,
                    what="Ready")
    rc_uid = _get(kube, "raycluster", "cartpole", namespace)["metadata"]["uid"]
    old_pods = {p["metadata"]["uid"] for p in _pods(kube, namespace, "cartpole")}
    assert len(old_pods) == 2

    kube.kubectl("patch", "epool", "cartpole", "-n", namespace, "--type=merge",
                 "-p", '{"spec":{"ray":{"image":"registry.example/envpool:rolled"}}}')

    def rolled() -> bool:
        pods = _pods(kube, namespace, "cartpole")
        images = {c["image"] for p in pods for c in p["spec"]["containers"]}
        uids = {p["metadata"]["uid"] for p in pods}
        return len(pods) == 2 and images == {"registry.example/envpool:rolled"} and not (
            uids & old_pods)

    kube.wait_until(rolled, timeout=120, what="head and worker pods replaced with the new image")
    rc = _get(kube, "raycluster", "cartpole", namespace)
    assert rc["metadata"]["uid"] == rc_uid  # same cluster, same head Service, same endpoint
    kube.wait_until(lambda: _phase(kube, namespace, "cartpole") == "Ready", timeout=90,
                    what="Ready after the roll")

    # settings the running pool absorbs reach it through the ConfigMap, no new pods
    before = {p["metadata"]["uid"] for p in _pods(kube, namespace, "cartpole")}
    kube.kubectl("patch", "epool", "cartpole", "-n", namespace, "--type=merge",
                 "-p", '{"spec":{"batchWaitMs":7,"envsPerActor":4}}')
    kube.wait_until(
        lambda: yaml.safe_load(_get(kube, "configmap", "cartpole-pool", namespace)["data"]
                               ["pool.yaml"])["spec"]["batchWaitMs"] == 7,
        timeout=30, what="ConfigMap updated")
    got = _get(kube, "envpool", "cartpole", namespace)
    kube.wait_until(lambda: _status(kube, namespace, "cartpole").get("observedGeneration")
                    == got["metadata"]["generation"], timeout=30, what="generation observed")
    assert {p["metadata"]["uid"] for p in _pods(kube, namespace, "cartpole")} == before
    assert _phase(kube, namespace, "cartpole") == "Ready"


def test_an_operator_upgrade_leaves_running_pools_pods_alone_until_asked(
        kube_cluster: Any, operator: Operator, namespace: str) -> None:
    """A new operator version (here: a new default image, as every release has) keeps
    each existing pool's pods as the old one rendered them, says so in PodsCurrent,
    and renders its own when the EnvPool asks (envpool.dev/render=latest)."""
    kube = kube_cluster
    _apply(kube, namespace, _cartpole())
    kube.wait_until(lambda: _phase(kube, namespace, "cartpole") == "Ready", timeout=90,
                    what="Ready")
    rc = _get(kube, "raycluster", "cartpole", namespace)
    pods = {p["metadata"]["uid"] for p in _pods(kube, namespace, "cartpole")}
    old_image = operator.env["ENVPOOL_IMAGE"]
    new_image = old_image + "-upgraded"
    operator.stop()
    try:
        operator.start(ENVPOOL_IMAGE=new_image)
        # the new operator reconciles every pool at start-up; an annotation of ours
        # makes one more event, so the check below follows a reconcile for certain
        kube.kubectl("annotate", "epool", "cartpole", "-n", namespace, "team=a")
        cond = kube.wait_until(
            lambda: (c := _condition(_get(kube, "envpool", "cartpole", namespace),
                                     "PodsCurrent")).get("reason") == "OlderRender" and c,
            timeout=60, what="PodsCurrent=False/OlderRender")
        assert old_image in cond["message"] and new_image in cond["message"], cond
        assert "envpool.dev/render=latest" in cond["message"], cond
        after = _get(kube, "raycluster", "cartpole", namespace)
        assert after["metadata"]["generation"] == rc["metadata"]["generation"], \
            "the upgrade changed the RayCluster's spec"
        assert after["spec"] == rc["spec"]
        assert {p["metadata"]["uid"] for p in _pods(kube, namespace, "cartpole")} == pods
        assert _phase(kube, namespace, "cartpole") == "Ready"

        kube.kubectl("annotate", "epool", "cartpole", "-n", namespace, "envpool.dev/render=latest")

        def rolled() -> bool:
            now = _pods(kube, namespace, "cartpole")
            images = {c["image"] for p in now for c in p["spec"]["containers"]}
            return len(now) == 2 and images == {new_image} and not (
                {p["metadata"]["uid"] for p in now} & pods)

        kube.wait_until(rolled, timeout=120, what="pods of the new rendering")
        kube.wait_until(
            lambda: _condition(_get(kube, "envpool", "cartpole", namespace),
                               "PodsCurrent").get("status") == "True",
            timeout=60, what="PodsCurrent=True")
        assert _get(kube, "raycluster", "cartpole", namespace)["metadata"]["uid"] == \
            rc["metadata"]["uid"]
    finally:
        operator.stop()
        operator.start()


def test_env_change_leaves_the_ray_cluster_alone_and_reaches_the_config_map(
        kube_cluster: Any, operator: Operator, namespace: str) -> None:
    """Issue 32: env and runtimeEnv are rolled by the pool server through the running
    pods, so the operator changes neither the cluster hash nor the RayCluster's spec
    (its generation stays: KubeRay has nothing to recreate pods for); the ConfigMap the
    pool server reads carries the change."""
    kube = kube_cluster
    _apply(kube, namespace, _cartpole())
    rc = kube.wait_until(lambda: _get(kube, "raycluster", "cartpole", namespace), timeout=60,
                         what="RayCluster created")
    hash_before = rc["metadata"]["annotations"]["envpool.dev/cluster-hash"]
    generation = rc["metadata"]["generation"]
    t0 = time.monotonic()
    kube.kubectl("patch", "epool", "cartpole", "-n", namespace, "--type=merge", "-p", json.dumps(
        {"spec": {"env": {"id": "Acrobot-v1"}, "ray": {"runtimeEnv": {"env_vars": {"A": "1"}}},
                  "updateStrategy": {"maxUnavailable": 8}}}))
    kube.wait_until(
        lambda: yaml.safe_load(_get(kube, "configmap", "cartpole-pool", namespace)["data"]
                               ["pool.yaml"])["spec"]["env"].get("id") == "Acrobot-v1",
        timeout=30, what="ConfigMap carries the new env")
    config_s = time.monotonic() - t0
    doc = yaml.safe_load(_get(kube, "configmap", "cartpole-pool", namespace)["data"]["pool.yaml"])
    assert doc["spec"]["ray"]["runtimeEnv"] == {"env_vars": {"A": "1"}}
    assert doc["spec"]["updateStrategy"]["maxUnavailable"] == 8
    got = _get(kube, "envpool", "cartpole", namespace)
    # 90 s: one run of this test saw the status write of the new generation take over 30 s
    # (a status refresh from a stale body racing the reconcile's write, it seems)
    kube.wait_until(lambda: _status(kube, namespace, "cartpole").get("observedGeneration")
                    == got["metadata"]["generation"], timeout=90, what="generation observed")
    rc = _get(kube, "raycluster", "cartpole", namespace)
    assert rc["metadata"]["generation"] == generation  # the RayCluster's spec did not change
    assert rc["metadata"]["annotations"]["envpool.dev/cluster-hash"] == hash_before
    for group in (rc["spec"]["headGroupSpec"], rc["spec"]["workerGroupSpecs"][0]):
        assert group["template"]["metadata"]["annotations"]["envpool.dev/cluster-hash"] == \
            hash_before
    # kwok's pods run no pool server: the rollout columns are there, empty
    header = kube.kubectl("get", "epool", "cartpole", "-n", namespace).stdout.splitlines()[0]
    assert header.split()[5:8] == ["DESIRED", "UPDATED", "OUTDATED"], header
    wide = kube.kubectl("get", "epool", "cartpole", "-n", namespace, "-o", "wide").stdout
    assert "REVISION" in wide.splitlines()[0]
    cond = {c["type"]: c for c in _status(kube, namespace, "cartpole")["conditions"]}
    assert cond["RolloutComplete"]["status"] == "Unknown"
    print(f"\nenv change: ConfigMap updated {config_s:.2f}s after the patch; RayCluster "
          f"generation {generation} and cluster hash unchanged")


def test_deletion_garbage_collects_children(kube_cluster: Any, operator: Operator,
                                            namespace: str) -> None:
    kube = kube_cluster
    _apply(kube, namespace, _cartpole())
    kube.wait_until(lambda: len(_pods(kube, namespace, "cartpole")) == 2, timeout=90,
                    what="pods")
    assert all(_children(kube, namespace).values())
    kube.kubectl("delete", "epool", "cartpole", "-n", namespace, "--wait=true", "--timeout=60s")

    def gone() -> bool:
        return not any(_children(kube, namespace).values()) and not _pods(
            kube, namespace, "cartpole")

    kube.wait_until(gone, timeout=120, what="garbage collection of RayCluster, ConfigMap, RBAC "
                                            "and pods")


def test_ray_cluster_deleted_behind_our_back_comes_back(
        kube_cluster: Any, operator: Operator, namespace: str) -> None:
    kube = kube_cluster
    _apply(kube, namespace, _cartpole())
    old = kube.wait_until(lambda: _get(kube, "raycluster", "cartpole", namespace), timeout=60,
                          what="RayCluster")
    kube.kubectl("delete", "raycluster", "cartpole", "-n", namespace, "--wait=false")
    new = kube.wait_until(
        lambda: (rc := _get(kube, "raycluster", "cartpole", namespace))
        and rc["metadata"]["uid"] != old["metadata"]["uid"] and rc,
        timeout=60, what="a new RayCluster")
    assert new["metadata"]["ownerReferences"][0]["name"] == "cartpole"
    kube.wait_until(lambda: _phase(kube, namespace, "cartpole") == "Ready", timeout=90,
                    what="Ready again")


def test_operator_killed_mid_reconcile_creates_no_duplicates(
        kube_cluster: Any, operator: Operator, namespace: str) -> None:
    kube = kube_cluster
    names = [f"pool-{i}" for i in range(30)]
    # The pools wait for an operator that is not there; it then starts with two
    # handler threads and is SIGKILLed the moment a watch sees its first child,
    # so most pools are still to do or half done (with 32 threads and polling,
    # all ten pools of an earlier version were finished before the first poll).
    operator.stop()
    _apply(kube, namespace, *[_cartpole(n) for n in names])
    watch = subprocess.Popen(
        [str(kube.bin_dir / "kubectl"), "get", "serviceaccounts", "-n", namespace, "-w",
         "-o", "name", "-l", "envpool.dev/pool"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=kube.env, text=True)
    killed = threading.Event()

    def kill_on_first_child() -> None:
        assert watch.stdout is not None
        if watch.stdout.readline() and operator.proc is not None:
            operator.proc.send_signal(signal.SIGKILL)
        killed.set()

    threading.Thread(target=kill_on_first_child, daemon=True).start()
    try:
        try:
            operator.start(ENVPOOL_OPERATOR_THREADS="2")
        except BaseException:
            # killed before its liveness answered: what the test wants
            if not killed.is_set():
                raise
        assert killed.wait(60), "no child appeared within 60 s"
    finally:
        watch.kill()
    operator.stop(signal.SIGKILL)
    partial = _children(kube, namespace)
    print(f"children when the operator was killed: {partial}")
    assert partial["serviceaccounts"], "the watch saw a child the listing does not"
    assert partial["rayclusters"] != set(names), "the kill came too late to be mid-reconcile"
    operator.start()
    for name in names:
        kube.wait_until(lambda n=name: _phase(kube, namespace, n) == "Ready", timeout=120,
                        what=f"{name} Ready after the restart")
    after = _children(kube, namespace)
    assert after["rayclusters"] == set(names), (partial, after)
    assert after["configmaps"] == {f"{n}-pool" for n in names}
    assert after["serviceaccounts"] == {f"{n}-pool-server" for n in names}
    for rc in _items(kube, "rayclusters", namespace, "envpool.dev/pool"):
        assert len(rc["metadata"]["ownerReferences"]) == 1
    for name in names:
        assert len(_pods(kube, namespace, name, "head")) == 1
        assert len(_pods(kube, namespace, name, "worker")) == 1
    # the restarted operator counted its reconciles
    text = operator.metrics()
    assert 'envpool_operator_reconciles_total{result="success"}' in text
    assert "envpool_operator_reconcile_duration_seconds_count" in text


# --------------------------------------------------------------------------
# bad input and refusals
# --------------------------------------------------------------------------

# (name, spec override (None removes a key), text the API server's error must contain)
MALFORMED: list[tuple[str, dict[str, Any], str]] = [
    ("wrong-type-replicas", {"replicas": "sixteen"},
     'spec.replicas: Invalid value: "string": spec.replicas in body must be of type integer'),
    ("zero-replicas", {"replicas": 0},
     "spec.replicas: Invalid value: 0: spec.replicas in body should be greater than or equal to 1"),
    ("negative-replicas", {"replicas": -3}, "should be greater than or equal to 1"),
    ("huge-replicas", {"replicas": 10_000_000}, "should be less than or equal to 100000"),
    ("missing-replicas", {"replicas": None}, "spec.replicas: Required value"),
    ("actor-gt-replicas", {"replicas": 4, "envsPerActor": 8},
     "spec.envsPerActor: Invalid value: envsPerActor must be <= replicas"),
    ("actor-gt-worker", {"replicas": 500, "envsPerActor": 128},
     "envsPerActor must be <= ray.worker.envsPerWorker"),
    ("both-env", {"env": {"id": "CartPole-v1", "entrypoint": "a.b:c"}},
     "exactly one of env.id (a gymnasium id, e.g. CartPole-v1) or env.entrypoint"),
    ("neither-env", {"env": {"kwargs": {}}}, "exactly one of env.id"),
    ("bad-entrypoint", {"env": {"entrypoint": "not a callable"}},
     "env.entrypoint must look like 'package.module:callable'"),
    ("bad-env-id", {"env": {"id": "Cart Pole"}}, "env.id must be a gymnasium id"),
    ("bad-quantity", {"ray": {"head": {"resources": {"requests": {"memory": "lots"}}}}},
     "must be a non-negative Kubernetes quantity such as 500m"),
    ("negative-quantity", {"ray": {"worker": {"resources": {"limits": {"cpu": "-2"}}}}},
     "must be a non-negative Kubernetes quantity such as 500m"),
    ("unknown-field", {"replicaz": 3}, 'unknown field "spec.replicaz"'),
    ("unknown-nested", {"env": {"id": "CartPole-v1", "kwarg": {}}},
     'unknown field "spec.env.kwarg"'),
    ("bad-enum", {"autoresetMode": "Sometimes"},
     'spec.autoresetMode: Unsupported value: "Sometimes"'),
    ("ray-port", {"metrics": {"port": 6379}}, "metrics.port must not be a Ray head port"),
    ("lease-port", {"metrics": {"port": 8267}}, "metrics.port must not be a Ray head port"),
    ("low-port", {"metrics": {"port": 80}}, "should be greater than or equal to 1024"),
    ("bad-version", {"ray": {"version": "latest"}}, "ray.version must be a Ray release"),
    ("bad-batch", {"batchWaitMs": -1}, "should be greater than or equal to 0"),
    ("bad-toleration", {"ray": {"worker": {"tolerations": [{"operator": "Sometimes"}]}}},
     'operator: Unsupported value: "Sometimes"'),
    ("x" * 41, {}, f'metadata.name: Invalid value: "{"x" * 41}": metadata.name must be at '
                   "most 40 characters"),
    ("9-starts-with-digit", {}, "metadata.name must be a DNS label that starts with a letter"),
]

# accepted by the schema, refused by the operator with a condition that says what to fix
OPERATOR_REJECTED: list[tuple[str, dict[str, Any], str]] = [
    ("tiny-memory", {"ray": {"head": {"resources": {"limits": {"memory": "64Mi"}}}}},
     "spec.ray.head.resources.limits.memory: Ray needs at least 256Mi of memory, got '64Mi'"),
    ("request-over-limit", {"ray": {"worker": {"resources": {
        "requests": {"cpu": "4"}, "limits": {"cpu": "2"}}}}},
     "spec.ray.worker.resources.requests.cpu: request 4 exceeds limit 2"),
    ("zero-cpu", {"ray": {"worker": {"resources": {"requests": {"cpu": "0"}}}}},
     "must be greater than zero"),
    ("too-many-workers", {"replicas": 100_000, "envsPerActor": 1,
                          "ray": {"worker": {"envsPerWorker": 1}}},
     "needs 100000 worker pods (100000 envs / 1 per worker) but this operator allows at most "
     "1000"),
]


def _doc(name: str, over: dict[str, Any]) -> dict[str, Any]:
    s: dict[str, Any] = {"env": {"id": "CartPole-v1"}, "replicas": 16}
    for key, value in over.items():
        if value is None:
            s.pop(key, None)
        else:
            s[key] = value
    return {"apiVersion": "envpool.dev/v1alpha1", "kind": "EnvPool",
            "metadata": {"name": name}, "spec": s}


def test_bad_input_list_covers_the_issue() -> None:
    assert len(MALFORMED) + len(OPERATOR_REJECTED) >= 15
    for name, over, _needle in MALFORMED:
        # every case is also refused by the operator's own parser (same YAML, no API server)
        with pytest.raises(spec.SpecError):
            s = _doc(name, over)["spec"]
            spec.parse_spec(s, name=name)


@pytest.mark.parametrize(("name", "over", "needle"), MALFORMED, ids=[m[0][:24] for m in MALFORMED])
def test_malformed_envpool_rejected_by_api_server(
        kube_cluster: Any, shared_namespace: str, name: str, over: dict[str, Any],
        needle: str) -> None:
    proc = kube_cluster.kubectl("apply", "-n", shared_namespace, "-f", "-",
                                input=json.dumps(_doc(name, over)), check=False)
    assert proc.returncode != 0, proc.stdout
    assert needle in proc.stderr, proc.stderr
    assert _get(kube_cluster, "envpool", name, shared_namespace) is None


def test_malformed_envpools_marked_by_operator_without_children(
        kube_cluster: Any, operator: Operator, namespace: str) -> None:
    kube = kube_cluster
    _apply(kube, namespace, *[_doc(name, over) for name, over, _ in OPERATOR_REJECTED])
    for name, _over, needle in OPERATOR_REJECTED:
        pool = kube.wait_until(
            lambda n=name: (p := _get(kube, "envpool", n, namespace))
            and _condition(p, "SpecValid").get("status") == "False" and p,
            timeout=60, what=f"SpecValid=False on {name}")
        cond = _condition(pool, "SpecValid")
        assert cond["reason"] == "InvalidSpec"
        assert needle in cond["message"], cond
        assert pool["status"]["phase"] == "Failed"
        assert needle in _condition(pool, "Ready")["message"]
    assert not any(_children(kube, namespace).values())
    # the operator says so in Events too (kubectl describe)
    events = kube.kubectl("get", "events", "-n", namespace,
                          "--field-selector", "involvedObject.name=tiny-memory").stdout
    assert "invalid EnvPool spec" in events, events
    # a fixed spec recovers the pool
    kube.kubectl("patch", "epool", "tiny-memory", "-n", namespace, "--type=json",
                 "-p", '[{"op":"remove","path":"/spec/ray/head/resources"}]')
    kube.wait_until(lambda: _phase(kube, namespace, "tiny-memory") == "Ready", timeout=90,
                    what="tiny-memory Ready once the spec is fixed")
    assert _children(kube, namespace)["rayclusters"] == {"tiny-memory"}


def test_quota_refusal_leaves_no_children_and_recovers(
        kube_cluster: Any, operator: Operator, namespace: str) -> None:
    kube = kube_cluster
    quota = {"apiVersion": "v1", "kind": "ResourceQuota",
             "metadata": {"name": "no-rayclusters"},
             "spec": {"hard": {"count/rayclusters.ray.io": "0"}}}
    _apply(kube, namespace, quota)
    kube.wait_until(lambda: (_get(kube, "resourcequota", "no-rayclusters", namespace)
                             .get("status") or {}).get("hard"), timeout=30,
                    what="quota status computed")
    _apply(kube, namespace, _cartpole())
    pool = kube.wait_until(
        lambda: (p := _get(kube, "envpool", "cartpole", namespace))
        and _condition(p, "RayClusterReady").get("reason") == "QuotaExceeded" and p,
        timeout=60, what="QuotaExceeded condition")
    msg = _condition(pool, "RayClusterReady")["message"]
    assert "exceeded quota: no-rayclusters" in msg and "raise the ResourceQuota" in msg, msg
    assert pool["status"]["phase"] == "Pending"
    # the dry run refused the RayCluster before anything else was written
    assert not any(_children(kube, namespace).values())
    operator.healthy()  # retried with backoff, no crash loop
    kube.kubectl("delete", "resourcequota", "no-rayclusters", "-n", namespace)
    kube.wait_until(lambda: _phase(kube, namespace, "cartpole") == "Ready", timeout=90,
                    what="Ready once the quota is gone")
    assert _children(kube, namespace)["configmaps"] == {"cartpole-pool"}


def test_kuberay_pod_failures_surface_in_the_condition(
        kube_cluster: Any, operator: Operator, namespace: str) -> None:
    kube = kube_cluster
    quota = {"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "one-pod"},
             "spec": {"hard": {"pods": "1"}}}
    _apply(kube, namespace, quota)
    kube.wait_until(lambda: (_get(kube, "resourcequota", "one-pod", namespace)
                             .get("status") or {}).get("hard"), timeout=30,
                    what="quota status computed")
    _apply(kube, namespace, _cartpole(replicas=128, envsPerActor=16))  # head + 2 workers
    pool = kube.wait_until(
        lambda: (p := _get(kube, "envpool", "cartpole", namespace))
        and _condition(p, "RayClusterReady").get("reason") == "ReplicaFailure" and p,
        timeout=90, what="ReplicaFailure from KubeRay")
    assert "exceeded quota: one-pod" in _condition(pool, "RayClusterReady")["message"]
    assert pool["status"]["phase"] == "Provisioning"
    kube.kubectl("delete", "resourcequota", "one-pod", "-n", namespace)
    kube.wait_until(lambda: _phase(kube, namespace, "cartpole") == "Ready", timeout=120,
                    what="Ready once the pods fit")


# --------------------------------------------------------------------------
# KubeRay absent: a second, private control plane (the shared one must keep
# its KubeRay CRDs for everyone else)
# --------------------------------------------------------------------------


@dataclass
class BareCluster:
    kubeconfig: Path
    kubectl_path: Path
    env: dict[str, str]
    wait_until: Any

    def kubectl(self, *args: str, input: str | None = None) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run([str(self.kubectl_path), "--kubeconfig", str(self.kubeconfig),
                               *args], input=input, capture_output=True, text=True, timeout=120)
        if proc.returncode != 0:
            pytest.fail(f"kubectl {' '.join(args)}: {proc.stderr}")
        return proc

    def kubectl_json(self, *args: str, check: bool = False) -> Any:
        proc = subprocess.run([str(self.kubectl_path), "--kubeconfig", str(self.kubeconfig),
                               *args, "-o", "json"], capture_output=True, text=True, timeout=120)
        return json.loads(proc.stdout) if proc.returncode == 0 else None


@pytest.fixture(scope="module")
def cluster_without_kuberay(kube_cluster: Any, tmp_path_factory: pytest.TempPathFactory,
                            ) -> Iterator[BareCluster]:
    """etcd + kube-apiserver of their own (kwokctl, the same local binaries), no KubeRay.

    Only what the operator talks to: no nodes, scheduler or controller
    manager, so it starts in seconds and changes nothing on the shared cluster.
    """
    v = kube_cluster.versions
    kube_bin = kube_cluster.bin_dir
    etcd = kube_bin.parents[1] / f"etcd-{v['ETCD_VERSION']}" / "bin" / "etcd"
    kwok = kube_cluster.kwokctl_path.with_name("kwok")
    work = tmp_path_factory.mktemp("nokuberay")
    name = f"envpool-nokuberay-{secrets.token_hex(2)}"
    config = work / "kwokctl.yaml"
    config.write_text(json.dumps({
        "apiVersion": "config.kwok.x-k8s.io/v1alpha1", "kind": "KwokctlConfiguration",
        "options": {
            "runtime": "binary", "kubeVersion": v["KUBE_VERSION"],
            "etcdVersion": v["ETCD_VERSION"].lstrip("v"), "kwokVersion": v["KWOK_VERSION"],
            "bindAddress": "127.0.0.1", "cacheDir": str(work / "cache"),
            "kubeBinaryPrefix": str(kube_bin),
            "kubeApiserverBinary": str(kube_bin / "kube-apiserver"),
            "kubectlBinary": str(kube_cluster.kubectl_path),
            "etcdBinaryPrefix": str(etcd.parent), "etcdBinary": str(etcd),
            "kwokBinaryPrefix": str(kwok.parent), "kwokControllerBinary": str(kwok),
            "components": ["etcd", "kube-apiserver"],
        },
    }))
    kubeconfig = work / "kubeconfig"
    env = {**os.environ, "KWOK_WORKDIR": str(work / "kwok"), "KWOK_RUNTIME": "binary"}
    kwokctl = [str(kube_cluster.kwokctl_path)]
    try:
        up = subprocess.run(
            [*kwokctl, "--config", str(config), "create", "cluster", "--name", name,
             "--runtime", "binary", "--kubeconfig", str(kubeconfig), "--wait", "60s",
             "--timeout", "120s"], env=env, capture_output=True, text=True, timeout=180)
        if up.returncode != 0:
            pytest.fail(f"kwokctl create cluster {name} failed:\n{up.stderr}\n{up.stdout}")
        bare = BareCluster(kubeconfig, kube_cluster.kubectl_path,
                           {**kube_cluster.env, "KUBECONFIG": str(kubeconfig)},
                           kube_cluster.wait_until)
        bare.wait_until(lambda: bare.kubectl_json("get", "namespace", "default"), timeout=60,
                        what="the second API server serving")
        install_crd(bare)
        yield bare
    finally:
        subprocess.run([*kwokctl, "delete", "cluster", "--name", name, "--kubeconfig",
                        str(kubeconfig)], env=env, capture_output=True, text=True, timeout=120)


def test_kuberay_absent_is_a_condition_then_recovers(
        cluster_without_kuberay: BareCluster, kube_cluster: Any,
        tmp_path_factory: pytest.TempPathFactory) -> None:
    bare = cluster_without_kuberay
    env = {**bare.env, "ENVPOOL_IMAGE": "registry.example/envpool:e2e",
           "ENVPOOL_MAX_RETRY_SECONDS": "2", "PYTHONUNBUFFERED": "1"}
    op = Operator(bare, tmp_path_factory.mktemp("operator-nokuberay") / "operator.log", env)
    op.start()
    try:
        ns = f"{NS_PREFIX}no-kuberay"
        bare.kubectl("create", "namespace", ns)
        _apply(bare, ns, _cartpole())
        pool = bare.wait_until(
            lambda: (p := _get(bare, "envpool", "cartpole", ns))
            and _condition(p, "RayClusterReady").get("reason") == "KubeRayMissing" and p,
            timeout=60, what="KubeRayMissing condition")
        assert "install the KubeRay operator and its CRDs" in _condition(
            pool, "RayClusterReady")["message"]
        assert pool["status"]["phase"] == "Pending"
        # retried with backoff, not crash-looping, and nothing half-made
        bare.wait_until(lambda: _metric(op.metrics(), 'result="retry"') >= 3, timeout=30,
                        what="3 retries")
        assert op.healthy()
        for kind in ("configmaps", "serviceaccounts", "roles", "rolebindings"):
            assert not _items(bare, kind, ns, "envpool.dev/pool"), kind
        # KubeRay's RayCluster CRD arrives: the pool goes ahead on the next retry
        bare.kubectl("apply", "--server-side", "-f",
                     str(kube_cluster.kuberay_crd_dir / "ray.io_rayclusters.yaml"))
        rc = bare.wait_until(lambda: _get(bare, "raycluster", "cartpole", ns), timeout=60,
                             what="RayCluster once KubeRay's CRDs exist")
        assert rc["spec"]["workerGroupSpecs"][0]["replicas"] == 1
        assert _children(bare, ns)["configmaps"] == {"cartpole-pool"}
    finally:
        op.stop()


def _metric(text: str, labels: str) -> float:
    for line in text.splitlines():
        if line.startswith("envpool_operator_reconciles_total{") and labels in line:
            return float(line.rsplit(" ", 1)[1])
    return 0.0
