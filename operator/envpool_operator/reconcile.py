"""One level-triggered reconcile of an EnvPool, the status-only refresh, the resync.

Called by the kopf handlers in :mod:`envpool_operator.handlers`; the manifests
come from :mod:`builders`, the status from :mod:`status`, API calls go through
:mod:`kube`, shared state is a :class:`~envpool_operator.runtime.Runtime`.
Running it twice, or after a crash halfway, gives the same children: names are
derived from the EnvPool and writes are server-side apply. The autoscaler pass
(:mod:`~envpool_operator.scaling`) only writes ``spec.replicas``; that change
reaches the children through this reconcile.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import secrets
import threading
import time
from collections.abc import Mapping
from typing import Any, Final, cast

import kopf

from envpool_operator import access, builders, gcs_store, kube, names
from envpool_operator import runtime as runtime_mod
from envpool_operator import settings as settings_mod
from envpool_operator import status as status_mod
from remote_env import restarts
from remote_env import spec as spec_mod

#: Delay before looking again while an old RayCluster is being deleted.
ROLL_POLL_SECONDS = 2.0


def _owned_by(obj: Mapping[str, Any], uid: str) -> bool:
    refs = (obj.get("metadata") or {}).get("ownerReferences") or ()
    return any(ref.get("uid") == uid for ref in refs)


def _owner_pool_names(obj: Mapping[str, Any]) -> set[str]:
    refs = (obj.get("metadata") or {}).get("ownerReferences") or ()
    return {ref.get("name", "") for ref in refs if ref.get("kind") == spec_mod.KIND}


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
    previous = status_mod.status_of(body)
    generation = meta.get("generation")
    pool: spec_mod.PoolSpec | None = None
    error: str | None = None
    try:
        pool = settings_mod.parse_pool(body, settings)
    except spec_mod.SpecError as exc:
        error = str(exc)
    # The rendering the reconcile recorded on the RayCluster (it chose it with the
    # full object in hand: render_for), this operator's when there is none.
    render = builders.Render.of_ray_cluster(ray_cluster)
    if render is None or not 1 <= render.generation <= builders.RENDER_GENERATION:
        render = builders.Render.current(settings)
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
        now=status_mod.now(),
        problem=problem,
        expected_hash=builders.cluster_hash(pool, settings, render) if pool else None,
        render_lag=builders.render_lag(pool, settings, render) if pool else None,
    )


@dataclasses.dataclass(frozen=True)
class Outcome:
    """The status to write, and the error to raise after writing it (if any)."""

    status: dict[str, Any]
    result: str  # a metrics.RESULTS label
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


def reconcile(body: Mapping[str, Any], runtime: runtime_mod.Runtime, logger: Any,
              retry: int = 0) -> Outcome:
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
        pool = settings_mod.parse_pool(body, settings)
    except spec_mod.SpecError as exc:
        st = compute(body, settings=settings, ray_cluster=runtime.ray_cluster(key),
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
    runtime.remember_ray_cluster(key, rc)
    return Outcome(compute(body, settings=settings, ray_cluster=rc, reconciled=True), "success")


def _apply_children(
    body: Mapping[str, Any], pool: spec_mod.PoolSpec, runtime: runtime_mod.Runtime,
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
        existing = kube.get_ray_cluster(namespace, names.ray_cluster_name(name))
        refusal = ownership_problem(existing, name=name, uid=uid)
        if refusal is not None:
            mine = existing if existing is not None and _owned_by(existing, uid) else None
            raise _Stop(*refusal, ray_cluster=mine)
        requested = (meta.get("annotations") or {}).get(names.RENDER_ANNOTATION)
        render = builders.render_for(pool, runtime.settings, existing, requested=requested)
        children = builders.build_children(pool, runtime.settings,
                                           workers=workers_for(pool, body, existing),
                                           render=render)
        # The pool's own Redis serves the GCS fault tolerance of render generation 2;
        # a pool kept at generation 1 by an upgrade has none (its head runs without it).
        ft_render = render.generation >= builders.GCS_FT_GENERATION
        if ft_render:
            children += gcs_store.build_redis_children(pool, runtime.settings)
        owner = kopf.Body(cast(Any, copy.deepcopy(dict(body))))
        kopf.adopt(children, owner=owner)
        # The lease API's token (render generation 2: only its head mounts it). Created
        # once, never applied: a token made here is used only if the Secret is new (an
        # existing one, the operator's or an admin's, is kept unread).
        once: list[dict[str, Any]] = []
        if render.generation >= builders.LEASE_API_GENERATION:
            once.append(access.build_lease_token_secret(pool, secrets.token_urlsafe(32)))
            kopf.adopt(once, owner=owner)
        if existing is None:
            # First creation: let the API server judge every child (quota,
            # RBAC, schema) before any is written, so a refusal leaves nothing
            # half-made behind. A RoleBinding can't be judged before its Role
            # exists: without the `bind` verb (which the operator must not have)
            # the API server checks it against that Role and answers 404. It is
            # applied after the Role.
            kube.apply_all([c for c in children if c.get("kind") != "RoleBinding"],
                           dry_run=True, create=once)
        # Before the Redis that reads it (after the dry run: nothing made if refused).
        if ft_render:
            _create_redis_password(pool, owner)
        # Two waves of writes at once (a slow API server costs two round trips, not
        # seven): the RoleBinding needs its Role, and the pods the ServiceAccount, the
        # ConfigMap and the token Secret; the rest needs nothing of each other.
        first = [c for c in children if c.get("kind") not in _SECOND_WAVE]
        second = [c for c in children if c.get("kind") in _SECOND_WAVE]
        kube.apply_all(first, create=once)
        stored = kube.apply_all(second)
    except kube.ApiProblem as exc:
        raise _Stop(exc.problem, exc.delay) from None
    return next((out for child, out in zip(second, stored, strict=True)
                 if child.get("kind") == "RayCluster"), {})


def _create_redis_password(pool: spec_mod.PoolSpec, owner: kopf.Body) -> None:
    """Secret ``<name>-redis`` for the pool's own Redis, created once with a fresh
    password (never read back, never rotated: the GCS and the Redis hold it)."""
    if not pool.head_fault_tolerance.provisioned:
        return
    secret = gcs_store.build_password_secret(pool, secrets.token_urlsafe(32))
    kopf.adopt(secret, owner=owner)
    kube.create_absent(secret)


#: Children written after the others: they refer to them (RoleBinding -> Role; the
#: RayCluster's pods -> ServiceAccount, ConfigMap).
_SECOND_WAVE: Final = frozenset({"RoleBinding", "RayCluster"})


def _current_workers(ray_cluster: Mapping[str, Any] | None) -> int | None:
    groups = ((ray_cluster or {}).get("spec") or {}).get("workerGroupSpecs") or ()
    for group in groups:
        if group.get("groupName") == names.WORKER_GROUP:
            replicas = group.get("replicas")
            return replicas if isinstance(replicas, int) else None
    return None


def workers_for(pool: spec_mod.PoolSpec, body: Mapping[str, Any],
                ray_cluster: Mapping[str, Any] | None) -> tuple[int, list[str]]:
    """:func:`builders.worker_plan` from the RayCluster as it is and a fresh pool report."""
    report = status_mod.fresh_report(status_mod.status_of(body).get("pool"), status_mod.now())
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
    return st if status_mod.status_changed(status_mod.status_of(body), st) else None


def merge_patched(current: Mapping[str, Any], patch: Mapping[str, Any]) -> dict[str, Any]:
    """``current`` after a JSON merge patch of its top-level keys (None deletes).

        >>> merge_patched({"phase": "Pending", "leasedEnvs": 2}, {"phase": "Ready", "leasedEnvs": None})
        {'phase': 'Ready'}
    """
    out = dict(current)
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = value
    return out


class StatusWrites:
    """The status fields this operator last patched into each EnvPool.

    The bodies that statuses are compared with can predate the operator's own last
    write: kopf patches the annotations and the status in two requests (an event
    comes between them), and a RayCluster event is compared with the last EnvPool
    event seen. Compared with such a body, a status already written looks changed
    and would be written again (about half the status patches of a 1,000-pool burst,
    issue 34). :meth:`basis` is that body with the last write merged in.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last: dict[tuple[str, str], dict[str, Any]] = {}

    def wrote(self, key: tuple[str, str], status: Mapping[str, Any]) -> None:
        with self._lock:
            self._last[key] = merge_patched(self._last.get(key, {}), status)

    def basis(self, key: tuple[str, str], current: Mapping[str, Any]) -> dict[str, Any]:
        """``current`` (a body's status) with the last write merged in."""
        with self._lock:
            return merge_patched(current, self._last.get(key, {}))

    def forget(self, key: tuple[str, str]) -> None:
        with self._lock:
            self._last.pop(key, None)


