"""The Helm chart and the plain manifests on the real control plane (issue 8).

* ``helm template`` output (several value sets, monitors included) is accepted
  by the real API server (``kubectl apply --dry-run=server``); the monitors are
  checked against the real prometheus-operator CRDs (from the Go module proxy).
* The plain manifests install for real into a namespace that enforces the
  restricted Pod Security Standard, and the operator pod is admitted.
* ``helm install`` -> ``helm test`` -> RBAC proven with the chart's
  ServiceAccount token: the operator runs out of cluster with only that token
  and reconciles an EnvPool to Ready, and the token is refused Secrets, Pods,
  deletes and namespaces it should not touch -> ``helm upgrade`` to a watched
  namespace list (Role instead of ClusterRole) and the same proof again ->
  ``helm uninstall`` leaves nothing but the CRD, and the token stops working.

Pods are kwok's (fake): the operator Deployment's pod is scheduled and admitted
but runs no container, so the operator itself runs here as a subprocess and the
pool server's report is written with the pool server's own token.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
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
CHART = REPO / "helm" / "envpool-operator"
CRD = REPO / "manifests" / "crd" / "envpool.dev_envpools.yaml"
INSTALL = REPO / "manifests" / "install" / "envpool-operator.yaml"
KUBE_VERSION = "v1.36.0"  # a helm built by `go install` defaults to v1.20
PROMETHEUS_OPERATOR = "github.com/prometheus-operator/prometheus-operator@v0.85.0"
MONITOR_CRDS = ("servicemonitors", "podmonitors", "prometheusrules")
#: Kinds the chart can create, to prove `helm uninstall` removed them all.
CHART_KINDS = ("deployments", "replicasets", "pods", "services", "configmaps", "serviceaccounts",
               "roles", "rolebindings", "jobs")
CHART_CLUSTER_KINDS = ("clusterroles", "clusterrolebindings", "validatingadmissionpolicies",
                       "validatingadmissionpolicybindings")
SA_TOKEN_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


# --------------------------------------------------------------------------- helpers


def _template(kube: Any, release: str, namespace: str, *sets: str) -> str:
    args = ["template", release, str(CHART), "--namespace", namespace, "--kube-version", KUBE_VERSION]
    for s in sets:
        args += ["--set", s]
    return str(kube.helm(*args).stdout)


def _create_namespace(kube: Any, name: str, restricted: bool = False) -> None:
    doc: dict[str, Any] = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
    if restricted:
        doc["metadata"]["labels"] = {"pod-security.kubernetes.io/enforce": "restricted",
                                     "pod-security.kubernetes.io/warn": "restricted"}
    kube.kubectl("apply", "-f", "-", input=json.dumps(doc))


def _delete_namespace(kube: Any, name: str) -> None:
    kube.kubectl("delete", "namespace", name, "--ignore-not-found", "--wait=false", check=False)


@pytest.fixture
def extra_namespace(kube_cluster: Any) -> Iterator[Any]:
    """Factory of extra namespaces (deleted after the test)."""
    made: list[str] = []

    def make(prefix: str, restricted: bool = False) -> str:
        name = f"e2e-{prefix}-{secrets.token_hex(3)}"
        _create_namespace(kube_cluster, name, restricted)
        made.append(name)
        return name

    yield make
    for name in made:
        _delete_namespace(kube_cluster, name)


@pytest.fixture(scope="module")
def envpool_crd(kube_cluster: Any) -> None:
    kube_cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CRD))
    kube_cluster.kubectl("wait", "--for=condition=Established", "crd/envpools.envpool.dev",
                         "--timeout=60s")


@pytest.fixture(scope="module")
def monitor_crds(kube_cluster: Any) -> None:
    """The real ServiceMonitor/PodMonitor/PrometheusRule CRDs, from the module proxy."""
    go = shutil.which("go")
    if go is None:  # tests/cluster/build.sh needs it too
        pytest.fail("go not found in PATH (needed to fetch the prometheus-operator CRDs)", pytrace=False)
    # A module download (cached in GOMODCACHE), the same proxy build.sh uses.
    env = {**os.environ, "GOFLAGS": "-mod=mod", "GO111MODULE": "on"}
    proc = subprocess.run([go, "mod", "download", "-json", PROMETHEUS_OPERATOR],
                          capture_output=True, text=True, env=env, cwd="/", timeout=300)
    assert proc.returncode == 0, f"go mod download {PROMETHEUS_OPERATOR}:\n{proc.stdout}{proc.stderr}"
    crd_dir = Path(json.loads(proc.stdout)["Dir"]) / "example" / "prometheus-operator-crd"
    files = [str(crd_dir / f"monitoring.coreos.com_{c}.yaml") for c in MONITOR_CRDS]
    args = [a for f in files for a in ("-f", f)]
    kube_cluster.kubectl("apply", "--server-side", "--force-conflicts", *args)
    kube_cluster.kubectl("wait", "--for=condition=Established", "--timeout=60s", *args)


def _token_kubeconfig(kube: Any, sa: str, ns: str, path: Path) -> Path:
    """A kubeconfig whose only credential is a fresh token of ServiceAccount ns/sa."""
    token = kube.kubectl("create", "token", sa, "-n", ns, "--duration=1h").stdout.strip()
    admin = json.loads(kube.kubectl("config", "view", "--raw", "--minify", "-o", "json").stdout)
    cluster = admin["clusters"][0]["cluster"]
    doc = {
        "apiVersion": "v1", "kind": "Config", "current-context": "sa",
        "clusters": [{"name": "kwok", "cluster": cluster}],
        "users": [{"name": sa, "user": {"token": token}}],
        "contexts": [{"name": "sa", "context": {"cluster": "kwok", "user": sa}}],
    }
    path.write_text(json.dumps(doc))
    path.chmod(0o600)
    return path


def _as(kube: Any, kubeconfig: Path, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """kubectl with only the given kubeconfig (a ServiceAccount token)."""
    env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
    return subprocess.run([str(kube.kubectl_path), "--kubeconfig", str(kubeconfig), *args],
                          capture_output=True, text=True, input=stdin, env=env, timeout=60)


def _refused(kube: Any, kubeconfig: Path, *args: str, stdin: str | None = None) -> None:
    proc = _as(kube, kubeconfig, *args, stdin=stdin)
    assert proc.returncode != 0 and "forbidden" in proc.stderr.lower(), (
        f"expected Forbidden for kubectl {' '.join(args)}; rc={proc.returncode}\n"
        f"{proc.stdout}{proc.stderr}")


def _allowed(kube: Any, kubeconfig: Path, *args: str, stdin: str | None = None) -> str:
    proc = _as(kube, kubeconfig, *args, stdin=stdin)
    assert proc.returncode == 0, f"kubectl {' '.join(args)} refused:\n{proc.stderr}"
    return proc.stdout


@dataclass
class OutOfClusterOperator:
    """``envpool operator`` as a subprocess with a given kubeconfig (a token)."""

    proc: subprocess.Popen[bytes]
    log_path: Path
    metrics_port: int
    health_port: int

    @classmethod
    def start(cls, kube: Any, kubeconfig: Path, log_path: Path, *scope: str) -> OutOfClusterOperator:
        metrics_port, health_port = _free_port(), _free_port()
        env = {k: v for k, v in os.environ.items()
               if k not in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT")}
        env.update(KUBECONFIG=str(kubeconfig), ENVPOOL_IMAGE="registry.example/envpool:e2e",
                   ENVPOOL_RESYNC_SECONDS="30", PYTHONUNBUFFERED="1")
        log = open(log_path, "ab")  # noqa: SIM115 - owned by the child
        proc = subprocess.Popen(
            [sys.executable, "-m", "envpool_operator", *scope, "--standalone",
             "--metrics-port", str(metrics_port),
             "--liveness", f"http://127.0.0.1:{health_port}/healthz"],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, cwd=REPO)
        op = cls(proc, log_path, metrics_port, health_port)
        kube.wait_until(op.healthy, timeout=60, interval=0.2, what="operator liveness")
        return op

    def healthy(self) -> bool:
        if self.proc.poll() is not None:
            pytest.fail(f"operator exited with {self.proc.returncode}:\n{self.log()[-4000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.health_port}/healthz", timeout=2) as r:
                return bool(r.status == 200)
        except OSError:
            return False

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}/metrics"

    def sample(self, name: str, **labels: str) -> float:
        from prometheus_client.parser import text_string_to_metric_families

        with urllib.request.urlopen(self.metrics_url, timeout=5) as resp:
            text = resp.read().decode()
        total = 0.0
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if s.name == name and labels.items() <= s.labels.items():
                    total += s.value
        return total

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)


#: Small pods: kwok runs nothing, and a shared test cluster has room for them.
SMALL = {"requests": {"cpu": "100m", "memory": "256Mi"}}


def _envpool(name: str, replicas: int = 16) -> str:
    doc = yaml.safe_load((REPO / "manifests" / "examples" / "cartpole.yaml").read_text())
    doc["metadata"]["name"] = name
    doc["spec"]["replicas"] = replicas
    doc["spec"]["ray"] = {"head": {"resources": SMALL}, "worker": {"resources": SMALL}}
    # kwok nodes: no GCS or Redis to keep (see test_operator_e2e._cartpole)
    doc["spec"]["headFaultTolerance"] = {"enabled": False}
    return json.dumps(doc)


def _condition(pool: dict[str, Any], ctype: str) -> dict[str, Any]:
    for c in (pool.get("status") or {}).get("conditions") or ():
        if c["type"] == ctype:
            return dict(c)
    return {}


def _reconcile_to_ready(kube: Any, op: OutOfClusterOperator, ns: str, name: str,
                        tmp: Path) -> None:
    """Create an EnvPool (as the admin) and let the token-only operator make it Ready.

    The pool server's readiness report is written with the token of the
    ServiceAccount the operator created for it, which also proves that Role.
    """
    kube.kubectl("apply", "-n", ns, "-f", "-", input=_envpool(name))

    def cluster_ready() -> bool:
        pool = kube.kubectl_json("get", "envpool", name, "-n", ns)
        if _condition(pool, "SpecValid").get("status") == "False":
            pytest.fail(f"EnvPool {ns}/{name} refused: {_condition(pool, 'SpecValid')}")
        return _condition(pool, "RayClusterReady").get("status") == "True"

    try:
        kube.wait_until(cluster_ready, timeout=180, what=f"EnvPool {ns}/{name} RayClusterReady")
    except pytest.fail.Exception:
        status = kube.kubectl_json("get", "envpool", name, "-n", ns).get("status") or {}
        tail = "\n".join(op.log().splitlines()[-15:])
        pytest.fail(f"EnvPool {ns}/{name} not reconciled by the operator holding only the chart's "
                    f"token; status.message: {status.get('message')!r}\noperator log "
                    f"({op.log_path}), last lines:\n{tail}", pytrace=False)
    pool_server = _token_kubeconfig(kube, f"{name}-pool-server", ns, tmp / f"{ns}-{name}.kubeconfig")
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    report = {"status": {"pool": {"readyEnvs": 16, "desiredEnvs": 16, "restarts": 0, "updatedAt": now}}}
    _allowed(kube, pool_server, "patch", "envpool", name, "-n", ns, "--subresource=status",
             "--type=merge", "-p", json.dumps(report))
    kube.wait_until(
        lambda: (kube.kubectl_json("get", "envpool", name, "-n", ns).get("status") or {})
        .get("phase") == "Ready",
        timeout=60, what=f"EnvPool {ns}/{name} Ready")
    # the pool server's token: its own EnvPool only, status only, nothing else
    _allowed(kube, pool_server, "get", "envpool", name, "-n", ns)
    _refused(kube, pool_server, "patch", "envpool", name, "-n", ns, "--type=merge",
             "-p", '{"spec":{"replicas":32}}')
    _refused(kube, pool_server, "get", "envpools", "-n", ns)
    _refused(kube, pool_server, "get", "secrets", "-n", ns)
    _refused(kube, pool_server, "get", "configmaps", "-n", ns)
    _refused(kube, pool_server, "patch", "envpool", "other", "-n", ns, "--subresource=status",
             "--type=merge", "-p", json.dumps(report))
    _secured_children(kube, ns, name)


def _secured_children(kube: Any, ns: str, name: str) -> None:
    """Ray token auth, the NetworkPolicy, and an API token in the pool-server sidecar only."""
    rc = kube.kubectl_json("get", "raycluster", name, "-n", ns)
    assert rc["spec"]["authOptions"] == {"mode": "token"}
    # KubeRay generated the token Secret the Ray containers and the sidecar read
    kube.wait_until(lambda: kube.kubectl("get", "secret", name, "-n", ns, check=False)
                    .returncode == 0, timeout=60, what=f"KubeRay's token Secret {ns}/{name}")
    secret = kube.kubectl_json("get", "secret", name, "-n", ns)
    assert secret["data"]["auth_token"]
    pol = kube.kubectl_json("get", "networkpolicy", f"{name}-ray", "-n", ns)
    assert pol["spec"]["podSelector"] == {"matchLabels": {"envpool.dev/pool": name}}
    pods = kube.kubectl_json("get", "pods", "-n", ns, "-l", f"envpool.dev/pool={name}")["items"]
    heads = [p for p in pods if p["metadata"]["labels"].get("app.kubernetes.io/component") == "head"]
    assert len(heads) == 1 and len(pods) > 1, [p["metadata"]["name"] for p in pods]
    for pod in pods:
        spec = pod["spec"]
        assert spec["automountServiceAccountToken"] is False
        for c in spec["containers"]:
            mounts = {m["mountPath"] for m in c.get("volumeMounts", ())}
            assert (SA_TOKEN_DIR in mounts) == (c["name"] == "pool-server"), (pod["metadata"]["name"], c["name"])
            if c["name"] in ("ray-head", "ray-worker", "pool-server"):
                env = {e["name"]: e for e in c.get("env", ())}
                assert env["RAY_AUTH_MODE"]["value"] == "token", c["name"]
                assert env["RAY_AUTH_TOKEN"]["valueFrom"]["secretKeyRef"] == {
                    "name": name, "key": "auth_token"}, c["name"]


def _forbidden_by_policy(kube: Any, kubeconfig: Path, *args: str, stdin: str | None = None,
                         needle: str = "") -> None:
    proc = _as(kube, kubeconfig, *args, stdin=stdin)
    assert proc.returncode != 0 and "forbidden" in proc.stderr.lower() and \
        "ValidatingAdmissionPolicy" in proc.stderr and needle in proc.stderr, (
        f"expected the admission policy to refuse kubectl {' '.join(args)} ({needle!r}); "
        f"rc={proc.returncode}\n{proc.stdout}{proc.stderr}")


def _operator_only_writes_its_children(kube: Any, token: Path, ns: str, pool: str) -> None:
    """RBAC lets the operator patch ConfigMaps, ServiceAccounts, Roles, RoleBindings in
    every watched namespace; the admission policy refuses all but its own children.

    Each write is the operator's own way (server-side apply, its field manager, its
    label, an ownerReference to a real EnvPool), the most a stolen token could forge.
    """
    uid = kube.kubectl_json("get", "envpool", pool, "-n", ns)["metadata"]["uid"]
    owner = [{"apiVersion": "envpool.dev/v1alpha1", "kind": "EnvPool", "name": pool, "uid": uid}]
    labels = {"app.kubernetes.io/managed-by": "envpool-operator"}

    def doc(kind: str, name: str, **extra: Any) -> str:
        api = "rbac.authorization.k8s.io/v1" if kind in ("Role", "RoleBinding") else "v1"
        return json.dumps({"apiVersion": api, "kind": kind, "metadata": {
            "name": name, "namespace": ns, "labels": labels, "ownerReferences": owner}, **extra})

    apply = ["apply", "--server-side", "--force-conflicts", "--field-manager=envpool-operator",
             "-f", "-"]
    # what the operator holds (RBAC's escalation check would refuse more before the policy)
    rules = [{"apiGroups": ["envpool.dev"], "resources": ["envpools"], "verbs": ["get"]}]
    ref = {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "victim"}
    subjects = [{"kind": "ServiceAccount", "name": "victim", "namespace": ns}]
    victims = [("configmap", "victim", doc("ConfigMap", "victim", data={"x": "y"})),
               ("serviceaccount", "victim", doc("ServiceAccount", "victim")),
               ("role", "victim --verb=get --resource=envpools.envpool.dev",
                doc("Role", "victim", rules=rules)),
               ("rolebinding", f"victim --role=victim --serviceaccount={ns}:victim",
                doc("RoleBinding", "victim", roleRef=ref, subjects=subjects))]
    for kind, args, forged in victims:
        kube.kubectl("create", kind, *args.split(), "-n", ns)  # not the operator's
        _forbidden_by_policy(kube, token, *apply, stdin=forged,
                             needle="may only change objects it created")
        got = kube.kubectl_json("get", kind, "victim", "-n", ns)
        assert "ownerReferences" not in got["metadata"], got  # untouched
    # a new object not named after its EnvPool (think kube-system/aws-auth on EKS)
    _forbidden_by_policy(kube, token, *apply, stdin=doc("ConfigMap", "aws-auth", data={"x": "y"}),
                         needle="named after it")
    # a Role of the pool server's name that hands on more than EnvPools (RayClusters:
    # pods with any ServiceAccount); RBAC allows it, the operator holds that grant
    _forbidden_by_policy(kube, token, *apply, stdin=doc("Role", f"{pool}-pool-server", rules=[
        {"apiGroups": ["ray.io"], "resources": ["rayclusters"], "verbs": ["create"]}]),
        needle="grant nothing outside envpool.dev")
    # a RoleBinding of the pool server's name to someone else
    _forbidden_by_policy(kube, token, *apply, stdin=doc(
        "RoleBinding", f"{pool}-pool-server",
        roleRef={**ref, "name": f"{pool}-pool-server"}, subjects=subjects),
        needle="its own pool-server ServiceAccount")
    # a RayCluster whose head runs as another ServiceAccount
    rc = kube.kubectl_json("get", "raycluster", pool, "-n", ns)
    rc["spec"]["headGroupSpec"]["template"]["spec"]["serviceAccountName"] = "victim"
    sneaky = {"apiVersion": "ray.io/v1", "kind": "RayCluster", "metadata": {
        "name": pool, "namespace": ns, "labels": labels, "ownerReferences": owner},
        "spec": rc["spec"]}
    _forbidden_by_policy(kube, token, *apply, stdin=json.dumps(sneaky),
                         needle="run the head as <name>-pool-server")
    assert "x" not in (kube.kubectl_json("get", "configmap", "victim", "-n", ns).get("data") or {})


def _operator_refused(kube: Any, token: Path, ns: str) -> None:
    """What the operator's token must never do, whatever the watch mode."""
    _refused(kube, token, "get", "secrets", "-n", ns)
    _refused(kube, token, "get", "secrets", "-A")
    _refused(kube, token, "create", "secret", "generic", "x", "-n", ns, "--from-literal=a=b")
    _refused(kube, token, "get", "pods", "-n", ns)
    _refused(kube, token, "delete", "rayclusters", "--all", "-n", ns)
    _refused(kube, token, "delete", "envpools", "--all", "-n", ns)
    _refused(kube, token, "get", "namespaces")
    _refused(kube, token, "get", "nodes")
    _refused(kube, token, "create", "clusterrolebinding", "x", "--clusterrole=cluster-admin",
             "--serviceaccount=default:default")
    _refused(kube, token, "create", "namespace", "e2e-should-not-exist")


