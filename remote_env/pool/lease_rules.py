"""Lease rules: what a lease is, which actors a grant takes, when a lapsed lease may be
granted again, when one expires. Pure (no Ray, no lock, no clock of its own: times
are passed in), so every rule is unit-tested as a function.

:class:`LeaseBook` holds the leases of one pool and the epochs (fences) they were
granted at; the :class:`~remote_env.pool.lease_actor.LeaseActor` (the named Ray
actor trainers and the pool server call) owns one, with the layout it picks from,
the lock and the store that keeps both across its restart.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import Any, Final

from remote_env.pool.slot import SlotInfo


@dataclasses.dataclass
class Lease:
    """One trainer's hold on whole actors (slots), until ``expires`` unless renewed.

    A record :class:`LeaseBook` alone writes."""

    lease_id: str
    trainer: str
    slots: list[int]
    ttl_s: float
    expires: float
    acquired: float
    epoch: int = 0
    #: the holder's Ray identity (:func:`holder_id`; "" unknown): when Ray says it
    #: died, the pool server reclaims the lease before its ttl runs out
    holder: str = ""


#: ``fencer(slots, epoch)``: raise the fence of the slots' actors to ``epoch``.
Fencer = Callable[[Sequence[SlotInfo], int], None]
#: How long a grant waits for its actors to take the new fence (a busy actor answers
#: after its current call; a hung one is the pool server's to replace).
FENCE_TIMEOUT_S: Final = 10.0


#: Prefixes of a holder identity: a Ray actor (the trainer runs inside one, e.g. an
#: RLlib EnvRunner) or a Ray job (a driver process: its job ends when it dies).
ACTOR_HOLDER: Final = "actor:"
JOB_HOLDER: Final = "job:"


def holder_id(actor_id: str | None, job_id: str | None, is_driver: bool,
              restarts: int | None = None) -> str:
    """The Ray identity whose death ends a lease: the actor the trainer runs in, else
    the job of a driver; "" for anything else (a task's worker dies without its job:
    only the ttl can tell).

    An actor holder names its incarnation too (``#<restarts>``, Ray's restart count of
    the actor when it leased): Ray restarts an actor with ``max_restarts`` (RLlib's
    EnvRunners) under the same actor id, and that restart must free its
    predecessor's lease."""
    if actor_id:
        return ACTOR_HOLDER + actor_id + ("" if restarts is None else f"#{restarts}")
    if is_driver and job_id:
        return JOB_HOLDER + job_id
    return ""


def actor_holder(holder: str) -> tuple[str, int | None]:
    """(actor id, its restart count when it leased; None: not recorded) of an actor
    holder."""
    actor_id, _, restarts = holder.removeprefix(ACTOR_HOLDER).partition("#")
    return actor_id, int(restarts) if restarts.isdigit() else None


def holders_to_probe(leases: Iterable[Mapping[str, Any]]) -> list[str]:
    """The distinct known holders of ``leases`` (summaries), in first-seen order."""
    return [h for h in dict.fromkeys(str(x.get("holder") or "") for x in leases) if h]


class LeaseError(RuntimeError):
    """No lease could be granted (too few free envs, or a bad request)."""


def check_request(num_envs: int | None, ttl_s: float) -> None:
    """Raises :class:`LeaseError` for a request no pool can grant."""
    if ttl_s <= 0:
        raise LeaseError(f"ttl_s must be > 0, got {ttl_s}")
    if num_envs is not None and num_envs < 1:
        raise LeaseError(f"num_envs must be >= 1 or None (all free envs), got {num_envs}")


def choose(slots: Iterable[SlotInfo], leased: Collection[int], num_envs: int | None,
           revision: str | None) -> list[SlotInfo] | None:
    """The free, ready actors a new lease of ``num_envs`` envs (None: all free) takes,
    in slot order; None when no set of them adds up.

    During a rollout, actors of the spec's ``revision`` first: an old one leased now
    would run the old env until the lease ends.
    """
    free = sorted(
        (s for s in slots if s.state == "ready" and s.slot not in leased),
        key=lambda s: (bool(revision) and s.revision != revision, -s.num_envs, s.slot),
    )
    picked = free if num_envs is None else pick(free, num_envs)
    if not picked:
        return None
    return sorted(picked, key=lambda s: s.slot)