def release_redis_cleanup(ray_cluster: Mapping[str, Any], logger: Any) -> bool:
    """Take KubeRay's Redis-cleanup finalizer off a RayCluster being deleted whose Redis is
    the operator's own and goes with its EnvPool (:func:`gcs_store.own_redis_cleanup_pending`,
    :func:`gcs_store.redis_goes_with_pool`): the keys to clean go with the Redis, and in a
    namespace being deleted KubeRay's cleanup Job is refused, which held the RayCluster
    and the namespace 15-22 minutes (KubeRay's timeout under its retry backoff). A
    Redis the user named keeps KubeRay's cleanup. Whether the finalizer was removed."""
    pool_name = gcs_store.own_redis_cleanup_pending(ray_cluster)
    if pool_name is None:
        return False
    meta = ray_cluster["metadata"]
    pool = kube.get(spec_mod.API_VERSION, spec_mod.KIND, meta["namespace"], pool_name)
    if not gcs_store.redis_goes_with_pool(ray_cluster, pool):
        return False
    removed = kube.remove_finalizer({**ray_cluster, "apiVersion": "ray.io/v1", "kind": "RayCluster"},
                                    gcs_store.KUBERAY_CLEANUP_FINALIZER)
    if removed:
        logger.info(f"RayCluster {meta['namespace']}/{meta['name']}: removed KubeRay's "
                    f"{gcs_store.KUBERAY_CLEANUP_FINALIZER}: its Redis "
                    f"{gcs_store.redis_name(pool_name)} goes with EnvPool {pool_name}")
    return removed


