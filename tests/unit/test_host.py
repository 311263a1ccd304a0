"""SubEnvHost in-process: autoreset equivalence with SyncVectorEnv and restarts."""

from __future__ import annotations

import asyncio
import functools
import inspect
import threading
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import AutoresetMode, SyncVectorEnv

from remote_env import errors
from remote_env.actor.host import SubEnvHost
from remote_env.actor.slots import restart_seed
from remote_env.wire import channel, shared_arrays


def _fns(n: int) -> list:
    return [lambda: gym.make("CartPole-v1") for _ in range(n)]


def _step_against_sync(host: SubEnvHost, sync: SyncVectorEnv, mode: AutoresetMode, steps: int,
                       seed: int) -> int:
    """Step both with the same random actions, assert equal results; return episode ends."""
    n = sync.num_envs
    rng = np.random.default_rng(seed)
    ends = 0
    for _ in range(steps):
        actions = rng.integers(0, 2, size=n)
        sobs, srew, sterm, strunc, sinfo = sync.step(actions)
        b = host.step(range(n), list(actions))
        assert not b.failures
        np.testing.assert_array_equal(b.obs, sobs)
        np.testing.assert_array_equal(b.rewards, srew)
        np.testing.assert_array_equal(b.terminations, sterm)
        np.testing.assert_array_equal(b.truncations, strunc)
        ends += int(sterm.sum() + strunc.sum())
        if mode is AutoresetMode.SAME_STEP:
            for i in np.flatnonzero(sterm | strunc):
                np.testing.assert_array_equal(b.infos[i]["final_obs"], sinfo["final_obs"][i])
    return ends


@pytest.mark.parametrize("threads", [1, 2])  # 2 threads for 3 envs: uneven shares
@pytest.mark.parametrize("mode", [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP])
def test_host_matches_sync_vector_env(mode: AutoresetMode, threads: int) -> None:
    n = 3
    sync = SyncVectorEnv(_fns(n), autoreset_mode=mode)
    host = SubEnvHost(_fns(n), autoreset_mode=mode.value, threads=threads)
    info = host.start()
    assert info["observation_space"] == sync.single_observation_space
    sobs, _ = sync.reset(seed=7)
    batch = host.reset(range(n), [7 + i for i in range(n)], None)
    np.testing.assert_array_equal(batch.obs, sobs)
    assert _step_against_sync(host, sync, mode, 300, seed=0) > 3  # the comparison crossed several autoresets


def test_host_class_has_no_coroutine_methods() -> None:
    # Ray makes a class with any `async def` method an asyncio actor, which does not
    # run calls in the order sent: a replacement actor's step() ran before its start()
    # (envs still None) until the per-env coroutines moved out of the class.
    assert not [name for name, m in inspect.getmembers(SubEnvHost)
                if inspect.iscoroutinefunction(m) or inspect.isasyncgenfunction(m)]


class _MeetOthers(gym.Wrapper):
    """Each step waits at a barrier for every other env's step: only concurrent steps pass."""

    def __init__(self, env: gym.Env, barrier: threading.Barrier) -> None:
        super().__init__(env)
        self.barrier = barrier

    def step(self, action):  # type: ignore[no-untyped-def]
        self.barrier.wait(timeout=5)
        return self.env.step(action)


@pytest.mark.parametrize("threads", [1, 4])
def test_threads_step_envs_concurrently(threads: int) -> None:
    k = 4
    barrier = threading.Barrier(k)
    fns = [lambda: _MeetOthers(gym.make("CartPole-v1"), barrier) for _ in range(k)]
    host = SubEnvHost(fns, threads=threads)
    host.start()
    host.reset(range(k), [0] * k, None)
    for _ in range(20):
        b = host.step(range(k), [0] * k)
        if threads == 1:  # one at a time: the first step waits alone and breaks the barrier
            assert b.failures and "BrokenBarrierError" in b.failures[0].message
            break
        assert not b.failures
    host.close()


