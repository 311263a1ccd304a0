from __future__ import annotations

import urllib.request

from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from remote_env.metrics import PoolMetrics, serve_metrics


def test_pool_metrics_on_injected_registry_and_http() -> None:
    reg = CollectorRegistry()
    a = PoolMetrics(reg, pool="a")
    b = PoolMetrics(reg, pool="b")
    a.observe_poll(4, 0.003)
    a.failures["timeout"].inc()
    b.steps.inc(10)
    a.track_states(lambda: {"running": 3, "failed": 1})
    assert reg.get_sample_value("envpool_polls_total", {"pool": "a"}) == 1
    assert reg.get_sample_value("envpool_polls_total", {"pool": "b"}) == 0
    assert reg.get_sample_value("envpool_env_failures_total", {"pool": "a", "reason": "timeout"}) == 1
    assert reg.get_sample_value("envpool_env_failures_total", {"pool": "a", "reason": "exception"}) == 0
    assert reg.get_sample_value("envpool_envs", {"pool": "a", "state": "failed"}) == 1
    server = serve_metrics(reg, 0)
    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{server.server_port}/metrics").read().decode()
    finally:
        server.shutdown()
    names = {s.name for f in text_string_to_metric_families(text) for s in f.samples}
    assert {"envpool_env_steps_total", "envpool_poll_wait_seconds_bucket", "envpool_envs"} <= names
    a.remove()
    assert reg.get_sample_value("envpool_polls_total", {"pool": "a"}) is None


def test_nothing_registered_globally_at_import() -> None:
    from prometheus_client import REGISTRY

    import remote_env.metrics  # noqa: F401

    assert REGISTRY.get_sample_value("envpool_polls_total", {"pool": "default"}) is None
