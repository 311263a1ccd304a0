"""Rolling a new actor build through a running pool: which actors to rebuild now.

A change of the env, ``ray.runtimeEnv``, ``envsPerActor`` or another actor setting
gives the spec a new :meth:`~remote_env.spec.model.PoolSpec.revision`. Each actor is
stamped with the revision it was built from; :func:`plan` picks the actors of an
older one to rebuild on this pass, on the same Ray pods (no pod is recreated):

* only free, ready actors: an actor a trainer leases keeps running its old envs
  until the lease ends (then it is free, and goes like the others), unless
  ``updateStrategy.leasedActors: ReplaceAfterGrace`` and its grace is over
  (``overdue``): then it is rebuilt in place at its size, after the free ones;
* at most ``maxUnavailable`` envs out of service at once, counting every env the
  pool lacks for any reason (starting, restarting, removed), as a Deployment counts
  unavailable pods; when none is out of service, one new actor's worth may go even
  if that is more (else a budget below one actor would never move);
* an actor of the new size is rebuilt in place; one of another size (envsPerActor
  changed) is removed and the scaling pass adds actors of the new size.

Pure: it reads slots, never Ray.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping, Sequence

from remote_env.pool.slot import ActorSlot


@dataclasses.dataclass(frozen=True)
class Plan:
    """This pass's part of a rollout."""

    #: Slots to rebuild in place (same size, the new revision).
    rebuild: tuple[int, ...] = ()
    #: Slots to remove (another size): the scaling pass refills the pool.
    remove: tuple[int, ...] = ()
    #: Leased slots past their grace: rebuilt in place at their size, lease or not.
    evict: tuple[int, ...] = ()

    @property
    def slots(self) -> list[int]:
        """The free slots of the plan (the lease actor is asked to withdraw them)."""
        return [*self.rebuild, *self.remove]


@dataclasses.dataclass(frozen=True)
class RolloutProgress:
    """Where a rollout stands (what ``/status`` and ``status.pool`` show)."""

    revision: str
    updated_envs: int
    outdated_envs: int
    #: outdated envs a trainer holds: they wait for the lease to end
    outdated_leased_envs: int

    @property
    def complete(self) -> bool:
        return self.outdated_envs == 0


def progress(slots: Sequence[ActorSlot], revision: str, leased: Mapping[int, str]) -> RolloutProgress:
    """Envs in actors of ``revision`` and of older ones."""
    old = [s for s in slots if s.revision != revision]
    return RolloutProgress(
        revision=revision,
        updated_envs=sum(s.num_envs for s in slots if s.revision == revision),
        outdated_envs=sum(s.num_envs for s in old),
        outdated_leased_envs=sum(s.num_envs for s in old if s.slot in leased),
    )


def plan(slots: Sequence[ActorSlot], *, revision: str, envs_per_actor: int, desired_envs: int,
         max_unavailable: int, leased: Mapping[int, str], overdue: Collection[int] = ()
         ) -> Plan:
    """The outdated actors to take down now (see the module's rules).

    Args:
        slots: the pool's actors.
        revision: the spec's revision; actors stamped otherwise are outdated.
        envs_per_actor: the spec's actor size: an outdated actor of this size is
            rebuilt in place, one of another size removed.
        desired_envs: envs the pool should have in service.
        max_unavailable: ``updateStrategy.maxUnavailable`` in envs.
        leased: slot -> lease id of the leased actors (never taken, but for...)
        overdue: leased slots whose grace is over (``ReplaceAfterGrace``).
    """
    ready = sum(s.num_envs for s in slots if s.state == "ready")
    unavailable = max(0, desired_envs - ready)
    budget = max_unavailable if unavailable else max(max_unavailable, envs_per_actor)
    # free ones first, then leased ones past their grace
    candidates = sorted((s for s in slots if s.revision != revision and s.state == "ready"
                         and (s.slot not in leased or s.slot in overdue)),
                        key=lambda s: (s.slot in leased, s.slot))
    rebuild: list[int] = []
    remove: list[int] = []
    evict: list[int] = []
    taken = 0
    for s in candidates:
        first = unavailable == 0 and taken == 0
        if unavailable + taken + s.num_envs > budget and not first:
            continue
        if s.slot in leased:
            evict.append(s.slot)  # its trainer keeps as many envs: rebuilt at its size
        else:
            (rebuild if s.num_envs == envs_per_actor else remove).append(s.slot)
        taken += s.num_envs
    return Plan(tuple(rebuild), tuple(remove), tuple(evict))
