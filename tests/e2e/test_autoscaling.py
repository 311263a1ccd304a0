"""Pools that size themselves (``spec.autoscaling``) on the real API server.

Everything is real except the pods: the kube-apiserver with the CRD and its CEL
rules, the operator (``envpool operator``, a subprocess), the real KubeRay operator
sizing the RayCluster's worker group (kwok runs its pods), a real local Ray, and the
pool server (``python -m remote_env.cli.serve``, as the head pod's sidecar runs it:
the operator's ConfigMap document, the operator-made ServiceAccount's token, the
EnvPool watch and the ``status.pool`` report). Trainers lease with
``remote_env.driver.attach`` from this process. The loop under test is the product's:
lease -> pool server report -> operator -> scale subresource -> pool server watch ->
new actors (and RayCluster workers).

Figures (printed, ``-s``): lease latency with autoscaling against a fixed-size pool,
time from a lease that empties the buffer to the buffer refilled, and envs created
and destroyed over a scripted lease pattern against the ideal.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import ray
import yaml
from test_operator_e2e import Operator, install_crd, watched_namespace
from test_pool_server_report import _token_kubeconfig

from envpool_operator import names
from remote_env import RemoteVectorEnv, spec
from remote_env.pool import lease_actor

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

REPO = Path(__file__).resolve().parents[2]
INTEGRATION = REPO / "tests" / "integration"  # pool_envs: envs that count constructions
NS_PREFIX = "e2e-as-"
sys.path.insert(0, str(INTEGRATION))
from pool_envs import constructions  # noqa: E402

attach = RemoteVectorEnv.from_pool  # the pool's trainer entry point


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.fixture(scope="module")
def operator(kube_cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Operator]:
    install_crd(kube_cluster)
    env = {**kube_cluster.env, "ENVPOOL_IMAGE": "registry.example/envpool:e2e",
           # a pass a second: scale-down delays of a few seconds run out on time
           "ENVPOOL_AUTOSCALE_SECONDS": "1", "PYTHONUNBUFFERED": "1"}
    op = Operator(kube_cluster, tmp_path_factory.mktemp("operator") / "operator.log", env,
                  namespaces=f"{NS_PREFIX}*")
    op.start()
    yield op
    op.stop()
    print(f"\n[operator log tail]\n{op.log_tail(40)}")


@pytest.fixture
def namespace(kube_cluster: Any, request: pytest.FixtureRequest) -> Iterator[str]:
    yield from watched_namespace(kube_cluster, request, NS_PREFIX)


@pytest.fixture(scope="module")
def local_ray() -> Iterator[str]:
    """A real local Ray whose node advertises the env resource, as worker pods do."""
    ray.shutdown()
    old = os.environ.get("PYTHONPATH")
    # the env actors import pool_envs (raylets and their workers inherit this)
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(INTEGRATION), old) if p)
    ctx = ray.init(address="local", num_cpus=2, include_dashboard=False,
                   resources={spec.ENV_RESOURCE: 256})
    try:
        yield str(ctx.address_info["gcs_address"])
    finally:
        ray.shutdown()
        if old is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = old


class PoolServer:
    """``envpool serve`` for one EnvPool, as its head pod's sidecar runs it."""

    def __init__(self, kube: Any, ns: str, name: str, gcs: str, tmp: Path) -> None:
        cm = kube.wait_until(
            lambda: kube.kubectl_json("get", "configmap", names.config_map_name(name),
                                      "-n", ns, check=False),
            timeout=60, what="the operator's ConfigMap")
        config = tmp / names.CONFIG_KEY
        config.write_text(cm["data"][names.CONFIG_KEY])
        kube.wait_until(lambda: kube.kubectl("get", "rolebinding",
                                             names.service_account_name(name), "-n", ns,
                                             check=False).returncode == 0,
                        timeout=60, what="the pool server's RoleBinding")
        kubeconfig = _token_kubeconfig(kube, names.service_account_name(name), ns,
                                       tmp / "sa.kubeconfig")
        env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
        env.update(KUBECONFIG=str(kubeconfig), ENVPOOL_POOL_NAMESPACE=ns,
                   ENVPOOL_POOL_NAME=name, PYTHONUNBUFFERED="1")
        self.port = _free_port()
        self.log = tmp / "serve.log"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "remote_env.cli.serve", "--config", str(config),
             "--address", gcs, "--http-port", str(self.port), "--health-interval", "0.3",
             "--destroy-on-exit"],
            stdout=self.log.open("ab"), stderr=subprocess.STDOUT, env=env, cwd=REPO)

    def status(self) -> dict[str, Any]:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/status", timeout=5) as r:
            doc: dict[str, Any] = json.load(r)
        return doc

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


