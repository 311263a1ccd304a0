"""Self-tuning defaults: the pure rule (:func:`tuning.choose`) and the probe on real envs."""

from __future__ import annotations

import functools
from typing import Any

import gymnasium as gym
import numpy as np
import pytest

from remote_env import examples
from remote_env.driver import tuning
from remote_env.driver.tuning import Measured

FRAME = 84 * 84 * 4  # bytes of an Atari-sized uint8 observation
CARTPOLE = 4 * 4  # Box(4,) float32


def test_frames_leave_the_driver_a_core_and_split_the_actor() -> None:
    """image 84x84x4, 16 envs, 2 cores: one actor of 16 in two splits (README round 4:
    66-68k steps/s against 42-48k for two actors of 8)."""
    t = tuning.choose(Measured(cores=2, num_envs=16, step_us=10.5, obs_bytes=FRAME))
    assert (t.envs_per_actor, t.splits_per_actor, t.spin_us) == (16, 2, 0.0)
    assert "a core left to the driver" in t.why


def test_cheap_small_envs_leave_the_driver_a_core_too() -> None:
    """CartPole's step is as cheap as the driver's share of it: 64 envs, 2 cores."""
    t = tuning.choose(Measured(cores=2, num_envs=64, step_us=4.0, obs_bytes=CARTPOLE))
    assert (t.envs_per_actor, t.splits_per_actor) == (64, 2)


def test_expensive_envs_get_an_actor_per_core_in_one_call() -> None:
    """A 1 ms step: the driver is idle most of the time; a core left to it would be lost."""
    t = tuning.choose(Measured(cores=2, num_envs=8, step_us=1000.0, obs_bytes=CARTPOLE))
    assert (t.envs_per_actor, t.splits_per_actor, t.spin_us) == (4, 1, 0.0)
    assert "<" in t.why and "a core left" not in t.why
    # an Atari-like frame with a physics-heavy step (300 us): still one actor per core
    atari = tuning.choose(Measured(cores=2, num_envs=16, step_us=300.0, obs_bytes=FRAME))
    assert (atari.envs_per_actor, atari.splits_per_actor) == (8, 1)


def test_more_cores_lower_the_share_the_driver_needs() -> None:
    """16 cores: the driver is one process beside 16 actors; a 1/17 share already binds."""
    t = tuning.choose(Measured(cores=16, num_envs=256, step_us=40.0, obs_bytes=CARTPOLE))
    assert t.envs_per_actor == 18  # 15 actors (ceil(256 / 15))
    assert t.splits_per_actor == 2
    heavy = tuning.choose(Measured(cores=16, num_envs=256, step_us=400.0, obs_bytes=CARTPOLE))
    assert (heavy.envs_per_actor, heavy.splits_per_actor) == (16, 1)


def test_a_batch_wait_keeps_one_actor_per_core() -> None:
    """recv gathers an actor's splits with batch_wait_ms > 0: they would not overlap."""
    m = Measured(cores=2, num_envs=64, step_us=4.0, obs_bytes=CARTPOLE)
    t = tuning.choose(m, batch_wait_ms=2.0)
    assert (t.envs_per_actor, t.splits_per_actor) == (32, 1)
    assert "not with batch_wait_ms=2" in t.why


def test_one_core_has_no_core_to_leave() -> None:
    t = tuning.choose(Measured(cores=1, num_envs=16, step_us=4.0, obs_bytes=FRAME))
    assert (t.envs_per_actor, t.splits_per_actor) == (16, 1)


def test_splits_keep_enough_envs_to_pay_for_their_call() -> None:
    """4 cheap envs in one actor: two splits of 2 would cost more calls than they overlap."""
    t = tuning.choose(Measured(cores=2, num_envs=4, step_us=4.0, obs_bytes=FRAME))
    assert (t.envs_per_actor, t.splits_per_actor) == (4, 1)
    assert tuning.min_split_envs(4.0) == tuning.MAX_MIN_SPLIT_ENVS
    assert tuning.min_split_envs(10.5) == 6  # 60 us of call / 10.5 us a step
    assert tuning.min_split_envs(1000.0) == 1


