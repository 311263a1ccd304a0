"""Shared arrays in-process: layout, rows, a segment mapped twice, the host's shared_step.

Real segments in /dev/shm (no mocks): both ends are mapped in this process.
"""

from __future__ import annotations

import collections
import functools
import os
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import AutoresetMode, SyncVectorEnv

from remote_env import examples
from remote_env._types import Batch
from remote_env.actor.host import SubEnvHost
from remote_env.wire import shared_arrays


def _segments() -> set[str]:
    return {f for f in os.listdir(shared_arrays.SHM_DIR) if f.startswith(shared_arrays.PREFIX)}


def test_layout_is_the_batched_spaces_cache_line_aligned() -> None:
    obs = gym.spaces.Box(0, 255, (84, 84, 4), np.uint8)
    fields, size = shared_arrays.layout(obs, gym.spaces.Discrete(4), 3)  # type: ignore[misc]
    by_name = {f[0]: f for f in fields}
    assert by_name["obs"][1:3] == ((3, 84, 84, 4), "|u1")
    assert by_name["actions"][1:3] == ((3,), np.dtype(np.int64).str)  # batch_space: MultiDiscrete
    assert by_name["rewards"][1:3] == ((3,), "<f8")
    assert all(f[3] % 64 == 0 for f in fields)
    assert size >= by_name["truncations"][3] + 3
    # no overlap: each field starts after the previous one's bytes
    ends = [f[3] + int(np.prod(f[1])) * np.dtype(f[2]).itemsize for f in fields]
    assert all(e <= f[3] for e, f in zip(ends, fields[1:], strict=False))


@pytest.mark.parametrize("obs, act", [
    (gym.spaces.Dict({"a": gym.spaces.Discrete(2)}), gym.spaces.Discrete(2)),
    (gym.spaces.Discrete(3), gym.spaces.Discrete(2)),
    (gym.spaces.Box(0, 1, (2,)), gym.spaces.Tuple((gym.spaces.Discrete(2),))),
])
def test_spaces_that_are_not_one_array_keep_the_pickled_path(obs: Any, act: Any) -> None:
    assert shared_arrays.layout(obs, act, 2) is None


def test_rows_slice_only_for_consecutive_positions() -> None:
    assert shared_arrays.rows([2, 3, 4]) == slice(2, 5)
    assert shared_arrays.rows([5]) == slice(5, 6)
    for positions in ([0, 1, 3, 2, 4], [3, 2], [0, 2]):
        np.testing.assert_array_equal(shared_arrays.rows(positions), positions)


def test_a_segment_outlives_its_name_and_is_shared_both_ways() -> None:
    where = shared_arrays.layout(gym.spaces.Box(-1, 1, (2,)), gym.spaces.Discrete(2), 4)
    assert where is not None
    name = shared_arrays.new_name()
    actor = shared_arrays.SharedArrays(name, *where, create=True)
    driver = shared_arrays.SharedArrays(name, *where, create=False)
    shared_arrays.unlink(name)
    assert name not in _segments()  # both mapped, nothing left to leak
    assert shared_arrays.write_actions(driver, [1, 2], np.array([1, 0]))
    np.testing.assert_array_equal(actor.actions[1:3], [1, 0])
    # another dtype would reach the env as another type: sent along instead
    assert not shared_arrays.write_actions(driver, [1, 2], np.array([1, 0], dtype=np.int32))
    actor.obs[3] = [0.5, -0.5]
    actor.rewards[3], actor.truncations[3] = 2.0, True
    b = shared_arrays.read_batch(driver, Batch([3], None, None, None, None, [], [], False))
    np.testing.assert_array_equal(b.obs, [[0.5, -0.5]])
    assert b.rewards.tolist() == [2.0] and b.truncations.tolist() == [True]
    assert b.infos == []  # none at all: the assembler reads [] as every info empty
    del b  # a view of the segment: close() below must not find it exported
    driver.close()
    actor.close()
    assert driver.closed and actor.closed
    driver.close()  # idempotent


def test_creating_a_taken_name_fails_and_leaves_it() -> None:
    where = shared_arrays.layout(gym.spaces.Box(-1, 1, (2,)), gym.spaces.Discrete(2), 1)
    assert where is not None
    name = shared_arrays.new_name()
    first = shared_arrays.SharedArrays(name, *where, create=True)
    try:
        with pytest.raises(FileExistsError):
            shared_arrays.SharedArrays(name, *where, create=True)
        assert name in _segments()
    finally:
        shared_arrays.unlink(name)
        first.close()