@pytest.fixture
def pool_server(kube_cluster: Any, local_ray: str,
                tmp_path: Path) -> Iterator[Callable[[str, str], PoolServer]]:
    started: list[PoolServer] = []

    def start(ns: str, name: str) -> PoolServer:
        server = PoolServer(kube_cluster, ns, name, local_ray, tmp_path)
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()
        print("\n[pool server log tail]\n"
              + "\n".join(server.log.read_text(errors="replace").splitlines()[-15:]))


def _envpool(name: str, counter: Path, replicas: int, **extra: Any) -> dict[str, Any]:
    return {
        "apiVersion": spec.API_VERSION, "kind": spec.KIND, "metadata": {"name": name},
        "spec": {
            "env": {"entrypoint": "pool_envs:make_counted_cartpole",
                    "kwargs": {"counter_file": str(counter)}},
            "replicas": replicas, "envsPerActor": 2,
            # 4 envs a worker pod: the RayCluster's workers visibly follow the size
            "ray": {"authMode": "disabled", "worker": {"envsPerWorker": 4}},
            "faultTolerance": {"restartBackoffSeconds": 0},
            **extra,
        },
    }


def _apply(kube: Any, ns: str, doc: dict[str, Any]) -> None:
    kube.kubectl("apply", "-n", ns, "-f", "-", input=json.dumps(doc))


def _epool(kube: Any, ns: str, name: str) -> dict[str, Any]:
    doc: dict[str, Any] = kube.kubectl_json("get", "envpool", name, "-n", ns)
    return doc


def _workers(kube: Any, ns: str, name: str) -> int | None:
    """The RayCluster's worker replicas (None before the operator created it)."""
    rc = kube.kubectl_json("get", "raycluster", name, "-n", ns, check=False)
    return None if rc is None else int(rc["spec"]["workerGroupSpecs"][0]["replicas"])


def _wait_free(server: PoolServer, kube: Any, free: int, total: int | None = None,
               timeout: float = 120) -> dict[str, Any]:
    def ok() -> dict[str, Any] | None:
        st = server.status()
        if st["freeEnvs"] >= free and (total is None or st["totalEnvs"] == total) \
                and st["readyEnvs"] == st["totalEnvs"]:
            return st
        return None

    got: dict[str, Any] = kube.wait_until(ok, timeout=timeout, interval=0.05,
                                          what=f"{free} free envs (log: {server.log})")
    return got


def _lease(name: str, n: int, who: str, wait_s: float = 0.0) -> tuple[Any, float]:
    t0 = time.perf_counter()
    envs = attach(name, num_envs=n, trainer=who, wait_s=wait_s)
    return envs, time.perf_counter() - t0


def _ms(xs: list[float]) -> str:
    return ", ".join(f"{x * 1000:.0f} ms" for x in xs)


