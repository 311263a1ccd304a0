"""RemoteVectorEnv on real Ray: SyncVectorEnv equivalence, async API, options, bad input."""

from __future__ import annotations

import functools
import time
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import AutoresetMode, SyncVectorEnv
from ray_checks import alive_actor_ids, state_api_address

from remote_env import errors, examples
from remote_env.driver.vector import RemoteVectorEnv

pytestmark = pytest.mark.usefixtures("ray_local")


def assert_tree_equal(a: Any, b: Any, path: str = "") -> None:
    """Deep equality for gymnasium results: dicts, tuples, (object) arrays."""
    if isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), f"{path}: keys {a.keys()} != {b.keys()}"
        for k in a:
            assert_tree_equal(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, tuple):
        assert isinstance(b, tuple) and len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_tree_equal(x, y, f"{path}[{i}]")
    elif isinstance(a, np.ndarray) and a.dtype == object:
        assert isinstance(b, np.ndarray) and a.shape == b.shape, path
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_tree_equal(x, y, f"{path}[{i}]")
    else:
        np.testing.assert_array_equal(a, b, err_msg=path)
        assert np.asarray(a).dtype == np.asarray(b).dtype, f"{path}: {np.asarray(a).dtype} != {np.asarray(b).dtype}"


ENVS = {
    # discrete actions, Box observations
    "CartPole-v1": {},
    # continuous actions, short episodes through truncation
    "Pendulum-v1": {"max_episode_steps": 25},
    # Tuple observations, frequent terminations
    "Blackjack-v1": {},
}


def _fns(env_id: str, n: int) -> list[Any]:
    return [functools.partial(gym.make, env_id, **ENVS[env_id]) for _ in range(n)]


def _step_both(remote: RemoteVectorEnv, sync: SyncVectorEnv, t: int) -> tuple[Any, ...]:
    """One step of both with the same sampled actions; asserts equal results."""
    actions = sync.action_space.sample()
    s = sync.step(actions)
    assert_tree_equal(remote.step(actions), s, f"step {t}")
    return s


@pytest.mark.parametrize("transport", ["auto", "ray"])
@pytest.mark.parametrize("env_id", list(ENVS))
@pytest.mark.parametrize(
    "mode", [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP, AutoresetMode.DISABLED]
)
def test_matches_sync_vector_env_step_by_step(
    env_id: str, mode: AutoresetMode, transport: str
) -> None:
    n, k = 5, 2  # uneven split: actors of 2, 2 and 1 envs
    sync = SyncVectorEnv(_fns(env_id, n), autoreset_mode=mode)
    remote = RemoteVectorEnv(_fns(env_id, n), envs_per_actor=k, autoreset_mode=mode,
                             transport=transport)
    try:
        assert len(remote.actors) == 3
        assert remote.single_observation_space == sync.single_observation_space
        assert remote.single_action_space == sync.single_action_space
        assert remote.observation_space == sync.observation_space
        assert remote.action_space == sync.action_space
        assert remote.metadata["autoreset_mode"] == sync.metadata["autoreset_mode"] == mode
        assert_tree_equal(remote.reset(seed=11), sync.reset(seed=11))
        sync.action_space.seed(3)
        ends = 0
        for t in range(120):
            s = _step_both(remote, sync, t)
            done = s[2] | s[3]
            ends += int(done.sum())
            if mode is AutoresetMode.DISABLED and done.any():
                opts = {"reset_mask": done.copy()}
                assert_tree_equal(
                    remote.reset(options=dict(opts)), sync.reset(options=dict(opts)), f"reset {t}"
                )
        assert ends >= 3, "the run must cross several autoresets"
        # seeds as a list
        seeds = [5, 6, 70, 8, 9]
        assert_tree_equal(remote.reset(seed=seeds), sync.reset(seed=seeds))
        # every actor is on this node: "auto" stepped them over sockets, "ray" never did
        uses_socket = [h.channel for h in remote.hosts()]
        assert uses_socket == [transport == "auto"] * 3
    finally:
        remote.close()
        sync.close()


@pytest.mark.parametrize("transport", ["auto", "ray"])
@pytest.mark.parametrize("mode", [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP])
def test_async_envs_are_awaited_and_match_sync_vector_env(mode: AutoresetMode,
                                                          transport: str) -> None:
    n = 5
    fn = functools.partial(examples.make_async_slow_cartpole, 0.5)
    sync = SyncVectorEnv([fn] * n, autoreset_mode=mode)  # gymnasium calls the blocking step
    remote = RemoteVectorEnv([fn] * n, envs_per_actor=3, autoreset_mode=mode,
                             transport=transport)
    try:
        assert remote.async_steps
        assert_tree_equal(remote.reset(seed=4), sync.reset(seed=4))
        sync.action_space.seed(4)
        ends = 0
        for t in range(150):
            s = _step_both(remote, sync, t)
            ends += int((s[2] | s[3]).sum())
        assert ends >= 3
    finally:
        remote.close()
        sync.close()


