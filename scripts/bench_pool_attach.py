"""Attach to a warm pool vs create the same envs fresh (issue 6's figure).

    .venv/bin/python scripts/bench_pool_attach.py --envs 256 --envs-per-actor 8

Starts a local Ray, a pool server with ``--envs`` CartPole envs, waits until they
are ready, then times (1) ``attach()`` to all of them and the first ``reset``,
and (2) ``RemoteVectorEnv`` creating the same number of envs in new actors and
its first ``reset``. CartPole builds in microseconds, so (2) is mostly Ray actor
start-up: a simulator that boots in seconds widens the gap by that much per actor
wave. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import time

import gymnasium as gym
import ray

from remote_env import RemoteVectorEnv, spec
from remote_env.pool.server import PoolServer

attach = RemoteVectorEnv.from_pool  # the pool's trainer entry point


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--envs", type=int, default=256)
    ap.add_argument("--envs-per-actor", type=int, default=8)
    ap.add_argument("--attaches", type=int, default=5, help="repeat the attach this often")
    ap.add_argument("--num-cpus", type=int, default=2)
    args = ap.parse_args()

    ray.init(address="local", num_cpus=args.num_cpus, include_dashboard=False)
    pool = spec.parse_spec({"env": {"id": "CartPole-v1"}, "replicas": args.envs,
                            "envsPerActor": args.envs_per_actor}, name="bench")
    server = PoolServer(pool, http_port=-1)
    t0 = time.perf_counter()
    server.start_background()
    server.wait_ready(1800)
    pool_start_s = time.perf_counter() - t0

    attach_only_s, attach_s = [], []
    for _ in range(args.attaches):
        t0 = time.perf_counter()
        envs = attach("bench", num_envs=args.envs)
        attach_only_s.append(time.perf_counter() - t0)
        envs.reset(seed=0)
        attach_s.append(time.perf_counter() - t0)
        envs.close()

    t0 = time.perf_counter()
    fresh = RemoteVectorEnv([functools.partial(gym.make, "CartPole-v1")] * args.envs,
                            envs_per_actor=args.envs_per_actor)
    fresh_only_s = time.perf_counter() - t0
    fresh.reset(seed=0)
    fresh_s = time.perf_counter() - t0
    fresh.close()
    server.close(destroy=True)
    ray.shutdown()

    attach_median = statistics.median(attach_s)
    print(json.dumps({
        "envs": args.envs,
        "envs_per_actor": args.envs_per_actor,
        "actors": -(-args.envs // args.envs_per_actor),
        "pool_server_start_s": round(pool_start_s, 2),
        "attach_s": [round(x, 3) for x in attach_only_s],
        "attach_and_reset_s": [round(x, 3) for x in attach_s],
        "attach_and_reset_median_s": round(attach_median, 3),
        "fresh_create_s": round(fresh_only_s, 2),
        "fresh_create_and_reset_s": round(fresh_s, 2),
        "ratio_fresh_over_attach": round(fresh_only_s / statistics.median(attach_only_s), 1),
        "ratio_with_first_reset": round(fresh_s / attach_median, 1),
    }))


if __name__ == "__main__":
    main()
