"""Parts of the real-node user journey (test_user_journey.py) that are not steps.

* ``STEPPING_TRAINER``: a trainer pod's script that steps its leased envs with
  ``send``/``recv`` (dynamic batching: healthy envs keep flowing while a lost actor
  is replaced) until ``/tmp/stop`` exists, serves its own ``/metrics`` (the polls,
  steps and failures panels are the trainer's series) and accounts for every step it
  sent: answered, or a truncated step carrying ``info["error"]``.
* ``MonitorDiscovery``: the chart's ServiceMonitor (operator) and PodMonitor (pool
  servers), plus trainer pods, as file_sd targets kept current from the API server,
  for a Prometheus outside the cluster that reaches the pods over the pod network.
* ``peak_rss_bytes``: a pod's peak memory from its cgroup on the real node;
  ``sigkill_container``: a container's processes SIGKILLed from the node.
* ``Journey``: one pool in one namespace with the operator installed by ``helm
  install``, and the trainer Jobs and faults that the journey and the chaos soak
  (test_soak.py) run against it.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import re
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from real_node import NODE_SELECTOR, RESTRICTED_CONTAINER, RESTRICTED_POD, TOLERATIONS, RealNode

REPO = Path(__file__).resolve().parents[2]
ALERTS = REPO / "helm" / "envpool-operator" / "files" / "envpool-alerts.yaml"
DASHBOARD = REPO / "helm" / "envpool-operator" / "files" / "envpool-dashboard.json"
TRAINER_METRICS_PORT = 9481
#: What Grafana puts in for the dashboard's variables ("All" and $__rate_interval
#: for a 1 s scrape interval).
GRAFANA_VARS = {"$namespace": ".*", "$pool": ".*", "$__rate_interval": "10s"}

STEPPING_TRAINER = r"""
import json, os, sys, time, traceback
import numpy as np
from remote_env import RemoteVectorEnv
from remote_env.metrics import PoolMetrics, serve_metrics

pool, num_envs, step_timeout = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
metrics = PoolMetrics(pool=pool, namespace=os.environ["POD_NAMESPACE"])
serve_metrics(metrics.registry, int(os.environ["METRICS_PORT"]), "0.0.0.0")
t0 = time.monotonic()
try:
    envs = RemoteVectorEnv.from_pool(
        pool, address=f"ray://{pool}-head-svc:10001", num_envs=num_envs, wait_s=180,
        trainer=os.environ["TRAINER"], step_timeout_s=step_timeout, metrics=metrics)
    n, space = envs.num_envs, envs.single_action_space
    envs.reset(seed=int(os.environ.get("SEED", "0")))  # gymnasium's order: reset, then step
    sent, answered = np.zeros(n, np.int64), np.zeros(n, np.int64)
    errors = untruncated_errors = episodes = 0
    last_error, slowest_recv = "", 0.0
    envs.send(np.stack([space.sample() for _ in range(n)]))
    sent += 1
    printed = time.monotonic()
    print(json.dumps({"attached_s": printed - t0, "num_envs": n}), flush=True)
    while True:
        stopping = os.path.exists("/tmp/stop")
        if stopping and (sent == answered).all():
            break
        t = time.monotonic()
        obs, rew, term, trunc, info = envs.recv()
        slowest_recv = max(slowest_recv, time.monotonic() - t)
        ids = np.asarray(info["env_id"])
        answered[ids] += 1
        episodes += int(np.sum(term | trunc))
        if "error" in info:
            bad = np.asarray(info["_error"], dtype=bool)
            errors += int(bad.sum())
            untruncated_errors += int((bad & ~np.asarray(trunc, dtype=bool)).sum())
            last_error = str(np.asarray(info["error"], dtype=object)[bad][0])
        if not stopping:
            envs.send(np.stack([space.sample() for _ in ids]), ids)
            sent[ids] += 1
        if time.monotonic() - printed >= 2:
            printed = time.monotonic()
            print(json.dumps({"t": printed - t0, "wall": time.time(), "steps": int(answered.sum()),
                              "errors": errors}),
                  flush=True)
    elapsed = time.monotonic() - t0
    envs.close()
    print(json.dumps({"done": True, "steps": int(answered.sum()), "sent": int(sent.sum()),
                      "unanswered": int((sent - answered).sum()), "errors": errors,
                      "untruncated_errors": untruncated_errors, "episodes": episodes,
                      "slowest_recv_s": slowest_recv, "last_error": last_error,
                      "seconds": elapsed}), flush=True)
