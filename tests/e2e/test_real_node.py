"""The real node runs pods for real (tests/cluster/node.sh).

A kubelet built from k8s.io/kubernetes, Debian's containerd and runc, the CNI
bridge, kube-proxy and CoreDNS: the project image starts, Services resolve and
route, logs/exec/port-forward reach the kubelet, deleted pods leave no process,
memory limits kill, and the restricted pod security the chart asks for is what
the kubelet enforces. These fail (never skip) when the node cannot run pods.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from real_node import RealNode

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def _pod(kube_cluster: Any, ns: str, name: str) -> dict[str, Any]:
    return kube_cluster.kubectl_json("get", "pod", name, "-n", ns)


def _phase(kube_cluster: Any, ns: str, name: str) -> str:
    return _pod(kube_cluster, ns, name)["status"].get("phase", "")


def _wait_phase(kube_cluster: Any, ns: str, name: str, phases: set[str], timeout: float = 180) -> dict[str, Any]:
    def done() -> dict[str, Any] | None:
        pod = _pod(kube_cluster, ns, name)
        return pod if pod["status"].get("phase") in phases else None

    return kube_cluster.wait_until(done, timeout=timeout, what=f"pod {ns}/{name} in {sorted(phases)}")


def _wait_ready(kube_cluster: Any, ns: str, name: str, timeout: float = 180) -> dict[str, Any]:
    def ready() -> dict[str, Any] | None:
        pod = _pod(kube_cluster, ns, name)
        conds = {c["type"]: c["status"] for c in pod["status"].get("conditions", [])}
        return pod if conds.get("Ready") == "True" else None

    return kube_cluster.wait_until(ready, timeout=timeout, what=f"pod {ns}/{name} Ready")


def _logs(kube_cluster: Any, ns: str, name: str) -> str:
    return kube_cluster.kubectl("logs", name, "-n", ns).stdout


def _run_json(kube_cluster: Any, real_node: RealNode, ns: str, name: str, script: str) -> dict[str, Any]:
    """Run a Python script in a pod of the project image; its last stdout line, as JSON."""
    kube_cluster.apply(real_node.pod(name, ["python", "-c", script], namespace=ns))
    pod = _wait_phase(kube_cluster, ns, name, {"Succeeded", "Failed"})
    out = _logs(kube_cluster, ns, name)
    assert pod["status"]["phase"] == "Succeeded", out
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return result


def _restricted(kube_cluster: Any, ns: str) -> None:
    kube_cluster.kubectl(
        "label", "namespace", ns, "--overwrite",
        "pod-security.kubernetes.io/enforce=restricted", "pod-security.kubernetes.io/enforce-version=latest",
    )


def test_real_node_beside_the_kwok_nodes(kube_cluster: Any, real_node: RealNode) -> None:
    node = kube_cluster.kubectl_json("get", "node", real_node.name)
    info = node["status"]["nodeInfo"]
    assert info["kubeletVersion"] == kube_cluster.versions["KUBE_VERSION"]
    assert info["containerRuntimeVersion"].startswith("containerd://"), info
    assert node["metadata"]["labels"]["envpool.dev/node"] == "real"
    assert {"key": "envpool.dev/real-node", "value": "true", "effect": "NoSchedule"} in node["spec"]["taints"]
    addresses = {a["type"]: a["address"] for a in node["status"]["addresses"]}
    assert addresses["InternalIP"] == "10.244.0.1"
    # the node's capacity is this machine's, not a kwok fiction
    assert int(node["status"]["capacity"]["cpu"]) == os.cpu_count()
    kwok = kube_cluster.kubectl_json("get", "nodes", "-l", "type=kwok")["items"]
    assert len(kwok) >= 1, "the kwok nodes for scale tests must stay"


def test_project_image_runs_the_cli(kube_cluster: Any, real_node: RealNode, namespace: str) -> None:
    _restricted(kube_cluster, namespace)
    script = 'envpool --help && python -c "import remote_env, envpool_operator; print(\'imports ok\')"'
    t0 = time.monotonic()
    kube_cluster.apply(real_node.pod("cli", ["sh", "-c", script], namespace=namespace))
    pod = _wait_phase(kube_cluster, namespace, "cli", {"Succeeded", "Failed"})
    real_node.record("pod_run_to_completion_envpool_help_s", time.monotonic() - t0)
    out = _logs(kube_cluster, namespace, "cli")
    assert pod["status"]["phase"] == "Succeeded", f"{pod['status']}\n{out}"
    assert pod["spec"]["nodeName"] == real_node.name
    assert "usage: envpool" in out and "imports ok" in out, out


def test_pod_start_time_of_the_project_image(kube_cluster: Any, real_node: RealNode, namespace: str) -> None:
    kube_cluster.apply(real_node.pod("start", ["python", "-c", "import time; time.sleep(600)"], namespace=namespace))
    pod = _wait_phase(kube_cluster, namespace, "start", {"Running"})
    created = pod["metadata"]["creationTimestamp"]
    started = pod["status"]["containerStatuses"][0]["state"]["running"]["startedAt"]
    fmt = "%Y-%m-%dT%H:%M:%SZ"
    secs = time.mktime(time.strptime(started, fmt)) - time.mktime(time.strptime(created, fmt))
    real_node.record("pod_created_to_container_started_s", secs)
    assert 0 <= secs < 120, (created, started)


def test_service_dns_and_clusterip_reach_a_pod(kube_cluster: Any, real_node: RealNode, namespace: str) -> None:
    server = real_node.pod(
        "web", ["python", "-m", "http.server", "8080", "--directory", "/tmp"],
        namespace=namespace, ports=[8080], readiness_port=8080,
    )
    svc = {
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "web", "namespace": namespace},
        "spec": {"selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": 8080}]},
    }
    kube_cluster.apply([server, svc])
    _wait_ready(kube_cluster, namespace, "web")
    cluster_ip = kube_cluster.kubectl_json("get", "svc", "web", "-n", namespace)["spec"]["clusterIP"]
    assert cluster_ip.startswith("10.96."), cluster_ip
    # A new Service reaches CoreDNS and kube-proxy's rules through their watches, a
    # moment after the API server has it: the client retries for up to 60 s (CI once
    # saw "Connection refused" from the ClusterIP right after the Service was made).
    client_py = f"""
