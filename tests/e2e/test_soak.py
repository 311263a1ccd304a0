"""The chaos soak: trainers step pools on the real node while faults drawn from a
seeded schedule hit them, and every step is counted.

The operator is installed with ``helm install`` (a pod, as a user runs it); each pool
runs ``remote_env.examples:make_chaos_cartpole`` (CartPole that raises or hangs when
a trigger file appears in its pod) with two worker pods of 8 envs; each trainer is a
Job stepping its leased envs with send/recv and accounting for every step it sent
(journey_kit.STEPPING_TRAINER). Faults (soak_kit.FAULTS) run one after another at the
scheduled times; after each, the soak waits until the pool is whole and every trainer
made progress again, and records how long that took and how many actors the pool
server re-created.

CI runs it for ENVPOOL_SOAK_SECONDS (default 300) with seed 1; ``scripts/soak`` runs it
by hand with other settings and writes the report (JSON, plus the readable form).
"""

from __future__ import annotations

import json
import os
import random
import secrets
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from journey_kit import Journey, example, kill_pool_server, restart_count
from real_node import RealNode
from soak_kit import FAULTS, FaultRecord, as_dict, fault_schedule, progress_points, render, timeline

SECONDS = float(os.environ.get("ENVPOOL_SOAK_SECONDS", "300"))
#: The run's own length, plus set-up (helm install, Ready), the last fault's recovery and
#: the settling after it: beyond pytest's default 600 s per test in CI.
pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(int(SECONDS) + 1500)]

SEED = int(os.environ.get("ENVPOOL_SOAK_SEED", "1"))
POOLS = int(os.environ.get("ENVPOOL_SOAK_POOLS", "1"))
TRAINERS = int(os.environ.get("ENVPOOL_SOAK_TRAINERS", "2"))  # per pool
KINDS = tuple(k for k in os.environ.get("ENVPOOL_SOAK_FAULTS", ",".join(FAULTS)).split(",") if k)
MEAN_GAP_S = float(os.environ.get("ENVPOOL_SOAK_MEAN_GAP_S", "30"))
REPORT = os.environ.get("ENVPOOL_SOAK_REPORT")
ENVS = 16  # per pool: two worker pods of one 8-env actor each
#: The longest a pool may take to be whole again after one fault (a new worker pod
#: on this 2-core machine beside the rest of CI took up to ~90 s).
RECOVERY_S = 300.0
API_PAUSE_S = 12.0
RELEASE = "envpool-soak"


def _pool_doc(ns: str, name: str) -> dict[str, Any]:
    doc = example(ns)
    doc["metadata"]["name"] = name
    doc["spec"]["replicas"] = ENVS
    doc["spec"]["env"] = {"entrypoint": "remote_env.examples:make_chaos_cartpole",
                          "kwargs": {"revision": 0}}
    # restarts are what the soak causes: never let the budget end the pool
    doc["spec"]["faultTolerance"].update(maxRestarts=1_000_000, restartBackoffSeconds=0)
    return doc


