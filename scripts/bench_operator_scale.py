"""The operator at scale (issue 34): N EnvPools applied at once on the test cluster's kwok nodes.

    eval "$(bash tests/cluster/up.sh)"
    PYTHONPATH=$PWD:$PWD/operator .venv/bin/python scripts/bench_operator_scale.py --pools 1000

A benchmark, not a test. Against the running local control plane (kwok pods, the
real KubeRay operator) it starts ``python -m envpool_operator`` for a fresh namespace
and, from one watch of RayClusters and one of EnvPools, measures:

* apply of all N (creates from ``--create-threads`` threads) -> every RayCluster
  created, and -> every EnvPool ``phase: Ready`` (head and ``--workers`` worker pods
  Running in kwok, KubeRay's RayCluster ready; no pool server runs, so Ready is the
  operator's "cluster ready, pool server not reported yet");
* apply -> RayCluster created, per pool (p50/p99: the reconcile with its queueing);
* the reconcile's own duration p50/p99 (``envpool_operator_reconcile_duration_seconds``,
  read as Prometheus' histogram_quantile does);
* API calls: the operator's own client per pool (``envpool_operator_api_requests_total``)
  for the burst and per pool per resync pass (``ENVPOOL_RESYNC_SECONDS=--resync-seconds``;
  one pass of at least ``--resync-pools`` pools is waited for), and the API server's
  ``apiserver_request_total`` by resource over the burst (every client: KubeRay,
  kwok, scheduler, kopf's patches);
* the operator's RSS (VmRSS at the end, VmHWM peak) and CPU seconds, the CPU
  seconds of the control plane's processes, and the machine's load.

Extra kwok nodes (``envpool-bench-<i>``, 1000 pods each) are added when the pods
would not fit, and removed at the end with the namespace. Progress goes to stderr
every few seconds, a table to stderr at the end, one JSON object to stdout (and
``--out``).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import datetime
import json
import math
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import kubernetes
from prometheus_client import parser as prom_parser

REPO = Path(__file__).resolve().parents[1]
CRD = REPO / "manifests" / "crd" / "envpool.dev_envpools.yaml"
CACHE = Path(os.environ.get("ENVPOOL_CLUSTER_CACHE", Path.home() / ".cache" / "envpool-cluster"))
STATE = Path(os.environ.get("ENVPOOL_CLUSTER_STATE", CACHE / "state"))
G, V, P = "envpool.dev", "v1alpha1", "envpools"
IMAGE = "registry.example/envpool:scale"
#: Small pods: a kwok node counts them, nothing runs them.
SMALL = {"requests": {"cpu": "100m", "memory": "256Mi"}}
BENCH_NODE_PODS = 1000
#: Control-plane processes whose CPU seconds are reported (kwokctl's pid files + KubeRay).
COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler",
              "kwok-controller")


# ---------------------------------------------------------------- pure helpers
def pct(values: Iterable[float], q: float) -> float:
    """Nearest-rank percentile (q in [0, 1]) of ``values``; nan when empty."""
    ordered = sorted(values)
    if not ordered:
        return math.nan
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def histogram_quantile(q: float, buckets: Mapping[float, float]) -> float:
    """Prometheus' ``histogram_quantile`` over cumulative ``{le: count}`` buckets.

    Linear inside the bucket the rank falls in; the +Inf bucket answers with the
    largest finite bound (as Prometheus does).

        >>> histogram_quantile(0.5, {0.1: 0, 0.5: 10, 1.0: 10, math.inf: 10})
        0.3
        >>> histogram_quantile(0.99, {0.1: 50, 1.0: 100, math.inf: 100})
        0.982
    """
    les = sorted(buckets)
    total = buckets[les[-1]] if les else 0.0
    if total <= 0:
        return math.nan
    rank = q * total
    prev_le, prev_count = 0.0, 0.0
    for le in les:
        count = buckets[le]
        if count >= rank:
            if math.isinf(le):
                return prev_le
            if count == prev_count:
                return le
            return round(prev_le + (le - prev_le) * (rank - prev_count) / (count - prev_count), 6)
        prev_le, prev_count = le, count
    return prev_le


def samples(text: str) -> list[tuple[str, dict[str, str], float]]:
    """(name, labels, value) of every sample in a Prometheus text exposition."""
    return [(s.name, dict(s.labels), float(s.value))
            for family in prom_parser.text_string_to_metric_families(text)
            for s in family.samples]


def sum_by(rows: Iterable[tuple[str, dict[str, str], float]], name: str,
           keys: tuple[str, ...]) -> dict[tuple[str, ...], float]:
    out: dict[tuple[str, ...], float] = {}
    for n, labels, value in rows:
        if n == name:
            k = tuple(labels.get(key, "") for key in keys)
            out[k] = out.get(k, 0.0) + value
    return out


def delta(after: Mapping[Any, float], before: Mapping[Any, float]) -> dict[Any, float]:
    return {k: v - before.get(k, 0.0) for k, v in after.items() if v - before.get(k, 0.0)}


# ---------------------------------------------------------------- process / cluster I/O
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _proc_status(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return 0


def _cpu_s(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return math.nan
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _machine_busy() -> tuple[float, float]:
    """(busy, total) jiffies of all CPUs since boot."""
    fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = fields[3] + fields[4]
    return float(sum(fields) - idle), float(sum(fields))


def _component_pids() -> dict[str, int]:
    name = os.environ.get("ENVPOOL_CLUSTER_NAME", "envpool")
    pids: dict[str, int] = {}
    for c in COMPONENTS:
        f = STATE / "kwok" / "clusters" / name / "pids" / f"{c}.pid"
        if f.exists():
            pids[c] = int(f.read_text().strip())
    f = STATE / "ray-operator.pid"
    if f.exists():
        pids["kuberay"] = int(f.read_text().strip())
    return pids


def _http(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as r:
        return str(r.read().decode())


class Watcher:
    """First time each object (by name) was seen, and first time it matched ``pred``.

    Lists, then watches from the list's resourceVersion, again after the server
    ends a watch, so nothing is missed (a change found by a re-list is stamped
    when found: late, never early).
    """

    def __init__(self, api: Any, ns: str, gvp: tuple[str, str, str],
                 pred: Callable[[dict[str, Any]], bool] | None = None) -> None:
        self.seen: dict[str, float] = {}
        self.matched: dict[str, float] = {}
        self.pred = pred
        self.args = (gvp[0], gvp[1], ns, gvp[2])
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
                # Short watches with a read timeout: on a loaded API server a watch
                # can stall without an error (seen here: 100 s without an event
                # while hundreds of pools turned Ready).
                for event in self.watch.stream(self.api.list_namespaced_custom_object,
                                               *self.args, resource_version=rv,
                                               timeout_seconds=60, _request_timeout=90):
                    if event.get("type") == "ERROR":  # 410 Gone: list again
                        break
                    obj = event.get("object") or {}
                    self._on(obj)
                    rv = obj.get("metadata", {}).get("resourceVersion", rv)
            except Exception as exc:
                if self.stopped.is_set():
                    return
                print(f"watch {self.args[-1]} interrupted: {exc!r}; listing again",
                      file=sys.stderr)
            while not self.stopped.is_set():
                try:
                    self.restarts += 1
                    rv = self._list()
                    break
                except Exception as exc:  # a 504 from a busy API server: try again
                    print(f"list {self.args[-1]} failed: {exc!r}; again in 2 s",
                          file=sys.stderr)
                    time.sleep(2)

    def stop(self) -> None:
        self.stopped.set()
        if self.watch is not None:
            self.watch.stop()


def _doc(name: str, workers: int) -> dict[str, Any]:
    # The image is explicit so that any other operator watching all namespaces of
    # this shared cluster builds the same RayCluster. replicas = envsPerWorker *
    # workers gives exactly `workers` worker pods; 0 workers: suspended (head only).
    spec: dict[str, Any] = {
        "env": {"id": "CartPole-v1"}, "replicas": max(1, workers) * 4, "envsPerActor": 4,
        "ray": {"image": IMAGE, "head": {"resources": SMALL},
                "worker": {"resources": SMALL, "envsPerWorker": 4}},
    }
    if workers == 0:
        spec["suspend"] = True
    return {"apiVersion": f"{G}/{V}", "kind": "EnvPool", "metadata": {"name": name},
            "spec": spec}


def _bench_node(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "annotations": {"node.alpha.kubernetes.io/ttl": "0",
                                                   "kwok.x-k8s.io/node": "fake"},
                     "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
                                "kubernetes.io/arch": "amd64", "type": "kwok"}},
        "spec": {},
        "status": {
            "allocatable": {"cpu": "1000", "memory": "1Pi", "pods": str(BENCH_NODE_PODS)},
            "capacity": {"cpu": "1000", "memory": "1Pi", "pods": str(BENCH_NODE_PODS)},
            "nodeInfo": {"architecture": "amd64", "kubeletVersion": "fake",
                         "kubeProxyVersion": "fake", "operatingSystem": "linux"},
            "phase": "Running"},
    }


def _wait(pred: Callable[[], bool], timeout: float, what: str,
          progress: Callable[[], str] | None = None, every: float = 5.0) -> None:
    start = time.monotonic()
    last = start
    while not pred():
        now = time.monotonic()
        if now - start > timeout:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        if progress is not None and now - last >= every:
            last = now
            print(f"  [{now - start:6.1f}s] {what}: {progress()}", file=sys.stderr, flush=True)
        time.sleep(0.2)


# ---------------------------------------------------------------- the run
def run(args: argparse.Namespace) -> dict[str, Any]:
    kubeconfig = os.environ["KUBECONFIG"]
    kubectl = CACHE / "kubernetes-v1.36.3" / "bin" / "kubectl"
    subprocess.run([str(kubectl), "apply", "--server-side", "--force-conflicts", "-f", str(CRD)],
                   check=True, capture_output=True)
    subprocess.run([str(kubectl), "wait", "--for=condition=Established",
                    "crd/envpools.envpool.dev", "--timeout=60s"], check=True, capture_output=True)
    cfg = kubernetes.client.Configuration()
    kubernetes.config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)
    # The bench's creates and watches share this client's connection pool.
    cfg.connection_pool_maxsize = args.create_threads + 4
    client = kubernetes.client.ApiClient(cfg)
    core = kubernetes.client.CoreV1Api(client)
    custom = kubernetes.client.CustomObjectsApi(client)

    def apiserver_requests() -> dict[tuple[str, ...], float]:
        text = subprocess.run([str(kubectl), "get", "--raw", "/metrics"], check=True,
                              capture_output=True, text=True).stdout
        rows = [r for r in samples(text) if r[0] == "apiserver_request_total"]
        return sum_by(rows, "apiserver_request_total", ("verb", "resource", "subresource"))

    figures: dict[str, Any] = {"pools": args.pools, "workers_per_pool": args.workers,
                               "cpus": os.cpu_count(),
                               "loadavg_before": Path("/proc/loadavg").read_text().split()[:3]}
    # head, workers and the pool's Redis (GCS fault tolerance, on by default): without
    # the Redis pods counted, 1,000 pools left 280 heads Pending ("Too many pods")
    pods_needed = args.pools * (2 + args.workers)
    bench_nodes = [f"envpool-bench-{i}" for i in range(math.ceil(pods_needed / BENCH_NODE_PODS))]
    # kubectl: the typed client's models insist on node fields kwok nodes leave out
    subprocess.run([str(kubectl), "apply", "--validate=false", "-f", "-"], check=True,
                   capture_output=True, text=True,
                   input=json.dumps({"apiVersion": "v1", "kind": "List",
                                     "items": [_bench_node(n) for n in bench_nodes]}))
    ns = f"scale-{secrets.token_hex(3)}"
    core.create_namespace({"metadata": {"name": ns}})
    _wait(lambda: any(sa.metadata.name == "default"
                      for sa in core.list_namespaced_service_account(ns).items),
          60, "default ServiceAccount")

    metrics_port, health_port = _free_port(), _free_port()
    log_path = Path(f"/tmp/envpool-operator-scale-{ns}.log")
    log = log_path.open("wb")
    env = {**os.environ, "ENVPOOL_IMAGE": IMAGE, "PYTHONUNBUFFERED": "1",
           "ENVPOOL_RESYNC_SECONDS": str(args.resync_seconds)}
    op = subprocess.Popen(
        [sys.executable, "-m", "envpool_operator", "--namespace", ns, "--standalone",
         "--metrics-port", str(metrics_port),
         "--liveness", f"http://127.0.0.1:{health_port}/healthz"],
        stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO)
    figures["operator_log"] = str(log_path)
    watches: list[Watcher] = []
    try:
        def alive() -> bool:
            try:
                return bool(_http(f"http://127.0.0.1:{health_port}/healthz"))
            except OSError:
                return False

        _wait(alive, 120, "operator liveness")
        figures["operator_rss_idle_mib"] = round(_proc_status(op.pid, "VmRSS") / 1024, 1)

        def op_metrics() -> list[tuple[str, dict[str, str], float]]:
            return samples(_http(f"http://127.0.0.1:{metrics_port}/metrics"))

        rc_watch = Watcher(custom, ns, ("ray.io", "v1", "rayclusters"))
        ready_watch = Watcher(custom, ns, (G, V, P),
                              lambda o: (o.get("status") or {}).get("phase") == (
                                  "Suspended" if args.workers == 0 else "Ready"))
        watches += [rc_watch, ready_watch]
        names = [f"pool-{i:04d}" for i in range(args.pools)]
        docs = [_doc(n, args.workers) for n in names]
        pids = _component_pids()
        cpu0 = {c: _cpu_s(pid) for c, pid in pids.items()}
        cpu0["operator"] = _cpu_s(op.pid)
        busy0 = _machine_busy()
        api0 = apiserver_requests()
        op0 = op_metrics()
        created_at: dict[str, float] = {}

        def create(doc: dict[str, Any]) -> None:
            name = doc["metadata"]["name"]
            created_at[name] = time.monotonic()  # each pool's own apply
            custom.create_namespaced_custom_object(G, V, ns, P, doc)

        def progress() -> str:
            return (f"applied {len(created_at)}/{args.pools}, RayClusters "
                    f"{len(rc_watch.seen)}/{args.pools}, {'Ready' if args.workers else 'Suspended'} "
                    f"{len(ready_watch.matched)}/{args.pools}, operator RSS "
                    f"{_proc_status(op.pid, 'VmRSS') / 1024:.0f} MiB, load "
                    f"{Path('/proc/loadavg').read_text().split()[0]}")

        print(f"applying {args.pools} EnvPools in {ns} ({args.create_threads} threads)",
              file=sys.stderr, flush=True)
        t0 = time.monotonic()
        with concurrent.futures.ThreadPoolExecutor(args.create_threads) as pool:
            futures = [pool.submit(create, d) for d in docs]
            _wait(lambda: all(f.done() for f in futures), args.timeout, "apply", progress)
            for f in futures:
                f.result()
        figures["apply_all_s"] = round(time.monotonic() - t0, 2)
        _wait(lambda: all(n in rc_watch.seen for n in names), args.timeout,
              "all RayClusters created", progress)
        t_rc = max(rc_watch.seen[n] for n in names)
        figures["all_rayclusters_created_s"] = round(t_rc - t0, 2)
        per_pool = [rc_watch.seen[n] - created_at[n] for n in names]
        figures["apply_to_raycluster_p50_s"] = round(pct(per_pool, 0.5), 3)
        figures["apply_to_raycluster_p99_s"] = round(pct(per_pool, 0.99), 3)
        rows = op_metrics()
        figures.update(_reconcile_figures(rows, op0))
        burst_calls = delta(sum_by(rows, "envpool_operator_api_requests_total", ("verb",)),
                            sum_by(op0, "envpool_operator_api_requests_total", ("verb",)))
        figures["operator_api_calls_per_pool_create"] = {
            k[0]: round(v / args.pools, 2) for k, v in sorted(burst_calls.items())}
        figures["rss_at_all_created_mib"] = round(_proc_status(op.pid, "VmRSS") / 1024, 1)

        _wait(lambda: all(n in ready_watch.matched for n in names), args.timeout,
              "all EnvPools Ready" if args.workers else "all EnvPools Suspended", progress)
        t_ready = max(ready_watch.matched[n] for n in names)
        figures["all_ready_s"] = round(t_ready - t0, 2)
        per_pool = [ready_watch.matched[n] - created_at[n] for n in names]
        figures["apply_to_ready_p50_s"] = round(pct(per_pool, 0.5), 3)
        figures["apply_to_ready_p99_s"] = round(pct(per_pool, 0.99), 3)
        figures.update(_timestamp_figures(custom, ns, args.workers))
        busy1 = _machine_busy()
        figures["machine_busy_during_burst"] = round(
            (busy1[0] - busy0[0]) / max(1.0, busy1[1] - busy0[1]), 3)
        figures["cpu_s_during_burst"] = {
            c: round(_cpu_s(pid) - cpu0[c], 1)
            for c, pid in {**pids, "operator": op.pid}.items()}
        figures["loadavg_after_burst"] = Path("/proc/loadavg").read_text().split()[:3]
        api1 = apiserver_requests()
        by_resource: dict[str, float] = {}
        for (verb, resource, sub), n in delta(api1, api0).items():
            if verb in ("WATCH", "CONNECT"):
                continue
            key = f"{resource}/{sub}" if sub else resource
            by_resource[key] = by_resource.get(key, 0.0) + n
        figures["apiserver_requests_per_pool_burst"] = {
            k: round(v / args.pools, 2) for k, v in sorted(by_resource.items())
            if v / args.pools >= 0.05}
        figures["apiserver_requests_per_pool_burst_total"] = round(
            sum(by_resource.values()) / args.pools, 1)
        rows = op_metrics()
        figures.update(_reconcile_figures(rows, op0))
        figures["status_patches_per_pool"] = round(
            delta(sum_by(rows, "envpool_operator_status_updates_total", ()),
                  sum_by(op0, "envpool_operator_status_updates_total", ())).get((), 0.0)
            / args.pools, 2)
        figures["operator_rss_mib"] = round(_proc_status(op.pid, "VmRSS") / 1024, 1)
        figures["operator_peak_rss_mib"] = round(_proc_status(op.pid, "VmHWM") / 1024, 1)

        if args.resync_pools:
            figures.update(_resync_figures(op_metrics, min(args.pools, args.resync_pools),
                                           args.resync_seconds + args.timeout))
        figures["operator_peak_rss_mib"] = round(_proc_status(op.pid, "VmHWM") / 1024, 1)
        figures["watch_restarts"] = sum(w.restarts for w in watches)
    finally:
        for w in watches:
            w.stop()
        op.terminate()
        try:
            op.wait(timeout=30)
        except subprocess.TimeoutExpired:
            op.kill()
        log.close()
        if not args.keep:
            _cleanup(core, custom, ns, bench_nodes, kubectl)
    return figures


def _timestamp_figures(custom: Any, ns: str, workers: int) -> dict[str, Any]:
    """The same spans from the objects' own timestamps (1 s resolution): creation of
    the EnvPools and RayClusters, and the Ready condition's lastTransitionTime. A
    cross-check of the watches, which a loaded API server can stall."""
    def ts(text: str) -> float:
        return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()

    pools = custom.list_namespaced_custom_object(G, V, ns, P)["items"]
    rcs = custom.list_namespaced_custom_object("ray.io", "v1", ns, "rayclusters")["items"]
    created = {p["metadata"]["name"]: ts(p["metadata"]["creationTimestamp"]) for p in pools}
    rc_at = {r["metadata"]["name"]: ts(r["metadata"]["creationTimestamp"]) for r in rcs}
    ctype = "Ready" if workers else "RayClusterReady"
    ready_at = {p["metadata"]["name"]: ts(c["lastTransitionTime"]) for p in pools
                for c in (p.get("status") or {}).get("conditions") or ()
                if c.get("type") == ctype and c.get("status") == "True"}
    t0 = min(created.values())
    return {
        "ts_all_rayclusters_created_s": max(rc_at.values()) - t0,
        # None when a pool was not Ready in this listing (a later status flip)
        "ts_all_ready_s": max(ready_at.values()) - t0 if len(ready_at) == len(created) else None,
        "ts_ready_in_listing": len(ready_at),
        "ts_apply_to_raycluster_p99_s": pct([rc_at[n] - created[n] for n in created if n in rc_at],
                                            0.99),
    }


def _reconcile_figures(rows: list[tuple[str, dict[str, str], float]],
                       before: list[tuple[str, dict[str, str], float]]) -> dict[str, Any]:
    name = "envpool_operator_reconcile_duration_seconds_bucket"
    buckets = delta(sum_by(rows, name, ("le",)), sum_by(before, name, ("le",)))
    cumulative = {float(k[0]): v for k, v in buckets.items()}
    count = delta(sum_by(rows, "envpool_operator_reconcile_duration_seconds_count", ()),
                  sum_by(before, "envpool_operator_reconcile_duration_seconds_count", ()))
    results = delta(sum_by(rows, "envpool_operator_reconciles_total", ("result",)),
                    sum_by(before, "envpool_operator_reconciles_total", ("result",)))
    return {
        "reconciles": {k[0]: int(v) for k, v in sorted(results.items())},
        "reconcile_count": int(count.get((), 0)),
        "reconcile_p50_s": histogram_quantile(0.5, cumulative) if cumulative else math.nan,
        "reconcile_p99_s": histogram_quantile(0.99, cumulative) if cumulative else math.nan,
    }


def _resync_figures(op_metrics: Callable[[], list[tuple[str, dict[str, str], float]]],
                    pools: int, timeout: float) -> dict[str, Any]:
    """API calls per pool per resync: the operator's own calls over >= ``pools`` resyncs.

    Waits for a quiet moment first (everything Ready: only the resync calls the API).
    """
    def counts() -> tuple[float, dict[tuple[str, ...], float]]:
        rows = op_metrics()
        resyncs = sum_by(rows, "envpool_operator_resyncs_total", ()).get((), 0.0)
        return resyncs, sum_by(rows, "envpool_operator_api_requests_total", ("verb", "resource"))

    r0, c0 = counts()
    t0 = time.monotonic()
    state = {"r": r0, "c": c0}

    def enough() -> bool:
        state["r"], state["c"] = counts()
        return state["r"] - r0 >= pools

    _wait(enough, timeout, f"a resync of >= {pools} pools",
          lambda: f"{state['r'] - r0:.0f} pools resynced")
    n = state["r"] - r0
    calls = delta(state["c"], c0)
    return {
        "resync_pools_measured": int(n),
        "resync_api_calls_per_pool": round(sum(calls.values()) / n, 2),
        "resync_api_calls_per_pool_by_kind": {
            f"{k[0]} {k[1]}": round(v / n, 2) for k, v in sorted(calls.items())},
        "resync_wall_s_per_pool": round((time.monotonic() - t0) / n, 4),
    }


def _cleanup(core: Any, custom: Any, ns: str, bench_nodes: list[str], kubectl: Path) -> None:
    print(f"deleting namespace {ns} (and the bench nodes)", file=sys.stderr, flush=True)
    try:
        core.delete_namespace(ns)
    except kubernetes.client.ApiException as exc:
        if exc.status != 404:
            raise

    def strip_finalizers() -> int:
        """The pools' RayClusters (GCS fault tolerance) carry KubeRay's Redis-cleanup
        finalizer, whose Job a terminating namespace refuses: the namespace would take
        15-22 min to go, holding the shared cluster. Their Redis goes with the namespace.
        Done again at each progress line (KubeRay adds it to any not deleted yet)."""
        try:
            listed = custom.list_namespaced_custom_object("ray.io", "v1", ns, "rayclusters")
        except kubernetes.client.ApiException:
            return 0
        stripped = 0
        for rc in listed.get("items", ()):
            if rc["metadata"].get("finalizers") and rc["metadata"].get("deletionTimestamp"):
                try:
                    custom.patch_namespaced_custom_object(
                        "ray.io", "v1", ns, "rayclusters", rc["metadata"]["name"],
                        {"metadata": {"finalizers": None}})
                    stripped += 1
                except kubernetes.client.ApiException as exc:
                    if exc.status != 404:
                        raise
        return stripped

    def gone() -> bool:
        try:
            core.read_namespace(ns)
        except kubernetes.client.ApiException as exc:
            return exc.status == 404
        return False

    try:
        _wait(gone, 900, f"namespace {ns} gone",
              lambda: f"{len(core.list_namespaced_pod(ns).items)} pods left, "
                      f"{strip_finalizers()} RayCluster finalizers removed")
    except TimeoutError as exc:
        print(f"warning: {exc}", file=sys.stderr)
    if bench_nodes:
        subprocess.run([str(kubectl), "delete", "node", "--ignore-not-found", *bench_nodes],
                       check=False, capture_output=True)


TARGETS = (
    ("all_rayclusters_created_s", "all RayClusters created after apply (s)", 60.0),
    ("all_ready_s", "all EnvPools Ready after apply (s)", 120.0),
    ("reconcile_p99_s", "reconcile p99 (s)", 1.0),
    ("operator_peak_rss_mib", "operator peak RSS (MiB)", 300.0),
)


def table(figures: Mapping[str, Any]) -> str:
    lines = [f"{'figure':<46} {'measured':>12} {'target':>8}"]
    for key, label, target in TARGETS:
        value = figures.get(key, math.nan)
        ok = "ok" if value <= target else "MISSED"
        lines.append(f"{label:<46} {value:>12} {'<= ' + format(target, 'g'):>8} {ok}")
    for key in ("ts_all_rayclusters_created_s", "ts_all_ready_s", "apply_all_s",
                "apply_to_raycluster_p50_s", "apply_to_raycluster_p99_s",
                "apply_to_ready_p50_s", "apply_to_ready_p99_s", "reconcile_p50_s",
                "reconcile_count", "operator_api_calls_per_pool_create",
                "apiserver_requests_per_pool_burst_total", "status_patches_per_pool",
                "resync_api_calls_per_pool", "resync_wall_s_per_pool", "operator_rss_mib",
                "machine_busy_during_burst", "cpu_s_during_burst", "loadavg_after_burst"):
        if key in figures:
            lines.append(f"{key:<46} {json.dumps(figures[key])}")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pools", type=int, default=1000)
    ap.add_argument("--workers", type=int, default=1,
                    help="worker pods per pool (0: suspended pools, head pod only)")
    ap.add_argument("--create-threads", type=int, default=16)
    ap.add_argument("--timeout", type=float, default=900.0, help="for each wait (s)")
    ap.add_argument("--resync-seconds", type=float, default=30.0,
                    help="the operator's ENVPOOL_RESYNC_SECONDS for this run")
    ap.add_argument("--resync-pools", type=int, default=200,
                    help="measure API calls over this many pool resyncs (0: skip)")
    ap.add_argument("--keep", action="store_true", help="keep the namespace and bench nodes")
    ap.add_argument("--out", default="/tmp/envpool-operator-scale.json")
    args = ap.parse_args()
    if args.pools < 1 or args.workers < 0:
        ap.error("--pools must be >= 1 and --workers >= 0")
    if not os.environ.get("KUBECONFIG"):
        print('set KUBECONFIG (eval "$(bash tests/cluster/up.sh)")', file=sys.stderr)
        return 2
    # SIGTERM runs run()'s finally: operator stopped, namespace and nodes deleted.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    figures = run(args)
    out = json.dumps(figures, sort_keys=True)
    Path(args.out).write_text(out + "\n")
    print(table(figures), file=sys.stderr)
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
