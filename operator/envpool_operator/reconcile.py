"""One level-triggered reconcile of an EnvPool, and the status-only refresh.

Called by the kopf handlers in :mod:`envpool_operator.handlers`; the manifests
come from :mod:`builders`, the status from :mod:`status`, API calls go through
:mod:`kube`. Running it twice, or after a crash halfway, gives the same
children: names are derived from the EnvPool and writes are server-side apply.
"""

from __future__ import annotations

import copy
import dataclasses
import datetime
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, cast

import kopf

from envpool_operator import autoscaler, builders, kube
from envpool_operator import metrics as metrics_mod
from envpool_operator import settings as settings_mod
from envpool_operator import status as status_mod
from remote_env import restarts
from remote_env import spec as spec_mod

#: Delay before looking again while an old RayCluster is being deleted.
ROLL_POLL_SECONDS = 2.0


@dataclasses.dataclass
class Runtime:
    """What handlers share, kept in kopf's ``memo`` (created at operator start-up)."""

    settings: settings_mod.Settings
    metrics: metrics_mod.OperatorMetrics
    #: Last seen RayClusters by (namespace, EnvPool name), fed by their watch.
    ray_clusters: dict[tuple[str, str], dict[str, Any]] = dataclasses.field(default_factory=dict)
    #: Last seen EnvPools by (namespace, name), so a RayCluster event needs no GET.
    pools: dict[tuple[str, str], dict[str, Any]] = dataclasses.field(default_factory=dict)
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)
    #: One lock per EnvPool: kopf's handlers, the RayCluster watch and the
    #: resync loop never apply the same pool's children at the same time (an
    #: older body applied after a newer one would roll the spec back).
    pool_locks: dict[tuple[str, str], threading.RLock] = dataclasses.field(
        default_factory=dict)
    #: Recent autoscaler recommendations of each autoscaled EnvPool (in memory: an
    #: operator restart starts a fresh scale-down window, which only delays shrinking).
    stabilizers: dict[tuple[str, str], autoscaler.Stabilizer] = dataclasses.field(
        default_factory=dict)

    def pool_lock(self, key: tuple[str, str]) -> threading.RLock:
        with self.lock:
            return self.pool_locks.setdefault(key, threading.RLock())

    def phases(self) -> list[tuple[str, str, str | None]]:
        """(namespace, name, status.phase) of every known EnvPool, for the metrics."""
        with self.lock:
            return [(ns, name, (body.get("status") or {}).get("phase"))
                    for (ns, name), body in self.pools.items()]

    def forget(self, key: tuple[str, str]) -> None:
        with self.lock:
            self.pools.pop(key, None)
            self.ray_clusters.pop(key, None)
            self.pool_locks.pop(key, None)
            self.stabilizers.pop(key, None)


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc)


def _owned_by(obj: Mapping[str, Any], uid: str) -> bool:
    refs = (obj.get("metadata") or {}).get("ownerReferences") or ()
    return any(ref.get("uid") == uid for ref in refs)


def _owner_pool_names(obj: Mapping[str, Any]) -> set[str]:
    refs = (obj.get("metadata") or {}).get("ownerReferences") or ()
    return {ref.get("name", "") for ref in refs if ref.get("kind") == spec_mod.KIND}


def _status_of(body: Mapping[str, Any]) -> Mapping[str, Any]:
    return body.get("status") or {}


def parse(body: Mapping[str, Any], settings: settings_mod.Settings) -> spec_mod.PoolSpec:
    meta = body.get("metadata") or {}
    return spec_mod.parse_spec(
        body.get("spec") or {}, name=meta.get("name", ""),
        namespace=meta.get("namespace", "default"), limits=settings.limits,
    )


