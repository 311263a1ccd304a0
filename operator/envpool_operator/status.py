"""Pure status logic: RayCluster status + pool-server report -> EnvPool status.

Inputs are the RayCluster as read from the API (a plain dict) and the
``status.pool`` report the pool server writes, read through its typed model
(:class:`remote_env.spec.pool_report.PoolReport`, shared with the writer); the
output is the EnvPool status fields to merge-patch. Conditions keep their
``lastTransitionTime`` while their status does not change::

    >>> import datetime
    >>> now = datetime.datetime(2026, 1, 1, tzinfo=datetime.timezone.utc)
    >>> compute_status(name="cp", namespace="ns", generation=1, observed_generation=1,
    ...                pool=None, spec_error="spec.replicas: required", ray_cluster=None,
    ...                pool_report=None, previous={}, now=now)["phase"]
    'Failed'
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Mapping, Sequence
from typing import Any, Final

from envpool_operator import gcs_store, names
from remote_env import spec as spec_mod
from remote_env.spec import pool_report as report_mod
from remote_env.spec.pool_report import PoolReport

PENDING: Final = "Pending"
PROVISIONING: Final = "Provisioning"
READY: Final = "Ready"
DEGRADED: Final = "Degraded"
FAILED: Final = "Failed"
SUSPENDED: Final = "Suspended"
PHASES: Final = (PENDING, PROVISIONING, READY, DEGRADED, FAILED, SUSPENDED)

COND_READY: Final = "Ready"
COND_SPEC_VALID: Final = "SpecValid"
COND_RAY_CLUSTER_READY: Final = "RayClusterReady"
COND_POOL_SERVER_READY: Final = "PoolServerReady"
#: Every actor runs the spec's revision (env, runtimeEnv, envsPerActor...): a rollout is done.
COND_ROLLOUT_COMPLETE: Final = "RolloutComplete"
#: Whether the Ray pods are what this operator renders (an upgrade keeps older ones).
COND_PODS_CURRENT: Final = "PodsCurrent"
#: The head pod (GCS, pool server) is ready; False with HeadRecovering/HeadLost during an
#: outage (issue 31: under GCS fault tolerance the envs and trainers ride it out).
COND_HEAD_AVAILABLE: Final = "HeadAvailable"
CONDITION_TYPES: Final = (COND_READY, COND_SPEC_VALID, COND_RAY_CLUSTER_READY,
                          COND_POOL_SERVER_READY, COND_ROLLOUT_COMPLETE, COND_HEAD_AVAILABLE,
                          COND_PODS_CURRENT)
#: HeadAvailable reasons of an outage (the head was available before).
HEAD_OUTAGE_REASONS: Final = ("HeadRecovering", "HeadLost")


@dataclasses.dataclass(frozen=True)
class Problem:
    """Why the operator could not (yet) reconcile the children; retried with backoff."""

    reason: str  # KubeRayMissing, Forbidden, QuotaExceeded, Invalid, ApiError, Rolling, ...
    message: str


def now() -> datetime.datetime:
    """The time that status timestamps and pool-report freshness are judged against."""
    return datetime.datetime.now(datetime.timezone.utc)


def rfc3339(now: datetime.datetime) -> str:
    return report_mod.timestamp(now)


def status_of(body: Mapping[str, Any]) -> Mapping[str, Any]:
    """An EnvPool body's ``status`` (``{}`` before the first one is written).

        >>> status_of({"metadata": {"name": "cp"}})
        {}
    """
    return body.get("status") or {}


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _condition_true(rc_status: Mapping[str, Any], ctype: str) -> bool | None:
    for cond in rc_status.get("conditions") or ():
        if isinstance(cond, Mapping) and cond.get("type") == ctype:
            return bool(cond.get("status") == "True")
    return None


@dataclasses.dataclass(frozen=True)
class _Cond:
    type: str
    ok: bool | None  # None: Unknown
    reason: str
    message: str


def ray_cluster_condition(
    ray_cluster: Mapping[str, Any] | None, *, expected_workers: int | None,
    expected_hash: str | None, problem: Problem | None,
) -> tuple[_Cond, bool]:
    """RayClusterReady from KubeRay's status; the bool says it went Failed.

    Ready means: KubeRay has seen this generation, its RayClusterProvisioned
    and HeadPodReady conditions are True, and ``readyWorkerReplicas`` covers
    the workers the spec asks for. The head pod is Ready only when every
    container is, the pool-server sidecar's readiness probe included.
    KubeRay's ``status.state`` stays "ready" once reached (it is not reset
    when pods go away), so it is used only when KubeRay writes no conditions.
    """
    t = COND_RAY_CLUSTER_READY
    if problem is not None:
        return _Cond(t, False, problem.reason, problem.message), False
    if ray_cluster is None:
        return _Cond(t, False, "NotCreated", "the RayCluster has not been created yet"), False
    meta = ray_cluster.get("metadata") or {}
    name = meta.get("name", "?")
    if meta.get("deletionTimestamp"):
        return _Cond(t, False, "Deleting", f"RayCluster {name} is being deleted"), False
    have_hash = (meta.get("annotations") or {}).get(names.CLUSTER_HASH_ANNOTATION)
    if expected_hash is not None and have_hash != expected_hash:
        return _Cond(t, False, "Updating",
                     f"RayCluster {name} does not reflect the new spec yet"), False
    rc_status: Mapping[str, Any] = ray_cluster.get("status") or {}
    seen_gen = _int(rc_status.get("observedGeneration"))
    generation = _int(meta.get("generation"))
    if generation and seen_gen < generation:
        return _Cond(t, False, "Updating",
                     f"KubeRay has not reconciled RayCluster {name} generation {generation} "
                     f"yet (observed {seen_gen})"), False
    state = rc_status.get("state")
    if state == "failed":
        reason = rc_status.get("reason") or "KubeRay reports state failed"
        return _Cond(t, False, "RayClusterFailed", f"RayCluster {name}: {reason}"), True
    head_ready = _condition_true(rc_status, "HeadPodReady")
    provisioned = _condition_true(rc_status, "RayClusterProvisioned")
    # omitempty: KubeRay leaves the field out when no worker is ready.
    ready_workers = _int(rc_status.get("readyWorkerReplicas"))
    want = expected_workers if expected_workers is not None else _int(
        rc_status.get("desiredWorkerReplicas"))
    if head_ready is None:
        # KubeRay without status conditions (feature gate off): the sticky state only.
        head_ok = state == "ready"
        provisioned = head_ok
    else:
        head_ok = head_ready
    if head_ok and provisioned and ready_workers >= want:
        return _Cond(t, True, "RayClusterReady",
                     f"RayCluster {name}: head ready, {ready_workers}/{want} workers ready"), False
    failure = _condition_true(rc_status, "ReplicaFailure")
    if failure:
        msg = next((c.get("message", "") for c in rc_status.get("conditions") or ()
                    if isinstance(c, Mapping) and c.get("type") == "ReplicaFailure"), "")
        return _Cond(t, False, "ReplicaFailure", f"RayCluster {name}: {msg}".strip()), False
    head = "ready" if head_ok else "not ready"
    first = "" if provisioned else " (first provisioning)"
    return _Cond(t, False, "Provisioning",
                 f"RayCluster {name}: head {head}, {ready_workers}/{want} workers "
                 f"ready{first}"), False


def head_condition(
    ray_cluster: Mapping[str, Any] | None, pool: spec_mod.PoolSpec | None,
    previous: Any,
) -> _Cond:
    """HeadAvailable from KubeRay's HeadPodReady, told apart by what an outage costs.

    With GCS fault tolerance a head that was ready and is not is *recovering*: the
    worker pods and their env actors keep running, trainers stepping over TCP do not
    notice, and the new head reloads the GCS from Redis. Without it the head's loss is
    the pool's (*lost*: every env is re-created on the new head). ``previous``: the
    EnvPool's conditions so far (an outage is a head that was available).
    """
    t = COND_HEAD_AVAILABLE
    if pool is None:
        return _Cond(t, None, "InvalidSpec", "no valid spec")
    if ray_cluster is None:
        return _Cond(t, False, "NotCreated", "the RayCluster has not been created yet")
    rc_status: Mapping[str, Any] = ray_cluster.get("status") or {}
    ready = _condition_true(rc_status, "HeadPodReady")
    if ready is None:
        ready = rc_status.get("state") == "ready"
    ft = pool.head_fault_tolerance
    store = (f"GCS fault tolerance: its state is kept in Redis {gcs_store.redis_address(pool)}"
             if ft.enabled else "no GCS fault tolerance (spec.headFaultTolerance.enabled: "
                                "false): its loss re-creates every env")
    if ready:
        return _Cond(t, True, "HeadReady", f"the head pod is ready; {store}")
    old = next((c for c in previous or () if isinstance(c, Mapping) and c.get("type") == t), None)
    was_up = old is not None and (old.get("status") == "True"
                                  or old.get("reason") in HEAD_OUTAGE_REASONS)
    if not was_up:
        return _Cond(t, False, "HeadStarting", f"the head pod is not ready yet; {store}")
    if ft.enabled:
        return _Cond(t, False, "HeadRecovering",
                     "the head pod is not ready: the worker pods and their env actors keep "
                     "running (GCS fault tolerance) and trainers keep stepping; leases and "
                     "new attaches wait for the new head, which reloads the GCS from Redis "
                     f"{gcs_store.redis_address(pool)}")
    return _Cond(t, False, "HeadLost",
                 "the head pod is not ready and the pool has no GCS fault tolerance: its env "
                 "actors are gone and are re-created on the new head")


def head_event(before: Mapping[str, Any], after: Mapping[str, Any]) -> tuple[str, str, str] | None:
    """(type, reason, message) of the Event to post when HeadAvailable changes between two
    EnvPool statuses: an outage starting, or ending (with how long it lasted)."""
    def cond(st: Mapping[str, Any]) -> Mapping[str, Any]:
        return next((c for c in st.get("conditions") or () if isinstance(c, Mapping)
                     and c.get("type") == COND_HEAD_AVAILABLE), {})

    old, new = cond(before), cond(after)
    if not new or (old.get("status"), old.get("reason")) == (new.get("status"), new.get("reason")):
        return None
    if new.get("reason") in HEAD_OUTAGE_REASONS and old.get("reason") not in HEAD_OUTAGE_REASONS:
        return "Warning", "HeadUnavailable", str(new.get("message", ""))
    if new.get("status") == "True" and old.get("reason") in HEAD_OUTAGE_REASONS:
        gone = report_mod.parse_time(old.get("lastTransitionTime"))
        back = report_mod.parse_time(new.get("lastTransitionTime"))
        took = f" after {(back - gone).total_seconds():.0f}s" if gone and back else ""
        return "Normal", "HeadRecovered", f"the head pod is ready again{took}"
    return None


def estimated_ready_envs(pool: spec_mod.PoolSpec, ray_cluster: Mapping[str, Any] | None) -> int:
    """Envs the ready pods can host, for when the pool server has not reported.

    Zero unless the head (and so the pool-server sidecar) is ready; then the
    ready workers' actor slots, capped at ``replicas``.
    """
    if pool.suspend or ray_cluster is None:
        return 0
    rc_status: Mapping[str, Any] = ray_cluster.get("status") or {}
    head = _condition_true(rc_status, "HeadPodReady")
    if not (head if head is not None else rc_status.get("state") == "ready"):
        return 0
    slots = _int(rc_status.get("readyWorkerReplicas")) * pool.actors_per_worker
    return min(pool.replicas, slots * pool.envs_per_actor)


def fresh_report(
    report: Mapping[str, Any] | None, now: datetime.datetime,
) -> PoolReport | None:
    """The pool server's report (``status.pool``) if it is recent enough to trust, else None."""
    return report_mod.fresh(report, now)


