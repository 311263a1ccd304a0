"""The Grafana dashboard and the alerts, proven with real data (issue 8).

A real Prometheus (Debian's) scrapes a real pool workload with injected
failures (``envpool run`` with a CartPole that raises every 50 steps, plus one
env actor process killed mid-run) and the real operator reconciling a real
EnvPool on the local control plane. Then every panel's query, as Grafana would
send it, must return non-empty series with the label sets its legend uses,
and with values that match what was injected. The alert rules are loaded into
the same Prometheus: all evaluate without error, the failure-rate expression
matches the injected rate, and stopping the operator makes EnvPoolOperatorDown
go pending.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

pytestmark = [pytest.mark.e2e]

REPO = Path(__file__).resolve().parents[2]
CRD = REPO / "manifests" / "crd" / "envpool.dev_envpools.yaml"
ALERTS = REPO / "helm" / "envpool-operator" / "files" / "envpool-alerts.yaml"
DASHBOARD = REPO / "helm" / "envpool-operator" / "files" / "envpool-dashboard.json"
ENVPOOL = Path(sys.executable).parent / "envpool"
FAIL_EVERY = 10  # each sub-env raises on every 10th step: 10% failures, over the 5% alert
POOL = "flaky"
#: A pool server (``envpool run -f``) whose trainer leases every env: the lease and buffer
#: panels' data (a RemoteVectorEnv of its own, like ``flaky``'s, has no leases).
LEASED_POOL = "leased"
WORKLOAD_SECONDS = 90
#: What Grafana puts in for the variables: "All" (allValue ".*") and, for
#: $__rate_interval, 4 x the 1 s scrape interval plus slack.
GRAFANA_VARS = {"$namespace": ".*", "$pool": ".*", "$__rate_interval": "10s"}
FIGURES = Path(os.environ.get("ENVPOOL_DASHBOARD_FIGURES", "/tmp/envpool-dashboard-figures.json"))


def _load_generate() -> Any:
    spec = importlib.util.spec_from_file_location("helm_generate", REPO / "helm" / "generate.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _get(url: str, timeout: float = 3) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return str(resp.read().decode())


def _up(url: str) -> bool:
    try:
        _get(url)
        return True
    except OSError:
        return False


def _descendants(pid: int) -> list[int]:
    """Pids of every process below ``pid`` (Ray's raylet and workers are)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


@dataclass
class Proc:
    proc: subprocess.Popen[bytes]
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)


def _spawn(args: list[str], log_path: Path, env: dict[str, str]) -> Proc:
    log = open(log_path, "ab")  # noqa: SIM115 - owned by the child
    return Proc(subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                 env=env, cwd=REPO, start_new_session=True), log_path)


@dataclass
class Stack:
    prom: Any
    workload: Proc
    workload_port: int
    operator: Proc
    operator_port: int
    namespace: str
    pool: str