def pick(free: Sequence[SlotInfo], target: int) -> list[SlotInfo] | None:
    """Actors whose envs add up to exactly ``target``, or None when no subset does.

    ``free`` is sorted largest first. Largest first is tried first (fewest actors,
    and the only case while every actor has ``envsPerActor`` envs); when it misses,
    an exact subset is searched over the distinct actor sizes, which a pool of
    mixed sizes (after an ``envsPerActor`` change, or a short last actor) needs:
    free actors of 6, 4 and 4 envs hold 8 as 4 + 4.
    """
    chosen: list[SlotInfo] = []
    left = target
    for s in free:
        if s.num_envs <= left:
            chosen.append(s)
            left -= s.num_envs
        if left == 0:
            return chosen
    by_size: dict[int, list[SlotInfo]] = {}
    for s in free:
        by_size.setdefault(s.num_envs, []).append(s)
    # Bounded subset sum over the distinct sizes (few in practice), O(target) each:
    # reach[t] is one way to make t as {size: how many actors}; used[t] how many of
    # the current size that way took, so no size is used more often than it is free.
    reach: dict[int, dict[int, int]] = {0: {}}
    for size, group in by_size.items():
        used: dict[int, int] = {}
        for t in range(size, target + 1):
            prev = reach.get(t - size)
            if t in reach or prev is None or used.get(t - size, 0) >= len(group):
                continue
            reach[t] = {**prev, size: prev.get(size, 0) + 1}
            used[t] = used.get(t - size, 0) + 1
        if target in reach:
            break
    if target not in reach:
        return None
    return [s for size, k in reach[target].items() for s in by_size[size][:k]]


def free_envs(slots: Iterable[SlotInfo], leased: Collection[int]) -> int:
    """The envs of ready actors no lease holds."""
    return sum(s.num_envs for s in slots if s.state == "ready" and s.slot not in leased)


def why_not(pool: str, slots: Mapping[int, SlotInfo], leased: Mapping[int, str],
            num_envs: int | None) -> str:
    """Why no lease of ``num_envs`` (None: any) can be granted from ``slots``."""
    states: dict[str, int] = {}
    for s in slots.values():
        key = "leased" if s.slot in leased else s.state
        states[key] = states.get(key, 0) + s.num_envs
    free_sizes = sorted(
        (s.num_envs for s in slots.values() if s.state == "ready" and s.slot not in leased),
        reverse=True,
    )
    have = sum(free_sizes)
    summary = ", ".join(f"{n} {k}" for k, n in sorted(states.items())) or "no envs yet"
    want = "any envs" if num_envs is None else f"num_envs={num_envs}"
    hint = ""
    if num_envs is not None and have >= num_envs:
        hint = (f"; actors are leased whole and the free ones hold {free_sizes} envs: ask "
                "for a sum of those")
    return f"pool {pool!r} cannot lease {want}: {have} free ({summary}){hint}"


def summary(leases: Sequence[Lease], slots: Mapping[int, SlotInfo],
            leased: Mapping[int, str], now: float) -> dict[str, Any]:
    """The leases and leased slots as the pool server and status pages see them."""
    # Ids shortened: the full id is the holder's proof (release, replace).
    shown = [
        {
            "lease_id": lease.lease_id[:8],
            "trainer": lease.trainer,
            "slots": list(lease.slots),
            "envs": sum(slots[s].num_envs for s in lease.slots if s in slots),
            "expires_in_s": round(lease.expires - now, 3),
            "age_s": round(now - lease.acquired, 3),
            # the Ray identity the pool server probes (absent: unknown, ttl only)
            **({"holder": lease.holder} if lease.holder else {}),
        }
        for lease in leases
    ]
    short = {s: lease_id[:8] for s, lease_id in leased.items()}
    return {"leases": shown, "leased_slots": short}