def test_step_async_and_state_errors() -> None:
    envs = RemoteVectorEnv(_fns("CartPole-v1", 4), envs_per_actor=2)
    envs.reset(seed=0)
    with pytest.raises(errors.NoAsyncCallError):
        envs.step_wait()
    envs.step_async(np.zeros(4, dtype=np.int64))
    with pytest.raises(errors.AlreadyPendingCallError):
        envs.step_async(np.zeros(4, dtype=np.int64))
    with pytest.raises(errors.AlreadyPendingCallError):
        envs.send(np.zeros(1, dtype=np.int64), [0])
    with pytest.raises(errors.AlreadyPendingCallError):
        envs.reset()
    obs, *_ = envs.step_wait(timeout=30)
    assert obs.shape == (4, 4)
    envs.close()
    envs.close()  # idempotent
    with pytest.raises(errors.ClosedEnvironmentError):
        envs.step(np.zeros(4, dtype=np.int64))
    with pytest.raises(errors.ClosedEnvironmentError):
        envs.reset()


def test_recv_returns_partial_batches_when_one_env_is_slow() -> None:
    fast = functools.partial(examples.make_slow_cartpole, 0.0)
    slow = functools.partial(examples.make_slow_cartpole, 400.0)
    envs = RemoteVectorEnv([slow, fast, fast, fast], envs_per_actor=1, batch_wait_ms=20)
    try:
        envs.async_reset(seed=0)
        got: set[int] = set()
        while len(got) < 4:
            _, _, _, _, info = envs.recv(timeout=30)
            got |= set(info["env_id"].tolist())
        envs.send(np.zeros(4, dtype=np.int64), [0, 1, 2, 3])
        t0 = time.perf_counter()
        obs, rew, term, trunc, info = envs.recv(timeout=30)
        first = time.perf_counter() - t0
        assert 0 not in info["env_id"], "the slow env must not be in the first batch"
        m = len(info["env_id"])
        assert m >= 1 and obs.shape == (m, 4) and rew.shape == term.shape == trunc.shape == (m,)
        assert first < 0.3, f"the fast envs waited for the slow one ({first:.3f}s)"
        while m < 3:  # the rest of the fast ones, still without env 0
            _, _, _, _, more = envs.recv(timeout=30)
            assert 0 not in more["env_id"]
            m += len(more["env_id"])
        # env 0 is still in flight: sending it again is refused
        with pytest.raises(errors.AlreadyPendingCallError, match=r"env ids \[0\]"):
            envs.send(np.zeros(1, dtype=np.int64), [0])
        # the fast ones keep stepping while env 0 is busy
        envs.send(np.ones(3, dtype=np.int64), [1, 2, 3])
        fast_steps = 0
        for _ in range(200):
            _, _, _, _, info = envs.recv(timeout=30)
            ids = info["env_id"].tolist()
            if 0 in ids:
                break
            fast_steps += len(ids)
            envs.send(np.ones(len(ids), dtype=np.int64), ids)
        else:
            pytest.fail("env 0 never came back")
        assert fast_steps >= 6, f"only {fast_steps} fast steps while env 0 was busy"
    finally:
        envs.close()


def test_recv_results_match_step_for_the_same_actions() -> None:
    """Dynamic batching returns the same per-env transitions as a lock-step run."""
    n = 6
    a = RemoteVectorEnv(_fns("CartPole-v1", n), envs_per_actor=2)
    b = SyncVectorEnv(_fns("CartPole-v1", n))
    try:
        a.async_reset(seed=1)
        obs_b, _ = b.reset(seed=1)
        obs_a = np.zeros_like(obs_b)
        got = 0
        while got < n:
            o, *_, info = a.recv(timeout=30)
            obs_a[info["env_id"]] = o
            got += len(info["env_id"])
        np.testing.assert_array_equal(obs_a, obs_b)
        rng = np.random.default_rng(1)
        for _ in range(40):
            act = rng.integers(0, 2, n)
            # send in two halves, in reverse order, and collect everything
            a.send(act[3:], [3, 4, 5])
            a.send(act[:3], [0, 1, 2])
            res = {}
            while len(res) < n:
                o, r, te, tr, info = a.recv(timeout=30)
                for j, e in enumerate(info["env_id"]):
                    res[int(e)] = (o[j], r[j], te[j], tr[j])
            sb = b.step(act)
            for e in range(n):
                np.testing.assert_array_equal(res[e][0], sb[0][e])
                assert (res[e][1], res[e][2], res[e][3]) == (sb[1][e], sb[2][e], sb[3][e])
    finally:
        a.close()
        b.close()


