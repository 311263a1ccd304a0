"""An autoscaled pool on the real node: real pods, the operator installed by helm.

The small end-to-end case of issue 19 (the sizing logic itself is covered on kwok
nodes in ``test_autoscaling.py``): ``manifests/examples/autoscaling.yaml`` sized for
2 cores (8 to 24 envs, 8 free, workers of 16 envs) -> a trainer Job leases 8, which
empties the buffer -> the operator, a pod, resizes the pool through the scale
subresource from the pool server's report -> the pool server, the head pod's sidecar,
starts the envs; a second worker pod starts when they no longer fit -> a second
trainer Job finds 8 free envs at once (``wait_s=0``) -> both leave and the pool goes
back to 8 envs and one worker after the scale-down delay. When the worker group
shrinks while A still leases, the pod that goes is one without A's actors.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from journey_kit import HEAD_RESOURCES, WORKER_RESOURCES, Journey
from journey_kit import placed as _placed
from real_node import RealNode

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "manifests" / "examples" / "autoscaling.yaml"
DELAY_S = 20


@pytest.fixture(scope="module")
def journey(kube_cluster: Any, real_node: RealNode) -> Iterator[Journey]:
    ns = f"autoscale-{secrets.token_hex(3)}"
    kube_cluster.kubectl("create", "namespace", ns)
    kube_cluster.kubectl("label", "namespace", ns, "pod-security.kubernetes.io/enforce=restricted")
    kube_cluster.wait_until(
        lambda: kube_cluster.kubectl("get", "sa", "default", "-n", ns, check=False).returncode == 0,
        timeout=30, what="default ServiceAccount")
    kube_cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f",
                         str(REPO / "manifests" / "crd"))
    j = Journey(kube_cluster, real_node, ns, "envpool-operator", pool="autoscaled")
    try:
        yield j
    finally:
        kube_cluster.helm("uninstall", j.release, "-n", ns, "--wait", check=False)
        kube_cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)
        for k, v in j.figures.items():
            real_node.record(f"autoscaling_{k}", v)


def _example(namespace: str) -> dict[str, Any]:
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["metadata"]["namespace"] = namespace
    doc["spec"]["replicas"] = 8
    doc["spec"]["autoscaling"].update(minReplicas=8, maxReplicas=24, bufferEnvs=8,
                                      scaleDownDelaySeconds=DELAY_S)
    doc["spec"]["ray"] = {"head": _placed({"resources": HEAD_RESOURCES}),
                          "worker": _placed({"resources": WORKER_RESOURCES, "envsPerWorker": 16})}
    return doc


def _workers(j: Journey) -> int:
    rc = j.kube.kubectl_json("get", "raycluster", j.pool, "-n", j.ns)
    return int(rc["spec"]["workerGroupSpecs"][0]["replicas"])


def _report(j: Journey) -> dict[str, Any]:
    """The pool server's report in the EnvPool, read through the API server: polling the
    pool server's /status by ``kubectl exec`` started a python in its container twice a
    second, the one process that an OOM kill in that container once hit in CI."""
    return j.pool_report()


def _running_workers(j: Journey) -> int:
    return sum(1 for p in j.pods("worker") if p["status"].get("phase") == "Running"
               and not p["metadata"].get("deletionTimestamp"))


def test_an_autoscaled_pool_keeps_a_buffer_on_real_pods(journey: Journey) -> None:
    j = journey
    j.install_operator()
    assert j.operator_pod()["spec"]["nodeName"] == j.node.name
    j.kube.apply(_example(j.ns))
    j.wait_ready(timeout=420, replicas=8)
    assert (_workers(j), _running_workers(j)) == (1, 1)

    # trainer A leases all 8: the buffer is empty until the operator resizes the pool
    j.kube.apply(j.trainer_job("trainer-a", 2_000, 8, 1, wait_s=120, hold_s=900))
    j.wait_leased("trainer-a", 8, timeout=300)
    t0 = time.monotonic()
    st = j.kube.wait_until(lambda: (s := _report(j)).get("freeEnvs", 0) >= 8 and s,
                           timeout=300, interval=0.5, what="the buffer refilled")
    j.figures["buffer_refill_s"] = time.monotonic() - t0
    assert j.epool()["spec"]["replicas"] == 16 and st["readyEnvs"] == 16

    # trainer B: 8 free envs at once (wait_s=0 fails otherwise); then 24 envs need a
    # second 16-env worker pod, which KubeRay starts on the real node
    # (B holds its lease for 120 s after stepping, so this is seen while it leases)
    j.kube.apply(j.trainer_job("trainer-b", 2_000, 8, 2, wait_s=0, hold_s=120))
    j.wait_leased("trainer-b", 16, timeout=300)
    j.kube.wait_until(lambda: j.epool()["spec"]["replicas"] == 24, timeout=60,
                      what="24 envs asked while B leases")
    j.kube.wait_until(lambda: _workers(j) == 2 and _running_workers(j) == 2, timeout=110,
                      interval=1, what="a second worker pod running")
    b = j.job_result("trainer-b", timeout=300)
    j.figures["second_trainer_attach_s"] = b["attach_s"]
    assert b["steps"] >= 2_000 and b["errors"] == 0, b

    # B has left: after the delay 16 envs, one worker pod; the pod that goes is the one
    # without A's leased actors (workersToDelete), so none of A's actors is restarted
    j.kube.wait_until(lambda: j.epool()["spec"]["replicas"] == 16, timeout=DELAY_S + 120,
                      interval=1, what="16 envs once B left")
    j.kube.wait_until(lambda: _workers(j) == 1 and _running_workers(j) == 1, timeout=180,
                      interval=1, what="one worker pod while A still leases")
    st = _report(j)
    assert (st["leasedEnvs"], st["restarts"]) == (8, 0), st

    # everyone leaves: after the delay, back to minReplicas and one worker
    j.kube.kubectl("delete", "job", "trainer-a", "-n", j.ns, "--wait=false")
    j.kube.wait_until(lambda: _report(j).get("leasedEnvs") == 0, timeout=120, interval=1,
                      what="trainer A's lease gone (its pod deleted: the lease times out)")
    t1 = time.monotonic()
    j.kube.wait_until(lambda: j.epool()["spec"]["replicas"] == 8, timeout=DELAY_S + 120,
                      interval=1, what="back to minReplicas")
    # the delay runs from the operator's last pass that still saw the lease: up to one
    # autoscale pass (5 s) before the report changed, which this test saw up to a poll
    # (1 s) and a kubectl call later
    assert time.monotonic() - t1 >= DELAY_S - 8
    j.wait_ready(timeout=120, replicas=8)
    j.kube.wait_until(lambda: _workers(j) == 1 and _running_workers(j) == 1, timeout=180,
                      interval=1, what="back to one worker pod")
    columns = j.kube.kubectl("get", "epool", j.pool, "-n", j.ns).stdout.splitlines()
    row = dict(zip(columns[0].split(), columns[1].split(), strict=False))
    assert (row["LEASED"], row["FREE"], row["DESIRED"]) == ("0", "8", "8"), columns
