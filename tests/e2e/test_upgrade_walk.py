"""The upgrade walk (issue 32): the operator of the last landed main, installed with
helm, runs two pools with a trainer stepping each; ``helm upgrade`` to this checkout's
operator. Afterwards: no Ray pod re-created, no RayCluster spec changed, every step
answered, and the time the operator was away.

The older version is built from this repository's history (a git worktree of
``ENVPOOL_UPGRADE_FROM``, by default the main that CI last passed before render pins
existed), with the same offline image recipe (tests/cluster/image.sh, cached by its
source key like the project image) and imported into the real node's containerd.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from journey_kit import REPO, Journey, example
from real_node import RealNode

#: building the older version's image cold (a Dockerfile layer and its import) comes first
pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(1800)]

#: Stop 37's main (its CI passed): the operator users ran before this version.
UPGRADE_FROM = os.environ.get("ENVPOOL_UPGRADE_FROM", "8685078921e35ad75630f539b341244920ea304b")
RELEASE = "envpool-upgrade"
ENVS = 8  # per pool: one worker pod, one actor


def _old_version(kube: Any, tree: Path) -> str:
    """A worktree of UPGRADE_FROM at ``tree`` (its chart is installed from there) and its
    project image, built (cached by its key) and imported; returns the image."""
    subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(tree), UPGRADE_FROM],
                   check=True, capture_output=True, text=True, timeout=120)
    built = subprocess.run(["bash", str(tree / "tests" / "cluster" / "image.sh")],
                           capture_output=True, text=True, timeout=1800)
    assert built.returncode == 0, built.stderr[-3000:]
    out = dict(line.split("=", 1) for line in built.stdout.splitlines() if "=" in line)
    image, tar = out["ENVPOOL_IMAGE"], out["ENVPOOL_IMAGE_TAR"]
    ctr = ["ctr", "--address", str(kube.state_dir / "node" / "containerd" / "containerd.sock"),
           "-n", "k8s.io"]
    have = subprocess.run([*ctr, "images", "ls", "-q"], capture_output=True, text=True, timeout=60)
    assert have.returncode == 0, have.stderr
    if image not in have.stdout.split():
        imported = subprocess.run([*ctr, "images", "import", tar], capture_output=True, text=True,
                                  timeout=600)
        assert imported.returncode == 0, imported.stderr[-2000:]
    return image


def _pool_doc(ns: str, name: str) -> dict[str, Any]:
    doc = example(ns)
    doc["metadata"]["name"] = name
    doc["spec"]["replicas"] = ENVS
    doc["spec"]["envsPerActor"] = ENVS
    doc["spec"]["ray"]["worker"]["envsPerWorker"] = ENVS
    return doc


@pytest.fixture(scope="module")
def walk(kube_cluster: Any, real_node: RealNode) -> Iterator[tuple[list[Journey], Path]]:
    ns = f"upgrade-{secrets.token_hex(3)}"
    kube_cluster.kubectl("create", "namespace", ns)
    kube_cluster.kubectl("label", "namespace", ns, "pod-security.kubernetes.io/enforce=restricted")
    kube_cluster.wait_until(
        lambda: kube_cluster.kubectl("get", "sa", "default", "-n", ns, check=False).returncode == 0,
        timeout=30, what="default ServiceAccount")
    pools = [Journey(kube_cluster, real_node, ns, RELEASE, pool=f"walk-{i}") for i in range(2)]
    tree = Path(tempfile.mkdtemp(prefix="envpool-upgrade-from-")) / "tree"
    try:
        yield pools, tree
    finally:
        kube_cluster.helm("uninstall", RELEASE, "-n", ns, "--wait", check=False)
        kube_cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)
        subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(tree)],
                       capture_output=True, text=True, timeout=120)


def _ray_pods(j: Journey) -> dict[str, str]:
    return {p["metadata"]["name"]: p["metadata"]["uid"] for c in ("head", "worker") for p in j.pods(c)}


def test_helm_upgrade_under_load_recreates_no_ray_pod_and_loses_no_step(
        walk: tuple[list[Journey], Path]) -> None:
    pools, tree = walk
    first = pools[0]
    kube, ns = first.kube, first.ns
    old_image, new_image = _old_version(kube, tree), first.node.image
    assert old_image != new_image, "the old version's image is this checkout's: nothing to walk"
    for j in pools:
        j.image = old_image  # the operator, its pools' default image and the trainers
    # the older version's CRD, as its users have it (helm never upgrades a chart's CRDs)
    kube.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(tree / "manifests" / "crd"))
    first.install_operator(chart=tree / "helm" / "envpool-operator")
    for j in pools:
        kube.apply(_pool_doc(ns, j.pool))
    for j in pools:
        j.wait_ready(timeout=420)
    for j in pools:
        kube.apply(j.stepping_job(f"{j.pool}-trainer", ENVS))
    for j in pools:
        j.wait_stepping(f"{j.pool}-trainer")
    pods = {j.pool: _ray_pods(j) for j in pools}
    clusters = {j.pool: kube.kubectl_json("get", "raycluster", j.pool, "-n", ns)["metadata"]
                for j in pools}
    old_operator = first.operator_pod()["metadata"]["name"]

    # a user upgrades the CRD first (kubectl apply), then the release; the new CRD's
    # fields must leave the old operator's EnvPools readable meanwhile
    kube.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(REPO / "manifests" / "crd"))
    t0 = time.monotonic()
    first.image = new_image
    first.install_operator(action="upgrade")  # --wait: the new operator pod is Ready
    operator_away_s = time.monotonic() - t0
    assert first.operator_pod()["metadata"]["name"] != old_operator
    # the new operator reconciled each pool: it writes PodsCurrent (the old one did not)
    for j in pools:
        cond = kube.wait_until(
            lambda j=j: next((c for c in (j.epool().get("status") or {}).get("conditions", [])
                              if c["type"] == "PodsCurrent"), None),
            timeout=120, interval=1, what=f"{j.pool} reconciled by the new operator")
        assert cond["status"] == "False" and cond["reason"] == "OlderRender", cond
        assert old_image in cond["message"] and new_image in cond["message"], cond
    progress = {j.pool: j.progress(f"{j.pool}-trainer") for j in pools}
    for j in pools:
        j.wait_stepping(f"{j.pool}-trainer", more_than=progress[j.pool])
    results = {j.pool: j.stop_stepping(f"{j.pool}-trainer") for j in pools}
    print(f"\n[upgrade walk] {UPGRADE_FROM[:12]} ({old_image}) -> {new_image}: the operator "
          f"away {operator_away_s:.1f} s (helm upgrade --wait); trainers: {results}")
    for j in pools:
        assert _ray_pods(j) == pods[j.pool], f"{j.pool}: Ray pods re-created by the upgrade"
        after = kube.kubectl_json("get", "raycluster", j.pool, "-n", ns)["metadata"]
        assert (after["uid"], after["generation"]) == (clusters[j.pool]["uid"],
                                                      clusters[j.pool]["generation"]), after
        r = results[j.pool]
        assert r["done"] is True and r["unanswered"] == 0 and r["errors"] == 0, r
        assert j.epool()["status"]["phase"] == "Ready"
    first.figures["upgrade_operator_away_s"] = operator_away_s
    first.node.record("upgrade_walk_operator_away_s", operator_away_s)
