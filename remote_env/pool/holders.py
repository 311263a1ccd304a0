"""Whether a lease's holder is still alive: the pool server's reclaim of a dead
trainer's lease (#33).

A trainer records its Ray identity when it leases
(:func:`~remote_env.pool.lease_rules.holder_id`: the actor it runs in, e.g. an RLlib
EnvRunner, else its driver's job). A SIGKILLed holder renews nothing, and its lease
would hold its envs for ``lease_timeout_s``; a restarted EnvRunner could not get them
back. The pool server asks Ray, on its tick and at most every
:data:`PROBE_INTERVAL_S`, whether each holder is dead, and has the lease actor release
the leases of the dead ones (:meth:`~remote_env.pool.lease_actor.LeaseActor.reclaim`).

Only Ray's definite word counts: an actor Ray lists as ``DEAD``, or as restarted
since it leased (its restart count grew: RLlib's EnvRunners have ``max_restarts``,
and Ray counts the restart when the old process dies, before the new one can lease),
a job Ray lists as dead whose driver's node is alive (:func:`job_died`). A holder Ray cannot
tell about (not found, the GCS call failed, no identity, a driver's node gone)
is left alone and its lease keeps its ttl. A holder that is alive but paused is
never reclaimed here; the actors' epoch fences handle it as before.

The GCS tables are read directly (``ray._private.state``, one call per actor holder,
one for all jobs): the state API (``ray.util.state``) needs the dashboard, which a
pool's Ray need not run.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final

from remote_env.pool import lease_rules

log = logging.getLogger(__name__)

#: Seconds between two probes of the holders (each is a GCS call per actor holder).
PROBE_INTERVAL_S: Final = 1.0

#: ``probe(holders)`` -> the holders Ray says died.
Probe = Callable[[list[str]], set[str]]


def actor_died(holder: str, entry: Mapping[str, Any] | None) -> bool:
    """Whether the incarnation of the actor that leased (``holder``) is gone, by its
    entry in Ray's actor table (None: not found, cannot tell)."""
    if not entry:
        return False
    _, restarts = lease_rules.actor_holder(holder)
    if entry.get("State") == "DEAD":
        return True
    # Not the process state or pid: a restarted EnvRunner leases in its constructor,
    # while Ray still shows it RESTARTING (seen: the old pid for 0.3 s, then the new).
    return restarts is not None and int(entry.get("NumRestarts") or 0) > restarts


def actor_restarts(actor_id: str) -> int | None:
    """How often Ray has restarted actor ``actor_id`` so far (None: cannot tell); a
    trainer in an actor records it with its lease (:func:`lease_rules.holder_id`)."""
    from ray._private import state

    try:
        info: dict[str, Any] = state.actors(actor_id=actor_id)
        return int(info["NumRestarts"]) if info else None
    except Exception as exc:  # the holder is still recorded, DEAD alone then counts
        log.debug("actor %s: actor table read failed: %s", actor_id, exc)
        return None


def job_died(entry: Mapping[str, Any], alive_ips: Iterable[str]) -> bool:
    """Whether the job table's ``entry`` says its driver died, and Ray can tell.

    A dead job whose driver ran on a node that is gone cannot tell: a Ray client
    trainer's driver is a server process on the head node, so with GCS fault tolerance
    the head's loss marks every such job dead while the trainers themselves live on
    (stepping over TCP, reconnecting). Their leases keep their ttl; a trainer that
    really died with that node renews nothing and loses it then.
    """
    return bool(entry.get("IsDead")) and str(entry.get("DriverIPAddress") or "") in set(alive_ips)


def dead_from_tables(holders: Iterable[str], actors: Mapping[str, Mapping[str, Any]],
                     jobs: Mapping[str, bool]) -> set[str]:
    """The holders the tables say died: an actor incarnation that is gone
    (:func:`actor_died`; ``actors`` by actor id), a job marked dead. A holder missing
    from the tables, or of an unknown kind, is not dead."""
    dead: set[str] = set()
    for h in holders:
        actor = h.startswith(lease_rules.ACTOR_HOLDER) and actor_died(
            h, actors.get(lease_rules.actor_holder(h)[0]))
        job = h.startswith(lease_rules.JOB_HOLDER) and jobs.get(
            h.removeprefix(lease_rules.JOB_HOLDER)) is True
        if actor or job:
            dead.add(h)
    return dead


def ray_probe(holders: list[str]) -> set[str]:
    """The holders Ray's GCS says died (see :func:`dead_from_tables`); each table read
    that fails counts as "cannot tell" for the holders it was for."""
    from ray._private import state

    actors: dict[str, dict[str, Any]] = {}
    for h in holders:
        if not h.startswith(lease_rules.ACTOR_HOLDER):
            continue
        actor_id = lease_rules.actor_holder(h)[0]
        try:
            info: dict[str, Any] = state.actors(actor_id=actor_id)
        except Exception as exc:  # cannot tell: the ttl still applies
            log.debug("holder %s: actor table read failed: %s", h, exc)
            continue
        if info:
            actors[actor_id] = info
    jobs: dict[str, bool] = {}
    if any(h.startswith(lease_rules.JOB_HOLDER) for h in holders):
        try:
            import ray

            alive = {str(n.get("NodeManagerAddress") or "")
                     for n in ray.nodes() if n.get("Alive")}  # type: ignore[no-untyped-call]
            jobs = {str(j["JobID"]): job_died(j, alive)
                    for j in state.jobs()}  # type: ignore[no-untyped-call]
        except Exception as exc:
            log.debug("job table read failed: %s", exc)
    return dead_from_tables(holders, actors, jobs)


class HolderWatch:
    """Rate-limits the probes of lease holders; owned by the pool server.

    Args:
        probe: asks Ray which holders died (:func:`ray_probe`; a fake in unit tests).
        interval_s: at least this long between two probes.
    """

    def __init__(self, probe: Probe = ray_probe, interval_s: float = PROBE_INTERVAL_S) -> None:
        self._probe = probe
        self._interval_s = interval_s
        self._last: float | None = None

    def dead(self, leases: Iterable[Mapping[str, Any]], now: float) -> set[str]:
        """The holders of ``leases`` (summaries) that died; empty when not due yet, or
        when no lease has a known holder (then nothing is asked)."""
        if self._last is not None and now - self._last < self._interval_s:
            return set()
        holders = lease_rules.holders_to_probe(leases)
        if not holders:
            return set()
        self._last = now
        try:
            return self._probe(holders)
        except Exception as exc:  # cannot tell: leave them to their ttl
            log.warning("probing lease holders failed: %s", exc)
            return set()
