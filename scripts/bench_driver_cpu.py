"""Where the driver's time goes in a tight ``send``/``recv`` loop (issue 34, image 16).

    PYTHONPATH=. .venv/bin/python scripts/bench_driver_cpu.py --workload image --num-envs 16

A sampling profiler attached from outside slowed this loop by a third and put most of
the driver's samples in ``poll``, which its thread CPU contradicted. This measures in
the driver's own thread instead: ``time.thread_time()`` over the loop and around each
``channel._poll`` (the wait for a reply; wrapped here, this process only). Prints one
JSON line per ``copy`` setting: steps/s, the driver thread's cores, the share of the
wall in ``poll``, how many polls found the reply already there (under 20 µs), and CPU
per ``recv``+``send`` cycle outside and inside ``poll``. Hold the benchmark lock.
"""

from __future__ import annotations

import argparse
import json
import select
import time

import ray

from remote_env.cli import bench_runners
from remote_env.driver.vector import RemoteVectorEnv
from remote_env.wire import channel

_POLL = channel._poll


class PollClock:
    """Wall and thread CPU spent in ``channel._poll`` while installed."""

    def __init__(self) -> None:
        self.wall = 0.0
        self.cpu = 0.0
        self.polls = 0
        self.instant = 0

    def poll(self, poller: select.poll, timeout: float | None) -> list[tuple[int, int]]:
        w0, c0 = time.perf_counter(), time.thread_time()
        ready = _POLL(poller, timeout)
        wall = time.perf_counter() - w0
        self.wall += wall
        self.cpu += time.thread_time() - c0
        self.polls += 1
        self.instant += wall < 20e-6
        return ready


def measure(workload: str, n: int, seconds: float, copy: bool) -> dict[str, object]:
    envs = RemoteVectorEnv([bench_runners.make_env_fn(workload)] * n, copy=copy)
    try:
        acts = bench_runners.actions(envs.single_action_space, n)
        envs.reset(seed=0)
        clock = PollClock()
        channel._poll = clock.poll
        try:
            envs.send(acts[0])
            steps, cycles = 0, 0
            t0, c0 = time.perf_counter(), time.thread_time()
            while time.perf_counter() - t0 < seconds:
                ids = envs.recv()[4]["env_id"]
                steps += len(ids)
                cycles += 1
                envs.send(acts[cycles % len(acts)][: len(ids)], ids)
            wall, cpu = time.perf_counter() - t0, time.thread_time() - c0
        finally:
            channel._poll = _POLL
        return {"copy": copy, "sps": round(steps / wall), "cycles": cycles,
                "driver_thread_cores": round(cpu / wall, 3),
                "poll_wall_share": round(clock.wall / wall, 3),
                "polls": clock.polls, "polls_under_20us": clock.instant,
                "us_cpu_per_cycle_outside_poll": round((cpu - clock.cpu) / cycles * 1e6, 1),
                "us_cpu_per_cycle_in_poll": round(clock.cpu / cycles * 1e6, 1)}
    finally:
        envs.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workload", choices=bench_runners.WORKLOADS, default="image")
    ap.add_argument("--num-envs", type=int, default=16)
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--num-cpus", type=int, default=2)
    args = ap.parse_args()
    ray.init(address="local", num_cpus=args.num_cpus, include_dashboard=False)
    for copy in (True, False):
        print(json.dumps({"workload": args.workload, "num_envs": args.num_envs,
                          **measure(args.workload, args.num_envs, args.seconds, copy)}),
              flush=True)


if __name__ == "__main__":
    main()
