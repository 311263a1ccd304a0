"""The README's "On Kubernetes, top to bottom" on the real node, nothing faked in between.

``helm install`` the operator (a pod of the project image, in-cluster config, the
chart's RBAC, restricted pod security) -> ``helm test`` -> ``kubectl apply`` the
cartpole example (placed on the real node, sized for 2 cores) -> KubeRay runs the
head (Ray + pool server) and a worker for real -> the EnvPool turns Ready from the
pool server's own report (no test writes ``status.pool`` here) -> a trainer Job of
the same image leases envs with ``RemoteVectorEnv.from_pool`` over Ray client and
steps them -> ``kubectl scale`` -> faults on real pods -> ``helm uninstall`` and the
EnvPool deleted leave nothing behind.

One module-scoped pool: the steps build on each other, as a user's would.
"""

from __future__ import annotations

import json
import secrets
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from real_node import NODE_SELECTOR, RESTRICTED_CONTAINER, RESTRICTED_POD, TOLERATIONS, RealNode

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "helm" / "envpool-operator"
EXAMPLE = REPO / "manifests" / "examples" / "cartpole.yaml"
POOL = "cartpole"
#: A Ray head (GCS, dashboard, client server) plus the pool server, and one worker
#: with 2 actors of 8 CartPole envs: what fits beside the test suite on 2 cores.
HEAD_RESOURCES = {"requests": {"cpu": "200m", "memory": "1Gi"}, "limits": {"memory": "3Gi"}}
WORKER_RESOURCES = {"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"memory": "3Gi"}}

TRAINER = r"""
import json, os, sys, time
import numpy as np
from remote_env import RemoteVectorEnv

steps_wanted = int(sys.argv[1])
wait_s = float(sys.argv[4]) if len(sys.argv) > 4 else 120.0  # 0: free envs at once or fail
hold_s = float(sys.argv[5]) if len(sys.argv) > 5 else 0.0  # keep the lease after stepping
pool = os.environ.get("POOL", "cartpole")
t0 = time.monotonic()
envs = RemoteVectorEnv.from_pool(
    pool, address=f"ray://{pool}-head-svc:10001", num_envs=int(sys.argv[2]),
    wait_s=wait_s, trainer=os.environ.get("TRAINER", "trainer"))
attached = time.monotonic() - t0
slots = sorted(int(x) for x in envs.slots)
obs, info = envs.reset(seed=int(sys.argv[3]))
first_step = None
steps = episodes = errors = 0
t1 = time.monotonic()
while steps < steps_wanted:
    obs, rew, term, trunc, info = envs.step(envs.action_space.sample())
    if first_step is None:
        first_step = time.monotonic() - t0
    steps += envs.num_envs
    episodes += int(np.sum(term | trunc))
    if "error" in info:
        errors += int(np.sum(info.get("_error", [])))
rate = steps / (time.monotonic() - t1)
time.sleep(hold_s)
envs.close()
print(json.dumps({"steps": steps, "episodes": episodes, "errors": errors, "attach_s": attached,
                  "first_step_s": first_step, "steps_per_s": rate, "num_envs": envs.num_envs,
                  "slots": slots}))
"""


def _placed(spec: dict[str, Any]) -> dict[str, Any]:
    return {"nodeSelector": dict(NODE_SELECTOR), "tolerations": [dict(t) for t in TOLERATIONS], **spec}


def _example(namespace: str) -> dict[str, Any]:
    """manifests/examples/cartpole.yaml as a user applies it, placed and sized for this node."""
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["metadata"]["namespace"] = namespace
    ray = doc["spec"].setdefault("ray", {})
    ray["head"] = _placed({"resources": HEAD_RESOURCES})
    ray["worker"] = _placed({"resources": WORKER_RESOURCES})
    return doc


class Journey:
    def __init__(self, kube: Any, node: RealNode, namespace: str, release: str,
                 pool: str = POOL) -> None:
        self.kube, self.node, self.ns, self.release = kube, node, namespace, release
        self.pool = pool
        self.figures: dict[str, float] = {}
        self.tmp = Path(tempfile.mkdtemp(prefix="journey-"))

    def install_operator(self) -> None:
        """``helm install`` the chart as a user would: the operator a pod of the project
        image on the real node, watching this namespace; then ``helm test``."""
        img = self.node.image
        values = {
            "image": {"repository": img.rsplit(":", 1)[0], "tag": img.rsplit(":", 1)[1],
                      "pullPolicy": "Never"},
            "operator": {"watchNamespaces": [self.ns]},
            "nodeSelector": dict(NODE_SELECTOR),
            "tolerations": [dict(t) for t in TOLERATIONS],
            "resources": {"requests": {"cpu": "50m", "memory": "128Mi"},
                          "limits": {"memory": "512Mi"}},
        }
        vfile = self.tmp / "values.yaml"
        vfile.write_text(yaml.safe_dump(values))
        self.kube.helm("install", self.release, str(CHART), "-n", self.ns, "-f", str(vfile),
                       "--wait", "--timeout", "180s")

    def operator_pod(self) -> dict[str, Any]:
        pods = self.kube.kubectl_json(
            "get", "pods", "-n", self.ns, "-l", "app.kubernetes.io/name=envpool-operator")["items"]
        (pod,) = [p for p in pods if "helm.sh/hook" not in p["metadata"].get("annotations", {})]
        return dict(pod)

    def epool(self) -> dict[str, Any]:
        return self.kube.kubectl_json("get", "envpool", self.pool, "-n", self.ns)

    def pods(self, component: str) -> list[dict[str, Any]]:
        sel = f"envpool.dev/pool={self.pool},app.kubernetes.io/component={component}"
        return self.kube.kubectl_json("get", "pods", "-n", self.ns, "-l", sel)["items"]

    def wait_ready(self, timeout: float, replicas: int | None = None) -> dict[str, Any]:
        def ready() -> dict[str, Any] | None:
            ep = self.epool()
            st = ep.get("status", {})
            report = st.get("pool") or {}
            want = replicas if replicas is not None else ep["spec"]["replicas"]
            if st.get("phase") == "Ready" and report.get("readyEnvs") == want:
                return ep
            return None

        try:
            return self.kube.wait_until(ready, timeout=timeout, interval=1,
                                        what=f"EnvPool {self.ns}/{self.pool} Ready from the pool server's report")
        except pytest.fail.Exception as exc:
            pytest.fail(f"{exc}\n{self.diagnose()}", pytrace=False)

    def diagnose(self) -> str:
        """What a user would look at: pods, the EnvPool's conditions, the pool server's log."""
        ep = self.kube.kubectl_json("get", "envpool", self.pool, "-n", self.ns, check=False) or {}
        out = [self.kube.kubectl("get", "pods", "-n", self.ns, "-o", "wide", check=False).stdout,
               json.dumps(ep.get("status", {}), indent=1)[:3000]]
        for head in self.pods("head"):
            out.append(self.kube.kubectl("logs", head["metadata"]["name"], "-n", self.ns, "-c", "pool-server",
                                         "--tail", "40", check=False).stdout)
        return "\n".join(out)

    def server_status(self) -> dict[str, Any]:
        (head,) = self.pods("head")
        port = self.epool()["spec"]["metrics"]["port"]
        out = self.kube.kubectl(
            "exec", head["metadata"]["name"], "-n", self.ns, "-c", "pool-server", "--", "python", "-c",
            f"import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:{port}/status').read().decode())",
        ).stdout
        return json.loads(out)

    def trainer_job(self, name: str, steps: int, num_envs: int, seed: int,
                    wait_s: float = 120.0, hold_s: float = 0.0) -> dict[str, Any]:
        container = {
            "name": "trainer",
            "image": self.node.image,
            "imagePullPolicy": "Never",
            "command": ["python", "-c", TRAINER, str(steps), str(num_envs), str(seed),
                        str(wait_s), str(hold_s)],
            "env": [{"name": "TRAINER", "value": name}, {"name": "HOME", "value": "/tmp"},
                    {"name": "POOL", "value": self.pool},
                    {"name": "RAY_USAGE_STATS_ENABLED", "value": "0"},
                    # the pool's Ray token (KubeRay's Secret <pool>, README "Security")
                    {"name": "RAY_AUTH_MODE", "value": "token"},
                    {"name": "RAY_AUTH_TOKEN", "valueFrom": {"secretKeyRef": {
                        "name": self.pool, "key": "auth_token"}}}],
            "resources": {"requests": {"cpu": "100m", "memory": "512Mi"}, "limits": {"memory": "2Gi"}},
            "securityContext": dict(RESTRICTED_CONTAINER),
            "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
        }
        return {
            "apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": name, "namespace": self.ns},
            "spec": {
                "backoffLimit": 0,
                "template": {
                    "metadata": {"labels": {"app": name, "envpool.dev/trainer": "true"}},
                    "spec": {
                        "restartPolicy": "Never",
                        "enableServiceLinks": False,
                        "automountServiceAccountToken": False,
                        "nodeSelector": dict(NODE_SELECTOR),
                        "tolerations": [dict(t) for t in TOLERATIONS],
                        "securityContext": dict(RESTRICTED_POD),
                        "containers": [container],
                        "volumes": [{"name": "tmp", "emptyDir": {}}],
                    },
                },
            },
        }

    def job_result(self, name: str, timeout: float) -> dict[str, Any]:
        def done() -> dict[str, Any] | None:
            job = self.kube.kubectl_json("get", "job", name, "-n", self.ns)
            conds = {c["type"]: c["status"] for c in job.get("status", {}).get("conditions", [])}
            return job if conds.get("Complete") == "True" or conds.get("Failed") == "True" else None

        job = self.kube.wait_until(done, timeout=timeout, interval=1, what=f"trainer Job {name}")
        logs = self.kube.kubectl("logs", f"job/{name}", "-n", self.ns, check=False).stdout
        conds = {c["type"]: c["status"] for c in job["status"].get("conditions", [])}
        assert conds.get("Complete") == "True", f"trainer {name} failed:\n{logs[-4000:]}"
        return json.loads(logs.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def journey(kube_cluster: Any, real_node: RealNode) -> Iterator[Journey]:
    ns = f"journey-{secrets.token_hex(3)}"
    release = "envpool-operator"
    kube_cluster.kubectl("create", "namespace", ns)
    kube_cluster.kubectl("label", "namespace", ns, "pod-security.kubernetes.io/enforce=restricted")
    kube_cluster.wait_until(
        lambda: kube_cluster.kubectl("get", "sa", "default", "-n", ns, check=False).returncode == 0,
        timeout=30, what="default ServiceAccount")
    # the CRD of this checkout (helm install keeps an existing CRD as it is)
    kube_cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(REPO / "manifests" / "crd"))
    j = Journey(kube_cluster, real_node, ns, release)
    try:
        yield j
    finally:
        kube_cluster.helm("uninstall", release, "-n", ns, "--wait", check=False)
        kube_cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)
        for k, v in j.figures.items():
            real_node.record(f"journey_{k}", v)