def _chart_objects(kube: Any, release: str) -> list[str]:
    sel = f"app.kubernetes.io/instance={release}"
    out = kube.kubectl("get", ",".join(CHART_KINDS), "-A", "-l", sel, "-o", "name").stdout.split()
    out += kube.kubectl("get", ",".join(CHART_CLUSTER_KINDS), "-l", sel, "-o", "name").stdout.split()
    return list(out)


# --------------------------------------------------------------------------- tests


@pytest.mark.parametrize("sets", [
    (),
    ("operator.watchNamespaces={team-a,team-b}", "image.repository=registry.example/me/envpool",
     "image.tag=1.2.3", "dashboard.namespace=monitoring"),
    ("metrics.serviceMonitor.enabled=true", "metrics.podMonitor.enabled=true",
     "metrics.prometheusRule.enabled=true", "metrics.serviceMonitor.labels.release=kps",
     "service.annotations.example\\.com/team=rl"),
    ("metrics.podMonitor.enabled=true", "operator.watchNamespaces={team-a}", "rbac.create=false",
     "serviceAccount.create=false", "serviceAccount.name=existing", "dashboard.enabled=false",
     "tests.enabled=false"),
], ids=["defaults", "watch-namespaces", "monitors", "bring-your-own-rbac"])
def test_helm_template_is_accepted_by_the_api_server(
        kube_cluster: Any, envpool_crd: None, monitor_crds: None, extra_namespace: Any,
        sets: tuple[str, ...]) -> None:
    kube = kube_cluster
    ns = extra_namespace("tpl", restricted=True)
    # every namespace the rendered objects go to must exist for a server-side dry run
    rendered = _template(kube, "rel", ns, *sets)
    docs = [d for d in yaml.safe_load_all(rendered) if d]
    for target in {d["metadata"].get("namespace") for d in docs} - {None, ns}:
        _create_namespace(kube, target)
    try:
        proc = kube.kubectl("apply", "--dry-run=server", "--server-side", "-f", "-", input=rendered)
        applied = [line for line in proc.stdout.splitlines() if "serverside-applied" in line]
        assert len(applied) == len(docs), proc.stdout
        assert "Warning" not in proc.stderr, proc.stderr  # e.g. pod security, deprecated APIs
        # a broken value is refused by the API server, not silently dropped
        bad = rendered.replace("runAsNonRoot: true", "runAsNonRoot: maybe", 1)
        proc = kube.kubectl("apply", "--dry-run=server", "-f", "-", input=bad, check=False)
        assert proc.returncode != 0, "the API server accepted runAsNonRoot: maybe"
    finally:
        for target in {d["metadata"].get("namespace") for d in docs} - {None, ns}:
            _delete_namespace(kube, target)