def test_fewer_envs_than_cores_is_one_env_per_actor() -> None:
    t = tuning.choose(Measured(cores=8, num_envs=3, step_us=1000.0, obs_bytes=CARTPOLE))
    assert (t.envs_per_actor, t.splits_per_actor) == (1, 1)


def test_given_values_win() -> None:
    m = Measured(cores=2, num_envs=16, step_us=10.5, obs_bytes=FRAME)
    t = tuning.choose(m, envs_per_actor=8, splits_per_actor=None, spin_us=None)
    # two actors of 8 on 2 cores: no spare core for the splits to overlap on
    assert (t.envs_per_actor, t.splits_per_actor, t.spin_us) == (8, 1, 0.0)
    assert "given: envs_per_actor" in t.why
    t = tuning.choose(m, splits_per_actor=4, spin_us="auto")
    assert (t.envs_per_actor, t.splits_per_actor, t.spin_us) == (16, 4, "auto")
    t = tuning.choose(m, envs_per_actor=4, splits_per_actor=1, spin_us=500.0)
    assert (t.envs_per_actor, t.splits_per_actor, t.spin_us) == (4, 1, 500.0)


def test_unmeasured_is_the_default_of_before() -> None:
    """Adopted actors, Ray calls, several nodes: one actor per core, one call, no spin."""
    t = tuning.choose(Measured(cores=4, num_envs=64, unmeasured="several nodes"))
    assert (t.envs_per_actor, t.splits_per_actor, t.spin_us) == (16, 1, 0.0)
    assert t.why == "not measured: several nodes"
    assert "4 actors x 16 envs, 1 split, spin_us=0" in t.describe(64)


def test_awaited_envs_get_two_actors_per_core() -> None:
    t = tuning.choose(Measured(cores=2, num_envs=64, step_us=0.0, awaited=True))
    assert (t.envs_per_actor, t.splits_per_actor) == (16, 1)


# ------------------------------------------------------------------ the probe
def test_probe_measures_a_real_env() -> None:
    m = tuning.probe(functools.partial(gym.make, "CartPole-v1"), cores=2, num_envs=8)
    assert m.step_us is not None and 0.0 < m.step_us < 50_000
    assert m.obs_bytes == CARTPOLE and not m.awaited
    img = tuning.probe(examples.ImageEnv, cores=2, num_envs=16)
    assert img.obs_bytes == FRAME


def test_probe_of_awaited_envs_says_so() -> None:
    m = tuning.probe(functools.partial(examples.make_async_slow_cartpole, 1.0), 2, 8)
    assert m.awaited


class _Raises(gym.Env[Any, Any]):
    observation_space = gym.spaces.Box(0, 1, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed: int | None = None, options: Any = None) -> Any:
        raise RuntimeError("needs the simulator on the actor's node")


def _broken() -> Any:
    raise OSError("no display")


@pytest.mark.parametrize(("fn", "says"), [
    (_Raises, "stepping an env here raised RuntimeError"),
    (_broken, "building an env here raised OSError"),
    (functools.partial(examples.rps_parallel_env, 3), "not a gym.Env"),
    (functools.partial(gym.make, "CartPole-v1", render_mode="human"), "render_mode='human'"),
])
def test_a_probe_that_cannot_measure_falls_back(fn: Any, says: str) -> None:
    m = tuning.probe(fn, cores=2, num_envs=8)
    assert m.step_us is None and says in m.unmeasured
    t = tuning.choose(m)
    assert (t.envs_per_actor, t.splits_per_actor) == (4, 1)


def test_obs_bytes_of_composite_spaces() -> None:
    box = gym.spaces.Box(0, 255, (84, 84, 4), np.uint8)
    assert tuning.obs_bytes(gym.spaces.Dict({"a": box, "b": gym.spaces.Discrete(3)})) == FRAME + 8
    assert tuning.obs_bytes(gym.spaces.Tuple((box, box))) == 2 * FRAME
    assert tuning.obs_bytes(gym.spaces.Text(5)) is None
