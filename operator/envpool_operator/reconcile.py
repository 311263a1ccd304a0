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

import contextvars
import copy
import dataclasses
import functools
import hashlib
import json
import logging
import secrets
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any, Final, cast

import kopf

from envpool_operator import access, builders, gcs_store, kube, names
from envpool_operator import runtime as runtime_mod
from envpool_operator import settings as settings_mod
from envpool_operator import status as status_mod
from remote_env import restarts
from remote_env import spec as spec_mod

#: for status writes made with no kopf logger at hand (tests, tools)
_log = logging.getLogger(__name__)

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
    mark = runtime.ray_cluster_mark(key)
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
    # The apply's answer, unless the watch brought the RayCluster since: then the cache
    # may be newer, and the refresh that event asked for runs after this reconcile.
    runtime.remember_ray_cluster_read(key, rc, mark)
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
        render, owner, children = render_children(body, pool, runtime.settings, existing)
        ft_render = render.generation >= builders.GCS_FT_GENERATION
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
    rc = next((out for child, out in zip(second, stored, strict=True)
               if child.get("kind") == "RayCluster"), {})
    runtime.remember_applied(key_of(body), applied_state(body, children, rc))
    return rc


def key_of(body: Mapping[str, Any]) -> tuple[str, str]:
    meta = body.get("metadata") or {}
    return meta.get("namespace", ""), meta.get("name", "")


def render_children(
    body: Mapping[str, Any], pool: spec_mod.PoolSpec, settings: settings_mod.Settings,
    existing: Mapping[str, Any] | None,
) -> tuple[builders.Render, kopf.Body, list[dict[str, Any]]]:
    """The rendering, the owner and the children of EnvPool ``body`` whose RayCluster is
    ``existing`` (pure: the reconcile applies them, the resync compares them)."""
    requested = ((body.get("metadata") or {}).get("annotations") or {}).get(
        names.RENDER_ANNOTATION)
    render = builders.render_for(pool, settings, existing, requested=requested)
    children = builders.build_children(pool, settings, workers=workers_for(pool, body, existing),
                                       render=render)
    # The pool's own Redis serves the GCS fault tolerance of render generation 2;
    # a pool kept at generation 1 by an upgrade has none (its head runs without it).
    if render.generation >= builders.GCS_FT_GENERATION:
        children += gcs_store.build_redis_children(pool, settings)
    owner = kopf.Body(cast(Any, copy.deepcopy(dict(body))))
    kopf.adopt(children, owner=owner)
    return render, owner, children