def pool_server_condition(
    report: PoolReport | None, *, expected_envs: int, now: datetime.datetime,
) -> _Cond:
    """PoolServerReady from ``status.pool``; Unknown while the pool server has not reported.

    Without a report, readiness rests on the head pod's readiness probe (the
    sidecar's ``/healthz``) and the RayCluster; a report refines it with the
    pool server's own count of ready envs.
    """
    t = COND_POOL_SERVER_READY
    if report is None:
        return _Cond(t, None, "NoReport",
                     "the pool server has not reported yet; readiness comes from the head "
                     "pod (pool-server readiness probe) and the RayCluster")
    if not report.is_fresh(now):
        when = "never" if report.updated_at is None else report.updated_at
        return _Cond(t, False, "ReportStale",
                     f"the pool server's last report ({when}) is older than "
                     f"{int(report_mod.STALE_AFTER_S)}s")
    ready, desired = report.ready_envs, report.desired_envs
    if desired != expected_envs:
        return _Cond(t, False, "Scaling",
                     f"the pool server is sized for {desired} envs, spec asks {expected_envs}")
    if ready >= expected_envs:
        return _Cond(t, True, "AllEnvsReady", f"{ready}/{expected_envs} envs ready")
    err = report.last_error
    suffix = f"; last error: {err}" if err else ""
    return _Cond(t, False, "EnvsNotReady", f"{ready}/{expected_envs} envs ready{suffix}")


