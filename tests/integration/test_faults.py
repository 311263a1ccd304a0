"""Real faults on real Ray: exceptions, constructor failures, SIGKILL, node loss, hangs.

Each test checks which envs restarted, that the others' trajectories are unchanged
against a fault-free run with the same seeds and actions, and the exact counters.
"""

from __future__ import annotations

import functools
import os
import signal
import time
from collections.abc import Iterator
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import ray
from gymnasium.vector import AutoresetMode
from prometheus_client import CollectorRegistry
from ray_checks import alive_actor_ids, wait_for

from remote_env import errors, examples
from remote_env.driver.vector import RemoteVectorEnv

N, K, STEPS, SEED = 4, 2, 60, 123


def cartpole() -> Any:
    return functools.partial(gym.make, "CartPole-v1")


def faulty(tmp: Any = None, **kw: Any) -> Any:
    """A FaultyEnv; with ``tmp`` (a directory) the fault fires once per test, not per restart."""
    once = None if tmp is None else str(tmp / f"fault-{len(os.listdir(tmp))}-{sorted(kw)}")
    return functools.partial(examples.FaultyEnv, once_file=once, **kw)


def actions(steps: int = STEPS, n: int = N) -> np.ndarray:
    return np.random.default_rng(7).integers(0, 2, size=(steps, n))


def reference_run(n: int = N, steps: int = STEPS) -> list[tuple[Any, ...]]:
    """The fault-free trajectory: what untouched envs must still produce."""
    sync = gym.vector.SyncVectorEnv([cartpole()] * n)
    out = [sync.reset(seed=SEED)[0]]
    out += [sync.step(a) for a in actions(steps, n)]
    sync.close()
    return out


def counters(registry: CollectorRegistry, pool: str = "default") -> dict[str, float]:
    def get(name: str, **labels: str) -> float:
        return registry.get_sample_value(name, {"pool": pool, **labels}) or 0.0

    return {
        "exception": get("envpool_env_failures_total", reason="exception"),
        "actor_died": get("envpool_env_failures_total", reason="actor_died"),
        "timeout": get("envpool_env_failures_total", reason="timeout"),
        "env_restarts": get("envpool_env_restarts_total"),
        "actor_restarts": get("envpool_actor_restarts_total"),
    }


def run_and_compare(envs: RemoteVectorEnv, untouched: list[int], *, fault: Any = None,
                    fault_at: int = -1) -> list[tuple[Any, ...]]:
    """Step with the reference actions; assert untouched envs match the reference."""
    ref = reference_run()
    obs, _ = envs.reset(seed=SEED)
    np.testing.assert_array_equal(obs, ref[0])
    results = []
    for t, a in enumerate(actions()):
        if t == fault_at and fault is not None:
            fault()
        r = envs.step(a)
        results.append(r)
        for e in untouched:
            np.testing.assert_array_equal(r[0][e], ref[t + 1][0][e], err_msg=f"obs env {e} t {t}")
            assert r[1][e] == ref[t + 1][1][e] and r[2][e] == ref[t + 1][2][e]
            assert r[3][e] == ref[t + 1][3][e], f"trunc env {e} t {t}"
    return results


