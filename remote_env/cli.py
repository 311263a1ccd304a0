"""``envpool`` command line: ``envpool run`` (the main job on an embedded local Ray).

Early version: ``run`` drives ``SubEnvHost`` actors directly with random actions.
The ``RemoteVectorEnv`` front end, ``serve``, ``bench`` and ``operator`` follow.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

import gymnasium as gym
import numpy as np


def _make(env_id: str) -> Any:
    return lambda: gym.make(env_id)


def run(args: argparse.Namespace) -> int:
    import ray

    from remote_env.host import SubEnvHost

    ray.init(num_cpus=args.num_cpus, include_dashboard=False, log_to_driver=False)
    try:
        host_cls: Any = ray.remote(SubEnvHost)
        k = args.envs_per_actor
        sizes = [min(k, args.num_envs - s) for s in range(0, args.num_envs, k)]
        hosts: list[Any] = [host_cls.remote([_make(args.env)] * n, restart_failed=True) for n in sizes]
        infos = ray.get([h.start.remote() for h in hosts])
        space = infos[0]["action_space"]
        ray.get([h.reset.remote(list(range(n)), [args.seed + i * k + j for j in range(n)], None)
                 for i, (h, n) in enumerate(zip(hosts, sizes, strict=True))])
        steps = episodes = failures = 0
        t0 = last = time.monotonic()
        while time.monotonic() - t0 < args.seconds:
            refs = [h.step.remote(list(range(n)), [space.sample() for _ in range(n)])
                    for h, n in zip(hosts, sizes, strict=True)]
            for b in ray.get(refs):
                steps += len(b.indices)
                episodes += int(np.sum(b.terminations | b.truncations))
                failures += len(b.failures)
            now = time.monotonic()
            if now - last >= 1.0:
                print(f"\r{now - t0:5.1f}s  {steps / (now - t0):9.0f} steps/s  "
                      f"episodes {episodes}  failures {failures}", end="", file=sys.stderr)
                last = now
        elapsed = time.monotonic() - t0
        print(f"\ndone: {steps} steps in {elapsed:.1f}s ({steps / elapsed:.0f} steps/s), "
              f"{episodes} episodes, {failures} failures, {args.num_envs} envs "
              f"in {len(hosts)} actors")
    finally:
        ray.shutdown()
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["operator"]:
        # The operator owns its flags; imported lazily so remote_env has no
        # import-time dependency on it (layering: remote_env never imports the operator).
        import importlib

        op_cli: Any = importlib.import_module("envpool_operator.cli")
        return int(op_cli.main(argv[1:]))
    parser = argparse.ArgumentParser(prog="envpool")
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("run", help="step a local pool on an embedded Ray with random actions")
    p.add_argument("--env", default="CartPole-v1", help="gymnasium env id")
    p.add_argument("--num-envs", type=int, default=16)
    p.add_argument("--envs-per-actor", type=int, default=8)
    p.add_argument("--seconds", type=float, default=30.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--num-cpus", type=int, default=2)
    p.set_defaults(fn=run)
    sub.add_parser("operator", help="run the Kubernetes operator (see envpool operator --help)")
    args = parser.parse_args(argv)
    if args.cmd == "run" and (args.num_envs < 1 or args.envs_per_actor < 1):
        parser.error("--num-envs and --envs-per-actor must be >= 1")
    return int(args.fn(args))


if __name__ == "__main__":
    raise SystemExit(main())
