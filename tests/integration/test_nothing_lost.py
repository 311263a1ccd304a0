"""Issue #28, driver side: nothing lost, nothing stuck, on real Ray, both transports.

Actions follow their env ids in any order; close() lets every sub-env close; an
interrupt (Ctrl-C, from a timer thread) in step/reset/step_wait/recv, or while a
large pickled reply is being read, leaves a call that resumes or a call that is
over; a recv() that raises keeps the healthy siblings' results; time options
follow one rule; mixed observation spaces fail with gymnasium's own message.
"""

from __future__ import annotations

import functools
import os
import re
import signal
import time
import warnings
from typing import Any

import bad_envs
import gymnasium as gym
import numpy as np
import pytest
from interrupting import Interrupter, interrupted
from ray_checks import alive_actor_ids, wait_for

from remote_env import errors, examples
from remote_env.driver.vector import RemoteVectorEnv

pytestmark = pytest.mark.usefixtures("ray_local")
bad_envs.register()
TRANSPORTS = ["auto", "ray"]


def cartpole() -> Any:
    return functools.partial(gym.make, "CartPole-v1")


def recv_all(envs: RemoteVectorEnv, n: int) -> dict[int, Any]:
    """recv() until ``n`` envs came back: {env id: its obs}."""
    got: dict[int, Any] = {}
    while len(got) < n:
        obs, _, _, _, info = envs.recv(timeout=30)
        for j, e in enumerate(info["env_id"].tolist()):
            assert e not in got, f"env {e} returned twice"
            got[e] = obs[j]
    return got


# ---------------------------------------------------- 1. actions follow their ids
@pytest.mark.parametrize("transport", ["auto", "pickle", "ray"])
def test_a_send_naming_every_env_in_any_order_gives_each_env_its_own_action(
        transport: str) -> None:
    n = 4
    envs = RemoteVectorEnv([cartpole()] * n, envs_per_actor=2, transport=transport)
    sync = gym.vector.SyncVectorEnv([cartpole()] * n)
    rng = np.random.default_rng(0)
    try:
        np.testing.assert_array_equal(envs.reset(seed=5)[0], sync.reset(seed=5)[0])
        for order in ([2, 0, 3, 1], [3, 2, 1, 0], [1, 0, 2, 3], [0, 1, 3, 2]):
            by_id = rng.integers(0, 2, size=n)
            ids = np.array(order)
            envs.send(by_id[ids], ids)  # actions in the order of ids
            got = recv_all(envs, n)
            want = sync.step(by_id)[0]
            for e in range(n):
                np.testing.assert_array_equal(got[e], want[e], err_msg=f"env {e}, {order}")
        # a send/recv loop sending back each batch as it came, joined in arrival order
        pending: list[int] = []
        envs.send(np.zeros(n, dtype=np.int64), np.array([3, 1, 0, 2]))
        sync.step(np.zeros(n, dtype=np.int64))
        got = recv_all(envs, n)
        pending = list(reversed(got))
        by_id = np.array([1, 0, 0, 1])
        envs.send(by_id[pending], pending)
        got = recv_all(envs, n)
        want = sync.step(by_id)[0]
        for e in range(n):
            np.testing.assert_array_equal(got[e], want[e])
    finally:
        envs.close()
        sync.close()


# ------------------------------------------------------- 2. close() lets envs close
def test_close_waits_for_every_sub_envs_own_close(tmp_path: Any) -> None:
    paths = [str(tmp_path / f"env-{i}") for i in range(12)]
    fns = [functools.partial(bad_envs.ClosingEnv, p, 0.3) for p in paths]
    envs = RemoteVectorEnv(fns, envs_per_actor=3)
    envs.reset(seed=0)
    envs.step(np.zeros(12, dtype=np.int64))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # every env closed cleanly: no warning
        envs.close()
    assert [os.path.exists(p) for p in paths] == [True] * 12
    sync = gym.vector.SyncVectorEnv(
        [functools.partial(bad_envs.ClosingEnv, p + "-sync", 0.0) for p in paths[:4]])
    sync.close()
    assert all(os.path.exists(p + "-sync") for p in paths[:4])  # the reference