except BaseException as exc:
    print(json.dumps({"done": False, "after_s": time.monotonic() - t0,
                      "exception": f"{type(exc).__name__}: {exc}"[:2000],
                      "traceback": traceback.format_exc()[-3000:]}), flush=True)
    sys.exit(3)
"""


def last_json(logs: str, key: str) -> dict[str, Any] | None:
    """The last JSON line of ``logs`` that has ``key``."""
    for line in reversed(logs.strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                doc = json.loads(line)
            except ValueError:
                continue
            if key in doc:
                return doc
    return None


#: Scrape jobs: the chart's ServiceMonitor (operator), PodMonitor (pool servers), trainers.
JOBS = ("envpool-operator", "envpool-pool-server", "envpool-trainer")


def monitor_targets(pods: list[dict[str, Any]], endpoints: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Prometheus file_sd target groups per job, selected as the chart's monitors select:

    * envpool-operator (ServiceMonitor): endpoints of the Service labelled
      ``app.kubernetes.io/name=envpool-operator``, port ``metrics``;
    * envpool-pool-server (PodMonitor): pods labelled ``envpool.dev/metrics=true``,
      container ``pool-server``, its port named ``metrics``;
    * envpool-trainer: running pods labelled ``envpool.dev/trainer``, port ``metrics``.
    """
    out: dict[str, list[dict[str, Any]]] = {job: [] for job in JOBS}
    for ep in endpoints:
        if ep["metadata"].get("labels", {}).get("app.kubernetes.io/name") != "envpool-operator":
            continue
        for subset in ep.get("subsets") or ():
            ports = [p["port"] for p in subset.get("ports", []) if p.get("name") == "metrics"]
            for addr in subset.get("addresses") or ():
                out["envpool-operator"] += [{"targets": [f"{addr['ip']}:{port}"], "labels": {}} for port in ports]
    for pod in pods:
        ip, labels = pod.get("status", {}).get("podIP"), pod["metadata"].get("labels", {})
        if not ip or pod["status"].get("phase") != "Running":
            continue
        for c in pod["spec"]["containers"]:
            ports = [p["containerPort"] for p in c.get("ports", []) if p.get("name") == "metrics"]
            if labels.get("envpool.dev/metrics") == "true" and c["name"] == "pool-server":
                job = "envpool-pool-server"
            elif labels.get("envpool.dev/trainer"):
                job = "envpool-trainer"
            else:
                continue
            out[job] += [{"targets": [f"{ip}:{port}"], "labels": {}} for port in ports]
    return out


class MonitorDiscovery:
    """Service discovery for a Prometheus built without Kubernetes SD (Debian's is):
    every ``interval`` s, list the namespace's pods and endpoints from the API server and
    write each job's targets to a file_sd file Prometheus watches."""

    def __init__(self, kube: Any, namespace: str, directory: Path, interval: float = 2.0) -> None:
        self.kube, self.ns, self.dir, self.interval = kube, namespace, directory, interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="monitor-discovery", daemon=True)

    def scrape_configs(self) -> list[dict[str, Any]]:
        return [{"job_name": job, "honor_labels": job != "envpool-operator",
                 "file_sd_configs": [{"files": [str(self.dir / f"{job}.json")], "refresh_interval": "5s"}]}
                for job in JOBS]

    def refresh(self) -> None:
        pods = self.kube.kubectl_json("get", "pods", "-n", self.ns, check=False)
        eps = self.kube.kubectl_json("get", "endpoints", "-n", self.ns, check=False)
        if pods is None or eps is None:
            return
        for job, groups in monitor_targets(pods["items"], eps["items"]).items():
            tmp = self.dir / f".{job}.json"
            tmp.write_text(json.dumps(groups))
            tmp.replace(self.dir / f"{job}.json")  # atomic: Prometheus never reads half a file

    def start(self) -> MonitorDiscovery:
        self.refresh()
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.refresh()
            except Exception:  # a transient API error: the next round tries again
                pass


def alert_rules_without_for(dest: Path) -> Path:
    """The shipped alert rules with ``for`` removed: the test proves each expression
    fires on real data; the durations are proven by promtool (helm/tests)."""
    rules = yaml.safe_load(ALERTS.read_text())
    for group in rules["groups"]:
        group["interval"] = "2s"
        for rule in group["rules"]:
            rule.pop("for", None)
    dest.write_text(yaml.safe_dump(rules))
    return dest


