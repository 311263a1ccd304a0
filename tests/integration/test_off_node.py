"""Actors on another node than the driver's: stepped over the channel's TCP path
(issue 30), on a real two-raylet Ray cluster on this machine (ray.cluster_utils).

What Ray calls gave before is the reference: the same seeds and actions give the same
results over TCP, image observations included (raw buffers), and a lost actor is
still a truncated step with an error, then a replacement.
"""

from __future__ import annotations

import functools
import os
import signal
from collections.abc import Iterator
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import ray
from ray.cluster_utils import Cluster
from ray_checks import wait_for

from remote_env import examples
from remote_env.driver.vector import RemoteVectorEnv

OFF = {"num_cpus": 0, "resources": {"other_node": 1}}


@pytest.fixture(scope="module")
def two_nodes() -> Iterator[Any]:
    if ray.is_initialized():
        ray.shutdown()
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    other = cluster.add_node(num_cpus=1, resources={"other_node": 8})
    ray.init(address=cluster.address)
    cluster.wait_for_nodes()
    try:
        yield other
    finally:
        ray.shutdown()
        cluster.shutdown()


def _node_of(handle: Any) -> str:
    return str(ray.get(handle.__ray_call__.remote(
        lambda _self: ray.get_runtime_context().get_node_id())))


def _run(envs: RemoteVectorEnv, steps: int) -> list[tuple[Any, ...]]:
    out = [envs.reset(seed=7)[0].copy()]
    rng = np.random.default_rng(0)
    for _ in range(steps):
        acts = rng.integers(0, 2, size=envs.num_envs)
        obs, rew, term, trunc, _ = envs.step(acts)
        out.append((obs.copy(), rew.copy(), term.copy(), trunc.copy()))
    return out


@pytest.mark.parametrize("env", ["cartpole", "image"])
def test_off_node_actors_step_over_tcp_as_ray_calls_would(two_nodes: Any, env: str) -> None:
    make = (functools.partial(gym.make, "CartPole-v1") if env == "cartpole"
            else examples.ImageEnv)
    got = {}
    for transport in ("auto", "ray"):
        envs = RemoteVectorEnv([make] * 4, envs_per_actor=2, actor_options=OFF,
                               transport=transport)
        try:
            assert {_node_of(a) for a in envs.actors} == {two_nodes.node_id}
            got[transport] = _run(envs, 30)
            paths = [(h.channel, h.shared, h.tcp) for h in envs.hosts()]
            want = (True, False, True) if transport == "auto" else (False, False, False)
            assert paths == [want] * 2, paths  # TCP off-node: no shared memory there
        finally:
            envs.close()
    for a, b in zip(got["auto"], got["ray"], strict=True):
        for x, y in zip(a if isinstance(a, tuple) else (a,),
                        b if isinstance(b, tuple) else (b,), strict=True):
            np.testing.assert_array_equal(x, y)


def test_an_off_node_actor_killed_mid_run_is_a_truncated_step_then_replaced(
        two_nodes: Any) -> None:
    envs = RemoteVectorEnv([functools.partial(gym.make, "CartPole-v1")] * 4, envs_per_actor=2,
                           actor_options=OFF, restart_failed_sub_environments=True,
                           step_timeout_s=30)
    try:
        envs.reset(seed=0)
        envs.step(np.zeros(4, dtype=np.int64))
        assert all(h.tcp for h in envs.hosts())
        victim = envs.actors[0]
        os.kill(ray.get(victim.ping.remote()), signal.SIGKILL)  # the socket's EOF
        cut: set[int] = set()

        def stepped_past_it() -> bool:
            _, _, _, trunc, info = envs.step(np.zeros(4, dtype=np.int64))
            for e in np.flatnonzero(trunc).tolist():
                assert str(info["error"][e]).startswith("actor_died"), info
                cut.add(e)
            return cut == {0, 1} and all(h.up for h in envs.hosts())

        wait_for(stepped_past_it, 60, "the lost actor's envs truncated, then replaced")
        assert envs.actors[0] is not victim
        for _ in range(3):  # its first call goes through Ray while its start is checked
            obs, *_ = envs.step(np.ones(4, dtype=np.int64))
        assert obs.shape == (4, 4)
        assert all(h.tcp for h in envs.hosts()), "the replacement is reached over TCP too"
    finally:
        envs.close()
