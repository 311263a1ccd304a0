"""envpool_operator.status: RayCluster status + pool report -> EnvPool phase/conditions."""

from __future__ import annotations

import datetime
from typing import Any

import pytest

from envpool_operator import builders, names, settings, status
from remote_env import spec

NOW = datetime.datetime(2026, 6, 1, 12, 0, 0, tzinfo=datetime.timezone.utc)
STAMP = "2026-06-01T12:00:00Z"
SETTINGS = settings.Settings()


def _pool(**over: Any) -> spec.PoolSpec:
    raw: dict[str, Any] = {"env": {"id": "CartPole-v1"}, "replicas": 16}
    raw.update(over)
    return spec.parse_spec(raw, name="cp", namespace="ns")


def _rc(pool: spec.PoolSpec, *, head_ready: bool = True, ready_workers: int | None = None,
        generation: int = 1, observed: int = 1, state: str = "ready",
        hash_: str | None = None, extra_conditions: list[dict[str, Any]] | None = None,
        provisioned: bool = True) -> dict[str, Any]:
    rc = builders.build_ray_cluster(pool, SETTINGS)
    rc["metadata"]["generation"] = generation
    if hash_ is not None:
        rc["metadata"]["annotations"][names.CLUSTER_HASH_ANNOTATION] = hash_
    rc["status"] = {
        "state": state,
        "observedGeneration": observed,
        "readyWorkerReplicas": pool.workers if ready_workers is None else ready_workers,
        "conditions": [{"type": "HeadPodReady", "status": "True" if head_ready else "False"},
                       {"type": "RayClusterProvisioned",
                        "status": "True" if provisioned else "False"},
                       *(extra_conditions or [])],
        "head": {"serviceName": "cp-head-svc"},
    }
    return rc


def _report(ready: int, desired: int = 16, *, at: datetime.datetime = NOW,
            error: str | None = None, revision: str | None = None,
            outdated: int = 0, outdated_leased: int = 0) -> dict[str, Any]:
    rep: dict[str, Any] = {"readyEnvs": ready, "desiredEnvs": desired, "restarts": 0,
                           "updatedAt": at.strftime("%Y-%m-%dT%H:%M:%SZ"),
                           "revision": revision or _pool().revision(),
                           "updatedEnvs": ready - outdated, "outdatedEnvs": outdated,
                           "outdatedLeasedEnvs": outdated_leased}
    if error:
        rep["lastError"] = error
    return rep


def _compute(pool: spec.PoolSpec | None, rc: dict[str, Any] | None,
             report: dict[str, Any] | None = None, previous: dict[str, Any] | None = None,
             **kw: Any) -> dict[str, Any]:
    return status.compute_status(
        name="cp", namespace="ns", generation=3, observed_generation=3, pool=pool,
        spec_error=kw.pop("spec_error", None), ray_cluster=rc, pool_report=report,
        previous=previous or {}, now=kw.pop("now", NOW),
        expected_hash=builders.cluster_hash(pool, SETTINGS) if pool else None, **kw,
    )


def _cond(st: dict[str, Any], ctype: str) -> dict[str, Any]:
    found = [c for c in st["conditions"] if c["type"] == ctype]
    assert len(found) == 1, st["conditions"]
    cond: dict[str, Any] = found[0]
    return cond


def test_ready_when_cluster_and_all_envs_ready() -> None:
    pool = _pool()
    st = _compute(pool, _rc(pool), _report(16))
    assert st["phase"] == "Ready"
    assert st["readyEnvs"] == 16 and st["replicas"] == 16 and st["desiredEnvs"] == 16
    assert st["rayCluster"] == "cp"
    assert st["endpoint"] == "ray://cp-head-svc.ns.svc:10001"
    assert st["selector"] == "envpool.dev/pool=cp"
    assert st["observedGeneration"] == 3
    for ctype in status.CONDITION_TYPES:
        c = _cond(st, ctype)
        assert c["status"] == "True", c
        assert c["observedGeneration"] == 3
        assert c["lastTransitionTime"] == STAMP