class _AsyncCartPole(gym.Wrapper):
    """CartPole with astep/areset; counts how many asteps are in flight at once."""

    in_flight = 0
    most_in_flight = 0

    def __init__(self, env: gym.Env, fail_at: int = 0) -> None:
        super().__init__(env)
        self.fail_at = fail_at
        self.n = 0

    async def astep(self, action):  # type: ignore[no-untyped-def]
        self.n += 1
        if self.n == self.fail_at:
            raise RuntimeError(f"async boom at step {self.fail_at}")
        cls = type(self)
        cls.in_flight += 1
        cls.most_in_flight = max(cls.most_in_flight, cls.in_flight)
        await asyncio.sleep(0.002)
        cls.in_flight -= 1
        return self.env.step(action)

    async def areset(self, *, seed=None, options=None):  # type: ignore[no-untyped-def]
        await asyncio.sleep(0)
        return self.env.reset(seed=seed, options=options)


@pytest.mark.parametrize("mode", [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP])
def test_async_envs_are_awaited_together_and_match_sync_vector_env(mode: AutoresetMode) -> None:
    k = 4
    _AsyncCartPole.most_in_flight = 0
    host = SubEnvHost([lambda: _AsyncCartPole(gym.make("CartPole-v1"))] * k,
                      autoreset_mode=mode.value)
    assert host.start()["async_steps"] is True
    sync = SyncVectorEnv(_fns(k), autoreset_mode=mode)
    sobs, _ = sync.reset(seed=3)
    np.testing.assert_array_equal(host.reset(range(k), [3 + i for i in range(k)], None).obs, sobs)
    assert _step_against_sync(host, sync, mode, 200, seed=1) > 3
    assert _AsyncCartPole.most_in_flight == k  # awaited together, not one after another
    host.close()


def test_failing_async_env_restarts_alone() -> None:
    fns = [lambda: _AsyncCartPole(gym.make("CartPole-v1")),
           lambda: _AsyncCartPole(gym.make("CartPole-v1"), fail_at=3)]
    host = SubEnvHost(fns, restart_failed=True)
    host.start()
    host.reset([0, 1], [1, 2], None)
    for step in range(1, 6):
        b = host.step([0, 1], [1, 1])
        if step == 3:
            [failure] = b.failures
            assert failure.index == 1 and failure.restarted
            assert "async boom at step 3" in b.infos[1]["error"] and b.truncations[1]
        else:
            assert not b.failures
    assert host.restart_counts() == [0, 1]
    host.close()


def test_env_with_only_one_async_method_is_stepped_synchronously() -> None:
    class HalfAsync(gym.Wrapper):
        async def astep(self, action):  # type: ignore[no-untyped-def]
            raise AssertionError("astep must not be used without areset")

    host = SubEnvHost([lambda: HalfAsync(gym.make("CartPole-v1"))])
    assert host.start()["async_steps"] is False
    host.reset([0], [0], None)
    assert not host.step([0], [1]).failures


def test_a_thread_share_raising_outside_env_handling_reaches_the_caller() -> None:
    from remote_env.actor.threads import Gang as _Gang

    gang = _Gang(3)

    def fn(i: int, _: object) -> int:
        if i == 4:
            raise KeyError("share of thread 1")
        return i * 10

    assert gang.map(fn, [0, 1, 2, 3], [None] * 4) == [0, 10, 20, 30]
    with pytest.raises(KeyError, match="share of thread 1"):
        gang.map(fn, [0, 4, 2], [None] * 3)
    assert gang.map(fn, [5, 6], [None] * 2) == [50, 60]  # still usable
    gang.close()


class _FailAt(gym.Wrapper):
    def __init__(self, env: gym.Env, at: int) -> None:
        super().__init__(env)
        self.n = 0
        self.at = at

    def step(self, action):  # type: ignore[no-untyped-def]
        self.n += 1
        if self.n == self.at:
            raise RuntimeError(f"boom at step {self.at}")
        return self.env.step(action)


def test_failed_env_restarts_alone() -> None:
    fns = [lambda: gym.make("CartPole-v1"), lambda: _FailAt(gym.make("CartPole-v1"), 3)]
    host = SubEnvHost(fns, restart_failed=True)
    host.start()
    ref = SubEnvHost([fns[0]])
    ref.start()
    host.reset([0, 1], [1, 2], None)
    ref.reset([0], [1], None)
    for step in range(1, 6):
        b = host.step([0, 1], [1, 1])
        r = ref.step([0], [1])
        np.testing.assert_array_equal(b.obs[0], r.obs[0])  # sibling undisturbed
        if step == 3:
            assert b.truncations[1] and not b.terminations[1]
            assert "boom at step 3" in b.infos[1]["error"]
            [failure] = b.failures
            assert failure.index == 1 and failure.restarted and failure.reason == "exception"
            assert "boom" in failure.traceback
    assert host.restart_counts() == [0, 1]