def test_close_names_envs_whose_close_failed_or_timed_out(tmp_path: Any) -> None:
    fns = [functools.partial(bad_envs.ClosingEnv, str(tmp_path / "ok"), 0.0),
           functools.partial(bad_envs.ClosingEnv, str(tmp_path / "bad"), 0.0, True),
           functools.partial(bad_envs.ClosingEnv, str(tmp_path / "slow"), 30.0)]
    envs = RemoteVectorEnv(fns, envs_per_actor=1, close_timeout_s=1.0)
    t0 = time.monotonic()
    with pytest.warns(RuntimeWarning) as caught:
        envs.close()
    assert time.monotonic() - t0 < 10, "close() is bounded by close_timeout_s"
    text = " ".join(str(w.message) for w in caught)
    assert "sub-environment 1: OSError: could not save" in text, text
    assert "sub-environments [2]: close() did not finish within close_timeout_s=1.0" in text
    assert "sub-environment 0" not in text
    assert os.path.exists(tmp_path / "ok")
    envs.close()  # idempotent


# ------------------------------------------------------------------ 3. interrupts
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_an_interrupted_step_stays_pending_and_step_wait_returns_it(transport: str) -> None:
    fns = [functools.partial(bad_envs.SlowEnv, 1.5)] + [cartpole()] * 3
    envs = RemoteVectorEnv(fns, envs_per_actor=2, transport=transport)
    sync = gym.vector.SyncVectorEnv([cartpole()] * 4)
    try:
        np.testing.assert_array_equal(envs.reset(seed=1)[0], sync.reset(seed=1)[0])
        a = np.array([1, 0, 1, 0])
        assert interrupted(0.3, lambda: envs.step(a))
        # one state: still pending; step() refused as in AsyncVectorEnv, step_wait resumes
        with pytest.raises(errors.AlreadyPendingCallError):
            envs.step(a)
        with pytest.raises(errors.AlreadyPendingCallError):
            envs.reset()
        with pytest.raises(errors.NoAsyncCallError):
            envs.recv()
        obs = envs.step_wait(timeout=30)[0]
        np.testing.assert_array_equal(obs, sync.step(a)[0])
        # and on: the next step works and agrees
        np.testing.assert_array_equal(envs.step(a)[0], sync.step(a)[0])
    finally:
        envs.close()
        sync.close()


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_an_interrupted_step_wait_resumes(transport: str) -> None:
    fns = [functools.partial(bad_envs.SlowEnv, 1.5)] * 2
    envs = RemoteVectorEnv(fns, envs_per_actor=1, transport=transport)
    sync = gym.vector.SyncVectorEnv([cartpole()] * 2)
    try:
        envs.reset(seed=2)
        sync.reset(seed=2)
        a = np.array([0, 1])
        envs.step_async(a)
        assert interrupted(0.3, envs.step_wait)
        assert interrupted(0.2, envs.step_wait)  # twice: still the same pending step
        np.testing.assert_array_equal(envs.step_wait(timeout=30)[0], sync.step(a)[0])
    finally:
        envs.close()
        sync.close()


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_an_interrupted_reset_is_over_and_the_next_call_works(transport: str) -> None:
    fns = [functools.partial(bad_envs.SlowEnv, 0.0, 1.5)] * 2 + [cartpole()] * 2
    envs = RemoteVectorEnv(fns, envs_per_actor=2, transport=transport)
    sync = gym.vector.SyncVectorEnv([cartpole()] * 4)
    try:
        assert interrupted(0.3, lambda: envs.reset(seed=3))
        with pytest.raises(errors.NoAsyncCallError):
            envs.step_wait()
        obs, _ = envs.reset(seed=4)  # the next call works (the cut-short reset is waited out)
        np.testing.assert_array_equal(obs, sync.reset(seed=4)[0])
        a = np.array([1, 1, 0, 0])
        np.testing.assert_array_equal(envs.step(a)[0], sync.step(a)[0])
        assert interrupted(0.3, lambda: envs.reset(seed=5))
        envs.send(np.zeros(4, dtype=np.int64))  # a send after it works too
        assert sorted(recv_all(envs, 4)) == [0, 1, 2, 3]
    finally:
        envs.close()
        sync.close()


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_an_interrupted_recv_keeps_every_env_in_flight(transport: str) -> None:
    fns = [functools.partial(bad_envs.SlowEnv, 1.0)] * 2 + [cartpole()] * 2
    envs = RemoteVectorEnv(fns, envs_per_actor=1, transport=transport, batch_wait_ms=0)
    try:
        envs.reset(seed=0)
        envs.send(np.zeros(4, dtype=np.int64))
        got = recv_all(envs, 2)  # the fast ones
        assert sorted(got) == [2, 3]
        assert interrupted(0.2, lambda: envs.recv(timeout=30))
        with pytest.raises(errors.AlreadyPendingCallError):
            envs.send(np.zeros(2, dtype=np.int64), [0, 1])  # still in flight
        assert sorted(recv_all(envs, 2)) == [0, 1]  # nothing lost
        with pytest.raises(errors.NoAsyncCallError):
            envs.recv(timeout=1)
    finally:
        envs.close()


