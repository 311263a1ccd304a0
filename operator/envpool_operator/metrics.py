"""Operator metrics on a registry the operator creates (nothing global at import).

    >>> from prometheus_client import CollectorRegistry
    >>> m = OperatorMetrics(CollectorRegistry())
    >>> m.reconciles.labels(result="success").inc()
    >>> m.registry.get_sample_value("envpool_operator_reconciles_total", {"result": "success"})
    1.0
    >>> m.track_pools(lambda: [("team-a", "cartpole", "Ready")])
    >>> m.registry.get_sample_value(
    ...     "envpool_pool_phase", {"namespace": "team-a", "pool": "cartpole", "phase": "Ready"})
    1.0
    >>> m.track_heads(lambda: [("team-a", "cartpole", False, "HeadRecovering")])
    >>> m.registry.get_sample_value("envpool_pool_head_available",
    ...     {"namespace": "team-a", "pool": "cartpole", "reason": "HeadRecovering"})
    0.0
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Final
from wsgiref.simple_server import WSGIServer

import prometheus_client
from prometheus_client import core, registry

from envpool_operator import status as status_mod

RESULTS: Final = ("success", "retry", "invalid", "error")

#: (namespace, pool, phase or None) for every EnvPool the operator knows.
PoolPhases = Callable[[], Iterable[tuple[str, str, "str | None"]]]
#: (namespace, pool, available, reason) of every EnvPool with a HeadAvailable condition.
PoolHeads = Callable[[], Iterable[tuple[str, str, bool, str]]]


class _PhaseCollector(registry.Collector):
    """``envpool_pool_phase{namespace,pool,phase}``: 1 for a pool's phase, 0 for the others.

    Derived at scrape time from what the operator knows, so a deleted pool's
    series disappear with it.
    """

    def __init__(self) -> None:
        self.pools: PoolPhases | None = None

    def collect(self) -> Iterator[core.Metric]:
        family = core.GaugeMetricFamily(
            "envpool_pool_phase", "EnvPool phase (1 for the current phase, 0 for the others).",
            labels=["namespace", "pool", "phase"])
        for namespace, pool, current in (self.pools() if self.pools else ()):
            for phase in status_mod.PHASES:
                family.add_metric([namespace, pool, phase], 1.0 if phase == current else 0.0)
        yield family

    def describe(self) -> Iterator[core.Metric]:
        # No samples needed to describe; avoids calling pools() at registration.
        yield core.GaugeMetricFamily(
            "envpool_pool_phase", "EnvPool phase (1 for the current phase, 0 for the others).",
            labels=["namespace", "pool", "phase"])


_HEAD_HELP: Final = ("EnvPool head pod available (1) or not (0), by the HeadAvailable "
                     "condition's reason (HeadRecovering: an outage with GCS fault "
                     "tolerance; HeadLost: without it).")


class _HeadCollector(registry.Collector):
    """``envpool_pool_head_available{namespace,pool,reason}`` from each pool's HeadAvailable
    condition at scrape time: the head's outages on the dashboard, told apart by what
    they cost (a pool without the condition yet has no series)."""

    def __init__(self) -> None:
        self.pools: PoolHeads | None = None

    def collect(self) -> Iterator[core.Metric]:
        family = core.GaugeMetricFamily("envpool_pool_head_available", _HEAD_HELP,
                                        labels=["namespace", "pool", "reason"])
        for namespace, pool, available, reason in (self.pools() if self.pools else ()):
            family.add_metric([namespace, pool, reason], 1.0 if available else 0.0)
        yield family

    def describe(self) -> Iterator[core.Metric]:
        yield core.GaugeMetricFamily("envpool_pool_head_available", _HEAD_HELP,
                                     labels=["namespace", "pool", "reason"])


class OperatorMetrics:
    def __init__(self, registry: prometheus_client.CollectorRegistry) -> None:
        self.registry = registry
        self.reconciles = prometheus_client.Counter(
            "envpool_operator_reconciles",
            "EnvPool reconciles by result (success, retry, invalid spec, error).",
            ["result"], registry=registry,
        )
        for result in RESULTS:
            self.reconciles.labels(result=result)
        self.reconcile_duration = prometheus_client.Histogram(
            "envpool_operator_reconcile_duration_seconds",
            "Time spent in one EnvPool reconcile (API calls included).",
            registry=registry,
            # 0.75 and 1.5 around the 1 s target, so a p99 read from the buckets
            # (histogram_quantile) is not a guess between 0.5 and 2.5.
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1, 1.5, 2.5, 5, 10, 30),
        )
        self.status_updates = prometheus_client.Counter(
            "envpool_operator_status_updates",
            "EnvPool status patches written by the operator.",
            registry=registry,
        )
        self.api_requests = prometheus_client.Counter(
            "envpool_operator_api_requests",
            "Kubernetes API requests of the operator's own client (reconcile, resync, "
            "status refresh, autoscaler; not kopf's watches and handler patches), by verb "
            "(get, apply, apply_dry_run, patch), resource and HTTP status code.",
            ["verb", "resource", "code"], registry=registry,
        )
        self.resyncs = prometheus_client.Counter(
            "envpool_operator_resyncs",
            "EnvPools reconciled by the periodic resync (one per pool per pass).",
            registry=registry,
        )
        self.resyncs_unchanged = prometheus_client.Counter(
            "envpool_operator_resyncs_unchanged",
            "Resyncs that found the pool's children as last applied (from the watch) and "
            "made no API call for them.",
            registry=registry,
        )
        self.scale_writes = prometheus_client.Counter(
            "envpool_operator_autoscale_writes",
            "spec.replicas written by the autoscaler through the scale subresource.",
            ["direction"], registry=registry,
        )
        for direction in ("up", "down"):
            self.scale_writes.labels(direction=direction)
        self._phases = _PhaseCollector()
        registry.register(self._phases)
        self._heads = _HeadCollector()
        registry.register(self._heads)

    def track_pools(self, pools: PoolPhases) -> None:
        """Export ``envpool_pool_phase`` for the pools ``pools()`` returns at each scrape."""
        self._phases.pools = pools

    def track_heads(self, pools: PoolHeads) -> None:
        """Export ``envpool_pool_head_available`` for the pools ``pools()`` returns."""
        self._heads.pools = pools


def serve(
    registry: prometheus_client.CollectorRegistry, port: int, addr: str = "127.0.0.1",
) -> tuple[WSGIServer, threading.Thread]:
    """Serve ``/metrics`` for ``registry`` in a daemon thread."""
    server, thread = prometheus_client.start_http_server(port, addr=addr, registry=registry)
    return server, thread