@pytest.mark.usefixtures("ray_local")
class TestInProcessFaults:
    def test_env_raising_at_step_n_restarts_only_that_env(self, tmp_path: Any) -> None:
        reg = CollectorRegistry()
        fns = [cartpole(), cartpole(), faulty(tmp_path, fail_at_step=10), cartpole()]
        envs = RemoteVectorEnv(fns, envs_per_actor=K, restart_failed_sub_environments=True,
                               registry=reg)
        try:
            # env 3 shares the actor with the failing env 2 and keeps its state
            results = run_and_compare(envs, untouched=[0, 1, 3])
            failed = results[9]
            assert failed[3][2] and not failed[2][2], "the failed step ends the episode: truncated"
            assert failed[4]["_error"].tolist() == [False, False, True, False]
            assert "injected failure at step 10" in failed[4]["error"][2]
            assert envs.restart_counts.tolist() == [0, 0, 1, 0]
            assert counters(reg) == {"exception": 1, "actor_died": 0, "timeout": 0,
                                     "env_restarts": 1, "actor_restarts": 0}
            # the restarted env resets on the next step (NEXT_STEP) and keeps going
            assert results[10][1][2] == 0.0 and not results[10][3][2]
        finally:
            envs.close()

    def test_env_raising_in_reset_is_restarted(self, tmp_path: Any) -> None:
        reg = CollectorRegistry()
        # reset #1 is ours (seeded); reset #2 is the autoreset after the first episode
        fns = [cartpole(), faulty(tmp_path, fail_in_reset=2), cartpole(), cartpole()]
        envs = RemoteVectorEnv(fns, envs_per_actor=K, restart_failed_sub_environments=True,
                               registry=reg)
        try:
            results = run_and_compare(envs, untouched=[0, 2, 3])
            assert envs.restart_counts.tolist() == [0, 1, 0, 0]
            assert counters(reg)["exception"] == 1 and counters(reg)["env_restarts"] == 1
            with_error = [t for t, r in enumerate(results) if "error" in r[4] and r[4]["_error"][1]]
            assert len(with_error) == 1
            assert "injected failure in reset #2" in results[with_error[0]][4]["error"][1]
        finally:
            envs.close()

    def test_constructor_failing_every_time_gives_up_after_max_restarts(self) -> None:
        reg = CollectorRegistry()
        before = alive_actor_ids()
        fns = [cartpole(), functools.partial(examples.broken_env, "simulator binary missing")]
        with pytest.raises(errors.SubEnvironmentFailedError) as info:
            RemoteVectorEnv(fns, envs_per_actor=2, restart_failed_sub_environments=True,
                            max_restarts=3, registry=reg)
        assert info.value.index == 1
        assert "(4 tries)" in str(info.value) and "simulator binary missing" in str(info.value)
        assert "Traceback" in info.value.remote_traceback
        assert counters(reg)["exception"] == 1
        wait_for(lambda: alive_actor_ids() <= before, what="no actors left behind")

    def test_crash_loop_is_bounded_and_names_the_env(self) -> None:
        # fails on every step: reset works, so only counting failed steps stops the loop
        fns = [cartpole(), functools.partial(examples.make_flaky_cartpole, 1)]
        envs = RemoteVectorEnv(fns, envs_per_actor=1, restart_failed_sub_environments=True,
                               max_restarts=2, restart_backoff_s=0.01)
        try:
            envs.reset(seed=0)
            with pytest.raises(errors.SubEnvironmentFailedError) as info:
                for _ in range(20):
                    envs.step(np.zeros(2, dtype=np.int64))
            assert info.value.index == 1
            assert "injected failure" in str(info.value)
            assert "Traceback" in info.value.remote_traceback
        finally:
            envs.close()

    def test_restart_disabled_raises_the_original_error_and_leaks_nothing(self) -> None:
        before = alive_actor_ids()
        envs = RemoteVectorEnv([cartpole(), faulty(fail_at_step=3)], envs_per_actor=1)
        envs.reset(seed=0)
        with pytest.raises(errors.SubEnvironmentError) as info:
            for _ in range(5):
                envs.step(np.zeros(2, dtype=np.int64))
        assert not isinstance(info.value, errors.SubEnvironmentFailedError)
        assert info.value.index == 1
        assert "RuntimeError: injected failure at step 3" in str(info.value)
        assert 'raise RuntimeError(f"injected failure at step' in info.value.remote_traceback
        # still usable: nothing pending, the healthy env steps on after a reset
        envs.reset(seed=1)
        envs.close()
        wait_for(lambda: alive_actor_ids() <= before, what="no actors left behind")

    def test_sigkill_of_an_actor_restarts_its_envs_only(self) -> None:
        reg = CollectorRegistry()
        envs = RemoteVectorEnv([cartpole()] * N, envs_per_actor=K,
                               restart_failed_sub_environments=True, registry=reg)
        victim = envs.actors[1]  # hosts envs 2 and 3
        pid = ray.get(victim.ping.remote())
        assert pid != os.getpid()

        def kill() -> None:
            os.kill(pid, signal.SIGKILL)
            wait_for(lambda: not _pid_alive(pid), what="actor process gone")

        try:
            results = run_and_compare(envs, untouched=[0, 1], fault=kill, fault_at=20)
            hit = results[20]
            assert hit[3].tolist() == [False, False, True, True]
            assert "actor_died" in hit[4]["error"][2]
            assert envs.actors[1] is not victim
            assert ray.get(envs.actors[1].ping.remote()) != pid
            assert envs.restart_counts.tolist() == [0, 0, 1, 1]
            assert counters(reg) == {"exception": 0, "actor_died": 2, "timeout": 0,
                                     "env_restarts": 2, "actor_restarts": 1}
            # the new actor's envs autoreset with restart seeds and step normally
            assert results[21][1][2:].tolist() == [0.0, 0.0]
            assert results[22][1][2:].tolist() == [1.0, 1.0]
        finally:
            envs.close()

    def test_hung_env_is_killed_and_replaced(self, tmp_path: Any) -> None:
        reg = CollectorRegistry()
        fns = [cartpole(), cartpole(), faulty(tmp_path, hang_at_step=5), cartpole()]
        envs = RemoteVectorEnv(fns, envs_per_actor=K, restart_failed_sub_environments=True,
                               step_timeout_s=1.5, registry=reg)
        try:
            t0 = time.monotonic()
            results = run_and_compare(envs, untouched=[0, 1])
            assert time.monotonic() - t0 < 30
            assert results[4][3].tolist() == [False, False, True, True]
            assert "timeout" in results[4][4]["error"][2]
            assert counters(reg) == {"exception": 0, "actor_died": 0, "timeout": 2,
                                     "env_restarts": 2, "actor_restarts": 1}
        finally:
            envs.close()

    def test_hang_without_restarts_raises_instead_of_waiting_forever(self) -> None:
        envs = RemoteVectorEnv([cartpole(), faulty(hang_at_step=2)], envs_per_actor=1,
                               step_timeout_s=1.0)
        try:
            envs.reset(seed=0)
            with pytest.raises(errors.SubEnvironmentError, match="timeout"):
                for _ in range(3):
                    envs.step(np.zeros(2, dtype=np.int64))
        finally:
            envs.close()

    def test_recv_keeps_serving_healthy_envs_while_one_actor_restarts(self) -> None:
        reg = CollectorRegistry()
        envs = RemoteVectorEnv([cartpole()] * N, envs_per_actor=1,
                               restart_failed_sub_environments=True, registry=reg)
        try:
            envs.async_reset(seed=0)
            pid = ray.get(envs.actors[0].ping.remote())
            os.kill(pid, signal.SIGKILL)
            seen_error = False
            steps = {e: 0 for e in range(N)}
            deadline = time.monotonic() + 60
            while min(steps.values()) < 10 and time.monotonic() < deadline:
                _, _, _, _, info = envs.recv(timeout=30)
                ids = info["env_id"]
                if "error" in info and info["_error"].any():
                    assert ids[info["_error"]].tolist() == [0]
                    seen_error = True
                for e in ids.tolist():
                    steps[e] += 1
                envs.send(np.zeros(len(ids), dtype=np.int64), ids)
            assert seen_error and min(steps.values()) >= 10
            assert counters(reg)["actor_restarts"] == 1
        finally:
            envs.close()


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie still answers kill(0); check its state
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


