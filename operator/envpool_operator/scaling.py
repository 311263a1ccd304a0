"""Pools that size themselves (``spec.autoscaling``): one autoscaler pass, and its loop.

A pass turns the pool server's last report (``status.pool.leasedEnvs``) into
``spec.replicas`` through the scale subresource, the path ``kubectl scale``
takes; the spec change then runs the ordinary reconcile
(:mod:`~envpool_operator.reconcile`). The arithmetic is pure, in
:mod:`~envpool_operator.autoscaler`; this module reads the cached body, writes
through :mod:`~envpool_operator.kube` and reports ``status.autoscaling``.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Mapping
from typing import Any

from envpool_operator import autoscaler, kube
from envpool_operator import runtime as runtime_mod
from envpool_operator import settings as settings_mod
from envpool_operator import status as status_mod
from remote_env import spec as spec_mod


@dataclasses.dataclass(frozen=True)
class ScaleDecision:
    """One autoscaler pass over an EnvPool: what it saw and what it asked for."""

    current: int
    leased: int | None  # None: no fresh pool-server report
    recommended: int
    replicas: int  # what spec.replicas should be; == current: nothing written


def autoscale(key: tuple[str, str], runtime: runtime_mod.Runtime, logger: Any,
              now: float | None = None) -> ScaleDecision | None:
    """Size EnvPool ``key`` from its last pool-server report (``spec.autoscaling``).

    Reads the cached body (events keep it fresh), so a pass with nothing to change
    makes no API call. A change goes through the scale subresource, the same path as
    ``kubectl scale``; the spec update that follows runs the ordinary reconcile
    (ConfigMap, RayCluster workers) and reaches the pool server through its watch.
    Without a fresh report only the bounds are enforced. Returns None for pools
    that are not autoscaled (or suspended, deleted, invalid).
    """
    now = time.monotonic() if now is None else now
    with runtime.pool_lock(key):
        body = runtime.pool_body(key)
        if body is None or (body.get("metadata") or {}).get("deletionTimestamp"):
            return None
        try:
            pool = settings_mod.parse_pool(body, runtime.settings)
        except spec_mod.SpecError:
            return None
        auto = pool.autoscaling
        if auto is None or pool.suspend:
            runtime.drop_stabilizer(key)
            return None
        report = status_mod.fresh_report(status_mod.status_of(body).get("pool"), status_mod.now())
        current = pool.replicas
        leased: int | None = None
        if report is not None and report.leased_envs is not None:
            leased = report.leased_envs
            recommended = autoscaler.recommend(auto, leased=leased,
                                               envs_per_actor=pool.envs_per_actor)
            stab = runtime.stabilizer(key)
            replicas = stab.decide(auto, current=current, recommended=recommended, now=now)
        else:
            recommended = replicas = max(auto.min_replicas, min(auto.max_replicas, current))
        decision = ScaleDecision(current, leased, recommended, replicas)
        if replicas != current:
            if kube.scale_envpool(key[0], key[1], replicas) is None:
                return decision  # deleted meanwhile
            runtime.scaled(key, replicas)  # until the watch brings the new body
            runtime.metrics.scale_writes.labels(
                direction="up" if replicas > current else "down").inc()
            logger.info(f"autoscaler: EnvPool {key[0]}/{key[1]} {current} -> {replicas} envs "
                        f"({_why(auto, leased)})")
        _report_decision(key, body, decision, auto)
        return decision


def _why(auto: spec_mod.Autoscaling, leased: int | None) -> str:
    if leased is None:
        return f"no fresh pool report: within [{auto.min_replicas}, {auto.max_replicas}]"
    buffer = f"{auto.buffer_envs} free" if auto.buffer_envs is not None \
        else f"{auto.buffer_percent}% free"
    return f"{leased} leased + {buffer}, within [{auto.min_replicas}, {auto.max_replicas}]"


def _report_decision(key: tuple[str, str], body: Mapping[str, Any], decision: ScaleDecision,
                     auto: spec_mod.Autoscaling) -> None:
    """``status.autoscaling``, patched only when the recommendation or the size changed."""
    previous = status_mod.status_of(body).get("autoscaling") or {}
    held = decision.replicas > decision.recommended
    message = f"{decision.replicas} envs: {_why(auto, decision.leased)}" + (
        f"; {decision.recommended} asked, held for scaleDownDelaySeconds="
        f"{auto.scale_down_delay_seconds}" if held else "")
    st: dict[str, Any] = {"recommendedReplicas": decision.recommended, "message": message}
    if decision.replicas != decision.current:
        st["lastScaleTime"] = status_mod.rfc3339(status_mod.now())
    if any(previous.get(k) != v for k, v in st.items()):
        kube.patch_envpool_status(key[0], key[1], {"autoscaling": st})


def autoscale_loop(runtime: runtime_mod.Runtime, stop: threading.Event, logger: Any) -> None:
    """Every ``autoscale_seconds``, one :func:`autoscale` pass over every known EnvPool.

    Reports trigger a pass of their own pool as they arrive; this loop lets a
    scale-down delay run out when nothing changes, and enforces the bounds.
    """
    runtime_mod.every_pool(runtime, stop, runtime.settings.autoscale_seconds, autoscale,
                           "autoscaling", logger)
