"""Env steps/s per trainer framework through RemoteVectorEnv against the framework's
own local vector env, in one run (the same machine load for each).

    .venv/bin/python scripts/bench_frameworks.py --envs 8

- CleanRL: cleanrl/ppo.py's rollout loop (tiny torch policy, ``envs.step``) on
  RemoteVectorEnv vs gymnasium's ``SyncVectorEnv``.
- TorchRL: ``env.rollout`` of ``remote_env.torchrl.gym_wrapper`` (SameStep) vs
  ``GymWrapper(SyncVectorEnv)``.
- RLlib: PPO ``algo.train()`` env steps/s (sampling plus learning, one EnvRunner) with
  ``remote_env.rllib.register`` vs RLlib's own sync vectorization; and multi-agent PPO
  (PettingZoo rock-paper-scissors) through ``RemoteMultiAgentEnvRunner`` vs RLlib's
  ``MultiAgentEnvRunner`` over ``ParallelPettingZooEnv``.
- Stable-Baselines3: ``scripts/bench_sb3.py``.

CartPole costs ~1 µs a step: this measures each path's overhead. Needs the
``frameworks`` and ``bench`` extras.
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
from ray.rllib.algorithms.ppo import PPOConfig
from ray.rllib.connectors.env_to_module import FlattenObservations
from ray.rllib.env.wrappers.pettingzoo_env import ParallelPettingZooEnv
from ray.tune.registry import register_env
from torch import nn
from torch.distributions.categorical import Categorical
from torchrl.envs.libs.gym import GymWrapper

from remote_env import examples, rllib
from remote_env.driver.vector import RemoteVectorEnv
from remote_env.torchrl import gym_wrapper

ENV_ID = "CartPole-v1"


def _cleanrl_rate(envs: Any, steps: int) -> float:
    torch.manual_seed(0)
    n_obs = int(np.prod(envs.single_observation_space.shape))
    actor = nn.Sequential(nn.Linear(n_obs, 64), nn.Tanh(), nn.Linear(64, 2))
    obs, _ = envs.reset(seed=0)

    def run(k: int) -> None:
        nonlocal obs
        for _ in range(k):
            with torch.no_grad():
                action = Categorical(logits=actor(torch.Tensor(obs))).sample()
            obs, _, term, trunc, _ = envs.step(action.numpy())
            np.logical_or(term, trunc)

    run(50)  # warm-up
    t0 = time.perf_counter()
    run(steps)
    return steps * envs.num_envs / (time.perf_counter() - t0)


def _torchrl_rate(env: Any, steps: int) -> float:
    env.set_seed(0)
    env.rollout(50, break_when_any_done=False)  # warm-up
    t0 = time.perf_counter()
    env.rollout(steps, break_when_any_done=False)
    return steps * int(env.batch_size[0]) / (time.perf_counter() - t0)


def _rllib_rate(config: PPOConfig, iters: int) -> float:
    algo = config.build_algo()
    try:
        first = algo.train()["env_runners"]["num_env_steps_sampled_lifetime"]  # warm-up
        t0 = time.perf_counter()
        for _ in range(iters):
            last = algo.train()["env_runners"]["num_env_steps_sampled_lifetime"]
        return float(last - first) / (time.perf_counter() - t0)
    finally:
        algo.stop()


def _ppo(env: str, n: int, mode: str) -> PPOConfig:
    return (PPOConfig().environment(env)
            .env_runners(num_env_runners=1, num_envs_per_env_runner=n,
                         num_cpus_per_env_runner=0, gym_env_vectorize_mode=mode)
            .training(train_batch_size_per_learner=1024, minibatch_size=256, num_epochs=1)
            .debugging(seed=0))


def _rps(_: Any) -> Any:
    return examples.rps_parallel_env(20)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--envs", type=int, default=8)
    parser.add_argument("--steps", type=int, default=2000, help="vector steps per loop")
    parser.add_argument("--iters", type=int, default=3, help="PPO iterations timed")
    args = parser.parse_args()
    torch.set_num_threads(1)
    ray.init(address="local", num_cpus=2, include_dashboard=False)
    n = args.envs
    make = functools.partial(gym.make, ENV_ID)
    rows: list[tuple[str, str, float]] = []

    def remote(mode: str = "NextStep") -> RemoteVectorEnv:
        return RemoteVectorEnv([make] * n, autoreset_mode=mode)

    def timed(framework: str, what: str, rate: Callable[[], float]) -> None:
        rows.append((framework, what, rate()))
        print(f"{framework:10} {what:48} {rows[-1][2]:>10,.0f} steps/s", flush=True)

    for name, venv_fn in [("RemoteVectorEnv", remote),
                          ("SyncVectorEnv", lambda: gym.vector.SyncVectorEnv([make] * n))]:
        envs = venv_fn()
        try:
            timed("CleanRL", f"rollout loop on {name}", lambda e=envs: _cleanrl_rate(e, args.steps))
        finally:
            envs.close()
    for name, env_fn in [
            ("gym_wrapper(RemoteVectorEnv SameStep)", lambda: gym_wrapper(remote("SameStep"))),
            ("GymWrapper(SyncVectorEnv SameStep)", lambda: GymWrapper(
                gym.vector.SyncVectorEnv([make] * n, autoreset_mode="SameStep")))]:
        env = env_fn()
        try:
            timed("TorchRL", f"rollout on {name}", lambda e=env: _torchrl_rate(e, args.steps))
        finally:
            env.close()
    rllib.register("bench-remote-cartpole", ENV_ID)
    timed("RLlib", "PPO train on RemoteVectorEnv (vector_entry_point)",
          lambda: _rllib_rate(_ppo("bench-remote-cartpole", n, "vector_entry_point"), args.iters))
    timed("RLlib", "PPO train on RLlib's sync vectorization",
          lambda: _rllib_rate(_ppo(ENV_ID, n, "sync"), args.iters))
    rllib.register("bench-remote-rps", _rps)
    register_env("bench-local-rps", lambda cfg: ParallelPettingZooEnv(_rps(cfg)))
    for name, env, runner in [
            ("RemoteMultiAgentEnvRunner", "bench-remote-rps", rllib.RemoteMultiAgentEnvRunner),
            ("MultiAgentEnvRunner + ParallelPettingZooEnv", "bench-local-rps", None)]:
        config = (_ppo(env, n, "sync")
                  .env_runners(env_to_module_connector=lambda *_: FlattenObservations(
                      multi_agent=True))
                  .multi_agent(policies={"p0", "p1"},
                               policy_mapping_fn=lambda agent, *_, **__: "p" + agent[-1]))
        if runner is not None:
            config = config.env_runners(env_runner_cls=runner)
        timed("PettingZoo", f"RLlib 2-policy PPO, {name}",
              lambda c=config: _rllib_rate(c, args.iters))
    ray.shutdown()


if __name__ == "__main__":
    main()
