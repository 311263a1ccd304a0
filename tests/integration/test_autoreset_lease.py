"""The autoreset mode is the trainer's, per lease (issue #33), on real Ray and a real pool
server: the same warm actors leased in NextStep, then SameStep, then Disabled each step
exactly as gymnasium's ``SyncVectorEnv`` in that mode with the same seeds; a switch
makes a reset due first; a bad mode is refused at attach, before any lease is taken.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import ray.cloudpickle
from gymnasium.vector import AutoresetMode

from remote_env import spec
from remote_env.driver.vector import RemoteVectorEnv
from remote_env.pool.server import PoolServer

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

pytestmark = [pytest.mark.usefixtures("ray_local"), pytest.mark.timeout(300)]

POOL = "autoreset-modes"
N = 4
EPISODE = 9  # short episodes: every env ends (and is autoreset) a few times per lease
STEPS = 40


@pytest.fixture(scope="module")
def pool() -> Iterator[PoolServer]:
    # the spec's own mode is Disabled: the last lease, which asks for none, gets it back
    # after two leases in other modes
    doc = {"apiVersion": "envpool.dev/v1alpha1", "kind": "EnvPool",
           "metadata": {"name": POOL},
           "spec": {"env": {"id": "CartPole-v1", "kwargs": {"max_episode_steps": EPISODE}},
                    "replicas": N, "envsPerActor": 2, "autoresetMode": "Disabled"}}
    if not ray.is_initialized():
        ray.init(address="local", num_cpus=2, include_dashboard=True)
    server = PoolServer(spec.parse_manifest(doc), http_port=0, health_interval_s=0.3)
    server.start_background()
    try:
        server.wait_ready(120)
        yield server
    finally:
        server.close(destroy=True)


def _local(mode: AutoresetMode) -> gym.vector.SyncVectorEnv:
    return gym.vector.SyncVectorEnv(
        [lambda: gym.make("CartPole-v1", max_episode_steps=EPISODE)] * N, autoreset_mode=mode)


def _actions(obs: np.ndarray, t: int) -> np.ndarray:
    """Actions that depend on each env's state (a misrouted result changes the run)."""
    return ((obs[:, 2] > 0) ^ (np.arange(N) + t) % 3 == 0).astype(np.int64)


def _same(got: Any, want: Any, what: str) -> None:
    np.testing.assert_array_equal(got, want, err_msg=what)


def _lease_equals_sync_vector_env(envs: RemoteVectorEnv, mode: AutoresetMode) -> int:
    """Step ``envs`` and a local SyncVectorEnv in ``mode`` side by side; episode ends seen."""
    local = _local(mode)
    try:
        obs, _ = envs.reset(seed=11)
        want, _ = local.reset(seed=11)
        _same(obs, want, "reset")
        ends = 0
        for t in range(STEPS):
            actions = _actions(want, t)
            got_step, want_step = envs.step(actions), local.step(actions)
            for name, g, w in zip(("obs", "reward", "terminated", "truncated"),
                                  got_step[:4], want_step[:4], strict=True):
                _same(g, w, f"{mode.value} step {t}: {name}")
            got_info, want_info = got_step[4], want_step[4]
            if mode is AutoresetMode.SAME_STEP:  # the last observation of an ended episode
                _same(got_info.get("_final_obs", np.zeros(N, bool)),
                      want_info.get("_final_obs", np.zeros(N, bool)), f"step {t}: _final_obs")
                for e in np.flatnonzero(want_info.get("_final_obs", [])):
                    _same(got_info["final_obs"][e], want_info["final_obs"][e],
                          f"step {t}: final_obs[{e}]")
            want = want_step[0]
            done = want_step[2] | want_step[3]
            ends += int(done.sum())
            if mode is AutoresetMode.DISABLED and done.any():  # the trainer resets them
                obs, _ = envs.reset(options={"reset_mask": done})
                want, _ = local.reset(options={"reset_mask": done})
                _same(obs, want, f"step {t}: masked reset")
        return ends
    finally:
        local.close()


