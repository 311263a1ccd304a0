"""A trainer without Ray (HTTP lease, TCP steps) against the on-node trainer (Ray lease,
shared memory) and Ray calls, on one warm pool, in the same run (issue 30's figure).

    PYTHONPATH=. .venv/bin/python scripts/bench_http_lease.py --envs 64 --envs-per-actor 16

Starts a local Ray and a pool server of ``--envs`` CartPole envs with its lease API,
then, rep by rep and in turn, leases all of them four ways and steps them for
``--seconds``: ``shm`` (``from_pool(name)``: the actors are on this node, so the Unix
socket and shared memory), ``http_tcp`` (``from_pool(name, url=...)``: HTTP lease,
the actors' TCP channels, no Ray calls), ``relay`` (the same, ``relay=True``: every
channel through the pool server's relay on the lease API's port, as a trainer
outside the cluster behind one port-forward) and ``ray`` (``transport="ray"``).
Prints each rep, then one JSON line with the medians and the ratios.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

import numpy as np
import ray

from remote_env import RemoteVectorEnv, spec
from remote_env.pool.server import PoolServer

TOKEN = "bench-token"


def run(make: Any, n: int, seconds: float, actions: np.ndarray) -> tuple[float, float]:
    """(steps/s, attach seconds) of one trainer stepping every env for ``seconds``."""
    t0 = time.perf_counter()
    envs = make()
    attach_s = time.perf_counter() - t0
    try:
        envs.reset(seed=0)
        for a in actions[:20]:  # warm up: channels opened, caches hot
            envs.step(a)
        steps = 0
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            envs.step(actions[steps % len(actions)])
            steps += 1
        elapsed = time.perf_counter() - t0
    finally:
        envs.close()
    return steps * n / elapsed, attach_s


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--envs", type=int, default=64)
    ap.add_argument("--envs-per-actor", type=int, default=16)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--num-cpus", type=int, default=2)
    args = ap.parse_args()

    ray.init(address="local", num_cpus=args.num_cpus, include_dashboard=False)
    pool = spec.parse_spec({"env": {"id": "CartPole-v1"}, "replicas": args.envs,
                            "envsPerActor": args.envs_per_actor}, name="bench")
    server = PoolServer(pool, http_port=-1, lease_host="127.0.0.1", lease_port=0,
                        lease_token=TOKEN.encode())
    server.start_background()
    server.wait_ready(600)
    n = args.envs
    actions = np.random.default_rng(0).integers(0, 2, size=(256, n))
    ways = {
        "shm": lambda: RemoteVectorEnv.from_pool("bench", num_envs=n, wait_s=60),
        "http_tcp": lambda: RemoteVectorEnv.from_pool("bench", url=server.lease_url,
                                                      token=TOKEN, num_envs=n, wait_s=60,
                                                      relay=False),
        "relay": lambda: RemoteVectorEnv.from_pool("bench", url=server.lease_url,
                                                   token=TOKEN, num_envs=n, wait_s=60,
                                                   relay=True),
        "ray": lambda: RemoteVectorEnv.from_pool("bench", num_envs=n, transport="ray",
                                                 wait_s=60),
    }
    sps: dict[str, list[float]] = {w: [] for w in ways}
    attach: dict[str, list[float]] = {w: [] for w in ways}
    try:
        for rep in range(args.reps):
            for way, make in ways.items():
                while server.status()["freeEnvs"] != n:  # the last lease is back
                    time.sleep(0.05)
                s, a = run(make, n, args.seconds, actions)
                sps[way].append(s)
                attach[way].append(a)
                print(f"rep {rep + 1}/{args.reps} {way:8s} {s:10,.0f} steps/s  "
                      f"attach {a * 1000:7.1f} ms", flush=True)
    finally:
        server.close(destroy=True)
        ray.shutdown()
    med = {w: statistics.median(v) for w, v in sps.items()}
    print(json.dumps({
        "envs": n, "envs_per_actor": args.envs_per_actor, "seconds": args.seconds,
        "reps": sps, "median_steps_per_s": med,
        "attach_ms_median": {w: statistics.median(v) * 1000 for w, v in attach.items()},
        "http_tcp_over_shm": med["http_tcp"] / med["shm"],
        "http_tcp_over_ray": med["http_tcp"] / med["ray"],
        "relay_over_http_tcp": med["relay"] / med["http_tcp"],
        "relay_over_shm": med["relay"] / med["shm"],
        "relay_over_ray": med["relay"] / med["ray"],
    }))


if __name__ == "__main__":
    main()