def test_plain_manifests_install_under_restricted_pod_security(
        kube_cluster: Any, envpool_crd: None) -> None:
    """``kubectl apply --server-side -f manifests/crd/ -f manifests/install/`` for real."""
    kube = kube_cluster
    docs = [d for d in yaml.safe_load_all(INSTALL.read_text()) if d]
    ns = docs[0]["metadata"]["name"]
    if kube.kubectl("get", "namespace", ns, check=False).returncode == 0:
        pytest.fail(f"namespace {ns} exists already: a previous run did not clean up", pytrace=False)
    try:
        kube.kubectl("apply", "--server-side", "-f", str(CRD), "-f", str(INSTALL))
        assert docs[0]["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
        # the ReplicaSet's pod passes the restricted admission check and is scheduled
        (dep,) = [d for d in docs if d["kind"] == "Deployment"]
        kube.kubectl("rollout", "status", f"deployment/{dep['metadata']['name']}", "-n", ns,
                     "--timeout=90s")
        pods = kube.kubectl_json("get", "pods", "-n", ns)["items"]
        assert len(pods) == 1 and pods[0]["spec"]["nodeName"].startswith("kwok-node-"), pods
        assert pods[0]["spec"]["containers"][0]["securityContext"]["readOnlyRootFilesystem"] is True
        cm = kube.kubectl_json("get", "configmap", "-n", ns, "-l", "grafana_dashboard=1")["items"]
        assert len(cm) == 1 and json.loads(cm[0]["data"]["envpool.json"])["uid"] == "envpool-overview"
    finally:
        kube.kubectl("delete", "-f", str(INSTALL), "--wait=false", "--ignore-not-found", check=False)
    kube.wait_until(lambda: kube.kubectl("get", "namespace", ns, check=False).returncode != 0,
                    timeout=120, what=f"namespace {ns} deleted")
    assert not kube.kubectl("get", "clusterrole,clusterrolebinding", "-o", "name",
                            "-l", "app.kubernetes.io/instance=envpool-operator").stdout.strip()


def _lines_about(log: str, namespace: str) -> list[str]:
    """The operator log's lines that name ``namespace``."""
    return [line for line in log.splitlines() if namespace in line]


def test_helm_install_test_rbac_upgrade_uninstall(
        kube_cluster: Any, envpool_crd: None, extra_namespace: Any, tmp_path: Path) -> None:
    kube = kube_cluster
    release = f"ep-{secrets.token_hex(3)}"
    system = extra_namespace("helm", restricted=True)
    team_a = extra_namespace("team-a")
    team_b = extra_namespace("team-b")
    sa = f"{release}-envpool-operator"
    common = ["-n", system]
    installed = False
    op: OutOfClusterOperator | None = None
    try:
        # ---- install: the operator pod is admitted under restricted PSS and becomes Available
        t0 = time.monotonic()
        installed = True  # a failed install leaves a release behind too
        kube.helm("install", release, str(CHART), *common, "--wait", "--timeout", "120s",
                  "--set", "image.repository=registry.example/envpool", "--set", "image.tag=e2e")
        install_s = time.monotonic() - t0
        notes = kube.helm("get", "notes", release, *common).stdout
        assert f"kubectl -n {system} rollout status deployment/{sa}" in notes
        assert "It watches EnvPools in all namespaces." in notes
        dep = kube.kubectl_json("get", "deployment", sa, "-n", system)
        (container,) = dep["spec"]["template"]["spec"]["containers"]
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert container["image"] == env["ENVPOOL_IMAGE"] == "registry.example/envpool:e2e"
        assert dep["status"]["availableReplicas"] == 1
        crd = kube.kubectl_json("get", "crd", "envpools.envpool.dev")
        assert any(c["type"] == "Established" and c["status"] == "True"
                   for c in crd["status"]["conditions"])

        # ---- helm test: the hook Job completes (kwok completes Job pods)
        proc = kube.helm("test", release, *common, "--timeout", "120s")
        assert "Phase:          Succeeded" in proc.stdout, proc.stdout

        # ---- RBAC, all-namespaces mode: the operator with only the chart's token
        token = _token_kubeconfig(kube, sa, system, tmp_path / "operator.kubeconfig")
        op = OutOfClusterOperator.start(kube, token, tmp_path / "operator-all.log", "--all-namespaces")
        t0 = time.monotonic()
        _reconcile_to_ready(kube, op, team_a, "pool-a", tmp_path)
        ready_s = time.monotonic() - t0
        assert op.sample("envpool_operator_reconciles_total", result="success") >= 1
        # All namespaces: it also sees EnvPools other tests left in namespaces being
        # deleted (their writes there are refused as "being terminated"); this test's
        # own namespace must have had no retry and no refusal.
        ours = _lines_about(op.log(), team_a)
        assert not [x for x in ours if "retrying" in x or "Forbidden" in x or " 403" in x], \
            "\n".join(ours[-40:])
        _operator_refused(kube, token, team_a)
        _operator_only_writes_its_children(kube, token, team_a, "pool-a")
        # spec.autoscaling: the chart's grants let it resize through the scale subresource
        auto = json.loads(_envpool("pool-auto"))
        auto["spec"]["autoscaling"] = {"minReplicas": 24, "maxReplicas": 32, "bufferEnvs": 8}
        kube.kubectl("apply", "-n", team_a, "-f", "-", input=json.dumps(auto))
        kube.wait_until(lambda: kube.kubectl_json("get", "envpool", "pool-auto", "-n", team_a)[
            "spec"]["replicas"] == 24, timeout=60, what="the token-only operator's scale write")
        assert op.sample("envpool_operator_autoscale_writes_total", direction="up") >= 1
        _forbidden_by_policy(kube, token, "create", "configmap", "aws-auth", "-n", "kube-system",
                             needle="carry app.kubernetes.io/managed-by=envpool-operator")
        # the helm test's own script passes against this operator's /metrics
        job = next(d for d in yaml.safe_load_all(_template(kube, release, system)) if d and d["kind"] == "Job")
        (tc,) = job["spec"]["template"]["spec"]["containers"]
        script = subprocess.run([sys.executable, *tc["command"][1:]], capture_output=True, text=True,
                                env={**os.environ, "METRICS_URL": op.metrics_url}, timeout=30)
        assert script.returncode == 0 and script.stdout.startswith("ok: "), script.stdout + script.stderr
        op.stop()
        op = None

        # ---- upgrade: only team-a, new image tag
        kube.helm("upgrade", release, str(CHART), *common, "--reuse-values", "--wait", "--timeout", "120s",
                  "--set", f"operator.watchNamespaces={{{team_a}}}", "--set", "image.tag=e2e-2")
        dep = kube.kubectl_json("get", "deployment", sa, "-n", system)
        (container,) = dep["spec"]["template"]["spec"]["containers"]
        assert container["image"] == "registry.example/envpool:e2e-2"
        assert f"--namespace={team_a}" in container["args"] and "--all-namespaces" not in container["args"]
        assert kube.kubectl_json("get", "role", sa, "-n", team_a)["rules"]
        rules = kube.kubectl_json("get", "clusterrole", sa)["rules"]
        assert [r["resources"] for r in rules] == [["customresourcedefinitions"]]
        assert kube.helm("history", release, *common, "-o", "json").stdout.count('"revision"') == 2

        # ---- RBAC, namespaced mode: same token, Role in team-a only
        op = OutOfClusterOperator.start(kube, token, tmp_path / "operator-ns.log", "--namespace", team_a)
        t0 = time.monotonic()
        _reconcile_to_ready(kube, op, team_a, "pool-a2", tmp_path)
        ready_ns_s = time.monotonic() - t0
        assert op.sample("envpool_operator_reconciles_total", result="retry") == 0, op.log()[-3000:]
        # exact namespaces: kopf does not try to list namespaces (least privilege refuses
        # it and kopf used to retry for ~1 minute before reconciling)
        assert "Not enough permissions to list namespaces" not in op.log()
        _operator_refused(kube, token, team_a)
        _allowed(kube, token, "get", "envpools", "-n", team_a)
        _refused(kube, token, "get", "envpools", "-n", team_b)
        _refused(kube, token, "get", "envpools", "-A")
        _refused(kube, token, "create", "configmap", "x", "-n", team_b)
        _refused(kube, token, "get", "rayclusters", "-n", team_b)
        _refused(kube, token, "create", "-n", team_b, "-f", "-", stdin=_envpool("sneaky"))
        op.stop()
        op = None

        # ---- uninstall: nothing left but the CRD (and the users' EnvPools)
        kube.helm("uninstall", release, *common, "--wait", "--timeout", "120s")
        installed = False
        kube.wait_until(lambda: not _chart_objects(kube, release), timeout=90,
                        what=f"no objects of release {release}")
        assert kube.kubectl("get", "crd", "envpools.envpool.dev", check=False).returncode == 0
        assert release not in kube.helm("list", "-A", "-q").stdout.split()
        assert kube.kubectl("get", "envpool", "pool-a", "-n", team_a, check=False).returncode == 0
        # the ServiceAccount is gone, so its token is dead
        kube.wait_until(lambda: "Unauthorized" in _as(kube, token, "get", "envpools", "-n", team_a).stderr,
                        timeout=60, what="the deleted ServiceAccount's token to be rejected")
        print(f"\n[helm] install --wait {install_s:.1f}s; EnvPool Ready with the chart's token: "
              f"all namespaces {ready_s:.1f}s, one namespace {ready_ns_s:.1f}s")
    finally:
        if op is not None:
            op.stop()
        if installed:
            kube.helm("uninstall", release, *common, "--wait", "--timeout", "120s", check=False)