def rollout_condition(
    report: PoolReport | None, pool: spec_mod.PoolSpec | None, *, now: datetime.datetime,
) -> _Cond:
    """RolloutComplete from ``status.pool``: True once the pool server runs the spec's
    revision and no actor of an older one is left (leased ones go when released)."""
    t = COND_ROLLOUT_COMPLETE
    if report is not None and not report.is_fresh(now):
        report = None
    if pool is None:
        return _Cond(t, None, "InvalidSpec", "no valid spec to roll out")
    if report is None:
        return _Cond(t, None, "NoReport", "no fresh pool-server report")
    if report.revision is None:
        return _Cond(t, None, "NoRevision", "the pool server does not report revisions "
                                            "(an older version)")
    want, runs = pool.revision(), report.revision
    if runs != want:
        return _Cond(t, False, "SpecPending",
                     f"the pool server rolls toward revision {runs}; the spec's is {want} "
                     "(it takes a new spec within seconds)")
    updated, outdated = report.updated_envs, report.outdated_envs
    if outdated:
        leased = report.outdated_leased_envs
        return _Cond(t, False, "RollingOut",
                     f"{updated}/{updated + outdated} envs at revision {want}; {outdated} "
                     f"outdated, {leased} of them leased (rebuilt when their lease ends)")
    return _Cond(t, True, "Updated", f"every env runs revision {want}")