class LeaseBook:
    """The leases of one pool and the epoch each slot was last granted at.

    Epochs only grow (each grant's is larger than any before, from the wall clock
    passed in, so a restarted book keeps counting up): the actors' fences refuse
    the calls of an older lease.
    """

    def __init__(self, leases: Iterable[Lease] = (), slot_epoch: Mapping[int, int] | None = None,
                 last_epoch: int = 0) -> None:
        self._leases: dict[str, Lease] = {x.lease_id: x for x in leases}
        self._slot_epoch: dict[int, int] = dict(slot_epoch or {})
        self._last_epoch = last_epoch

    # ---------------------------------------------------------------- views
    def leases(self) -> list[Lease]:
        return list(self._leases.values())

    def get(self, lease_id: str) -> Lease | None:
        return self._leases.get(lease_id)

    def slot_epochs(self) -> dict[int, int]:
        return dict(self._slot_epoch)

    @property
    def last_epoch(self) -> int:
        return self._last_epoch

    def leased_slots(self) -> dict[int, str]:
        """slot -> id of the lease holding it."""
        return {s: lease.lease_id for lease in self._leases.values() for s in lease.slots}

    def holds(self, lease_id: str, slot: int) -> bool:
        lease = self._leases.get(lease_id)
        return lease is not None and slot in lease.slots

    def summary(self, slots: Mapping[int, SlotInfo], now: float) -> dict[str, Any]:
        return summary(self.leases(), slots, self.leased_slots(), now)

    # ------------------------------------------------------------- changes
    def expire(self, now: float) -> bool:
        """Drop the leases not renewed in time; True when any went."""
        expired = [lease_id for lease_id, lease in self._leases.items() if lease.expires < now]
        for lease_id in expired:
            del self._leases[lease_id]
        return bool(expired)

    def grant(self, trainer: str, slots: Sequence[int], ttl_s: float, now: float,
              wall_epoch: int, lease_id: str | None = None, holder: str = "") -> Lease:
        """A new lease on ``slots`` (chosen by :func:`choose`), at a new, larger epoch."""
        self._last_epoch = max(self._last_epoch + 1, wall_epoch)
        lease = Lease(lease_id or uuid.uuid4().hex, trainer, list(slots), ttl_s, now + ttl_s,
                      now, self._last_epoch, holder)
        self._leases[lease.lease_id] = lease
        for s in slots:
            self._slot_epoch[s] = lease.epoch
        return lease

    def extend(self, lease: Lease, ttl_s: float, now: float) -> None:
        """``lease`` now runs ``ttl_s`` from ``now``."""
        lease.ttl_s = ttl_s
        lease.expires = now + ttl_s

    def rehold(self, lease: Lease, holder: str) -> bool:
        """``lease``'s holder is now ``holder`` (the same trainer, with a new Ray identity:
        a Ray client that connected again after its head was lost is a new job); True
        when it changed. "" changes nothing (a caller that sends no identity)."""
        if not holder or holder == lease.holder:
            return False
        lease.holder = holder
        return True

    def regrant(self, lease_id: str, trainer: str, slots: Sequence[int], ttl_s: float,
                epoch: int, now: float, *, present: Collection[int] | None,
                holder: str = "") -> Lease | None:
        """A lease this book no longer holds (expired, or lost with a restarted book)
        granted again as it was: only when nobody took its actors meanwhile (none
        leased, none granted at a later epoch) and every actor is still in the
        layout (``present``; None: no layout yet, which cannot tell). None: refused.
        """
        taken = self.leased_slots()
        if any(s in taken or (present is not None and s not in present)
               or self._slot_epoch.get(s, epoch) != epoch for s in slots):
            return None
        lease = Lease(lease_id, trainer, list(slots), ttl_s, now, now, epoch, holder)
        self._leases[lease_id] = lease
        for s in slots:
            self._slot_epoch[s] = epoch
        return lease

    def release(self, lease_id: str) -> bool:
        return self._leases.pop(lease_id, None) is not None

    def reclaim(self, dead: Collection[str]) -> list[Lease]:
        """Drop the leases whose holder is in ``dead`` (Ray says it died); returns them.

        Epochs are left as they are: the next grant of those actors fences them as
        any grant does, and a lease with no known holder ("") is never matched.
        """
        gone = [lease for lease in self._leases.values() if lease.holder and lease.holder in dead]
        for lease in gone:
            del self._leases[lease.lease_id]
        return gone