class Soak:
    """The pools, their trainers and the faults of one soak (one namespace)."""

    def __init__(self, kube: Any, node: RealNode, ns: str) -> None:
        self.kube, self.ns = kube, ns
        self.pools = [Journey(kube, node, ns, RELEASE, pool=f"soak-{i}")
                      for i in range(POOLS)]
        self.trainers = {j.pool: [f"soak-{i}-t{k}" for k in range(TRAINERS)]
                         for i, j in enumerate(self.pools)}
        self.rng = random.Random(SEED)
        self.records: list[FaultRecord] = []
        self.revision = 0
        self.pool_server_restarts = 0  # the container's count before it was killed

    # -- what the soak reads ------------------------------------------------

    def status(self, j: Journey) -> dict[str, Any] | None:
        """The pool server's /status, None while it does not answer (restarting, or
        the API server paused: kubectl exec goes through it)."""
        try:
            return j.server_status()
        except (pytest.fail.Exception, ValueError, KeyError, RuntimeError, OSError):
            return None

    def whole(self, j: Journey, more_restarts_than: int | None = None) -> dict[str, Any] | None:
        st = self.status(j)
        if st is None or st.get("readyEnvs") != ENVS or not st.get("healthy"):
            return None
        if more_restarts_than is not None and st["restarts"] <= more_restarts_than:
            return None
        return st

    def progress(self) -> dict[str, int]:
        return {t: j.progress(t) for j in self.pools for t in self.trainers[j.pool]}

    def all_progressed(self, since: dict[str, int]) -> bool:
        now = self.progress()
        stopped = [t for t, n in now.items() if n <= since[t]]
        return not stopped

    # -- faults -------------------------------------------------------------

    def _exec(self, j: Journey, pod: str, container: str, code: str) -> str:
        return str(self.kube.kubectl("exec", pod, "-n", self.ns, "-c", container, "--",
                                     "python", "-c", code).stdout)

    def _worker(self, j: Journey) -> str:
        workers = sorted(p["metadata"]["name"] for p in j.pods("worker")
                         if p["status"].get("phase") == "Running")
        assert workers, f"no running worker pod in pool {j.pool}"
        return self.rng.choice(workers)

    def inject(self, j: Journey, kind: str) -> tuple[str, float | None]:
        """Inject one fault; return its target and, for the faults the soak runs to
        the end itself (pause, scale), the seconds that took (else None)."""
        if kind == "worker_pod_deleted":
            pod = self._worker(j)
            self.kube.kubectl("delete", "pod", pod, "-n", self.ns, "--wait=false")
            return pod, None
        if kind == "actor_killed":
            pod = self._worker(j)
            pid = self._exec(j, pod, "ray-worker", (
                "import os, signal\n"
                "for p in filter(str.isdigit, os.listdir('/proc')):\n"
                "    try: cmd = open(f'/proc/{p}/cmdline', 'rb').read()\n"
                "    except OSError: continue\n"
                "    if cmd.startswith(b'ray::SubEnvHost'):\n"
                "        os.kill(int(p), signal.SIGKILL); print(p); break\n")).strip()
            assert pid, f"no env actor process (ray::SubEnvHost) found in {pod}"
            return f"{pod} pid {pid}", None
        if kind in ("env_raised", "env_hung"):
            pod = self._worker(j)
            trigger = "raise" if kind == "env_raised" else "hang"
            self._exec(j, pod, "ray-worker", (
                "import os\nos.makedirs('/tmp/envpool-chaos', exist_ok=True)\n"
                f"open('/tmp/envpool-chaos/{trigger}', 'w').close()\n"))
            return f"{pod} /tmp/envpool-chaos/{trigger}", None
        if kind == "pool_server_killed":
            (head,) = j.pods("head")
            self.pool_server_restarts = restart_count(head, "pool-server")
            kill_pool_server(j, head["metadata"]["name"])
            return head["metadata"]["name"], None
        if kind == "operator_pod_deleted":
            pod = j.operator_pod()["metadata"]["name"]
            self.kube.kubectl("delete", "pod", pod, "-n", self.ns, "--wait=false")
            return pod, None
        if kind == "api_server_paused":
            pid = self.kube.component_pid("kube-apiserver")
            assert pid, "no kube-apiserver pid file"
            t0 = time.monotonic()
            os.kill(pid, signal.SIGSTOP)
            try:
                time.sleep(API_PAUSE_S)
            finally:
                os.kill(pid, signal.SIGCONT)
            self.kube.wait_until(
                lambda: self.kube.kubectl("get", "--raw", "/readyz", check=False,
                                          timeout=10).stdout == "ok",
                timeout=120, what="the API server serving again")
            return f"kube-apiserver pid {pid} for {API_PAUSE_S:.0f} s", time.monotonic() - t0
        if kind == "scaled":
            t0 = time.monotonic()
            self.kube.kubectl("scale", f"epool/{j.pool}", "-n", self.ns, f"--replicas={ENVS + 8}")
            j.wait_ready(timeout=RECOVERY_S, replicas=ENVS + 8)
            self.kube.kubectl("scale", f"epool/{j.pool}", "-n", self.ns, f"--replicas={ENVS}")
            j.wait_ready(timeout=RECOVERY_S, replicas=ENVS)
            return f"epool/{j.pool} {ENVS} -> {ENVS + 8} -> {ENVS}", time.monotonic() - t0
        if kind == "env_rolled":
            self.revision += 1
            patch = {"spec": {"env": {"kwargs": {"revision": self.revision}}}}
            self.kube.kubectl("patch", "epool", j.pool, "-n", self.ns, "--type=merge",
                              "-p", json.dumps(patch))
            return f"epool/{j.pool} env revision {self.revision}", None
        raise AssertionError(f"unknown fault {kind}")

    def trigger_taken(self, j: Journey, target: str) -> bool:
        """Whether an env took the trigger file ``target`` ("<pod> <path>") named."""
        pod, path = target.split(" ", 1)
        try:
            return self._exec(j, pod, "ray-worker",
                              f"import os; print(os.path.exists({path!r}))").strip() == "False"
        except (pytest.fail.Exception, RuntimeError, OSError):
            return False

    def recover(self, j: Journey, kind: str, restarts: int, since: dict[str, int],
                operator_pod: str | None, revision: str | None, target: str) -> None:
        """Wait until the pool is whole after ``kind`` and every trainer stepped again."""
        def recovered() -> bool:
            if kind in ("worker_pod_deleted", "actor_killed", "env_hung"):
                # the actor was replaced (a hang is ended by the step timeout)
                if self.whole(j, more_restarts_than=restarts) is None:
                    return False
            elif kind == "operator_pod_deleted":
                try:
                    op = j.operator_pod(timeout=0)
                except AssertionError:  # the old pod still listed, or the new one not yet
                    return False
                ready = all(c.get("ready") for c in op["status"].get("containerStatuses", []))
                if op["metadata"]["name"] == operator_pod or not ready:
                    return False
            elif kind == "pool_server_killed":
                # restarted, and it re-adopted the actors and the trainers' leases
                heads = j.pods("head")
                st = self.whole(j)
                if (len(heads) != 1 or restart_count(heads[0], "pool-server") <= self.pool_server_restarts
                        or st is None or st["leasedEnvs"] != ENVS):
                    return False
            elif kind == "env_rolled":
                st = self.whole(j)
                if st is None or st.get("revision") in (None, revision):
                    return False
            elif self.whole(j) is None:
                return False
            if kind in ("env_raised", "env_hung") and not self.trigger_taken(j, target):
                return False
            return self.all_progressed(since)

        self.kube.wait_until(recovered, timeout=RECOVERY_S, interval=1,
                             what=f"pool {j.pool} whole and every trainer stepping after {kind}")

    def run_fault(self, t0: float, due_s: float, kind: str) -> None:
        j = self.rng.choice(self.pools)
        before = self.whole(j) or {}
        restarts = int(before.get("restarts", 0))
        operator_pod = j.operator_pod()["metadata"]["name"] if kind == "operator_pod_deleted" else None
        since = self.progress()
        at = time.monotonic() - t0
        target, own = self.inject(j, kind)
        self.recover(j, kind, restarts, since, operator_pod, before.get("revision"), target)
        after = self.whole(j) or {}
        took = time.monotonic() - t0 - at
        self.records.append(FaultRecord(
            kind=kind, due_s=due_s, at_s=round(at, 1), target=target,
            recovered_s=round(own if own is not None and own > took else took, 1),
            restarts=int(after.get("restarts", restarts)) - restarts))
        print(f"[soak] {at:6.1f}s {kind:<22} {target}: whole again after {took:.1f} s", flush=True)


