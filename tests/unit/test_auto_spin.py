"""``spin_us="auto"``: what the driver asks its actors to spin, from the observations."""

from __future__ import annotations

import gymnasium as gym
import numpy as np

from remote_env.driver import options


def test_auto_spins_for_small_observations_and_not_for_frames() -> None:
    cartpole = gym.make("CartPole-v1").observation_space
    # 32 CartPole observations a call: 512 bytes, spun for
    assert options.auto_spin_us(cartpole, 32, 1) == options.AUTO_SPIN_US
    frame = gym.spaces.Box(0, 255, (84, 84, 4), np.uint8)  # 28,224 bytes
    assert options.auto_spin_us(frame, 2, 1) == options.AUTO_SPIN_US  # 56 KB a call
    assert options.auto_spin_us(frame, 8, 1) == 0.0  # 225 KB a call: the driver's core
    # the bytes of one call count: 8 envs in 4 splits are calls of 2
    assert options.auto_spin_us(frame, 8, 4) == options.AUTO_SPIN_US
    assert options.auto_spin_us(frame, 9, 4) == 0.0  # calls of up to 3: 85 KB
    # not a Box (pickled; its size unknown): spun for
    assert options.auto_spin_us(gym.spaces.Dict({"x": frame}), 8, 1) == options.AUTO_SPIN_US