def test_one_pool_leased_in_each_mode_steps_as_sync_vector_env(pool: PoolServer) -> None:
    actor_ids = None
    # the enum or its value; None: the spec's (Disabled)
    for asked, mode in [("NextStep", AutoresetMode.NEXT_STEP),
                        (AutoresetMode.SAME_STEP, AutoresetMode.SAME_STEP),
                        (None, AutoresetMode.DISABLED)]:
        kwargs = {} if asked is None else {"autoreset_mode": asked}
        envs = RemoteVectorEnv.from_pool(POOL, num_envs=N, **kwargs)
        try:
            ids = [h._actor_id.hex() for h in envs.actors]
            assert actor_ids in (None, ids), "not the same warm actors"
            actor_ids = ids
            assert envs.autoreset_mode is mode
            assert envs.metadata["autoreset_mode"] is mode
            # each lease switched the actors' mode: a step before a reset is refused
            with pytest.raises(gym.error.ResetNeeded, match="never reset"):
                envs.step(np.zeros(N, dtype=np.int64))
            ends = _lease_equals_sync_vector_env(envs, mode)
            assert ends >= 2 * N, f"{mode.value}: only {ends} episode ends compared"
        finally:
            envs.close()
        pool_status = pool.status()
        assert pool_status["leasedEnvs"] in (0, N)  # released (the server may lag a tick)


def test_leasing_the_mode_served_already_keeps_the_envs_where_they_were(
        pool: PoolServer) -> None:
    local = _local(AutoresetMode.SAME_STEP)
    local.reset(seed=3)
    left = np.zeros(N, dtype=np.int64)
    first = RemoteVectorEnv.from_pool(POOL, num_envs=N, autoreset_mode="SameStep")
    try:
        first.reset(seed=3)
        _same(first.step(left)[0], local.step(left)[0], "first lease's step")
    finally:
        first.close()
    again = RemoteVectorEnv.from_pool(POOL, num_envs=N, autoreset_mode="SameStep")
    try:
        # no switch, no reset due: the episodes go on, as a warm pool's always did
        _same(again.step(left)[0], local.step(left)[0], "second lease's first step")
    finally:
        again.close()
        local.close()


def test_a_bad_mode_is_refused_at_attach_before_any_lease(pool: PoolServer) -> None:
    for bad in ("SAME_STEP", "Sometimes", 3):
        with pytest.raises(ValueError, match=r"autoreset_mode=.*not a gymnasium AutoresetMode.*"
                                             r"'NextStep', 'SameStep', 'Disabled'"):
            RemoteVectorEnv.from_pool(POOL, num_envs=N, autoreset_mode=bad)
    # nothing was leased: the whole pool is still free for the next trainer
    envs = RemoteVectorEnv.from_pool(POOL, num_envs=N, autoreset_mode="NextStep")
    envs.close()


def test_sb3_adapter_leases_the_pool_in_same_step_and_equals_dummy_vec_env(
        pool: PoolServer) -> None:
    from stable_baselines3.common.vec_env import DummyVecEnv

    from remote_env.sb3 import SB3VecEnv

    remote = SB3VecEnv.from_pool(POOL, num_envs=N)  # the spec says Disabled
    dummy = DummyVecEnv([lambda: gym.make("CartPole-v1", max_episode_steps=EPISODE)] * N)
    try:
        assert remote.venv.autoreset_mode is AutoresetMode.SAME_STEP
        remote.seed(5)
        dummy.seed(5)
        _same(remote.reset(), dummy.reset(), "reset")
        ends = 0
        for t in range(STEPS):
            actions = np.arange(N) * t % 2
            (o1, r1, d1, i1), (o2, r2, d2, i2) = remote.step(actions), dummy.step(actions)
            for name, g, w in (("obs", o1, o2), ("rewards", r1, r2), ("dones", d1, d2)):
                _same(g, w, f"step {t}: {name}")
            for e in np.flatnonzero(d2):
                _same(i1[e]["terminal_observation"], i2[e]["terminal_observation"],
                      f"step {t}: terminal_observation[{e}]")
            ends += int(d2.sum())
        assert ends >= 2 * N
    finally:
        remote.close()
        dummy.close()


def test_adopted_actors_serving_another_mode_are_refused_by_name() -> None:
    """Actors of one's own (not a pool's) keep the mode they were built with: a vector
    env over them in another mode would hand out that mode's results as its own."""
    host = RemoteVectorEnv.host_class().remote(
        [lambda: gym.make("CartPole-v1")] * 2, autoreset_mode="NextStep")
    try:
        ray.get(host.start.remote())
        with pytest.raises(ValueError, match=r"existing actor 0 serves autoreset_mode="
                                             r"'NextStep'.*asked for 'SameStep'"):
            RemoteVectorEnv.from_actors([host], autoreset_mode="SameStep")
        envs = RemoteVectorEnv.from_actors([host], autoreset_mode="NextStep")
        assert envs.reset(seed=0)[0].shape == (2, 4)
        envs.close()
    finally:
        ray.kill(host)