@pytest.fixture(scope="module")
def stack(kube_cluster: Any, prometheus: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    kube = kube_cluster
    tmp = tmp_path_factory.mktemp("dashboard")
    workload_port, operator_port, health_port = _free_port(), _free_port(), _free_port()
    pool_port = _free_port()
    prom = prometheus(targets=[
        {"job": "envpool", "targets": [f"127.0.0.1:{workload_port}", f"127.0.0.1:{pool_port}"]},
        {"job": "envpool-operator", "targets": [f"127.0.0.1:{operator_port}"]},
    ], scrape_interval="1s")
    # the alert rules, evaluated every second on the same data
    cfg = json.loads(prom.config_path.read_text())
    cfg["rule_files"] = [str(ALERTS)]
    prom.config_path.write_text(json.dumps(cfg))
    prom.reload()

    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    workload = _spawn(
        [str(ENVPOOL), "run", "--entrypoint", "remote_env.examples:make_flaky_cartpole",
         "--env-kwarg", f"fail_every={FAIL_EVERY}", "--pool", POOL, "--num-envs", "4",
         "--envs-per-actor", "2", "--seconds", str(WORKLOAD_SECONDS), "--metrics-port", str(workload_port)],
        tmp / "workload.log", env)
    pool_file = tmp / "leased.yaml"
    pool_file.write_text(yaml.safe_dump({
        "apiVersion": "envpool.dev/v1alpha1", "kind": "EnvPool", "metadata": {"name": LEASED_POOL},
        "spec": {"env": {"id": "CartPole-v1"}, "replicas": 2, "envsPerActor": 1}}))
    leased = _spawn(
        [str(ENVPOOL), "run", "-f", str(pool_file), "--seconds", str(WORKLOAD_SECONDS),
         "--metrics-port", str(pool_port)], tmp / "leased.log", env)

    kube.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CRD))
    kube.kubectl("wait", "--for=condition=Established", "crd/envpools.envpool.dev", "--timeout=60s")
    ns = f"e2e-dashboard-{os.getpid()}"
    kube.kubectl("create", "namespace", ns)
    operator = _spawn(
        [sys.executable, "-m", "envpool_operator", "--all-namespaces", "--standalone",
         "--metrics-port", str(operator_port), "--liveness", f"http://127.0.0.1:{health_port}/healthz"],
        tmp / "operator.log",
        {**kube.env, "PYTHONUNBUFFERED": "1", "ENVPOOL_IMAGE": "registry.example/envpool:e2e",
         "ENVPOOL_RESYNC_SECONDS": "10"})
    try:
        kube.wait_until(lambda: _up(f"http://127.0.0.1:{health_port}/healthz") or not operator.alive(),
                        timeout=60, what="operator liveness")
        assert operator.alive(), operator.log()[-3000:]
        doc = yaml.safe_load((REPO / "manifests" / "examples" / "cartpole.yaml").read_text())
        small = {"requests": {"cpu": "100m", "memory": "256Mi"}}  # kwok runs nothing
        doc["spec"]["ray"] = {"head": {"resources": small}, "worker": {"resources": small}}
        kube.kubectl("apply", "-n", ns, "-f", "-", input=json.dumps(doc))
        pool = doc["metadata"]["name"]
        # reconciled: the operator wrote a phase (any phase will do for the dashboard)
        kube.wait_until(
            lambda: (kube.kubectl_json("get", "envpool", pool, "-n", ns).get("status") or {}).get("phase"),
            timeout=120, what=f"EnvPool {ns}/{pool} phase")
        yield Stack(prom, workload, workload_port, operator, operator_port, ns, pool)
    finally:
        workload.stop()
        leased.stop()
        operator.stop()
        kube.kubectl("delete", "namespace", ns, "--wait=false", "--ignore-not-found", check=False)


def _grafana(expr: str) -> str:
    for var, value in GRAFANA_VARS.items():
        expr = expr.replace(var, value)
    assert "$" not in expr, f"unsubstituted variable in {expr}"
    return expr


def _by_labels(expr: str) -> set[str]:
    m = re.search(r"\bby \(([^)]*)\)", expr)
    return {x.strip() for x in m.group(1).split(",")} - {"le"} if m else set()


def _value(series: dict[str, Any]) -> float:
    return float(series["value"][1])