def compute(
    body: Mapping[str, Any],
    *,
    settings: settings_mod.Settings,
    ray_cluster: Mapping[str, Any] | None,
    reconciled: bool,
    problem: status_mod.Problem | None = None,
) -> dict[str, Any]:
    """The EnvPool's status from its body and its RayCluster (no API calls)."""
    meta = body.get("metadata") or {}
    previous = _status_of(body)
    generation = meta.get("generation")
    pool: spec_mod.PoolSpec | None = None
    error: str | None = None
    try:
        pool = parse(body, settings)
    except spec_mod.SpecError as exc:
        error = str(exc)
    return status_mod.compute_status(
        name=meta.get("name", ""),
        namespace=meta.get("namespace", ""),
        generation=generation,
        observed_generation=generation if reconciled else previous.get("observedGeneration"),
        pool=pool,
        spec_error=error,
        ray_cluster=ray_cluster,
        pool_report=previous.get("pool"),
        previous=previous,
        now=_now(),
        problem=problem,
        expected_hash=builders.cluster_hash(pool, settings) if pool else None,
    )


@dataclasses.dataclass(frozen=True)
class Outcome:
    """The status to write, and the error to raise after writing it (if any)."""

    status: dict[str, Any]
    result: str  # a metrics_mod.RESULTS label
    error: kopf.PermanentError | kopf.TemporaryError | None = None


