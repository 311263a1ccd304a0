"""What ``envpool bench`` runs: the workloads' envs and one runner per implementation.

Every runner returns a :class:`Run`: steps/s and µs of CPU per env-step. The CPU is that of the
driver (``time.process_time``: all its threads, Ray's included) plus the processes
that host the envs (actors, AsyncVectorEnv workers), from ``/proc/<pid>/stat``, over
the timed window; Ray's own daemons (raylet, GCS) are not counted.
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import gymnasium as gym
import numpy as np

from remote_env import examples

WORKLOADS = ("cartpole", "cpu1ms", "sleep1ms", "image")
_TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")


def make_env_fn(workload: str) -> Callable[[], Any]:
    if workload == "cartpole":
        return functools.partial(gym.make, "CartPole-v1")
    if workload == "cpu1ms":
        return functools.partial(examples.BusyCartPole, 1.0)
    if workload == "sleep1ms":
        return functools.partial(examples.make_slow_cartpole, 1.0)
    if workload == "image":
        return examples.ImageEnv
    raise ValueError(f"unknown workload {workload!r}; expected one of {', '.join(WORKLOADS)}")


def make_async_env_fn(workload: str) -> Callable[[], Any] | None:
    """The workload's env with ``astep``/``areset`` (same wait, awaited), if it has one."""
    if workload == "sleep1ms":
        return functools.partial(examples.make_async_slow_cartpole, 1.0)
    return None