@pytest.fixture
def sim_cluster() -> Iterator[tuple[Any, Any]]:
    """A 2-node ray.cluster_utils.Cluster: a head and one simulator node.

    Env actors ask for the "sim" resource: only simulator nodes have it (not the head).
    """
    from ray.cluster_utils import Cluster

    if ray.is_initialized():
        ray.shutdown()
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    worker = cluster.add_node(num_cpus=1, resources={"sim": 4})
    ray.init(address=cluster.address)
    cluster.wait_for_nodes()
    try:
        yield cluster, worker
    finally:
        ray.shutdown()
        cluster.shutdown()


def test_node_killed_envs_come_back_on_a_healthy_node(sim_cluster: tuple[Any, Any]) -> None:
    """The simulator node's raylet is removed; a replacement node joins."""
    cluster, worker = sim_cluster
    reg = CollectorRegistry()
    envs = None
    try:
        envs = RemoteVectorEnv(
            [cartpole()] * N, envs_per_actor=K, restart_failed_sub_environments=True,
            actor_options={"num_cpus": 0, "resources": {"sim": 1}}, registry=reg,
        )
        assert [_node_of(a) for a in envs.actors] == [worker.node_id] * 2
        envs.reset(seed=SEED)
        envs.step(np.zeros(N, dtype=np.int64))
        # another node than the driver's: stepped over TCP (no shared memory there)
        assert [(h.channel, h.shared, h.tcp) for h in envs.hosts()] == [(True, False, True)] * 2
        cluster.remove_node(worker, allow_graceful=False)
        # a replacement node joins (as Kubernetes re-creates a lost worker pod)
        spare = cluster.add_node(num_cpus=1, resources={"sim": 4})
        # the workers on the lost node notice their raylet is gone within a moment (not
        # necessarily in the same step; a replacement placed there before the node was
        # marked dead dies too and is replaced again)
        cut: set[int] = set()
        for _ in range(200):
            r = envs.step(np.zeros(N, dtype=np.int64))
            for e in np.flatnonzero(r[3]).tolist():
                assert str(r[4]["error"][e]).startswith("actor_died"), r[4]
                cut.add(e)
            if len(cut) == N and {_node_of(a) for a in envs.actors} == {spare.node_id}:
                break
            time.sleep(0.05)
        assert cut == set(range(N)), "every env lived on the lost node: all truncated"
        for _ in range(5):
            r = envs.step(np.ones(N, dtype=np.int64))
        assert not r[3].any()
        assert [_node_of(a) for a in envs.actors] == [spare.node_id] * 2
        c = counters(reg)
        assert c["exception"] == c["timeout"] == 0
        assert c["actor_died"] == c["env_restarts"] == 2 * c["actor_restarts"] >= 4
        assert envs.restart_counts.sum() == c["env_restarts"]
    finally:
        if envs is not None:
            envs.close()


