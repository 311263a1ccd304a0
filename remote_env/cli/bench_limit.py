"""The machine's limit for a workload, measured: P processes stepping it in-process.

P = cores processes, each stepping its share of the N envs with ``SyncVectorEnv``
(for ``sleep1ms``: awaiting its envs' ``astep`` together on one event loop), no
IPC at all. Their aggregate steps/s is what this machine can do for the workload;
anything that moves envs into other processes can only approach it. The processes
are spawned (not forked: the bench process holds a Ray driver) and start stepping
together, once all are set up (a barrier), so their counts add up: a straggler
that started late would otherwise have had a core to itself.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import queue as queue_mod
import time
from typing import Any

import gymnasium as gym


def split(n: int, parts: int) -> list[int]:
    """``n`` envs over ``parts`` processes as evenly as possible (none empty)."""
    parts = max(1, min(parts, n))
    return [n // parts + (1 if i < n % parts else 0) for i in range(parts)]


def measure(workload: str, n: int, procs: int, seconds: float, *,
            awaited: bool = False) -> Any:
    """Aggregate steps/s of ``procs`` processes and their CPU µs per env-step (a
    :class:`~remote_env.cli.bench_runners.Run`; no driver: each steps its own)."""
    from remote_env.cli.bench_runners import Run

    shares = split(n, procs)
    ctx = multiprocessing.get_context("spawn")
    results: Any = ctx.Queue()
    start = ctx.Barrier(len(shares))
    workers = [ctx.Process(target=_worker, args=(workload, k, seconds, start, awaited,
                                                 results), daemon=True) for k in shares]
    for w in workers:
        w.start()
    try:
        counts = [results.get(timeout=120 + seconds) for _ in workers]
    except queue_mod.Empty:
        raise RuntimeError(f"a limit process for {workload} did not report within "
                           f"{120 + seconds:.0f} s") from None
    finally:
        for w in workers:
            w.join(timeout=10)
    steps = sum(c[0] for c in counts)
    window = max(c[1] for c in counts)
    cpu = sum(c[2] for c in counts)
    return Run(steps / window, cpu / max(steps, 1) * 1e6, 0.0)


def _worker(workload: str, k: int, seconds: float, start: Any, awaited: bool,
            out: Any) -> None:
    from remote_env.cli import bench_runners

    if awaited:
        fn = bench_runners.make_async_env_fn(workload)
        assert fn is not None, f"{workload} has no awaitable variant"
        out.put(asyncio.run(_awaited(fn, k, seconds, start)))
        return
    envs = gym.vector.SyncVectorEnv([bench_runners.make_env_fn(workload)] * k)
    acts = bench_runners.actions(envs.single_action_space, k)
    envs.reset(seed=0)
    envs.step(acts[0])
    start.wait(timeout=120)
    steps, i = 0, 0
    c0, t0 = time.process_time(), time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        envs.step(acts[i % len(acts)])
        i += 1
        steps += k
    out.put((steps, time.perf_counter() - t0, time.process_time() - c0))
    envs.close()


async def _awaited(fn: Any, k: int, seconds: float, start: Any) -> tuple[int, float, float]:
    envs = [fn() for _ in range(k)]
    space = envs[0].action_space
    space.seed(0)
    pool = [space.sample() for _ in range(256)]
    for j, env in enumerate(envs):
        await env.areset(seed=j)

    async def one(env: Any, action: Any) -> None:
        _, _, term, trunc, _ = await env.astep(action)
        if term or trunc:  # autoreset, as the vector envs do
            await env.areset()

    start.wait(timeout=120)  # blocking is fine: nothing else runs on this loop yet
    steps, i = 0, 0
    c0, t0 = time.process_time(), time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        await asyncio.gather(*(one(e, pool[(i + j) % 256]) for j, e in enumerate(envs)))
        i += 1
        steps += k
    return steps, time.perf_counter() - t0, time.process_time() - c0


def yardsticks(workload: str, n: int, cpus: int, sync_sps: float | None) -> dict[str, Any]:
    """The limits earlier benches used, kept for comparison (they ignore what a
    wake-up or a core's other work costs, so they overstate what is reachable)."""
    out: dict[str, Any] = {"in_process_sync": sync_sps}
    if workload == "cpu1ms":
        out["cores_x_1000"] = cpus * 1000.0
    if workload == "sleep1ms":
        out["envs_x_1000"] = n * 1000.0
    return out