class _Malformed(gym.Wrapper):
    """Returns a malformed result of ``kind`` on step 2."""

    def __init__(self, kind: str) -> None:
        super().__init__(gym.make("CartPole-v1"))
        self.kind, self.n = kind, 0

    def step(self, action):
        obs, rew, term, trunc, info = self.env.step(action)
        self.n += 1
        if self.n == 2:
            return {
                "str_reward": (obs, "1", term, trunc, info),
                "list_reward": (obs, [1.0], term, trunc, info),
                "obs_shape": (obs[:2], rew, term, trunc, info),
                "array_terminated": (obs, rew, np.array([True, False]), trunc, info),
                "str_truncated": (obs, rew, term, "no", info),
                "info_list": (obs, rew, term, trunc, []),
                "four_values": (obs, rew, term, info),
            }[self.kind]
        return obs, rew, term, trunc, info


@pytest.mark.parametrize("restart", [True, False])
@pytest.mark.parametrize("kind", ["str_reward", "list_reward", "obs_shape", "array_terminated",
                                  "str_truncated", "info_list", "four_values"])
def test_a_malformed_result_fails_that_env_only(kind: str, restart: bool) -> None:
    fns = [lambda: gym.make("CartPole-v1"), lambda: _Malformed(kind),
           lambda: gym.make("CartPole-v1")]
    host = SubEnvHost(fns, restart_failed=restart)
    host.start()
    host.reset([0, 1, 2], [1, 2, 3], None)
    host.step([0, 1, 2], [1, 1, 1])
    b = host.step([0, 1, 2], [1, 1, 1])  # packs fine: the siblings' results are there
    [failure] = b.failures
    assert failure.index == 1 and failure.restarted == restart and failure.permanent != restart
    assert b.truncations.tolist() == [False, True, False]
    assert b.rewards.dtype == np.float64 and b.obs.shape == (3, 4)
    assert b.infos[1]["error"].startswith(("MalformedResultError", "ValueError")), b.infos[1]


def test_env_spaces_that_differ_are_reported_by_slot() -> None:
    fns = [lambda: gym.make("CartPole-v1"), lambda: gym.make("FrozenLake-v1"),
           lambda: gym.make("CartPole-v1")]
    info = SubEnvHost(fns).start()
    assert list(info["other_spaces"]) == [1]
    assert info["other_spaces"][1][0] == gym.spaces.Discrete(16)


def test_constructor_failing_every_time_is_permanent_after_max_restarts() -> None:
    calls = []

    def bad() -> gym.Env:
        calls.append(1)
        raise ValueError("no simulator licence")

    host = SubEnvHost([bad], restart_failed=True, max_restarts=2)
    info = host.start()
    [failure] = info["failures"]
    assert failure.permanent and "no simulator licence" in failure.message
    assert len(calls) == 3  # first try + 2 restarts


def test_restart_seed_is_deterministic_and_new() -> None:
    assert restart_seed(5, 1) == restart_seed(5, 1)
    assert restart_seed(5, 1) != restart_seed(5, 2) != 5
    assert restart_seed(None, 1) is None


def test_multi_agent_pettingzoo_autoreset_next_step() -> None:
    from remote_env.examples import rps_parallel_env

    host = SubEnvHost([lambda: rps_parallel_env(2)] * 2)
    info = host.start()
    assert info["multi_agent"] is True
    assert set(info["action_space"].spaces) == {"player_0", "player_1"}
    host.reset([0, 1], [0, 1], None)
    act = {"player_0": 0, "player_1": 1}  # paper beats rock
    b1 = host.step([0, 1], [act, act])
    assert b1.rewards[0] == {"player_0": -1.0, "player_1": 1.0}
    assert b1.truncations[0]["__all__"] is False
    b2 = host.step([0, 1], [act, act])
    assert b2.truncations[1]["__all__"] is True  # max_cycles reached
    b3 = host.step([0, 1], [act, act])  # NEXT_STEP: this call resets
    assert b3.rewards[0] == {"player_0": 0.0, "player_1": 0.0}
    assert b3.obs[0] == {"player_0": 3, "player_1": 3}
    assert b3.truncations[0]["__all__"] is False


