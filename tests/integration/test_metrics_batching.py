"""Pool metrics from a real faulty workload, over HTTP; recv() honours batch_wait_ms."""

from __future__ import annotations

import functools
import time
import urllib.request

import numpy as np
import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from remote_env import examples
from remote_env.driver.vector import RemoteVectorEnv
from remote_env.metrics import serve_metrics

pytestmark = pytest.mark.usefixtures("ray_local")


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_metrics_of_a_faulty_pool_over_http() -> None:
    reg = CollectorRegistry()
    flaky = functools.partial(examples.make_flaky_cartpole, 7)
    envs = RemoteVectorEnv([flaky] * 4, envs_per_actor=2, restart_failed_sub_environments=True,
                           registry=reg, pool="flaky")
    server = serve_metrics(reg, 0)
    try:
        envs.reset(seed=0)
        for _ in range(20):
            envs.step(np.zeros(4, dtype=np.int64))
        # each env fails on its 7th, 14th step of a lifetime; a restart starts a new lifetime
        failures = reg.get_sample_value("envpool_env_failures_total",
                                        {"pool": "flaky", "reason": "exception"})
        assert failures == envs.restart_counts.sum() >= 4
        got = scrape(server.server_port)
        p = (("pool", "flaky"),)
        assert got[("envpool_env_failures_total", (*p, ("reason", "exception")))] == failures
        assert got[("envpool_env_failures_total", (*p, ("reason", "actor_died")))] == 0
        assert got[("envpool_env_restarts_total", p)] == failures
        assert got[("envpool_actor_restarts_total", p)] == 0
        assert got[("envpool_polls_total", p)] == 20
        assert got[("envpool_env_steps_total", p)] == 80
        assert got[("envpool_poll_batch_size_count", p)] == 20
        assert got[("envpool_poll_batch_size_sum", p)] == 80
        assert got[("envpool_poll_wait_seconds_count", p)] == 20
        assert got[("envpool_envs", (*p, ("state", "running")))] == 4
        assert got[("envpool_envs", (*p, ("state", "failed")))] == 0
    finally:
        server.shutdown()
        envs.close()
    # a closed pool stops reporting env states
    assert reg.get_sample_value("envpool_envs", {"pool": "flaky", "state": "running"}) is None


@pytest.mark.parametrize("batch_wait_ms", [5.0, 25.0])
def test_recv_waits_about_batch_wait_ms_for_stragglers(batch_wait_ms: float) -> None:
    """One env never answers in time: recv returns the others after ~batch_wait_ms."""
    fast = functools.partial(examples.make_slow_cartpole, 0.0)
    slow = functools.partial(examples.make_slow_cartpole, 3000.0)
    envs = RemoteVectorEnv([slow, fast, fast], envs_per_actor=1, batch_wait_ms=batch_wait_ms)
    try:
        envs.reset(seed=0)
        envs.send(np.zeros(1, dtype=np.int64), [0])  # env 0 is busy for 3 s
        waits = []
        idle = [1, 2]
        for _ in range(15):
            envs.send(np.zeros(len(idle), dtype=np.int64), idle)
            # let the fast envs finish: recv then only waits the batch window for env 0
            # (one that is late under load is returned by a later recv: the window is
            # still what recv waits, since env 0 is never ready)
            time.sleep(0.02)
            t0 = time.perf_counter()
            _, _, _, _, info = envs.recv(timeout=10)
            waits.append(time.perf_counter() - t0)
            idle = info["env_id"].tolist()
            assert idle and set(idle) <= {1, 2}, idle
        p50 = float(np.median(waits))
        print(f"batch_wait_ms={batch_wait_ms}: recv p50={p50 * 1000:.1f} ms "
              f"max={max(waits) * 1000:.1f} ms")
        assert p50 >= 0.8 * batch_wait_ms / 1000, "returned before the batch window"
        assert p50 <= batch_wait_ms / 1000 + 0.05, "overshot the batch window by > 50 ms"
    finally:
        envs.close()


def test_recv_does_not_spin_when_nothing_is_ready() -> None:
    """A recv blocked on slow envs sleeps in ray.wait: little driver CPU used."""
    slow = functools.partial(examples.make_slow_cartpole, 1500.0)
    envs = RemoteVectorEnv([slow] * 2, envs_per_actor=1, batch_wait_ms=0)
    try:
        envs.reset(seed=0)
        envs.send(np.zeros(2, dtype=np.int64))
        c0, t0 = time.process_time(), time.perf_counter()
        got = 0
        while got < 2:
            _, _, _, _, info = envs.recv(timeout=10)
            got += len(info["env_id"])
        cpu, wall = time.process_time() - c0, time.perf_counter() - t0
        assert wall >= 1.0
        assert cpu < 0.3 * wall, f"recv busy-spun: {cpu:.2f}s CPU in {wall:.2f}s"
    finally:
        envs.close()


