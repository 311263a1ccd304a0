"""An EnvPool as the API serves it (pure): its spec parsed, its status, the clock.

The reconcile, the autoscaler pass and the handlers all read EnvPool bodies the
same way, so a spec the reconcile rejects is one the autoscaler skips::

    >>> from envpool_operator import settings
    >>> body = {"metadata": {"name": "cp", "namespace": "ns"},
    ...         "spec": {"env": {"id": "CartPole-v1"}, "replicas": 4}}
    >>> parse(body, settings.Settings()).replicas
    4
    >>> status_of(body)
    {}
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import Any

from envpool_operator import settings as settings_mod
from remote_env import spec as spec_mod


def now() -> datetime.datetime:
    """The time that status timestamps and pool-report freshness are judged against."""
    return datetime.datetime.now(datetime.timezone.utc)


def status_of(body: Mapping[str, Any]) -> Mapping[str, Any]:
    return body.get("status") or {}


def parse(body: Mapping[str, Any], settings: settings_mod.Settings) -> spec_mod.PoolSpec:
    """The EnvPool's spec under the operator's limits; raises ``spec_mod.SpecError``."""
    meta = body.get("metadata") or {}
    return spec_mod.parse_spec(
        body.get("spec") or {}, name=meta.get("name", ""),
        namespace=meta.get("namespace", "default"), limits=settings.limits,
    )
