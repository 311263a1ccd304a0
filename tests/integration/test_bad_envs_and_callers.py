"""remote_env under bad envs and bad callers (issue 15), on real Ray, both transports.

Hangs seen during a send/recv loop, one env's malformed result failing that env
only, results the driver cannot decode, transports that agree, caller errors
raised before anything is sent, and a replacement in backoff stalling no one.
"""

from __future__ import annotations

import functools
import os
import statistics
import time
from typing import Any

import bad_envs
import gymnasium as gym
import numpy as np
import pytest
from prometheus_client import CollectorRegistry
from ray_checks import wait_for

from remote_env import errors, examples
from remote_env.driver.vector import RemoteVectorEnv

pytestmark = pytest.mark.usefixtures("ray_local")
bad_envs.register()
TRANSPORTS = ["auto", "ray"]


def cartpole() -> Any:
    return functools.partial(gym.make, "CartPole-v1")


def once(tmp: Any, name: str) -> str:
    return str(tmp / f"{name}-{len(os.listdir(tmp))}")


def failures(reg: CollectorRegistry) -> float:
    return sum(reg.get_sample_value("envpool_env_failures_total",
                                    {"pool": "default", "reason": r}) or 0.0
               for r in ("exception", "actor_died", "timeout"))


# ------------------------------------------------------------ hangs in recv()
@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("batch_wait_ms", [2.0, 5.0])
def test_a_hang_is_seen_during_recv_while_the_others_keep_flowing(
        transport: str, batch_wait_ms: float, tmp_path: Any) -> None:
    timeout_s = 1.0
    hang = functools.partial(examples.FaultyEnv, hang_at_step=3,
                             once_file=once(tmp_path, "hang"))
    envs = RemoteVectorEnv([hang] + [cartpole()] * 7, envs_per_actor=1, transport=transport,
                           batch_wait_ms=batch_wait_ms, step_timeout_s=timeout_s,
                           restart_failed_sub_environments=True)
    try:
        envs.async_reset(seed=0)
        sent_at = np.zeros(8)
        others = 0
        latency = None
        deadline = time.monotonic() + 30
        while latency is None and time.monotonic() < deadline:
            _, _, _, trunc, info = envs.recv(timeout=10)
            ids = info["env_id"]
            if "error" in info and info["_error"][ids == 0].any():
                assert "timeout" in info["error"][ids == 0][0]
                assert trunc[ids == 0][0]
                latency = time.perf_counter() - sent_at[0]
            others += int((ids != 0).sum())
            sent_at[ids] = time.perf_counter()
            envs.send(np.zeros(len(ids), dtype=np.int64), ids)
        assert latency is not None, "the hang was never reported"
        assert latency <= timeout_s + batch_wait_ms / 1000 + 0.5, latency
        assert others >= 100, f"the healthy envs stalled: {others} steps"
        # the replaced env steps on
        wait_for(lambda: _recv_ids(envs).count(0) > 0, what="env 0 back")
    finally:
        envs.close()


def _recv_ids(envs: RemoteVectorEnv) -> list[int]:
    _, _, _, _, info = envs.recv(timeout=30)
    ids = info["env_id"]
    envs.send(np.zeros(len(ids), dtype=np.int64), ids)
    return list(ids.tolist())


# ------------------------------------------------- one env's malformed result
@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("kind", ["str_reward", "obs_shape", "array_terminated"])
def test_a_malformed_result_is_that_envs_failure_only(kind: str, transport: str,
                                                      tmp_path: Any) -> None:
    reg = CollectorRegistry()
    bad = functools.partial(bad_envs.BadResultEnv, kind, 5, once(tmp_path, kind))
    fns = [cartpole(), cartpole(), bad, cartpole()]
    envs = RemoteVectorEnv(fns, envs_per_actor=4, transport=transport, registry=reg,
                           restart_failed_sub_environments=True)
    sync = gym.vector.SyncVectorEnv([cartpole()] * 4)
    try:
        np.testing.assert_array_equal(envs.reset(seed=1)[0], sync.reset(seed=1)[0])
        for t in range(1, 8):
            a = np.array([t % 2] * 4)
            r, s = envs.step(a), sync.step(a)
            for e in (0, 1, 3):  # the siblings' results are delivered, unchanged
                np.testing.assert_array_equal(r[0][e], s[0][e])
                assert r[1][e] == s[1][e] and r[2][e] == s[2][e] and r[3][e] == s[3][e]
            if t == 5:
                assert r[4]["_error"].tolist() == [False, False, True, False]
                assert "MalformedResultError" in r[4]["error"][2], r[4]["error"][2]
                assert r[3][2], "the env's failed step is a truncated episode end"
        assert envs.restart_counts.tolist() == [0, 0, 1, 0]
        assert failures(reg) == 1
    finally:
        envs.close()
        sync.close()


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_malformed_result_without_restarts_names_the_culprit(transport: str) -> None:
    bad = functools.partial(bad_envs.BadResultEnv, "str_reward", 2)
    envs = RemoteVectorEnv([cartpole(), cartpole(), bad], envs_per_actor=3, transport=transport)
    try:
        envs.reset(seed=0)
        envs.step(np.zeros(3, dtype=np.int64))
        with pytest.raises(errors.SubEnvironmentError) as info:
            envs.step(np.zeros(3, dtype=np.int64))
        assert info.value.index == 2
        assert "reward '1.0' (str), expected a real number" in str(info.value)
    finally:
        envs.close()