def test_invalid_spec_is_failed_with_the_message() -> None:
    st = _compute(None, None, spec_error="spec.replicas: must be in [1, 100000], got 0")
    assert st["phase"] == "Failed"
    c = _cond(st, "SpecValid")
    assert c["status"] == "False" and c["reason"] == "InvalidSpec"
    assert "got 0" in c["message"]
    assert "fix the spec" in _cond(st, "Ready")["message"]


def test_pending_without_ray_cluster() -> None:
    st = _compute(_pool(), None)
    assert st["phase"] == "Pending"
    assert _cond(st, "RayClusterReady")["reason"] == "NotCreated"
    assert st["rayCluster"] is None and st["endpoint"] is None


def test_problem_is_reported_as_pending_with_reason() -> None:
    problem = status.Problem("KubeRayMissing", "install KubeRay")
    st = _compute(_pool(), None, problem=problem)
    assert st["phase"] == "Pending"
    c = _cond(st, "RayClusterReady")
    assert (c["status"], c["reason"], c["message"]) == ("False", "KubeRayMissing", "install KubeRay")
    assert _cond(st, "Ready")["reason"] == "KubeRayMissing"


def test_provisioning_while_head_not_ready() -> None:
    pool = _pool()
    st = _compute(pool, _rc(pool, head_ready=False), None)
    assert st["phase"] == "Provisioning"
    assert "head not ready" in _cond(st, "RayClusterReady")["message"]


def test_sticky_kuberay_state_ready_is_not_trusted() -> None:
    # KubeRay leaves state=ready once reached; HeadPodReady=False wins.
    pool = _pool()
    st = _compute(pool, _rc(pool, head_ready=False, state="ready"), _report(16))
    assert _cond(st, "RayClusterReady")["status"] == "False"
    assert st["phase"] != "Ready"


def test_not_ready_until_kuberay_observed_the_generation() -> None:
    pool = _pool()
    st = _compute(pool, _rc(pool, generation=5, observed=4), _report(16))
    c = _cond(st, "RayClusterReady")
    assert c["reason"] == "Updating" and "generation 5" in c["message"]


def test_missing_workers_block_ready() -> None:
    pool = _pool(replicas=200)  # 4 workers
    st = _compute(pool, _rc(pool, ready_workers=2), _report(200, 200))
    assert "2/4 workers" in _cond(st, "RayClusterReady")["message"]
    assert st["phase"] == "Provisioning"


def test_no_report_ready_from_the_ray_cluster_alone() -> None:
    # No pool-server report (e.g. kwok's fake pods): the head pod's readiness
    # (the sidecar's probe included) and the workers decide.
    pool = _pool()
    st = _compute(pool, _rc(pool), None)
    assert st["phase"] == "Ready"
    c = _cond(st, "PoolServerReady")
    assert (c["status"], c["reason"]) == ("Unknown", "NoReport")
    assert st["readyEnvs"] == 16 and st["replicas"] == 16
    assert "has not reported yet" in st["message"]


def test_no_report_ready_envs_estimated_from_ready_workers() -> None:
    pool = _pool(replicas=200, envsPerActor=8)  # 64 envs (8 actors) per worker, 4 workers
    st = _compute(pool, _rc(pool, ready_workers=3), None)
    assert st["phase"] == "Provisioning"
    assert st["readyEnvs"] == 192
    assert _compute(pool, _rc(pool, ready_workers=4), None)["readyEnvs"] == 200  # capped
    assert _compute(pool, _rc(pool, head_ready=False), None)["readyEnvs"] == 0


def test_report_refines_ready_envs() -> None:
    pool = _pool()
    st = _compute(pool, _rc(pool), _report(10))
    assert st["readyEnvs"] == 10
    assert st["phase"] == "Provisioning"
    assert _cond(st, "PoolServerReady")["reason"] == "EnvsNotReady"
    assert "10/16 envs ready" in st["message"]


def test_stale_report_is_not_trusted() -> None:
    pool = _pool()
    old = NOW - datetime.timedelta(minutes=10)
    st = _compute(pool, _rc(pool), _report(16, at=old))
    assert _cond(st, "PoolServerReady")["reason"] == "ReportStale"
    assert st["phase"] == "Provisioning"
    # and a serving pool whose server went quiet is degraded
    assert _compute(pool, _rc(pool), _report(16, at=old),
                    previous={"phase": "Ready"})["phase"] == "Degraded"