def dashboard_queries() -> list[tuple[str, str]]:
    """(panel title, query as Grafana sends it) for every target of the shipped dashboard."""
    dashboard = json.loads(DASHBOARD.read_text())
    out = []
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            expr = target["expr"]
            for var, value in GRAFANA_VARS.items():
                expr = expr.replace(var, value)
            assert "$" not in expr, f"unsubstituted variable in {expr}"
            out.append((panel["title"], expr))
    return out


def peak_rss_bytes(pod_uid: str) -> int | None:
    """Peak memory of a pod of the real node: its cgroup's ``memory.max_usage_in_bytes``
    (cgroup v1, kubelet's cgroupfs driver: kubepods/<qos>/pod<uid>)."""
    for path in glob.glob(f"/sys/fs/cgroup/memory/kubepods/**/pod{pod_uid}/memory.max_usage_in_bytes",
                          recursive=True):
        return int(Path(path).read_text())
    return None


def sigkill_container(pod: dict[str, Any], container: str) -> list[int]:
    """SIGKILL every process of one container of a real-node pod from the node (this
    machine, as root), as the kernel's OOM killer ends a process: nothing it can catch or
    finish, and its PID 1 too, which no ``kill`` inside the container can end (a
    container's init ignores signals it has no handler for). Returns the pids killed;
    the kubelet restarts the container in the same pod (restartCount + 1)."""
    (status,) = [c for c in pod["status"]["containerStatuses"] if c["name"] == container]
    cid = str(status["containerID"]).split("://", 1)[1]
    uid = pod["metadata"]["uid"]
    # kubelet's cgroupfs driver (cgroup v1): kubepods/<qos>/pod<uid>/<container id>
    found = glob.glob(f"/sys/fs/cgroup/pids/kubepods/**/pod{uid}/{cid}/cgroup.procs", recursive=True)
    assert found, f"no cgroup of container {container} ({cid}) of pod {uid} on this machine"
    pids = [int(p) for p in Path(found[0]).read_text().split()]
    assert pids, f"container {container} of pod {pod['metadata']['name']} has no process"
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):  # ended with the container's init
            os.kill(pid, signal.SIGKILL)
    return pids


def steps_per_s(run_stdout: str) -> float:
    """steps/s from `envpool run`'s summary line."""
    m = re.search(r"\((\d+) steps/s\)", run_stdout)
    assert m, run_stdout[-2000:]
    return float(m.group(1))


CHART = REPO / "helm" / "envpool-operator"
EXAMPLE = REPO / "manifests" / "examples" / "cartpole.yaml"
POOL = "cartpole"
#: A Ray head (GCS, dashboard, client server) plus the pool server, and one worker
#: pod per actor of 8 CartPole envs (envsPerWorker 8): a lost worker costs a trainer
#: the envs of one actor while the other keeps stepping. What fits beside the test
#: suite on 2 cores (up to 3 workers when scaled to 24).
HEAD_RESOURCES = {"requests": {"cpu": "200m", "memory": "1Gi"}, "limits": {"memory": "3Gi"}}
WORKER_RESOURCES = {"requests": {"cpu": "250m", "memory": "768Mi"}, "limits": {"memory": "3Gi"}}
#: faultTolerance.stepTimeoutSeconds of the journey's pool: no step waits longer.
STEP_TIMEOUT_S = 10

TRAINER = r"""
import json, os, sys, time
import numpy as np
from remote_env import RemoteVectorEnv, ray_connect

steps_wanted = int(sys.argv[1])
wait_s = float(sys.argv[4]) if len(sys.argv) > 4 else 120.0  # 0: free envs at once or fail
hold_s = float(sys.argv[5]) if len(sys.argv) > 5 else 0.0  # keep the lease after stepping
pool = os.environ.get("POOL", "cartpole")
address = os.environ.get("POOL_ADDRESS", f"ray://{pool}-head-svc:10001")
t0 = time.monotonic()
# the Ray client connection first, with patience whatever wait_s is: wait_s=0 asks for
# free envs at once, and a head busy starting this client's server is not "no envs"
ray_connect.connect(address, default="auto", wait_s=max(wait_s, 120.0))
# TRANSPORT=ray: Ray calls only, as a trainer that cannot reach pod addresses gets
envs = RemoteVectorEnv.from_pool(
    pool, num_envs=int(sys.argv[2]), wait_s=wait_s, trainer=os.environ.get("TRAINER", "trainer"),
    transport=os.environ.get("TRANSPORT", "auto"))
attached = time.monotonic() - t0
attached_at = time.time()
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
released_at = time.time()
envs.close()
print(json.dumps({"steps": steps, "episodes": episodes, "errors": errors, "attach_s": attached,
                  "attached_at": attached_at, "released_at": released_at,
                  "first_step_s": first_step, "steps_per_s": rate, "num_envs": envs.num_envs,
                  "slots": slots}))
"""