@pytest.mark.parametrize("mode", [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP])
def test_a_replacement_that_cannot_be_placed_fails_after_start_timeout(
    mode: AutoresetMode, sim_cluster: tuple[Any, Any]
) -> None:
    """The only node with the envs' resource is lost and none comes back: the driver
    must not wait forever for the replacement (no step_timeout_s set)."""
    cluster, worker = sim_cluster
    envs = None
    try:
        envs = RemoteVectorEnv(
            [cartpole()] * 2, envs_per_actor=2, restart_failed_sub_environments=True,
            actor_options={"num_cpus": 0, "resources": {"sim": 1}}, start_timeout_s=3.0,
            max_restarts=2,
            autoreset_mode=mode,
        )
        envs.reset(seed=SEED)
        cluster.remove_node(worker, allow_graceful=False)
        t0 = time.monotonic()
        with pytest.raises(errors.SubEnvironmentFailedError) as info:
            # the loss is noticed within seconds; then each replacement gets 3 s to start
            while time.monotonic() - t0 < 120:
                envs.step(np.zeros(2, dtype=np.int64))
                time.sleep(0.05)
        waited = time.monotonic() - t0
        assert "start_timeout_s=3.0" in str(info.value), str(info.value)
        assert waited < 90, f"gave up only after {waited:.0f} s"
    finally:
        if envs is not None:
            envs.close()


def _node_of(actor: Any) -> str | None:
    """The actor's node, or None if it died (the next step replaces it)."""
    try:
        node: str = ray.get(actor.__ray_call__.remote(
            lambda self: ray.get_runtime_context().get_node_id()), timeout=60)
    except ray.exceptions.RayActorError:
        return None
    return node