@pytest.mark.parametrize("mode", [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP])
def test_host_shared_step_matches_sync_vector_env(mode: AutoresetMode) -> None:
    n = 3
    fns = [functools.partial(examples.SparseInfoCartPole, 3)] * n
    sync = SyncVectorEnv(fns, autoreset_mode=mode)
    host = SubEnvHost(fns, autoreset_mode=mode.value)
    host.start()
    where = host.open_shared(name := shared_arrays.new_name())
    assert where is not None
    driver = shared_arrays.SharedArrays(name, *where, create=False)
    sync.reset(seed=3)
    host.reset(range(n), [3 + i for i in range(n)], None)
    rng = np.random.default_rng(0)
    empty = 0
    for _ in range(200):
        actions = rng.integers(0, 2, size=n)
        sobs, srew, sterm, strunc, sinfo = sync.step(actions)
        # actions through the segment for envs 0 and 2, in the message for env 1
        assert shared_arrays.write_actions(driver, [0, 2], actions[[0, 2]])
        b1 = shared_arrays.read_batch(driver, host.shared_step([1], actions[[1]]))
        raw = host.shared_step([0, 2])
        empty += raw.infos == []
        b02 = shared_arrays.read_batch(driver, raw)
        for j, (b, i) in enumerate([(b02, 0), (b1, 0), (b02, 1)]):
            np.testing.assert_array_equal(b.obs[i], sobs[j])
            assert b.rewards[i] == srew[j] and b.terminations[i] == sterm[j]
            assert b.truncations[i] == strunc[j]
            info = b.infos[i] if b.infos else {}  # []: every env's info was empty
            if "t" in sinfo and sinfo["_t"][j]:
                assert info["t"] == sinfo["t"][j]
            elif mode is AutoresetMode.NEXT_STEP:
                assert info == {}
    assert 0 < empty < 200  # infos shipped only when some env had one
    assert name not in _segments()  # the first shared_step unlinked it
    host.endpoint.release_shared()
    driver.close()
    host.close()


def test_rows_of_a_range_are_a_slice() -> None:
    assert shared_arrays.rows(range(3, 7)) == slice(3, 7)
    assert shared_arrays.rows(range(0, 0)) == slice(0, 0)


class _Odd(gym.Wrapper):
    """CartPole returning, at some steps, what the host's lean loop must not take as it
    is: malformed results (refused), unusual but valid types (taken), exceptions."""

    KINDS = ("ok", "scalar_obs", "obs_shape", "str_reward", "array_terminated",
             "info_list", "four_values", "list_result", "np_types", "dict_subclass",
             "float64_obs", "raises", "ok", "ok")

    def __init__(self) -> None:
        super().__init__(gym.make("CartPole-v1"))

    def step(self, action: Any) -> Any:
        obs, rew, term, trunc, info = self.env.step(action)
        # from the state: the same in both hosts, and not the same after every restart
        kind = self.KINDS[int(abs(obs[0]) * 1e7) % len(self.KINDS)]
        if kind == "raises":
            raise RuntimeError("boom")
        return {
            "ok": (obs, rew, term, trunc, info),
            "scalar_obs": (np.float32(0.5), rew, term, trunc, info),  # would broadcast
            "obs_shape": (obs[:2], rew, term, trunc, info),
            "str_reward": (obs, "1", term, trunc, info),
            "array_terminated": (obs, rew, np.array([True, False]), trunc, info),
            "info_list": (obs, rew, term, trunc, []),
            "four_values": (obs, rew, term, info),
            "list_result": [obs, rew, term, trunc, info],
            "np_types": (obs, np.float32(rew), np.bool_(term), np.bool_(trunc), info),
            "dict_subclass": (obs, rew, term, trunc, collections.OrderedDict(info)),
            "float64_obs": (obs.astype(np.float64), rew, term, trunc, info),
        }[kind]


def _same_failures(a: list[Any], b: list[Any]) -> None:
    assert [(f.index, f.reason, f.message, f.restarted, f.permanent) for f in a] == \
        [(f.index, f.reason, f.message, f.restarted, f.permanent) for f in b]


def _same_infos(a: dict[str, Any], b: dict[str, Any]) -> None:
    assert a.keys() == b.keys()
    for k in a:
        if k == "final_obs":
            np.testing.assert_array_equal(a[k], b[k])
        elif k == "final_info":
            _same_infos(a[k], b[k])
        else:
            assert a[k] == b[k], k


@pytest.mark.parametrize("restart", [True, False])
@pytest.mark.parametrize("mode", list(AutoresetMode))
def test_the_lean_shared_step_matches_the_generic_step(mode: AutoresetMode, restart: bool) -> None:
    """Every irregular result goes the generic way: the same results, failures,
    restarts as host.step, for odd envs next to good ones."""
    n = 6
    fns = [_Odd if i % 2 else (lambda: gym.make("CartPole-v1")) for i in range(n)]
    kw: dict[str, Any] = {"autoreset_mode": mode.value, "restart_failed": restart, "max_restarts": 1000}
    ref, host = SubEnvHost(fns, **kw), SubEnvHost(fns, **kw)
    ref.start()
    host.start()
    where = host.open_shared(name := shared_arrays.new_name())
    assert where is not None
    driver = shared_arrays.SharedArrays(name, *where, create=False)
    ref.reset(range(n), list(range(n)), None)
    host.reset(range(n), list(range(n)), None)
    rng = np.random.default_rng(1)
    live = list(range(n))
    for _ in range(150):
        actions = rng.integers(0, 2, size=len(live))
        r = ref.step(live, list(actions))
        assert shared_arrays.write_actions(driver, live, actions)
        b = shared_arrays.read_batch(driver, host.shared_step(live))
        _same_failures(b.failures, r.failures)
        np.testing.assert_array_equal(b.obs, r.obs)
        np.testing.assert_array_equal(b.rewards, r.rewards)
        np.testing.assert_array_equal(b.terminations, r.terminations)
        np.testing.assert_array_equal(b.truncations, r.truncations)
        for x, y in zip(b.infos or [{}] * len(live), r.infos, strict=True):
            _same_infos(x, y)
        # out of restarts: stop stepping those (as the driver would raise)
        gone = {f.index for f in r.failures if f.permanent}
        live = [p for p in live if p not in gone]
        if not live:
            break
    assert host.restart_counts() == ref.restart_counts()
    host.endpoint.release_shared()
    driver.close()
    host.close()
    ref.close()