@pytest.mark.parametrize("envs_per_actor", [1, 2])
def test_mixed_spaces_are_refused_at_construction(envs_per_actor: int) -> None:
    fns = [cartpole(), functools.partial(gym.make, "FrozenLake-v1")]
    with pytest.raises(RuntimeError, match="sub-environment 1 has observation space Discrete"):
        RemoteVectorEnv(fns, envs_per_actor=envs_per_actor)


# ---------------------------------------------- results the driver can't read
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_an_undecodable_result_does_not_wedge_the_vector_env(transport: str,
                                                             tmp_path: Any) -> None:
    reg = CollectorRegistry()
    bad = functools.partial(bad_envs.UndecodableInfoEnv, 3, once(tmp_path, "undecodable"))
    envs = RemoteVectorEnv([cartpole(), bad, cartpole(), cartpole()], envs_per_actor=2,
                           transport=transport, registry=reg,
                           restart_failed_sub_environments=True)
    try:
        envs.reset(seed=0)
        for _ in range(2):
            envs.step(np.zeros(4, dtype=np.int64))
        with pytest.raises(errors.ResultError) as info:
            envs.step(np.zeros(4, dtype=np.int64))
        assert info.value.index == 0
        assert "sub-environments [0, 1] could not be received" in str(info.value)
        assert "only_in_the_actors_runtime_env" in str(info.value)
        # nothing left pending: the env steps and resets on
        envs.step(np.zeros(4, dtype=np.int64))
        envs.reset(seed=1)
        envs.send(np.zeros(4, dtype=np.int64))
        got: set[int] = set()
        while len(got) < 4:
            got |= set(envs.recv(timeout=30)[4]["env_id"].tolist())
        assert failures(reg) == 0, "not an env failure: nothing is restarted"
    finally:
        envs.close()


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_both_transports_carry_objects_plain_pickle_cannot_name(transport: str) -> None:
    envs = RemoteVectorEnv([bad_envs.OpaqueInfoEnv] * 2, envs_per_actor=2, transport=transport)
    try:
        envs.reset(seed=0)
        info = envs.step(np.zeros(2, dtype=np.int64))[4]
        assert [o.value for o in info["opaque"]] == [1, 1]
        assert type(info["opaque"][0]).__name__ == "Opaque"
    finally:
        envs.close()


# ----------------------------------------------------------- caller errors
@pytest.fixture
def counted() -> Any:
    reg = CollectorRegistry()
    envs = RemoteVectorEnv([cartpole()] * 4, envs_per_actor=2, registry=reg,
                           restart_failed_sub_environments=True)
    sync = gym.vector.SyncVectorEnv([cartpole()] * 4)
    envs.reset(seed=3)
    sync.reset(seed=3)
    yield envs, sync, reg
    envs.close()
    sync.close()


def test_caller_errors_are_raised_before_anything_is_sent(counted: Any) -> None:
    envs, sync, reg = counted
    with pytest.raises(ValueError, match=r"actions for env ids \[1, 3\] are outside Discrete"):
        envs.step(np.array([0, 2, 1, -1]))
    with pytest.raises(ValueError, match=r"actions for env ids \[2\] are outside Discrete"):
        envs.send(np.array([1, 5]), [1, 2])
    with pytest.raises(TypeError):
        sync.step(0)
    with pytest.raises(TypeError, match="got a scalar int"):
        envs.step(0)
    with pytest.raises(TypeError, match=r"seeds for env ids \[1, 2\] must be ints"):
        envs.reset(seed=[0, 1.5, "2", None])
    with pytest.raises(TypeError, match=r"seeds for env ids \[0\] must be ints"):
        envs.reset(seed=[True, 1, 2, 3])
    with pytest.raises(ValueError, match=r"seeds for env ids \[3\] must be >= 0"):
        envs.reset(seed=[0, 1, 2, -4])
    with pytest.raises(ValueError, match="seed must be an int >= 0"):
        envs.reset(seed=-1)
    with pytest.raises(TypeError, match="seed must be None, an int or a list"):
        envs.reset(seed="42")
    # nothing was sent: the envs are where the reference is, nothing failed or restarted
    for t in range(20):
        a = np.array([t % 2, 1, 0, 1])
        r, s = envs.step(a), sync.step(a)
        np.testing.assert_array_equal(r[0], s[0])
        np.testing.assert_array_equal(r[3], s[3])
    assert failures(reg) == 0 and envs.restart_counts.sum() == 0


