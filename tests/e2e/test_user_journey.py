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

import base64
import json
import os
import secrets
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from journey_kit import (
    EXAMPLE,
    POOL,
    STEP_TIMEOUT_S,
    TRAINER,
    Journey,
    MonitorDiscovery,
    alert_rules_without_for,
    dashboard_queries,
    example,
    kill_pool_server,
    last_json,
    peak_rss_bytes,
    restart_count,
    steps_per_s,
)
from real_node import RealNode

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
def _prometheus(prometheus: Any, discovery: MonitorDiscovery, tmp: Path) -> Any:
    """A real Prometheus on this machine scraping the journey's pods over the pod network,
    finding them as the chart's ServiceMonitor/PodMonitor would, with the alert rules."""
    prom = prometheus(targets=[], scrape_interval="2s")
    cfg = json.loads(prom.config_path.read_text())
    cfg["scrape_configs"] = discovery.scrape_configs()
    cfg["rule_files"] = [str(alert_rules_without_for(tmp / "alerts.yaml"))]
    prom.config_path.write_text(json.dumps(cfg))
    prom.reload()
    return prom


@pytest.fixture(scope="module")
def journey(kube_cluster: Any, real_node: RealNode, prometheus: Any) -> Iterator[Journey]:
    ns = f"journey-{secrets.token_hex(3)}"
    release = "envpool-operator"
    kube_cluster.kubectl("create", "namespace", ns)
    kube_cluster.kubectl("label", "namespace", ns, "pod-security.kubernetes.io/enforce=restricted")
    kube_cluster.wait_until(
        lambda: kube_cluster.kubectl("get", "sa", "default", "-n", ns, check=False).returncode == 0,
        timeout=30, what="default ServiceAccount")
    # the CRD of this checkout (helm install keeps an existing CRD as it is)
    kube_cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(REPO / "manifests" / "crd"))
    tmp = Path(tempfile.mkdtemp(prefix="journey-prom-"))
    discovery = MonitorDiscovery(kube_cluster, ns, tmp).start()
    j = Journey(kube_cluster, real_node, ns, release)
    try:
        j.prom = _prometheus(prometheus, discovery, tmp)  # inside: a failed start still cleans up
        yield j
    finally:
        discovery.stop()
        if os.environ.get("ENVPOOL_JOURNEY_KEEP") == "1":  # to look at what a failed run left
            print(f"\n[journey] ENVPOOL_JOURNEY_KEEP=1: namespace {ns} and release {release} kept")
        else:
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
    # The opt-out: test 7 pins what a pool without GCS fault tolerance does when its head
    # goes (as before issue 31); test_head_loss_real_node.py the default.
    journey.kube.apply(example(journey.ns, head_fault_tolerance=False))
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
    # each holds its lease 90 s after stepping, so that the two leases overlap even when
    # one trainer's Ray client connection needed a retry (41 s once, seen) and the
    # stepping itself takes well under a second (over TCP to the worker pods)
    journey.kube.apply([journey.trainer_job("trainer-a", 12_000, 8, 1, hold_s=90),
                        journey.trainer_job("trainer-b", 12_000, 8, 2, hold_s=90)])
    a = journey.job_result("trainer-a", timeout=300)
    b = journey.job_result("trainer-b", timeout=300)
    journey.figures["apply_trainer_to_first_step_s"] = max(a["first_step_s"], b["first_step_s"])
    journey.figures["trainer_jobs_done_s"] = time.monotonic() - t0
    journey.figures["trainer_steps_per_s"] = a["steps_per_s"] + b["steps_per_s"]
    for got in (a, b):
        assert got["steps"] >= 10_000 and got["episodes"] > 0 and got["errors"] == 0, got
        assert got["num_envs"] == 8
    # at the same time, on actors of their own (whole actors are leased)
    assert a["attached_at"] < b["released_at"] and b["attached_at"] < a["released_at"], (a, b)
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