def test_three_trainers_find_free_envs_and_scale_down_spares_leases(
    kube_cluster: Any, operator: Operator, namespace: str, pool_server: Any, tmp_path: Path,
) -> None:
    kube, name = kube_cluster, "auto"
    counter = tmp_path / "constructed"
    delay = 12  # long enough that the release-then-spike below stays inside it
    _apply(kube, namespace, _envpool(name, counter, replicas=4, autoscaling={
        "minReplicas": 4, "maxReplicas": 16, "bufferEnvs": 4,
        "scaleDownDelaySeconds": delay}))
    server = pool_server(namespace, name)
    _wait_free(server, kube, 4, total=4)
    start_envs = constructions(str(counter))
    assert start_envs == 4

    # three trainers lease 4 envs each in turn; each arrives once the buffer is back
    latencies, refills, trainers = [], [], []
    for i in range(3):
        envs, took = _lease(name, 4, f"trainer-{i}")  # wait_s=0: free at once or an error
        latencies.append(took)
        trainers.append(envs)
        t0 = time.monotonic()
        st = _wait_free(server, kube, 4, total=4 * (i + 2))
        refills.append(time.monotonic() - t0)
        assert st["leasedEnvs"] == 4 * (i + 1)
        envs.reset(seed=i)
        envs.step(envs.action_space.sample())
    doc = _epool(kube, namespace, name)
    assert doc["spec"]["replicas"] == 16
    # the RayCluster's workers followed: 16 envs in actors of 2, 4 envs a worker pod
    kube.wait_until(lambda: _workers(kube, namespace, name) == 4, timeout=30,
                    what="4 RayCluster workers")
    # the pool server's report reaches status (and kubectl) within its 1 s throttle
    kube.wait_until(
        lambda: (d := _epool(kube, namespace, name)["status"]).get("leasedEnvs") == 12
        and d.get("freeEnvs") == 4, timeout=30, what="status.leasedEnvs/freeEnvs")
    lines = kube.kubectl("get", "epool", name, "-n", namespace).stdout.splitlines()
    columns = dict(zip(lines[0].split(), lines[1].split(), strict=False))
    assert (columns["LEASED"], columns["FREE"], columns["DESIRED"]) == ("12", "4", "16"), lines

    # bounds: a fourth trainer takes the last 4; the pool stays at maxReplicas
    fourth, _ = _lease(name, 4, "trainer-3")
    kube.wait_until(lambda: server.status()["leasedEnvs"] == 16, timeout=10, what="16 leased")
    _stays(kube, namespace, name, 16, seconds=3)  # several autoscaler passes later
    with pytest.raises(lease_actor.LeaseError, match="cannot lease num_envs=2"):
        _lease(name, 2, "trainer-4")
    built = constructions(str(counter))

    # a release and a new spike inside the delay: two trainers leave (8 leased, so 12
    # asked), another takes 8 again within seconds. Nothing is destroyed or re-created.
    fourth.close()
    trainers.pop().close()
    kube.wait_until(lambda: server.status()["leasedEnvs"] == 8, timeout=10, what="8 leased")
    spike, _ = _lease(name, 8, "trainer-4")
    _stays(kube, namespace, name, 16, seconds=2)
    assert constructions(str(counter)) == built

    # scale down: the spike and trainer-0 leave; trainer-1 keeps its actors and env state
    keeper = trainers[1]
    kept_ids, kept_steps = [h._actor_id.hex() for h in keeper.actors], keeper.get_attr("steps")
    spike.close()
    trainers[0].close()
    t_release = time.monotonic()
    kube.wait_until(lambda: _epool(kube, namespace, name)["spec"]["replicas"] == 8,
                    timeout=delay + 30, what="scaled down to 4 leased + 4")
    waited = time.monotonic() - t_release
    assert waited >= delay - 1, f"scaled down after {waited:.1f}s, before the {delay}s delay"
    _wait_free(server, kube, 4, total=8)
    assert [h._actor_id.hex() for h in keeper.actors] == kept_ids
    assert keeper.get_attr("steps") == kept_steps, "a leased env was touched by the scale-down"
    keeper.step(keeper.action_space.sample())
    kube.wait_until(lambda: _workers(kube, namespace, name) == 2, timeout=30,
                    what="2 RayCluster workers")

    # the last trainer leaves: back to minReplicas after the delay, never below
    keeper.close()
    kube.wait_until(lambda: _epool(kube, namespace, name)["spec"]["replicas"] == 4,
                    timeout=delay + 30, what="back to minReplicas")
    final = _wait_free(server, kube, 4, total=4)
    assert final["restarts"] == 0
    kube.wait_until(lambda: _workers(kube, namespace, name) == 1, timeout=30,
                    what="1 RayCluster worker")
    created = constructions(str(counter)) - start_envs
    destroyed = constructions(str(counter)) - final["totalEnvs"]
    auto = kube.wait_until(
        lambda: (a := _epool(kube, namespace, name)["status"].get("autoscaling", {})).get(
            "recommendedReplicas") == 4 and a, timeout=30, what="status.autoscaling")
    assert "0 leased + 4 free" in auto["message"], auto
    print(f"\nFIGURE autoscaled lease latency (3 trainers in turn, 4 envs each): "
          f"{_ms(latencies)}")
    print(f"FIGURE buffer refill after a lease emptied it (4 envs, 2 actors): {_ms(refills)}")
    print(f"FIGURE envs created/destroyed over the lease pattern (4 -> 16 -> release 8 + "
          f"spike 8 -> 8 -> 4): {created}/{destroyed}, ideal 12/12")
    assert all(t < 5.0 for t in latencies), latencies  # warm envs: no env was created
    assert created == 12 and destroyed == 12  # the spike and its release cost nothing


def _stays(kube: Any, ns: str, name: str, replicas: int, seconds: float) -> None:
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        assert _epool(kube, ns, name)["spec"]["replicas"] == replicas
        time.sleep(0.3)


