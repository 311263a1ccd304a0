"""How a pool server shows itself over HTTP (``/metrics``, ``/healthz``, ``/status``)
and the pool gauges it adds to Prometheus.

``/status`` is unauthenticated (Prometheus and the kubelet use the same port), so it
shows counts and states only: lease ids, trainer names (host:pid), actor and node ids
are in ``/status?detail=1``, which is answered to loopback clients only (``kubectl
port-forward`` and ``kubectl exec`` arrive there; other pods do not).

Kept apart from the supervision loop (:mod:`remote_env.pool.server`); everything
here reads a :class:`StatusSource` and never touches Ray.
"""

from __future__ import annotations

import http.server
import ipaddress
import json
import logging
import threading
import urllib.parse
import weakref
from collections.abc import Iterator, Mapping
from typing import Any, Final, Protocol

from prometheus_client import CollectorRegistry, exposition
from prometheus_client.core import GaugeMetricFamily

from remote_env import metrics

log = logging.getLogger(__name__)


class StatusSource(Protocol):
    """What the HTTP server needs from a pool server."""

    registry: CollectorRegistry

    def status(self) -> dict[str, Any]: ...

    def healthy(self) -> bool: ...


# ------------------------------------------------------------------ metrics
class _PoolGauges(metrics.SourcesCollector[Mapping[str, float]]):
    """``envpool_pool_{desired,leased,free,outdated}_envs`` and ``envpool_pool_leases``, at
    scrape time.

    Leased and free are gauges of their own rather than states of ``envpool_envs``:
    that family partitions envs by health (running, restarting, failed), and leased
    and free both are running envs.
    """

    def collect(self) -> Iterator[GaugeMetricFamily]:
        ln = list(self._labelnames)
        desired = GaugeMetricFamily("envpool_pool_desired_envs",
                                    "Sub-envs the pool server is asked to keep.", labels=ln)
        leased = GaugeMetricFamily("envpool_pool_leased_envs",
                                   "Sub-envs leased by trainers.", labels=ln)
        free = GaugeMetricFamily("envpool_pool_free_envs",
                                 "Ready sub-envs no trainer leases (the autoscaling buffer).",
                                 labels=ln)
        leases = GaugeMetricFamily("envpool_pool_leases", "Trainer leases held.", labels=ln)
        outdated = GaugeMetricFamily(
            "envpool_pool_outdated_envs",
            "Sub-envs in actors of an older spec revision, still to be rolled (leased ones "
            "when their lease ends).", labels=ln)
        for labels, fn in self.sources():
            v = fn()
            desired.add_metric(list(labels), v["desired"])
            leased.add_metric(list(labels), v["leased"])
            free.add_metric(list(labels), v["free"])
            leases.add_metric(list(labels), v["leases"])
            outdated.add_metric(list(labels), v.get("outdated", 0))
        yield desired
        yield leased
        yield free
        yield leases
        yield outdated


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
#: Fields of a ``/status`` slot that name who holds it or where it runs.
_PRIVATE_SLOT_FIELDS: Final = ("actorId", "nodeId", "leasedBy")


def public_status(status: Mapping[str, Any]) -> dict[str, Any]:
    """``/status`` for anyone who can reach the port: no lease ids, trainers, actor ids."""
    out = {k: v for k, v in status.items() if k not in ("leases", "reclaimedLeases")}
    out["leaseCount"] = len(status.get("leases") or ())
    out["slots"] = [
        {**{k: v for k, v in slot.items() if k not in _PRIVATE_SLOT_FIELDS},
         "leased": slot.get("leasedBy") is not None}
        for slot in status.get("slots") or ()
    ]
    return out


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host.split("%", 1)[0]).is_loopback
    except ValueError:
        return False


def status_response(status: Mapping[str, Any], query: str, client_host: str,
                    ) -> tuple[int, dict[str, Any]]:
    """What ``GET /status?<query>`` answers ``client_host``: (HTTP code, document)."""
    params = urllib.parse.parse_qs(query)
    detail = params.get("detail", ["0"])[-1].lower() in ("1", "true", "yes")
    if not detail:
        return 200, public_status(status)
    if not _is_loopback(client_host):
        return 403, {"error": "/status?detail=1 is answered to loopback clients only (lease "
                              "ids, trainers, actor ids): use kubectl port-forward or exec"}
    return 200, dict(status)


def serve_http(server: StatusSource, host: str, port: int) -> http.server.ThreadingHTTPServer:
    ref = weakref.ref(server)

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            pool = ref()
            path, _, query = self.path.partition("?")
            if pool is None:
                self._send(503, "text/plain", b"pool server stopped\n")
            elif path == "/metrics":
                self._send(200, exposition.CONTENT_TYPE_LATEST,
                           exposition.generate_latest(pool.registry))
            elif path == "/healthz":
                ok = pool.healthy()
                self._send(200 if ok else 503, "text/plain", b"ok\n" if ok else b"not ticking\n")
            elif path == "/status":
                code, doc = status_response({**pool.status(), "healthy": pool.healthy()},
                                            query, self.client_address[0])
                self._send(code, "application/json", json.dumps(doc, indent=1).encode())
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
