"""Stable-Baselines3 steps/s through remote_env.sb3.SB3VecEnv against DummyVecEnv and
SubprocVecEnv, in one run (the same machine load for each).

    .venv/bin/python scripts/bench_sb3.py --envs 8 --steps 4000 --ppo-steps 16384

Two figures per vector env: stepping alone (random actions, ``venv.step``) and PPO
training (``model.learn``: rollouts plus updates, MlpPolicy on CPU). Needs the
``frameworks`` extra.
"""

from __future__ import annotations

import argparse
import functools
import time
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
import ray
import torch
from stable_baselines3 import PPO
from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv, VecEnv, VecMonitor

from remote_env.sb3 import SB3VecEnv


def _step_rate(venv: VecEnv, steps: int) -> float:
    venv.reset()
    rng = np.random.default_rng(0)
    actions = rng.integers(0, 2, size=(steps, venv.num_envs))
    for a in actions[:50]:  # warm-up
        venv.step(a)
    t0 = time.perf_counter()
    for a in actions:
        venv.step(a)
    return steps * venv.num_envs / (time.perf_counter() - t0)


def _ppo_rate(venv: VecEnv, timesteps: int) -> float:
    model = PPO("MlpPolicy", VecMonitor(venv), n_steps=256, batch_size=256, n_epochs=4,
                seed=0, device="cpu")
    model.learn(total_timesteps=1024)  # warm-up: first rollout and update
    t0 = time.perf_counter()
    model.learn(total_timesteps=timesteps, reset_num_timesteps=False)
    return timesteps / (time.perf_counter() - t0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--envs", type=int, default=8)
    parser.add_argument("--steps", type=int, default=4000, help="vector steps for stepping alone")
    parser.add_argument("--ppo-steps", type=int, default=16384, help="env steps for PPO")
    parser.add_argument("--env-id", default="CartPole-v1")
    parser.add_argument("--rounds", type=int, default=2,
                        help="rounds, each vector env in turn (a loaded machine drifts)")
    parser.add_argument("--torch-threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.torch_threads)
    fns = [functools.partial(gym.make, args.env_id)] * args.envs
    ray.init(address="local", num_cpus=2, include_dashboard=False)  # ours, not a running one
    makers: dict[str, Callable[[], VecEnv]] = {
        "SB3VecEnv(RemoteVectorEnv)": lambda: SB3VecEnv(fns),
        "DummyVecEnv": lambda: DummyVecEnv(list(fns)),
        "SubprocVecEnv": lambda: SubprocVecEnv(list(fns)),
    }
    rows: dict[str, list[tuple[float, float]]] = {name: [] for name in makers}
    for r in range(args.rounds):
        for name, make in makers.items():
            venv: Any = make()
            try:
                step = _step_rate(venv, args.steps)
                ppo = _ppo_rate(venv, args.ppo_steps)
            finally:
                venv.close()
            rows[name].append((step, ppo))
            print(f"round {r} {name:28s} step: {step:9,.0f} steps/s   PPO learn: "
                  f"{ppo:7,.0f} steps/s", flush=True)
    for name, got in rows.items():
        step, ppo = np.median([g[0] for g in got]), np.median([g[1] for g in got])
        print(f"median  {name:28s} step: {step:9,.0f} steps/s   PPO learn: {ppo:7,.0f} steps/s")
    ray.shutdown()


if __name__ == "__main__":
    main()
