"""The EnvPool's ``status.pool``: what the pool server reports and the operator reads.

One typed model for both ends of the contract. The pool server builds a
:class:`PoolReport` from its ``/status`` document and writes
:meth:`PoolReport.to_document` (camelCase keys, :data:`KEYS`) into its EnvPool's
status; the operator reads the object back with :meth:`PoolReport.read`, which
takes what a writer of any version (or a hand edit) may have left there, and trusts
it only while :meth:`PoolReport.is_fresh` (:data:`STALE_AFTER_S`, the one place the
staleness rule lives).

Pure (stdlib only): the operator imports it without Ray, the pool server without
Kubernetes.

    >>> import datetime
    >>> doc = {"readyEnvs": 4, "desiredEnvs": 4, "updatedAt": "2026-01-01T00:00:00Z"}
    >>> report = PoolReport.read(doc)
    >>> report.ready_envs, report.leased_envs, report.revision
    (4, None, None)
    >>> report.is_fresh(datetime.datetime(2026, 1, 1, 0, 3, tzinfo=datetime.timezone.utc))
    False
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Mapping
from typing import Any, Final

#: A report older than this is not trusted (the pool server writes one at least
#: every :data:`REPORT_INTERVAL_S`, and on every change).
STALE_AFTER_S: Final = 120.0
#: How often a pool server with nothing new to say still writes ``status.pool``, so
#: that the operator sees a fresh ``updatedAt``: well inside :data:`STALE_AFTER_S`.
REPORT_INTERVAL_S: Final = STALE_AFTER_S / 4
#: Most host names reported per list: a scale-down removes a few worker pods at a
#: time, and the EnvPool object must stay small.
MAX_REPORTED_WORKERS: Final = 100

#: The keys of ``status.pool``, in the order the pool server writes them (the keys
#: of its ``/status`` document of the same names).
KEYS: Final = ("readyEnvs", "leasedEnvs", "freeEnvs", "desiredEnvs", "restarts",
               "lastError", "updatedAt", "leasedWorkers", "freeWorkers", "revision",
               "updatedEnvs", "outdatedEnvs", "outdatedLeasedEnvs")


def timestamp(now: datetime.datetime) -> str:
    """``now`` as ``updatedAt`` is written (RFC 3339, UTC, whole seconds)."""
    return now.astimezone(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(text: Any) -> datetime.datetime | None:
    """An RFC 3339 time (UTC when it names no zone); None when ``text`` is not one."""
    if not isinstance(text, str):
        return None
    try:
        parsed = datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=datetime.timezone.utc)
    return parsed


def _int(value: Any) -> int:
    """A count as written, 0 for anything else (a bool is no count)."""
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _hosts(value: Any) -> tuple[str, ...]:
    return tuple(str(h) for h in value or ())


@dataclasses.dataclass(frozen=True)
class PoolReport:
    """``status.pool`` of one EnvPool.

    ``leased_envs``/``free_envs`` are None when a pool server older than leases
    wrote the report, ``revision`` None when one older than rollouts did: the
    operator then leaves what depends on them alone. ``leased_workers`` and
    ``free_workers`` name the worker hosts (pods) with and without a leased actor,
    emptiest first, so that shrinking the worker group can name the pods to remove
    (KubeRay's ``workersToDelete``) instead of random ones.
    """

    ready_envs: int
    desired_envs: int
    updated_at: str | None
    leased_envs: int | None = None
    free_envs: int | None = None
    restarts: int = 0
    last_error: str = ""
    leased_workers: tuple[str, ...] = ()
    free_workers: tuple[str, ...] = ()
    revision: str | None = None
    updated_envs: int = 0
    outdated_envs: int = 0
    outdated_leased_envs: int = 0

    @classmethod
    def from_status(cls, status: Mapping[str, Any]) -> PoolReport:
        """The report in a pool server's ``/status`` document (which holds every key)."""
        missing = [key for key in KEYS if key not in status]
        if missing:
            raise KeyError(f"a /status document without {missing} cannot make status.pool")
        return cls(
            ready_envs=status["readyEnvs"], desired_envs=status["desiredEnvs"],
            updated_at=status["updatedAt"], leased_envs=status["leasedEnvs"],
            free_envs=status["freeEnvs"], restarts=status["restarts"],
            last_error=status["lastError"], leased_workers=tuple(status["leasedWorkers"]),
            free_workers=tuple(status["freeWorkers"]), revision=status["revision"],
            updated_envs=status["updatedEnvs"], outdated_envs=status["outdatedEnvs"],
            outdated_leased_envs=status["outdatedLeasedEnvs"],
        )

    @classmethod
    def read(cls, doc: Mapping[str, Any] | None) -> PoolReport | None:
        """The report in ``status.pool`` as read from the API; None when there is none.

        Lenient, as any status an older writer or a hand edit left: a count that is
        not an integer reads as 0, a missing ``leasedEnvs``/``revision`` as None.
        """
        if not doc:
            return None
        leased = "leasedEnvs" in doc
        err = doc.get("lastError")
        updated = doc.get("updatedAt")
        return cls(
            ready_envs=_int(doc.get("readyEnvs")),
            desired_envs=_int(doc.get("desiredEnvs")),
            updated_at=None if updated is None else str(updated),
            leased_envs=_int(doc.get("leasedEnvs")) if leased else None,
            free_envs=_int(doc.get("freeEnvs")) if leased else None,
            restarts=_int(doc.get("restarts")),
            last_error=str(err) if err else "",
            leased_workers=_hosts(doc.get("leasedWorkers")),
            free_workers=_hosts(doc.get("freeWorkers")),
            revision=str(doc["revision"]) if "revision" in doc else None,
            updated_envs=_int(doc.get("updatedEnvs")),
            outdated_envs=_int(doc.get("outdatedEnvs")),
            outdated_leased_envs=_int(doc.get("outdatedLeasedEnvs")),
        )

    def to_document(self) -> dict[str, Any]:
        """``status.pool`` as the pool server writes it (every key of :data:`KEYS`)."""
        return {
            "readyEnvs": self.ready_envs,
            "leasedEnvs": self.leased_envs,
            "freeEnvs": self.free_envs,
            "desiredEnvs": self.desired_envs,
            "restarts": self.restarts,
            "lastError": self.last_error,
            "updatedAt": self.updated_at,
            "leasedWorkers": list(self.leased_workers),
            "freeWorkers": list(self.free_workers),
            "revision": self.revision,
            "updatedEnvs": self.updated_envs,
            "outdatedEnvs": self.outdated_envs,
            "outdatedLeasedEnvs": self.outdated_leased_envs,
        }

    def is_fresh(self, now: datetime.datetime) -> bool:
        """Written within :data:`STALE_AFTER_S` of ``now`` (an unreadable time is stale)."""
        updated = parse_time(self.updated_at)
        return updated is not None and (now - updated).total_seconds() <= STALE_AFTER_S


def fresh(doc: Mapping[str, Any] | None, now: datetime.datetime) -> PoolReport | None:
    """The report in ``doc`` (``status.pool``) if it is recent enough to trust, else None."""
    report = PoolReport.read(doc)
    return report if report is not None and report.is_fresh(now) else None