def test_a_fixed_size_pool_makes_the_next_trainer_wait_for_new_envs(
    kube_cluster: Any, operator: Operator, namespace: str, pool_server: Any, tmp_path: Path,
) -> None:
    """The same 3 trainers against a pool without autoscaling, resized by hand the moment
    each trainer asks (the best a person or a script watching the pool can do)."""
    kube, name = kube_cluster, "fixed"
    _apply(kube, namespace, _envpool(name, tmp_path / "constructed", replicas=4))
    server = pool_server(namespace, name)
    _wait_free(server, kube, 4, total=4)
    latencies, trainers = [], []
    for i in range(3):
        if i:
            # no free envs: the trainer would fail at once; scale by hand and wait
            with pytest.raises(lease_actor.LeaseError):
                _lease(name, 4, f"trainer-{i}")
            t0 = time.perf_counter()
            kube.kubectl("scale", "envpool", name, "-n", namespace, f"--replicas={4 * (i + 1)}")
            envs, _ = _lease(name, 4, f"trainer-{i}", wait_s=120)
            took = time.perf_counter() - t0
        else:
            envs, took = _lease(name, 4, f"trainer-{i}")
        latencies.append(took)
        trainers.append(envs)
    for t in trainers:
        t.close()
    print(f"\nFIGURE fixed-size pool lease latency (3 trainers in turn, scaled by hand "
          f"on demand): {_ms(latencies)}")
    assert _epool(kube, namespace, name)["spec"]["replicas"] == 12
    assert "autoscaling" not in _epool(kube, namespace, name)["status"]


def test_bounds_hold_against_hand_written_sizes(
    kube_cluster: Any, operator: Operator, namespace: str,
) -> None:
    """No pool server here: without a fresh report the autoscaler only keeps the bounds."""
    kube, name = kube_cluster, "bounded"
    _apply(kube, namespace, _envpool(name, Path("/nonexistent"), replicas=2, autoscaling={
        "minReplicas": 4, "maxReplicas": 8, "bufferPercent": 20}))
    kube.wait_until(lambda: _epool(kube, namespace, name)["spec"]["replicas"] == 4,
                    timeout=30, what="raised to minReplicas")
    kube.wait_until(lambda: _workers(kube, namespace, name) == 1, timeout=30, what="1 worker")
    kube.kubectl("scale", "envpool", name, "-n", namespace, "--replicas=40")
    kube.wait_until(lambda: _epool(kube, namespace, name)["spec"]["replicas"] == 8,
                    timeout=30, what="lowered to maxReplicas")
    kube.wait_until(lambda: _workers(kube, namespace, name) == 2, timeout=30, what="2 workers")
    metrics = operator.metrics()
    assert 'envpool_operator_autoscale_writes_total{direction="up"}' in metrics


def test_an_hpa_resizes_a_pool_through_the_same_scale_subresource(
    kube_cluster: Any, operator: Operator, namespace: str,
) -> None:
    """The example HPA, on the real kube-controller-manager. No custom metrics API here,
    so the HPA acts on its bounds only: a pool below minReplicas is raised to it, and
    the operator follows that write as it follows kubectl scale."""
    kube = kube_cluster
    pool_doc, hpa = yaml.safe_load_all(
        (REPO / "manifests" / "examples" / "hpa" / "cartpole-hpa.yaml").read_text())
    name = pool_doc["metadata"]["name"]
    pool_doc["spec"]["replicas"] = 8  # below the HPA's minReplicas (16)
    _apply(kube, namespace, pool_doc)
    kube.wait_until(lambda: _workers(kube, namespace, name) == 1, timeout=30, what="1 worker")
    _apply(kube, namespace, hpa)
    kube.wait_until(lambda: _epool(kube, namespace, name)["spec"]["replicas"] == 16,
                    timeout=90, what="the HPA's scale write")
    got = kube.kubectl_json("get", "hpa", hpa["metadata"]["name"], "-n", namespace)
    assert got["status"]["desiredReplicas"] == 16
    # the write is honoured like kubectl scale: the ConfigMap and the workers follow
    kube.wait_until(
        lambda: yaml.safe_load(kube.kubectl_json(
            "get", "configmap", names.config_map_name(name), "-n", namespace)["data"][
            names.CONFIG_KEY])["spec"]["replicas"] == 16,
        timeout=30, what="the pool spec in the ConfigMap")
    kube.wait_until(lambda: _workers(kube, namespace, name) == 1, timeout=30,
                    what="16 envs on one 64-env worker")


