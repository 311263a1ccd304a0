"""How a pool server shows itself over HTTP (``/metrics``, ``/healthz``, ``/status``)
and the pool gauges it adds to Prometheus.

Kept apart from the supervision loop (:mod:`remote_env.pool.server`); everything
here reads a :class:`StatusSource` and never touches Ray.
"""

from __future__ import annotations

import http.server
import json
import logging
import threading
import weakref
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, exposition
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

log = logging.getLogger(__name__)


class StatusSource(Protocol):
    """What the HTTP server needs from a pool server."""

    registry: CollectorRegistry

    def status(self) -> dict[str, Any]: ...

    def healthy(self) -> bool: ...


# ------------------------------------------------------------------ metrics
class _PoolGauges(Collector):
    """``envpool_pool_{desired,leased}_envs`` and ``envpool_pool_leases``, at scrape time."""

    def __init__(self, labelnames: tuple[str, ...]) -> None:
        self._labelnames = labelnames
        self._sources: dict[tuple[str, ...], Callable[[], Mapping[str, float]]] = {}
        self._lock = threading.Lock()

    def add(self, labels: tuple[str, ...], fn: Callable[[], Mapping[str, float]]) -> None:
        with self._lock:
            self._sources[labels] = fn

    def remove(self, labels: tuple[str, ...]) -> None:
        with self._lock:
            self._sources.pop(labels, None)

    def collect(self) -> Iterator[GaugeMetricFamily]:
        ln = list(self._labelnames)
        desired = GaugeMetricFamily("envpool_pool_desired_envs",
                                    "Sub-envs the pool server is asked to keep.", labels=ln)
        leased = GaugeMetricFamily("envpool_pool_leased_envs",
                                   "Sub-envs leased by trainers.", labels=ln)
        leases = GaugeMetricFamily("envpool_pool_leases", "Trainer leases held.", labels=ln)
        with self._lock:
            sources = list(self._sources.items())
        for labels, fn in sources:
            v = fn()
            desired.add_metric(list(labels), v["desired"])
            leased.add_metric(list(labels), v["leased"])
            leases.add_metric(list(labels), v["leases"])
        yield desired
        yield leased
        yield leases


_gauges_by_registry: weakref.WeakKeyDictionary[CollectorRegistry, _PoolGauges] = (
    weakref.WeakKeyDictionary()
)
_gauges_lock = threading.Lock()


def pool_gauges(registry: CollectorRegistry, nlabels: int) -> _PoolGauges:
    with _gauges_lock:
        g = _gauges_by_registry.get(registry)
        if g is None:
            g = _PoolGauges(("pool",) if nlabels == 1 else ("namespace", "pool"))
            registry.register(g)
            _gauges_by_registry[registry] = g
        return g


# --------------------------------------------------------------------- HTTP
def serve_http(server: StatusSource, host: str, port: int) -> http.server.ThreadingHTTPServer:
    ref = weakref.ref(server)

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            pool = ref()
            path = self.path.split("?", 1)[0]
            if pool is None:
                self._send(503, "text/plain", b"pool server stopped\n")
            elif path == "/metrics":
                self._send(200, exposition.CONTENT_TYPE_LATEST,
                           exposition.generate_latest(pool.registry))
            elif path == "/healthz":
                ok = pool.healthy()
                self._send(200 if ok else 503, "text/plain", b"ok\n" if ok else b"not ticking\n")
            elif path == "/status":
                body = json.dumps({**pool.status(), "healthy": pool.healthy()}, indent=1)
                self._send(200, "application/json", body.encode())
            else:
                self._send(404, "text/plain", b"not found: try /status, /metrics, /healthz\n")

        def _send(self, code: int, ctype: str, body: bytes) -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            log.debug("http: " + format, *args)

    httpd = http.server.ThreadingHTTPServer((host, port), Handler)
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, name="pool-http", daemon=True).start()
    return httpd