def test_multi_agent_pettingzoo_keyed_by_env_then_agent() -> None:
    fn = functools.partial(examples.rps_parallel_env, 3)
    envs = RemoteVectorEnv([fn] * 3, envs_per_actor=2)
    local = [examples.rps_parallel_env(3) for _ in range(3)]
    try:
        assert envs.multi_agent
        assert set(envs.single_action_space.spaces) == {"player_0", "player_1"}
        obs, infos = envs.reset(seed=0)
        assert list(obs) == [0, 1, 2]
        for e in range(3):
            lo, li = local[e].reset(seed=e)
            assert obs[e] == lo and infos[e] == li
        act = {"player_0": 0, "player_1": 1}
        for t in range(3):
            obs, rew, term, trunc, _ = envs.step({e: act for e in range(3)})
            for e in range(3):
                lo, lr, _, _, _ = local[e].step(act)
                assert obs[e] == lo and rew[e] == lr, (t, e)
                assert trunc[e]["__all__"] is (t == 2)
                assert term[e]["__all__"] is False
        # NEXT_STEP: the step after the end resets
        obs, rew, term, trunc, _ = envs.step([act] * 3)
        assert obs[0] == {"player_0": 3, "player_1": 3}
        assert rew[0] == {"player_0": 0.0, "player_1": 0.0}
        with pytest.raises(TypeError, match="dicts keyed by agent id"):
            envs.step([0, 1, 2])
    finally:
        envs.close()


def test_rllib_style_all_dicts_accepted() -> None:
    envs = RemoteVectorEnv([examples.AllDictCounterEnv] * 2, envs_per_actor=2)
    try:
        obs, _ = envs.reset(seed=0)
        assert obs == {0: {"a": 0, "b": 0}, 1: {"a": 0, "b": 0}}
        for _ in range(3):
            obs, rew, term, _, _ = envs.step([{"a": 1, "b": 1}] * 2)
        assert term[0]["__all__"] is True and rew[1] == {"a": 1.0, "b": 1.0}
    finally:
        envs.close()


def test_existing_actors_used_as_is_and_only_missing_ones_created() -> None:
    host_cls = RemoteVectorEnv.host_class()
    mine = host_cls.remote(_fns("CartPole-v1", 2))
    assert not ray_get(mine.start.remote())["failures"]
    before = alive_actor_ids()
    envs = RemoteVectorEnv(_fns("CartPole-v1", 5), envs_per_actor=2, existing_actors=[mine])
    try:
        assert envs.actors[0] is mine
        assert len(envs.actors) == 3  # 2 (given) + 2 + 1 created
        assert len(alive_actor_ids() - before) == 2
        obs, _ = envs.reset(seed=0)
        assert obs.shape == (5, 4)
        envs.step(np.zeros(5, dtype=np.int64))
    finally:
        envs.close()
    # ours are gone, the given one is still alive and usable
    assert ray_get(mine.ping.remote()) > 0
    ray_kill(mine)


def test_make_env_callable_returning_an_env_actor() -> None:
    import ray

    env_actor_cls = ray.remote(examples.ActorCartPole)
    fns = [lambda: env_actor_cls.remote()] * 2
    envs = RemoteVectorEnv(fns, envs_per_actor=2)
    sync = SyncVectorEnv(_fns("CartPole-v1", 2))
    try:
        assert_tree_equal(envs.reset(seed=4)[0], sync.reset(seed=4)[0])
        for _ in range(30):
            a = sync.action_space.sample()
            assert_tree_equal(envs.step(a)[:4], sync.step(a)[:4])
    finally:
        envs.close()


def test_on_sub_environment_created_gets_a_live_actor() -> None:
    seen: list[tuple[int, int]] = []

    def created(actor: Any, index: int) -> None:
        # the actor exists and its envs are built when the callback runs (RLlib #32855)
        seen.append((index, ray_get(actor.ping.remote())))
        assert ray_get(actor.describe.remote())["num_envs"] >= 1

    envs = RemoteVectorEnv(
        _fns("CartPole-v1", 3), envs_per_actor=2, on_sub_environment_created=created
    )
    try:
        assert [i for i, _ in seen] == [0, 1, 2]
        assert seen[0][1] == seen[1][1] != seen[2][1]  # envs 0,1 share an actor process
    finally:
        envs.close()