@pytest.mark.parametrize("transport", ["auto", "ray"])
def test_interrupts_while_large_replies_are_read_lose_and_desync_nothing(
        transport: str) -> None:
    envs = RemoteVectorEnv([functools.partial(bad_envs.BigDictEnv, 64)] * 2, envs_per_actor=1,
                           transport=transport)
    try:
        obs, _ = envs.reset(seed=[10, 20])
        total = np.array([10.0, 20.0])
        delays = [0.001, 0.005, 0.01, 0.02, 0.03, 0.05, 0.08, 0.12]
        hits = 0
        for k, delay in enumerate(delays):
            a = np.array([k % 2, 1])
            was, result = Interrupter(delay).run(lambda a=a: envs.step(a))
            total += 1 + a
            if was:
                hits += 1
                try:
                    result = envs.step_wait(timeout=10)  # resumes; never a garbage frame
                except errors.NoAsyncCallError:  # Ctrl-C came before step() sent anything
                    result = envs.step(a)
            obs = result[0]
            assert obs["big"][:, 0].tolist() == total.tolist()
            assert obs["big"][:, -1].tolist() == total.tolist()
            assert obs["t"].tolist() == [k + 1, k + 1]
        assert hits >= 3, "the interrupts never landed in a call"
    finally:
        envs.close()


@pytest.mark.parametrize("transport", ["auto", "ray"])
def test_interrupts_in_recv_of_large_replies_lose_and_desync_nothing(transport: str) -> None:
    envs = RemoteVectorEnv([functools.partial(bad_envs.BigDictEnv, 64)] * 2, envs_per_actor=1,
                           transport=transport)
    try:
        envs.reset(seed=[10, 20])
        total = np.array([10.0, 20.0])
        delays = [0.001, 0.005, 0.01, 0.02, 0.03, 0.05, 0.08, 0.12]
        hits = 0
        # a send/recv loop with interrupts in recv; recv(timeout=10) always returns
        for delay in delays:
            envs.send(np.zeros(2, dtype=np.int64))
            total += 1
            got: dict[int, Any] = {}
            first = True
            while len(got) < 2:  # Ctrl-C in the first recv() after each send
                was, result = Interrupter(delay if first else 1e9).run(
                    lambda: envs.recv(timeout=10))
                hits += was
                first = False
                if not was:
                    for j, e in enumerate(result[4]["env_id"].tolist()):
                        assert e not in got, f"env {e} returned twice"
                        got[e] = result[0]["big"][j][[0, -1]]
            for e in range(2):
                assert got[e].tolist() == [total[e], total[e]]
        assert hits >= 3, "the interrupts never landed in a call"
    finally:
        envs.close()


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_an_interrupted_call_is_over_and_the_next_call_gets_its_own_answer(
        transport: str) -> None:
    envs = RemoteVectorEnv([bad_envs.SlowEnv] * 2, envs_per_actor=2, transport=transport)
    try:
        envs.reset(seed=0)
        assert interrupted(0.3, lambda: envs.call("pause", 1.5))
        assert envs.call("pause", 0.01) == (0.01, 0.01)  # not the late 1.5s
        envs.send(np.zeros(2, dtype=np.int64))
        assert sorted(recv_all(envs, 2)) == [0, 1]
    finally:
        envs.close()