def test_every_panel_has_data_with_its_labels(stack: Stack, kube_cluster: Any) -> None:
    prom, workload = stack.prom, stack.workload
    gen = _load_generate()
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard == gen.build_dashboard()

    # the workload is up and failing as designed
    kube_cluster.wait_until(lambda: _up(f"http://127.0.0.1:{stack.workload_port}/metrics") or not workload.alive(),
                            timeout=90, what="workload /metrics")
    assert workload.alive(), workload.log()[-3000:]
    kube_cluster.wait_until(
        lambda: prom.query('sum(envpool_env_failures_total{reason="exception"}) > 0'),
        timeout=60, what="injected failures scraped")

    # one env actor process killed for real: the pool must restart it
    actors = [p for p in _descendants(workload.proc.pid) if "SubEnvHost" in _cmdline(p)]
    assert actors, f"no SubEnvHost actor process under pid {workload.proc.pid}"
    os.kill(actors[0], signal.SIGKILL)
    kube_cluster.wait_until(lambda: prom.query("sum(envpool_actor_restarts_total) > 0"), timeout=60,
                            what="actor restart scraped")

    # every panel's every query, as Grafana sends it, has data (one shared deadline)
    targets = [(panel, target) for panel in dashboard["panels"] if panel["type"] != "row"
               for target in panel["targets"]]
    results: dict[int, list[dict[str, Any]]] = {}
    deadline = time.monotonic() + 60
    while len(results) < len(targets) and time.monotonic() < deadline:
        for i, (_, target) in enumerate(targets):
            if i not in results and (got := prom.query(_grafana(target["expr"]))):
                results[i] = got
        time.sleep(1)
    empty = [f"{p['title']!r}: {_grafana(t['expr'])}" for i, (p, t) in enumerate(targets) if i not in results]
    assert not empty, "panels without data:\n" + "\n".join(empty)

    figures: dict[str, Any] = {}
    pool_label: set[str] = set()
    for i, (panel, target) in enumerate(targets):
        expr, result = _grafana(target["expr"]), results[i]
        by = _by_labels(expr)
        # the operator's per-pool gauges carry the namespace too (its EnvPools')
        from_pool = "envpool_operator" not in expr and "envpool_pool_phase" not in expr \
            and "envpool_pool_head_available" not in expr and not expr.startswith("up")
        for s in result:
            labels = set(s["metric"]) - {"__name__"}
            if expr.startswith("up"):
                assert labels == {"instance", "job"} and s["metric"]["job"] == "envpool-operator"
                continue
            # out of cluster a pool has no namespace label; the operator always has one
            need = by - {"namespace"} if from_pool else by
            assert need <= labels <= by, f"{panel['title']}: labels {labels}, expected {by}"
            # every label the legend shows is there
            for name in re.findall(r"\{\{(\w+)\}\}", target["legendFormat"]):
                assert name in labels or (name == "namespace" and from_pool), (panel["title"], name)
            if from_pool:
                pool_label.add(s["metric"]["pool"])
        figures[f"{panel['title']} [{target['refId']}]"] = {
            json.dumps(s["metric"], sort_keys=True): _value(s) for s in result}
    assert pool_label == {POOL, LEASED_POOL}, f"pool panels show pools {pool_label}"

    # values that match what was injected
    def one(expr: str) -> float:
        result = prom.query(_grafana(expr))
        assert result, expr
        return sum(_value(s) for s in result)

    steps = one('sum(rate(envpool_env_steps_total{pool=~"$pool"}[$__rate_interval]))')
    polls = one('sum(rate(envpool_polls_total[$__rate_interval]))')
    failures = one('sum(rate(envpool_env_failures_total{reason="exception"}[$__rate_interval]))')
    assert steps > 0 and polls > 0
    assert 0.5 / FAIL_EVERY < failures / steps < 2 / FAIL_EVERY, (failures, steps)
    for q in (0.5, 0.99):
        batch = one(f"histogram_quantile({q}, sum by (le) (rate(envpool_poll_batch_size_bucket[$__rate_interval])))")
        wait = one(f"histogram_quantile({q}, sum by (le) (rate(envpool_poll_wait_seconds_bucket[$__rate_interval])))")
        assert 1 <= batch <= 4 and 0 < wait < 10 and not math.isnan(wait), (q, batch, wait)
        figures[f"batch p{int(q * 100)}"], figures[f"wait p{int(q * 100)} s"] = batch, wait
    assert one("sum(envpool_actor_restarts_total)") >= 1
    assert one("sum(envpool_env_restarts_total)") >= 1
    assert one('sum(envpool_envs{state="running"})') >= 1
    # the lease panels: leased's trainer holds both of its envs, none is free. Polled:
    # the gauges exist (0 leased, 2 free) from the pool's start, before its trainer
    # attaches, and on a quiet machine this point comes seconds after both started
    kube_cluster.wait_until(
        lambda: (one(f'sum(envpool_pool_leased_envs{{pool="{LEASED_POOL}"}})'),
                 one(f'sum(envpool_pool_free_envs{{pool="{LEASED_POOL}"}})')) == (2, 0),
        timeout=60, what=f"pool {LEASED_POOL}: 2 envs leased, 0 free in Prometheus")
    # the phase panel agrees with kubectl get epool
    def phase_agrees() -> bool:
        shown = prom.query(f'envpool_pool_phase{{namespace="{stack.namespace}", pool="{stack.pool}"}} == 1')
        status = kube_cluster.kubectl_json("get", "envpool", stack.pool, "-n", stack.namespace)["status"]
        return [s["metric"]["phase"] for s in shown] == [status["phase"]]

    kube_cluster.wait_until(phase_agrees, timeout=30, what="envpool_pool_phase == the EnvPool's phase")
    assert one('sum(envpool_operator_reconciles_total{result="success"})') >= 1
    assert one('up{job="envpool-operator"}') == 1
    figures.update(steps_per_s=steps, polls_per_s=polls, failures_per_s=failures)

    # the variables' queries (label_values) find the pool
    values = prom.api("series", **{"match[]": 'envpool_envs{namespace=~".*"}'})
    assert {s["pool"] for s in values} == pool_label
    FIGURES.write_text(json.dumps(figures, indent=2, sort_keys=True))
    print(f"\n[dashboard] steps/s {steps:.0f}  polls/s {polls:.0f}  failures/s {failures:.1f} "
          f"(1/{steps / failures:.0f} steps)  figures: {FIGURES}")