import json, socket, time, urllib.request
def retry(fn):
    deadline = time.monotonic() + 60
    while True:
        try:
            return fn()
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)
out = {{}}
out["fqdn"] = retry(lambda: socket.gethostbyname("web.{namespace}.svc.cluster.local"))
out["short"] = retry(lambda: socket.gethostbyname("web"))
out["status"] = retry(lambda: urllib.request.urlopen("http://web/", timeout=10).status)
out["kubernetes"] = retry(lambda: socket.gethostbyname("kubernetes.default"))
retry(lambda: socket.create_connection(("kubernetes.default", 443), timeout=10).close())
out["api"] = "connected"
try:
    socket.gethostbyname("pypi.org")
    out["outside"] = "resolved"
except OSError as exc:
    out["outside"] = type(exc).__name__
print(json.dumps(out))
"""
    got = _run_json(kube_cluster, real_node, namespace, "client", client_py)
    assert got["fqdn"] == cluster_ip and got["short"] == cluster_ip, got
    assert got["status"] == 200, got
    assert got["kubernetes"] == "10.96.0.1", got
    assert got["api"] == "connected", got  # in-cluster clients reach the API server
    # cluster DNS answers for the cluster only: nothing is asked of any server off this machine
    assert got["outside"] != "resolved", got


def test_logs_exec_and_port_forward(kube_cluster: Any, real_node: RealNode, namespace: str) -> None:
    cmd = ["sh", "-c", "echo hello-from-the-real-node; exec python -m http.server 8080 --directory /tmp"]
    kube_cluster.apply(real_node.pod("shell", cmd, namespace=namespace, ports=[8080], readiness_port=8080))
    _wait_ready(kube_cluster, namespace, "shell")
    assert "hello-from-the-real-node" in _logs(kube_cluster, namespace, "shell")
    ex = kube_cluster.kubectl("exec", "shell", "-n", namespace, "--", "python", "-c", "import os; print(os.getuid(), 6*7)")
    assert ex.stdout.split() == ["1000", "42"], ex.stdout
    pf = subprocess.Popen(
        [str(kube_cluster.kubectl_path), "--kubeconfig", str(kube_cluster.kubeconfig),
         "port-forward", "-n", namespace, "pod/shell", ":8080", "--address", "127.0.0.1"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        assert pf.stdout is not None
        line = pf.stdout.readline()
        m = re.search(r"127\.0\.0\.1:(\d+) ->", line)
        assert m, f"port-forward said {line!r}"
        body = urllib.request.urlopen(f"http://127.0.0.1:{m.group(1)}/", timeout=10).read().decode()
        assert "Directory listing" in body
    finally:
        pf.terminate()
        pf.wait(10)


def _host_pids(marker: str) -> list[int]:
    out = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def test_deleted_pod_leaves_no_process(kube_cluster: Any, real_node: RealNode, namespace: str) -> None:
    marker = f"envpool-marker-{namespace}"
    cmd = ["python", "-c", "import sys, time; time.sleep(3600)", marker]
    kube_cluster.apply(real_node.pod("victim", cmd, namespace=namespace))
    _wait_phase(kube_cluster, namespace, "victim", {"Running"})
    pids = kube_cluster.wait_until(lambda: _host_pids(marker), timeout=30, what="the pod's process on the host")
    # it runs as the pod's user, in cgroups the kubelet made
    status = Path(f"/proc/{pids[0]}/status").read_text()
    assert re.search(r"^Uid:\s+1000\s", status, re.M), status
    cgroup = Path(f"/proc/{pids[0]}/cgroup").read_text()
    assert "kubepods" in cgroup, cgroup
    kube_cluster.kubectl("delete", "pod", "victim", "-n", namespace, "--wait=true", "--timeout=60s")
    kube_cluster.wait_until(lambda: not _host_pids(marker), timeout=30, what="the deleted pod's processes gone")


def test_container_over_its_memory_limit_is_oom_killed(kube_cluster: Any, real_node: RealNode, namespace: str) -> None:
    hog = "b = []\nwhile True: b.append(bytearray(16 << 20))"
    res = {"requests": {"cpu": "50m", "memory": "64Mi"}, "limits": {"memory": "64Mi"}}
    kube_cluster.apply(real_node.pod("hog", ["python", "-c", hog], namespace=namespace, resources=res))
    pod = _wait_phase(kube_cluster, namespace, "hog", {"Failed", "Succeeded"}, timeout=120)
    term = pod["status"]["containerStatuses"][0]["state"]["terminated"]
    assert term["reason"] == "OOMKilled", term
    assert term["exitCode"] == 137, term


def test_restricted_pod_security_is_what_the_kubelet_enforces(
    kube_cluster: Any, real_node: RealNode, namespace: str
) -> None:
    _restricted(kube_cluster, namespace)
    probe = """
