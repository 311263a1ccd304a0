"""Stable-Baselines3 through ``remote_env.sb3.SB3VecEnv`` (issue #33), on real Ray.

The adapter must give what ``DummyVecEnv`` gives for the same seeds and actions, step
for step (observations, rewards, dones, infos with ``terminal_observation``), whatever
autoreset mode the vector env runs in, and PPO must train through it.
"""

from __future__ import annotations

import functools
import sys
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import ray.cloudpickle
from gymnasium.vector import AutoresetMode
from stable_baselines3 import PPO
from stable_baselines3.common.monitor import Monitor
from stable_baselines3.common.vec_env import DummyVecEnv, VecMonitor

from remote_env.driver.vector import RemoteVectorEnv
from remote_env.errors import ClosedEnvironmentError
from remote_env.sb3 import SB3VecEnv

# the make-env functions below reach the actors by value (no PYTHONPATH there)
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

pytestmark = pytest.mark.usefixtures("ray_local")


def _cartpole(max_steps: int) -> gym.Env[Any, Any]:
    """Short episodes (many ends to compare) and infos at their ends (nested dicts)."""
    return gym.wrappers.RecordEpisodeStatistics(
        gym.make("CartPole-v1", max_episode_steps=max_steps))


def _dict_cartpole(max_steps: int) -> gym.Env[Any, Any]:
    """The same with a Dict observation space (SB3's MultiInputPolicy case)."""
    env = _cartpole(max_steps)
    box = env.observation_space
    space = gym.spaces.Dict({"pos": gym.spaces.Box(box.low[:2], box.high[:2]),
                             "vel": gym.spaces.Box(box.low[2:], box.high[2:])})
    return gym.wrappers.TransformObservation(
        env, lambda o: {"pos": o[:2], "vel": o[2:]}, space)


def _drop_times(info: dict[str, Any]) -> dict[str, Any]:
    """An info without the episode's wall time (it differs run to run)."""
    out = dict(info)
    if "episode" in out:
        out["episode"] = {k: v for k, v in out["episode"].items() if k != "t"}
    return out


def _assert_same_info(got: dict[str, Any], want: dict[str, Any], where: Any) -> None:
    got, want = _drop_times(got), _drop_times(want)
    assert set(got) == set(want), (where, got, want)
    for k in want:
        if k == "terminal_observation" and isinstance(want[k], dict):
            assert set(got[k]) == set(want[k]), where
            for part in want[k]:
                np.testing.assert_array_equal(got[k][part], want[k][part], err_msg=str(where))
        elif k == "terminal_observation":
            np.testing.assert_array_equal(got[k], want[k], err_msg=str(where))
        else:
            assert got[k] == want[k], (where, k, got[k], want[k])


def _same_obs(got: Any, want: Any, where: Any) -> None:
    if isinstance(want, dict):
        assert list(got) == list(want), where
        for k in want:
            _same_obs(got[k], want[k], where)
        return
    np.testing.assert_array_equal(got, want, err_msg=str(where))
    assert got.dtype == want.dtype, where


@pytest.mark.parametrize("make", [_cartpole, _dict_cartpole], ids=["box", "dict"])
@pytest.mark.parametrize("mode", [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP,
                                  AutoresetMode.DISABLED])
def test_adapter_equals_dummy_vec_env_step_for_step(mode: AutoresetMode, make: Any) -> None:
    n, steps = 6, 120
    fns = [functools.partial(make, 9 + 3 * i) for i in range(n)]
    dummy = DummyVecEnv(list(fns))
    remote = SB3VecEnv(RemoteVectorEnv(fns, envs_per_actor=3, autoreset_mode=mode))
    try:
        assert remote.observation_space == dummy.observation_space
        assert remote.action_space == dummy.action_space
        assert remote.seed(7) == dummy.seed(7)
        _same_obs(remote.reset(), dummy.reset(), "reset")
        assert remote.reset_infos == dummy.reset_infos
        rng = np.random.default_rng(0)
        ends = 0
        for t in range(steps):
            actions = rng.integers(0, 2, size=n)
            o1, r1, d1, i1 = remote.step(actions)
            o2, r2, d2, i2 = dummy.step(actions)
            _same_obs(o1, o2, f"step {t}")
            assert r1.dtype == r2.dtype and d1.dtype == d2.dtype
            np.testing.assert_array_equal(r1, r2)
            np.testing.assert_array_equal(d1, d2)
            for e in range(n):
                _assert_same_info(i1[e], i2[e], (t, e))
            assert remote.reset_infos == dummy.reset_infos
            ends += int(d2.sum())
        assert ends > 30  # the comparison saw many episode ends, in every env
    finally:
        remote.close()
        dummy.close()