@pytest.fixture(scope="module")
def soak(kube_cluster: Any, real_node: RealNode) -> Iterator[Soak]:
    ns = f"soak-{secrets.token_hex(3)}"
    kube_cluster.kubectl("create", "namespace", ns)
    kube_cluster.kubectl("label", "namespace", ns, "pod-security.kubernetes.io/enforce=restricted")
    kube_cluster.wait_until(
        lambda: kube_cluster.kubectl("get", "sa", "default", "-n", ns, check=False).returncode == 0,
        timeout=30, what="default ServiceAccount")
    repo = Path(__file__).resolve().parents[2]
    kube_cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(repo / "manifests" / "crd"))
    s = Soak(kube_cluster, real_node, ns)
    try:
        yield s
    finally:
        if os.environ.get("ENVPOOL_SOAK_KEEP") == "1":
            print(f"\n[soak] ENVPOOL_SOAK_KEEP=1: namespace {ns} kept")
        else:
            kube_cluster.helm("uninstall", RELEASE, "-n", ns, "--wait", check=False)
            kube_cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)


def test_soak_counts_every_step_through_seeded_faults(soak: Soak) -> None:
    schedule = fault_schedule(SEED, SECONDS, kinds=KINDS, mean_gap_s=MEAN_GAP_S)
    print(f"\n[soak] seed {SEED}, {SECONDS:.0f} s, schedule: "
          + ", ".join(f"{f.due_s:.0f}s {f.kind}" for f in schedule), flush=True)
    first = soak.pools[0]
    first.install_operator()
    for j in soak.pools:
        soak.kube.apply(_pool_doc(soak.ns, j.pool))
    for j in soak.pools:
        j.wait_ready(timeout=420)
    pods_before = {j.pool: {p["metadata"]["uid"] for p in j.pods("head")} for j in soak.pools}
    for j in soak.pools:
        soak.kube.apply([j.stepping_job(t, ENVS // TRAINERS) for t in soak.trainers[j.pool]])
    for j in soak.pools:
        for t in soak.trainers[j.pool]:
            j.wait_stepping(t)

    origin, t0 = time.time(), time.monotonic()
    for fault in schedule:
        now = time.monotonic() - t0
        if now >= SECONDS:
            break
        if fault.due_s > now:
            time.sleep(fault.due_s - now)
        soak.run_fault(t0, fault.due_s, fault.kind)
    if (left := SECONDS - (time.monotonic() - t0)) > 0:
        time.sleep(left)
    seconds = time.monotonic() - t0

    results = {t: j.stop_stepping(t, timeout=180) for j in soak.pools for t in soak.trainers[j.pool]}
    points = [progress_points(j.logs(t), origin) for j in soak.pools for t in soak.trainers[j.pool]]
    # leaks: the leases handed back, the leased envs rolled to the last revision once
    # free, one worker pod per actor, the head pods never re-created
    leaks: dict[str, Any] = {}
    for j in soak.pools:
        def settled(j: Journey = j) -> dict[str, Any] | None:
            st = soak.whole(j)
            done = st is not None and st["leasedEnvs"] == 0 and st.get("outdatedEnvs", 0) == 0
            return st if done else None

        st = soak.kube.wait_until(settled, timeout=RECOVERY_S, interval=2,
                                  what=f"pool {j.pool} free and fully updated after the soak")

        def live_workers(j: Journey = j) -> list[dict[str, Any]]:
            return [p for p in j.pods("worker") if not p["metadata"].get("deletionTimestamp")]

        # a scale-down's extra worker pod goes a little after its actor: give it time
        deadline = time.monotonic() + 180
        while len(live_workers()) != ENVS // 8 and time.monotonic() < deadline:
            time.sleep(2)
        leaks[f"{j.pool}_extra_worker_pods"] = len(live_workers()) - ENVS // 8
        leaks[f"{j.pool}_extra_slots"] = len(st["slots"]) - ENVS // 8
        leaks[f"{j.pool}_head_recreated"] = int(
            {p["metadata"]["uid"] for p in j.pods("head")} != pods_before[j.pool])

    sent = sum(r["sent"] for r in results.values())
    answered = sum(r["steps"] for r in results.values())
    report = {
        "seed": SEED, "seconds": seconds, "pools": POOLS, "trainers": POOLS * TRAINERS,
        "bucket_s": 10.0,
        "totals": {"sent": sent, "answered": answered, "lost": sent - answered,
                   "errors": sum(r["errors"] for r in results.values()),
                   "untruncated_errors": sum(r["untruncated_errors"] for r in results.values()),
                   "slowest_recv_s": max(r["slowest_recv_s"] for r in results.values()),
                   "steps_per_s": answered / seconds},
        "faults": [as_dict(r) for r in soak.records],
        "trainers_detail": results,
        "timeline": timeline(points, seconds),
        "leaks": leaks,
    }
    text = render(report)
    print("\n" + text, flush=True)
    if REPORT:
        Path(REPORT).write_text(json.dumps(report, indent=1))
        Path(REPORT).with_suffix(".txt").write_text(text + "\n")
    for name, r in results.items():
        assert r["done"] is True, f"trainer {name} ended with an exception: {r}"
        assert r["unanswered"] == 0, f"trainer {name} lost steps: {r}"
        # every error came back as a truncated step with its reason, never silently
        assert r["untruncated_errors"] == 0, f"trainer {name}: errors without truncation: {r}"
    assert report["totals"]["lost"] == 0, text
    assert soak.records, "no fault ran"
    assert all(v == 0 for v in leaks.values()), text
    # the faults that make errors did: the trainers saw them, with a reason each
    if any(r.kind in ("worker_pod_deleted", "actor_killed", "env_raised", "env_hung")
           for r in soak.records):
        assert report["totals"]["errors"] > 0, text