def test_1_helm_install_runs_the_operator_as_a_pod(journey: Journey) -> None:
    journey.install_operator()
    pod = journey.operator_pod()
    assert pod["spec"]["nodeName"] == journey.node.name
    assert pod["status"]["phase"] == "Running"
    assert pod["spec"]["serviceAccountName"].startswith(journey.release)
    assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
    logs = journey.kube.kubectl("logs", pod["metadata"]["name"], "-n", journey.ns).stdout
    assert "Traceback" not in logs, logs
    test = journey.kube.helm("test", journey.release, "-n", journey.ns, "--timeout", "120s", check=False)
    assert test.returncode == 0, f"helm test failed:\n{test.stdout}\n{test.stderr}"


def test_2_apply_the_example_and_ready_from_the_pool_servers_report(journey: Journey) -> None:
    t0 = time.monotonic()
    journey.kube.apply(_example(journey.ns))
    ep = journey.wait_ready(timeout=420)
    journey.figures["apply_to_ready_s"] = time.monotonic() - t0
    report = ep["status"]["pool"]
    assert report["readyEnvs"] == report["desiredEnvs"] == 16, report
    (head,) = journey.pods("head")
    workers = journey.pods("worker")
    assert head["spec"]["nodeName"] == journey.node.name
    assert workers and all(w["spec"]["nodeName"] == journey.node.name for w in workers)
    assert all(w["status"]["phase"] == "Running" for w in [head, *workers])
    # the pool server's own /status, read inside its container
    status = journey.server_status()
    assert status["readyEnvs"] == 16 and status["healthy"], status
    columns = journey.kube.kubectl("get", "epool", POOL, "-n", journey.ns).stdout
    header = columns.splitlines()[0].split()
    assert {"NAME", "PHASE", "READY"} <= set(header), columns
    assert "Ready" in columns.splitlines()[1], columns


