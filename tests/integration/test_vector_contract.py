"""gymnasium's VectorEnv contract where RemoteVectorEnv used to differ from SyncVectorEnv.

call/get_attr/set_attr through wrappers, np_random_seed, observation_mode, and
gymnasium's own vector wrappers on top, each compared with SyncVectorEnv.
"""

from __future__ import annotations

import functools
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import SyncVectorEnv
from gymnasium.wrappers import vector as vw
from test_vector_env import assert_tree_equal

from remote_env.driver.vector import RemoteVectorEnv

pytestmark = pytest.mark.usefixtures("ray_local")
TRANSPORTS = ["auto", "ray"]


def cartpole() -> Any:
    return functools.partial(gym.make, "CartPole-v1")


def pendulum() -> Any:
    return functools.partial(gym.make, "Pendulum-v1", max_episode_steps=30)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_attributes_go_through_wrappers_as_in_sync(transport: str) -> None:
    sync = SyncVectorEnv([cartpole()] * 3)
    remote = RemoteVectorEnv([cartpole()] * 3, envs_per_actor=2, transport=transport)
    try:
        assert remote.call("gravity") == sync.call("gravity") == (9.8, 9.8, 9.8)
        assert remote.get_attr("gravity") == sync.get_attr("gravity")
        for env in (sync, remote):
            env.set_attr("gravity", [20.0, 9.8, 1.0])
        assert remote.get_attr("gravity") == (20.0, 9.8, 1.0)
        # the physics changed (not an attribute on the TimeLimit wrapper): steps agree
        assert_tree_equal(remote.reset(seed=42), sync.reset(seed=42))
        assert remote.np_random_seed == sync.np_random_seed == (42, 43, 44)
        for t in range(30):
            a = np.array([t % 2, 1, 0])
            assert_tree_equal(remote.step(a), sync.step(a), f"step {t}")
        with pytest.raises(ValueError, match="Got `2` values for 3 environments"):
            remote.set_attr("gravity", [1.0, 2.0])
    finally:
        remote.close()
        sync.close()


def _raising() -> Any:
    """An env whose ``explode(kind)`` raises; defined here so Ray ships it by value."""

    class Unpicklable(Exception):
        def __init__(self, a: int, b: int) -> None:  # pickle calls it with one arg: fails
            super().__init__(f"{a}/{b}")

    class Raising(gym.Wrapper[Any, Any, Any, Any]):
        def __init__(self) -> None:
            super().__init__(gym.make("CartPole-v1"))

        def explode(self, kind: str) -> None:
            if kind == "key":
                raise KeyError("no such level")
            if kind == "reset":
                raise gym.error.ResetNeeded("reset first")
            raise Unpicklable(1, 2)

    return Raising


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_attribute_errors_are_the_envs_own_exceptions_as_in_sync(transport: str) -> None:
    sync = SyncVectorEnv([_raising()] * 3)
    remote = RemoteVectorEnv([_raising()] * 3, envs_per_actor=2, transport=transport)
    try:
        for env in (sync, remote):
            with pytest.raises(AttributeError, match="has no attribute 'no_such_attr'"):
                env.get_attr("no_such_attr")
            with pytest.raises(AttributeError, match="has no attribute 'no_such_method'"):
                env.call("no_such_method", 1)
            with pytest.raises(KeyError, match="no such level"):
                env.call("explode", "key")
            with pytest.raises(gym.error.ResetNeeded, match="reset first"):
                env.call("explode", "reset")
        # an exception that cannot be rebuilt here still says what and where
        with pytest.raises(Exception, match=r"Unpicklable: 1/2") as info:
            remote.call("explode", "other")
        assert "explode" in str(getattr(info.value, "remote_traceback", info.value))
        # nothing left behind: the next calls and steps are answered as Sync's
        assert remote.get_attr("gravity") == sync.get_attr("gravity")
        assert_tree_equal(remote.reset(seed=3), sync.reset(seed=3))
        assert_tree_equal(remote.step(np.array([1, 0, 1])), sync.step(np.array([1, 0, 1])))
    finally:
        remote.close()
        sync.close()