@contextlib.contextmanager
def port_forward(kube: Any, namespace: str, target: str, port: int) -> Iterator[int]:
    """``kubectl port-forward <target> :<port>`` from this machine, as from a laptop;
    yields the local port (on 127.0.0.1), stops it on exit."""
    forward = subprocess.Popen(
        [str(kube.kubectl_path), "--kubeconfig", str(kube.kubeconfig), "port-forward", "-n",
         namespace, target, f":{port}"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True)
    try:
        assert forward.stdout is not None
        line = forward.stdout.readline()  # "Forwarding from 127.0.0.1:<port> -> <port>"
        local = line.split("127.0.0.1:", 1)[1].split()[0] if "127.0.0.1:" in line else ""
        assert local.isdigit(), f"kubectl port-forward said {line!r}"
        yield int(local)
    finally:
        forward.terminate()
        forward.wait(timeout=10)


def placed(spec: dict[str, Any]) -> dict[str, Any]:
    return {"nodeSelector": dict(NODE_SELECTOR), "tolerations": [dict(t) for t in TOLERATIONS], **spec}


def example(namespace: str, *, head_fault_tolerance: bool = True) -> dict[str, Any]:
    """manifests/examples/cartpole.yaml as a user applies it, placed and sized for this
    node; ``head_fault_tolerance=False`` opts out of GCS fault tolerance (its own Redis)."""
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["metadata"]["namespace"] = namespace
    ray = doc["spec"].setdefault("ray", {})
    ray["head"] = placed({"resources": HEAD_RESOURCES})
    ray["worker"] = placed({"resources": WORKER_RESOURCES, "envsPerWorker": 8})
    doc["spec"]["faultTolerance"] = {"stepTimeoutSeconds": STEP_TIMEOUT_S}
    if not head_fault_tolerance:
        doc["spec"]["headFaultTolerance"] = {"enabled": False}
    return doc


class Journey:
    def __init__(self, kube: Any, node: RealNode, namespace: str, release: str,
                 pool: str = POOL, prom: Any = None) -> None:
        self.kube, self.node, self.ns, self.release = kube, node, namespace, release
        self.pool, self.prom = pool, prom
        self.figures: dict[str, float] = {}
        #: The image of the operator and the trainer Jobs: the project image of this
        #: checkout unless a test installs another version (the upgrade walk).
        self.image: str = node.image
        self.tmp = Path(tempfile.mkdtemp(prefix="journey-"))

    def install_operator(self, action: str = "install", chart: Path = CHART) -> None:
        """``helm install`` the chart as a user would: the operator a pod of the project
        image (``self.image``) on the real node, watching this namespace. ``action``
        "upgrade" upgrades the release to ``chart`` and ``self.image`` instead."""
        img = self.image
        values = {
            "image": {"repository": img.rsplit(":", 1)[0], "tag": img.rsplit(":", 1)[1],
                      "pullPolicy": "Never"},
            "operator": {"watchNamespaces": [self.ns]},
            "nodeSelector": dict(NODE_SELECTOR),
            "tolerations": [dict(t) for t in TOLERATIONS],
            "resources": {"requests": {"cpu": "50m", "memory": "128Mi"},
                          "limits": {"memory": "512Mi"}},
        }
        if self.node.redis_image and chart == CHART:
            # the pools' own Redis (GCS fault tolerance, on by default): Debian's, imported;
            # a chart of an older version may not know the value
            values["redis"] = {"image": self.node.redis_image}
        vfile = self.tmp / "values.yaml"
        vfile.write_text(yaml.safe_dump(values))
        self.kube.helm(action, self.release, str(chart), "-n", self.ns, "-f", str(vfile),
                       "--wait", "--timeout", "180s")

    def operator_pod(self, timeout: float = 60.0) -> dict[str, Any]:
        """The operator's one live pod. Right after a Recreate rollout (helm upgrade --wait,
        a deleted pod) the old pod can still be listed: its containers have exited, so the
        Deployment has started the new one, but its object is still being deleted. Such a
        pod (deletionTimestamp set, or phase Succeeded/Failed) is not the operator."""
        deadline = time.monotonic() + timeout
        while True:
            pods = self.kube.kubectl_json(
                "get", "pods", "-n", self.ns, "-l", "app.kubernetes.io/name=envpool-operator")["items"]
            live = [p for p in pods
                    if "helm.sh/hook" not in p["metadata"].get("annotations", {})
                    and not p["metadata"].get("deletionTimestamp")
                    and p.get("status", {}).get("phase") not in ("Succeeded", "Failed")]
            if len(live) == 1:
                return dict(live[0])
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"expected one live operator pod in {self.ns} within {timeout:.0f} s, found "
                    f"{[(p['metadata']['name'], p.get('status', {}).get('phase')) for p in pods]}")
            time.sleep(1.0)

    def epool(self) -> dict[str, Any]:
        return self.kube.kubectl_json("get", "envpool", self.pool, "-n", self.ns)

    def pods(self, component: str, *, terminating: bool = False) -> list[dict[str, Any]]:
        """The pool's ``component`` pods; one being deleted (a replaced head or worker,
        listed for a while after its successor) only if ``terminating``."""
        sel = f"envpool.dev/pool={self.pool},app.kubernetes.io/component={component}"
        pods = self.kube.kubectl_json("get", "pods", "-n", self.ns, "-l", sel)["items"]
        return [p for p in pods if terminating or not p["metadata"].get("deletionTimestamp")]

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

    def client_server_logs(self) -> str:
        """The head's Ray client server logs (a trainer's Ray client connection ends there)."""
        out = []
        for head in self.pods("head"):
            out.append(self.kube.kubectl(
                "exec", head["metadata"]["name"], "-n", self.ns, "-c", "ray-head", "--", "sh", "-c",
                "tail -n 25 /tmp/ray/session_latest/logs/ray_client_server*.err", check=False).stdout)
        return "\n".join(out)

    def server_status(self) -> dict[str, Any]:
        (head,) = self.pods("head")
        port = self.epool()["spec"]["metrics"]["port"]
        out = self.kube.kubectl(
            "exec", head["metadata"]["name"], "-n", self.ns, "-c", "pool-server", "--", "python", "-c",
            # detail=1 (actor ids, leases): answered to loopback, as here inside the pod
            f"import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:{port}/status?detail=1').read().decode())",
        ).stdout
        return json.loads(out)

    def trainer_job(self, name: str, steps: int, num_envs: int, seed: int,
                    wait_s: float = 120.0, hold_s: float = 0.0) -> dict[str, Any]:
        """A Job stepping ``steps`` env steps with ``step()`` (TRAINER) and printing a summary."""
        return self._job(name, ["python", "-c", TRAINER, str(steps), str(num_envs), str(seed),
                                str(wait_s), str(hold_s)])

    def stepping_job(self, name: str, num_envs: int) -> dict[str, Any]:
        """A Job stepping with send/recv until /tmp/stop, with /metrics (STEPPING_TRAINER)."""
        job = self._job(name, ["python", "-c", STEPPING_TRAINER, self.pool, str(num_envs), str(STEP_TIMEOUT_S)])
        (c,) = job["spec"]["template"]["spec"]["containers"]
        c["env"] += [{"name": "METRICS_PORT", "value": str(TRAINER_METRICS_PORT)},
                     {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
                     {"name": "PYTHONUNBUFFERED", "value": "1"}]
        c["ports"] = [{"name": "metrics", "containerPort": TRAINER_METRICS_PORT}]
        return job

    def _job(self, name: str, command: list[str]) -> dict[str, Any]:
        container = {
            "name": "trainer",
            "image": self.image,
            "imagePullPolicy": "Never",
            "command": command,
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
                    # the label the pool's NetworkPolicy admits (README "Network")
                    "metadata": {"labels": {"app": name, "envpool.dev/trainer": self.pool}},
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

    def job_pod(self, name: str) -> str:
        pods = self.kube.kubectl_json("get", "pods", "-n", self.ns, "-l", f"job-name={name}")["items"]
        assert len(pods) == 1, [p["metadata"]["name"] for p in pods]
        return str(pods[0]["metadata"]["name"])

    def logs(self, name: str) -> str:
        return str(self.kube.kubectl("logs", f"job/{name}", "-n", self.ns, check=False).stdout)

    def progress(self, name: str) -> int:
        """Steps a stepping trainer has answered so far (its last progress line)."""
        last = last_json(self.logs(name), "steps")
        return int(last["steps"]) if last else 0

    def wait_stepping(self, name: str, more_than: int = 0, timeout: float = 240) -> int:
        def stepping() -> int | None:
            logs = self.logs(name)
            if (end := last_json(logs, "done")) is not None:
                pytest.fail(f"trainer {name} ended early: {end}\n{logs[-3000:]}", pytrace=False)
            if self.job_failed(name):
                pytest.fail(f"trainer {name} failed before stepping:\n{logs[-3000:]}\n"
                            f"{self.diagnose()}", pytrace=False)
            return steps if (steps := self.progress(name)) > more_than else None

        return int(self.kube.wait_until(stepping, timeout=timeout, interval=1,
                                        what=f"trainer {name} stepping past {more_than} steps"))

    def stop_stepping(self, name: str, timeout: float = 120) -> dict[str, Any]:
        self.kube.kubectl("exec", self.job_pod(name), "-n", self.ns, "--", "python", "-c",
                          "open('/tmp/stop', 'w').close()")
        return self.job_result(name, timeout=timeout, key="done")

    def job_conditions(self, name: str) -> dict[str, str]:
        """The Job's conditions as {type: status} ({} while it has none, or is gone)."""
        job = self.kube.kubectl_json("get", "job", name, "-n", self.ns, check=False) or {}
        return {c["type"]: c["status"] for c in job.get("status", {}).get("conditions", [])}

    def job_failed(self, name: str) -> bool:
        return self.job_conditions(name).get("Failed") == "True"

    def pool_report(self) -> dict[str, Any]:
        """What the pool server last reported into the EnvPool (``status.pool``), as
        ``kubectl get epool`` shows it, read through the API server."""
        return dict((self.epool().get("status") or {}).get("pool") or {})

    def wait_leased(self, name: str, leased: int, timeout: float) -> dict[str, Any]:
        """Wait until the pool server reports ``leased`` envs leased after trainer Job
        ``name`` attached; fail at once, with what the trainer printed, if its Job failed."""
        def seen() -> tuple[dict[str, Any], bool] | None:
            report = self.pool_report()
            if report.get("leasedEnvs") == leased:
                return report, False
            return (report, True) if self.job_failed(name) else None

        try:
            report, failed = self.kube.wait_until(seen, timeout=timeout, interval=0.5,
                                                  what=f"{leased} envs leased with trainer {name}")
        except pytest.fail.Exception as exc:
            pod = self.kube.kubectl("describe", "pods", "-n", self.ns, "-l", f"job-name={name}",
                                    check=False).stdout
            pytest.fail(f"{exc}\n{pod[-3000:]}\n{self.logs(name)[-3000:]}\n{self.diagnose()}",
                        pytrace=False)
        if failed:
            pytest.fail(f"trainer {name} failed before its lease was seen:\n"
                        f"{self.logs(name)[-4000:]}\n{self.diagnose()}\n{self.client_server_logs()}",
                        pytrace=False)
        return report

    def job_result(self, name: str, timeout: float, key: str = "steps") -> dict[str, Any]:
        def done() -> dict[str, str] | None:
            conds = self.job_conditions(name)
            return conds if conds.get("Complete") == "True" or conds.get("Failed") == "True" else None

        conds = self.kube.wait_until(done, timeout=timeout, interval=1, what=f"trainer Job {name}")
        logs = self.kube.kubectl("logs", f"job/{name}", "-n", self.ns, check=False).stdout
        assert conds.get("Complete") == "True", f"trainer {name} failed:\n{logs[-4000:]}\n{self.client_server_logs()}"
        result = last_json(logs, key)
        assert result is not None, logs[-4000:]
        return result


def kill_pool_server(journey: Journey, head: str) -> None:
    """SIGKILL the pool server's process in its container (the head pod shares its
    process namespace: find it by its command line, not as PID 1)."""
    code = ("import os, signal\n"
            "for p in filter(str.isdigit, os.listdir('/proc')):\n"
            "    try: cmd = open(f'/proc/{p}/cmdline', 'rb').read()\n"
            "    except OSError: continue\n"
            "    if b'\\0serve\\0--config\\0' in cmd and int(p) != os.getpid(): os.kill(int(p), signal.SIGKILL)\n")
    journey.kube.kubectl("exec", head, "-n", journey.ns, "-c", "pool-server", "--", "python", "-c", code,
                         check=False)


def restart_count(pod: dict[str, Any], container: str) -> int:
    return next(int(c["restartCount"]) for c in pod["status"]["containerStatuses"] if c["name"] == container)
