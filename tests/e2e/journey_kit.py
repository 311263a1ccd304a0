"""Parts of the real-node user journey (test_user_journey.py) that are not steps.

* ``STEPPING_TRAINER``: a trainer pod's script that steps its leased envs with
  ``send``/``recv`` (dynamic batching: healthy envs keep flowing while a lost actor
  is replaced) until ``/tmp/stop`` exists, serves its own ``/metrics`` (the polls,
  steps and failures panels are the trainer's series) and accounts for every step it
  sent: answered, or a truncated step carrying ``info["error"]``.
* ``MonitorDiscovery``: the chart's ServiceMonitor (operator) and PodMonitor (pool
  servers), plus trainer pods, as file_sd targets kept current from the API server,
  for a Prometheus outside the cluster that reaches the pods over the pod network.
* ``peak_rss_bytes``: a pod's peak memory from its cgroup on the real node.
"""

from __future__ import annotations

import glob
import json
import re
import threading
from pathlib import Path
from typing import Any

import yaml

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
            print(json.dumps({"t": printed - t0, "steps": int(answered.sum()), "errors": errors}),
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


def steps_per_s(run_stdout: str) -> float:
    """steps/s from `envpool run`'s summary line."""
    m = re.search(r"\((\d+) steps/s\)", run_stdout)
    assert m, run_stdout[-2000:]
    return float(m.group(1))