def test_a_with_block_closes_the_envs_and_their_actors() -> None:
    from ray_checks import alive_actor_ids, wait_for

    before = alive_actor_ids()
    with RemoteVectorEnv([cartpole()] * 2, envs_per_actor=1) as envs:
        assert len(alive_actor_ids() - before) == 2
        envs.reset(seed=0)
        assert envs.step(np.array([0, 1]))[1].tolist() == [1.0, 1.0]
    assert envs.closed
    # the block's end kills what it created, as close() does
    wait_for(lambda: alive_actor_ids() <= before, what="no actors left after the with block")
    with pytest.raises(KeyError), RemoteVectorEnv([cartpole()], envs_per_actor=1) as envs:
        raise KeyError("the block's error propagates")
    assert envs.closed


def _boxes(lows: list[float]) -> list[Any]:
    class Shifted(gym.ObservationWrapper[Any, Any, Any]):
        def __init__(self, low: float) -> None:
            super().__init__(gym.make("Pendulum-v1", max_episode_steps=30))
            self.observation_space = gym.spaces.Box(low, 10.0, (3,), np.float32)

        def observation(self, obs: Any) -> Any:
            return obs

    return [functools.partial(Shifted, low) for low in lows]


def test_observation_mode_as_sync() -> None:
    fns = _boxes([-1.0, -2.0, -3.0])
    with pytest.raises(RuntimeError, match="observation_mode='different'"):
        RemoteVectorEnv(fns, envs_per_actor=3)
    sync = SyncVectorEnv(fns, observation_mode="different")
    remote = RemoteVectorEnv(fns, envs_per_actor=2, observation_mode="different")
    try:
        assert remote.observation_space == sync.observation_space
        assert remote.single_observation_space == sync.single_observation_space
        assert remote.observation_mode == "different"
        assert_tree_equal(remote.reset(seed=0), sync.reset(seed=0))
    finally:
        remote.close()
        sync.close()
    single = gym.spaces.Box(-5.0, 10.0, (3,), np.float32)
    custom = (gym.vector.utils.batch_space(single, 3), single)
    remote = RemoteVectorEnv(fns, envs_per_actor=3, observation_mode=custom)
    try:
        assert remote.single_observation_space == single
        assert remote.observation_space == custom[0]
    finally:
        remote.close()
    with pytest.raises(ValueError, match="Invalid `observation_mode`"):
        RemoteVectorEnv(fns, observation_mode="similar")
    with pytest.raises(TypeError, match="both elements of observation_mode to be Spaces"):
        RemoteVectorEnv(fns, observation_mode=(single, "x"))  # type: ignore[arg-type]


WRAPPERS: dict[str, Any] = {
    "RecordEpisodeStatistics": (cartpole, vw.RecordEpisodeStatistics),
    "NormalizeObservation": (cartpole, vw.NormalizeObservation),
    "NormalizeReward": (pendulum, vw.NormalizeReward),
    "TransformObservation": (
        cartpole, lambda env: vw.TransformObservation(env, lambda obs: obs * 2.0)),
    "TransformReward": (pendulum, lambda env: vw.TransformReward(env, lambda r: r - 1.0)),
    "ClipAction": (pendulum, vw.ClipAction),
    "RescaleAction": (pendulum, lambda env: vw.RescaleAction(env, -1.0, 1.0)),
    "FlattenObservation": (cartpole, vw.FlattenObservation),
    "DtypeObservation": (cartpole, lambda env: vw.DtypeObservation(env, np.float64)),
}


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("name", list(WRAPPERS))
def test_gymnasium_vector_wrappers_work_on_top_as_on_sync(name: str, transport: str) -> None:
    make, wrap = WRAPPERS[name]
    sync = wrap(SyncVectorEnv([make()] * 4))
    remote = wrap(RemoteVectorEnv([make()] * 4, envs_per_actor=2, transport=transport))
    try:
        assert remote.observation_space == sync.observation_space
        assert remote.action_space == sync.action_space
        assert_tree_equal(remote.reset(seed=5), sync.reset(seed=5), "reset")
        sync.action_space.seed(0)
        for t in range(60):
            a = sync.action_space.sample()
            r, s = remote.step(a), sync.step(a)
            if name == "RecordEpisodeStatistics":  # episode times are wall-clock
                for info in (r[4], s[4]):
                    info.get("episode", {}).pop("t", None)
            assert_tree_equal(r, s, f"step {t}")
    finally:
        remote.close()
        sync.close()
