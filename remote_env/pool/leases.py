"""Leases on a pool's actors: the record, which actors to grant, fencing, summaries.

The :class:`~remote_env.pool.registry.PoolRegistry` keeps the leases; what a lease
is and how a grant is chosen and fenced lives here, as plain functions of the
registry's records (unit-tested with them).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

from remote_env.pool.slot import SlotInfo


@dataclasses.dataclass
class Lease:
    """One trainer's hold on whole actors (slots), until ``expires`` unless renewed."""

    lease_id: str
    trainer: str
    slots: list[int]
    ttl_s: float
    expires: float
    acquired: float
    epoch: int = 0


#: ``fencer(slots, epoch)``: raise the fence of the slots' actors to ``epoch``.
Fencer = Callable[[Sequence[SlotInfo], int], None]
#: How long a grant waits for its actors to take the new fence (a busy actor answers
#: after its current call; a hung one is the pool server's to replace).
FENCE_TIMEOUT_S: Final = 10.0


class LeaseError(RuntimeError):
    """No lease could be granted (too few free envs, or a bad request)."""


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
        }
        for lease in leases
    ]
    short = {s: lease_id[:8] for s, lease_id in leased.items()}
    return {"leases": shown, "leased_slots": short}


def ray_fencer(slots: Sequence[SlotInfo], epoch: int, namespace: str | None = None) -> None:
    """Raise the fence of the slots' actors (named actors in Ray namespace ``namespace``)."""
    try:
        import ray
    except ImportError:  # pragma: no cover - ray is a dependency
        return
    if not ray.is_initialized():
        return  # in-process (unit tests): no actors to fence
    refs: list[Any] = []
    for s in slots:
        try:
            refs.append(ray.get_actor(s.actor_name, namespace=namespace).fence.remote(epoch))
        except ValueError:  # gone: its replacement starts unfenced and takes the next call's
            continue
    if refs:
        # a dead actor's error or a busy one's delay must not fail the grant
        ray.wait(refs, num_returns=len(refs), timeout=FENCE_TIMEOUT_S)
