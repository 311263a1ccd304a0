"""What GCS fault tolerance costs a pool (issue 31): apply -> Ready with it on and off in
one run, the memory of the pool's Redis, and how long deleting each pool takes.

    eval "$(bash tests/cluster/up.sh)"
    ENVPOOL_CLUSTER_KEEP=1 flock /tmp/envpool-cluster.lock env PYTHONPATH=$PWD:$PWD/tests/e2e \\
      .venv/bin/python scripts/bench_head_ft.py --rounds 3

A benchmark, not a test. On the running test cluster with its real node (the images
``tests/cluster/node.sh images`` imported): the operator ``helm install``-ed into a fresh
namespace as the e2e tests do (``journey_kit.Journey``), then ``--rounds`` rounds, each
applying the example pool (16 CartPole envs, 8 per actor, 2 worker pods, placed on the
real node) once with fault tolerance on (the default: the operator's own Redis) and once
off (``headFaultTolerance: {enabled: false}``), in alternating order (on/off, off/on, ...)
so that neither always runs on a warmer node. One pool at a time, under its own name:

* apply -> the RayCluster made, and -> Ready (``phase: Ready`` with the pool server's
  report of every env, as the e2e tests wait for it);
* with fault tolerance: the Redis pod's memory once Ready: its cgroup's usage and peak
  (``memory.usage_in_bytes``, ``memory.max_usage_in_bytes``: page cache included) and
  ``redis-server``'s own resident set (VmRSS, VmHWM from /proc);
* ``kubectl delete epool`` -> every pod of the pool gone and the RayCluster gone (with
  fault tolerance KubeRay's finalizer first runs its Redis-cleanup Job).

Prints a table to stderr and one JSON object to stdout. Removes what it made (EnvPools,
the release, the namespace) at the end.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import secrets
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "e2e"))

from conftest import KubeCluster, _cluster_paths, _versions  # noqa: E402
from journey_kit import Journey, example  # noqa: E402
from real_node import RealNode, read_images_env  # noqa: E402


def cluster() -> KubeCluster:
    paths = _cluster_paths()
    kube_bin = paths["kube_bin"]
    return KubeCluster(kubeconfig=paths["state"] / "kubeconfig", bin_dir=kube_bin,
                       kubectl_path=kube_bin / "kubectl", helm_path=paths["helm"],
                       kwokctl_path=paths["kwokctl"], kuberay_crd_dir=paths["crds"],
                       state_dir=paths["state"], versions=_versions())


def real_node(kube: KubeCluster) -> RealNode:
    images = read_images_env(kube.state_dir)
    if "ENVPOOL_IMAGE" not in images or not images.get("REDIS_IMAGE"):
        sys.exit(f"no project or Redis image recorded in {kube.state_dir / 'node' / 'images.env'}: "
                 "run tests/cluster/up.sh first")
    return RealNode(name=os.environ.get("ENVPOOL_NODE_NAME", "envpool-real-0"),
                    image=images["ENVPOOL_IMAGE"], state_dir=kube.state_dir,
                    redis_image=images["REDIS_IMAGE"])


def redis_memory(kube: KubeCluster, ns: str, pool: str) -> dict[str, float]:
    """MiB: the Redis pod's cgroup usage and peak, redis-server's VmRSS and VmHWM."""
    (pod,) = [p for p in kube.kubectl_json("get", "pods", "-n", ns, "-l",
                                           f"envpool.dev/redis={pool}")["items"]
              if p["status"].get("phase") == "Running"]
    uid = pod["metadata"]["uid"]
    out: dict[str, float] = {}
    for key, name in (("cgroup_usage_mib", "memory.usage_in_bytes"),
                      ("cgroup_peak_mib", "memory.max_usage_in_bytes")):
        (path,) = glob.glob(f"/sys/fs/cgroup/memory/kubepods/**/pod{uid}/{name}", recursive=True)
        out[key] = int(Path(path).read_text()) / 2**20
    procs = glob.glob(f"/sys/fs/cgroup/pids/kubepods/**/pod{uid}/*/cgroup.procs", recursive=True)
    for pid in (int(p) for f in procs for p in Path(f).read_text().split()):
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        if "\nName:\tredis-server\n" in f"\n{status}":
            fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
            out["rss_mib"] = int(fields["VmRSS"].split()[0]) / 1024
            out["peak_rss_mib"] = int(fields["VmHWM"].split()[0]) / 1024
    return out


def one_pool(kube: KubeCluster, node: RealNode, ns: str, name: str, ft: bool) -> dict[str, Any]:
    doc = example(ns, head_fault_tolerance=ft)
    doc["metadata"]["name"] = name
    j = Journey(kube, node, ns, "envpool-operator", pool=name)
    t0 = time.monotonic()
    kube.apply(doc)
    kube.wait_until(lambda: kube.kubectl("get", "raycluster", name, "-n", ns, check=False).returncode == 0,
                    timeout=120, interval=0.2, what=f"RayCluster {name}")
    row: dict[str, Any] = {"pool": name, "fault_tolerance": ft,
                           "apply_to_raycluster_s": round(time.monotonic() - t0, 2)}
    j.wait_ready(timeout=600)
    row["apply_to_ready_s"] = round(time.monotonic() - t0, 2)
    if ft:
        row.update({k: round(v, 2) for k, v in redis_memory(kube, ns, name).items()})
    t1 = time.monotonic()
    kube.kubectl("delete", "epool", name, "-n", ns, "--wait=false")

    def gone() -> bool:
        pods = kube.kubectl_json("get", "pods", "-n", ns, "-l", f"envpool.dev/pool={name}")["items"]
        redis = kube.kubectl_json("get", "pods", "-n", ns, "-l", f"envpool.dev/redis={name}")["items"]
        rc = kube.kubectl("get", "raycluster", name, "-n", ns, check=False).returncode == 0
        return not pods and not redis and not rc

    kube.wait_until(gone, timeout=1800, interval=1, what=f"pool {name} gone")
    row["delete_to_gone_s"] = round(time.monotonic() - t1, 2)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3, help="pools of each kind (default 3)")
    args = ap.parse_args()
    if args.rounds < 1:
        sys.exit(f"--rounds must be at least 1, got {args.rounds}")
    kube = cluster()
    node = real_node(kube)
    ns = f"ftcost-{secrets.token_hex(3)}"
    load_start = os.getloadavg()
    kube.kubectl("create", "namespace", ns)
    kube.kubectl("label", "namespace", ns, "pod-security.kubernetes.io/enforce=restricted")
    kube.wait_until(lambda: kube.kubectl("get", "sa", "default", "-n", ns, check=False).returncode == 0,
                    timeout=30, what="default ServiceAccount")
    kube.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(REPO / "manifests" / "crd"))
    rows: list[dict[str, Any]] = []
    try:
        Journey(kube, node, ns, "envpool-operator").install_operator()
        for r in range(args.rounds):
            for ft in ((True, False) if r % 2 == 0 else (False, True)):
                row = one_pool(kube, node, ns, f"bench-{'on' if ft else 'off'}-{r}", ft)
                row["load_1m"] = round(os.getloadavg()[0], 2)
                rows.append(row)
                print(json.dumps(row), file=sys.stderr, flush=True)
    finally:
        kube.kubectl("delete", "epool", "--all", "-n", ns, "--wait=true", check=False, timeout=1800)
        kube.helm("uninstall", "envpool-operator", "-n", ns, "--wait", check=False)
        kube.kubectl("delete", "namespace", ns, "--wait=false", check=False)
    summary: dict[str, Any] = {"rounds": args.rounds, "load_at_start": load_start,
                               "load_at_end": os.getloadavg(), "pools": rows}
    for ft in (True, False):
        kind = "on" if ft else "off"
        for key in ("apply_to_raycluster_s", "apply_to_ready_s", "delete_to_gone_s"):
            vals = [r[key] for r in rows if r["fault_tolerance"] is ft]
            summary[f"ft_{kind}_{key}_median"] = round(statistics.median(vals), 2)
    for key in ("cgroup_usage_mib", "cgroup_peak_mib", "rss_mib", "peak_rss_mib"):
        vals = [r[key] for r in rows if key in r]
        if vals:
            summary[f"redis_{key}_max"] = round(max(vals), 2)
    print(f"\n{'pool':<14} {'FT':<4} {'->RC s':>7} {'->Ready s':>10} {'delete s':>9} "
          f"{'redis RSS MiB':>14} {'cgroup MiB':>11} {'load':>6}", file=sys.stderr)
    for r in rows:
        print(f"{r['pool']:<14} {'on' if r['fault_tolerance'] else 'off':<4} "
              f"{r['apply_to_raycluster_s']:>7.2f} {r['apply_to_ready_s']:>10.2f} "
              f"{r['delete_to_gone_s']:>9.2f} {r.get('rss_mib', float('nan')):>14.2f} "
              f"{r.get('cgroup_usage_mib', float('nan')):>11.2f} {r['load_1m']:>6.2f}", file=sys.stderr)
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
