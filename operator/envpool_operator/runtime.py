"""What the operator's handlers and background loops share while it runs.

:class:`Runtime` lives in kopf's ``memo`` (created at operator start-up): the
last seen EnvPools and RayClusters, one lock per pool, the autoscaler's recent
recommendations. :func:`every_pool` is the one periodic loop shape that the
resync (:mod:`~envpool_operator.reconcile`) and the autoscaler pass
(:mod:`~envpool_operator.scaling`) both run on.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import threading
import zlib
from collections.abc import Callable, Mapping
from typing import Any, Final

from envpool_operator import autoscaler, kube
from envpool_operator import metrics as metrics_mod
from envpool_operator import settings as settings_mod
from envpool_operator import status as status_mod

#: (namespace, EnvPool name)
Key = tuple[str, str]


@dataclasses.dataclass(frozen=True)
class Applied:
    """What a pool's last successful apply wrote, as a resync can tell it again without
    an API call: the digest of the rendered children (:func:`reconcile.children_digest`),
    the EnvPool's generation, and the RayCluster's uid and generation (a hand edit of its
    spec or a re-creation changes one of them; KubeRay's status writes change neither)."""

    digest: str
    pool_generation: int | None
    ray_cluster_uid: str
    ray_cluster_generation: int | None


class Runtime:
    """What handlers share, kept in kopf's ``memo`` (created at operator start-up).

    The caches change only through its methods, each under its one lock: the last
    seen EnvPools and RayClusters by (namespace, EnvPool name), a lock per EnvPool
    and the autoscaler's stabilizers. Bodies go in and come out as copies, so no
    caller holds a dict another thread changes.
    """

    def __init__(self, settings: settings_mod.Settings,
                 metrics: metrics_mod.OperatorMetrics) -> None:
        self.settings = settings
        self.metrics = metrics
        self._lock = threading.Lock()
        #: Last seen EnvPools, so a RayCluster event needs no GET.
        self._pools: dict[Key, dict[str, Any]] = {}
        #: Last seen RayClusters, fed by their watch (and by each apply).
        self._ray_clusters: dict[Key, dict[str, Any]] = {}
        #: The watch's last delivery to each cache entry, numbered in order: an answer
        #: the operator got back from its own GET or apply is kept only when no event
        #: came after the request went out (:meth:`pool_mark`, :meth:`ray_cluster_mark`).
        #: Otherwise a reconcile slower than KubeRay put its apply's older RayCluster
        #: over the watch's newer one, and the pool stayed "Updating" until a resync.
        self._seq = itertools.count(1)
        self._pool_seen: dict[Key, int] = {}
        self._rc_seen: dict[Key, int] = {}
        #: One lock per EnvPool: kopf's handlers, the RayCluster watch and the
        #: resync loop never apply the same pool's children at the same time (an
        #: older body applied after a newer one would roll the spec back).
        self._pool_locks: dict[Key, threading.RLock] = {}
        #: Recent autoscaler recommendations of each autoscaled EnvPool (in memory: an
        #: operator restart starts a fresh scale-down window, which only delays shrinking).
        self._stabilizers: dict[Key, autoscaler.Stabilizer] = {}
        #: Each pool's last successful apply, and how many resyncs may still skip
        #: writing it again before one re-applies everything (:meth:`skip_resync`).
        self._applied: dict[Key, tuple[Applied, int]] = {}

    def pool_lock(self, key: Key) -> threading.RLock:
        with self._lock:
            return self._pool_locks.setdefault(key, threading.RLock())

    # ------------------------------------------------------------- EnvPools
    def remember_pool(self, key: Key, body: Mapping[str, Any]) -> None:
        """The EnvPool as its watch delivered it, without what only kopf reads
        (:func:`cached_pool`)."""
        kept = cached_pool(body)
        with self._lock:
            self._pools[key] = kept
            self._pool_seen[key] = next(self._seq)

    def pool_mark(self, key: Key) -> int | None:
        """Where the watch of EnvPool ``key`` stands: take it before a GET, hand it to
        :meth:`remember_pool_read` with the answer."""
        with self._lock:
            return self._pool_seen.get(key)

    def remember_pool_read(self, key: Key, body: Mapping[str, Any], mark: int | None) -> bool:
        """The EnvPool as read, unless the watch delivered it since ``mark`` (that copy
        may be newer than the answer). Whether it was kept."""
        kept = cached_pool(body)
        with self._lock:
            if self._pool_seen.get(key) != mark:
                return False
            self._pools[key] = kept
            return True

    def pool_body(self, key: Key) -> dict[str, Any] | None:
        """A copy of the EnvPool as last seen; None when unknown."""
        with self._lock:
            body = self._pools.get(key)
            return None if body is None else copy.deepcopy(body)

    def knows_pool(self, key: Key) -> bool:
        with self._lock:
            return key in self._pools

    def pool_keys(self) -> list[Key]:
        with self._lock:
            return sorted(self._pools)

    def pool_count(self) -> int:
        with self._lock:
            return len(self._pools)

    def scaled(self, key: Key, replicas: int) -> None:
        """The scale subresource was written: the cached body says so until the watch
        brings the new body."""
        with self._lock:
            cached = self._pools.get(key)
            if cached is not None:
                cached.setdefault("spec", {})["replicas"] = replicas

    def phases(self) -> list[tuple[str, str, str | None]]:
        """(namespace, name, status.phase) of every known EnvPool, for the metrics."""
        with self._lock:
            return [(ns, name, (body.get("status") or {}).get("phase"))
                    for (ns, name), body in self._pools.items()]

    def heads(self) -> list[tuple[str, str, bool, str]]:
        """(namespace, name, head available, reason) of every known EnvPool with a
        HeadAvailable condition, for the metrics."""
        out = []
        with self._lock:
            for (ns, name), body in self._pools.items():
                cond = next((c for c in (body.get("status") or {}).get("conditions") or ()
                             if isinstance(c, Mapping)
                             and c.get("type") == status_mod.COND_HEAD_AVAILABLE), None)
                if cond is not None:
                    out.append((ns, name, cond.get("status") == "True",
                                str(cond.get("reason") or "")))
        return out

    def forget(self, key: Key) -> None:
        with self._lock:
            self._pools.pop(key, None)
            self._ray_clusters.pop(key, None)
            self._pool_seen.pop(key, None)
            self._rc_seen.pop(key, None)
            self._pool_locks.pop(key, None)
            self._stabilizers.pop(key, None)
            self._applied.pop(key, None)

    # ------------------------------------------------------- applied children
    def remember_applied(self, key: Key, applied: Applied) -> None:
        """Every child of EnvPool ``key`` was just applied as ``applied`` says.

        The next full re-apply by the resync comes ``resync_full_every`` passes later;
        a pool's first one is staggered by its name, so that the pools of a burst do
        not all re-apply in the same pass.
        """
        every = self.settings.resync_full_every
        with self._lock:
            if key in self._applied:
                left = every - 1
            else:
                left = zlib.crc32(f"{key[0]}/{key[1]}".encode()) % every
            self._applied[key] = (applied, left)

    def skip_resync(self, key: Key, seen: Applied) -> bool:
        """Whether a resync may leave EnvPool ``key``'s children alone: they render and
        stand as last applied (``seen``) and no full re-apply is due (counted down)."""
        with self._lock:
            last = self._applied.get(key)
            if last is None or last[0] != seen or last[1] <= 0:
                return False
            self._applied[key] = (last[0], last[1] - 1)
            return True

    # ---------------------------------------------------------- RayClusters
    def remember_ray_cluster(self, key: Key, ray_cluster: Mapping[str, Any] | None) -> bool:
        """EnvPool ``key``'s RayCluster as its watch delivered it (None: deleted); True
        when the EnvPool itself is known."""
        kept = None if ray_cluster is None else cached_ray_cluster(ray_cluster)
        with self._lock:
            self._rc_seen[key] = next(self._seq)
            self._keep_ray_cluster(key, kept)
            return key in self._pools

    def ray_cluster_mark(self, key: Key) -> int | None:
        """Where the watch of EnvPool ``key``'s RayCluster stands: take it before an
        apply, hand it to :meth:`remember_ray_cluster_read` with the answer."""
        with self._lock:
            return self._rc_seen.get(key)

    def remember_ray_cluster_read(self, key: Key, ray_cluster: Mapping[str, Any] | None,
                                  mark: int | None) -> bool:
        """The RayCluster as an apply or GET answered, unless the watch delivered it since
        ``mark`` (KubeRay may have written its status after the answer). Whether kept."""
        kept = None if ray_cluster is None else cached_ray_cluster(ray_cluster)
        with self._lock:
            if self._rc_seen.get(key) != mark:
                return False
            self._keep_ray_cluster(key, kept)
            return True

    def _keep_ray_cluster(self, key: Key, kept: dict[str, Any] | None) -> None:
        if kept is None:
            self._ray_clusters.pop(key, None)
        else:
            self._ray_clusters[key] = kept

    def ray_cluster(self, key: Key) -> dict[str, Any] | None:
        """EnvPool ``key``'s RayCluster as last seen (read-only: it is replaced, never
        changed in place); None when unknown."""
        with self._lock:
            return self._ray_clusters.get(key)

    # ----------------------------------------------------------- autoscaler
    def stabilizer(self, key: Key) -> autoscaler.Stabilizer:
        """EnvPool ``key``'s autoscaler window (a new one on first use)."""
        with self._lock:
            return self._stabilizers.setdefault(key, autoscaler.Stabilizer())

    def drop_stabilizer(self, key: Key) -> None:
        """EnvPool ``key`` is no longer autoscaled: its window goes."""
        with self._lock:
            self._stabilizers.pop(key, None)


#: Kept of a RayCluster's metadata between events (what the status and the ownership
#: checks read).
_RC_META: Final = ("name", "namespace", "uid", "generation", "annotations", "labels",
                   "deletionTimestamp", "ownerReferences", "resourceVersion")


def cached_ray_cluster(rc: Mapping[str, Any]) -> dict[str, Any]:
    """The part of a RayCluster the operator keeps between events (a deep copy).

    The status, the metadata above and the worker groups' sizes: what
    :func:`compute` and :func:`workers_for` read. The pod templates and
    managedFields, most of the object, are left out: with a thousand pools the
    full objects were most of the operator's memory.

        >>> rc = {"metadata": {"name": "cp", "generation": 2, "managedFields": [{}]},
        ...       "spec": {"headGroupSpec": {"template": {}}, "workerGroupSpecs": [
        ...           {"groupName": "envs", "replicas": 3, "template": {}}]},
        ...       "status": {"state": "ready"}}
        >>> cached_ray_cluster(rc)
        {'metadata': {'name': 'cp', 'generation': 2}, 'spec': {'workerGroupSpecs': [{'groupName': 'envs', 'replicas': 3}]}, 'status': {'state': 'ready'}}
    """
    meta = rc.get("metadata") or {}
    groups = [{k: g[k] for k in ("groupName", "replicas", "scaleStrategy") if k in g}
              for g in (rc.get("spec") or {}).get("workerGroupSpecs") or ()]
    return copy.deepcopy({
        "metadata": {k: meta[k] for k in _RC_META if k in meta},
        "spec": {"workerGroupSpecs": groups},
        "status": rc.get("status") or {},
    })


def cached_pool(body: Mapping[str, Any]) -> dict[str, Any]:
    """An EnvPool as the operator keeps it between events: a deep copy without
    ``managedFields`` and kopf's copy of the last handled spec (an annotation only
    kopf reads, from the body it is handed).

        >>> cached_pool({"metadata": {"name": "cp", "managedFields": [{}], "annotations": {
        ...     "envpool.dev/last-handled-configuration": "{}", "team": "a"}}, "spec": {}})
        {'metadata': {'name': 'cp', 'annotations': {'team': 'a'}}, 'spec': {}}
    """
    out = {k: v for k, v in body.items() if k != "metadata"}
    meta = {k: v for k, v in (body.get("metadata") or {}).items() if k != "managedFields"}
    if "annotations" in meta:
        meta["annotations"] = {k: v for k, v in meta["annotations"].items()
                               if k != _KOPF_LAST_HANDLED}
    return copy.deepcopy({"metadata": meta, **out})


#: kopf's diffbase annotation (handlers.configure sets its prefix and key).
_KOPF_LAST_HANDLED: Final = "envpool.dev/last-handled-configuration"


def every_pool(runtime: Runtime, stop: threading.Event, period: float,
               fn: Callable[[Key, Runtime, Any], object], what: str,
               logger: Any) -> None:
    """Every ``period`` seconds, ``fn(key, runtime, logger)`` for every known EnvPool.

    One loop for the whole operator rather than a kopf timer per object:
    kopf timers put a finalizer on every EnvPool, and a finalizer would block
    deleting pools while the operator is down. A pool's failure is logged and
    the loop goes on to the next.
    """
    while not stop.wait(period):
        for key in runtime.pool_keys():
            if stop.is_set():
                return
            try:
                fn(key, runtime, logger)
            except kube.ApiProblem as exc:
                logger.warning(f"{what} of EnvPool {key[0]}/{key[1]}: {exc}")
            except Exception:
                logger.exception(f"{what} of EnvPool {key[0]}/{key[1]} failed")