def test_an_interrupted_construction_leaves_no_actor_behind() -> None:
    before = alive_actor_ids()
    slow = functools.partial(bad_envs.SlowEnv, 0.0, 0.0, 3.0)
    assert interrupted(1.0, lambda: RemoteVectorEnv([slow] * 2, envs_per_actor=1))
    wait_for(lambda: alive_actor_ids() <= before, what="the actors created so far gone")


def test_an_interrupted_close_is_done_all_the_same(tmp_path: Any) -> None:
    fns = [functools.partial(bad_envs.ClosingEnv, str(tmp_path / f"e{i}"), 3.0)
           for i in range(2)]
    before = alive_actor_ids()
    envs = RemoteVectorEnv(fns, envs_per_actor=1)
    assert interrupted(0.5, envs.close)
    assert envs.closed
    envs.close()  # idempotent
    with pytest.raises(errors.ClosedEnvironmentError):
        envs.reset()
    wait_for(lambda: alive_actor_ids() <= before, what="the actors killed")


# ---------------------------------------------- 4. a raising recv() drops nothing
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_recv_that_raises_keeps_the_healthy_siblings_results(transport: str,
                                                               tmp_path: Any) -> None:
    # env 0's reply cannot be unpickled here (ResultError) while envs 2 and 3's actor
    # answered in the same batch window: theirs must come back, not vanish
    bad = functools.partial(bad_envs.UndecodableInfoEnv, 3, str(tmp_path / "once"))
    envs = RemoteVectorEnv([bad, cartpole(), cartpole(), cartpole()], envs_per_actor=2,
                           transport=transport, batch_wait_ms=300.0,
                           restart_failed_sub_environments=True)
    try:
        envs.async_reset(seed=0)
        steps = np.zeros(4, dtype=np.int64)
        free: set[int] = set()  # envs whose call ended in the error: ours to send again
        raised = 0
        for _ in range(12):
            if free:
                envs.send(np.zeros(len(free), dtype=np.int64), sorted(free))
                free.clear()
            try:
                _, _, _, _, info = envs.recv(timeout=30)
            except errors.ResultError as exc:
                raised += 1
                assert exc.index == 0
                free |= {0, 1}
            else:
                ids = info["env_id"]
                steps[ids] += 1
                envs.send(np.zeros(len(ids), dtype=np.int64), ids)
            # every env is in flight (or its result waits) or free: none lost
            assert set(np.flatnonzero(~envs.busy()).tolist()) == free
        assert raised == 1
        assert (steps[2:] >= 8).all(), f"the healthy actor's envs stopped stepping: {steps}"
        assert (steps[:2] >= 6).all(), steps
    finally:
        envs.close()


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_sub_environment_error_from_recv_keeps_the_others_results(transport: str) -> None:
    bad = functools.partial(examples.FaultyEnv, fail_at_step=2)
    envs = RemoteVectorEnv([bad, cartpole()], envs_per_actor=1, transport=transport,
                           batch_wait_ms=500.0)
    try:
        envs.reset(seed=0)
        envs.send(np.zeros(2, dtype=np.int64))
        assert sorted(recv_all(envs, 2)) == [0, 1]
        envs.send(np.zeros(2, dtype=np.int64))
        with pytest.raises(errors.SubEnvironmentError) as info:
            envs.recv(timeout=30)
        assert info.value.index == 0
        # env 1 stepped beside it: the next recv() returns it
        _, _, _, _, got = envs.recv(timeout=30)
        assert 1 in got["env_id"].tolist()
    finally:
        envs.close()


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_step_that_raises_carries_what_arrived_and_the_next_call_works(
        transport: str) -> None:
    bad = functools.partial(examples.FaultyEnv, fail_at_step=2)
    envs = RemoteVectorEnv([bad, cartpole(), cartpole()], envs_per_actor=1,
                           transport=transport)
    try:
        envs.reset(seed=0)
        envs.step(np.zeros(3, dtype=np.int64))
        with pytest.raises(errors.SubEnvironmentError) as info:
            envs.step(np.zeros(3, dtype=np.int64))
        results = info.value.results  # type: ignore[attr-defined]
        assert sorted(results[4]["env_id"].tolist()) == [0, 1, 2]
        with pytest.raises(errors.NoAsyncCallError):
            envs.step_wait()
        envs.send(np.zeros(2, dtype=np.int64), [1, 2])  # the step is over: on we go
        assert sorted(recv_all(envs, 2)) == [1, 2]
    finally:
        envs.close()


