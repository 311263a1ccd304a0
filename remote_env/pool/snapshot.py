"""What the pool server shows: the ``/status`` document, and from it the EnvPool's
``status.pool`` (:class:`remote_env.spec.pool_report.PoolReport`, the typed contract
with the operator).

Pure functions of what :class:`~remote_env.pool.server.PoolServer` holds, so the
HTTP server, the kube reporter and ``wait_ready`` all read one snapshot.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence
from typing import Any

from remote_env import spec as spec_mod
from remote_env.pool import rollout
from remote_env.pool.slot import ActorSlot
from remote_env.spec import pool_report as report_mod

#: The keys of ``/status`` the operator reads (``status.pool`` of the EnvPool).
POOL_REPORT_KEYS = report_mod.KEYS
MAX_REPORTED_WORKERS = report_mod.MAX_REPORTED_WORKERS


def now_iso() -> str:
    return report_mod.timestamp(datetime.datetime.now(datetime.timezone.utc))


def workers(slots: Sequence[ActorSlot], leased: Mapping[int, str],
            hosts: Mapping[str, str]) -> tuple[list[str], list[str]]:
    """(hosts with a leased actor, the other env hosts by fewest actors first).

    ``hosts`` maps Ray node ids to host names (in-cluster: the worker pods' names).
    """
    leased_nodes = {s.node_id for s in slots if s.slot in leased}
    actors: dict[str, int] = {}
    for s in slots:
        actors[s.node_id] = actors.get(s.node_id, 0) + 1
    held = sorted(h for nid, h in hosts.items() if nid in leased_nodes)
    free = sorted((actors.get(nid, 0), h) for nid, h in hosts.items()
                  if nid not in leased_nodes)
    return held[:MAX_REPORTED_WORKERS], [h for _, h in free[:MAX_REPORTED_WORKERS]]


def snapshot(spec: spec_mod.PoolSpec, *, ray_namespace: str, slots: Sequence[ActorSlot],
             leased: Mapping[int, str], leases: Sequence[Mapping[str, Any]],
             hosts: Mapping[str, str], last_error: str, healthy: bool,
             spec_version: int, reclaimed: Sequence[Mapping[str, Any]] = (),
             reclaimed_count: int = 0) -> dict[str, Any]:
    """The ``/status`` document of a pool whose actors are ``slots`` (in slot order).

    ``reclaimed``: the latest leases released because their holder died (newest
    last), ``reclaimed_count`` how many since this pool server started."""
    by_state = {"ready": 0, "starting": 0, "backoff": 0, "failed": 0}
    for s in slots:
        by_state[s.state] += s.num_envs
    trainers = {lease["lease_id"]: lease["trainer"] for lease in leases}
    leased_envs = sum(s.num_envs for s in slots if s.slot in leased)
    # What a trainer can lease right now: ready and nobody's (the autoscaler's buffer).
    free_envs = sum(s.num_envs for s in slots if s.state == "ready" and s.slot not in leased)
    leased_workers, free_workers = workers(slots, leased, hosts)
    roll = rollout.progress(slots, spec.revision(), leased)
    return {
        "pool": spec.name,
        "namespace": spec.namespace,
        "rayNamespace": ray_namespace,
        "desiredEnvs": spec.desired_envs,
        "totalEnvs": sum(by_state.values()),
        "readyEnvs": by_state["ready"],
        "startingEnvs": by_state["starting"] + by_state["backoff"],
        "failedEnvs": by_state["failed"],
        "leasedEnvs": leased_envs,
        "freeEnvs": free_envs,
        "leasedWorkers": leased_workers,
        "freeWorkers": free_workers,
        "actors": len(slots),
        "readyActors": sum(1 for s in slots if s.state == "ready"),
        "restarts": sum(s.restarts for s in slots),
        "lastError": last_error,
        "updatedAt": now_iso(),
        "healthy": healthy,
        "specVersion": spec_version,
        # the rollout of a new actor build (rollout.py): done when nothing is outdated
        "revision": roll.revision,
        "updatedEnvs": roll.updated_envs,
        "outdatedEnvs": roll.outdated_envs,
        "outdatedLeasedEnvs": roll.outdated_leased_envs,
        "spec": {"replicas": spec.replicas, "envsPerActor": spec.envs_per_actor,
                 "suspend": spec.suspend},
        "slots": [
            {"slot": s.slot, "name": s.name, "actorId": s.actor_id, "envs": s.num_envs,
             "state": s.state, "restarts": s.restarts, "nodeId": s.node_id,
             "revision": s.revision,
             "leasedBy": trainers.get(leased.get(s.slot, "")),
             "lastError": s.last_error}
            for s in slots
        ],
        "leases": [dict(lease) for lease in leases],
        # a dead holder's lease released before its ttl (holders.py)
        "leasesReclaimed": reclaimed_count,
        "reclaimedLeases": [dict(lease) for lease in reclaimed],
    }


def pool_report(status: Mapping[str, Any]) -> dict[str, Any]:
    """``status.pool`` of the EnvPool, from a ``/status`` document (see
    :class:`~remote_env.spec.pool_report.PoolReport`)."""
    return report_mod.PoolReport.from_status(status).to_document()
