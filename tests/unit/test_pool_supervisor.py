"""ActorSupervisor without Ray: what it shows the pool server (layout version, last error)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from remote_env import spec as spec_mod
from remote_env.metrics import PoolMetrics
from remote_env.pool.launch import ActorLauncher
from remote_env.pool.supervisor import ActorSupervisor


def _supervisor(replicas: int = 2) -> ActorSupervisor:
    pool = spec_mod.parse_spec({"env": {"id": "CartPole-v1"}, "replicas": replicas}, name="p")
    return ActorSupervisor(pool, ray_namespace="ns", metrics=PoolMetrics(CollectorRegistry(), "p"),
                           health_interval_s=1.0,
                           launcher=ActorLauncher(ray_namespace="ns", actor_options={}))


def test_a_new_spec_is_a_new_layout_version_and_the_running_spec() -> None:
    sup = _supervisor()
    before = sup.layout_version
    new = spec_mod.parse_spec({"env": {"id": "CartPole-v1"}, "replicas": 4}, name="p")
    sup.respec(new, now=0.0)
    assert sup.layout_version > before  # the pool server republishes: no flag to reset
    assert sup.spec is new and sup.layout() == [] and sup.slots() == []


def test_a_failed_pass_is_the_last_error_until_an_actor_fails() -> None:
    sup = _supervisor()
    assert sup.last_error == ""
    version = sup.layout_version
    sup.tick_failed("supervision tick failed: RayError: x")
    assert sup.last_error == "supervision tick failed: RayError: x"
    assert sup.layout_version == version  # nothing the lease actor shows changed
