"""Self-tuning defaults on real Ray (2 CPUs): what a vector env with no tuning
arguments picks, that given values win, and that the picked layout steps exactly as
``SyncVectorEnv`` (the rule itself: tests/unit/test_tuning.py)."""

from __future__ import annotations

import functools

import gymnasium as gym
import numpy as np
import pytest
from ray_checks import assert_same_step

from remote_env import examples
from remote_env.driver.vector import RemoteVectorEnv

pytestmark = pytest.mark.usefixtures("ray_local")


def test_frames_get_one_actor_in_two_splits_and_step_as_sync() -> None:
    n = 16
    remote = RemoteVectorEnv([examples.ImageEnv] * n, batch_wait_ms=0)
    sync = gym.vector.SyncVectorEnv([examples.ImageEnv] * n)
    try:
        assert (len(remote.actors), remote.envs_per_actor, remote.splits_per_actor,
                remote.spin_us) == (1, 16, 2, 0.0)
        assert "a core left to the driver" in remote.tuning.why
        assert "splits_per_actor=2" in repr(remote) and "obs 27.6 KiB" in repr(remote)
        np.testing.assert_array_equal(remote.reset(seed=1)[0], sync.reset(seed=1)[0])
        rng = np.random.default_rng(0)
        for _ in range(5):
            a = rng.integers(0, 4, size=n)
            assert_same_step(remote.step(a), sync.step(a))
    finally:
        remote.close()
        sync.close()


def test_expensive_envs_keep_an_actor_per_core() -> None:
    remote = RemoteVectorEnv([functools.partial(examples.BusyCartPole, 1.0)] * 4,
                             batch_wait_ms=0)
    try:
        assert (len(remote.actors), remote.splits_per_actor) == (2, 1)
    finally:
        remote.close()


def test_given_values_win_and_skip_the_measuring() -> None:
    fns = [examples.ImageEnv] * 16
    for kwargs, want in [
        ({"envs_per_actor": 8}, (2, 8, 1, 0.0, "not measured: envs_per_actor given")),
        ({"transport": "ray"}, (2, 8, 1, 0.0, "not measured: transport='ray'")),
        ({"splits_per_actor": 4, "spin_us": "auto"}, (1, 16, 4, "auto", "given: splits")),
        # the default batch_wait_ms (2): recv gathers the splits; the layout of before
        ({"batch_wait_ms": 2}, (2, 8, 1, 0.0, "not measured: batch_wait_ms=2")),
    ]:
        remote = RemoteVectorEnv(fns, **{"batch_wait_ms": 0, **kwargs})  # type: ignore[arg-type]
        try:
            got = (len(remote.actors), remote.envs_per_actor, remote.splits_per_actor,
                   remote.spin_us)
            assert got == want[:4], kwargs
            assert want[4] in remote.tuning.why, remote.tuning.why
        finally:
            remote.close()


def test_no_arguments_is_batch_wait_0_and_the_tuned_layout() -> None:
    """The defaults (issue 34): recv() waits for no more than the first call to finish,
    so the picked layout applies with no flags; step() still returns every env, and
    recv() returns one split's envs while the other split steps."""
    n = 16
    remote = RemoteVectorEnv([examples.ImageEnv] * n)
    sync = gym.vector.SyncVectorEnv([examples.ImageEnv] * n)
    try:
        assert remote.batch_wait_ms == 0.0
        assert (len(remote.actors), remote.envs_per_actor, remote.splits_per_actor) == (1, 16, 2)
        assert "a core left to the driver" in remote.tuning.why
        np.testing.assert_array_equal(remote.reset(seed=3)[0], sync.reset(seed=3)[0])
        rng = np.random.default_rng(1)
        for _ in range(3):
            a = rng.integers(0, 4, size=n)
            assert_same_step(remote.step(a), sync.step(a))  # all 16, as SyncVectorEnv
        sizes = []
        remote.send(rng.integers(0, 4, size=n))
        stepped = np.zeros(n, dtype=np.int64)
        for _ in range(60):
            ids = remote.recv()[4]["env_id"]
            assert list(ids) == sorted(ids) and len(ids)
            sizes.append(len(ids))
            stepped[ids] += 1
            remote.send(rng.integers(0, 4, size=len(ids)), ids)
        # every env kept stepping, and the splits came back apart (a wait gathers them)
        assert stepped.min() >= 1, stepped
        assert min(sizes) < n, sizes
    finally:
        remote.close()
        sync.close()
