"""``envpool run``: the main job on a laptop.

An embedded local Ray, a pool (``--env``/``--entrypoint``: a :class:`RemoteVectorEnv`
owned by this process; ``-f pool.yaml``: that EnvPool's pool server and a trainer
attached to it) and a random-action driver through ``send``/``recv`` (dynamic
batching), with a live progress line and ``/metrics``.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from typing import Any

import gymnasium as gym
import numpy as np

from remote_env import entrypoints, errors, ray_connect
from remote_env.cli import argcheck
from remote_env.driver import options
from remote_env.spec.fields import FIELDS


def add_parser(sub: Any) -> None:
    """Add the ``run`` subcommand to an ``argparse`` subparsers object."""
    p = sub.add_parser(
        "run", help="step a local pool on an embedded Ray with random actions",
        description="The main job on a laptop: an embedded local Ray, a pool of env actors "
        "and a random-action driver (dynamic batching), with progress and /metrics.",
    )
    what = p.add_mutually_exclusive_group()
    what.add_argument("-f", "--file", metavar="POOL_YAML",
                      help="an EnvPool manifest: run its pool server and a random trainer")
    what.add_argument("--env", default="CartPole-v1", help="gymnasium env id (default %(default)s)")
    what.add_argument("--entrypoint", help="make-env callable 'package.module:callable'")
    p.add_argument("--env-kwarg", dest="env_kwargs", type=_kv, action="append", default=[],
                   metavar="KEY=VALUE", help="keyword for the env (YAML value); repeatable")
    p.add_argument("--num-envs", type=int, default=16, help="sub-envs in the pool (default %(default)s)")
    p.add_argument("--envs-per-actor", type=int, default=None,
                   help="sub-envs per Ray actor; one call steps them all (default: at "
                   "--batch-wait-ms 0, picked from one env measured at start-up; with a wait, "
                   "num-envs / CPUs; shown when the pool is ready)")
    p.add_argument("--threads-per-actor", type=int, default=_default("threadsPerActor"),
                   help="threads stepping each actor's envs, for envs that block on I/O "
                   "(envs with async astep/areset need none) (default %(default)s)")
    p.add_argument("--transport", choices=("auto", "ray"), default="auto",
                   help="auto: shared memory and a Unix socket to actors on this node, TCP to others; "
                   "ray: Ray calls only (default %(default)s)")
    p.add_argument("--batch-wait-ms", type=float, default=options.DEFAULT_BATCH_WAIT_MS,
                   help="how long recv() waits for more ready envs; 0: return the envs ready "
                   "when the first actor call finishes (default %(default)s, the "
                   "library's; with -f: the pool's spec.batchWaitMs)")
    p.add_argument("--spin-us", type=_spin_us, default=None,
                   help="how long an actor on this node looks for the next call before it "
                   "sleeps; ~500 for cheap envs (see README); auto: 500 only while calls "
                   "come back-to-back (default: 0)")
    p.add_argument("--splits-per-actor", type=int, default=None,
                   help="send each actor's envs as this many calls, so the actor steps one "
                   "split while the driver handles another; 2 with one actor per spare "
                   "core (see README) (default: picked at start-up at --batch-wait-ms 0; "
                   "1 with a wait)")
    p.add_argument("--seconds", type=float, default=30.0, help="how long to run (Ctrl-C stops early)")
    p.add_argument("--seed", type=int, default=0, help="reset seed of env 0 (env i: seed+i)")
    p.add_argument("--num-cpus", type=int, default=2, help="CPUs of the embedded Ray")
    p.add_argument("--no-restart", action="store_true", help="raise on the first env failure")
    p.add_argument("--max-restarts", type=int, default=_default("faultTolerance.maxRestarts"),
                   help="failures in a row after which an env is given up (default %(default)s)")
    p.add_argument("--step-timeout", type=float, metavar="SECONDS",
                   default=_default("faultTolerance.stepTimeoutSeconds"),
                   help="replace an actor that does not answer within this; 0: wait forever "
                   "(default %(default)s)")
    p.add_argument("--metrics-port", type=int, default=None,
                   help="serve Prometheus /metrics on this port (0 = any free port)")
    p.add_argument("--metrics-addr", default="127.0.0.1",
                   help="address for /metrics (default loopback: nothing exposed)")
    p.add_argument("--pool", default="local", help="pool label of the metrics")
    p.set_defaults(fn=run)
    argcheck.bind(p, check)


def _spin_us(text: str) -> float | str:
    """``--spin-us``: ``auto`` or a number of µs (checked in :func:`check`)."""
    if text == "auto":
        return "auto"
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected 'auto' or microseconds (e.g. 500), got {text!r}") from None


def _default(field: str) -> object:
    """An EnvPool field's default: `envpool run` runs a pool as the spec would."""
    return FIELDS[f"spec.{field}"].default