def test_3_trainers_attach_and_step_disjoint_actors(journey: Journey) -> None:
    t0 = time.monotonic()
    journey.kube.apply([journey.trainer_job("trainer-a", 12_000, 8, 1),
                        journey.trainer_job("trainer-b", 12_000, 8, 2)])
    a = journey.job_result("trainer-a", timeout=300)
    b = journey.job_result("trainer-b", timeout=300)
    journey.figures["apply_trainer_to_first_step_s"] = max(a["first_step_s"], b["first_step_s"])
    journey.figures["trainer_jobs_done_s"] = time.monotonic() - t0
    journey.figures["trainer_steps_per_s"] = a["steps_per_s"] + b["steps_per_s"]
    for got in (a, b):
        assert got["steps"] >= 10_000 and got["episodes"] > 0 and got["errors"] == 0, got
        assert got["num_envs"] == 8
    # at the same time, on actors of their own (whole actors are leased)
    assert a["slots"] and b["slots"] and not set(a["slots"]) & set(b["slots"]), (a["slots"], b["slots"])
    # close() handed every env back: the pool is whole and free again
    journey.wait_ready(timeout=60)
    status = journey.kube.wait_until(lambda: (st := journey.server_status())["leasedEnvs"] == 0 and st,
                                     timeout=60, what="every lease returned")
    assert status["readyEnvs"] == 16, status


