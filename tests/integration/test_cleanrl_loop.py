"""A CleanRL-style PPO rollout (issue #33), on real Ray: the loop of cleanrl/ppo.py
under gymnasium 1.x (make_env with RecordEpisodeStatistics, actions sampled from a
tiny torch policy, ``envs.step``, episode stats from ``infos["episode"]`` masked by
``infos["_episode"]``) sees the same observations, rewards, dones and episode stats on
RemoteVectorEnv as on gymnasium's ``SyncVectorEnv`` for the same seeds."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import ray.cloudpickle
import torch
from torch import nn
from torch.distributions.categorical import Categorical

from remote_env.driver.vector import RemoteVectorEnv

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

pytestmark = pytest.mark.usefixtures("ray_local")

NUM_ENVS, NUM_STEPS, SEED = 4, 128, 1


def make_env(env_id: str) -> Callable[[], gym.Env[Any, Any]]:
    """cleanrl/ppo.py's make_env (without video)."""
    def thunk() -> gym.Env[Any, Any]:
        env = gym.make(env_id, max_episode_steps=40)
        return gym.wrappers.RecordEpisodeStatistics(env)
    return thunk


class Agent(nn.Module):
    """cleanrl/ppo.py's Agent, narrower."""

    def __init__(self, envs: gym.vector.VectorEnv[Any, Any, Any]) -> None:
        super().__init__()
        n_obs = int(np.prod(envs.single_observation_space.shape))
        self.actor = nn.Sequential(nn.Linear(n_obs, 16), nn.Tanh(),
                                   nn.Linear(16, int(envs.single_action_space.n)))

    def get_action(self, x: torch.Tensor) -> torch.Tensor:
        return Categorical(logits=self.actor(x)).sample()


def rollout(envs: gym.vector.VectorEnv[Any, Any, Any]) -> dict[str, Any]:
    """cleanrl/ppo.py's rollout phase; returns what it stores and what it logs."""
    torch.manual_seed(SEED)
    agent = Agent(envs)
    obs = torch.zeros((NUM_STEPS, NUM_ENVS, *envs.single_observation_space.shape))
    rewards = torch.zeros((NUM_STEPS, NUM_ENVS))
    dones = torch.zeros((NUM_STEPS, NUM_ENVS))
    actions = torch.zeros((NUM_STEPS, NUM_ENVS))
    episodes: list[tuple[int, int, float, int]] = []
    next_obs_np, _ = envs.reset(seed=SEED)
    next_obs, next_done = torch.Tensor(next_obs_np), torch.zeros(NUM_ENVS)
    for step in range(NUM_STEPS):
        obs[step], dones[step] = next_obs, next_done
        with torch.no_grad():
            action = agent.get_action(next_obs)
        actions[step] = action
        next_obs_np, reward, terminations, truncations, infos = envs.step(action.numpy())
        next_done_np = np.logical_or(terminations, truncations)
        rewards[step] = torch.tensor(reward).view(-1)
        next_obs, next_done = torch.Tensor(next_obs_np), torch.Tensor(next_done_np)
        if "episode" in infos:  # gymnasium 1.x: one dict of arrays, masked by "_episode"
            for i in np.nonzero(infos["_episode"])[0]:
                episodes.append((step, int(i), float(infos["episode"]["r"][i]),
                                 int(infos["episode"]["l"][i])))
    return {"obs": obs, "rewards": rewards, "dones": dones, "actions": actions,
            "episodes": episodes}


def test_cleanrl_rollout_is_the_same_on_remote_and_sync_vector_envs() -> None:
    fns = [make_env("CartPole-v1") for _ in range(NUM_ENVS)]
    sync = gym.vector.SyncVectorEnv(fns)
    remote = RemoteVectorEnv(fns, envs_per_actor=2)
    try:
        want, got = rollout(sync), rollout(remote)
    finally:
        sync.close()
        remote.close()
    for key in ("obs", "rewards", "dones", "actions"):
        torch.testing.assert_close(got[key], want[key], msg=lambda m, k=key: f"{k}: {m}")
    # 128 steps of <= 40-step episodes: every env finished some, stats logged alike
    assert len(want["episodes"]) >= NUM_ENVS * 3
    assert {e[1] for e in want["episodes"]} == set(range(NUM_ENVS))
    assert got["episodes"] == want["episodes"]
