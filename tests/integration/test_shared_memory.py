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


def _recv_all(envs: RemoteVectorEnv, n: int) -> dict[int, tuple[Any, ...]]:
    """Every env's (obs, reward, terminated, truncated) of one round of recv()s, by id."""
    got: dict[int, tuple[Any, ...]] = {}
    while len(got) < n:
        obs, rew, term, trunc, info = envs.recv(timeout=30)
        for j, e in enumerate(info["env_id"].tolist()):
            got[e] = (obs[j].copy(), rew[j], term[j], trunc[j])
    return got


def test_copy_false_hands_out_views_of_the_segment_that_match_the_copies() -> None:
    """copy=False: recv() returns rows of the shared-memory batch, equal step for step to
    what copy=True returns; one split's rows survive the recv of the other, and are
    rewritten (the documented end of their validity) once their envs are sent again."""
    n = 4  # one actor of 4 in two splits of 2: two calls in flight
    kw: dict[str, Any] = {"envs_per_actor": 4, "splits_per_actor": 2, "batch_wait_ms": 0.0}
    views = RemoteVectorEnv([examples.SparseInfoCartPole] * n, copy=False, **kw)
    copies = RemoteVectorEnv([examples.SparseInfoCartPole] * n, **kw)
    try:
        assert not views.copy and copies.copy
        np.testing.assert_array_equal(views.reset(seed=9)[0], copies.reset(seed=9)[0])
        rng = np.random.default_rng(2)
        for _ in range(150):  # episodes end on the way: autoreset rows too
            a = rng.integers(0, 2, size=n)
            views.send(a)
            copies.send(a)
            got, want = _recv_all(views, n), _recv_all(copies, n)
            for e in range(n):
                for g, w in zip(got[e], want[e], strict=True):
                    np.testing.assert_array_equal(g, w)
        assert all(h.shared for h in views.hosts())

        # recv() at batch_wait_ms=0 returns what is ready with the first call to finish:
        # one split, or both merged into an array of its own when both had finished
        # before it looked (a loaded machine: a CI-like run failed on it here). Send
        # again until a recv returns one split, so two calls' rows are in flight.
        for _ in range(100):
            views.send(np.zeros(n, dtype=np.int64))
            first_obs, _, _, _, first_info = views.recv(timeout=30)
            first_ids = first_info["env_id"].tolist()
            if len(first_ids) < n:
                break
        assert len(first_ids) < n, "every recv() of 100 merged both splits"
        # a view, not an array of its own: the rows the actor wrote
        assert first_obs.base is not None and not first_obs.flags.owndata
        kept = first_obs.copy()
        second_obs, _, _, _, second_info = views.recv(timeout=30)
        second_ids = second_info["env_id"].tolist()
        assert sorted(first_ids + second_ids) == list(range(n))
        assert not np.shares_memory(first_obs, second_obs)
        np.testing.assert_array_equal(first_obs, kept)  # the other split's recv left it be
        # sending those envs again reuses their rows: the old view shows the new step
        views.send(np.ones(len(first_ids), dtype=np.int64), first_ids)
        again_obs, _, _, _, again_info = views.recv(timeout=30)
        assert again_info["env_id"].tolist() == first_ids
        assert np.shares_memory(again_obs, first_obs)
        np.testing.assert_array_equal(first_obs, again_obs)
        assert not np.array_equal(first_obs, kept)
        # copy=True hands out arrays of its own
        copies.send(np.zeros(n, dtype=np.int64))
        own = copies.recv(timeout=30)[0]
        assert own.flags.owndata
        _recv_all(copies, n - len(own))
    finally:
        views.close()
        copies.close()


def test_an_auto_spin_steps_exactly_and_an_idle_trainer_costs_its_actor_no_spinning() -> None:
    """spin_us="auto": the actors spin only while the calls come back-to-back."""
    n = 4
    remote = RemoteVectorEnv([examples.SparseInfoCartPole] * n, envs_per_actor=2,
                             spin_us="auto")
    sync = gym.vector.SyncVectorEnv([examples.SparseInfoCartPole] * n)
    try:
        assert remote.spin_us == "auto"
        np.testing.assert_array_equal(remote.reset(seed=4)[0], sync.reset(seed=4)[0])
        rng = np.random.default_rng(3)
        for _ in range(100):
            a = rng.integers(0, 2, size=n)
            assert_same_step(remote.step(a), sync.step(a))
        # the actors took the flag (a host that refused it would have no shared arrays)
        assert all(h.shared for h in remote.hosts())
        pids = remote._ray.get([a.ping.remote() for a in remote.actors])

        def cpu_s() -> float:
            total = 0.0
            for pid in pids:
                with open(f"/proc/{pid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
            return total

        # a trainer that paces its steps 50 ms apart: every gap is past the spin
        before = cpu_s()
        for _ in range(20):
            remote.step(np.zeros(n, dtype=np.int64))
            time.sleep(0.05)
        assert cpu_s() - before < 0.2  # 2 actors over ~1 s: stepping, not spinning
    finally:
        remote.close()
        sync.close()