def async_config(num_envs: int, cpus: int) -> dict[str, Any]:
    """Awaiting envs cost little CPU while they wait: two actors per core overlap one
    actor's waits with the other's steps (16 envs/actor: 11.6k steps/s at 64 envs,
    against 10.3k with 32 and 8.6k with 8)."""
    per_actor = -(-num_envs // max(1, min(2 * cpus, num_envs)))
    return {"envs_per_actor": per_actor, "batch_wait_ms": 0.0}


def untuned_config(num_envs: int, cpus: int) -> dict[str, Any]:
    """The layout before it tuned itself (issue 34): one actor per core, one call each,
    no spin (``batch_wait_ms`` the default: 0 since issue 34, 2 before; the defaults of
    before as a whole are ``{"batch_wait_ms": 2}``, ``remote_env_wait2``)."""
    return {"envs_per_actor": -(-num_envs // max(1, cpus)), "splits_per_actor": 1,
            "spin_us": 0.0}


def best_config(workload: str, num_envs: int, cpus: int) -> dict[str, Any]:
    """What we would tell a user to pick for this workload (see README).

    About one actor per core. Envs that wait also overlap their waits on threads
    inside the actor. Cheap envs (cartpole, image) are stepped in a tight loop, so
    their actors look for the next call for ``spin_us`` before sleeping: a call's
    fixed cost (~100 us of driver CPU, ~60 us in the actor on 2 cores) is then not
    paid again in a wake-up and cold caches. CartPole 64 in two actors of 32:
    108-115k steps/s sleeping at once, 136-145k with 500 us of spin (one actor of
    64: 85-93k; one of 64 in two splits: 124-133k).

    Images are the other way round: each step moves a 28 KB frame, so the driver's
    share of the work (copying frames out, ~90 us a call of 8) is as large as the
    actor's. The driver gets a core of its own and the actors the others, each in two
    splits (``splits_per_actor``) so that an actor steps one half of its envs while
    the driver handles the other half: image 16 on 2 cores, one actor of 16 in two
    splits 54-72k steps/s, against 42-48k for two actors of 8 (one call each) that
    take turns with the driver on two cores.
    """
    cheap = workload in ("cartpole", "image")
    actors = max(1, min(cpus - 1 if workload == "image" else cpus, num_envs))
    per_actor = -(-num_envs // actors)
    cfg: dict[str, Any] = {"envs_per_actor": per_actor, "batch_wait_ms": 0.0}
    if cheap:
        cfg["spin_us"] = 500.0
    if workload == "image":
        cfg["splits_per_actor"] = 2
    if workload == "sleep1ms":
        cfg["threads_per_actor"] = per_actor
    return cfg


def actions(space: gym.Space[Any], n: int, k: int = 64) -> list[np.ndarray]:
    space.seed(0)
    return [np.stack([space.sample() for _ in range(n)]) for _ in range(k)]


# ------------------------------------------------------------------- CPU time
def proc_cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (all its threads)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * _TICK_S


class CpuClock:
    """CPU seconds of this process plus ``pids`` between :meth:`start` and :meth:`stop`."""

    def __init__(self, pids: Sequence[int]) -> None:
        self.pids = list(pids)
        self._t0 = (0.0, 0.0)
        #: of the total :meth:`stop` returned, this process's share (the driver's)
        self.driver_s = 0.0

    def _now(self) -> tuple[float, float]:
        return time.process_time(), sum(proc_cpu_s(p) for p in self.pids)

    def start(self) -> None:
        self._t0 = self._now()

    def stop(self) -> float:
        (d0, w0), (d1, w1) = self._t0, self._now()
        self.driver_s = d1 - d0
        return self.driver_s + w1 - w0


class Run(NamedTuple):
    """One timed run: steps/s, µs of CPU per env-step in all, and the driver's part."""

    sps: float
    cpu_us: float
    driver_us: float


def _run(steps: int, wall: float, clock: CpuClock) -> Run:
    total = clock.stop()
    per = 1e6 / max(steps, 1)
    return Run(steps / wall, total * per, clock.driver_s * per)


# -------------------------------------------------------------------- runners
def run_remote_env(fn: Callable[[], Any], n: int, seconds: float,
                   cfg: dict[str, Any]) -> Run:
    from remote_env.driver.vector import RemoteVectorEnv

    envs = RemoteVectorEnv([fn] * n, **cfg)
    try:
        acts = actions(envs.single_action_space, n)
        envs.reset(seed=0)  # every actor is up and every env answered once
        clock = CpuClock(envs._ray.get([a.ping.remote() for a in envs.actors]))
        envs.send(acts[0])
        steps, i = 0, 0
        clock.start()
        t0 = time.perf_counter()
        while True:
            ids = envs.recv()[4]["env_id"]
            steps += len(ids)
            if time.perf_counter() - t0 >= seconds:
                break
            i += 1
            envs.send(acts[i % len(acts)][: len(ids)], ids)
        wall = time.perf_counter() - t0
        return _run(steps, wall, clock)
    finally:
        envs.close()


def run_gymnasium(fn: Callable[[], Any], n: int, seconds: float,
                  cls: str) -> Run:
    vec_cls = gym.vector.SyncVectorEnv if cls == "sync" else gym.vector.AsyncVectorEnv
    envs = vec_cls([fn] * n)
    try:
        acts = actions(envs.single_action_space, n)
        envs.reset(seed=0)
        envs.step(acts[0])
        clock = CpuClock([p.pid for p in getattr(envs, "processes", [])])
        steps, i = 0, 0
        clock.start()
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            envs.step(acts[i % len(acts)])
            i += 1
            steps += n
        wall = time.perf_counter() - t0
        return _run(steps, wall, clock)
    finally:
        envs.close()


def _pid(_actor_self: Any) -> int:
    return os.getpid()


def run_rllib(fn: Callable[[], Any], n: int, seconds: float) -> Run:
    import ray
    from ray.rllib.env.remote_base_env import RemoteBaseEnv

    env: Any = RemoteBaseEnv(lambda _idx: fn(), num_envs=n, multiagent=False,
                             remote_env_batch_wait_ms=0)
    try:
        space = fn().action_space
        space.seed(0)
        pool = [space.sample() for _ in range(256)]
        # warm-up: until every env has answered once (its actors are up)
        seen: set[Any] = set()
        deadline = time.monotonic() + 600
        while len(seen) < n and time.monotonic() < deadline:
            obs: Any = env.poll()[0]
            seen |= set(obs)
            env.send_actions({e: {a: pool[0] for a in ag} for e, ag in obs.items()})
        clock = CpuClock(ray.get([a.__ray_call__.remote(_pid) for a in env.actors]))
        steps, i = 0, 0
        clock.start()
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            obs = env.poll()[0]
            i += 1
            steps += len(obs)
            env.send_actions({e: {a: pool[(i + int(e)) % 256] for a in ag} for e, ag in obs.items()})
        wall = time.perf_counter() - t0
        return _run(steps, wall, clock)
    finally:
        # stop() only queues __ray_terminate__ behind each actor's pending step: kill
        # them, so their processes go now rather than beside the next run (the bench
        # still waits for them to exit: bench_quiet)
        env.stop()
        for actor in env.actors or ():
            ray.kill(actor)


def rllib_available() -> str | None:
    try:
        import ray.rllib.env.remote_base_env  # noqa: F401
    except Exception as exc:  # ImportError or a missing optional dependency
        return f"{type(exc).__name__}: {exc} (pip install 'envpool-k8s[bench]')"
    return None