def pods_current_condition(
    pool: spec_mod.PoolSpec | None, ray_cluster: Mapping[str, Any] | None, lag: str | None,
) -> _Cond:
    """PodsCurrent: False while the pool keeps pods an older operator rendered
    (``lag`` says what newer pods would bring and how to take them)."""
    t = COND_PODS_CURRENT
    if pool is None or ray_cluster is None:
        return _Cond(t, None, "NoRayCluster", "no RayCluster to compare")
    if lag is not None:
        return _Cond(t, False, "OlderRender", lag)
    return _Cond(t, True, "Current", "the Ray pods are as this operator renders them")


def _merge_conditions(
    new: Sequence[_Cond], previous: Any, *, now: str, generation: int | None,
) -> list[dict[str, Any]]:
    old = {c.get("type"): c for c in previous or () if isinstance(c, Mapping)}
    out: list[dict[str, Any]] = []
    for cond in new:
        status = "Unknown" if cond.ok is None else ("True" if cond.ok else "False")
        prev = old.get(cond.type)
        same = prev is not None and prev.get("status") == status
        item: dict[str, Any] = {
            "type": cond.type,
            "status": status,
            "reason": cond.reason,
            "message": cond.message,
            "lastTransitionTime": prev.get("lastTransitionTime", now) if same and prev else now,
        }
        if generation is not None:
            item["observedGeneration"] = generation
        out.append(item)
    return out


