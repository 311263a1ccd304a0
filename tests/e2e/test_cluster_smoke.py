"""Smoke tests of the real local control plane (tests/cluster, DESIGN.md pyramid 3).

A plain RayCluster goes through the real KubeRay operator: head + worker pods
and the head service are created, the real kube-scheduler binds the pods to
kwok nodes, kwok marks them Running/Ready, KubeRay reports the cluster ready;
deleting the RayCluster lets the real kube-controller-manager garbage-collect
the pods through their ownerReferences.
"""

from __future__ import annotations

import json
import urllib.request
from typing import Any

import pytest

pytestmark = [pytest.mark.e2e]

RAY_IMAGE = "rayproject/ray:2.41.0"  # never pulled: kwok pods are fake


def _container(name: str) -> dict:
    return {
        "name": name,
        "image": RAY_IMAGE,
        "resources": {
            "requests": {"cpu": "1", "memory": "2Gi"},
            "limits": {"cpu": "1", "memory": "2Gi"},
        },
    }


def raycluster(name: str, namespace: str, workers: int = 2) -> dict:
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayCluster",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "rayVersion": RAY_IMAGE.rsplit(":", 1)[1],
            "headGroupSpec": {
                "rayStartParams": {},
                "template": {"spec": {"containers": [_container("ray-head")]}},
            },
            "workerGroupSpecs": [
                {
                    "groupName": "workers",
                    "replicas": workers,
                    "minReplicas": 0,
                    "maxReplicas": workers,
                    "rayStartParams": {},
                    "template": {"spec": {"containers": [_container("ray-worker")]}},
                }
            ],
        },
    }


def _pods(kube: Any, namespace: str, selector: str) -> list[dict]:
    return kube.kubectl_json("get", "pods", "-n", namespace, "-l", selector)["items"]


def _running_ready(pod: dict) -> bool:
    conds = {c["type"]: c["status"] for c in pod.get("status", {}).get("conditions", [])}
    return pod.get("status", {}).get("phase") == "Running" and conds.get("Ready") == "True"


def test_control_plane_versions_and_nodes(kube_cluster: Any) -> None:
    version = kube_cluster.kubectl_json("version")
    assert version["serverVersion"]["gitVersion"] == kube_cluster.versions["KUBE_VERSION"]
    assert version["clientVersion"]["gitVersion"] == kube_cluster.versions["KUBE_VERSION"]

    # kwok's fake nodes for scale; the real node (test_real_node.py) is tainted apart
    nodes = kube_cluster.kubectl_json("get", "nodes", "-l", "type=kwok")["items"]
    assert len(nodes) >= 4
    for node in nodes:
        assert node["metadata"]["annotations"].get("kwok.x-k8s.io/node") == "fake"
        assert node["status"]["allocatable"]["cpu"] == "32"
        conds = {c["type"]: c["status"] for c in node["status"]["conditions"]}
        assert conds["Ready"] == "True"

    crd = kube_cluster.kubectl_json("get", "crd", "rayclusters.ray.io")
    assert "v1" in [v["name"] for v in crd["spec"]["versions"]]

    helm = kube_cluster.helm("version", "--short")
    assert helm.stdout.strip().startswith(kube_cluster.versions["HELM_VERSION"])


def test_garbage_collector_deletes_dependents(kube_cluster: Any, namespace: str) -> None:
    """Owner -> dependent via ownerReferences, no operator involved: only the
    real kube-controller-manager's garbage collector can remove the dependent."""
    kube_cluster.apply({"apiVersion": "v1", "kind": "ConfigMap",
                        "metadata": {"name": "owner", "namespace": namespace}})
    uid = kube_cluster.kubectl_json("get", "configmap", "owner", "-n", namespace)["metadata"]["uid"]
    kube_cluster.apply({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "dependent", "namespace": namespace,
                     "ownerReferences": [{"apiVersion": "v1", "kind": "ConfigMap",
                                          "name": "owner", "uid": uid}]},
    })
    kube_cluster.kubectl("delete", "configmap", "owner", "-n", namespace, "--cascade=background")
    kube_cluster.wait_until(
        lambda: kube_cluster.kubectl("get", "configmap", "dependent", "-n", namespace,
                                     check=False).returncode != 0,
        timeout=60, what="garbage collection of configmap/dependent",
    )