import json, os
status = dict(l.split(":", 1) for l in open("/proc/self/status").read().splitlines() if ":" in l)
out = {"uid": os.getuid(), "gid": os.getgid(), "CapEff": status["CapEff"].strip(),
       "NoNewPrivs": status["NoNewPrivs"].strip(), "Seccomp": status["Seccomp"].strip()}
for path in ("/home/ray/x", "/tmp/x"):
    try:
        open(path, "w").close(); out[path] = "written"
    except OSError as exc:
        out[path] = exc.strerror
print(json.dumps(out))
"""
    got = _run_json(kube_cluster, real_node, namespace, "probe", probe)
    assert got["uid"] == 1000 and got["gid"] == 100, got
    assert int(got["CapEff"], 16) == 0, got           # capabilities: drop ALL
    assert got["NoNewPrivs"] == "1", got              # allowPrivilegeEscalation: false
    assert got["Seccomp"] == "2", got                 # seccompProfile RuntimeDefault (filter mode)
    assert got["/home/ray/x"] == "Read-only file system", got
    assert got["/tmp/x"] == "written", got            # the emptyDir stays writable

    # runAsNonRoot with uid 0: admitted by nothing but refused by the kubelet itself
    kube_cluster.kubectl("label", "namespace", namespace, "--overwrite", "pod-security.kubernetes.io/enforce=privileged")
    root = real_node.pod("as-root", ["id", "-u"], namespace=namespace)
    root["spec"]["securityContext"] = {"runAsNonRoot": True, "runAsUser": 0}
    kube_cluster.apply(root)

    def refused() -> str | None:
        statuses = _pod(kube_cluster, namespace, "as-root")["status"].get("containerStatuses") or []
        waiting = statuses[0]["state"].get("waiting", {}) if statuses else {}
        return waiting.get("message") if waiting.get("reason") == "CreateContainerConfigError" else None

    message = kube_cluster.wait_until(refused, timeout=120, what="the kubelet to refuse a root container")
    assert "non-root" in message, message
    assert _phase(kube_cluster, namespace, "as-root") == "Pending"


def test_pod_network_stays_on_this_machine(kube_cluster: Any, real_node: RealNode, namespace: str) -> None:
    """A pod has routes to the pod and Service CIDRs only: an outside address is unreachable.

    A UDP connect() only looks the route up; no packet is sent either way.
    """
    probe = """
import json, socket
out = {"routes": open("/proc/net/route").read().split("\\n")[1:]}
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
try:
    s.connect(("203.0.113.1", 9)); out["outside"] = "routable"
except OSError as exc:
    out["outside"] = exc.strerror or type(exc).__name__
s.connect(("10.96.0.10", 53)); out["dns_service"] = "routable"
print(json.dumps(out))
"""
    got = _run_json(kube_cluster, real_node, namespace, "net", probe)
    destinations = {line.split()[1] for line in got["routes"] if line.strip()}
    assert "00000000" not in destinations, f"a default route in the pod: {got['routes']}"
    assert got["outside"] == "Network is unreachable", got
    assert got["dns_service"] == "routable", got


def test_images_are_never_pulled_from_a_registry(kube_cluster: Any, real_node: RealNode, namespace: str) -> None:
    """An image the node lacks fails at once: every registry resolves to a closed loopback port."""
    pod = real_node.pod("pull", ["true"], namespace=namespace)
    container = pod["spec"]["containers"][0]
    container["image"], container["imagePullPolicy"] = "ghcr.io/envpool-dev/envpool:0.1.0", "IfNotPresent"
    kube_cluster.apply(pod)

    def pull_failed() -> str | None:
        statuses = _pod(kube_cluster, namespace, "pull")["status"].get("containerStatuses") or []
        waiting = statuses[0]["state"].get("waiting", {}) if statuses else {}
        if waiting.get("reason") == "ErrImagePull":  # (BackOff between tries says less)
            return str(waiting.get("message", ""))
        return None

    message = kube_cluster.wait_until(pull_failed, timeout=90, interval=0.2, what="the pull to be refused")
    assert "127.0.0.1:9" in message, message  # never a registry's own address
