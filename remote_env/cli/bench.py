"""``envpool bench``: one workload through every implementation, in one process run.

Implementations (JSON keys): ``remote_env`` (best config), ``remote_env_defaults``,
``gymnasium_sync``, ``gymnasium_async``, ``rllib_remote_base_env`` (needs the
``bench`` extra), and for ``sleep1ms`` also ``remote_env_async``: the same wait
awaited (the env's ``astep``) instead of blocking a thread, which only remote_env
can use. They run alternately for ``--reps`` rounds of ``--seconds`` each
and the median steps/s is reported, with ratios to each peer and to the workload's
physical limit on this machine.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np

from remote_env import examples

WORKLOADS = ("cartpole", "cpu1ms", "sleep1ms", "image")
IMPLS = ("remote_env", "remote_env_async", "remote_env_defaults", "gymnasium_sync",
         "gymnasium_async", "rllib_remote_base_env")


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


def best_config(workload: str, num_envs: int, cpus: int) -> dict[str, Any]:
    """What we would tell a user to pick for this workload (see README).

    A Ray call costs ~1-3 ms here, so about one actor per core (few, large calls);
    I/O-bound envs also overlap their waits on threads inside the actor.
    """
    per_actor = -(-num_envs // max(1, min(cpus, num_envs)))
    cfg: dict[str, Any] = {"envs_per_actor": per_actor, "batch_wait_ms": 0.0}
    if workload == "sleep1ms":
        cfg["threads_per_actor"] = per_actor
    return cfg


# ------------------------------------------------------------------ runners
def _actions(space: gym.Space[Any], n: int, k: int = 64) -> list[np.ndarray]:
    space.seed(0)
    return [np.stack([space.sample() for _ in range(n)]) for _ in range(k)]


def run_remote_env(fn: Callable[[], Any], n: int, seconds: float, cfg: dict[str, Any]) -> float:
    from remote_env.vector import RemoteVectorEnv

    envs = RemoteVectorEnv([fn] * n, **cfg)
    try:
        acts = _actions(envs.single_action_space, n)
        envs.reset(seed=0)  # every actor is up and every env answered once
        envs.send(acts[0])
        steps, i = 0, 0
        t0 = time.perf_counter()
        while True:
            ids = envs.recv()[4]["env_id"]
            steps += len(ids)
            if time.perf_counter() - t0 >= seconds:
                break
            i += 1
            envs.send(acts[i % len(acts)][: len(ids)], ids)
        return steps / (time.perf_counter() - t0)
    finally:
        envs.close()


def run_gymnasium(fn: Callable[[], Any], n: int, seconds: float, cls: str) -> float:
    vec_cls = gym.vector.SyncVectorEnv if cls == "sync" else gym.vector.AsyncVectorEnv
    envs = vec_cls([fn] * n)
    try:
        acts = _actions(envs.single_action_space, n)
        envs.reset(seed=0)
        envs.step(acts[0])
        steps, i = 0, 0
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            envs.step(acts[i % len(acts)])
            i += 1
            steps += n
        return steps / (time.perf_counter() - t0)
    finally:
        envs.close()


def run_rllib(fn: Callable[[], Any], n: int, seconds: float) -> float:
    from ray.rllib.env.remote_base_env import RemoteBaseEnv

    env: Any = RemoteBaseEnv(lambda _idx: fn(), num_envs=n, multiagent=False,
                             remote_env_batch_wait_ms=0)
    try:
        space = fn().action_space
        space.seed(0)
        pool = [space.sample() for _ in range(256)]
        # warm-up: until every env has answered once (its actors are up)
        seen: set[Any] = set()
        deadline = time.monotonic() + 120
        while len(seen) < n and time.monotonic() < deadline:
            obs: Any = env.poll()[0]
            seen |= set(obs)
            env.send_actions({e: {a: pool[0] for a in ag} for e, ag in obs.items()})
        steps, i = 0, 0
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            obs = env.poll()[0]
            i += 1
            steps += len(obs)
            env.send_actions({e: {a: pool[(i + int(e)) % 256] for a in ag} for e, ag in obs.items()})
        return steps / (time.perf_counter() - t0)
    finally:
        env.stop()


def _rllib_available() -> str | None:
    try:
        import ray.rllib.env.remote_base_env  # noqa: F401
    except Exception as exc:  # ImportError or a missing optional dependency
        return f"{type(exc).__name__}: {exc} (pip install 'envpool-k8s[bench]')"
    return None


def limit(workload: str, n: int, cpus: int, sync_sps: float | None) -> tuple[float | None, str]:
    if workload == "cpu1ms":
        return cpus * 1000.0, f"{cpus} cores x 1000 steps/s"
    if workload == "sleep1ms":
        return n * 1000.0, f"{n} envs x 1000 steps/s"
    return sync_sps, "in-process SyncVectorEnv (no IPC)"


def bench(workload: str, n: int, seconds: float, reps: int, impls: list[str],
          cpus: int, progress: Callable[[str], None] = lambda _m: None) -> dict[str, Any]:
    import ray

    if not ray.is_initialized():
        ray.init(address="local", num_cpus=cpus, include_dashboard=False)
    fn = make_env_fn(workload)
    cfg = best_config(workload, n, cpus)
    skipped: dict[str, str] = {}
    async_fn = make_async_env_fn(workload)
    async_cfg = async_config(n, cpus)
    if "remote_env_async" in impls and async_fn is None:
        skipped["remote_env_async"] = f"the {workload} env has no awaitable (astep) variant"
        impls = [i for i in impls if i != "remote_env_async"]
    if "rllib_remote_base_env" in impls:
        why = _rllib_available()
        if why:
            skipped["rllib_remote_base_env"] = why
            impls = [i for i in impls if i != "rllib_remote_base_env"]
    runners: dict[str, Callable[[], float]] = {
        "remote_env": lambda: run_remote_env(fn, n, seconds, cfg),
        "remote_env_async": lambda: run_remote_env(async_fn, n, seconds, async_cfg),  # type: ignore[arg-type]
        "remote_env_defaults": lambda: run_remote_env(fn, n, seconds, {}),
        "gymnasium_sync": lambda: run_gymnasium(fn, n, seconds, "sync"),
        "gymnasium_async": lambda: run_gymnasium(fn, n, seconds, "async"),
        "rllib_remote_base_env": lambda: run_rllib(fn, n, seconds),
    }
    samples: dict[str, list[float]] = {i: [] for i in impls}
    for rep in range(reps):
        # alternate the order so drift (thermal, other load) spreads over all
        order = impls if rep % 2 == 0 else list(reversed(impls))
        for impl in order:
            sps = runners[impl]()
            samples[impl].append(sps)
            progress(f"[{workload} n={n} rep {rep + 1}/{reps}] {impl}: {sps:,.0f} steps/s")
    results = {i: statistics.median(v) for i, v in samples.items()}
    lim, lim_how = limit(workload, n, cpus, results.get("gymnasium_sync"))
    return {
        "workload": workload,
        "num_envs": n,
        "seconds": seconds,
        "cpus": cpus,
        "results": results,
        "limit": lim,
        "config": {"remote_env": cfg, "remote_env_async": async_cfg, "reps": reps, "limit": lim_how,
                   "samples": samples, "skipped": skipped},
    }


def table(report: dict[str, Any]) -> str:
    res: dict[str, float] = report["results"]
    peers = [p for p in ("gymnasium_sync", "gymnasium_async", "rllib_remote_base_env") if p in res]
    lines = [f"workload={report['workload']} num_envs={report['num_envs']} cpus={report['cpus']} "
             f"limit={_fmt(report['limit'])} ({report['config']['limit']}), median of "
             f"{report['config']['reps']} x {report['seconds']}s"]
    head = f"{'implementation':24}{'steps/s':>12}" + "".join(f"{'x ' + p:>26}" for p in peers)
    head += f"{'x limit':>10}"
    lines.append(head)
    for impl, sps in res.items():
        row = f"{impl:24}{sps:12,.0f}" + "".join(f"{sps / res[p]:26.2f}" for p in peers)
        row += f"{sps / report['limit']:10.2f}" if report["limit"] else f"{'-':>10}"
        lines.append(row)
    for impl, why in report["config"]["skipped"].items():
        lines.append(f"{impl:24} not run: {why}")
    return "\n".join(lines)


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:,.0f}"


# ------------------------------------------------------------------ extras
def rss_per_env(n: int, envs_per_actor: int, cpus: int) -> dict[str, Any]:
    """Peak RSS (VmHWM) of the env actor processes per CartPole sub-env (Linux /proc)."""
    import ray

    from remote_env.vector import RemoteVectorEnv

    if not ray.is_initialized():
        ray.init(address="local", num_cpus=cpus, include_dashboard=False)
    envs = RemoteVectorEnv([make_env_fn("cartpole")] * n, envs_per_actor=envs_per_actor,
                           actor_options={"num_cpus": 0})
    try:
        envs.reset(seed=0)
        envs.step(np.zeros(n, dtype=np.int64))
        pids = ray.get([a.ping.remote() for a in envs.actors])
        rss = sum(_peak_rss(p) for p in pids)
        driver = _peak_rss(os.getpid())
        return {"num_envs": n, "envs_per_actor": envs_per_actor, "actors": len(pids),
                "actor_rss_mib": rss / 2**20, "rss_per_env_kib": rss / n / 1024,
                "driver_rss_mib": driver / 2**20}
    finally:
        envs.close()


def _peak_rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmHWM for pid {pid}")


def recv_latency(batch_wait_ms: float, n: int, cpus: int, polls: int = 300) -> dict[str, Any]:
    """recv() latency with one straggler env always busy: the batch window in action."""
    import ray

    from remote_env.vector import RemoteVectorEnv

    if not ray.is_initialized():
        ray.init(address="local", num_cpus=cpus, include_dashboard=False)
    fast = functools.partial(examples.make_slow_cartpole, 0.0)
    slow = functools.partial(examples.make_slow_cartpole, 60_000.0)
    envs = RemoteVectorEnv([slow] + [fast] * (n - 1), envs_per_actor=1, batch_wait_ms=batch_wait_ms)
    try:
        envs.reset(seed=0)
        envs.send(np.zeros(1, dtype=np.int64), [0])
        ids = np.arange(1, n)
        waits = []
        for _ in range(polls):
            envs.send(np.zeros(len(ids), dtype=np.int64), ids)
            t0 = time.perf_counter()
            got: list[int] = []
            while len(got) < len(ids):
                got += envs.recv()[4]["env_id"].tolist()
            waits.append(time.perf_counter() - t0)
        w = np.asarray(waits) * 1000
        return {"batch_wait_ms": batch_wait_ms, "num_envs": n, "p50_ms": float(np.percentile(w, 50)),
                "p99_ms": float(np.percentile(w, 99))}
    finally:
        envs.close()


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "bench", help="benchmark remote_env against gymnasium and RLlib on this machine",
        description="Runs one workload through each implementation alternately and reports "
        "median steps/s with ratios to each peer and to the workload's physical limit.",
    )
    p.add_argument("--workload", choices=WORKLOADS, default="cartpole")
    p.add_argument("--num-envs", type=int, nargs="+", default=[8, 64])
    p.add_argument("--seconds", type=float, default=3.0, help="per repetition")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--impl", choices=IMPLS, nargs="+", default=list(IMPLS))
    p.add_argument("--cpus", type=int, default=os.cpu_count() or 1)
    p.add_argument("--json", action="store_true", help="print one JSON object per num_envs")
    p.add_argument("--rss", type=int, nargs="*", metavar="N",
                   help="instead: RSS per CartPole sub-env at these pool sizes")
    p.add_argument("--latency", type=float, nargs="*", metavar="MS",
                   help="instead: recv() latency p50/p99 at these batch_wait_ms")
    p.set_defaults(fn=main)


def main(args: argparse.Namespace) -> int:
    # Ray prints its workers' and raylet's log lines to the driver's sys.stdout: keep
    # stdout for results only (one JSON object a line with --json)
    out = sys.stdout
    sys.stdout = sys.stderr
    try:
        return _main(args, out)
    finally:
        sys.stdout = out


def _main(args: argparse.Namespace, out: Any) -> int:
    def progress(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    if args.rss is not None or args.latency is not None:
        rows = [rss_per_env(n, 256, args.cpus) for n in (args.rss or [])]
        rows += [recv_latency(ms, 8, args.cpus) for ms in (args.latency or [])]
        for row in rows:
            print(json.dumps(row) if args.json else row, file=out, flush=True)
        return 0
    for n in args.num_envs:
        if n < 1:
            raise SystemExit(f"envpool bench: --num-envs must be >= 1, got {n}")
        report = bench(args.workload, n, args.seconds, args.reps, list(args.impl), args.cpus,
                       progress)
        print(json.dumps(report) if args.json else table(report), file=out, flush=True)
    return 0
