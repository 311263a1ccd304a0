"""TorchRL through ``remote_env.torchrl.gym_wrapper`` (issue #33), on real Ray.

``GymWrapper`` over RemoteVectorEnv passes TorchRL's ``check_env_specs`` and rolls out
exactly as over gymnasium's ``SyncVectorEnv`` (same seeds, same actions), in both modes
TorchRL steps, locally and on a pool whose spec says NextStep, asked for SameStep when
attaching; NEXT_STEP (the default) is our error, before TorchRL's.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Iterator
from typing import Any

import gymnasium as gym
import pytest
import ray.cloudpickle
import torch
from gymnasium.vector import AutoresetMode
from tensordict import TensorDictBase
from torchrl.envs.libs.gym import GymWrapper
from torchrl.envs.utils import check_env_specs

from remote_env import spec
from remote_env import torchrl as remote_torchrl
from remote_env.driver.vector import RemoteVectorEnv
from remote_env.pool.server import PoolServer
from remote_env.torchrl import gym_wrapper

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

pytestmark = [pytest.mark.usefixtures("ray_local"), pytest.mark.timeout(300)]

N = 4


def _short_cartpole() -> gym.Env[Any, Any]:
    return gym.make("CartPole-v1", max_episode_steps=15)


def _policy(td: TensorDictBase) -> TensorDictBase:
    """Deterministic actions that differ per env and step: left/right by the cart's
    velocity sign, flipped for odd envs (a misrouted action changes the trajectory)."""
    obs = td["observation"]
    right = (obs[..., 1] > 0) ^ (torch.arange(obs.shape[0]) % 2 == 1)
    td["action"] = torch.nn.functional.one_hot(right.long(), 2)
    return td


def _rollout(env: Any, steps: int) -> TensorDictBase:
    env.set_seed(3)
    return env.rollout(steps, _policy, break_when_any_done=False)


@pytest.mark.parametrize("mode", ["SameStep", "Disabled"])
def test_specs_check_and_rollout_equals_sync_vector_env(mode: str) -> None:
    remote = gym_wrapper(RemoteVectorEnv([_short_cartpole] * N, envs_per_actor=2,
                                         autoreset_mode=mode))
    local = GymWrapper(gym.vector.SyncVectorEnv([_short_cartpole] * N, autoreset_mode=mode))
    try:
        assert remote.batch_size == torch.Size([N])
        check_env_specs(remote)
        got, want = _rollout(remote, 60), _rollout(local, 60)
        # 60 steps of 15-step episodes: every env ended and restarted (reset masks sent)
        assert int(want["next", "done"].sum()) >= 3 * N
        for key in [("next", "observation"), ("next", "reward"), ("next", "done"),
                    ("next", "terminated"), ("next", "truncated"), "action"]:
            torch.testing.assert_close(got[key], want[key], msg=lambda m, k=key: f"{k}: {m}")
    finally:
        remote.close()
        local.close()


def test_next_step_autoreset_is_our_error_before_torchrls() -> None:
    envs = RemoteVectorEnv([_short_cartpole] * 2, envs_per_actor=2)
    try:
        with pytest.raises(ValueError, match=r"SameStep or Disabled.*runs NextStep.*"
                                             r"autoreset_mode=\"SameStep\""):
            gym_wrapper(envs)
    finally:
        envs.close()


@pytest.fixture(scope="module")
def next_step_pool() -> Iterator[PoolServer]:
    # the spec's default mode (NextStep), which TorchRL cannot step: the trainer asks
    if not ray.is_initialized():
        ray.init(address="local", num_cpus=2, include_dashboard=True)
    doc = {"apiVersion": "envpool.dev/v1alpha1", "kind": "EnvPool",
           "metadata": {"name": "torchrl-cartpole"},
           "spec": {"env": {"id": "CartPole-v1"}, "replicas": N, "envsPerActor": 2}}
    server = PoolServer(spec.parse_manifest(doc), http_port=0, health_interval_s=0.3)
    server.start_background()
    try:
        server.wait_ready(120)
        yield server
    finally:
        server.close(destroy=True)


def test_specs_check_and_rollout_on_a_pool_asked_for_same_step(
        next_step_pool: PoolServer) -> None:
    envs = RemoteVectorEnv.from_pool("torchrl-cartpole", num_envs=N, autoreset_mode="SameStep")
    assert envs.metadata["autoreset_mode"] is AutoresetMode.SAME_STEP
    env = gym_wrapper(envs)
    try:
        check_env_specs(env)
        td = env.rollout(600, _policy, break_when_any_done=False)
        assert td.batch_size == torch.Size([N, 600])
        # CartPole-v1 truncates at 500: this policy's episodes end long before
        assert bool(td["next", "done"].any(dim=1).all())
    finally:
        env.close()


def test_the_helper_leases_a_pool_in_a_mode_torchrl_steps(next_step_pool: PoolServer) -> None:
    with pytest.raises(ValueError, match=r"steps autoreset mode 'SameStep' or 'Disabled', not "
                                         r"'NextStep'"):
        remote_torchrl.from_pool("torchrl-cartpole", autoreset_mode="NextStep")
    for mode in ("SameStep", "Disabled"):  # each lease switches the same actors
        env = (remote_torchrl.from_pool("torchrl-cartpole", num_envs=N) if mode == "SameStep"
               else remote_torchrl.from_pool("torchrl-cartpole", num_envs=N,
                                             autoreset_mode=mode))
        try:
            assert env._env.autoreset_mode is AutoresetMode(mode)
            check_env_specs(env)
            td = env.rollout(100, _policy, break_when_any_done=False)
            assert bool(td["next", "done"].any(dim=1).all())  # each env's episode ended
        finally:
            env.close()
    # closing the wrapper released the lease: the whole pool is free again
    RemoteVectorEnv.from_pool("torchrl-cartpole", num_envs=N, autoreset_mode="SameStep").close()


def test_gym_wrapper_refuses_multi_agent_envs() -> None:
    from remote_env import examples

    envs = RemoteVectorEnv([functools.partial(examples.rps_parallel_env, 3)] * 2,
                           envs_per_actor=2, autoreset_mode="SameStep")
    try:
        with pytest.raises(TypeError, match="PettingZooWrapper"):
            gym_wrapper(envs)
    finally:
        envs.close()