def refresh_from_ray_cluster(
    ray_cluster: Mapping[str, Any] | None, pool_key: tuple[str, str],
    runtime: runtime_mod.Runtime, written: StatusWrites | None = None,
) -> tuple[dict[str, Any], tuple[str, str, str]] | None:
    """A RayCluster changed: recompute its EnvPool's status and patch it if different
    (from the last EnvPool seen and, if given, what was ``written`` since).

    Returns the EnvPool and the Event to post about it when the head's availability
    changed (:func:`status.head_event`: an outage began or ended), else None.
    """
    if not runtime.remember_ray_cluster(pool_key, ray_cluster):
        return None
    with runtime.pool_lock(pool_key):
        body = runtime.pool_body(pool_key)
        if body is not None and written is not None:
            body = {**body, "status": written.basis(pool_key, status_mod.status_of(body))}
        st = None if body is None else refreshed_status(body, ray_cluster, runtime.settings)
        if st is not None:
            kube.patch_envpool_status(pool_key[0], pool_key[1], st)
            runtime.metrics.status_updates.inc()
            if written is not None:
                written.wrote(pool_key, st)
        if body is None or st is None:
            return None
        event = status_mod.head_event(status_mod.status_of(body), st)
        return (dict(body), event) if event is not None else None


def counted(body: Mapping[str, Any], runtime: runtime_mod.Runtime, logger: Any,
            retry: int = 0) -> Outcome:
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


def reconcile_fresh(key: tuple[str, str], runtime: runtime_mod.Runtime,
                    logger: Any, written: StatusWrites | None = None) -> Outcome | None:
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
        runtime.remember_pool(key, body)
        outcome = counted(body, runtime, logger)
        # compared with the fresh read alone: this is the repair path
        if status_mod.status_changed(status_mod.status_of(body), outcome.status):
            kube.patch_envpool_status(ns, name, outcome.status)
            runtime.metrics.status_updates.inc()
            if written is not None:
                written.wrote(key, outcome.status)
        return outcome


def resync(key: tuple[str, str], runtime: runtime_mod.Runtime, logger: Any,
           written: StatusWrites | None = None) -> Outcome | None:
    """One pool's share of a resync pass: :func:`reconcile_fresh`, counted."""
    try:
        return reconcile_fresh(key, runtime, logger, written)
    finally:
        runtime.metrics.resyncs.inc()


def resync_loop(runtime: runtime_mod.Runtime, stop: threading.Event, logger: Any,
                written: StatusWrites | None = None) -> None:
    """Every ``resync_seconds``, reconcile every known EnvPool (level-triggered repair)."""
    runtime_mod.every_pool(runtime, stop, runtime.settings.resync_seconds,
                           functools.partial(resync, written=written), "resync", logger)
