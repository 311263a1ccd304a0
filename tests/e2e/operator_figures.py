"""Measure the operator's figures once (issue 7's note); not a test, not collected.

    eval "$(bash tests/cluster/up.sh)"
    .venv/bin/python tests/e2e/operator_figures.py [--latency-pools 40] [--bulk 200]

Against the running local control plane (kwok pods, the real KubeRay operator)
it starts ``envpool operator`` and measures, in a fresh namespace:

* apply -> RayCluster created, p50/p99 over pools created one at a time;
* apply -> EnvPool Ready (KubeRay HeadPodReady/RayClusterProvisioned, no pool
  server report), p50/p99, same pools;
* N EnvPools created at once (a burst of concurrent creates) -> every one
  reconciled (RayCluster applied and ``status.observedGeneration`` equal to
  its generation), and -> every one in its final phase;
* the operator's peak RSS (VmHWM) at the end.

Times are taken from a watch, so they include the watch latency, not polling.
Prints one JSON object (also written to ``--out``).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import secrets
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import kubernetes

REPO = Path(__file__).resolve().parents[2]
CRD = REPO / "manifests" / "crd" / "envpool.dev_envpools.yaml"
G, V, P = "envpool.dev", "v1alpha1", "envpools"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered) + 0.5) - 1))]


def _cond(obj: dict[str, Any], ctype: str) -> dict[str, Any]:
    for c in (obj.get("status") or {}).get("conditions") or ():
        if c.get("type") == ctype:
            return dict(c)
    return {}


class Watcher:
    """First time each object (by name) was seen, and first time it matched ``pred``.

    Lists, then watches from the list's resourceVersion; when the API server
    ends the watch it lists and watches again, so no change is missed (one
    found by a re-list is stamped when found, i.e. a little late, never early).
    """

    def __init__(self, api: Any, ns: str, group: str, version: str, plural: str,
                 pred: Any = None) -> None:
        self.seen: dict[str, float] = {}
        self.matched: dict[str, float] = {}
        self.pred = pred
        self.args = (group, version, ns, plural)
        self.api = api
        self.stopped = threading.Event()
        self.watch: Any = None
        self.restarts = 0
        rv = self._list()
        self.thread = threading.Thread(target=self._read, args=(rv,), daemon=True)
        self.thread.start()

    def _list(self) -> str:
        listing = self.api.list_namespaced_custom_object(*self.args)
        for obj in listing["items"]:
            self._on(obj)
        rv: str = listing["metadata"]["resourceVersion"]
        return rv

    def _on(self, obj: dict[str, Any]) -> None:
        now = time.monotonic()
        name = obj.get("metadata", {}).get("name", "")
        self.seen.setdefault(name, now)
        if self.pred is not None and name not in self.matched and self.pred(obj):
            self.matched[name] = now

    def _read(self, rv: str) -> None:
        while not self.stopped.is_set():
            self.watch = kubernetes.watch.Watch()
            try:
                for event in self.watch.stream(self.api.list_namespaced_custom_object,
                                               *self.args, resource_version=rv,
                                               timeout_seconds=300):
                    if event.get("type") == "ERROR":  # e.g. 410 Gone: list again
                        break
                    self._on(event.get("object") or {})
                    rv = (event.get("object") or {}).get("metadata", {}).get(
                        "resourceVersion", rv)
            except Exception as exc:
                if self.stopped.is_set():
                    return
                print(f"watch {self.args[-1]} interrupted: {exc!r}; listing again",
                      file=sys.stderr)
            if not self.stopped.is_set():
                self.restarts += 1
                rv = self._list()

    def stop(self) -> None:
        self.stopped.set()
        if self.watch is not None:
            self.watch.stop()


def _wait(pred: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.2)


#: Small pods so the figures leave room on the shared 4 kwok nodes (128 CPU).
SMALL = {"requests": {"cpu": "100m", "memory": "256Mi"}}
IMAGE = "registry.example/envpool:figures"


def _doc(name: str, **spec_over: Any) -> dict[str, Any]:
    # The image is explicit so that any other operator watching all
    # namespaces of this shared cluster builds the same RayCluster (an
    # operator-default image of its own would roll the pods back and forth).
    spec: dict[str, Any] = {"env": {"id": "CartPole-v1"}, "replicas": 16, "envsPerActor": 8,
                            "ray": {"image": IMAGE, "head": {"resources": SMALL},
                                    "worker": {"resources": SMALL}}}
    spec.update(spec_over)
    return {"apiVersion": f"{G}/{V}", "kind": "EnvPool", "metadata": {"name": name}, "spec": spec}


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--latency-pools", type=int, default=40)
    ap.add_argument("--bulk", type=int, default=200)
    ap.add_argument("--out", default="/tmp/envpool-operator-figures.json")
    args = ap.parse_args()
    # SIGTERM runs the finally below: operator stopped, namespace deleted.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    kubeconfig = os.environ.get("KUBECONFIG")
    if not kubeconfig:
        print("set KUBECONFIG (eval \"$(bash tests/cluster/up.sh)\")", file=sys.stderr)
        return 2
    kubectl = Path.home() / ".cache/envpool-cluster/kubernetes-v1.36.3/bin/kubectl"
    subprocess.run([str(kubectl), "apply", "--server-side", "--force-conflicts", "-f", str(CRD)],
                   check=True, capture_output=True)
    subprocess.run([str(kubectl), "wait", "--for=condition=Established",
                    "crd/envpools.envpool.dev", "--timeout=60s"], check=True, capture_output=True)
    client = kubernetes.config.new_client_from_config(config_file=kubeconfig)
    core = kubernetes.client.CoreV1Api(client)
    custom = kubernetes.client.CustomObjectsApi(client)
    ns = f"figures-{secrets.token_hex(3)}"
    core.create_namespace({"metadata": {"name": ns}})
    _wait(lambda: any(sa.metadata.name == "default"
                      for sa in core.list_namespaced_service_account(ns).items),
          30, "default ServiceAccount")

    metrics_port, health_port = _free_port(), _free_port()
    log = open(f"/tmp/envpool-operator-figures-{ns}.log", "wb")  # noqa: SIM115
    env = {**os.environ, "ENVPOOL_IMAGE": "registry.example/envpool:figures",
           "PYTHONUNBUFFERED": "1"}
    op = subprocess.Popen(
        [str(Path(sys.executable).with_name("envpool")), "operator", "--namespace", ns,
         "--standalone", "--metrics-port", str(metrics_port),
         "--liveness", f"http://127.0.0.1:{health_port}/healthz"],
        stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO)
    figures: dict[str, Any] = {}
    try:
        def alive() -> bool:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{health_port}/healthz",
                                            timeout=1) as r:
                    return bool(r.status == 200)
            except OSError:
                return False

        _wait(alive, 60, "operator liveness")
        figures["operator_rss_idle_mib"] = round(_rss_kib(op.pid) / 1024, 1)

        # 1. latency, one pool at a time (the operator otherwise idle)
        rc_watch = Watcher(custom, ns, "ray.io", "v1", "rayclusters")
        ready_watch = Watcher(custom, ns, G, V, P,
                              lambda o: (o.get("status") or {}).get("phase") == "Ready")
        applied: dict[str, float] = {}
        for i in range(args.latency_pools):
            name = f"lat-{i:03d}"
            applied[name] = time.monotonic()
            custom.create_namespaced_custom_object(G, V, ns, P, _doc(name))
            _wait(lambda n=name: n in ready_watch.matched, 120, f"{name} Ready")
        rc_watch.stop()
        ready_watch.stop()
        custom.delete_collection_namespaced_custom_object(G, V, ns, P)
        _wait(lambda: not core.list_namespaced_pod(ns).items, 300, "latency pools' pods gone")
        created = [rc_watch.seen[n] - t for n, t in applied.items()]
        ready = [ready_watch.matched[n] - t for n, t in applied.items()]
        figures["latency_pools"] = args.latency_pools
        figures["apply_to_raycluster_p50_s"] = round(statistics.median(created), 3)
        figures["apply_to_raycluster_p99_s"] = round(_pct(created, 0.99), 3)
        figures["apply_to_ready_p50_s"] = round(statistics.median(ready), 3)
        figures["apply_to_ready_p99_s"] = round(_pct(ready, 0.99), 3)

        # 2. a burst of N pools at once
        def reconciled(o: dict[str, Any]) -> bool:
            st = o.get("status") or {}
            return bool(st.get("rayCluster")) and st.get("observedGeneration") == o[
                "metadata"].get("generation")

        done_watch = Watcher(custom, ns, G, V, P, reconciled)
        final_watch = Watcher(custom, ns, G, V, P,
                              lambda o: (o.get("status") or {}).get("phase") == "Suspended"
                              and _cond(o, "RayClusterReady").get("status") == "True")
        # Suspended (head pod only, small) so N head pods fit on the 4 kwok
        # nodes next to other work; the operator does the same work per pool.
        docs = [_doc(f"bulk-{i:03d}", suspend=True,
                     ray={"image": IMAGE, "head": {"resources": SMALL}})
                for i in range(args.bulk)]
        t0 = time.monotonic()
        with concurrent.futures.ThreadPoolExecutor(16) as pool:
            list(pool.map(lambda d: custom.create_namespaced_custom_object(G, V, ns, P, d), docs))
        figures["bulk_pools"] = args.bulk
        figures["bulk_create_requests_s"] = round(time.monotonic() - t0, 2)
        names = [d["metadata"]["name"] for d in docs]
        _wait(lambda: all(n in done_watch.matched for n in names), 900, "bulk reconciled")
        figures["bulk_all_reconciled_s"] = round(max(done_watch.matched[n] for n in names) - t0, 2)
        _wait(lambda: all(n in final_watch.matched for n in names), 900,
              "bulk Suspended with head pods ready")
        figures["bulk_all_heads_ready_s"] = round(
            max(final_watch.matched[n] for n in names) - t0, 2)
        done_watch.stop()
        final_watch.stop()
        figures["watch_restarts"] = done_watch.restarts + final_watch.restarts
        rcs = custom.list_namespaced_custom_object("ray.io", "v1", ns, "rayclusters")["items"]
        figures["bulk_rayclusters_total_in_namespace"] = len(rcs)
        figures["operator_peak_rss_mib"] = round(_rss_kib(op.pid) / 1024, 1)
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5) as r:
            text = r.read().decode()
        figures["operator_reconciles"] = {
            line.split("{")[1].split("}")[0]: float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith("envpool_operator_reconciles_total{")}
        samples = {line.split(" ")[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith("envpool_operator_reconcile_duration_seconds_")}
        count = samples.get("envpool_operator_reconcile_duration_seconds_count", 0.0)
        if count:
            figures["reconcile_duration_mean_s"] = round(
                samples["envpool_operator_reconcile_duration_seconds_sum"] / count, 3)
        figures["operator_cpu_s"] = round(_cpu_s(op.pid), 1)
        with open("/proc/loadavg") as f:
            figures["loadavg_1_5_15"] = f.read().split()[:3]
    finally:
        op.terminate()
        op.wait(timeout=30)
        log.close()
        core.delete_namespace(ns)
    out = json.dumps(figures, indent=2, sort_keys=True)
    Path(args.out).write_text(out + "\n")
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
