"""Fixtures for the real-control-plane e2e tests (DESIGN.md, test pyramid 3).

* ``kube_cluster`` (session): a real kube-apiserver / etcd /
  kube-controller-manager / kube-scheduler with kwok fake nodes and the real
  KubeRay operator, brought up by ``tests/cluster/up.sh`` (reused when one is
  already up). If it cannot come up the test FAILS with the script's output;
  it is never skipped. A cluster this fixture started is torn down with
  ``down.sh`` at the end of the session unless ``ENVPOOL_CLUSTER_KEEP=1``;
  a cluster that was already running is left alone.
* ``namespace`` (function): a fresh namespace per test, deleted afterwards.
* ``prometheus`` (session): factory ``prometheus(targets=[...]) -> server``
  starting Debian's ``/usr/bin/prometheus`` on 127.0.0.1 (free port, tmp
  storage, scrape config written for this run). All servers stop at the end.

Environment: ``ENVPOOL_CLUSTER_CACHE`` / ``ENVPOOL_CLUSTER_STATE`` /
``ENVPOOL_CLUSTER_NAME`` as for the shell scripts; ``ENVPOOL_CLUSTER_KEEP=1``
keeps a cluster this session started; ``ENVPOOL_CLUSTER_UP_TIMEOUT`` (seconds,
default 3600: a cold start includes the Go build).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from real_node import RealNode, read_images_env

REPO = Path(__file__).resolve().parents[2]
CLUSTER_DIR = REPO / "tests" / "cluster"
#: What kwokctl runs (tests/cluster/health.sh has the full list, the node's parts too)
KWOK_COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok-controller")
NODE_COMPONENTS = ("containerd", "kubelet", "kube-proxy", "coredns", "apiserver-relay")


def pytest_configure(config: pytest.Config) -> None:
    # Registered in pyproject.toml too; repeating it here is harmless and keeps
    # --strict-markers happy when this directory is run on its own.
    config.addinivalue_line("markers", "e2e: needs the real local control plane (tests/cluster)")
    config.addinivalue_line("markers", "slow: takes more than a few seconds")


# --------------------------------------------------------------------------
# polling helper (never a bare sleep)
# --------------------------------------------------------------------------


def wait_until(
    predicate: Callable[[], Any],
    *,
    timeout: float = 60.0,
    interval: float = 0.5,
    what: str = "condition",
) -> Any:
    """Call ``predicate`` until it returns a truthy value; return that value.

    Fails the test with the last value/exception after ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        try:
            last = predicate()
            if last:
                return last
        except Exception as exc:
            last = exc
        if time.monotonic() >= deadline:
            pytest.fail(f"timed out after {timeout:.0f}s waiting for {what}; last: {last!r}")
        time.sleep(interval)


# --------------------------------------------------------------------------
# cluster
# --------------------------------------------------------------------------


def _versions() -> dict[str, str]:
    out: dict[str, str] = {}
    for line in (CLUSTER_DIR / "versions.env").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if "=" in line:
            key, value = line.split("=", 1)
            out[key.strip()] = value.strip()
    return out