def test_alert_rules_evaluate_on_real_data(stack: Stack, kube_cluster: Any) -> None:
    prom = stack.prom
    rules = yaml.safe_load(ALERTS.read_text())
    names = {r["alert"] for g in rules["groups"] for r in g["rules"]}

    def loaded() -> dict[str, Any]:
        got = {r["name"]: r for g in prom.api("rules")["groups"] for r in g["rules"]}
        # health is "unknown" until the first evaluation
        return got if set(got) == names and all(r["health"] != "unknown" for r in got.values()) else {}

    got = kube_cluster.wait_until(loaded, timeout=30, what="alert rules loaded and evaluated")
    for name, rule in got.items():
        assert rule["health"] == "ok", (name, rule.get("lastError"))

    # the failure-rate alert's ratio is the injected rate (1 in FAIL_EVERY), over its 5% threshold
    expr = next(r["expr"] for g in rules["groups"] for r in g["rules"]
                if r.get("alert") == "EnvPoolEnvFailureRateHigh")
    ratio_expr = expr.split(">")[0]
    ratio = kube_cluster.wait_until(
        lambda: [r for r in prom.query(ratio_expr) if r["metric"]["pool"] == POOL], timeout=30,
        what=ratio_expr)  # LEASED_POOL's server steps nothing itself: its ratio is 0
    assert len(ratio) == 1 and 0.5 / FAIL_EVERY < _value(ratio[0]) < 2 / FAIL_EVERY, ratio
    kube_cluster.wait_until(
        lambda: next(r for g in prom.api("rules")["groups"] for r in g["rules"]
                     if r["name"] == "EnvPoolEnvFailureRateHigh")["state"] == "pending",
        timeout=30, what="EnvPoolEnvFailureRateHigh pending (its `for` is 10m)")
    assert got["EnvPoolOperatorDown"]["state"] == "inactive"

    # the operator goes away: up == 0, and the operator-down alert goes pending
    stack.operator.stop()
    kube_cluster.wait_until(
        lambda: next(r for g in prom.api("rules")["groups"] for r in g["rules"]
                     if r["name"] == "EnvPoolOperatorDown")["state"] == "pending",
        timeout=30, what="EnvPoolOperatorDown pending after the operator stopped")
    assert prom.query('up{job="envpool-operator"} == 0')
