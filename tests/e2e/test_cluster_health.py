"""The test cluster keeps itself whole (tests/cluster/health.sh, up.sh, the e2e fixtures).

A control-plane component that dies (SIGKILL, or an elected component that lost its
lease to a slow API server) is noticed by the fixtures' health step and restarted,
and the cluster works afterwards: namespaces get their ServiceAccount, pods are
scheduled, deletions complete. The single-instance components run without leader
election, so an API server that stops answering for longer than a lease deadline
does not make them exit.
"""

from __future__ import annotations

import os
import secrets
import signal
import time
from typing import Any

import pytest
from conftest import KWOK_COMPONENTS, NODE_COMPONENTS

pytestmark = [pytest.mark.e2e]

# kube-controller-manager's and kube-scheduler's leader election defaults: a leader
# that cannot renew within 10 s gives up (and exits); a lease lasts 15 s.
FORMER_RENEW_DEADLINE_S = 10.0
FORMER_LEASE_DURATION_S = 15.0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a killed child of ours not yet reaped is a zombie: gone for our purposes
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _components(kube: Any) -> list[str]:
    names = [*KWOK_COMPONENTS, "ray-operator"]
    if os.environ.get("ENVPOOL_CLUSTER_REAL_NODE", "1") == "1":
        names += NODE_COMPONENTS
    return names


def _cluster_works(kube: Any) -> None:
    """A new namespace gets its ServiceAccount, a pod on a kwok node is scheduled and
    runs, and deleting the namespace completes: the controller-manager's service
    account, namespace and garbage-collection controllers and the scheduler all work."""
    ns = f"e2e-health-{secrets.token_hex(3)}"
    kube.kubectl("create", "namespace", ns)
    try:
        kube.wait_until(
            lambda: kube.kubectl("get", "serviceaccount", "default", "-n", ns, check=False).returncode == 0,
            timeout=60, what=f"ServiceAccount default in the new namespace {ns}",
        )
        kube.apply({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "probe", "namespace": ns},
            "spec": {
                "nodeSelector": {"type": "kwok"},
                "containers": [{"name": "probe", "image": "localhost/never-pulled:0"}],
            },
        })

        def scheduled_and_running() -> str | None:
            pod = kube.kubectl_json("get", "pod", "probe", "-n", ns)
            node = pod["spec"].get("nodeName") or ""
            return node if node.startswith("kwok-node-") and pod["status"].get("phase") == "Running" else None

        kube.wait_until(scheduled_and_running, timeout=60, what="the probe pod scheduled on a kwok node and Running")
    finally:
        kube.kubectl("delete", "namespace", ns, "--wait=false", "--ignore-not-found", check=False)
    kube.wait_until(
        lambda: kube.kubectl("get", "namespace", ns, check=False).returncode != 0,
        timeout=120, what=f"deletion of namespace {ns} to complete",
    )


def test_health_step_restarts_a_killed_controller_manager_and_scheduler(kube_cluster: Any) -> None:
    whole, status = kube_cluster.health()
    assert whole, f"the cluster should be whole before the test (the module fixture mends it):\n{status}"
    killed = {c: kube_cluster.component_pid(c) for c in ("kube-controller-manager", "kube-scheduler")}
    assert all(killed.values()), killed
    for pid in killed.values():
        os.kill(pid, signal.SIGKILL)
    kube_cluster.wait_until(lambda: not any(_alive(p) for p in killed.values()), timeout=10,
                            what="the killed components to be gone")

    whole, status = kube_cluster.health()
    assert not whole
    for c in killed:
        assert f"{c} down" in status, status

    mended = kube_cluster.heal()
    assert "kube-controller-manager down" in mended and "kube-scheduler down" in mended, mended
    whole, status = kube_cluster.health()
    assert whole, status
    for c, old in killed.items():
        new = kube_cluster.component_pid(c)
        assert new and new != old and _alive(new), (c, old, new)
    _cluster_works(kube_cluster)


def test_components_outlive_an_api_server_stopped_longer_than_a_lease(kube_cluster: Any) -> None:
    whole, status = kube_cluster.health()
    assert whole, status
    names = _components(kube_cluster)
    before = {c: kube_cluster.component_pid(c) for c in names}
    assert all(before.values()), before
    api = before["kube-apiserver"]
    assert api is not None
    pause_s = FORMER_LEASE_DURATION_S + 5
    os.kill(api, signal.SIGSTOP)
    try:
        # The pause is the point of the test: longer than the 10 s renew deadline and
        # the 15 s lease after which an elected controller-manager or scheduler exits.
        time.sleep(pause_s)
    finally:
        os.kill(api, signal.SIGCONT)
    assert pause_s > FORMER_RENEW_DEADLINE_S

    def api_serves() -> bool:
        return kube_cluster.kubectl("get", "--raw", "/readyz", check=False, timeout=10).stdout == "ok"

    kube_cluster.wait_until(api_serves, timeout=60, what="the API server to serve again")
    # an elected component would exit right after its renew deadline; give one more
    # renew period for anything that is about to go
    kube_cluster.wait_until(lambda: kube_cluster.health()[0], timeout=60,
                            what="every component healthy after the pause")
    gone = {c: pid for c, pid in before.items() if not _alive(pid)}  # type: ignore[arg-type]
    assert not gone, f"components exited during the API server's {pause_s:.0f} s pause: {gone}"
    after = {c: kube_cluster.component_pid(c) for c in names}
    assert after == before, f"components were restarted: {before} -> {after}"
    _cluster_works(kube_cluster)
