"""kopf handlers: thin decorators over :mod:`envpool_operator.reconcile` and
:mod:`envpool_operator.scaling`.

Run with ``envpool operator`` or ``kopf run -m envpool_operator.handlers``.
The handlers that call the API are plain functions, so kopf runs them in its thread
pool and the blocking Kubernetes client never stalls the event loop. The two watch-event
handlers are async: they only update caches and compute a status (no API call), so
kopf is done with each event, and its body, at once; what calls the API goes to threads.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any

import kopf
import prometheus_client

from envpool_operator import gcs_store, kube, names, reconcile, scaling
from envpool_operator import metrics as metrics_mod
from envpool_operator import runtime as runtime_mod
from envpool_operator import settings as settings_mod
from remote_env import kubeconfig
from remote_env import spec as spec_mod

G, V, P = spec_mod.GROUP, spec_mod.VERSION, spec_mod.PLURAL


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, logger: Any, **_: Any) -> None:
    cfg: settings_mod.Settings = getattr(memo, "envpool_settings", None) or settings_mod.from_env()
    # Watch streams can stall without an error (kopf issue #614): a proxy or
    # load balancer drops the TCP connection silently and no event ever comes
    # again. Ask the API server to end every watch after ~4.5 minutes so it is
    # re-established regularly ...
    settings.watching.server_timeout = 270
    # ... and give up client-side a bit later, in case the server's close
    # never reaches us either (the half-open connection case).
    settings.watching.client_timeout = 300
    # A connect that takes longer than this is a dead endpoint; retry instead
    # of hanging the watcher for the OS TCP timeout (minutes).
    settings.watching.connect_timeout = 10
    # Same bounds for ordinary requests (patches of status and annotations).
    settings.networking.request_timeout = 60
    settings.networking.connect_timeout = 10
    # Kubernetes Events only for warnings and errors: with hundreds of pools
    # and periodic resyncs, info-level events would flood etcd.
    settings.posting.level = logging.WARNING
    settings.posting.loggers = True  # handler errors become Events on the EnvPool
    # Handler progress and the last-handled spec live in annotations, not in
    # .status: the pool server owns status.pool and the operator owns the rest.
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="envpool.dev")
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix="envpool.dev", key="last-handled-configuration")
    settings.persistence.finalizer = "envpool.dev/finalizer"
    # Handlers are sync (blocking client) and run in this many threads. A first
    # reconcile is 3 round trips (a GET, the dry runs at once, two waves of
    # applies), each waiting on the API server: the threads mostly wait, and the
    # RayClusters' status refreshes queue behind the reconciles for the same threads.
    settings.execution.max_workers = cfg.handler_threads
    # Watching a list of exact namespaces needs no namespace scan; without this,
    # kopf retries listing namespaces (which least-privilege RBAC refuses) for
    # ~1 minute before it starts reconciling.
    if getattr(memo, "envpool_exact_namespaces", False):
        settings.scanning.disabled = True
    logging.getLogger("kopf.objects").addFilter(_quiet_event_handlers)
    registry = prometheus_client.CollectorRegistry()
    runtime = runtime_mod.Runtime(settings=cfg, metrics=metrics_mod.OperatorMetrics(registry))
    kube.configure(
        observe=lambda verb, resource, code: runtime.metrics.api_requests.labels(
            verb=verb, resource=resource, code=str(code)).inc(),
        # a connection for every thread that calls the API: the handler threads, as
        # many writers of children, the resync and autoscaler loops
        connections=2 * cfg.handler_threads + 8, writers=cfg.handler_threads)
    runtime.metrics.track_pools(runtime.phases)
    runtime.metrics.track_heads(runtime.heads)
    memo.envpool = runtime
    if cfg.metrics_port:
        addr = cfg.metrics_addr or kubeconfig.default_bind_address()
        memo.envpool_metrics_server, _thread = metrics_mod.serve(registry, cfg.metrics_port, addr)
    memo.envpool_stop = threading.Event()
    memo.envpool_status_writes = reconcile.StatusWrites()
    memo.envpool_refresher = reconcile.StatusRefresher(
        runtime, memo.envpool_status_writes, memo.envpool_stop)
    threading.Thread(
        target=reconcile.resync_loop, name="envpool-resync", daemon=True,
        args=(runtime, memo.envpool_stop, logging.getLogger("envpool_operator.resync"),
              memo.envpool_status_writes),
    ).start()
    threading.Thread(
        target=scaling.autoscale_loop, name="envpool-autoscale", daemon=True,
        args=(runtime, memo.envpool_stop, logging.getLogger("envpool_operator.autoscale")),
    ).start()
    logger.info(f"envpool operator: image={cfg.image} metrics_port={cfg.metrics_port} "
                f"resync={cfg.resync_seconds:g}s")


def _quiet_event_handlers(record: logging.LogRecord) -> bool:
    # Event handlers run on every watch event; their success is not news.
    msg = str(record.msg)
    return not (msg.startswith("Handler '") and "_event_fn' succeeded" in msg)


@kopf.on.cleanup()
def cleanup(memo: kopf.Memo, **_: Any) -> None:
    stop = getattr(memo, "envpool_stop", None)
    if stop is not None:
        stop.set()
    server = getattr(memo, "envpool_metrics_server", None)
    if server is not None:
        server.shutdown()


def _runtime(memo: kopf.Memo) -> runtime_mod.Runtime:
    runtime: runtime_mod.Runtime = memo.envpool
    return runtime


def _written(memo: kopf.Memo) -> reconcile.StatusWrites:
    written: reconcile.StatusWrites = memo.envpool_status_writes
    return written


@kopf.on.resume(G, V, P)
@kopf.on.create(G, V, P)
# Spec changes only: status.pool reports from the pool server must not re-run
# the whole reconcile. kubectl scale lands here too (spec.replicas): it patches
# the ConfigMap and the worker count, the hash is unchanged, nothing rolls.
@kopf.on.update(G, V, P, field="spec")
def reconcile_fn(body: kopf.Body, memo: kopf.Memo, logger: Any, retry: int, **_: Any) -> None:
    try:
        outcome = reconcile.reconcile_handled(body, _runtime(memo), logger, retry=retry,
                                              written=_written(memo))
    except kube.ApiProblem as exc:  # the status write refused: kopf tries again
        raise kopf.TemporaryError(str(exc), delay=10) from exc
    if outcome.error is not None:
        raise outcome.error  # kopf: PermanentError stops, TemporaryError retries after delay


@kopf.on.event(G, V, P)
async def pool_event_fn(
    body: kopf.Body, type: str | None, memo: kopf.Memo, logger: Any, **_: Any,
) -> None:
    """Keep the EnvPool cache fresh; turn pool-server reports into phase/conditions
    and, for ``spec.autoscaling``, into a size (a lease report scales up at once).

    Async, on kopf's event loop: the cache needs no API call and no lock that a
    reconcile holds, and the status is left to the refresher's threads, so the event is
    done at once and kopf lets go of its body (issue 34: bodies waiting for a handler
    thread behind the reconciles were most of the operator's memory). Only an
    autoscaled pool, or one with worker pods to let go, waits for a thread.
    """
    runtime = _runtime(memo)
    key = (body.metadata.namespace or "", body.metadata.name or "")
    if type == "DELETED":
        runtime.forget(key)
        _written(memo).forget(key)
        # Its RayCluster may have been marked for deletion before the EnvPool went (a
        # namespace deleted): that event found the EnvPool still there. Read the
        # RayCluster itself (the cached copy is slim: no gcsFaultToleranceOptions), off
        # kopf's event loop; one GET per deleted pool.
        await asyncio.to_thread(_release_after_pool, key, logger)
        return
    runtime.remember_pool(key, body)
    if body.metadata.deletion_timestamp or runtime.ray_cluster(key) is None:
        return  # nothing to report yet: the reconcile writes the first status
    # The status (a pool-server report, a spec change) from the body just remembered,
    # written on the refresher's threads in order with every other status write.
    refresher: reconcile.StatusRefresher = memo.envpool_refresher
    refresher.submit(key, deleted=False, logger=logger)
    try:
        pool = settings_mod.parse_pool(body, runtime.settings)
    except spec_mod.SpecError:
        return  # the reconcile reports it (SpecValid=False)
    # Worker pods kept for leased envs: once a report names pods without leases,
    # shrink now rather than at the next spec change or resync.
    shrink = reconcile.shrink_waiting(pool, body, runtime.ray_cluster(key))
    if pool.autoscaling is not None or shrink:
        await asyncio.to_thread(_scale, key, runtime, logger, _written(memo), shrink)


def _scale(key: tuple[str, str], runtime: runtime_mod.Runtime, logger: Any,
           written: reconcile.StatusWrites, shrink: bool) -> None:
    try:
        scaling.autoscale(key, runtime, logger)
        if shrink:
            reconcile.reconcile_fresh(key, runtime, logger, written)
    except kube.ApiProblem as exc:
        logger.warning(f"EnvPool {key[0]}/{key[1]}: {exc}; the next pass retries")


@kopf.on.event("ray.io", "v1", "rayclusters", labels={names.POOL_LABEL: kopf.PRESENT})
async def ray_cluster_event_fn(
    body: kopf.Body, type: str | None, memo: kopf.Memo, logger: Any, **_: Any,
) -> None:
    """KubeRay updated a RayCluster we own: refresh its EnvPool's status.

    If the RayCluster was deleted behind our back while its EnvPool lives on,
    put it back now rather than at the next resync. Async, on kopf's event loop: it
    keeps the RayCluster's slim copy and returns, and kopf lets go of the body at once;
    the refresh runs on the refresher's threads (:class:`reconcile.StatusRefresher`).
    """
    runtime = _runtime(memo)
    pool_name = body.metadata.labels.get(names.POOL_LABEL, "")
    key = (body.metadata.namespace or "", pool_name)
    # Rare (a RayCluster of ours held by KubeRay's Redis cleanup), and it makes API
    # calls: off kopf's event loop. True: it is going, nothing of it to report.
    if (type != "DELETED" and gcs_store.own_redis_cleanup_pending(body) is not None
            and await asyncio.to_thread(_release_redis_cleanup, dict(body), logger)):
        return
    runtime.remember_ray_cluster(key, None if type == "DELETED" else body)
    refresher: reconcile.StatusRefresher = memo.envpool_refresher
    refresher.submit(key, deleted=type == "DELETED", logger=logger)


def _release_after_pool(key: tuple[str, str], logger: Any) -> None:
    try:
        rc = kube.get_ray_cluster(*key)
    except kube.ApiProblem as exc:
        logger.warning(f"RayCluster {key[0]}/{key[1]}: reading it to lift KubeRay's "
                       f"Redis-cleanup finalizer failed: {exc}")
        return
    if rc is not None:
        _release_redis_cleanup(rc, logger)


def _release_redis_cleanup(ray_cluster: dict[str, Any], logger: Any) -> bool:
    try:
        return reconcile.release_redis_cleanup(ray_cluster, logger)
    except kube.ApiProblem as exc:
        logger.warning(f"RayCluster {ray_cluster['metadata'].get('namespace')}/"
                       f"{ray_cluster['metadata'].get('name')}: removing KubeRay's Redis-cleanup "
                       f"finalizer failed: {exc}; the next event retries")
        return False


@kopf.on.delete(G, V, P, optional=True)
def delete_fn(name: str, namespace: str | None, memo: kopf.Memo, logger: Any, **_: Any) -> None:
    # optional=True: no finalizer. The children go through the garbage
    # collector (ownerReferences), even if the operator is down.
    _runtime(memo).forget((namespace or "", name))
    _written(memo).forget((namespace or "", name))
    logger.info(f"EnvPool {namespace}/{name} deleted; its children are garbage-collected")


@kopf.on.probe(id="pools")
def pools_probe(memo: kopf.Memo, **_: Any) -> int:
    runtime = getattr(memo, "envpool", None)
    return runtime.pool_count() if runtime is not None else 0
