"""Prometheus metrics for remote vector envs.

Everything goes to an injected ``CollectorRegistry``; nothing is registered on the
global registry at import time. Several pools may share one registry: the metric
families are created once per registry and each pool is a ``pool`` label value.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Generic, TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

FAILURE_REASONS = ("exception", "actor_died", "timeout")
ENV_STATES = ("running", "restarting", "failed")
#: how a lease request over the pool's HTTP API ended (envpool_lease_attach_seconds)
ATTACH_OUTCOMES = ("granted", "waited", "exhausted")
#: how a relay request through the pool server ended (envpool_relay_connections):
#: spliced to the actor, refused (token, lease, actor), turned away at the cap, or the
#: actor's data address did not accept from the head
RELAY_OUTCOMES = ("relayed", "refused", "full", "unreachable")
#: which way relayed bytes went (envpool_relay_bytes)
RELAY_DIRECTIONS = ("to_actor", "to_trainer")
_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
_ATTACH_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
                   300.0)
_WAIT_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0)

StateFn = Callable[[], Mapping[str, int]]
_V = TypeVar("_V")


class SourcesCollector(Collector, Generic[_V]):
    """A collector whose series are computed at scrape time from one callback per
    label set (a pool), added and removed as pools come and go."""

    def __init__(self, labelnames: tuple[str, ...]) -> None:
        self._labelnames = labelnames
        self._sources: dict[tuple[str, ...], Callable[[], _V]] = {}
        self._lock = threading.Lock()

    def add(self, labels: tuple[str, ...], fn: Callable[[], _V]) -> None:
        with self._lock:
            self._sources[labels] = fn

    def remove(self, labels: tuple[str, ...]) -> None:
        with self._lock:
            self._sources.pop(labels, None)

    def sources(self) -> list[tuple[tuple[str, ...], Callable[[], _V]]]:
        """A snapshot: callbacks run outside the lock."""
        with self._lock:
            return list(self._sources.items())


class _EnvStateCollector(SourcesCollector[Mapping[str, int]]):
    """``envpool_envs{state}`` computed at scrape time from each pool's callback."""

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            "envpool_envs", "Sub-environments by state.", labels=[*self._labelnames, "state"]
        )
        for labels, fn in self.sources():
            counts = fn()
            for state in ENV_STATES:
                family.add_metric([*labels, state], counts.get(state, 0))
        yield family


class _Families:
    def __init__(self, registry: CollectorRegistry, labelnames: tuple[str, ...]) -> None:
        ln = list(labelnames)
        self.labelnames = labelnames
        self.polls = Counter(
            "envpool_polls", "Polls (step_wait/recv calls) that returned results.", ln,
            registry=registry,
        )
        self.batch = Histogram(
            "envpool_poll_batch_size", "Sub-envs returned per poll.", ln,
            buckets=_BATCH_BUCKETS, registry=registry,
        )
        self.wait = Histogram(
            "envpool_poll_wait_seconds", "Time a poll waited for results.", ln,
            buckets=_WAIT_BUCKETS, registry=registry,
        )
        self.steps = Counter(
            "envpool_env_steps", "Sub-env steps returned.", ln, registry=registry
        )
        self.failures = Counter(
            "envpool_env_failures", "Sub-env failures by reason.", [*ln, "reason"],
            registry=registry,
        )
        self.env_restarts = Counter(
            "envpool_env_restarts", "Sub-envs re-created after a failure.", ln, registry=registry
        )
        self.actor_restarts = Counter(
            "envpool_actor_restarts", "Env actors re-created after dying or hanging.", ln,
            registry=registry,
        )
        self.leases_reclaimed = Counter(
            "envpool_leases_reclaimed", "Leases released early because their holder died.",
            ln, registry=registry,
        )
        self.attach = Histogram(
            "envpool_lease_attach_seconds",
            "Time the pool's lease API took to answer a lease request, by outcome: "
            "granted at once, granted after waiting (wait_s), or exhausted (refused).",
            [*ln, "outcome"], buckets=_ATTACH_BUCKETS, registry=registry,
        )
        self.relay_connections = Counter(
            "envpool_relay_connections",
            "Relay requests through the pool server (trainers that cannot reach pod "
            "addresses), by outcome.", [*ln, "outcome"], registry=registry,
        )
        self.relay_open = Gauge(
            "envpool_relay_open_connections", "Relayed connections open now.", ln,
            registry=registry,
        )
        self.relay_bytes = Counter(
            "envpool_relay_bytes", "Bytes the pool server relayed, by direction.",
            [*ln, "direction"], registry=registry,
        )
        self.states = _EnvStateCollector(labelnames)
        registry.register(self.states)