def test_first_provisioning_is_not_ready() -> None:
    pool = _pool()
    st = _compute(pool, _rc(pool, provisioned=False), None)
    assert st["phase"] == "Provisioning"
    assert "first provisioning" in _cond(st, "RayClusterReady")["message"]


def test_ready_worker_count_absent_means_zero() -> None:
    # KubeRay omits readyWorkerReplicas when it is 0 (omitempty); running but
    # unready workers are in availableWorkerReplicas and must not count.
    pool = _pool()
    rc = _rc(pool)
    del rc["status"]["readyWorkerReplicas"]
    rc["status"]["availableWorkerReplicas"] = 1
    st = _compute(pool, rc, None)
    assert st["phase"] == "Provisioning"
    assert "0/1 workers ready" in _cond(st, "RayClusterReady")["message"]


def test_scaling_until_the_pool_server_catches_up() -> None:
    pool = _pool(replicas=32)
    st = _compute(pool, _rc(pool), _report(16, 16))
    c = _cond(st, "PoolServerReady")
    assert c["reason"] == "Scaling" and "spec asks 32" in c["message"]


def test_degraded_when_a_serving_pool_loses_envs() -> None:
    pool = _pool()
    st = _compute(pool, _rc(pool), _report(12, error="actor 3 died"),
                  previous={"phase": "Ready"})
    assert st["phase"] == "Degraded"
    assert "12/16" in st["message"] and "actor 3 died" in st["message"]
    # the same report on a pool that never served is still provisioning
    assert _compute(pool, _rc(pool), _report(12))["phase"] == "Provisioning"


def test_degraded_when_head_lost_after_serving() -> None:
    pool = _pool()
    ready = _compute(pool, _rc(pool), _report(16))
    st = _compute(pool, _rc(pool, head_ready=False), _report(16), previous=ready)
    assert st["phase"] == "Degraded"


def test_roll_is_provisioning_not_degraded() -> None:
    old_pool = _pool()
    ready = _compute(old_pool, _rc(old_pool), _report(16))
    assert ready["clusterHash"] == builders.cluster_hash(old_pool, SETTINGS)
    new_pool = _pool(ray={"image": "new:2"})
    st = _compute(new_pool, _rc(new_pool, head_ready=False), _report(16), previous=ready)
    assert st["phase"] == "Provisioning"
    assert _cond(st, "RayClusterReady")["reason"] == "Rolling"
    assert st["clusterHash"] == ready["clusterHash"]  # not ready yet on the new hash


def test_hash_mismatch_means_updating() -> None:
    pool = _pool()
    st = _compute(pool, _rc(pool, hash_="0000"), _report(16))
    assert _cond(st, "RayClusterReady")["reason"] == "Updating"


def test_failed_ray_cluster() -> None:
    pool = _pool()
    st = _compute(pool, _rc(pool, state="failed"), _report(16))
    assert st["phase"] == "Failed"
    assert _cond(st, "RayClusterReady")["reason"] == "RayClusterFailed"


def test_replica_failure_message_surfaces() -> None:
    pool = _pool()
    fail = {"type": "ReplicaFailure", "status": "True", "message": "exceeded quota: pods"}
    st = _compute(pool, _rc(pool, head_ready=False, extra_conditions=[fail]), None)
    c = _cond(st, "RayClusterReady")
    assert c["reason"] == "ReplicaFailure" and "exceeded quota" in c["message"]


def test_suspended() -> None:
    pool = _pool(suspend=True)
    st = _compute(pool, _rc(pool), None)
    assert st["phase"] == "Suspended"
    assert st["workers"] == 0
    # a pool server that scaled to zero is "all envs ready" for a suspended pool
    st = _compute(pool, _rc(pool), _report(0, 0))
    assert _cond(st, "PoolServerReady")["status"] == "True"