def test_a_step_before_any_reset_is_refused_as_gymnasium_does() -> None:
    # It was sent: with an env failing its first step the actor had no observation to
    # return, the driver raised a shape error and the vector env stayed pending forever.
    reg = CollectorRegistry()
    fns = [functools.partial(examples.make_flaky_cartpole, 1)] * 4
    envs = RemoteVectorEnv(fns, envs_per_actor=2, registry=reg, restart_failed_sub_environments=True,
                           restart_backoff_s=0.0)
    sync = gym.vector.SyncVectorEnv([cartpole()] * 2)
    try:
        with pytest.raises(gym.error.ResetNeeded):
            sync.step(np.zeros(2, dtype=np.int64))  # the reference refuses it too
        with pytest.raises(gym.error.ResetNeeded, match=r"sub-environments \[0, 1, 2, 3\] were never reset"):
            envs.step(np.zeros(4, dtype=np.int64))
        envs.reset(options={"reset_mask": np.array([True, True, False, False])})
        with pytest.raises(gym.error.ResetNeeded, match=r"sub-environments \[3\] were never reset"):
            envs.send(np.zeros(2, dtype=np.int64), [1, 3])
        assert failures(reg) == 0  # nothing was sent
        # after a reset every env steps; each of these fails as injected, as a truncation
        envs.reset(seed=0)
        _, _, _, trunc, info = envs.step(np.zeros(4, dtype=np.int64))
        assert trunc.all() and all("injected failure" in e for e in info["error"])
    finally:
        envs.close()
        sync.close()


# ---------------------------------------- a replacement in backoff stalls no one
def _healthy_rate(envs: RemoteVectorEnv, seconds: float, healthy: set[int]) -> float:
    """Steps/s of the ``healthy`` envs in a send/recv loop over ``seconds``."""
    n = 0
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        _, _, _, _, info = envs.recv(timeout=30)
        ids = info["env_id"]
        n += sum(1 for e in ids.tolist() if e in healthy)
        envs.send(np.zeros(len(ids), dtype=np.int64), ids)
    return n / (time.perf_counter() - t0)


def test_one_actor_in_backoff_keeps_the_others_at_80_percent(tmp_path: Any) -> None:
    """The benchmark figure: healthy envs' recv() throughput with one actor in backoff
    against the same loop without faults (median of 3 windows each, alternating)."""
    healthy = {1, 2, 3}
    calm = RemoteVectorEnv([cartpole()] * 4, envs_per_actor=1, batch_wait_ms=0)
    dying = functools.partial(bad_envs.DyingEnv, once(tmp_path, "dying"))
    faulty = RemoteVectorEnv([dying] + [cartpole()] * 3, envs_per_actor=1,
                             batch_wait_ms=0, restart_failed_sub_environments=True,
                             max_restarts=100, restart_backoff_s=4.0)
    try:
        calm.async_reset(seed=0)
        faulty.async_reset(seed=0)
        _healthy_rate(calm, 0.5, healthy)  # warm up
        rates: dict[str, list[float]] = {"calm": [], "backoff": []}
        for _ in range(3):
            rates["calm"].append(_healthy_rate(calm, 1.0, healthy))
            # wait (stepping) for env 0's actor to be in backoff after its crash loop
            wait_for(lambda: _healthy_rate(faulty, 0.05, healthy) >= 0
                     and faulty.hosts()[0].retry_at is not None
                     and faulty.hosts()[0].retry_at - time.perf_counter() > 1.5,
                     timeout=120, what="env 0's actor in backoff")
            rates["backoff"].append(_healthy_rate(faulty, 1.0, healthy))
        calm_rate = statistics.median(rates["calm"])
        backoff_rate = statistics.median(rates["backoff"])
        print(f"\nhealthy envs' recv() steps/s: fault-free {calm_rate:.0f}, one actor in "
              f"backoff {backoff_rate:.0f} ({backoff_rate / calm_rate:.0%}); {rates}")
        assert backoff_rate >= 0.8 * calm_rate, rates
    finally:
        calm.close()
        faulty.close()