def test_3b_a_client_without_the_pools_ray_token_is_refused(journey: Journey) -> None:
    job = journey.trainer_job("no-token", 100, 8, 3)
    pod = job["spec"]["template"]["spec"]
    pod["containers"][0]["env"] = [e for e in pod["containers"][0]["env"]
                                   if not e["name"].startswith("RAY_AUTH")]
    job["spec"]["activeDeadlineSeconds"] = 150
    journey.kube.apply(job)

    def finished() -> dict[str, str] | None:
        got = journey.kube.kubectl_json("get", "job", "no-token", "-n", journey.ns)
        conds = {c["type"]: c["status"] for c in got.get("status", {}).get("conditions", [])}
        return conds if "True" in (conds.get("Complete"), conds.get("Failed")) else None

    conds = journey.kube.wait_until(finished, timeout=240, interval=1, what="the token-less trainer to end")
    logs = journey.kube.kubectl("logs", "job/no-token", "-n", journey.ns, check=False).stdout
    assert conds.get("Failed") == "True" and conds.get("Complete") != "True", (conds, logs[-2000:])
    assert '"steps"' not in logs, logs[-2000:]
    # the pool is untouched by the refused client
    assert journey.server_status()["leasedEnvs"] == 0


def test_4_kubectl_scale_resizes_the_same_ray_cluster(journey: Journey) -> None:
    uid = journey.kube.kubectl_json("get", "raycluster", POOL, "-n", journey.ns)["metadata"]["uid"]
    t0 = time.monotonic()
    journey.kube.kubectl("scale", f"epool/{POOL}", "-n", journey.ns, "--replicas=24")
    journey.wait_ready(timeout=180, replicas=24)
    journey.figures["scale_16_to_24_ready_s"] = time.monotonic() - t0
    assert journey.server_status()["readyEnvs"] == 24
    journey.kube.kubectl("scale", f"epool/{POOL}", "-n", journey.ns, "--replicas=16")
    journey.wait_ready(timeout=180, replicas=16)
    rc = journey.kube.kubectl_json("get", "raycluster", POOL, "-n", journey.ns)
    assert rc["metadata"]["uid"] == uid, "kubectl scale must not make a new RayCluster"


def test_5_a_deleted_worker_pod_is_replaced_and_the_pool_recovers(journey: Journey) -> None:
    (worker,) = journey.pods("worker")
    restarts_before = journey.server_status()["restarts"]
    t0 = time.monotonic()
    journey.kube.kubectl("delete", "pod", worker["metadata"]["name"], "-n", journey.ns, "--wait=false")

    def recovered() -> bool:
        pods = journey.pods("worker")
        fresh = [p for p in pods if p["metadata"]["name"] != worker["metadata"]["name"]]
        st = journey.server_status()
        return bool(fresh) and st["readyEnvs"] == 16 and st["restarts"] > restarts_before

    journey.kube.wait_until(recovered, timeout=300, interval=1, what="a new worker and every env back")
    journey.figures["worker_pod_deleted_to_envs_back_s"] = time.monotonic() - t0
    journey.wait_ready(timeout=60)


def test_6_uninstall_leaves_nothing_behind(journey: Journey) -> None:
    journey.kube.helm("uninstall", journey.release, "-n", journey.ns, "--wait")
    journey.kube.kubectl("delete", "epool", POOL, "-n", journey.ns, "--wait=false")

    left: list[str] = []

    def gone() -> bool:
        left.clear()
        for kind in ("pods", "rayclusters", "configmaps", "roles", "rolebindings", "serviceaccounts"):
            # the trainers' finished Job pods are the user's own, not the pool's or the chart's
            items = journey.kube.kubectl_json("get", kind, "-n", journey.ns, "-l", "!envpool.dev/trainer")["items"]
            left.extend(f"{kind}/{i['metadata']['name']}" for i in items
                        if i["metadata"]["name"] not in ("default", "kube-root-ca.crt"))
        return not left

    try:
        journey.kube.wait_until(gone, timeout=180, interval=1, what="every pool and chart object gone")
    except pytest.fail.Exception as exc:
        pytest.fail(f"{exc}\nleft: {left}", pytrace=False)
    # and no Ray process of the pool is left on the node
    ps = subprocess.run(["pgrep", "-f", f"raylet.*{journey.ns}|gcs_server.*{journey.ns}"],
                        capture_output=True, text=True)
    assert ps.stdout.strip() == "", ps.stdout
