"""``envpool bench``: one workload through every implementation, in one process run.

Implementations (JSON keys): ``remote_env`` (best config), ``remote_env_defaults``,
``remote_env_pickle`` and ``remote_env_ray`` (defaults over the pickling socket and
over Ray calls only: the older data paths), ``gymnasium_sync``,
``gymnasium_async``, ``rllib_remote_base_env`` (needs the ``bench`` extra), and for
``sleep1ms`` also ``remote_env_async``: the same wait awaited (the env's ``astep``)
instead of blocking a thread, which only remote_env can use. ``limit`` is the
machine's, measured in the same rotation (:mod:`remote_env.cli.bench_limit`). They
run alternately for ``--reps`` rounds of ``--seconds`` each, each alone: the earlier
runs' processes gone first (:mod:`remote_env.cli.bench_quiet`). The median steps/s and
µs of CPU per env-step are reported, with ratios to each peer and to the limit except
where a figure is a disturbed measurement (:mod:`remote_env.cli.bench_sanity`).
Progress and an estimate of the time left go to stderr.
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

import numpy as np

from remote_env import examples
from remote_env.checks import TRANSPORTS
from remote_env.cli import argcheck, bench_limit, bench_quiet, bench_runners, bench_sanity
from remote_env.cli.bench_runners import run_gymnasium, run_remote_env

WORKLOADS = bench_runners.WORKLOADS
#: ``limit`` is the machine's (see :mod:`remote_env.cli.bench_limit`), run alongside.
#: The yardsticks Sync and the limit come right after RLlib's teardown of an actor per env (odd
#: reps; even reps run in reverse), where anything it left running would show most.
IMPLS = ("remote_env", "remote_env_async", "remote_env_defaults", "remote_env_pickle",
         "remote_env_ray", "gymnasium_async", "rllib_remote_base_env", "gymnasium_sync",
         "limit")
#: With ``--simulate-nodes``: the defaults with every actor on the driver's node
#: (shared memory), and on the other nodes over the channel's TCP path or Ray calls.
OFF_NODE_IMPLS = ("remote_env_on_node", "remote_env_off_node", "remote_env_off_node_ray")
#: On request (``--impl``): the tuned and the default configs with ``copy=False``
#: (observations handed out as views of the shared-memory batch, no copy out); the
#: defaults with the actors' spin at ``"auto"`` and at a fixed 500 µs; the layout of
#: before the self-tuning (issue 34: one actor per core, one call each, no spin); the
#: defaults of before issue 34 (``batch_wait_ms=2``, which also keeps that layout).
EXTRA_IMPLS = ("remote_env_nocopy", "remote_env_defaults_nocopy",
               "remote_env_defaults_spinauto", "remote_env_defaults_spin500",
               "remote_env_untuned", "remote_env_wait2")
#: the custom resources that place them (the simulated nodes advertise them)
ON_NODE, OFF_NODE = "envpool_bench_driver_node", "envpool_bench_other_node"
PEERS = ("gymnasium_sync", "gymnasium_async", "rllib_remote_base_env")
# re-exported: tests and scripts call these through this module
make_env_fn = bench_runners.make_env_fn
make_async_env_fn = bench_runners.make_async_env_fn
best_config = bench_runners.best_config
untuned_config = bench_runners.untuned_config
async_config = bench_runners.async_config
# A guess per run before one has been timed, beyond its --seconds: start-up and
# teardown. RLlib's RemoteBaseEnv starts one actor per env, ~4.5 s each here.
_PRIOR_S = {"gymnasium_sync": 1.0, "gymnasium_async": 3.0, "limit": 5.0}


def _prior_s(impl: str, n: int) -> float:
    if impl == "rllib_remote_base_env":
        return 4.5 * n
    return _PRIOR_S.get(impl, 5.0)


class Progress:
    """Says on stderr which run is next and how long the rest should take."""

    def __init__(self, say: Callable[[str], None], workload: str, n: int, seconds: float,
                 reps: int, impls: list[str]) -> None:
        self._say, self._seconds, self._n = say, seconds, n
        self._tag = f"[{workload} n={n}]"
        self._took: dict[str, float] = {}
        self._left = [i for _ in range(reps) for i in impls]
        self._say(f"{self._tag} {len(impls)} implementations x {reps} reps x {seconds:g} s: "
                  f"about {self._eta()} (RLlib's estimate assumes ~4.5 s per actor start)"
                  if "rllib_remote_base_env" in impls else
                  f"{self._tag} {len(impls)} implementations x {reps} reps x {seconds:g} s: "
                  f"about {self._eta()}")

    def _eta(self) -> str:
        s = sum(self._took.get(i, self._seconds + _prior_s(i, self._n)) for i in self._left)
        return f"{s / 60:.1f} min" if s >= 90 else f"{s:.0f} s"

    def starting(self, impl: str, rep: int, reps: int, around: bench_quiet.Beside) -> None:
        waited = f"waited {around.waited_s:.1f} s for the last run's processes to exit; " \
            if around.waited_s >= 0.5 else ""
        left = ", ".join(f"{k} x {v}" for k, v in around.leftover.items())
        left = f"STILL RUNNING BESIDE IT: {left}; " if left else ""
        top = ", ".join(f"{k} {v:.1f}" for k, v in around.busiest.items())
        self._say(f"{self._tag} rep {rep}/{reps} {impl} ... ({waited}{left}machine busy "
                  f"{around.busy_cores:.1f} cores before it{': ' + top if top else ''}; "
                  f"{self._eta()} left)")

    def done(self, impl: str, rep: int, reps: int, sps: float, cpu_us: float | None,
             took: float) -> None:
        self._took[impl] = took
        self._left.remove(impl)
        cpu = "" if cpu_us is None else f", {cpu_us:.1f} us CPU/step"
        self._say(f"{self._tag} rep {rep}/{reps} {impl}: {sps:,.0f} steps/s{cpu} "
                  f"(took {took:.1f} s; {self._eta()} left)")


def _impls(workload: str, impls: list[str], skipped: dict[str, str]) -> list[str]:
    if "remote_env_async" in impls and make_async_env_fn(workload) is None:
        skipped["remote_env_async"] = f"the {workload} env has no awaitable (astep) variant"
    if "rllib_remote_base_env" in impls:
        why = bench_runners.rllib_available()
        if why:
            skipped["rllib_remote_base_env"] = why
    placed = [i for i in impls if i in OFF_NODE_IMPLS]
    if placed:
        import ray

        have = ray.cluster_resources()  # type: ignore[no-untyped-call]
        if not (have.get(ON_NODE) and have.get(OFF_NODE)):
            for i in placed:
                skipped[i] = "needs --simulate-nodes 2 or more (a node besides the driver's)"
    return [i for i in impls if i not in skipped]


def bench(workload: str, n: int, seconds: float, reps: int, impls: list[str],
          cpus: int, progress: Callable[[str], None] = lambda _m: None,
          address: str | None = None, worker_niceness: int | None = None) -> dict[str, Any]:
    """Every implementation in ``impls`` (and the machine limit) on one workload.

    ``limit`` is P = ``cpus`` processes stepping the workload in-process (for
    ``sleep1ms`` awaiting it: the awaited limit), measured in the same rotation.
    """
    import ray

    if not ray.is_initialized():
        if address:  # a running cluster (e.g. several `ray start` nodes on this machine)
            ray.init(address=address)
        else:
            # Ray starts its workers at nice 15: on a busy machine they get a sliver of a
            # core next to nice-0 processes (the limit's, gymnasium's). Say so, or even it out.
            system = {} if worker_niceness is None else {"worker_niceness": worker_niceness}
            ray.init(address="local", num_cpus=cpus, include_dashboard=False,
                     _system_config=system)
    fn = make_env_fn(workload)
    cfg = best_config(workload, n, cpus)
    async_fn = make_async_env_fn(workload)
    async_cfg = async_config(n, cpus)
    skipped: dict[str, str] = {}
    impls = _impls(workload, impls, skipped)
    awaited_limit = async_fn is not None
    runners: dict[str, Callable[[], bench_runners.Run]] = {
        "remote_env": lambda: run_remote_env(fn, n, seconds, cfg),
        "remote_env_async": lambda: run_remote_env(async_fn, n, seconds, async_cfg),  # type: ignore[arg-type]
        "remote_env_defaults": lambda: run_remote_env(fn, n, seconds, {}),
        "remote_env_nocopy": lambda: run_remote_env(fn, n, seconds, {**cfg, "copy": False}),
        "remote_env_defaults_nocopy": lambda: run_remote_env(fn, n, seconds, {"copy": False}),
        "remote_env_defaults_spinauto": lambda: run_remote_env(fn, n, seconds,
                                                               {"spin_us": "auto"}),
        "remote_env_defaults_spin500": lambda: run_remote_env(fn, n, seconds,
                                                              {"spin_us": 500.0}),
        "remote_env_untuned": lambda: run_remote_env(fn, n, seconds, untuned_config(n, cpus)),
        "remote_env_wait2": lambda: run_remote_env(fn, n, seconds, {"batch_wait_ms": 2.0}),
        # the older data paths, at the defaults: compare with remote_env_defaults
        "remote_env_pickle": lambda: run_remote_env(fn, n, seconds, {"transport": "pickle"}),
        "remote_env_ray": lambda: run_remote_env(fn, n, seconds, {"transport": "ray"}),
        # placed by the simulated nodes' resources (see OFF_NODE_IMPLS)
        "remote_env_on_node": lambda: run_remote_env(fn, n, seconds, _placed(ON_NODE)),
        "remote_env_off_node": lambda: run_remote_env(fn, n, seconds, _placed(OFF_NODE)),
        "remote_env_off_node_ray": lambda: run_remote_env(
            fn, n, seconds, {**_placed(OFF_NODE), "transport": "ray"}),
        "gymnasium_sync": lambda: run_gymnasium(fn, n, seconds, "sync"),
        "gymnasium_async": lambda: run_gymnasium(fn, n, seconds, "async"),
        "rllib_remote_base_env": lambda: bench_runners.run_rllib(fn, n, seconds),
        "limit": lambda: bench_limit.measure(workload, n, cpus, seconds, awaited=awaited_limit),
    }
    samples: dict[str, list[float]] = {i: [] for i in impls}
    cpu_samples: dict[str, list[float]] = {i: [] for i in impls}
    driver_samples: dict[str, list[float]] = {i: [] for i in impls}
    beside: dict[str, list[bench_quiet.Beside]] = {i: [] for i in impls}
    shown = Progress(progress, workload, n, seconds, reps, impls)
    quiet = bench_quiet.Quiet(str(ray.get_runtime_context().gcs_address))
    for rep in range(1, reps + 1):
        # alternate the order so drift (thermal, other load) spreads over all
        order = impls if rep % 2 == 1 else list(reversed(impls))
        for impl in order:
            # each run alone: the earlier runs' actors and processes gone, checked
            around = quiet.wait()
            shown.starting(impl, rep, reps, around)
            t0 = time.perf_counter()
            sps, cpu_us, driver_us = runners[impl]()
            samples[impl].append(sps)
            cpu_samples[impl].append(cpu_us)
            driver_samples[impl].append(driver_us)
            beside[impl].append(around)
            shown.done(impl, rep, reps, sps, cpu_us, time.perf_counter() - t0)
    medians = {i: statistics.median(v) for i, v in samples.items()}
    lim = medians.pop("limit", None)
    bad = bench_sanity.disturbed(samples, {i: [b.leftover for b in v] for i, v in beside.items()},
                                 yardsticks=(*PEERS, "limit"))
    procs = len(bench_limit.split(n, cpus))
    how = (f"{procs} processes x {n // procs}+ envs in-process, no IPC"
           + (" (awaited: astep on one event loop each)" if awaited_limit else " (SyncVectorEnv)"))
    return {
        "workload": workload,
        "num_envs": n,
        "seconds": seconds,
        "cpus": cpus,
        "ray_worker_niceness": worker_niceness if worker_niceness is not None else "ray default",
        "results": medians,
        "limit": lim,
        # impl -> why its figure is a disturbed measurement, not a figure to divide by
        "disturbed": bad,
        # per rep: how long the bench waited for the earlier runs' processes to exit,
        # which of them still ran beside it (none unless the wait gave up), and the
        # cores the rest of the machine kept busy just before it
        "beside": {i: [b._asdict() for b in v] for i, v in beside.items()},
        "cpu_us_per_step": {i: statistics.median(v) for i, v in cpu_samples.items()},
        # the driver's share of it (for the limit: 0, each process steps its own)
        "driver_cpu_us_per_step": {i: statistics.median(v) for i, v in driver_samples.items()},
        # what earlier benches called the limit (see bench_limit.yardsticks)
        "yardsticks": bench_limit.yardsticks(workload, n, cpus, medians.get("gymnasium_sync")),
        "config": {"remote_env": cfg, "remote_env_async": async_cfg, "reps": reps,
                   "limit": how if "limit" in impls else "not measured (--impl without limit)",
                   "samples": samples, "cpu_samples": cpu_samples,
                   "driver_cpu_samples": driver_samples, "skipped": skipped},
    }


def _placed(resource: str) -> dict[str, Any]:
    """Every actor on the node(s) advertising ``resource`` (defaults otherwise)."""
    return {"actor_options": {"num_cpus": 0, "resources": {resource: 0.001}}}


def table(report: dict[str, Any]) -> str:
    res: dict[str, float] = report["results"]
    cpu: dict[str, float] = report.get("cpu_us_per_step", {})
    lim = report["limit"]
    bad: dict[str, str] = report.get("disturbed", {})
    peers = [p for p in PEERS if p in res]
    lines = [f"workload={report['workload']} num_envs={report['num_envs']} cpus={report['cpus']} "
             f"limit={_fmt(lim)} ({report['config']['limit']}), median of "
             f"{report['config']['reps']} x {report['seconds']}s"]
    drv: dict[str, float] = report.get("driver_cpu_us_per_step", {})
    head = f"{'implementation':24}{'steps/s':>12}{'us CPU/step':>13}{'(driver)':>10}"
    head += "".join(f"{'x ' + p:>26}" for p in peers) + f"{'x limit':>12}"
    lines.append(head)
    both = {**res, "limit": lim} if lim else dict(res)
    for impl, sps in both.items():
        row = f"{impl:24}{sps:12,.0f}{_fmt(cpu.get(impl), '.1f'):>13}"
        row += f"{_fmt(drv.get(impl), '.1f'):>10}"
        row += "".join(f"{_ratio(both, bad, impl, p):>26}" for p in peers)
        row += f"{_ratio(both, bad, impl, 'limit'):>12}" if lim else f"{'-':>12}"
        lines.append(row)
    for impl, why in bad.items():
        lines.append(f"DISTURBED {impl}: {why}")
    lines.append(_beside_line(report.get("beside", {})))
    old = ", ".join(f"{k}={_fmt(v)}" for k, v in report.get("yardsticks", {}).items())
    if old:
        lines.append(f"earlier yardsticks: {old}")
    for impl, why in report["config"]["skipped"].items():
        lines.append(f"{impl:24} not run: {why}")
    return "\n".join(lines)


def _ratio(res: dict[str, float], bad: dict[str, str], num: str, den: str) -> str:
    r = bench_sanity.ratio(res, bad, num, den)
    return "disturbed" if r is None else f"{r:.2f}"


def _beside_line(beside: dict[str, list[dict[str, Any]]]) -> str:
    runs = [b for v in beside.values() for b in v]
    if not runs:
        return "beside: not recorded"
    left = sum(bool(b["leftover"]) for b in runs)
    busy = [b["busy_cores"] for b in runs]
    top: dict[str, float] = {}
    for b in runs:
        for name, cores in b.get("busiest", {}).items():
            top[name] = max(top.get(name, 0.0), cores)
    who = ", ".join(f"{k} up to {v:.1f}" for k, v in sorted(top.items(), key=lambda kv: -kv[1])[:5])
    return (f"beside: {'nothing' if not left else f'{left} of {len(runs)} runs had something'}"
            f" of the bench's own still running (waited up to "
            f"{max(b['waited_s'] for b in runs):.1f} s for a run's processes to exit); the "
            f"machine's other load just before each run: {min(busy):.1f}-{max(busy):.1f} cores"
            + (f" ({who})" if who else ""))


def _fmt(x: float | None, how: str = ",.0f") -> str:
    return "-" if x is None else format(x, how)


# ------------------------------------------------------------------ extras
def rss_per_env(n: int, envs_per_actor: int, cpus: int, transport: str = "auto") -> dict[str, Any]:
    """Peak RSS (VmHWM) of the env actor processes per CartPole sub-env (Linux /proc)."""
    import ray

    from remote_env.driver.vector import RemoteVectorEnv

    if not ray.is_initialized():
        ray.init(address="local", num_cpus=cpus, include_dashboard=False)
    envs = RemoteVectorEnv([make_env_fn("cartpole")] * n, envs_per_actor=envs_per_actor,
                           transport=transport,
                           actor_options={"num_cpus": 0})
    try:
        envs.reset(seed=0)
        envs.step(np.zeros(n, dtype=np.int64))
        pids = ray.get([a.ping.remote() for a in envs.actors])
        rss = sum(_peak_rss(p) for p in pids)
        driver = _peak_rss(os.getpid())
        return {"num_envs": n, "transport": transport, "envs_per_actor": envs_per_actor,
                "actors": len(pids), "actor_rss_mib": rss / 2**20, "rss_per_env_kib": rss / n / 1024,
                "driver_rss_mib": driver / 2**20}
    finally:
        envs.close()


def _peak_rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmHWM for pid {pid}")


def recv_latency(batch_wait_ms: float, n: int, cpus: int, polls: int = 300,
                 transport: str = "auto") -> dict[str, Any]:
    """recv() latency with one straggler env always busy: the batch window in action."""
    import ray

    from remote_env.driver.vector import RemoteVectorEnv

    if not ray.is_initialized():
        ray.init(address="local", num_cpus=cpus, include_dashboard=False)
    fast = functools.partial(examples.make_slow_cartpole, 0.0)
    slow = functools.partial(examples.make_slow_cartpole, 60_000.0)
    envs = RemoteVectorEnv([slow] + [fast] * (n - 1), envs_per_actor=1, batch_wait_ms=batch_wait_ms,
                           transport=transport)
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
        return {"batch_wait_ms": batch_wait_ms, "transport": transport, "num_envs": n,
                "p50_ms": float(np.percentile(w, 50)), "p99_ms": float(np.percentile(w, 99))}
    finally:
        envs.close()


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "bench", help="benchmark remote_env against gymnasium and RLlib on this machine",
        description="Runs one workload through each implementation alternately and reports "
        "median steps/s with ratios to each peer and to the machine's limit for the workload "
        "(measured in the same run: one process per core stepping it in-process).",
    )
    p.add_argument("--workload", choices=WORKLOADS, default="cartpole")
    p.add_argument("--num-envs", type=int, nargs="+", default=[8, 64])
    p.add_argument("--seconds", type=float, default=3.0, help="per repetition")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--impl", choices=IMPLS + OFF_NODE_IMPLS + EXTRA_IMPLS, nargs="+",
                   default=None,
                   help="implementations to run (default: all but "
                   f"{', '.join(EXTRA_IMPLS)}; with --simulate-nodes also "
                   f"{', '.join(OFF_NODE_IMPLS)})")
    p.add_argument("--cpus", type=int, default=os.cpu_count() or 1)
    p.add_argument("--address", help="a running Ray cluster to use (default: a fresh "
                   "local Ray with --cpus CPUs)")
    p.add_argument("--simulate-nodes", type=int, metavar="N",
                   help="run on a Ray cluster of N simulated nodes on this machine (1 CPU "
                   "each, ray.cluster_utils): actors on the driver's node get shared "
                   "memory, the others the channel over TCP; adds the off-node "
                   "implementations (the same envs placed on the driver's node, or on the "
                   "others over TCP or over Ray calls)")
    p.add_argument("--ray-worker-niceness", type=int, metavar="NICE",
                   help="nice value of the local Ray's workers (Ray's default: 15; the limit "
                   "and gymnasium's processes run at this process's, usually 0)")
    p.add_argument("--transport", choices=TRANSPORTS, default="auto",
                   help="remote_env's transport for --rss and --latency")
    p.add_argument("--json", action="store_true", help="print one JSON object per num_envs")
    p.add_argument("--rss", type=int, nargs="*", metavar="N",
                   help="instead: RSS per CartPole sub-env at these pool sizes")
    p.add_argument("--latency", type=float, nargs="*", metavar="MS",
                   help="instead: recv() latency p50/p99 at these batch_wait_ms")
    p.set_defaults(fn=main)
    argcheck.bind(p, check)


def check(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse bad arguments before Ray starts, with ``envpool bench``'s usage message.

    ``parser`` is the ``bench`` subparser (``args.check(args)`` binds it).
    """
    argcheck.each_at_least(parser, "--num-envs", args.num_envs, 1)
    argcheck.positive(parser, "--seconds", args.seconds)
    argcheck.at_least(parser, "--reps", args.reps, 1)
    argcheck.at_least(parser, "--cpus", args.cpus, 1)
    if args.simulate_nodes is not None and args.simulate_nodes < 2:
        parser.error("--simulate-nodes needs 2 or more (the driver's node and another), "
                     f"got {args.simulate_nodes}")
    argcheck.each_at_least(parser, "--rss", args.rss, 1)
    argcheck.each_at_least(parser, "--latency", args.latency, 0)


