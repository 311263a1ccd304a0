"""envpool_operator.reconcile: the pure decisions around the API calls.

The API calls themselves (ordering, dry-run before create, retries, no
duplicates) are exercised against the real control plane in
tests/e2e/test_operator_e2e.py; here only what needs no API server.
"""

from __future__ import annotations

from typing import Any

import kopf
import prometheus_client
import pytest

from envpool_operator import builders, metrics, reconcile, settings, status
from envpool_operator import runtime as runtime_mod
from remote_env import restarts

UID = "11111111-2222-3333-4444-555555555555"


def _body(**spec_over: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {"env": {"id": "CartPole-v1"}, "replicas": 16}
    spec.update(spec_over)
    return {
        "apiVersion": "envpool.dev/v1alpha1", "kind": "EnvPool",
        "metadata": {"name": "cp", "namespace": "ns", "uid": UID, "generation": 2},
        "spec": spec, "status": {},
    }


def _runtime(**over: Any) -> runtime_mod.Runtime:
    return runtime_mod.Runtime(settings=settings.Settings(**over),
                               metrics=metrics.OperatorMetrics(prometheus_client.CollectorRegistry()))


class _Log:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def info(self, msg: str) -> None:
        self.lines.append(msg)

    def warning(self, msg: str) -> None:
        self.lines.append(msg)


def _cond(st: dict[str, Any], ctype: str) -> dict[str, Any]:
    return next(c for c in st["conditions"] if c["type"] == ctype)


def test_invalid_spec_is_permanent_before_any_api_call() -> None:
    # No API client is configured in unit tests: any call would raise.
    out = reconcile.reconcile(_body(replicas=0), _runtime(), _Log())
    assert isinstance(out.error, kopf.PermanentError)
    assert out.result == "invalid"
    assert out.status["phase"] == "Failed"
    assert out.status["observedGeneration"] == 2
    assert "spec.replicas: must be in [1, 100000], got 0" in _cond(out.status, "SpecValid")[
        "message"]
    assert _cond(out.status, "Ready")["reason"] == "InvalidSpec"


def test_backoff_doubles_up_to_the_cap() -> None:
    assert [restarts.backoff(5, r, 60) for r in range(6)] == [5, 10, 20, 40, 60, 60]
    assert restarts.backoff(30, 1000, 120) == 120  # no overflow on long outages


def test_no_existing_cluster_is_no_problem() -> None:
    assert reconcile.ownership_problem(None, name="cp", uid=UID) is None


def test_own_cluster_is_updated_in_place() -> None:
    mine = {"metadata": {"name": "cp", "uid": "rc", "ownerReferences": [
        {"kind": "EnvPool", "name": "cp", "uid": UID}]}}
    assert reconcile.ownership_problem(mine, name="cp", uid=UID) is None


def test_foreign_cluster_is_never_taken_over() -> None:
    foreign = {"metadata": {"name": "cp", "uid": "x", "ownerReferences": []}}
    got = reconcile.ownership_problem(foreign, name="cp", uid=UID)
    assert got is not None
    problem, delay = got
    assert problem.reason == "NameConflict"
    assert "not owned by this EnvPool" in problem.message and delay > 0


def test_previous_pools_cluster_is_waited_for() -> None:
    old = {"metadata": {"name": "cp", "uid": "old", "ownerReferences": [
        {"kind": "EnvPool", "name": "cp", "uid": "an-older-uid"}]}}
    got = reconcile.ownership_problem(old, name="cp", uid=UID)
    assert got is not None and got[0].reason == "Rolling"
    assert "garbage-collected" in got[0].message


def test_own_cluster_being_deleted_is_waited_for() -> None:
    going = {"metadata": {"name": "cp", "deletionTimestamp": "2026-01-01T00:00:00Z",
                          "ownerReferences": [{"kind": "EnvPool", "name": "cp", "uid": UID}]}}
    got = reconcile.ownership_problem(going, name="cp", uid=UID)
    assert got is not None and got[0].reason == "Rolling"
    assert got[1] == reconcile.ROLL_POLL_SECONDS


@pytest.mark.parametrize(
    ("reason", "message"),
    [
        ("KubeRayMissing", "the ray.io/v1 RayCluster API is not served: install the KubeRay"),
        ("QuotaExceeded", "applying RayCluster ns/cp: exceeded quota: q"),
        ("Forbidden", "applying ConfigMap ns/cp-pool: forbidden"),
    ],
)
def test_a_problem_becomes_a_pending_condition(reason: str, message: str) -> None:
    st = reconcile.compute(_body(), settings=settings.Settings(), ray_cluster=None,
                           reconciled=False, problem=status.Problem(reason, message))
    assert st["phase"] == "Pending"
    c = _cond(st, "RayClusterReady")
    assert (c["status"], c["reason"], c["message"]) == ("False", reason, message)
    assert _cond(st, "Ready")["reason"] == reason
    assert "observedGeneration" not in st  # the children do not reflect this generation


def test_compute_reflects_the_cached_ray_cluster() -> None:
    runtime = _runtime()
    body = _body()
    pool = settings.parse_pool(body, runtime.settings)
    rc = builders.build_ray_cluster(pool, runtime.settings)
    rc["metadata"]["generation"] = 1
    rc["status"] = {"observedGeneration": 1, "readyWorkerReplicas": 1, "conditions": [
        {"type": "HeadPodReady", "status": "True"},
        {"type": "RayClusterProvisioned", "status": "True"}]}
    st = reconcile.compute(body, settings=runtime.settings, ray_cluster=rc, reconciled=True)
    assert st["phase"] == "Ready"
    assert st["readyEnvs"] == 16 and st["replicas"] == 16
    assert st["observedGeneration"] == 2


def test_refresh_without_a_cached_pool_writes_nothing() -> None:
    # No EnvPool seen yet (operator start-up): nothing to patch, so no API call.
    runtime = _runtime()
    assert not runtime.remember_ray_cluster(("ns", "cp"), {"metadata": {"name": "cp"}})
    assert reconcile.refresh_from_ray_cluster(("ns", "cp"), runtime) is None
    assert (runtime.ray_cluster(("ns", "cp")) or {})["metadata"]["name"] == "cp"


def test_an_answer_older_than_the_watch_does_not_replace_it() -> None:
    # A reconcile applies the RayCluster; KubeRay's status writes reach the watch before
    # the reconcile is done. The apply's answer (older) must not replace them: the pool
    # stayed "Updating" with its workers ready (the resumed pool of issue 34's CI run).
    runtime = _runtime()
    key = ("ns", "cp")
    runtime.remember_pool(key, _body())
    mark = runtime.ray_cluster_mark(key)
    applied = {"metadata": {"name": "cp", "generation": 3}, "status": {"observedGeneration": 2}}
    ready = {"metadata": {"name": "cp", "generation": 3}, "status": {"observedGeneration": 3}}
    runtime.remember_ray_cluster(key, ready)  # the watch, while the apply was answered
    assert not runtime.remember_ray_cluster_read(key, applied, mark)
    assert (runtime.ray_cluster(key) or {})["status"] == {"observedGeneration": 3}
    # no event since the mark: the answer is the newest copy there is
    mark = runtime.ray_cluster_mark(key)
    assert runtime.remember_ray_cluster_read(key, applied, mark)
    assert (runtime.ray_cluster(key) or {})["status"] == {"observedGeneration": 2}
    # the same for the EnvPool's own cache and a fresh read
    mark = runtime.pool_mark(key)
    newer = _body()
    newer["spec"]["replicas"] = 32
    runtime.remember_pool(key, newer)
    assert not runtime.remember_pool_read(key, _body(), mark)
    assert (runtime.pool_body(key) or {})["spec"]["replicas"] == 32
    # deleted while the GET was out (the watch's DELETED forgot it): its answer is not
    # kept, so no ghost of the pool stays in the cache
    mark = runtime.pool_mark(key)
    runtime.forget(key)
    assert not runtime.remember_pool_read(key, _body(), mark)
    assert not runtime.knows_pool(key)


def test_refreshed_status_only_when_something_changes() -> None:
    cfg = settings.Settings()
    body = _body()
    pool = settings.parse_pool(body, cfg)
    rc = builders.build_ray_cluster(pool, cfg)
    rc["status"] = {"conditions": [{"type": "HeadPodReady", "status": "False"}]}
    first = reconcile.refreshed_status(body, rc, cfg)
    assert first is not None and first["phase"] == "Provisioning"
    assert "observedGeneration" not in first  # a refresh never claims a generation
    body["status"] = first
    assert reconcile.refreshed_status(body, rc, cfg) is None  # nothing new to say
    rc["status"] = {"readyWorkerReplicas": 1, "conditions": [
        {"type": "HeadPodReady", "status": "True"},
        {"type": "RayClusterProvisioned", "status": "True"}]}
    second = reconcile.refreshed_status(body, rc, cfg)
    assert second is not None and second["phase"] == "Ready"
    body["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    assert reconcile.refreshed_status(body, rc, cfg) is None
