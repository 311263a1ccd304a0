"""The EnvPool ``status.pool`` report of an in-cluster pool server.

It patches only its own EnvPool's status (its Role allows no more), on a worker
thread so a slow API server never stalls supervision.
"""

from __future__ import annotations

import concurrent.futures
import logging
import os
import time
from collections.abc import Mapping
from typing import Any

from remote_env import kubeconfig
from remote_env import spec as spec_mod
from remote_env.spec import pool_report as report_mod

log = logging.getLogger(__name__)


class KubeStatusReporter:
    """Patches ``status.pool`` of one EnvPool; nothing else (its Role allows no more).

    Called every tick with :meth:`PoolReport.to_document
    <remote_env.spec.pool_report.PoolReport.to_document>`; patches when the report
    changes (at most every ``min_interval_s``) and at least every ``interval_s`` so
    the operator sees a fresh ``updatedAt`` (it distrusts reports older than
    :data:`~remote_env.spec.pool_report.STALE_AFTER_S`). The API call runs on a
    worker thread so a slow API server never stalls supervision.
    """

    def __init__(self, namespace: str, name: str, *,
                 interval_s: float = report_mod.REPORT_INTERVAL_S,
                 min_interval_s: float = 1.0, api: Any = None) -> None:
        self.namespace = namespace
        self.name = name
        self.interval_s = interval_s
        self.min_interval_s = min_interval_s
        self._api = api
        self._last: tuple[Any, ...] | None = None
        self._last_at = 0.0
        self._pending: concurrent.futures.Future[None] | None = None
        self._executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="kube-status")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> KubeStatusReporter | None:
        """In-cluster: ``ENVPOOL_POOL_NAMESPACE`` and ``ENVPOOL_POOL_NAME`` (the
        operator sets both on the pool-server container); None elsewhere."""
        ns, name = environ.get("ENVPOOL_POOL_NAMESPACE"), environ.get("ENVPOOL_POOL_NAME")
        if not ns or not name:
            return None
        return cls(ns, name)

    def __call__(self, report: dict[str, Any]) -> None:
        # Leases are in the key: the autoscaler sizes the pool from them, so a lease
        # that empties the buffer reaches the operator within min_interval_s.
        key = (report["readyEnvs"], report["leasedEnvs"], report["freeEnvs"],
               report["desiredEnvs"], report["restarts"], report["lastError"],
               tuple(report.get("leasedWorkers", ())), tuple(report.get("freeWorkers", ())))
        now = time.monotonic()
        due = now - self._last_at >= self.interval_s
        changed = key != self._last and now - self._last_at >= self.min_interval_s
        if not (due or changed) or (self._pending is not None and not self._pending.done()):
            return
        self._last, self._last_at = key, now
        self._pending = self._executor.submit(self._patch, dict(report))

    def _patch(self, report: dict[str, Any]) -> None:
        try:
            api = self._client()
            api.patch_namespaced_custom_object_status(
                spec_mod.GROUP, spec_mod.VERSION, self.namespace, spec_mod.PLURAL, self.name,
                {"status": {"pool": report}}, _request_timeout=10,
            )
        except Exception as exc:
            status = getattr(exc, "status", None)
            if status == 404:
                log.info("EnvPool %s/%s is gone; not reporting", self.namespace, self.name)
            else:
                log.warning("cannot patch EnvPool %s/%s status.pool: %s", self.namespace,
                            self.name, exc)
            self._last = None  # try again on the next tick that is due

    def _client(self) -> Any:
        if self._api is None:
            self._api = kubeconfig.load().client.CustomObjectsApi()
        return self._api

    def close(self) -> None:
        self._executor.shutdown(wait=True)