def test_attributes_and_methods_on_indices() -> None:
    fns = [functools.partial(_cartpole, 20)] * 5
    remote = SB3VecEnv(fns, envs_per_actor=2)
    try:
        remote.reset()
        assert remote.get_attr("gravity") == [9.8] * 5
        remote.set_attr("gravity", 3.0, indices=[1, 4])
        assert remote.get_attr("gravity") == [9.8, 3.0, 9.8, 9.8, 3.0]
        assert remote.get_attr("gravity", indices=[4, 0]) == [3.0, 9.8]
        assert remote.get_attr("gravity", indices=2) == [9.8]
        assert remote.env_method("get_wrapper_attr", "gravity", indices=[1, 2]) == [3.0, 9.8]
        assert remote.env_method("reset", indices=[3], seed=5)[0][0].shape == (4,)
        assert remote.env_is_wrapped(gym.wrappers.RecordEpisodeStatistics) == [True] * 5
        assert remote.env_is_wrapped(Monitor, indices=[0, 3]) == [False, False]
        assert remote.get_attr("gravity", indices=[]) == []
        assert remote.render_mode is None and remote.get_images() == [None] * 5
        with pytest.raises(AttributeError):
            remote.get_attr("no_such_attribute", indices=[0])
    finally:
        remote.close()
    with pytest.raises(ClosedEnvironmentError):
        remote.get_attr("gravity")


class _Painted(gym.Wrapper[Any, Any, Any, Any]):
    """CartPole drawing a 4x6 frame of its own (CartPole's renderer needs pygame)."""

    metadata = {"render_modes": ["rgb_array"]}

    def __init__(self) -> None:
        super().__init__(gym.make("CartPole-v1"))
        self._render_mode = "rgb_array"

    @property
    def render_mode(self) -> str:
        return self._render_mode

    def render(self) -> np.ndarray:
        return np.full((4, 6, 3), 200, dtype=np.uint8)


def test_render_rgb_array_tiles_the_envs_images() -> None:
    remote = SB3VecEnv([_Painted] * 2, envs_per_actor=2)
    try:
        remote.reset()
        assert remote.render_mode == "rgb_array"
        images = remote.get_images()
        assert len(images) == 2 and images[0] is not None and images[0].shape == (4, 6, 3)
        assert remote.render("rgb_array").shape == (8, 6, 3)  # type: ignore[union-attr]
    finally:
        remote.close()


def test_reset_options_per_env_and_seeds_used_once() -> None:
    fns = [functools.partial(_cartpole, 20)] * 3
    dummy = DummyVecEnv(list(fns))
    remote = SB3VecEnv(fns, envs_per_actor=3)
    try:
        for venv in (remote, dummy):
            venv.seed(11)
            venv.set_options([{"low": -0.01, "high": 0.01}, {}, {"low": -0.2, "high": 0.2}])
        np.testing.assert_array_equal(remote.reset(), dummy.reset())
        assert remote._seeds == [None] * 3 and remote._options == [{}] * 3
        # unseeded now: both continue their generators, so still equal
        np.testing.assert_array_equal(remote.reset(), dummy.reset())
    finally:
        remote.close()
        dummy.close()


def test_multi_agent_envs_are_refused_clearly() -> None:
    from remote_env import examples

    envs = RemoteVectorEnv([examples.rps_parallel_env] * 2, envs_per_actor=2)
    try:
        with pytest.raises(TypeError, match="multi-agent"):
            SB3VecEnv(envs)
    finally:
        envs.close()


def test_ppo_trains_through_the_adapter() -> None:
    venv = VecMonitor(SB3VecEnv([functools.partial(gym.make, "CartPole-v1")] * 4,
                                envs_per_actor=2))
    try:
        model = PPO("MlpPolicy", venv, n_steps=64, batch_size=64, n_epochs=2, seed=0,
                    device="cpu")
        model.learn(total_timesteps=512)
        assert model.num_timesteps >= 512
        assert len(model.ep_info_buffer) > 0  # episodes ended and were counted
        obs = venv.reset()
        actions, _ = model.predict(obs, deterministic=True)
        assert actions.shape == (4,)
    finally:
        venv.close()