@pytest.mark.slow
def test_raycluster_lifecycle(kube_cluster: Any, namespace: str) -> None:
    name = "smoke"
    sel = f"ray.io/cluster={name}"
    kube_cluster.apply(raycluster(name, namespace, workers=2))

    # 1. the real KubeRay operator creates the head pod, 2 worker pods and the head service
    def pods_created() -> list[dict] | None:
        pods = _pods(kube_cluster, namespace, sel)
        return pods if len(pods) == 3 else None

    pods = kube_cluster.wait_until(pods_created, timeout=90, what="KubeRay to create 1 head + 2 worker pods")
    types = sorted(p["metadata"]["labels"].get("ray.io/node-type") for p in pods)
    assert types == ["head", "worker", "worker"]

    svc = kube_cluster.wait_until(
        lambda: [s for s in kube_cluster.kubectl_json("get", "services", "-n", namespace, "-l", sel)["items"]
                 if s["metadata"]["labels"].get("ray.io/node-type") == "head"],
        timeout=60, what="KubeRay head service",
    )[0]
    assert svc["metadata"]["name"] == f"{name}-head-svc"
    assert {p["name"] for p in svc["spec"]["ports"]} >= {"gcs-server", "dashboard", "client"}

    # 2. scheduled by the real kube-scheduler onto kwok nodes, made Running/Ready by kwok
    def all_ready() -> list[dict] | None:
        pods = _pods(kube_cluster, namespace, sel)
        return pods if len(pods) == 3 and all(_running_ready(p) for p in pods) else None

    pods = kube_cluster.wait_until(all_ready, timeout=120, what="head and worker pods Running/Ready")
    for pod in pods:
        assert pod["spec"]["nodeName"].startswith("kwok-node-")
        owners = pod["metadata"]["ownerReferences"]
        assert [(o["kind"], o["name"]) for o in owners] == [("RayCluster", name)]

    # 3. KubeRay reports the cluster ready, with status conditions
    def rc_ready() -> dict | None:
        rc = kube_cluster.kubectl_json("get", "raycluster", name, "-n", namespace)
        status = rc.get("status", {})
        conds = {c["type"]: c["status"] for c in status.get("conditions", [])}
        if status.get("state") == "ready" and conds.get("HeadPodReady") == "True" \
                and conds.get("RayClusterProvisioned") == "True":
            return rc
        return None

    rc = kube_cluster.wait_until(rc_ready, timeout=120, what="RayCluster .status.state == ready")
    status = rc["status"]
    conds = {c["type"]: c for c in status["conditions"]}
    # what KubeRay v1.6.2 reports (RayClusterStatusConditions is on by default)
    assert conds["HeadPodReady"]["status"] == "True"
    assert conds["HeadPodReady"]["reason"] == "HeadPodRunningAndReady"
    assert conds["RayClusterProvisioned"]["status"] == "True"
    assert conds["RayClusterProvisioned"]["reason"] == "AllPodRunningAndReadyFirstTime"
    for suspend in ("RayClusterSuspended", "RayClusterSuspending"):
        if suspend in conds:
            assert conds[suspend]["status"] == "False"
    assert status["availableWorkerReplicas"] == 2
    assert status["readyWorkerReplicas"] == 2
    assert status["desiredWorkerReplicas"] == 2
    assert status["head"]["serviceName"] == f"{name}-head-svc"

    # 4. delete -> pods garbage-collected by kube-controller-manager (ownerReferences)
    kube_cluster.kubectl("delete", "raycluster", name, "-n", namespace, "--cascade=background")
    kube_cluster.wait_until(lambda: not _pods(kube_cluster, namespace, sel), timeout=120,
               what="pods of the deleted RayCluster to be garbage-collected")
    kube_cluster.wait_until(
        lambda: not kube_cluster.kubectl_json("get", "services", "-n", namespace, "-l", sel)["items"],
        timeout=60, what="head service to be garbage-collected",
    )


def test_prometheus_scrapes_kuberay_operator(kube_cluster: Any, prometheus) -> None:
    url = kube_cluster.operator_metrics_url
    assert url, "up.sh wrote no ray-operator metrics port"
    with urllib.request.urlopen(url, timeout=5) as resp:
        assert b"controller_runtime_reconcile_total" in resp.read()
    target = url.removeprefix("http://").removesuffix("/metrics")
    prom = prometheus(targets=[target], job="kuberay-operator")

    def scraped() -> list[dict]:
        return prom.query('up{job="kuberay-operator"} == 1')

    kube_cluster.wait_until(scraped, timeout=30, what="prometheus to scrape the KubeRay operator")
    assert prom.query('controller_runtime_reconcile_total{controller="raycluster-controller"}') is not None
    assert json.dumps(prom.targets())  # API answers
