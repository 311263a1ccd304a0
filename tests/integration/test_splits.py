"""``splits_per_actor`` on real Ray: an actor's envs as several calls in flight.

An actor answers its calls in order, so it steps one split while the driver handles
another's reply (Sample Factory's double-buffered sampling). These tests check that
results stay exactly SyncVectorEnv's, that the first split really comes back before
the last is stepped, and that faults stay per env and per actor with calls of one
actor in flight together.
"""

from __future__ import annotations

import functools
import os
import signal
import time
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from prometheus_client import CollectorRegistry
from ray_checks import assert_same_step

from remote_env import examples
from remote_env.driver.vector import RemoteVectorEnv

pytestmark = pytest.mark.usefixtures("ray_local")
TRANSPORTS = ["auto", "ray"]


def _count(reg: CollectorRegistry, name: str) -> float:
    return reg.get_sample_value(name, {"pool": "default"}) or 0.0


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_splits_step_exactly_as_sync_and_send_one_call_per_split(transport: str) -> None:
    n = 10  # two actors of 5: splits of 3 and 2 envs
    remote = RemoteVectorEnv([examples.SparseInfoCartPole] * n, envs_per_actor=5,
                             splits_per_actor=2, transport=transport)
    sync = gym.vector.SyncVectorEnv([examples.SparseInfoCartPole] * n)
    try:
        np.testing.assert_array_equal(remote.reset(seed=3)[0], sync.reset(seed=3)[0])
        rng = np.random.default_rng(0)
        for _ in range(80):  # episodes end on the way: autoreset crosses splits
            a = rng.integers(0, 2, size=n)
            assert_same_step(remote.step(a), sync.step(a))
        remote.send(np.zeros(n, dtype=np.int64))
        assert len(remote.in_flight()) == 4  # 2 actors x 2 splits
        assert sorted(len(c.env_ids) for c in remote.in_flight()) == [2, 2, 3, 3]
        seen: list[int] = []
        while len(seen) < n:
            seen += remote.recv(timeout=30)[4]["env_id"].tolist()
        assert sorted(seen) == list(range(n))
        # a send that regroups ids across splits still goes as one call per split
        remote.send(np.zeros(3, dtype=np.int64), [7, 1, 2])
        assert sorted(c.env_ids.tolist() for c in remote.in_flight()) == [[1, 2], [7]]
        got_ids: list[int] = []
        while remote.in_flight():
            got_ids += remote.recv(timeout=30)[4]["env_id"].tolist()
        assert sorted(got_ids) == [1, 2, 7]
    finally:
        remote.close()
        sync.close()


def test_an_actor_answers_its_first_split_before_it_steps_the_next() -> None:
    # one actor of 4 envs that each take 0.25 s a step: 0.5 s per split
    slow = functools.partial(examples.make_slow_cartpole, 250.0)
    envs = RemoteVectorEnv([slow] * 4, envs_per_actor=4, splits_per_actor=2,
                           batch_wait_ms=0.0)
    try:
        envs.reset(seed=0)
        t0 = time.perf_counter()
        envs.send(np.zeros(4, dtype=np.int64))
        first = envs.recv(timeout=30)[4]["env_id"].tolist()
        t_first = time.perf_counter() - t0
        second = envs.recv(timeout=30)[4]["env_id"].tolist()
        t_second = time.perf_counter() - t0
        assert first == [0, 1] and second == [2, 3]
        # the first split came back while the actor stepped the second
        assert t_first < 0.9 and t_second >= 0.95, (t_first, t_second)
    finally:
        envs.close()


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_sigkilled_actor_with_both_splits_in_flight_is_replaced_once(transport: str) -> None:
    reg = CollectorRegistry()
    envs = RemoteVectorEnv([functools.partial(gym.make, "CartPole-v1")] * 8, envs_per_actor=4,
                           splits_per_actor=2, transport=transport, registry=reg,
                           restart_failed_sub_environments=True)
    try:
        envs.reset(seed=0)
        envs.step(np.zeros(8, dtype=np.int64))
        pid = envs._ray.get(envs.actors[0].ping.remote())
        os.kill(pid, signal.SIGKILL)
        _, _, term, trunc, info = envs.step(np.zeros(8, dtype=np.int64))
        # both splits of the lost actor end truncated; the other actor's envs step on
        assert trunc[:4].all() and not term[:4].any()
        assert all("actor_died" in info["error"][i] for i in range(4))
        assert not info["_error"][4:].any()
        for _ in range(5):
            envs.step(np.ones(8, dtype=np.int64))
        assert envs.restart_counts.tolist() == [1, 1, 1, 1, 0, 0, 0, 0]
        assert _count(reg, "envpool_actor_restarts_total") == 1  # not once per split
        assert envs._ray.get(envs.actors[0].ping.remote()) != pid
    finally:
        envs.close()


def test_an_env_raising_in_one_split_leaves_the_other_split_alone(tmp_path: Any) -> None:
    once = str(tmp_path / "fault")
    faulty = functools.partial(examples.FaultyEnv, fail_at_step=3, once_file=once)
    cartpole = functools.partial(gym.make, "CartPole-v1")
    envs = RemoteVectorEnv([cartpole, cartpole, cartpole, faulty], envs_per_actor=4,
                           splits_per_actor=2, restart_failed_sub_environments=True)
    sync = gym.vector.SyncVectorEnv([cartpole] * 3)
    try:
        np.testing.assert_array_equal(envs.reset(seed=0)[0][:3], sync.reset(seed=0)[0])
        for step in range(1, 6):
            a = np.ones(4, dtype=np.int64)
            obs, _, _, trunc, info = envs.step(a)
            want = sync.step(a[:3])
            np.testing.assert_array_equal(obs[:3], want[0])  # env 3's split-mate too
            if step == 3:
                assert trunc[3] and "injected failure at step 3" in info["error"][3]
                assert not info["_error"][:3].any() and not trunc[:3].any()
        assert envs.restart_counts.tolist() == [0, 0, 0, 1]
    finally:
        envs.close()
        sync.close()