def test_3c_a_trainer_outside_the_cluster_over_kubectl_port_forward(journey: Journey) -> None:
    """From this machine, as from a laptop: `kubectl port-forward` to the head's Ray
    client port, the pool's token from its Secret, the same Ray and Python minor."""
    secret = journey.kube.kubectl_json("get", "secret", POOL, "-n", journey.ns)
    token = base64.b64decode(secret["data"]["auth_token"]).decode()
    kube = journey.kube
    forward = subprocess.Popen(
        [str(kube.kubectl_path), "--kubeconfig", str(kube.kubeconfig), "port-forward", "-n", journey.ns,
         f"svc/{POOL}-head-svc", ":10001"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert forward.stdout is not None
        line = forward.stdout.readline()  # "Forwarding from 127.0.0.1:<port> -> 10001"
        port = line.split("127.0.0.1:", 1)[1].split()[0] if "127.0.0.1:" in line else None
        assert port, line
        env = {k: v for k, v in kube.env.items() if not k.startswith("RAY_")}
        env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=token, TRAINER="outside", RAY_USAGE_STATS_ENABLED="0",
                   POOL=POOL, POOL_ADDRESS=f"ray://127.0.0.1:{port}")
        out = subprocess.run([sys.executable, "-c", TRAINER, "3000", "8", "4"], capture_output=True, text=True,
                             timeout=300, env=env)
    finally:
        forward.terminate()
        forward.wait(timeout=10)
    assert out.returncode == 0, out.stderr[-4000:]
    got = last_json(out.stdout, "steps")
    assert got is not None and got["steps"] >= 3000 and got["errors"] == 0, (got, out.stderr[-2000:])
    journey.figures["outside_trainer_steps_per_s"] = got["steps_per_s"]
    journey.kube.wait_until(lambda: journey.server_status()["leasedEnvs"] == 0, timeout=60,
                            what="the outside trainer's lease returned")


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
    # the worker pods follow: one per actor again
    journey.kube.wait_until(lambda: len(journey.pods("worker")) == 2, timeout=180, interval=2,
                            what="worker pods back to 2 after the scale down")


def test_5a_faults_on_real_pods_while_a_trainer_steps(journey: Journey) -> None:
    """A trainer steps every env (send/recv) through three faults: a worker pod deleted,
    the pool-server container killed, the operator pod deleted mid-reconcile."""
    journey.kube.apply(journey.stepping_job("stepper", 16))
    steps = journey.wait_stepping("stepper")

    # 1. a worker pod deleted: its actor is replaced on the new worker, the other keeps stepping
    workers = journey.pods("worker")
    assert len(workers) == 2, [w["metadata"]["name"] for w in workers]
    # one actor per worker pod (envsPerWorker 8), placed by the env resource the workers
    # advertise even though the pool server started before they joined
    slots = journey.server_status()["slots"]
    assert len({s["nodeId"] for s in slots}) == 2, slots
    victim = workers[0]["metadata"]["name"]
    restarts_before = journey.server_status()["restarts"]
    t0 = time.monotonic()
    journey.kube.kubectl("delete", "pod", victim, "-n", journey.ns, "--wait=false")

    def recovered() -> bool:
        fresh = [p for p in journey.pods("worker") if p["metadata"]["name"] != victim]
        st = journey.server_status()
        return len(fresh) == 2 and st["readyEnvs"] == 16 and st["restarts"] > restarts_before

    journey.kube.wait_until(recovered, timeout=300, interval=1, what="a new worker and every env back")
    journey.figures["worker_pod_deleted_to_envs_back_s"] = time.monotonic() - t0
    steps = journey.wait_stepping("stepper", more_than=steps)

    # 2. the pool-server container killed: it restarts and re-adopts the same actors
    before = journey.server_status()
    actors = {s["slot"]: s["actorId"] for s in before["slots"]}
    (head,) = journey.pods("head")
    count = restart_count(head, "pool-server")
    t0 = time.monotonic()
    kill_pool_server(journey, head["metadata"]["name"])

    def readopted() -> dict[str, Any] | None:
        (pod,) = journey.pods("head")
        if restart_count(pod, "pool-server") <= count:
            return None
        try:
            st = journey.server_status()
        except (pytest.fail.Exception, ValueError):  # the new server is not listening yet
            return None
        # the trainer's lease too: CI once saw the restarted server's first ready status
        # without it (leasedEnvs 0) and the next with it; a lost lease still times out
        return st if st["readyEnvs"] == 16 and st["leasedEnvs"] == 16 else None

    after = journey.kube.wait_until(readopted, timeout=180, interval=1,
                                    what="the pool server back with its actors and the lease")
    journey.figures["pool_server_killed_to_readopted_s"] = time.monotonic() - t0
    assert {s["slot"]: s["actorId"] for s in after["slots"]} == actors, "re-adopted, not re-created"
    assert after["restarts"] == before["restarts"] and after["leasedEnvs"] == 16, after
    journey.wait_ready(timeout=120)
    steps = journey.wait_stepping("stepper", more_than=steps)

    # 3. the operator pod deleted right after a scale: the new one converges, no duplicates
    rc_uid = journey.kube.kubectl_json("get", "raycluster", POOL, "-n", journey.ns)["metadata"]["uid"]
    op = journey.operator_pod()
    t0 = time.monotonic()
    journey.kube.kubectl("scale", f"epool/{POOL}", "-n", journey.ns, "--replicas=24")
    journey.kube.kubectl("delete", "pod", op["metadata"]["name"], "-n", journey.ns, "--wait=false")
    journey.wait_ready(timeout=300, replicas=24)
    journey.figures["operator_deleted_mid_scale_to_ready_s"] = time.monotonic() - t0
    rcs = journey.kube.kubectl_json("get", "rayclusters", "-n", journey.ns)["items"]
    assert [(r["metadata"]["name"], r["metadata"]["uid"]) for r in rcs] == [(POOL, rc_uid)]
    cms = journey.kube.kubectl_json("get", "configmaps", "-n", journey.ns, "-l", f"envpool.dev/pool={POOL}")
    assert len(cms["items"]) == 1, [c["metadata"]["name"] for c in cms["items"]]
    assert len(journey.pods("worker")) == 3
    # scaling down frees the new, un-leased actor: the trainer's 16 envs are untouched
    journey.kube.kubectl("scale", f"epool/{POOL}", "-n", journey.ns, "--replicas=16")
    journey.wait_ready(timeout=180, replicas=16)
    assert journey.server_status()["leasedEnvs"] == 16
    journey.wait_stepping("stepper", more_than=journey.progress("stepper"))


def test_5b_metrics_from_the_real_pods_fill_every_panel(journey: Journey) -> None:
    """Prometheus found the operator, pool-server and trainer pods itself and scraped
    them over the pod network; the worker fault moved the failure and restart counters."""
    prom, ns = journey.prom, journey.ns
    journey.kube.wait_until(
        lambda: {t["labels"]["job"] for t in prom.targets() if t["health"] == "up"}
        >= {"envpool-operator", "envpool-pool-server", "envpool-trainer"},
        timeout=90, interval=2, what="the three jobs' targets up")
    for expr in (f'sum(envpool_actor_restarts_total{{namespace="{ns}", pool="{POOL}"}}) >= 1',
                 f'sum(envpool_env_failures_total{{namespace="{ns}", pool="{POOL}"}}) >= 1'):
        journey.kube.wait_until(lambda e=expr: prom.query(e), timeout=60, interval=2, what=expr)
    queries = dashboard_queries()
    results: dict[int, list[dict[str, Any]]] = {}
    deadline = time.monotonic() + 90
    while len(results) < len(queries) and time.monotonic() < deadline:
        for i, (_, expr) in enumerate(queries):
            if i not in results and (got := prom.query(expr)):
                results[i] = got
        time.sleep(2)
    empty = [f"{title!r}: {expr}" for i, (title, expr) in enumerate(queries) if i not in results]
    assert not empty, "panels without data from the real pods:\n" + "\n".join(empty)
    pools = {s["metric"]["pool"] for got in results.values() for s in got if "pool" in s["metric"]}
    assert pools == {POOL}, pools


def test_5c_the_trainer_got_an_answer_for_every_step(journey: Journey) -> None:
    result = journey.stop_stepping("stepper")
    journey.figures["stepper_steps"] = result["steps"]
    journey.figures["stepper_slowest_recv_s"] = result["slowest_recv_s"]
    assert result["done"] and result["unanswered"] == 0, result
    # the lost worker's in-flight steps came back as truncated steps with an error
    assert result["errors"] >= 1 and result["untruncated_errors"] == 0, result
    assert result["slowest_recv_s"] < STEP_TIMEOUT_S, result
    journey.wait_ready(timeout=60)
    journey.kube.wait_until(lambda: journey.server_status()["leasedEnvs"] == 0, timeout=60,
                            what="the stepper's lease returned")


def _new_head_with_every_env(journey: Journey, old_head_uid: str, envs: int = 16) -> dict[str, Any] | None:
    """The pool server's /status once a head pod other than ``old_head_uid`` has ``envs``
    ready (the EnvPool's status may still show the old head's last report)."""
    pods = journey.pods("head")
    if len(pods) != 1 or pods[0]["metadata"]["uid"] == old_head_uid:
        return None
    try:
        st = journey.server_status()
    except (pytest.fail.Exception, ValueError, KeyError):  # not serving yet
        return None
    return st if st["readyEnvs"] == envs else None


def _rolled_in_place(journey: Journey, old_revision: str, envs: int = 16) -> dict[str, Any] | None:
    """The pool server's /status once every env runs a revision other than ``old_revision``."""
    try:
        st = journey.server_status()
    except (pytest.fail.Exception, ValueError, KeyError):  # not serving
        return None
    done = (st.get("revision") not in (None, old_revision) and st["readyEnvs"] == envs
            and st.get("updatedEnvs") == envs and st.get("outdatedEnvs") == 0)
    return st if done else None


def test_6_an_env_failing_every_step_fires_the_failure_alert(journey: Journey) -> None:
    """The pool re-specced to an env that raises on every step: the new env rolls
    through the running Ray pods (spec.env is not in the operator's cluster hash, so no
    pod is re-created); its trainer's steps come back as errors, and the failure-rate
    alert fires on the scraped series. The pool keeps the flaky env for the rest of
    the journey."""
    prom, ns = journey.prom, journey.ns
    pods_before = {p["metadata"]["uid"] for c in ("head", "worker") for p in journey.pods(c)}
    old_revision = journey.server_status()["revision"]
    flaky = {"spec": {"env": {"id": None, "entrypoint": "remote_env.examples:make_flaky_cartpole",
                              "kwargs": {"fail_every": 1}},
                      "faultTolerance": {"maxRestarts": 1_000_000, "restartBackoffSeconds": 0}}}
    t0 = time.monotonic()
    journey.kube.kubectl("patch", "epool", POOL, "-n", ns, "--type=merge", "-p", json.dumps(flaky))
    journey.kube.wait_until(lambda: _rolled_in_place(journey, old_revision),
                            timeout=420, interval=2, what="every env rolled to the flaky env in place")
    journey.wait_ready(timeout=120)
    pods_after = {p["metadata"]["uid"] for c in ("head", "worker") for p in journey.pods(c)}
    assert pods_after == pods_before, "an env change re-created Ray pods"
    journey.figures["env_changed_to_ready_s"] = time.monotonic() - t0
    journey.kube.apply(journey.stepping_job("flaky", 8))
    journey.wait_stepping("flaky")

    def firing() -> list[dict[str, Any]]:
        return [a for a in prom.api("alerts")["alerts"] if a["labels"].get("alertname") == "EnvPoolEnvFailureRateHigh"
                and a["labels"].get("pool") == POOL and a["state"] == "firing"]

    try:
        journey.kube.wait_until(firing, timeout=120, interval=2, what="EnvPoolEnvFailureRateHigh firing")
    finally:
        result = journey.stop_stepping("flaky")
    assert result["errors"] > 0 and result["untruncated_errors"] == 0 and result["unanswered"] == 0, result
    assert "injected failure" in result["last_error"], result
    journey.wait_ready(timeout=120)


def test_7_the_head_pod_deleted(journey: Journey) -> None:
    """The head holds GCS and the pool server: its loss ends every actor. What a trainer
    sees, and how long until the pool is Ready again."""
    journey.kube.apply(journey.stepping_job("headless", 8))
    journey.wait_stepping("headless")
    (head,) = journey.pods("head")
    t0 = time.monotonic()
    journey.kube.kubectl("delete", "pod", head["metadata"]["name"], "-n", journey.ns, "--wait=false")

    def ended() -> dict[str, Any] | None:
        return last_json(journey.logs("headless"), "done")

    end = journey.kube.wait_until(ended, timeout=300, interval=2, what="the attached trainer to end")
    journey.figures["head_deleted_to_trainer_error_s"] = time.monotonic() - t0
    print(f"\n[journey] trainer attached while the head was deleted: {end}")
    # it fails with an error (no hang, no silent success over a pool that is gone)
    assert end["done"] is False and end["exception"], end
    journey.kube.wait_until(lambda: _new_head_with_every_env(journey, head["metadata"]["uid"]),
                            timeout=420, interval=2, what="a new head with every env")
    journey.wait_ready(timeout=120)
    journey.figures["head_deleted_to_ready_s"] = time.monotonic() - t0


def test_8_figures_in_cluster_against_the_host_and_peak_memory(journey: Journey) -> None:
    """`envpool run -f` of the same YAML on this machine, beside the in-cluster trainers;
    peak memory of the head and worker pods from their cgroups."""
    envpool = Path(sys.executable).parent / "envpool"
    out = subprocess.run([str(envpool), "run", "-f", str(EXAMPLE), "--seconds", "20"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    host = steps_per_s(out.stdout)
    journey.figures["host_envpool_run_f_steps_per_s"] = host
    assert host > 0
    for pod in [*journey.pods("head"), *journey.pods("worker")]:
        rss = peak_rss_bytes(pod["metadata"]["uid"])
        assert rss is not None, f"no cgroup for pod {pod['metadata']['name']}"
        kind = pod["metadata"]["labels"]["app.kubernetes.io/component"]
        key = f"peak_rss_{kind}_mib"
        journey.figures[key] = max(journey.figures.get(key, 0.0), rss / 2**20)


def test_9_uninstall_leaves_nothing_behind(journey: Journey) -> None:
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