def compute_status(
    *,
    name: str,
    namespace: str,
    generation: int | None,
    observed_generation: int | None,
    pool: spec_mod.PoolSpec | None,
    spec_error: str | None,
    ray_cluster: Mapping[str, Any] | None,
    pool_report: Mapping[str, Any] | None,
    previous: Mapping[str, Any],
    now: datetime.datetime,
    problem: Problem | None = None,
    expected_hash: str | None = None,
    render_lag: str | None = None,
) -> dict[str, Any]:
    """EnvPool status fields (to merge-patch) from what is known right now.

    Args:
        generation: the EnvPool's ``metadata.generation``.
        observed_generation: the generation whose spec the children reflect
            (the reconcile passes ``generation``; a status-only refresh passes
            the previous ``status.observedGeneration``).
        pool: the parsed spec, or None when ``spec_error`` says why it is invalid.
        ray_cluster: the RayCluster child as read, or None if absent.
        pool_report: ``status.pool`` as written by the pool server.
        previous: the current EnvPool ``status`` (for lastTransitionTime and phase history).
        problem: a transient reconcile failure (KubeRay missing, forbidden, quota).
        expected_hash: the cluster hash the spec wants; a mismatch means rolling.
        render_lag: what the pool's pods miss of this operator's rendering
            (:func:`~envpool_operator.builders.render_lag`), None if nothing.
    """
    stamp = rfc3339(now)
    if spec_error is not None or pool is None:
        spec_cond = _Cond(COND_SPEC_VALID, False, "InvalidSpec", spec_error or "invalid spec")
    else:
        spec_cond = _Cond(COND_SPEC_VALID, True, "Valid", "the spec is valid")

    rc_cond, rc_failed = ray_cluster_condition(
        ray_cluster,
        expected_workers=pool.workers if pool else None,
        expected_hash=expected_hash,
        problem=problem,
    )
    expected_envs = 0 if pool is None or pool.suspend else pool.replicas
    written = PoolReport.read(pool_report)
    pool_cond = pool_server_condition(written, expected_envs=expected_envs, now=now)
    prev_phase = previous.get("phase")

    if pool is None:
        phase, ready_cond = FAILED, _Cond(COND_READY, False, "InvalidSpec",
                                          "fix the spec: " + spec_cond.message)
    elif rc_failed:
        phase, ready_cond = FAILED, _Cond(COND_READY, False, rc_cond.reason, rc_cond.message)
    elif problem is not None or ray_cluster is None:
        phase, ready_cond = PENDING, _Cond(COND_READY, False, rc_cond.reason, rc_cond.message)
    elif pool.suspend:
        phase, ready_cond = SUSPENDED, _Cond(COND_READY, False, "Suspended",
                                             "spec.suspend is true: workers scaled to zero")
    elif rc_cond.ok and pool_cond.ok is not False:
        message = pool_cond.message if pool_cond.ok else (
            f"{rc_cond.message}; the pool server has not reported yet")
        phase, ready_cond = READY, _Cond(COND_READY, True, "PoolReady", message)
    else:
        failing = rc_cond if not rc_cond.ok else pool_cond
        served_hash = previous.get("clusterHash")
        if (failing is rc_cond and served_hash and expected_hash
                and served_hash != expected_hash):
            # KubeRay is replacing the pods for a new image or Ray version: not a fault.
            rc_cond = _Cond(rc_cond.type, False, "Rolling",
                            f"{rc_cond.message} (new pods for a new image, Ray version or resources)")
            failing = rc_cond
        was_serving = prev_phase in (READY, DEGRADED)
        lost_envs = failing is pool_cond and pool_cond.reason in ("EnvsNotReady", "ReportStale")
        lost_cluster = failing is rc_cond and rc_cond.reason in ("Provisioning", "ReplicaFailure")
        phase = DEGRADED if was_serving and (lost_envs or lost_cluster) else PROVISIONING
        ready_cond = _Cond(COND_READY, False, failing.reason, failing.message)

    conditions = _merge_conditions(
        [ready_cond, spec_cond, rc_cond, pool_cond,
         rollout_condition(written, pool, now=now),
         head_condition(ray_cluster, pool, previous.get("conditions")),
         pods_current_condition(pool, ray_cluster, render_lag)],
        previous.get("conditions"),
        now=stamp,
        generation=generation,
    )
    report = written if written is not None and written.is_fresh(now) else None
    # Lease counts only from a fresh report: a stale one would show (and size the
    # pool for) leases that may be long gone. None removes them (merge patch).
    leased_envs = free_envs = None
    rollout: dict[str, Any] = {"revision": None, "updatedEnvs": None, "outdatedEnvs": None}
    if report is not None and report.revision is not None:
        rollout = {"revision": report.revision, "updatedEnvs": report.updated_envs,
                   "outdatedEnvs": report.outdated_envs}
    if report is not None:
        ready_envs, sized_for = report.ready_envs, report.desired_envs
        leased_envs, free_envs = report.leased_envs, report.free_envs
    elif pool is not None and ray_cluster is not None:
        ready_envs = estimated_ready_envs(pool, ray_cluster)
        sized_for = 0 if pool.suspend else pool.replicas
    else:
        ready_envs, sized_for = 0, 0
    rc_name = (ray_cluster or {}).get("metadata", {}).get("name") if ray_cluster else None
    endpoint = None
    if ray_cluster is not None:
        head = ((ray_cluster.get("status") or {}).get("head") or {})
        svc = head.get("serviceName") or names.head_service_name(name)
        endpoint = f"ray://{svc}.{namespace}.svc:{names.RAY_CLIENT_PORT}"
    out: dict[str, Any] = {
        "phase": phase,
        "message": ready_cond.message,
        # The scale subresource's current size: what the pool server says it
        # runs, else what the applied RayCluster is sized for.
        "replicas": sized_for,
        "readyEnvs": ready_envs,
        "leasedEnvs": leased_envs,
        "freeEnvs": free_envs,
        "desiredEnvs": pool.replicas if pool else None,
        "workers": pool.workers if pool else None,
        "selector": names.selector(name),
        "rayCluster": rc_name,
        "endpoint": endpoint,
        "conditions": conditions,
        # a rollout of a new env spec through the running pods (kubectl get epool shows them)
        **rollout,
        "observedGeneration": observed_generation,
        # The cluster hash last seen ready: a later mismatch means a roll.
        "clusterHash": expected_hash if rc_cond.ok else previous.get("clusterHash"),
    }
    # Never clear these by merge-patching null: a refresh computed from a
    # slightly stale body must not erase what a reconcile just wrote.
    for sticky in ("observedGeneration", "clusterHash"):
        if out[sticky] is None:
            del out[sticky]
    return out


def status_changed(current: Mapping[str, Any], computed: Mapping[str, Any]) -> bool:
    """True if merge-patching ``computed`` onto ``current`` would change anything."""
    return any(current.get(key) != value for key, value in computed.items())
