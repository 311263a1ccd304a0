"""Settings, metrics, CLI parsing, API error mapping and handler registration."""

from __future__ import annotations

import json

import prometheus_client
import pytest
from kubernetes.client import exceptions as k8s_exceptions

from envpool_operator import cli, kube, metrics, settings


def test_settings_from_env() -> None:
    cfg = settings.from_env({
        "ENVPOOL_IMAGE": "reg/envpool:9",
        "ENVPOOL_WATCH_NAMESPACES": "a, b,,",
        "ENVPOOL_OPERATOR_METRICS_PORT": "9999",
        "ENVPOOL_MAX_WORKERS_PER_POOL": "5",
        "ENVPOOL_RESYNC_SECONDS": "2.5",
    })
    assert cfg.image == "reg/envpool:9"
    assert cfg.namespaces == ("a", "b")
    assert cfg.metrics_port == 9999
    assert cfg.limits.max_workers == 5
    assert cfg.resync_seconds == 2.5
    assert settings.from_env({}) == settings.Settings()


@pytest.mark.parametrize("key", ["ENVPOOL_OPERATOR_METRICS_PORT", "ENVPOOL_RESYNC_SECONDS"])
def test_bad_settings_name_the_variable(key: str) -> None:
    with pytest.raises(ValueError, match=key):
        settings.from_env({key: "many"})


def test_metrics_on_an_injected_registry() -> None:
    reg = prometheus_client.CollectorRegistry()
    m = metrics.OperatorMetrics(reg)
    for result in metrics.RESULTS:  # created up front, at zero
        assert reg.get_sample_value(
            "envpool_operator_reconciles_total", {"result": result}) == 0.0
    m.reconciles.labels(result="retry").inc()
    m.reconcile_duration.observe(0.2)
    assert reg.get_sample_value("envpool_operator_reconciles_total", {"result": "retry"}) == 1.0
    assert reg.get_sample_value("envpool_operator_reconcile_duration_seconds_count") == 1.0
    # nothing on the global registry
    assert prometheus_client.REGISTRY.get_sample_value(
        "envpool_operator_reconciles_total", {"result": "retry"}) is None


def test_metrics_bind_loopback_unless_in_a_pod(monkeypatch: pytest.MonkeyPatch) -> None:
    from remote_env import kubeconfig

    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    assert kubeconfig.default_bind_address() == "127.0.0.1"
    server, _thread = metrics.serve(prometheus_client.CollectorRegistry(), 0)
    try:
        assert server.server_address[0] == "127.0.0.1"
    finally:
        server.shutdown()
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    assert kubeconfig.default_bind_address() == "0.0.0.0"
    cfg = settings.from_env({"ENVPOOL_OPERATOR_METRICS_ADDR": "10.0.0.5"})
    assert cfg.metrics_addr == "10.0.0.5" and settings.Settings().metrics_addr == ""
    assert cli._parser().parse_args(["--metrics-addr", "::1"]).metrics_addr == "::1"


def test_cli_arguments() -> None:
    p = cli._parser()
    a = p.parse_args(["-n", "x", "--namespace", "y", "--liveness", "http://0.0.0.0:8080/healthz",
                      "--metrics-port", "0", "--standalone"])
    assert a.namespace == ["x", "y"] and a.standalone and a.metrics_port == 0
    with pytest.raises(SystemExit):
        p.parse_args(["-n", "x", "--all-namespaces"])


def _api_error(code: int, message: str, kind: str = "Status") -> k8s_exceptions.ApiException:
    body = json.dumps({"kind": kind, "message": message}) if kind else "404 page not found"
    return k8s_exceptions.ApiException(status=code, reason="x", body=body)


@pytest.mark.parametrize(
    ("code", "message", "kind", "reason", "delay"),
    [
        (403, 'configmaps "x" is forbidden: exceeded quota: q, requested: count/configmaps=1',
         "Status", "QuotaExceeded", 60),
        (403, 'rayclusters.ray.io is forbidden: User "op" cannot create', "Status", "Forbidden", 60),
        (404, "", "", "KubeRayMissing", 30),
        (422, "spec.x: Invalid value", "Status", "Invalid", None),
        (409, "conflict", "Status", "ApiError", 5),
        (500, "etcd timeout", "Status", "ApiError", 5),
    ],
)
def test_api_errors_map_to_conditions(
    code: int, message: str, kind: str, reason: str, delay: float | None,
) -> None:
    got = kube.problem_from_api_error(_api_error(code, message, kind), "applying X ns/n")
    assert got.problem.reason == reason
    assert got.delay == delay
    assert got.problem.message.startswith("applying X ns/n")


def test_handlers_register_with_kopf() -> None:
    import kopf

    from envpool_operator import handlers

    registry = kopf.get_default_registry()
    changing = list(registry._changing.get_all_handlers())
    ids = {h.id for h in changing}
    assert {"reconcile_fn", "delete_fn"} <= ids
    assert handlers.reconcile_fn.__name__ == "reconcile_fn"
    # No finalizer on EnvPools: deleting one must not wait for the operator
    # (its children go through the garbage collector). kopf puts one there for
    # any non-optional delete handler, timer or daemon.
    assert not [h.id for h in changing if h.requires_finalizer]
    assert not list(registry._spawning.get_all_handlers())


@pytest.mark.parametrize("module", [
    "remote_env.spec", "remote_env.spec.parse", "remote_env.restarts", "envpool_operator.builders",
    "envpool_operator.status", "envpool_operator.metrics", "envpool_operator.names",
    "envpool_operator.pod_templates", "envpool_operator.access", "envpool_operator.settings",
    "remote_env.spec.pool_report",
    "envpool_operator.runtime", "envpool_operator.reconcile", "envpool_operator.kube",
])
def test_docstring_examples_run(module: str) -> None:
    import doctest
    import importlib

    mod = importlib.import_module(module)
    result = doctest.testmod(mod, optionflags=doctest.ELLIPSIS)
    assert result.failed == 0
    assert result.attempted > 0, f"{module} has no runnable example"


def test_retry_and_resync_settings() -> None:
    cfg = settings.from_env({"ENVPOOL_MAX_RETRY_SECONDS": "3", "ENVPOOL_RESYNC_SECONDS": "30"})
    assert (cfg.max_retry_seconds, cfg.resync_seconds) == (3.0, 30.0)
    with pytest.raises(ValueError, match="ENVPOOL_MAX_RETRY_SECONDS must be > 0"):
        settings.from_env({"ENVPOOL_MAX_RETRY_SECONDS": "0"})


def test_pool_phase_gauge_follows_the_known_pools() -> None:
    reg = prometheus_client.CollectorRegistry()
    m = metrics.OperatorMetrics(reg)
    pools = [("team-a", "cp", "Ready"), ("team-a", "bad", "Failed"), ("team-b", "new", None)]
    m.track_pools(lambda: pools)

    def value(ns: str, pool: str, phase: str) -> float | None:
        return reg.get_sample_value(
            "envpool_pool_phase", {"namespace": ns, "pool": pool, "phase": phase})

    assert value("team-a", "cp", "Ready") == 1.0
    assert value("team-a", "cp", "Degraded") == 0.0
    assert value("team-a", "bad", "Failed") == 1.0
    assert value("team-b", "new", "Pending") == 0.0  # no phase yet: all zero
    pools.pop(0)  # a deleted pool's series go with it
    assert value("team-a", "cp", "Ready") is None