@dataclass
class KubeCluster:
    """Handle on the running local cluster."""

    kubeconfig: Path
    bin_dir: Path  # kube-apiserver, kube-controller-manager, kube-scheduler, kubectl
    kubectl_path: Path
    helm_path: Path
    kwokctl_path: Path
    kuberay_crd_dir: Path
    state_dir: Path
    versions: dict[str, str]
    started_here: bool = False
    up_output: str = ""

    # the polling helper, so tests need not import conftest
    wait_until = staticmethod(wait_until)

    @property
    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["KUBECONFIG"] = str(self.kubeconfig)
        return env

    def kubectl(
        self,
        *args: str,
        check: bool = True,
        input: str | None = None,
        timeout: float = 120,
    ) -> subprocess.CompletedProcess[str]:
        """Run kubectl against this cluster; on failure (check=True) fail the test."""
        cmd = [str(self.kubectl_path), "--kubeconfig", str(self.kubeconfig), *args]
        proc = subprocess.run(
            cmd, input=input, capture_output=True, text=True, timeout=timeout, env=self.env
        )
        if check and proc.returncode != 0:
            pytest.fail(
                f"kubectl {' '.join(args)} failed ({proc.returncode}):\n"
                f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
            )
        return proc

    def kubectl_json(self, *args: str, check: bool = True) -> Any:
        """``kubectl ... -o json`` parsed; None if it failed and check=False."""
        proc = self.kubectl(*args, "-o", "json", check=check)
        if proc.returncode != 0:
            return None
        return json.loads(proc.stdout)

    def apply(self, manifest: dict | list, *, server_side: bool = False) -> subprocess.CompletedProcess[str]:
        """Apply a manifest dict (or list of dicts) given as JSON on stdin."""
        docs = manifest if isinstance(manifest, list) else [manifest]
        body = json.dumps({"apiVersion": "v1", "kind": "List", "items": docs})
        args = ["apply", "-f", "-"] + (["--server-side"] if server_side else [])
        return self.kubectl(*args, input=body)

    def helm(self, *args: str, check: bool = True, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        cmd = [str(self.helm_path), "--kubeconfig", str(self.kubeconfig), *args]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=self.env)
        if check and proc.returncode != 0:
            pytest.fail(f"helm {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
        return proc

    def health(self) -> tuple[bool, str]:
        """Whether every component is alive and answering, with one line per component."""
        return cluster_health()

    def heal(self) -> str:
        """The fixtures' health step (see :func:`heal_cluster`): returns what was mended."""
        return heal_cluster()

    def component_pid(self, component: str) -> int | None:
        """The pid health.sh checks for ``component`` (None without a pid file)."""
        name = os.environ.get("ENVPOOL_CLUSTER_NAME", "envpool")
        if component == "ray-operator":
            path = self.state_dir / "ray-operator.pid"
        elif component in KWOK_COMPONENTS:
            path = self.state_dir / "kwok" / "clusters" / name / "pids" / f"{component}.pid"
        else:
            path = self.state_dir / "node" / f"{component}.pid"
        return int(path.read_text().strip()) if path.exists() else None

    @property
    def operator_metrics_url(self) -> str | None:
        """http URL of the KubeRay operator's /metrics (from up.sh's ports file)."""
        ports = self.state_dir / "ray-operator.ports"
        if not ports.exists():
            return None
        for line in ports.read_text().splitlines():
            if line.startswith("metrics="):
                return f"http://127.0.0.1:{line.split('=', 1)[1].strip()}/metrics"
        return None


def _cluster_paths() -> dict[str, Path]:
    v = _versions()
    cache = Path(os.environ.get("ENVPOOL_CLUSTER_CACHE", Path.home() / ".cache" / "envpool-cluster"))
    state = Path(os.environ.get("ENVPOOL_CLUSTER_STATE", cache / "state"))
    return {
        "cache": cache,
        "state": state,
        "kube_bin": cache / f"kubernetes-{v['KUBE_VERSION']}" / "bin",
        "helm": cache / f"helm-{v['HELM_VERSION']}" / "bin" / "helm",
        "kwokctl": cache / f"kwok-{v['KWOK_VERSION']}" / "bin" / "kwokctl",
        "crds": cache / f"kuberay-{v['KUBERAY_VERSION']}" / "crds",
    }


def _run_up(timeout: float) -> tuple[subprocess.CompletedProcess[str], str]:
    """Run up.sh (start, mend or reuse the cluster); fail the test with its output if it fails."""
    try:
        proc = subprocess.run(
            ["bash", str(CLUSTER_DIR / "up.sh")],
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired as exc:
        out = (exc.stdout or b"").decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        err = (exc.stderr or b"").decode() if isinstance(exc.stderr, bytes) else (exc.stderr or "")
        pytest.fail(f"tests/cluster/up.sh timed out after {timeout:.0f}s\n{out}\n{err}", pytrace=False)
    output = f"{proc.stderr}\n{proc.stdout}"
    if proc.returncode != 0:
        pytest.fail(
            f"tests/cluster/up.sh failed with exit code {proc.returncode}; the e2e control plane "
            f"could not come up:\n{output}",
            pytrace=False,
        )
    return proc, output


def cluster_health() -> tuple[bool, str]:
    """``health.sh status``: whether every component of the test cluster is alive and
    answering, and one line per component (``<name> ok|down|unhealthy <detail>``)."""
    try:
        proc = subprocess.run(
            ["bash", str(CLUSTER_DIR / "health.sh"), "status"],
            capture_output=True, text=True, timeout=120,
        )
    except subprocess.TimeoutExpired:
        return False, "tests/cluster/health.sh status did not answer within 120 s"
    return proc.returncode == 0, (proc.stdout + proc.stderr).strip()


@pytest.fixture(scope="session")
def kube_cluster() -> Iterator[KubeCluster]:
    timeout = float(os.environ.get("ENVPOOL_CLUSTER_UP_TIMEOUT", "3600"))
    t0 = time.monotonic()
    proc, output = _run_up(timeout)
    m = re.search(r"^export KUBECONFIG=(.+)$", proc.stdout, re.M)
    if not m:
        pytest.fail(f"tests/cluster/up.sh printed no 'export KUBECONFIG=' line:\n{output}", pytrace=False)
    paths = _cluster_paths()
    cluster = KubeCluster(
        kubeconfig=Path(m.group(1).strip()),
        bin_dir=paths["kube_bin"],
        kubectl_path=paths["kube_bin"] / "kubectl",
        helm_path=paths["helm"],
        kwokctl_path=paths["kwokctl"],
        kuberay_crd_dir=paths["crds"],
        state_dir=paths["state"],
        versions=_versions(),
        started_here="reusing" not in proc.stderr,
        up_output=output,
    )
    print(f"\n[kube_cluster] up.sh took {time.monotonic() - t0:.1f}s "
          f"({'started' if cluster.started_here else 'reused'}); KUBECONFIG={cluster.kubeconfig}")
    yield cluster
    if cluster.started_here and os.environ.get("ENVPOOL_CLUSTER_KEEP") != "1":
        down = subprocess.run(
            ["bash", str(CLUSTER_DIR / "down.sh")], capture_output=True, text=True, timeout=300
        )
        if down.returncode != 0:
            warnings.warn(f"tests/cluster/down.sh failed ({down.returncode}):\n{down.stderr}\n{down.stdout}", stacklevel=2)


def heal_cluster() -> str:
    """The fixtures' health step: if any component of the cluster is down or not
    answering, run up.sh, which restarts what is missing (cheap when whole: one
    ``health.sh status``). Returns what was mended ("" when nothing was) and fails
    the test if the cluster is still not whole afterwards."""
    whole, before = cluster_health()
    if whole:
        return ""
    _run_up(float(os.environ.get("ENVPOOL_CLUSTER_UP_TIMEOUT", "3600")))
    whole, after = cluster_health()
    if not whole:
        pytest.fail(f"the test cluster is not whole after up.sh:\n{after}", pytrace=False)
    mended = "\n".join(line for line in before.splitlines() if " ok " not in f"{line} ")
    print(f"\n[kube_cluster] mended the test cluster; was:\n{mended}")
    return mended


@pytest.fixture(scope="module", autouse=True)
def cluster_whole(request: pytest.FixtureRequest) -> None:
    """Before each e2e module that uses the cluster, make sure it is whole: a
    component that died during an earlier module (a lost leader lease, an OOM
    kill) is restarted here instead of failing every test after it."""
    module_items = [i for i in request.session.items if i.module is request.module]  # type: ignore[attr-defined]
    if any("kube_cluster" in i.fixturenames for i in module_items):  # type: ignore[attr-defined]
        request.getfixturevalue("kube_cluster")
        heal_cluster()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """When an e2e test fails, say which components of the test cluster were down
    at that moment, so a harness failure never reads as a product failure."""
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    if report.failed and "kube_cluster" in getattr(item, "fixturenames", ()):
        whole, status = cluster_health()
        head = ("every component was up: not a harness failure" if whole else
                "SOME COMPONENTS WERE DOWN: this failure may be the test harness's, not the product's")
        report.sections.append((f"test cluster at failure ({call.when})", f"{head}\n{status}"))


@pytest.fixture(scope="session")
def real_node(kube_cluster: KubeCluster) -> RealNode:
    """The cluster's real node (kubelet + containerd + runc), Ready, with the project image.

    Fails (never skips) when up.sh brought up no real node or it is not Ready.
    """
    name = os.environ.get("ENVPOOL_NODE_NAME", "envpool-real-0")
    node = kube_cluster.kubectl_json("get", "node", name, check=False)
    if node is None:
        pytest.fail(
            f"the real node {name} is not registered (tests/cluster/node.sh; "
            f"ENVPOOL_CLUSTER_REAL_NODE=0 turns it off):\n{kube_cluster.up_output[-3000:]}",
            pytrace=False,
        )
    ready = {c["type"]: c["status"] for c in node["status"].get("conditions", [])}.get("Ready")
    if ready != "True":
        pytest.fail(f"the real node {name} is not Ready: {node['status'].get('conditions')}", pytrace=False)
    images = read_images_env(kube_cluster.state_dir)
    if "ENVPOOL_IMAGE" not in images:
        pytest.fail(f"no project image recorded in {kube_cluster.state_dir / 'node' / 'images.env'}", pytrace=False)
    return RealNode(name=name, image=images["ENVPOOL_IMAGE"], state_dir=kube_cluster.state_dir,
                    redis_image=images.get("REDIS_IMAGE", ""),
                    trainer_image=images.get("TRAINER_IMAGE", ""))


def _ns_name(node: pytest.Item) -> str:
    base = re.sub(r"[^a-z0-9-]+", "-", node.name.lower()).strip("-")[:40].strip("-") or "test"
    return f"e2e-{base}-{secrets.token_hex(3)}"


@pytest.fixture
def namespace(kube_cluster: KubeCluster, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace for one test (its default ServiceAccount exists); deleted after."""
    name = _ns_name(request.node)
    kube_cluster.kubectl("create", "namespace", name)
    # pods are rejected until the service-account controller made "default"
    wait_until(
        lambda: kube_cluster.kubectl("get", "serviceaccount", "default", "-n", name, check=False).returncode == 0,
        timeout=30,
        what=f"serviceaccount default in {name}",
    )
    yield name
    kube_cluster.kubectl("delete", "namespace", name, "--wait=false", "--ignore-not-found", check=False)
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        if kube_cluster.kubectl("get", "namespace", name, check=False).returncode != 0:
            return
        time.sleep(0.5)
    warnings.warn(f"namespace {name} still terminating after 90s", stacklevel=2)


# --------------------------------------------------------------------------
# prometheus
# --------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class PrometheusServer:
    url: str
    port: int
    config_path: Path
    storage_dir: Path
    log_path: Path
    process: subprocess.Popen = field(repr=False)

    def api(self, path: str, **params: str) -> Any:
        q = f"?{urllib.parse.urlencode(params)}" if params else ""
        with urllib.request.urlopen(f"{self.url}/api/v1/{path}{q}", timeout=10) as resp:
            body = json.load(resp)
        if body.get("status") != "success":
            raise RuntimeError(f"prometheus API {path}: {body}")
        return body["data"]

    def query(self, expr: str) -> list[dict]:
        """Instant query; returns the result vector."""
        return self.api("query", query=expr)["result"]

    def targets(self) -> list[dict]:
        return self.api("targets")["activeTargets"]

    def reload(self) -> None:
        req = urllib.request.Request(f"{self.url}/-/reload", method="POST")
        urllib.request.urlopen(req, timeout=10).close()

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=5)


def _scrape_config(targets: Sequence[Any], job: str, interval: str, metrics_path: str) -> str:
    """Build prometheus.yml as JSON (a YAML subset). ``targets`` items are
    "host:port" strings, or dicts {job, targets, metrics_path?, scheme?}."""
    plain = [t for t in targets if isinstance(t, str)]
    jobs: list[dict] = []
    if plain:
        jobs.append({"job_name": job, "metrics_path": metrics_path, "static_configs": [{"targets": plain}]})
    for t in targets:
        if isinstance(t, dict):
            entry = {
                "job_name": t["job"],
                "metrics_path": t.get("metrics_path", metrics_path),
                "scheme": t.get("scheme", "http"),
                "static_configs": [{"targets": list(t["targets"]), "labels": t.get("labels", {})}],
            }
            jobs.append(entry)
        elif not isinstance(t, str):
            raise TypeError(f"scrape target must be 'host:port' or dict, not {t!r}")
    cfg = {
        "global": {"scrape_interval": interval, "evaluation_interval": interval, "scrape_timeout": interval},
        "scrape_configs": jobs,
    }
    return json.dumps(cfg, indent=2)


@pytest.fixture(scope="session")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., PrometheusServer]]:
    """Factory: ``prometheus(targets=["127.0.0.1:9100"], job="envpool", scrape_interval="1s")``.

    Starts Debian's prometheus on 127.0.0.1 with a free port, a scrape config
    written for this call and a tmp TSDB dir; waits until it is ready. Every
    server started is stopped at the end of the session.
    """
    binary = shutil.which("prometheus") or "/usr/bin/prometheus"
    servers: list[PrometheusServer] = []

    def start(
        targets: Sequence[Any] = (),
        *,
        job: str = "envpool",
        scrape_interval: str = "1s",
        metrics_path: str = "/metrics",
        timeout: float = 30,
    ) -> PrometheusServer:
        if not os.access(binary, os.X_OK):
            pytest.fail("prometheus not found: install Debian's package (apt-get install -y prometheus)",
                        pytrace=False)
        base = tmp_path_factory.mktemp("prometheus")
        cfg = base / "prometheus.yml"
        cfg.write_text(_scrape_config(targets, job, scrape_interval, metrics_path))
        storage = base / "data"
        storage.mkdir()
        log_path = base / "prometheus.log"
        port = _free_port()
        with open(log_path, "w") as log:
            proc = subprocess.Popen(
                [
                    binary,
                    f"--config.file={cfg}",
                    f"--storage.tsdb.path={storage}",
                    f"--web.listen-address=127.0.0.1:{port}",
                    "--web.enable-lifecycle",
                    "--storage.tsdb.retention.time=1h",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        server = PrometheusServer(f"http://127.0.0.1:{port}", port, cfg, storage, log_path, proc)
        servers.append(server)

        def ready() -> bool:
            if proc.poll() is not None:
                pytest.fail(f"prometheus exited with {proc.returncode}:\n{log_path.read_text()}", pytrace=False)
            try:
                with urllib.request.urlopen(f"{server.url}/-/ready", timeout=2) as resp:
                    return resp.status == 200
            except (urllib.error.URLError, OSError):
                return False

        wait_until(ready, timeout=timeout, interval=0.2, what=f"prometheus ready on {server.url}")
        return server

    yield start
    for server in servers:
        server.stop()
