"""PettingZoo envs in RemoteVectorEnv (issue #33), on real Ray: Parallel envs as local
ones step for step, AEC envs converted (or refused clearly), envs that name their
agents only after a reset, and env ids of one type in actions and results."""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import pytest
from pettingzoo.test import parallel_api_test

from remote_env import checks, errors, examples
from remote_env.driver.vector import RemoteVectorEnv

AGENTS = {"player_0", "player_1"}


def test_example_env_passes_pettingzoos_parallel_api_test() -> None:
    parallel_api_test(examples.rps_parallel_env(5), num_cycles=20)
    parallel_api_test(examples.rps_parallel_env(5, render_mode="ansi"), num_cycles=20)
    env = examples.rps_parallel_env(2, render_mode="ansi")
    env.reset(seed=0)
    env.step({"player_0": 0, "player_1": 1})
    assert env.render() == "cycle 1: player_0: rock, player_1: paper"
    with pytest.raises(ValueError, match="render_mode"):
        examples.rps_parallel_env(render_mode="rgb_array")


def _moves(t: int, e: int) -> dict[str, int]:
    """Different actions per env and step, so a misrouted action shows."""
    return {"player_0": (t + e) % 3, "player_1": (2 * t + e // 2) % 3}


def _same_as_local(envs: RemoteVectorEnv, local: list[Any], steps: int) -> None:
    n = len(local)
    obs, infos = envs.reset(seed=0)
    for e in range(n):
        lo, li = local[e].reset(seed=e)
        assert obs[e] == lo and infos[e] == li
    reset_next = [False] * n
    for t in range(steps):
        acts = {e: _moves(t, e) for e in range(n)}
        obs, rew, term, trunc, _ = envs.step(acts)
        for e in range(n):
            if reset_next[e]:  # NEXT_STEP: this step reset the env
                want_obs, _ = local[e].reset()
                assert obs[e] == want_obs and rew[e] == dict.fromkeys(AGENTS, 0.0), (t, e)
                reset_next[e] = False
                continue
            lo, lr, lte, ltr, _ = local[e].step(acts[e])
            assert obs[e] == lo and rew[e] == lr, (t, e)
            assert {a: term[e][a] for a in lte} == lte and {a: trunc[e][a] for a in ltr} == ltr
            reset_next[e] = bool(trunc[e]["__all__"] or term[e]["__all__"])


def test_aec_env_is_converted_and_steps_as_the_parallel_env(ray_local: Any) -> None:
    envs = RemoteVectorEnv([functools.partial(examples.rps_aec_env, 3)] * 3, envs_per_actor=2)
    try:
        assert envs.multi_agent and set(envs.single_action_space.spaces) == AGENTS
        _same_as_local(envs, [examples.rps_parallel_env(3) for _ in range(3)], steps=9)
    finally:
        envs.close()


def test_aec_env_that_is_not_parallelizable_is_refused_clearly(ray_local: Any) -> None:
    fn = functools.partial(examples.rps_aec_env, 3, parallelizable=False)
    with pytest.raises(errors.SubEnvironmentError, match=r"AEC env.*is_parallelizable"):
        RemoteVectorEnv([fn] * 2, envs_per_actor=2)


def test_env_without_possible_agents_is_multi_agent_with_its_agents_after_reset(
        ray_local: Any) -> None:
    assert not hasattr(examples.AgentsAfterReset(), "possible_agents")
    envs = RemoteVectorEnv([functools.partial(examples.AgentsAfterReset, 3)] * 2,
                           envs_per_actor=2)
    try:
        assert envs.multi_agent
        assert set(envs.single_action_space.spaces) == AGENTS
        assert set(envs.single_observation_space.spaces) == AGENTS
        _same_as_local(envs, [examples.AgentsAfterReset(3) for _ in range(2)], steps=7)
    finally:
        envs.close()


def test_env_ids_are_ints_in_spaces_actions_and_results_and_route_by_key(
        ray_local: Any) -> None:
    n = 12  # str keys sort '10' before '2': the case that misrouted actions
    envs = RemoteVectorEnv([functools.partial(examples.rps_parallel_env, 50)] * n,
                           envs_per_actor=6)
    local = [examples.rps_parallel_env(50) for _ in range(n)]
    try:
        obs, _ = envs.reset(seed=0)
        for env in local:
            env.reset()
        assert list(envs.action_space.spaces) == list(range(n)) == list(obs)
        assert list(envs.observation_space.spaces) == list(range(n))
        sample = envs.action_space.sample()
        assert sample in envs.action_space and list(sample) == list(range(n))
        shuffled = {e: _moves(1, e) for e in reversed(range(n))}  # keys out of order
        obs, rew, _, _, _ = envs.step(shuffled)
        for e in range(n):
            lo, lr, _, _, _ = local[e].step(_moves(1, e))
            assert obs[e] == lo and rew[e] == lr, e
        # send/recv: a dict keyed by the ids sent
        envs.send({11: _moves(2, 11), 3: _moves(2, 3)}, [3, 11])
        got: dict[int, Any] = {}
        while len(got) < 2:
            o, _, _, _, info = envs.recv(timeout=30)
            got.update({int(e): o[int(e)] for e in info["env_id"]})
        assert got == {3: local[3].step(_moves(2, 3))[0], 11: local[11].step(_moves(2, 11))[0]}
        with pytest.raises(ValueError, match="do not name the env ids"):
            envs.send({0: _moves(0, 0), 1: _moves(0, 1)}, [4, 5])
    finally:
        envs.close()


def test_multi_agent_actions_are_taken_by_key() -> None:
    ids = np.array([10, 2])
    acts = checks.multi_agent_actions({2: {"a": 2}, 10: {"a": 10}}, 2, ids)
    assert acts == [{"a": 10}, {"a": 2}]
    legacy = checks.multi_agent_actions({"2": {"a": 2}, "10": {"a": 10}}, 2, ids)
    assert legacy == [{"a": 10}, {"a": 2}]
    assert checks.multi_agent_actions([{"a": 1}, {"a": 2}], 2, ids) == [{"a": 1}, {"a": 2}]


def test_render_mode_reaches_the_vector_env(ray_local: Any) -> None:
    fn = functools.partial(examples.rps_parallel_env, 3, render_mode="ansi")
    envs = RemoteVectorEnv([fn] * 2, envs_per_actor=2)
    try:
        assert envs.render_mode == "ansi"
        envs.reset(seed=0)
        envs.step({0: _moves(0, 0), 1: _moves(0, 1)})
        assert envs.render() == ("cycle 1: player_0: rock, player_1: rock",
                                 "cycle 1: player_0: paper, player_1: rock")
    finally:
        envs.close()
