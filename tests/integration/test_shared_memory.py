"""The shared-memory data path on real Ray: used where it fits, exact, and leak-free.

The fault, contract and equivalence suites run on this path too (it is the default
transport); these tests check that it is really taken, what falls back, and that no
segment outlives a close or a SIGKILLed actor.
"""

from __future__ import annotations

import functools
import os
import signal
import sys
import time
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import ray.cloudpickle
from ray_checks import assert_same_step, wait_for

from remote_env import examples
from remote_env.driver.vector import RemoteVectorEnv
from remote_env.wire import shared_arrays

pytestmark = pytest.mark.usefixtures("ray_local")
# the env below is defined here: ship it to the actors by value
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


def _segments() -> set[str]:
    return {f for f in os.listdir(shared_arrays.SHM_DIR) if f.startswith(shared_arrays.PREFIX)}


def _mapped(pid: int) -> list[str]:
    """Our segments still mapped by process ``pid`` (``/dev/shm/envpool-... (deleted)``)."""
    with open(f"/proc/{pid}/maps") as f:
        return [line for line in f if "/dev/shm/" + shared_arrays.PREFIX in line]


class _DictObs(gym.ObservationWrapper[Any, Any, Any]):
    def __init__(self) -> None:
        super().__init__(gym.make("CartPole-v1"))
        self.observation_space = gym.spaces.Dict({"x": self.env.observation_space})

    def observation(self, observation: Any) -> Any:
        return {"x": observation}


@pytest.mark.parametrize("spin_us", [0.0, 500.0])
def test_box_envs_step_through_shared_memory_with_exact_infos(spin_us: float) -> None:
    n = 6
    remote = RemoteVectorEnv([examples.SparseInfoCartPole] * n, envs_per_actor=3,
                             spin_us=spin_us)
    sync = gym.vector.SyncVectorEnv([examples.SparseInfoCartPole] * n)
    try:
        np.testing.assert_array_equal(remote.reset(seed=5)[0], sync.reset(seed=5)[0])
        rng = np.random.default_rng(1)
        for _ in range(120):
            a = rng.integers(0, 2, size=n)
            assert_same_step(remote.step(a), sync.step(a))
        assert all(h.shared for h in remote.hosts())
        assert not _segments()  # mapped by both ends, the names are gone
    finally:
        remote.close()
        sync.close()


def test_dict_observations_and_pickle_transport_keep_the_socket() -> None:
    dict_obs = RemoteVectorEnv([_DictObs] * 2, envs_per_actor=2)
    pickled = RemoteVectorEnv([functools.partial(gym.make, "CartPole-v1")] * 2,
                              envs_per_actor=2, transport="pickle")
    try:
        for envs in (dict_obs, pickled):
            envs.reset(seed=0)
            envs.step(np.zeros(2, dtype=np.int64))
            assert [h.channel for h in envs.hosts()] == [True]
            assert [h.shared for h in envs.hosts()] == [False]
        assert dict_obs.step(np.zeros(2, dtype=np.int64))[0]["x"].shape == (2, 4)
    finally:
        dict_obs.close()
        pickled.close()


def test_no_segment_survives_a_sigkilled_actor_or_close() -> None:
    envs = RemoteVectorEnv([functools.partial(gym.make, "CartPole-v1")] * 4, envs_per_actor=2,
                           restart_failed_sub_environments=True)
    try:
        envs.reset(seed=0)
        envs.step(np.zeros(4, dtype=np.int64))
        pid = envs._ray.get(envs.actors[0].ping.remote())
        assert len(_mapped(pid)) == 1 and not _segments()
        os.kill(pid, signal.SIGKILL)
        # the lost actor's envs come back truncated; the replacement gets new arrays
        _, _, _, trunc, info = envs.step(np.zeros(4, dtype=np.int64))
        assert trunc[:2].all() and "actor_died" in info["error"][0]
        for _ in range(5):
            envs.step(np.ones(4, dtype=np.int64))
        assert envs.hosts()[0].shared and envs.restart_counts.tolist() == [1, 1, 0, 0]
        new_pid = envs._ray.get(envs.actors[0].ping.remote())
        assert new_pid != pid and len(_mapped(new_pid)) == 1
        assert not _segments()
        assert len(_mapped(os.getpid())) == 2  # one per live actor: the dead one's is gone
    finally:
        envs.close()
    assert not _segments() and not _mapped(os.getpid())


def test_an_actor_it_does_not_own_unmaps_when_the_driver_closes() -> None:
    host_cls = RemoteVectorEnv.host_class()
    actor = host_cls.remote([functools.partial(gym.make, "CartPole-v1")] * 2)
    try:
        envs = RemoteVectorEnv([functools.partial(gym.make, "CartPole-v1")] * 2,
                               existing_actors=[actor])
        envs.reset(seed=0)
        envs.step(np.zeros(2, dtype=np.int64))
        pid = envs._ray.get(actor.ping.remote())
        assert len(_mapped(pid)) == 1
        envs.close()
        # the actor lives on (not ours to kill) but lets go of that driver's arrays
        wait_for(lambda: not _mapped(pid), timeout=10, what="the actor to unmap")
        assert not _segments()
    finally:
        envs._ray.kill(actor)


def test_a_spinning_actor_stops_spinning_when_the_driver_pauses() -> None:
    """spin_us is a bound: an actor whose driver thinks (a learner update) sleeps."""
    remote = RemoteVectorEnv([examples.SparseInfoCartPole] * 2, envs_per_actor=2,
                             spin_us=20_000.0)
    try:
        remote.reset(seed=0)
        remote.step(np.zeros(2, dtype=np.int64))
        pid = remote._ray.get(remote.actors[0].ping.remote())

        def cpu_s() -> float:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

        time.sleep(0.1)  # past the spin after the last call
        before = cpu_s()
        time.sleep(1.0)  # the driver "thinks" for a second
        assert cpu_s() - before < 0.3  # asleep, not a second of spinning
        remote.step(np.zeros(2, dtype=np.int64))  # and it still answers
    finally:
        remote.close()