def _worker_pods(kube: Any, ns: str, name: str) -> set[str]:
    pods = kube.kubectl_json("get", "pods", "-n", ns, "-l",
                             f"envpool.dev/pool={name},app.kubernetes.io/component=worker")
    return {p["metadata"]["name"] for p in pods["items"]
            if not p["metadata"].get("deletionTimestamp")}


def _deleted_by_kuberay(kube: Any, ns: str, name: str) -> set[str]:
    """Worker pods KubeRay says it deleted for RayCluster ``name`` (its events)."""
    events = kube.kubectl_json(
        "get", "events", "-n", ns, "--field-selector",
        f"involvedObject.kind=RayCluster,involvedObject.name={name},reason=DeletedWorkerPod")
    # message: "Deleted pod <namespace>/<pod>"
    return {e["message"].rsplit("/", 1)[-1] for e in events["items"]}


def _report(kube: Any, ns: str, name: str, leased: list[str], free: list[str]) -> None:
    """``status.pool`` as the pool server writes it (kwok's pods run no Ray to report)."""
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    report = {"readyEnvs": 12, "leasedEnvs": 4, "freeEnvs": 8, "desiredEnvs": 12, "restarts": 0,
              "lastError": "", "updatedAt": now, "leasedWorkers": leased, "freeWorkers": free}
    kube.kubectl("patch", "envpool", name, "-n", ns, "--subresource=status", "--type=merge",
                 "-p", json.dumps({"status": {"pool": report}}))


def test_shrinking_the_workers_keeps_the_pods_that_host_leased_envs(
    kube_cluster: Any, operator: Operator, namespace: str,
) -> None:
    """The real KubeRay removes the pods the operator names and no other."""
    kube, name = kube_cluster, "pods"
    _apply(kube, namespace, _envpool(name, Path("/nonexistent"), replicas=12))
    pods = kube.wait_until(lambda: len(p := _worker_pods(kube, namespace, name)) == 3 and p,
                           timeout=90, what="3 worker pods")
    a, b, c = sorted(pods)
    head = kube.wait_until(lambda: _head_pod(kube, namespace, name), timeout=60, what="head pod")
    _report(kube, namespace, name, leased=[a, b], free=[c])
    kube.kubectl("scale", "envpool", name, "-n", namespace, "--replicas=4")  # 1 worker's worth
    # a and b host leased envs: only c goes, by name. workersToDelete is transient
    # (KubeRay empties it once it has deleted those pods), so what is checked is what
    # KubeRay deleted, from its events, and which pods are left.
    rc = kube.wait_until(
        lambda: (r := kube.kubectl_json("get", "raycluster", name, "-n", namespace))[
            "spec"]["workerGroupSpecs"][0]["replicas"] == 2 and r, timeout=30, what="2 workers")
    assert rc["spec"]["workerGroupSpecs"][0].get("scaleStrategy", {}).get(
        "workersToDelete") in ([c], [], None), rc["spec"]["workerGroupSpecs"][0]
    kube.wait_until(lambda: _worker_pods(kube, namespace, name) == {a, b}, timeout=60,
                    what=f"only {c} deleted")
    kube.wait_until(lambda: _deleted_by_kuberay(kube, namespace, name) == {c}, timeout=30,
                    what=f"KubeRay's DeletedWorkerPod events naming {c} only")
    # b's lease ended: the next report frees it and the group shrinks without a spec change
    _report(kube, namespace, name, leased=[a], free=[b])
    kube.wait_until(lambda: _workers(kube, namespace, name) == 1, timeout=30, what="1 worker")
    kube.wait_until(lambda: _worker_pods(kube, namespace, name) == {a}, timeout=60,
                    what=f"{b} deleted, {a} kept")
    kube.wait_until(lambda: _deleted_by_kuberay(kube, namespace, name) == {b, c}, timeout=30,
                    what=f"KubeRay's DeletedWorkerPod events naming {b} and {c} only")
    # and nothing rolled: naming pods is not a spec change for KubeRay's Recreate
    assert _head_pod(kube, namespace, name) == head


def _head_pod(kube: Any, ns: str, name: str) -> str | None:
    """The uid of the pool's one head pod (None while there is not exactly one)."""
    pods = kube.kubectl_json("get", "pods", "-n", ns, "-l",
                             f"envpool.dev/pool={name},app.kubernetes.io/component=head")
    return str(pods["items"][0]["metadata"]["uid"]) if len(pods["items"]) == 1 else None