def children_digest(children: Sequence[Mapping[str, Any]]) -> str:
    """A digest of rendered children: equal exactly when an apply would send the same.

        >>> children_digest([{"kind": "ConfigMap", "data": {"a": "1"}}]) == children_digest(
        ...     [{"data": {"a": "1"}, "kind": "ConfigMap"}])
        True
    """
    text = json.dumps(list(children), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def applied_state(body: Mapping[str, Any], children: Sequence[Mapping[str, Any]],
                  ray_cluster: Mapping[str, Any]) -> runtime_mod.Applied:
    """:class:`~envpool_operator.runtime.Applied` of ``children`` rendered from ``body``
    with ``ray_cluster`` the RayCluster as stored (after the apply or as watched)."""
    rc_meta = ray_cluster.get("metadata") or {}
    return runtime_mod.Applied(
        digest=children_digest(children),
        pool_generation=(body.get("metadata") or {}).get("generation"),
        ray_cluster_uid=str(rc_meta.get("uid") or ""),
        ray_cluster_generation=rc_meta.get("generation"),
    )


def _metadata_holds(rendered: Mapping[str, Any], live: Mapping[str, Any]) -> bool:
    """The labels and annotations the operator renders on an object are on ``live``
    (a hand edit of them does not change the RayCluster's generation)."""
    want, have = rendered.get("metadata") or {}, live.get("metadata") or {}
    return all(
        (have.get(field) or {}).get(k) == v
        for field in ("labels", "annotations") for k, v in (want.get(field) or {}).items())


def as_rendered(key: tuple[str, str], runtime: runtime_mod.Runtime) -> runtime_mod.Applied | None:
    """EnvPool ``key``'s children as they would be applied now and its RayCluster as last
    watched, from the operator's caches alone (no API call); None when that cannot say
    (unknown, being deleted, an invalid spec, a RayCluster not ours or whose labels or
    annotations differ from the rendered ones): the resync then reads and applies."""
    body, rc = runtime.pool_body(key), runtime.ray_cluster(key)
    if body is None or rc is None:
        return None
    meta = body.get("metadata") or {}
    if meta.get("deletionTimestamp"):
        return None
    try:
        pool = settings_mod.parse_pool(body, runtime.settings)
    except spec_mod.SpecError:
        return None
    if ownership_problem(rc, name=meta.get("name", ""), uid=meta.get("uid", "")) is not None:
        return None
    _render, _owner, children = render_children(body, pool, runtime.settings, rc)
    rendered_rc = next(c for c in children if c.get("kind") == "RayCluster")
    if not _metadata_holds(rendered_rc, rc):
        return None
    return applied_state(body, children, rc)


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


def write_status(key: tuple[str, str], body: Mapping[str, Any], status: Mapping[str, Any],
                 runtime: runtime_mod.Runtime, written: StatusWrites | None,
                 logger: Any) -> None:
    """Patch EnvPool ``key``'s status (the caller holds the pool's lock), after posting
    the Event of the head's availability changing between ``body``'s status and
    ``status`` (:func:`status.head_event`: an outage began or ended).

    The Event goes first, and at once (:func:`kube.post_event`): with ``kopf.event``
    (queued, posted later) after the status, an operator killed in between lost the
    outage's HeadUnavailable for good, since its successor saw the outage already
    recorded (a CI rehearsal's SIGKILL test). Event first: a death in between leaves the
    status as it was, and the successor posts the Event again. An Event the API refuses
    is logged, not retried: the condition is the record.
    """
    event = status_mod.head_event(status_mod.status_of(body), status)
    if event is not None:
        etype, reason, message = event
        try:
            kube.post_event(body, etype, reason, message)
            logger.info(f"EnvPool {key[0]}/{key[1]}: {reason}: {message}")
        except kube.ApiProblem as exc:
            logger.warning(f"EnvPool {key[0]}/{key[1]}: {reason} ({message}); its Event "
                           f"was not posted: {exc}")
    kube.patch_envpool_status(key[0], key[1], status)
    runtime.metrics.status_updates.inc()
    if written is not None:
        written.wrote(key, status)


def refresh_from_ray_cluster(
    pool_key: tuple[str, str], runtime: runtime_mod.Runtime,
    written: StatusWrites | None = None, logger: Any = None,
) -> None:
    """The EnvPool or its RayCluster changed: recompute the EnvPool's status from the
    caches and patch it if different (from the last EnvPool seen and, if given, what
    was ``written`` since), with the head's Event if any (:func:`write_status`).

    The caches are read under the pool's lock, and the status is written under it: the
    status writes land in the order they were computed, each from the newest copies
    seen, so none can put an older phase over a newer one.
    """
    with runtime.pool_lock(pool_key):
        ray_cluster = runtime.ray_cluster(pool_key)
        body = runtime.pool_body(pool_key)
        if body is not None and written is not None:
            body = {**body, "status": written.basis(pool_key, status_mod.status_of(body))}
        st = None if body is None else refreshed_status(body, ray_cluster, runtime.settings)
        if body is not None and st is not None:
            write_status(pool_key, body, st, runtime, written, logger or _log)


@dataclasses.dataclass(frozen=True)
class _Refresh:
    deleted: bool  # the RayCluster was deleted (since the last refresh of the pool)
    logger: Any
    context: contextvars.Context  # kopf's (its Events and per-object logger need it)


class StatusRefresher:
    """The status refreshes that EnvPool and RayCluster events ask for: coalesced per pool
    and run on threads of their own, each under the pool's lock
    (:func:`refresh_from_ray_cluster`).

    Every status write made for an event goes through here rather than through kopf's
    patch of the handler's body: kopf applies that patch after the handler returns,
    outside the pool's lock, so a status computed from an older RayCluster could land
    after one computed from a newer, and the pool's phase stayed behind (a resumed pool
    shown "Provisioning" with its workers ready, issue 34's async handlers).

    kopf (1.45) hands a handler every event of an object in turn, each holding its whole
    parsed body until the handler is done with it. With the refreshes on kopf's handler
    threads, a burst left each RayCluster's events queued behind the reconciles for those
    threads, and the bodies were most of the operator's memory (issue 34). The event
    handler now keeps the RayCluster's slim copy (:func:`runtime.cached_ray_cluster`) and
    :meth:`submit`s its pool, which returns at once; a pool asked for again before its
    refresh ran is refreshed once, from the latest RayCluster. One refresh per pool at a
    time, pools in the order asked.
    """

    def __init__(self, runtime: runtime_mod.Runtime, written: StatusWrites | None,
                 stop: threading.Event, threads: int = 4) -> None:
        self._runtime, self._written, self._stop = runtime, written, stop
        self._cond = threading.Condition()
        #: Pools to refresh, in the order first asked (a dict keeps insertion order).
        self._pending: dict[tuple[str, str], _Refresh] = {}
        #: Pools being refreshed now (by one thread each).
        self._busy: set[tuple[str, str]] = set()
        self._threads = [threading.Thread(target=self._run, name=f"envpool-refresh-{i}",
                                          daemon=True) for i in range(threads)]
        for thread in self._threads:
            thread.start()

    def submit(self, key: tuple[str, str], *, deleted: bool, logger: Any) -> None:
        """Refresh pool ``key``'s status from its cached RayCluster soon (and, ``deleted``,
        put a RayCluster deleted behind the operator's back back)."""
        with self._cond:
            earlier = self._pending.pop(key, None)
            self._pending[key] = _Refresh(deleted or (earlier is not None and earlier.deleted),
                                          logger, contextvars.copy_context())
            self._cond.notify()

    def pending(self) -> int:
        with self._cond:
            return len(self._pending)

    def _take(self) -> tuple[tuple[str, str], _Refresh] | None:
        with self._cond:
            while not self._stop.is_set():
                key = next((k for k in self._pending if k not in self._busy), None)
                if key is not None:
                    self._busy.add(key)
                    return key, self._pending.pop(key)
                self._cond.wait(1.0)
            return None

    def _run(self) -> None:
        while (job := self._take()) is not None:
            key, refresh = job
            try:
                refresh.context.run(self._refresh, key, refresh)
            except Exception:
                refresh.logger.exception(f"status refresh of EnvPool {key[0]}/{key[1]} failed")
            finally:
                with self._cond:
                    self._busy.discard(key)
                    self._cond.notify()

    def _refresh(self, key: tuple[str, str], refresh: _Refresh) -> None:
        runtime, logger = self._runtime, refresh.logger
        try:
            refresh_from_ray_cluster(key, runtime, self._written, logger)
            if refresh.deleted and runtime.knows_pool(key):
                # Re-read first: the EnvPool itself may be what is being deleted.
                reconcile_fresh(key, runtime, logger, self._written)
        except kube.ApiProblem as exc:
            logger.warning(f"status refresh of EnvPool {key[0]}/{key[1]} failed: {exc}")


def reconcile_handled(body: Mapping[str, Any], runtime: runtime_mod.Runtime, logger: Any,
                      *, retry: int, written: StatusWrites | None) -> Outcome:
    """kopf's create/update/resume: :func:`counted`, and its status written under the
    pool's lock (see :class:`StatusRefresher` for why not through kopf's patch)."""
    meta = body.get("metadata") or {}
    key = (meta.get("namespace", ""), meta.get("name", ""))
    with runtime.pool_lock(key):
        outcome = counted(body, runtime, logger, retry=retry)
        before = status_mod.status_of(body)
        basis = {**body, "status": written.basis(key, before) if written is not None else before}
        write_status(key, basis, outcome.status, runtime, written, logger)
    return outcome


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
        mark = runtime.pool_mark(key)
        body = kube.get(spec_mod.API_VERSION, spec_mod.KIND, ns, name)
        if body is None:
            runtime.forget(key)
            return None
        if (body.get("metadata") or {}).get("deletionTimestamp"):
            return None
        runtime.remember_pool_read(key, body, mark)
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
    """One pool's share of a resync pass, counted: nothing but the status (from the
    caches) when the children render as last applied and the watched RayCluster is as
    applied (:func:`as_rendered`, :meth:`Runtime.skip_resync`), else
    :func:`reconcile_fresh` (2 GETs, every child applied).

    What the skip still repairs at once: a RayCluster whose spec was edited (its
    generation moves), re-created (its uid), relabelled, or deleted (no cached
    RayCluster); a spec or pool report that renders differently. The watch that feeds
    the caches is re-listed every ``server_timeout`` (4.5 min), so a missed event is
    caught then. What it repairs only at the next full re-apply (every
    ``resync_full_every`` passes, and at every operator start and spec change): a hand
    edit of the ConfigMap, the RBAC objects, the NetworkPolicy or the Redis children,
    which the operator may write but not read.
    """
    try:
        with runtime.pool_lock(key):
            seen = as_rendered(key, runtime)
            if seen is not None and runtime.skip_resync(key, seen):
                runtime.metrics.resyncs_unchanged.inc()
                refresh_from_ray_cluster(key, runtime, written, logger)
                return None
        return reconcile_fresh(key, runtime, logger, written)
    finally:
        runtime.metrics.resyncs.inc()


def resync_loop(runtime: runtime_mod.Runtime, stop: threading.Event, logger: Any,
                written: StatusWrites | None = None) -> None:
    """Every ``resync_seconds``, reconcile every known EnvPool (level-triggered repair)."""
    runtime_mod.every_pool(runtime, stop, runtime.settings.resync_seconds,
                           functools.partial(resync, written=written), "resync", logger)