class _Stop(Exception):
    def __init__(
        self, problem: status_mod.Problem, delay: float | None,
        ray_cluster: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(problem.message)
        self.problem, self.delay, self.ray_cluster = problem, delay, ray_cluster


def ownership_problem(
    existing: Mapping[str, Any] | None, *, name: str, uid: str,
) -> tuple[status_mod.Problem, float] | None:
    """Why the RayCluster named after EnvPool ``name`` must not be applied now, if so.

    Pure: ``existing`` is the RayCluster as read (None if absent). A RayCluster
    of a deleted EnvPool of the same name is waited for (garbage collection is
    on its way); one owned by nothing of ours is never taken over.
    """
    if existing is None:
        return None
    ex_meta = existing.get("metadata") or {}
    rc_name = ex_meta.get("name", name)
    if not _owned_by(existing, uid):
        if name in _owner_pool_names(existing):
            return status_mod.Problem(
                "Rolling", f"waiting for the previous EnvPool's RayCluster {rc_name} to be "
                           "garbage-collected"), ROLL_POLL_SECONDS * 2
        return status_mod.Problem(
            "NameConflict", f"a RayCluster named {rc_name} exists and is not owned by this "
                            "EnvPool; rename one of them"), 60.0
    if ex_meta.get("deletionTimestamp"):
        return status_mod.Problem(
            "Rolling", f"waiting for the old RayCluster {rc_name} to be deleted"), ROLL_POLL_SECONDS
    return None


def reconcile(body: Mapping[str, Any], runtime: Runtime, logger: Any, retry: int = 0) -> Outcome:
    """Bring the children in line with the spec; say what status to write.

    An invalid spec gives a ``kopf.PermanentError`` outcome and touches no
    child; KubeRay missing, RBAC/quota refusals and an old RayCluster still
    going away give a ``kopf.TemporaryError`` whose delay doubles with each
    ``retry`` (kopf's retry count), up to ``settings.max_retry_seconds``. The
    caller writes ``status`` first, then raises ``error``.
    """
    settings = runtime.settings
    meta = body.get("metadata") or {}
    key = (meta.get("namespace", ""), meta.get("name", ""))
    try:
        pool = parse(body, settings)
    except spec_mod.SpecError as exc:
        st = compute(body, settings=settings, ray_cluster=runtime.ray_clusters.get(key),
                     reconciled=True)
        return Outcome(st, "invalid", kopf.PermanentError(f"invalid EnvPool spec: {exc}"))
    try:
        rc = _apply_children(body, pool, runtime)
    except _Stop as stop:
        st = compute(body, settings=settings, ray_cluster=stop.ray_cluster, reconciled=False,
                     problem=stop.problem)
        if stop.delay is None:
            return Outcome(st, "error", kopf.PermanentError(stop.problem.message))
        delay = restarts.backoff(stop.delay, retry, settings.max_retry_seconds)
        logger.warning(f"{stop.problem.reason}: {stop.problem.message}; retrying in {delay:g}s")
        return Outcome(st, "retry", kopf.TemporaryError(stop.problem.message, delay=delay))
    with runtime.lock:
        runtime.ray_clusters[key] = copy.deepcopy(rc)
    return Outcome(compute(body, settings=settings, ray_cluster=rc, reconciled=True), "success")


def _apply_children(
    body: Mapping[str, Any], pool: spec_mod.PoolSpec, runtime: Runtime,
) -> dict[str, Any]:
    meta = body.get("metadata") or {}
    name, namespace, uid = meta.get("name", ""), meta.get("namespace", ""), meta.get("uid", "")
    try:
        # Checked first so a cluster without KubeRay gets no half-made children.
        if not kube.ray_api_available():
            raise _Stop(status_mod.Problem(
                "KubeRayMissing",
                "the ray.io/v1 RayCluster API is not served: install the KubeRay operator "
                "and its CRDs; retrying"), 30)
        existing = kube.get_ray_cluster(namespace, builders.ray_cluster_name(name))
        refusal = ownership_problem(existing, name=name, uid=uid)
        if refusal is not None:
            mine = existing if existing is not None and _owned_by(existing, uid) else None
            raise _Stop(*refusal, ray_cluster=mine)
        children = builders.build_children(pool, runtime.settings,
                                           workers=workers_for(pool, body, existing))
        kopf.adopt(children, owner=kopf.Body(cast(Any, copy.deepcopy(dict(body)))))
        if existing is None:
            # First creation: let the API server judge every child (quota,
            # RBAC, schema) before any is written, so a refusal leaves nothing
            # half-made behind.
            for child in children:
                # A RoleBinding can't be judged before its Role exists: without the
                # `bind` verb (which the operator must not have) the API server checks
                # it against that Role and answers 404. It is applied after the Role.
                if child.get("kind") != "RoleBinding":
                    kube.apply(child, dry_run=True)
        rc: dict[str, Any] = {}
        for child in children:
            rc = kube.apply(child)
    except kube.ApiProblem as exc:
        raise _Stop(exc.problem, exc.delay) from None
    return rc


def _current_workers(ray_cluster: Mapping[str, Any] | None) -> int | None:
    groups = ((ray_cluster or {}).get("spec") or {}).get("workerGroupSpecs") or ()
    for group in groups:
        if group.get("groupName") == builders.WORKER_GROUP:
            replicas = group.get("replicas")
            return replicas if isinstance(replicas, int) else None
    return None


def workers_for(pool: spec_mod.PoolSpec, body: Mapping[str, Any],
                ray_cluster: Mapping[str, Any] | None) -> tuple[int, list[str]]:
    """:func:`builders.worker_plan` from the RayCluster as it is and a fresh pool report."""
    report = status_mod.fresh_report(_status_of(body).get("pool"), _now())
    return builders.worker_plan(pool, current=_current_workers(ray_cluster), report=report)


def shrink_waiting(pool: spec_mod.PoolSpec, body: Mapping[str, Any],
                   ray_cluster: Mapping[str, Any] | None) -> bool:
    """The worker group holds pods it kept for leases that a new report lets go."""
    current = _current_workers(ray_cluster)
    replicas, remove = workers_for(pool, body, ray_cluster)
    return current is not None and bool(remove) and replicas < current


def refreshed_status(
    body: Mapping[str, Any], ray_cluster: Mapping[str, Any] | None,
    settings: settings_mod.Settings,
) -> dict[str, Any] | None:
    """The status to patch after a RayCluster event, or None if nothing would change.

    A refresh never claims a generation: only a reconcile that applied the
    children writes ``observedGeneration``.
    """
    if (body.get("metadata") or {}).get("deletionTimestamp"):
        return None
    st = compute(body, settings=settings, ray_cluster=ray_cluster, reconciled=False)
    return st if status_mod.status_changed(_status_of(body), st) else None


def refresh_from_ray_cluster(
    ray_cluster: Mapping[str, Any] | None, pool_key: tuple[str, str], runtime: Runtime,
) -> None:
    """A RayCluster changed: recompute its EnvPool's status and patch it if different."""
    with runtime.lock:
        if ray_cluster is None:
            runtime.ray_clusters.pop(pool_key, None)
        else:
            runtime.ray_clusters[pool_key] = copy.deepcopy(dict(ray_cluster))
        known = pool_key in runtime.pools
    if not known:
        return
    with runtime.pool_lock(pool_key):
        body = runtime.pools.get(pool_key)
        st = None if body is None else refreshed_status(body, ray_cluster, runtime.settings)
        if st is not None:
            kube.patch_envpool_status(pool_key[0], pool_key[1], st)
            runtime.metrics.status_updates.inc()


def counted(body: Mapping[str, Any], runtime: Runtime, logger: Any, retry: int = 0) -> Outcome:
    """:func:`reconcile` under the pool's lock, counted in the operator metrics."""
    meta = body.get("metadata") or {}
    key = (meta.get("namespace", ""), meta.get("name", ""))
    started = time.perf_counter()
    result = "error"
    try:
        with runtime.pool_lock(key):
            outcome = reconcile(body, runtime, logger, retry=retry)
        result = outcome.result
        return outcome
    finally:
        runtime.metrics.reconciles.labels(result=result).inc()
        runtime.metrics.reconcile_duration.observe(time.perf_counter() - started)


def reconcile_fresh(key: tuple[str, str], runtime: Runtime, logger: Any) -> Outcome | None:
    """Re-read EnvPool ``key`` and reconcile it outside kopf (resync, lost RayCluster).

    The fresh read keeps a cached body from re-creating the children of an
    EnvPool that was just deleted (their owner would be gone) or from
    applying an older spec. Returns None when there is nothing to reconcile.
    """
    ns, name = key
    with runtime.pool_lock(key):
        body = kube.get(spec_mod.API_VERSION, spec_mod.KIND, ns, name)
        if body is None:
            runtime.forget(key)
            return None
        if (body.get("metadata") or {}).get("deletionTimestamp"):
            return None
        with runtime.lock:
            runtime.pools[key] = copy.deepcopy(body)
        outcome = counted(body, runtime, logger)
        if status_mod.status_changed(_status_of(body), outcome.status):
            kube.patch_envpool_status(ns, name, outcome.status)
            runtime.metrics.status_updates.inc()
        return outcome


def every_pool(runtime: Runtime, stop: threading.Event, period: float,
               fn: Callable[[tuple[str, str], Runtime, Any], object], what: str,
               logger: Any) -> None:
    """Every ``period`` seconds, ``fn(key, runtime, logger)`` for every known EnvPool.

    One loop for the whole operator rather than a kopf timer per object:
    kopf timers put a finalizer on every EnvPool, and a finalizer would block
    deleting pools while the operator is down. A pool's failure is logged and
    the loop goes on to the next.
    """
    while not stop.wait(period):
        with runtime.lock:
            keys = sorted(runtime.pools)
        for key in keys:
            if stop.is_set():
                return
            try:
                fn(key, runtime, logger)
            except kube.ApiProblem as exc:
                logger.warning(f"{what} of EnvPool {key[0]}/{key[1]}: {exc}")
            except Exception:
                logger.exception(f"{what} of EnvPool {key[0]}/{key[1]} failed")


def resync_loop(runtime: Runtime, stop: threading.Event, logger: Any) -> None:
    """Every ``resync_seconds``, reconcile every known EnvPool (level-triggered repair)."""
    every_pool(runtime, stop, runtime.settings.resync_seconds, reconcile_fresh, "resync",
               logger)


@dataclasses.dataclass(frozen=True)
class ScaleDecision:
    """One autoscaler pass over an EnvPool: what it saw and what it asked for."""

    current: int
    leased: int | None  # None: no fresh pool-server report
    recommended: int
    replicas: int  # what spec.replicas should be; == current: nothing written


def autoscale(key: tuple[str, str], runtime: Runtime, logger: Any,
              now: float | None = None) -> ScaleDecision | None:
    """Size EnvPool ``key`` from its last pool-server report (``spec.autoscaling``).

    Reads the cached body (events keep it fresh), so a pass with nothing to change
    makes no API call. A change goes through the scale subresource, the same path as
    ``kubectl scale``; the spec update that follows runs the ordinary reconcile
    (ConfigMap, RayCluster workers) and reaches the pool server through its watch.
    Without a fresh report only the bounds are enforced. Returns None for pools
    that are not autoscaled (or suspended, deleted, invalid).
    """
    now = time.monotonic() if now is None else now
    with runtime.pool_lock(key):
        with runtime.lock:
            body = copy.deepcopy(runtime.pools.get(key))
        if body is None or (body.get("metadata") or {}).get("deletionTimestamp"):
            return None
        try:
            pool = parse(body, runtime.settings)
        except spec_mod.SpecError:
            return None
        auto = pool.autoscaling
        if auto is None or pool.suspend:
            runtime.stabilizers.pop(key, None)
            return None
        report = status_mod.fresh_report(_status_of(body).get("pool"), _now())
        current = pool.replicas
        leased: int | None = None
        if report is not None and "leasedEnvs" in report:
            raw = report.get("leasedEnvs")
            leased = raw if isinstance(raw, int) and not isinstance(raw, bool) else 0
            recommended = autoscaler.recommend(auto, leased=leased,
                                               envs_per_actor=pool.envs_per_actor)
            stab = runtime.stabilizers.setdefault(key, autoscaler.Stabilizer())
            replicas = stab.decide(auto, current=current, recommended=recommended, now=now)
        else:
            recommended = replicas = max(auto.min_replicas, min(auto.max_replicas, current))
        decision = ScaleDecision(current, leased, recommended, replicas)
        if replicas != current:
            if kube.scale_envpool(key[0], key[1], replicas) is None:
                return decision  # deleted meanwhile
            with runtime.lock:
                cached = runtime.pools.get(key)
                if cached is not None:  # until the watch brings the new body
                    cached.setdefault("spec", {})["replicas"] = replicas
            runtime.metrics.scale_writes.labels(
                direction="up" if replicas > current else "down").inc()
            logger.info(f"autoscaler: EnvPool {key[0]}/{key[1]} {current} -> {replicas} envs "
                        f"({_why(auto, leased)})")
        _report_decision(key, body, decision, auto)
        return decision


def _why(auto: spec_mod.Autoscaling, leased: int | None) -> str:
    if leased is None:
        return f"no fresh pool report: within [{auto.min_replicas}, {auto.max_replicas}]"
    buffer = f"{auto.buffer_envs} free" if auto.buffer_envs is not None \
        else f"{auto.buffer_percent}% free"
    return f"{leased} leased + {buffer}, within [{auto.min_replicas}, {auto.max_replicas}]"


def _report_decision(key: tuple[str, str], body: Mapping[str, Any], decision: ScaleDecision,
                     auto: spec_mod.Autoscaling) -> None:
    """``status.autoscaling``, patched only when the recommendation or the size changed."""
    previous = _status_of(body).get("autoscaling") or {}
    held = decision.replicas > decision.recommended
    message = f"{decision.replicas} envs: {_why(auto, decision.leased)}" + (
        f"; {decision.recommended} asked, held for scaleDownDelaySeconds="
        f"{auto.scale_down_delay_seconds}" if held else "")
    st: dict[str, Any] = {"recommendedReplicas": decision.recommended, "message": message}
    if decision.replicas != decision.current:
        st["lastScaleTime"] = status_mod.rfc3339(_now())
    if any(previous.get(k) != v for k, v in st.items()):
        kube.patch_envpool_status(key[0], key[1], {"autoscaling": st})


def autoscale_loop(runtime: Runtime, stop: threading.Event, logger: Any) -> None:
    """Every ``autoscale_seconds``, one :func:`autoscale` pass over every known EnvPool.

    Reports trigger a pass of their own pool as they arrive; this loop lets a
    scale-down delay run out when nothing changes, and enforces the bounds.
    """
    every_pool(runtime, stop, runtime.settings.autoscale_seconds, autoscale, "autoscaling",
               logger)