def main(args: argparse.Namespace) -> int:
    # stdout carries results only (one JSON object a line with --json). Ray prints its
    # workers' log lines to sys.stdout from a thread, and the daemons it starts inherit
    # file descriptor 1: point both at stderr, and write results to a copy of the real
    # stdout. Ray is shut down before stdout is given back, or its log thread prints
    # what it still holds after the results (issue 35: `--json | tail -1` was a log line).
    import ray

    ours = not ray.is_initialized()
    sys.stdout.flush()
    real = os.dup(1)
    os.dup2(2, 1)
    saved, sys.stdout = sys.stdout, sys.stderr
    try:
        with os.fdopen(os.dup(real), "w") as out:
            return _main(args, out)
    finally:
        if ours and ray.is_initialized():
            ray.shutdown()
        sys.stderr.flush()
        os.dup2(real, 1)
        os.close(real)
        sys.stdout = saved


def _main(args: argparse.Namespace, out: Any) -> int:
    def progress(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    if args.rss is not None or args.latency is not None:
        rows = [rss_per_env(n, 256, args.cpus, args.transport) for n in (args.rss or [])]
        rows += [recv_latency(ms, 8, args.cpus, transport=args.transport)
                 for ms in (args.latency or [])]
        for row in rows:
            print(json.dumps(row) if args.json else row, file=out, flush=True)
        return 0
    cluster = None
    address = args.address
    if args.simulate_nodes:
        from ray.cluster_utils import Cluster

        # fake nodes: each a raylet of its own claiming 1 CPU, all on this machine
        # (2 or more: check)
        cluster = Cluster(initialize_head=True,
                          head_node_args={"num_cpus": 1, "resources": {ON_NODE: 1000}})
        for _ in range(args.simulate_nodes - 1):
            cluster.add_node(num_cpus=1, resources={OFF_NODE: 1000})
        cluster.wait_for_nodes()
        address = cluster.address
    try:
        for n in args.num_envs:  # each >= 1: check
            impls = list(args.impl or (IMPLS + OFF_NODE_IMPLS if args.simulate_nodes else IMPLS))
            report = bench(args.workload, n, args.seconds, args.reps, impls,
                           args.cpus, progress, address, args.ray_worker_niceness)
            report["simulated_nodes"] = args.simulate_nodes or None
            print(json.dumps(report) if args.json else table(report), file=out, flush=True)
    finally:
        if cluster is not None:
            import ray

            ray.shutdown()
            cluster.shutdown()  # type: ignore[no-untyped-call]
    return 0
