"""What the operator's handlers and background loops share while it runs.

:class:`Runtime` lives in kopf's ``memo`` (created at operator start-up): the
last seen EnvPools and RayClusters, one lock per pool, the autoscaler's recent
recommendations. :func:`every_pool` is the one periodic loop shape that the
resync (:mod:`~envpool_operator.reconcile`) and the autoscaler pass
(:mod:`~envpool_operator.scaling`) both run on.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from typing import Any

from envpool_operator import autoscaler, kube
from envpool_operator import metrics as metrics_mod
from envpool_operator import settings as settings_mod


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