def test_actor_options_reach_ray() -> None:
    from ray.util.state import list_actors

    envs = RemoteVectorEnv(
        _fns("CartPole-v1", 2), envs_per_actor=1,
        actor_options={"num_cpus": 0.25, "name": None, "lifetime": None},
    )
    try:
        ids = {a._actor_id.hex() for a in envs.actors}
        rows = [
            a
            for a in list_actors(address=state_api_address(), detail=True, limit=10_000)
            if a.actor_id in ids
        ]
        assert len(rows) == 2
        for row in rows:
            assert row.required_resources.get("CPU") == 0.25
    finally:
        envs.close()


# ------------------------------------------------------------------ bad input
@pytest.fixture
def cartpole4() -> Any:
    envs = RemoteVectorEnv(_fns("CartPole-v1", 4), envs_per_actor=2)
    envs.reset(seed=0)
    yield envs
    envs.close()


def test_bad_actions_say_what_was_expected(cartpole4: RemoteVectorEnv) -> None:
    with pytest.raises(ValueError, match=r"shape \(4,\).*got shape \(3,\)"):
        cartpole4.step(np.zeros(3, dtype=np.int64))
    with pytest.raises(ValueError, match=r"shape \(4,\).*got shape \(4, 2\)"):
        cartpole4.step(np.zeros((4, 2), dtype=np.int64))
    with pytest.raises(TypeError, match="must be integers"):
        cartpole4.step(np.zeros(4, dtype=np.float32))
    with pytest.raises(TypeError, match="numeric"):
        cartpole4.step(["left", "right", "left", "right"])
    # nothing was sent: the env is still usable
    cartpole4.step(np.zeros(4, dtype=np.int64))


def test_bad_seeds_env_ids_and_masks(cartpole4: RemoteVectorEnv) -> None:
    with pytest.raises(ValueError, match="length must match num_envs=4 but got length=3"):
        cartpole4.reset(seed=[1, 2, 3])
    with pytest.raises(ValueError, match=r"unknown env ids \[7\]: expected ids in \[0, 4\)"):
        cartpole4.send(np.zeros(2, dtype=np.int64), [0, 7])
    with pytest.raises(ValueError, match=r"unknown env ids \[-1\]"):
        cartpole4.send(np.zeros(1, dtype=np.int64), [-1])
    with pytest.raises(ValueError, match="must not repeat"):
        cartpole4.send(np.zeros(2, dtype=np.int64), [1, 1])
    with pytest.raises(ValueError, match=r"shape \(2,\).*got shape \(3,\)"):
        cartpole4.send(np.zeros(3, dtype=np.int64), [0, 1])
    with pytest.raises(errors.NoAsyncCallError, match="nothing sent"):
        cartpole4.recv()
    with pytest.raises(TypeError, match="reset_mask"):
        cartpole4.reset(options={"reset_mask": [True] * 4})
    cartpole4.step(np.zeros(4, dtype=np.int64))


def test_bad_constructor_arguments() -> None:
    with pytest.raises(ValueError, match="at least one"):
        RemoteVectorEnv([])
    with pytest.raises(TypeError, match=r"env_fns\[1\] must be a callable"):
        RemoteVectorEnv([_fns("CartPole-v1", 1)[0], "CartPole-v1"])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="envs_per_actor must be an int >= 1, got 0"):
        RemoteVectorEnv(_fns("CartPole-v1", 2), envs_per_actor=0)
    with pytest.raises(ValueError, match=r"transport must be 'auto' .* or 'ray' .*got 'socket'"):
        RemoteVectorEnv(_fns("CartPole-v1", 2), transport="socket")


def test_env_fn_raising_on_construction_names_the_env_and_leaks_nothing() -> None:
    before = alive_actor_ids()
    fns = [*_fns("CartPole-v1", 3), functools.partial(examples.broken_env, "no simulator licence")]
    with pytest.raises(errors.SubEnvironmentError) as info:
        RemoteVectorEnv(fns, envs_per_actor=2)
    assert info.value.index == 3
    assert "sub-environment 3" in str(info.value)
    assert "no simulator licence" in str(info.value)
    assert "Traceback" in info.value.remote_traceback
    from ray_checks import wait_for

    wait_for(lambda: alive_actor_ids() <= before, what="no actors left behind")


def test_close_leaves_no_actors() -> None:
    before = alive_actor_ids()
    envs = RemoteVectorEnv(_fns("CartPole-v1", 6), envs_per_actor=2)
    assert len(alive_actor_ids() - before) == 3
    envs.reset(seed=0)
    envs.send(np.zeros(6, dtype=np.int64))  # close with calls in flight
    envs.close()
    from ray_checks import wait_for

    wait_for(lambda: alive_actor_ids() <= before, what="no actors left after close")


def ray_get(ref: Any) -> Any:
    import ray

    return ray.get(ref, timeout=60)


def ray_kill(actor: Any) -> None:
    import ray

    ray.kill(actor)