# ------------------------------------------------------------- options, one rule
@pytest.mark.parametrize("name", ["start_timeout_s", "step_timeout_s", "close_timeout_s",
                                  "restart_backoff_s", "batch_wait_ms"])
@pytest.mark.parametrize("bad", [-1.0, float("nan"), float("inf"), True, "1"])
def test_bad_time_options_are_refused_at_construction(name: str, bad: Any) -> None:
    with pytest.raises(ValueError, match=f"{name}.* must be a finite number"):
        RemoteVectorEnv([cartpole()], **{name: bad})


def test_start_timeout_none_survives_an_actor_replacement() -> None:
    # it used to be accepted, then fail as float + NoneType on the first replacement
    envs = RemoteVectorEnv([cartpole()] * 2, envs_per_actor=1, start_timeout_s=None,
                           restart_failed_sub_environments=True)
    try:
        envs.reset(seed=0)
        import ray

        pid = ray.get(envs.actors[0].ping.remote())
        os.kill(pid, signal.SIGKILL)
        wait_for(lambda: not os.path.exists(f"/proc/{pid}"), what="the actor's process gone")
        _, _, _, trunc, info = envs.step(np.zeros(2, dtype=np.int64))
        assert trunc[0] and "actor_died" in info["error"][0], (trunc, info)
        envs.step(np.zeros(2, dtype=np.int64))  # the replacement steps
        assert envs.restart_counts.tolist() == [1, 0]
    finally:
        envs.close()


@pytest.mark.parametrize("bad", [float("nan"), -1.0, True])
def test_call_timeouts_follow_the_same_rule(bad: Any) -> None:
    envs = RemoteVectorEnv([cartpole()], envs_per_actor=1)
    try:
        envs.reset(seed=0)
        envs.send(np.zeros(1, dtype=np.int64))
        with pytest.raises(ValueError, match="timeout must be a finite number"):
            envs.recv(timeout=bad)
        envs.recv(timeout=30)  # nothing was lost to the refused call
        envs.step_async(np.zeros(1, dtype=np.int64))
        with pytest.raises(ValueError, match="timeout must be a finite number"):
            envs.step_wait(timeout=bad)
        envs.step_wait(timeout=30)
    finally:
        envs.close()


# ------------------------------------------------ 10. gymnasium's own messages
def test_mixed_observation_spaces_fail_with_gymnasiums_message() -> None:
    # gymnasium's tests/vector/test_observation_mode.py matches this text
    spaces = [gym.spaces.Box(low=0, high=i, shape=(2,)) for i in range(1, 4)]
    with pytest.raises(RuntimeError, match=r"the sub-environments observation spaces are not "
                       r"equivalent. .*If this is intentional, use "
                       r"`observation_mode='different'` instead."):
        RemoteVectorEnv([functools.partial(bad_envs.SpaceEnv, s) for s in spaces], observation_mode="same")
    shapes = [gym.spaces.Box(low=0, high=1, shape=(i + 1,)) for i in range(3)]
    with pytest.raises(RuntimeError, match=re.escape("do not share a common shape and dtype")):
        RemoteVectorEnv([functools.partial(bad_envs.SpaceEnv, s) for s in shapes],
                        observation_mode=(gym.spaces.Box(0, 1, shape=(3, 1)),
                                          gym.spaces.Box(0, 1, shape=(1,))))