class _NoRay:
    def wait(self, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError("Ray must not be used for channel calls")

    get = wait


def _serve(host: SubEnvHost) -> channel.Channel:
    """A channel to the host's endpoint as open_channel serves it (which needs Ray's node id)."""
    return channel.Channel(*host.endpoint.listen())


def test_shared_steps_over_a_channel_and_fenced_ones_refused_once_leased_again() -> None:
    n = 4
    fns = [lambda: gym.make("CartPole-v1")] * n
    host, ref = SubEnvHost(fns), SubEnvHost(fns)
    host.start()
    ref.start()
    ch = _serve(host)
    name = shared_arrays.new_name()
    where = channel.get(ch.call(("open_shared", name)), _NoRay())
    arrays = shared_arrays.SharedArrays(name, *where, create=False)
    shared_arrays.unlink(name)
    try:
        host.reset(range(n), list(range(n)), None)
        ref.reset(range(n), list(range(n)), None)
        decode = functools.partial(shared_arrays.read_batch, arrays)
        for positions, epoch in (([0, 1, 2, 3], None), ([2, 0], 1), ([3], 2), ([1, 2], 2)):
            acts = np.ones(len(positions), dtype=np.int64)
            want = ref.step(positions, list(acts))
            assert shared_arrays.write_actions(arrays, positions, acts)
            message = (("shared_step", positions, None) if epoch is None else
                       ("fenced", epoch, "shared_step", positions, None))
            got = channel.get(ch.call(message, decode), _NoRay())
            assert got.indices == positions and got.failures == []
            np.testing.assert_array_equal(got.obs, want.obs)
            np.testing.assert_array_equal(got.rewards, want.rewards)
        host.fence(5)  # the pool leased these envs to another trainer
        with pytest.raises(errors.LeaseLostError):
            channel.get(ch.call(("fenced", 2, "shared_step", [0], None), decode), _NoRay())
        got = channel.get(ch.call(("fenced", 5, "shared_step", [0], np.array([1])), decode),
                          _NoRay())
        assert got.indices == [0]
        with pytest.raises(channel.RemoteCallError, match="unknown channel call"):
            channel.get(ch.call(("close",)), _NoRay())
    finally:
        ch.close()
        arrays.close()
        host.close()


def test_channel_calls_skip_wrappers_like_rays_tracing() -> None:
    calls = []

    def wrap(method: Any) -> Any:
        @functools.wraps(method)
        def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
            calls.append(method.__name__)
            return method(self, *args, **kwargs)
        return wrapper

    class Wrapped(SubEnvHost):  # what ray.remote makes of the class: every method wrapped
        pass

    for name, method in inspect.getmembers(SubEnvHost, inspect.isfunction):
        if name.startswith("__"):
            continue
        setattr(Wrapped, name, wrap(method))
    host = Wrapped([lambda: gym.make("CartPole-v1")] * 2)
    host.start()
    assert calls == ["start"]  # the wrappers are there: a Ray call goes through them
    ch = _serve(host)
    try:
        name = shared_arrays.new_name()
        where = channel.get(ch.call(("open_shared", name)), _NoRay())
        arrays = shared_arrays.SharedArrays(name, *where, create=False)
        channel.get(ch.call(("fenced", 1, "reset", [0, 1], [0, 1], None)), _NoRay())
        decode = functools.partial(shared_arrays.read_batch, arrays)
        got = channel.get(ch.call(("fenced", 1, "shared_step", [0, 1], np.array([1, 0])),
                                  decode), _NoRay())
        assert got.indices == [0, 1]
        assert channel.get(ch.call(("step", [1], [1])), _NoRay()).indices == [1]
        assert calls == ["start"]  # channel calls reached the core past every wrapper
    finally:
        ch.close()
        arrays.close()
        host.close()
