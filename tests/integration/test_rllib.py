"""RLlib's new API stack through ``remote_env.rllib`` (issue #33), on real Ray.

PPO trains on RemoteVectorEnv envs made from ``env_config`` and on a warm pool's envs
(returned to the pool when the algorithm stops); the wrong ``gym_env_vectorize_mode``
is our error naming the right one; two-policy PPO trains through the shipped
multi-agent runner on the PettingZoo example env.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Iterator
from typing import Any

import gymnasium as gym
import pytest
import ray.cloudpickle
from ray.rllib.algorithms.ppo import PPOConfig
from ray.rllib.connectors.env_to_module import FlattenObservations
from ray_checks import wait_for

from remote_env import examples, rllib, spec
from remote_env.pool.server import PoolServer

# the make-env functions below reach the actors by value (no PYTHONPATH there)
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

pytestmark = [pytest.mark.usefixtures("ray_local"), pytest.mark.timeout(300)]

BATCH = 256


def _short_cartpole(config: dict[str, Any]) -> gym.Env[Any, Any]:
    return gym.make("CartPole-v1", max_episode_steps=int(config["max_steps"]))


def _rps(config: dict[str, Any]) -> Any:
    return examples.rps_parallel_env(int(config.get("max_cycles", 10)))


def _ppo(env: str, **env_config: Any) -> PPOConfig:
    """A PPO small enough for 2 cores: one remote runner, one short epoch."""
    return (PPOConfig()
            .environment(env, env_config=env_config)
            .env_runners(num_env_runners=1, num_envs_per_env_runner=4,
                         num_cpus_per_env_runner=0,
                         gym_env_vectorize_mode="vector_entry_point")
            .training(train_batch_size_per_learner=BATCH, minibatch_size=64, num_epochs=1)
            .debugging(seed=0))


def _sampled(result: dict[str, Any]) -> int:
    return int(result["env_runners"]["num_env_steps_sampled_lifetime"])


def test_ppo_trains_on_local_envs_from_env_config() -> None:
    rllib.register("remote-short-cartpole", _short_cartpole, envs_per_actor=2)
    algo = _ppo("remote-short-cartpole", max_steps=20).build_algo()
    try:
        first = algo.train()
        second = algo.train()
        assert _sampled(second) >= 2 * BATCH > _sampled(first) >= BATCH
        # max_steps reached the envs: episodes end by step 20
        assert 0 < second["env_runners"]["episode_len_max"] <= 20
        assert "default_policy" in second["learners"]
        runner = algo.env_runner_group.foreach_env_runner(
            lambda r: (type(r.env.unwrapped).__name__, r.env.unwrapped.num_envs),
            local_env_runner=False)
        assert runner == [("RemoteVectorEnv", 4)]
    finally:
        algo.stop()


def test_wrong_vectorize_mode_names_vector_entry_point() -> None:
    rllib.register("remote-cartpole-sync", "CartPole-v1")
    config = (_ppo("remote-cartpole-sync")
              .env_runners(num_env_runners=0, gym_env_vectorize_mode="sync"))
    with pytest.raises(rllib.VectorizeModeError,
                       match='gym_env_vectorize_mode="vector_entry_point"'):
        config.build_algo()


def test_creator_refuses_an_autoreset_mode_rllib_cannot_step() -> None:
    with pytest.raises(ValueError, match="autoreset_mode='NextStep'"):
        rllib.register("remote-cartpole-same", "CartPole-v1", autoreset_mode="SameStep")


@pytest.fixture
def cartpole_pool() -> Iterator[PoolServer]:
    doc = {"apiVersion": "envpool.dev/v1alpha1", "kind": "EnvPool",
           "metadata": {"name": "rllib-cartpole"},
           "spec": {"env": {"id": "CartPole-v1"}, "replicas": 4, "envsPerActor": 2}}
    server = PoolServer(spec.parse_manifest(doc), http_port=0, health_interval_s=0.3)
    server.start_background()
    try:
        server.wait_ready(120)
        yield server
    finally:
        server.close(destroy=True)


def test_ppo_trains_on_a_warm_pools_envs_and_hands_them_back(
        cartpole_pool: PoolServer) -> None:
    rllib.register("pooled-cartpole", pool="rllib-cartpole")
    algo = _ppo("pooled-cartpole").build_algo()
    try:
        assert cartpole_pool.status()["leasedEnvs"] == 4
        result = algo.train()
        assert _sampled(result) >= BATCH
    finally:
        algo.stop()
    wait_for(lambda: cartpole_pool.status()["leasedEnvs"] == 0, 30, "lease released")


def test_a_sigkilled_env_runner_gets_its_envs_back_at_once_and_sampling_goes_on(
        cartpole_pool: PoolServer) -> None:
    """The runner holds every env of the pool (no spare) with the default 60 s lease;
    its process is SIGKILLed. RLlib restarts it, the pool server has reclaimed the
    dead runner's lease meanwhile, and the new runner leases the same envs: training
    samples again within seconds, not after the lease's ttl."""
    rllib.register("pooled-cartpole-restart", pool="rllib-cartpole")
    algo = (_ppo("pooled-cartpole-restart")
            .fault_tolerance(restart_failed_env_runners=True)
            .build_algo())
    try:
        sampled = _sampled(algo.train())
        assert sampled >= BATCH and cartpole_pool.status()["leasedEnvs"] == 4
        [pid] = algo.env_runner_group.foreach_env_runner(lambda r: os.getpid(),
                                                         local_env_runner=False)
        os.kill(pid, signal.SIGKILL)
        killed_at = time.monotonic()
        deadline = killed_at + 45
        while True:
            now_sampled = _sampled(algo.train())
            if now_sampled > sampled:
                break
            assert time.monotonic() < deadline, "no samples since the runner was killed"
        resumed = time.monotonic() - killed_at
        print(f"RLlib runner: sampling again {resumed:.2f}s after SIGKILL (ttl 60s)")
        assert resumed < 30, resumed
        [new_pid] = algo.env_runner_group.foreach_env_runner(lambda r: os.getpid(),
                                                             local_env_runner=False)
        assert new_pid != pid
        status = cartpole_pool.status()
        assert status["leasesReclaimed"] == 1 and status["leasedEnvs"] == 4
    finally:
        algo.stop()


def test_multi_agent_ppo_trains_two_policies_through_the_shipped_runner() -> None:
    rllib.register("remote-rps", _rps, envs_per_actor=2)
    config = (_ppo("remote-rps", max_cycles=10)
              .env_runners(env_runner_cls=rllib.RemoteMultiAgentEnvRunner,
                           # Discrete observations: one-hot, as RLlib's own RPS example
                           env_to_module_connector=lambda *_: FlattenObservations(
                               multi_agent=True))
              .multi_agent(policies={"p0", "p1"},
                           policy_mapping_fn=lambda agent, *_, **__: "p" + agent[-1]))
    algo = config.build_algo()
    try:
        algo.train()
        result = algo.train()
        assert _sampled(result) >= 2 * BATCH
        assert {"p0", "p1"} <= set(result["learners"])
        # rock-paper-scissors is zero-sum, and every episode lasts max_cycles
        assert result["env_runners"]["episode_len_max"] == 10
        assert result["env_runners"]["num_episodes_lifetime"] >= 2 * BATCH // 10 - 4
    finally:
        algo.stop()