_by_registry: weakref.WeakKeyDictionary[CollectorRegistry, _Families] = (
    weakref.WeakKeyDictionary()
)
_lock = threading.Lock()


def _families(registry: CollectorRegistry, labelnames: tuple[str, ...]) -> _Families:
    with _lock:
        fam = _by_registry.get(registry)
        if fam is None:
            fam = _Families(registry, labelnames)
            _by_registry[registry] = fam
        elif fam.labelnames != labelnames:
            raise ValueError(
                f"this registry already holds envpool metrics labelled {fam.labelnames}; "
                f"got {labelnames}: use one labelling per registry"
            )
        return fam


class PoolMetrics:
    """The series of one pool. Create labelled series up front so they scrape as 0.

    Args:
        registry: where to register; a private registry when None.
        pool: value of the ``pool`` label.
        namespace: value of the ``namespace`` label (in-cluster); None leaves it out.
    """

    def __init__(
        self,
        registry: CollectorRegistry | None = None,
        pool: str = "default",
        namespace: str | None = None,
    ) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        names = ("pool",) if namespace is None else ("namespace", "pool")
        self._labels = (pool,) if namespace is None else (namespace, pool)
        self._f = _families(self.registry, names)
        lv = self._labels
        self.polls = self._f.polls.labels(*lv)
        self.batch_size = self._f.batch.labels(*lv)
        self.wait = self._f.wait.labels(*lv)
        self.steps = self._f.steps.labels(*lv)
        self.failures = {r: self._f.failures.labels(*lv, r) for r in FAILURE_REASONS}
        self.env_restarts = self._f.env_restarts.labels(*lv)
        self.actor_restarts = self._f.actor_restarts.labels(*lv)
        self.leases_reclaimed = self._f.leases_reclaimed.labels(*lv)
        #: outcome -> the lease API's attach latency (seconds)
        self.attach = {o: self._f.attach.labels(*lv, o) for o in ATTACH_OUTCOMES}
        #: the relay's (remote_env.pool.relay): outcome -> requests, open now, direction -> bytes
        self.relay_connections = {o: self._f.relay_connections.labels(*lv, o)
                                  for o in RELAY_OUTCOMES}
        self.relay_open = self._f.relay_open.labels(*lv)
        self.relay_bytes = {d: self._f.relay_bytes.labels(*lv, d) for d in RELAY_DIRECTIONS}

    def track_states(self, fn: StateFn) -> None:
        self._f.states.add(self._labels, fn)

    def untrack_states(self) -> None:
        self._f.states.remove(self._labels)

    def observe_poll(self, batch: int, wait_s: float) -> None:
        self.polls.inc()
        self.batch_size.observe(batch)
        self.wait.observe(wait_s)

    def totals(self) -> dict[str, float]:
        """Current counter values of this pool (for progress lines and status)."""
        names = dict(zip(self._f.labelnames, self._labels, strict=True))

        def get(name: str, **extra: str) -> float:
            return self.registry.get_sample_value(name, {**names, **extra}) or 0.0

        return {
            "polls": get("envpool_polls_total"),
            "steps": get("envpool_env_steps_total"),
            "failures": sum(get("envpool_env_failures_total", reason=r) for r in FAILURE_REASONS),
            "env_restarts": get("envpool_env_restarts_total"),
            "actor_restarts": get("envpool_actor_restarts_total"),
        }

    def remove(self) -> None:
        """Drop this pool's series (when the pool goes away)."""
        lv = self._labels
        self.untrack_states()
        for fam in (self._f.polls, self._f.batch, self._f.wait, self._f.steps,
                    self._f.env_restarts, self._f.actor_restarts, self._f.leases_reclaimed,
                    self._f.relay_open):
            fam.remove(*lv)
        for r in FAILURE_REASONS:
            self._f.failures.remove(*lv, r)
        for o in ATTACH_OUTCOMES:
            self._f.attach.remove(*lv, o)
        for o in RELAY_OUTCOMES:
            self._f.relay_connections.remove(*lv, o)
        for d in RELAY_DIRECTIONS:
            self._f.relay_bytes.remove(*lv, d)


def serve_metrics(registry: CollectorRegistry, port: int, addr: str = "127.0.0.1") -> Any:
    """Serve ``/metrics`` for ``registry`` on a daemon thread; returns the server.

    Binds to loopback unless told otherwise: nothing is exposed by default.
    ``port=0`` picks a free port (``server.server_port``).
    """
    server, _thread = start_http_server(port, addr=addr, registry=registry)
    return server
