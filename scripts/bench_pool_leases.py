"""Lease bursts on one pool (issue 34): grant latency p50/p99 and a check of no double grant.

    PYTHONPATH=$PWD .venv/bin/python scripts/bench_pool_leases.py [--mode registry|attach|both]

A benchmark, not a test; local Ray (embedded), nothing on Kubernetes.

``registry``: the pool's registry actor made as the pool server makes it (named,
detached, ``max_concurrency=REGISTRY_CONCURRENCY``, leases kept in Ray's GCS
key-value store), with a published layout of ``--slots`` one-env slots whose actors
do not exist (so the fence step of a grant looks each actor up and finds none: no
actor RPC). Then:

* a burst: ``--trainers`` threads ask for one env each at the same moment
  (``acquire``), and each grant's latency (call to answer) is recorded;
* ``--cycles`` lease/release cycles from ``--trainers`` threads at once.

``attach``: a real pool server with ``--actors`` one-env actors (CartPole), and as
many trainers calling :func:`remote_env.pool.attach.attach` at once, for
``--attach-rounds`` rounds (attach, reset, close): the whole trainer-side path,
fencing of real actors included.

Double grants are checked from the trainers' side: every granted slot is marked held
until its holder lets it go (before its release call), and a grant of a slot that is
marked held is a double grant. Prints a table to stderr and one JSON object to stdout.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import ray
from remote_env.pool.attach import attach

from remote_env import spec
from remote_env.pool import registry as registry_mod
from remote_env.pool import registry_store
from remote_env.pool.server import PoolServer
from remote_env.pool.slot import SlotInfo


def pct(values: Iterable[float], q: float) -> float:
    """Nearest-rank percentile (q in [0, 1]); nan when empty."""
    ordered = sorted(values)
    if not ordered:
        return math.nan
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


class HeldSlots:
    """Which slots trainers hold right now; a grant of a held slot is a double grant."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: dict[int, str] = {}
        self.grants = 0
        self.double: list[tuple[int, str, str]] = []  # (slot, holder, new grantee)

    def granted(self, slots: Iterable[int], who: str) -> None:
        with self._lock:
            self.grants += 1
            for s in slots:
                if s in self._held:
                    self.double.append((s, self._held[s], who))
                self._held[s] = who

    def letting_go(self, slots: Iterable[int], who: str) -> None:
        with self._lock:
            for s in slots:
                if self._held.get(s) == who:
                    del self._held[s]


def _stats(latencies: list[float]) -> dict[str, Any]:
    return {"n": len(latencies), "p50_ms": round(pct(latencies, 0.5) * 1e3, 2),
            "p99_ms": round(pct(latencies, 0.99) * 1e3, 2),
            "max_ms": round(max(latencies) * 1e3, 2) if latencies else math.nan}


def _threads(n: int, target: Callable[[int], None]) -> list[BaseException]:
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            target(i)
        except BaseException as exc:  # reported, not swallowed
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return errors


