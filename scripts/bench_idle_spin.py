"""The CPU a pool's actors burn while its trainer is busy elsewhere (issue 34's figure).

    .venv/bin/python scripts/bench_idle_spin.py --envs 16 --spins 0 500 auto

For each ``spin_us`` (in turn, repeated ``--reps`` times in alternating order so
drift spreads over all), a ``RemoteVectorEnv`` of ``--envs`` CartPole envs on a
local Ray is stepped in two trainer patterns, and its actors' CPU seconds are read
from ``/proc/<pid>/stat``:

* ``bursts``: ``--burst`` back-to-back steps, then the trainer sleeps ``--idle-s``
  (a learner update), ``--bursts`` times; the actors' CPU during the sleeps, per
  actor per second of sleep (a fraction of a core);
* ``paced``: a step every 50 ms (a trainer that thinks between steps) for
  ``--paced-s``; the actors' CPU per actor per second, stepping included.

Prints one JSON line per spin setting with the raw reps and their medians.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from typing import Any

import gymnasium as gym
import numpy as np
import ray

from remote_env import RemoteVectorEnv

_TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")


def _cpu_s(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) * _TICK_S
    return total


def _spin(value: str) -> float | str:
    return value if value == "auto" else float(value)


def one(spin: float | str, args: argparse.Namespace) -> dict[str, float]:
    envs = RemoteVectorEnv([lambda: gym.make("CartPole-v1")] * args.envs, spin_us=spin,
                           batch_wait_ms=0.0)
    try:
        envs.reset(seed=0)
        acts = np.zeros(args.envs, dtype=np.int64)
        pids = envs._ray.get([a.ping.remote() for a in envs.actors])
        actors = len(pids)
        idle_cpu = idle_wall = 0.0
        t0 = time.perf_counter()
        for _ in range(args.bursts):
            for _ in range(args.burst):
                envs.step(acts)
            c, w = _cpu_s(pids), time.perf_counter()
            time.sleep(args.idle_s)
            idle_cpu += _cpu_s(pids) - c
            idle_wall += time.perf_counter() - w
        bursts_wall = time.perf_counter() - t0
        c, w = _cpu_s(pids), time.perf_counter()
        while time.perf_counter() - w < args.paced_s:
            envs.step(acts)
            time.sleep(0.05)
        paced = (_cpu_s(pids) - c) / (time.perf_counter() - w) / actors
        return {"idle_core_per_actor": idle_cpu / idle_wall / actors,
                "paced_core_per_actor": paced, "actors": actors, "bursts_wall_s": bursts_wall}
    finally:
        envs.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--envs", type=int, default=16)
    ap.add_argument("--spins", nargs="+", default=["0", "500", "auto"])
    ap.add_argument("--burst", type=int, default=500, help="back-to-back steps per burst")
    ap.add_argument("--bursts", type=int, default=3)
    ap.add_argument("--idle-s", type=float, default=5.0, help="the trainer's sleep per burst")
    ap.add_argument("--paced-s", type=float, default=5.0)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--num-cpus", type=int, default=2)
    args = ap.parse_args()
    ray.init(address="local", num_cpus=args.num_cpus, include_dashboard=False)
    runs: dict[str, list[dict[str, float]]] = {s: [] for s in args.spins}
    for rep in range(args.reps):
        for s in args.spins if rep % 2 == 0 else list(reversed(args.spins)):
            runs[s].append(one(_spin(s), args))
    for s, reps in runs.items():
        out: dict[str, Any] = {"spin_us": s, "envs": args.envs, "reps": reps}
        for key in ("idle_core_per_actor", "paced_core_per_actor"):
            out[key + "_median"] = statistics.median(r[key] for r in reps)
        print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
