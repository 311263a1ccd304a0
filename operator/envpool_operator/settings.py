"""Operator settings, read from environment variables (the Helm chart sets them).

``ENVPOOL_IMAGE`` is the one image setting shared with the chart: the operator
and the pool servers it starts run the same image (Ray base plus this package).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import Any

from remote_env import spec as spec_mod

DEFAULT_IMAGE = "ghcr.io/envpool-dev/envpool:0.1.0"
#: The pools' own Redis (``spec.headFaultTolerance``): any image with ``redis-server``
#: on the PATH that runs as a non-root uid.
DEFAULT_REDIS_IMAGE = "docker.io/library/redis:7.4"


@dataclasses.dataclass(frozen=True)
class Settings:
    #: Image for the Ray head, the workers and the pool-server sidecar when an
    #: EnvPool leaves ``spec.ray.image`` empty.
    image: str = DEFAULT_IMAGE
    #: Namespaces to watch; empty means all namespaces.
    namespaces: tuple[str, ...] = ()
    #: Port of the operator's own /metrics.
    metrics_port: int = 8000
    #: Address of the operator's /metrics; empty: 0.0.0.0 in a pod, else loopback.
    metrics_addr: str = ""
    #: Seconds between level-triggered resyncs of every EnvPool. Events drive the
    #: normal path; this only repairs drift and missed events. A pool whose children
    #: render as last applied and whose RayCluster (from the watch) is as applied
    #: costs no API call; the others are read and re-applied (2 GETs, 6 applies).
    resync_seconds: float = 300.0
    #: Every this many resyncs a pool's children are re-applied even when nothing
    #: seems changed: the operator may not read its ConfigMap, RBAC objects and
    #: NetworkPolicy (create/patch only), so a hand edit of one of them is only
    #: seen by applying it again. 1: every resync applies (the old behaviour).
    resync_full_every: int = 12
    #: Longest delay between retries of a reconcile that hit a transient
    #: problem (KubeRay missing, quota, RBAC); delays double up to this.
    max_retry_seconds: float = 120.0
    #: Most worker pods a single EnvPool may ask for (a quota the CRD cannot know).
    max_workers_per_pool: int = 1000
    #: Seconds between autoscaler passes over the autoscaled pools. A lease report
    #: re-evaluates its pool at once (scale-ups are event-driven); the passes let
    #: scale-down delays run out when no report arrives.
    autoscale_seconds: float = 5.0
    #: Threads that run the handlers; each blocks on API calls. A burst of new
    #: EnvPools (and the status refreshes of their RayClusters) waits for these: 8
    #: bound 1,000 pools to ~3 reconciles/s against a slow API server (issue 34).
    handler_threads: int = 32
    #: imagePullPolicy for pods the operator creates.
    image_pull_policy: str = "IfNotPresent"
    #: Image of the Redis the operator runs for each fault-tolerant pool.
    redis_image: str = DEFAULT_REDIS_IMAGE

    @property
    def limits(self) -> spec_mod.Limits:
        return spec_mod.Limits(max_workers=self.max_workers_per_pool)


def _int(env: Mapping[str, str], key: str, default: int) -> int:
    raw = env.get(key, "").strip()
    if not raw:
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{key} must be an integer, got {raw!r}") from None


def _positive(env: Mapping[str, str], key: str, default: int) -> int:
    value = _int(env, key, default)
    if value < 1:
        raise ValueError(f"{key} must be >= 1, got {value}")
    return value


def _seconds(env: Mapping[str, str], key: str, default: float) -> float:
    raw = env.get(key, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{key} must be a number of seconds, got {raw!r}") from None
    if not value > 0:
        raise ValueError(f"{key} must be > 0, got {raw!r}")
    return value


def from_env(env: Mapping[str, str] | None = None) -> Settings:
    """Settings from ``env`` (default ``os.environ``); raises ValueError on bad values."""
    env = os.environ if env is None else env
    namespaces = tuple(
        ns.strip() for ns in env.get("ENVPOOL_WATCH_NAMESPACES", "").split(",") if ns.strip()
    )
    resync = _seconds(env, "ENVPOOL_RESYNC_SECONDS", Settings.resync_seconds)
    return Settings(
        image=env.get("ENVPOOL_IMAGE", "").strip() or DEFAULT_IMAGE,
        namespaces=namespaces,
        metrics_port=_int(env, "ENVPOOL_OPERATOR_METRICS_PORT", Settings.metrics_port),
        metrics_addr=env.get("ENVPOOL_OPERATOR_METRICS_ADDR", "").strip(),
        resync_seconds=resync,
        resync_full_every=_positive(env, "ENVPOOL_RESYNC_FULL_EVERY", Settings.resync_full_every),
        max_retry_seconds=_seconds(
            env, "ENVPOOL_MAX_RETRY_SECONDS", Settings.max_retry_seconds),
        max_workers_per_pool=_int(
            env, "ENVPOOL_MAX_WORKERS_PER_POOL", Settings.max_workers_per_pool),
        autoscale_seconds=_seconds(env, "ENVPOOL_AUTOSCALE_SECONDS", Settings.autoscale_seconds),
        image_pull_policy=env.get("ENVPOOL_IMAGE_PULL_POLICY", "").strip() or "IfNotPresent",
        handler_threads=_positive(env, "ENVPOOL_OPERATOR_THREADS", Settings.handler_threads),
        redis_image=env.get("ENVPOOL_REDIS_IMAGE", "").strip() or DEFAULT_REDIS_IMAGE,
    )


def parse_pool(body: Mapping[str, Any], settings: Settings) -> spec_mod.PoolSpec:
    """An EnvPool body's spec under the operator's limits; raises ``spec_mod.SpecError``.

    The reconcile, the autoscaler pass and the handlers all read EnvPool bodies
    through this, so a spec the reconcile rejects is one the autoscaler skips::

        >>> body = {"metadata": {"name": "cp", "namespace": "ns"},
        ...         "spec": {"env": {"id": "CartPole-v1"}, "replicas": 4}}
        >>> parse_pool(body, Settings()).replicas
        4
    """
    meta = body.get("metadata") or {}
    return spec_mod.parse_spec(
        body.get("spec") or {}, name=meta.get("name", ""),
        namespace=meta.get("namespace", "default"), limits=settings.limits,
    )