def bench_registry(slots: int, trainers: int, cycles: int, ttl_s: float) -> dict[str, Any]:
    ns = f"envpool-leasebench-{uuid.uuid4().hex[:6]}"
    reg = registry_mod.remote_class().options(
        name=registry_mod.REGISTRY_NAME, namespace=ns, lifetime="detached",
        max_concurrency=registry_mod.REGISTRY_CONCURRENCY, num_cpus=0, max_restarts=-1,
    ).remote("leasebench", ray_namespace=ns, store=registry_store.RayKVStore(ns))
    layout = [SlotInfo(slot=i, actor_name=f"host-{i:05d}-g1", actor_id=f"{i:032x}",
                       num_envs=1, state="ready") for i in range(slots)]
    ray.get(reg.server_sync.remote(layout, {"revision": ""}, 0.0))
    out: dict[str, Any] = {"slots": slots, "trainers": trainers}
    try:
        # warm-up: the actor's threads and the first store write
        warm = ray.get(reg.acquire.remote("warm", 1, ttl_s))
        ray.get(reg.release.remote(warm["lease_id"]))

        # 1. the burst: every trainer asks at the same moment
        held = HeldSlots()
        barrier = threading.Barrier(trainers)
        burst: list[float] = []
        leases: dict[int, tuple[str, list[int]]] = {}

        def one(i: int) -> None:
            barrier.wait()
            t0 = time.perf_counter()
            lease = ray.get(reg.acquire.remote(f"t{i}", 1, ttl_s))
            burst.append(time.perf_counter() - t0)
            got = [s.slot for s in lease["slots"]]
            held.granted(got, f"t{i}")
            leases[i] = (lease["lease_id"], got)

        t0 = time.perf_counter()
        errors = _threads(trainers, one)
        out["burst_wall_s"] = round(time.perf_counter() - t0, 3)
        out["burst_errors"] = [repr(e) for e in errors[:3]]
        out["burst_grant"] = _stats(burst)
        for i, (lease_id, got) in leases.items():
            held.letting_go(got, f"t{i}")
            ray.get(reg.release.remote(lease_id))

        # 2. lease/release cycles, all trainers at once
        cycle: list[float] = []
        per = -(-cycles // trainers)
        done = [0]
        lock = threading.Lock()

        def loop(i: int) -> None:
            for _ in range(per):
                with lock:
                    if done[0] >= cycles:
                        return
                    done[0] += 1
                t0 = time.perf_counter()
                lease = ray.get(reg.acquire.remote(f"c{i}", 1, ttl_s))
                cycle.append(time.perf_counter() - t0)
                got = [s.slot for s in lease["slots"]]
                held.granted(got, f"c{i}")
                held.letting_go(got, f"c{i}")
                if not ray.get(reg.release.remote(lease["lease_id"])):
                    raise AssertionError(f"release of {lease['lease_id'][:8]} found no lease")

        t0 = time.perf_counter()
        errors = _threads(trainers, loop)
        wall = time.perf_counter() - t0
        out["cycles"] = len(cycle)
        out["cycles_wall_s"] = round(wall, 3)
        out["cycles_per_s"] = round(len(cycle) / wall, 1)
        out["cycle_errors"] = [repr(e) for e in errors[:3]]
        out["cycle_grant"] = _stats(cycle)
        out["grants_checked"] = held.grants
        out["double_grants"] = len(held.double)
        left = ray.get(reg.layout.remote())["leases"]
        out["leases_left"] = len(left)
    finally:
        ray.kill(reg)
    return out


def bench_attach(actors: int, rounds: int) -> dict[str, Any]:
    pool = spec.parse_spec({"env": {"id": "CartPole-v1"}, "replicas": actors,
                            "envsPerActor": 1}, name="leasebench")
    server = PoolServer(pool, http_port=-1)
    t0 = time.perf_counter()
    server.start_background()
    server.wait_ready(900)
    out: dict[str, Any] = {"actors": actors, "trainers": actors, "rounds": rounds,
                           "pool_start_s": round(time.perf_counter() - t0, 2)}
    held = HeldSlots()
    grant: list[float] = []
    errors: list[str] = []
    try:
        for r in range(rounds):
            barrier = threading.Barrier(actors)
            envs: dict[int, Any] = {}

            def one(i: int, r: int = r, barrier: threading.Barrier = barrier,
                    envs: dict[int, Any] = envs) -> None:
                barrier.wait()
                t0 = time.perf_counter()
                e = attach("leasebench", num_envs=1, wait_s=30, trainer=f"r{r}t{i}")
                grant.append(time.perf_counter() - t0)
                held.granted(e.slots, f"r{r}t{i}")
                envs[i] = e

            errors += [repr(e) for e in _threads(actors, one)]
            for i, e in envs.items():
                e.reset(seed=i)
            for i, e in envs.items():
                held.letting_go(e.slots, f"r{r}t{i}")
                e.close()
    finally:
        server.close(destroy=True)
    out["attach"] = _stats(grant)
    out["errors"] = errors[:3]
    out["grants_checked"] = held.grants
    out["double_grants"] = len(held.double)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mode", choices=("registry", "attach", "both"), default="both")
    ap.add_argument("--slots", type=int, default=100, help="registry mode: one-env slots")
    ap.add_argument("--trainers", type=int, default=100, help="registry mode: trainers at once")
    ap.add_argument("--cycles", type=int, default=1000, help="registry mode: lease/release cycles")
    ap.add_argument("--ttl", type=float, default=60.0, help="lease ttl (s)")
    ap.add_argument("--actors", type=int, default=8,
                    help="attach mode: real one-env actors = trainers attaching at once")
    ap.add_argument("--attach-rounds", type=int, default=5)
    ap.add_argument("--num-cpus", type=int, default=2)
    ap.add_argument("--out", default="/tmp/envpool-lease-bench.json")
    args = ap.parse_args()
    if args.trainers > args.slots:
        ap.error("--trainers must be <= --slots (each takes one slot at once)")
    ray.init(address="local", num_cpus=args.num_cpus, include_dashboard=False,
             log_to_driver=False)
    figures: dict[str, Any] = {"cpus": os.cpu_count(),
                               "loadavg_before": Path("/proc/loadavg").read_text().split()[:3]}
    try:
        if args.mode in ("registry", "both"):
            print(f"registry: {args.trainers} trainers at once on {args.slots} slots, then "
                  f"{args.cycles} cycles", file=sys.stderr, flush=True)
            figures["registry"] = bench_registry(args.slots, args.trainers, args.cycles, args.ttl)
        if args.mode in ("attach", "both"):
            print(f"attach: {args.actors} trainers at once on {args.actors} real actors, "
                  f"{args.attach_rounds} rounds", file=sys.stderr, flush=True)
            figures["attach"] = bench_attach(args.actors, args.attach_rounds)
    finally:
        ray.shutdown()
    figures["loadavg_after"] = Path("/proc/loadavg").read_text().split()[:3]
    for mode in ("registry", "attach"):
        f = figures.get(mode)
        if not f:
            continue
        for key in ("burst_grant", "cycle_grant", "attach"):
            if key in f:
                s = f[key]
                print(f"{mode:<9} {key:<12} n={s['n']:<5} p50 {s['p50_ms']:>8} ms  "
                      f"p99 {s['p99_ms']:>8} ms  max {s['max_ms']:>8} ms", file=sys.stderr)
        print(f"{mode:<9} double grants: {f['double_grants']} of {f['grants_checked']} grants",
              file=sys.stderr)
    out = json.dumps(figures, sort_keys=True)
    Path(args.out).write_text(out + "\n")
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