def test_last_transition_time_kept_while_status_unchanged() -> None:
    pool = _pool()
    first = _compute(pool, _rc(pool, head_ready=False), None)
    later = NOW + datetime.timedelta(minutes=5)
    second = _compute(pool, _rc(pool), _report(16, at=later), previous=first, now=later)
    assert _cond(second, "SpecValid")["lastTransitionTime"] == STAMP  # unchanged
    assert _cond(second, "RayClusterReady")["lastTransitionTime"] == "2026-06-01T12:05:00Z"
    third = _compute(pool, _rc(pool), _report(16, at=later), previous=second,
                     now=later + datetime.timedelta(seconds=30))
    assert third["conditions"] == second["conditions"]
    assert not status.status_changed(second, third)


def test_status_changed() -> None:
    assert status.status_changed({"phase": "Ready"}, {"phase": "Degraded"})
    assert not status.status_changed({"phase": "Ready"}, {"phase": "Ready", "endpoint": None})


@pytest.mark.parametrize("bad", [None, "", "yesterday", 12])
def test_unparseable_report_time_is_stale(bad: Any) -> None:
    pool = _pool()
    rep = {"readyEnvs": 16, "desiredEnvs": 16, "updatedAt": bad}
    assert _cond(_compute(pool, _rc(pool), rep), "PoolServerReady")["reason"] == "ReportStale"


def test_leased_and_free_come_from_a_fresh_report_only() -> None:
    pool = _pool()
    fresh = {**_report(16), "leasedEnvs": 10, "freeEnvs": 6}
    st = _compute(pool, _rc(pool), fresh)
    assert (st["leasedEnvs"], st["freeEnvs"]) == (10, 6)
    old = {**fresh, "updatedAt": (NOW - datetime.timedelta(minutes=10)).strftime(
        "%Y-%m-%dT%H:%M:%SZ")}
    st = _compute(pool, _rc(pool), old)
    # None: the merge patch removes them, so kubectl shows no lease count it cannot trust
    assert (st["leasedEnvs"], st["freeEnvs"]) == (None, None)
    assert _compute(pool, _rc(pool), _report(16))["leasedEnvs"] is None  # an older server


def test_rollout_complete_when_every_env_runs_the_spec_revision() -> None:
    pool = _pool()
    st = _compute(pool, _rc(pool), _report(16))
    c = _cond(st, "RolloutComplete")
    assert (c["status"], c["reason"]) == ("True", "Updated")
    assert (st["revision"], st["updatedEnvs"], st["outdatedEnvs"]) == (pool.revision(), 16, 0)


def test_rollout_in_progress_names_the_outdated_and_leased_envs() -> None:
    pool = _pool()
    st = _compute(pool, _rc(pool), _report(16, outdated=6, outdated_leased=4))
    c = _cond(st, "RolloutComplete")
    assert (c["status"], c["reason"]) == ("False", "RollingOut")
    assert "10/16 envs at revision" in c["message"] and "4 of them leased" in c["message"]
    assert (st["updatedEnvs"], st["outdatedEnvs"]) == (10, 6)
    assert st["phase"] == "Ready"  # old envs still serve: a rollout is no outage


def test_rollout_pending_until_the_pool_server_takes_the_new_spec() -> None:
    old, new = _pool(), _pool(env={"id": "Acrobot-v1"})
    # the pool server still reports the old revision with nothing outdated: not done
    st = _compute(new, _rc(new), _report(16, revision=old.revision()))
    c = _cond(st, "RolloutComplete")
    assert (c["status"], c["reason"]) == ("False", "SpecPending")
    assert new.revision() in c["message"]
    # an env change needs no new pods: same cluster hash, so no "Rolling" RayCluster
    assert builders.cluster_hash(old, SETTINGS) == builders.cluster_hash(new, SETTINGS)


def test_rollout_unknown_without_a_report_or_a_revision() -> None:
    pool = _pool()
    assert _cond(_compute(pool, _rc(pool)), "RolloutComplete")["status"] == "Unknown"
    report = _report(16)
    del report["revision"]
    st = _compute(pool, _rc(pool), report)
    assert _cond(st, "RolloutComplete")["reason"] == "NoRevision"
    assert st["revision"] is None and st["outdatedEnvs"] is None