def check(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse bad arguments before Ray starts, with ``envpool run``'s usage message.

    ``parser`` is the ``run`` subparser (``args.check(args)`` binds it).
    """
    for name in ("num_envs", "envs_per_actor", "threads_per_actor", "splits_per_actor"):
        argcheck.at_least(parser, f"--{name.replace('_', '-')}", getattr(args, name), 1)  # None: picked
    argcheck.at_least(parser, "--num-cpus", args.num_cpus, 0)
    argcheck.positive(parser, "--seconds", args.seconds, inf_ok=True)  # inf: until Ctrl-C
    for flag, value in (("--max-restarts", args.max_restarts),
                        ("--step-timeout", args.step_timeout),
                        ("--batch-wait-ms", args.batch_wait_ms),
                        ("--spin-us", None if args.spin_us == "auto" else args.spin_us)):
        argcheck.at_least(parser, flag, value, 0)
    argcheck.port(parser, "--metrics-port", args.metrics_port)
    try:
        if args.file:
            from remote_env import spec
            from remote_env.pool import launch

            pool = spec.load(args.file)
            bad_env = launch.runtime_env_error(pool.ray.runtime_env)
            if bad_env is not None:
                parser.error(f"{args.file}: spec.ray.runtimeEnv: {bad_env}")
            bad_id = launch.env_id_error(pool.env, pool.ray.runtime_env)
            if bad_id is not None:
                parser.error(f"{args.file}: spec.env.id: {bad_id}")
        else:
            _env_fn(args).check()  # an unknown id or entrypoint: now, not in every actor
    except (ValueError, OSError, ImportError, gym.error.Error) as exc:
        parser.error(str(exc))


def _env_fn(args: argparse.Namespace) -> entrypoints.EnvFactory:
    kwargs = dict(args.env_kwargs)
    if args.entrypoint:
        return entrypoints.EnvFactory(None, args.entrypoint, kwargs)
    return entrypoints.EnvFactory(args.env, None, kwargs,
                                  instead="--entrypoint package.module:callable")


def _kv(text: str) -> tuple[str, Any]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    import yaml

    return key, yaml.safe_load(value)


def run(args: argparse.Namespace) -> int:
    """``envpool run``: an embedded Ray, a pool, a random-action trainer; cleans up all."""
    import ray

    # address="local": always a fresh embedded Ray, never whatever cluster ran last here.
    # log_to_driver=False made every actor call ~7x slower here (Ray 2.60): keep the default.
    with contextlib.ExitStack() as cleanup:
        cleanup.callback(ray.shutdown)  # also stops a Ray interrupted while starting
        try:
            ray_connect.connect("local", num_cpus=args.num_cpus)
            envs = _open_pool(args, cleanup) if args.file else _open_envs(args, cleanup)
            return _drive(envs, args)
        except KeyboardInterrupt:
            print("\ninterrupted while starting: closing the pool", file=sys.stderr)
            return 130
        except errors.SubEnvironmentError as exc:
            print(f"\nenvpool run: {exc}", file=sys.stderr)
            return 1


def _open_envs(args: argparse.Namespace, cleanup: contextlib.ExitStack) -> Any:
    """A RemoteVectorEnv owned by this process (``--env`` / ``--entrypoint``)."""
    from remote_env.driver.vector import RemoteVectorEnv
    from remote_env.metrics import PoolMetrics, serve_metrics

    metrics = PoolMetrics(pool=args.pool)
    if args.metrics_port is not None:
        server = serve_metrics(metrics.registry, args.metrics_port, args.metrics_addr)
        cleanup.callback(server.shutdown)
        print(f"metrics: http://{args.metrics_addr}:{server.server_port}/metrics", file=sys.stderr)
    t0 = time.monotonic()
    envs = RemoteVectorEnv(
        [_env_fn(args)] * args.num_envs,
        envs_per_actor=args.envs_per_actor,
        batch_wait_ms=args.batch_wait_ms,
        restart_failed_sub_environments=not args.no_restart,
        step_timeout_s=args.step_timeout or None,  # 0: no hang check, as in the spec
        max_restarts=args.max_restarts,
        threads_per_actor=args.threads_per_actor,
        transport=args.transport,
        spin_us=args.spin_us,
        splits_per_actor=args.splits_per_actor,
        metrics=metrics,
    )
    cleanup.callback(envs.close)
    how = "awaiting astep" if envs.async_steps else (
        f"{args.threads_per_actor} threads each" if args.threads_per_actor > 1 else "")
    if envs.splits_per_actor > 1:
        how = ", ".join(filter(None, (how, f"{envs.splits_per_actor} splits each")))
    n = len(envs.actors)
    print(f"{envs.num_envs} x {args.entrypoint or args.env} in {n} actor{'s' * (n != 1)}"
          f"{f' ({how})' if how else ''} ready in {time.monotonic() - t0:.1f}s", file=sys.stderr)
    _say_layout(envs)
    return envs


def _say_layout(envs: Any) -> None:
    """What the library picked for the options not given, and from what."""
    print(f"layout: {envs.tuning.describe(envs.num_envs)}", file=sys.stderr)


def _open_pool(args: argparse.Namespace, cleanup: contextlib.ExitStack) -> Any:
    """``-f pool.yaml``: the pool server of that EnvPool and a trainer attached to it."""
    from remote_env import RemoteVectorEnv
    from remote_env import spec as spec_mod
    from remote_env.metrics import PoolMetrics
    from remote_env.pool.server import PoolServer

    spec = spec_mod.load(args.file)
    port = args.metrics_port if args.metrics_port is not None else spec.metrics_port
    server = PoolServer(spec, http_host=args.metrics_addr, http_port=port)
    cleanup.callback(server.close, destroy=True)
    server.start_background()
    t0 = time.monotonic()
    print(f"pool {spec.name}: starting {spec.desired_envs} envs; "
          f"status {server.url}/status, metrics {server.url}/metrics", file=sys.stderr)
    server.wait_ready(timeout=600)
    print(f"pool {spec.name}: {spec.desired_envs} envs ready in "
          f"{time.monotonic() - t0:.1f}s", file=sys.stderr)
    # the trainer gets its own registry: the server already counts pool-side events
    envs = RemoteVectorEnv.from_pool(spec.name, metrics=PoolMetrics(pool=spec.name),
                                     spin_us=args.spin_us, splits_per_actor=args.splits_per_actor)
    cleanup.callback(envs.close)
    _say_layout(envs)
    return envs


def _drive(envs: Any, args: argparse.Namespace) -> int:
    """Random actions through send/recv until --seconds or Ctrl-C; returns the exit code."""
    space = envs.single_action_space
    space.seed(args.seed)
    envs.async_reset(seed=args.seed)
    steps = episodes = 0
    t0 = last = time.monotonic()
    tty = sys.stderr.isatty()
    interrupted = False
    try:
        while time.monotonic() - t0 < args.seconds:
            _, _, term, trunc, info = envs.recv()
            ids = info["env_id"]
            if envs.multi_agent:
                done = [bool(term[e]["__all__"] or trunc[e]["__all__"]) for e in term]
                actions: Any = [space.sample() for _ in ids]
            else:
                done = term | trunc
                actions = np.stack([space.sample() for _ in ids])
            steps += len(ids)
            episodes += int(np.sum(done))
            envs.send(actions, ids)
            now = time.monotonic()
            if now - last >= 1.0:
                line = _progress(envs, now - t0, steps, episodes)
                print(f"\r{line}" if tty else line, end="" if tty else "\n", file=sys.stderr,
                      flush=True)
                last = now
    except KeyboardInterrupt:
        interrupted = True
    elapsed = time.monotonic() - t0
    t = envs.metrics.totals()
    print(("\n" if tty else "") + (
        f"done{' (interrupted)' if interrupted else ''}: {steps} steps in {elapsed:.1f}s "
        f"({steps / max(elapsed, 1e-9):.0f} steps/s), {episodes} episodes, "
        f"{t['failures']:.0f} failures, {t['env_restarts']:.0f} env restarts, "
        f"{t['actor_restarts']:.0f} actor restarts"
    ))
    return 130 if interrupted else 0


def _progress(envs: Any, elapsed: float, steps: int, episodes: int) -> str:
    t = envs.metrics.totals()
    return (f"{elapsed:6.1f}s  {steps / elapsed:9.0f} steps/s  episodes {episodes}  "
            f"failures {t['failures']:.0f}  restarts {t['env_restarts']:.0f} env / "
            f"{t['actor_restarts']:.0f} actor  layout {len(envs.actors)}x{envs.envs_per_actor}"
            f"/{envs.splits_per_actor} split{'s' * (envs.splits_per_actor != 1)}")
