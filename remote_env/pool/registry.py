"""The pool's registry: which env actors exist and which trainer leases which.

One named, detached actor per pool (:data:`REGISTRY_NAME` in the pool's Ray
namespace), so it outlives both trainers and the pool server: a restarted pool
server finds its layout and leases here, a trainer finds the actors here.

* The pool server publishes the layout (slot -> actor name, envs, state) and
  picks up replacement requests with one long-poll per supervision tick
  (:meth:`PoolRegistry.server_sync`).
* Trainers :meth:`~PoolRegistry.acquire` a lease on whole actors (one Ray call
  steps all envs of an actor, so an actor is the unit two trainers must not
  share), :meth:`~PoolRegistry.renew` it on a heartbeat and
  :meth:`~PoolRegistry.release` it on close. A lease not renewed within its
  ``ttl_s`` expires and its actors return to the pool.
* A trainer whose actor died asks for a replacement
  (:meth:`~PoolRegistry.request_replace`) and waits for the pool server to
  publish it (:meth:`~PoolRegistry.wait_for_replacement`): the pool server is
  the one owner of restarts.

Leases are fenced. Each grant gets an epoch larger than any before it (from the
wall clock, so a restarted registry keeps counting up); the registry raises the
fence of every leased actor to it before the grant returns, and trainers send
their epoch with every host call (:meth:`remote_env.actor.host.SubEnvHost.fenced`), so
a trainer that resumes after its lease went to someone else gets
``LeaseLostError`` from the actor itself, not a step of another trainer's env.
Only the holder (who knows the lease id, shown nowhere else) can release a lease
or ask for its actors to be replaced.

The leases and the published layout survive a restart of the registry itself
(Ray restarts it empty): they are written to a
:class:`~remote_env.pool.registry_store.RegistryStore` (Ray's GCS key-value store)
before any caller hears of a change, and read back when it starts.

A plain class (threaded Ray actor: the long-polls block a thread each), so it is
unit-tested in-process with a fake clock.
"""

from __future__ import annotations

import functools
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any, Final

from remote_env import errors
from remote_env.pool import leases as leases_mod
from remote_env.pool import registry_store
from remote_env.pool.leases import LeaseError
from remote_env.pool.slot import SlotInfo

__all__ = ["REGISTRY_NAME", "LeaseError", "PoolRegistry", "get_registry", "remote_class"]

REGISTRY_NAME: Final = "envpool-registry"
#: Threads of the registry actor: long-polls (pool server, trainers waiting for a
#: replacement) each hold one while they wait.
REGISTRY_CONCURRENCY: Final = 64

class PoolRegistry:
    """Layout and leases of one pool. Thread-safe; every method is one Ray call."""

    def __init__(self, pool: str, clock: Callable[[], float] = time.monotonic,
                 fencer: leases_mod.Fencer | None = None,
                 epoch_clock: Callable[[], int] = time.time_ns,
                 ray_namespace: str | None = None,
                 store: registry_store.RegistryStore | None = None) -> None:
        self._pool = pool
        self._clock = clock
        self._fencer = fencer if fencer is not None else functools.partial(
            leases_mod.ray_fencer, namespace=ray_namespace)
        self._epoch_clock = epoch_clock
        # The leases (and the published layout) are kept across this actor's own
        # restart (Ray restarts it empty): a trainer stepping through the restart must
        # keep its envs, and a second trainer attaching meanwhile must not get them.
        self._store = store if store is not None else registry_store.MemoryStore()
        book = registry_store.load_book(self._store.load(registry_store.LEASES), clock())
        self._last_epoch = book.last_epoch
        # the epoch each slot was last granted at
        self._slot_epoch: dict[int, int] = dict(book.slot_epoch)
        self._cond = threading.Condition()
        layout = registry_store.load_layout(self._store.load(registry_store.LAYOUT))
        self._slots: dict[int, SlotInfo] = {s.slot: s for s in layout.slots}
        self._pool_info: dict[str, Any] = dict(layout.pool_info)
        self._leases: dict[str, leases_mod.Lease] = {x.lease_id: x for x in book.leases}
        self._requests: dict[int, tuple[str, str]] = {}  # slot -> (actor_id, reason)
        self._server_seen: float | None = None
        self._generation = layout.generation  # bumped on every layout change; 0: none yet
        self._lease_version = 0  # bumped when leases change: wakes the pool server's sync

    # ------------------------------------------------------------ pool server
    def server_sync(
        self,
        slots: Sequence[SlotInfo] | None,
        pool_info: dict[str, Any] | None,
        timeout: float,
    ) -> dict[str, Any]:
        """Publish the layout (when given), then wait up to ``timeout`` for requests.

        Returns the pending replacement requests (taken), the leased slots and a
        summary of the leases.
        """
        with self._cond:
            self._server_seen = self._clock()
            if pool_info is not None:
                self._pool_info = dict(pool_info)
            if slots is not None:
                self._slots = {s.slot: s for s in slots}
                for slot in list(self._requests):
                    if slot not in self._slots:
                        del self._requests[slot]
                self._layout_changed()
            version = self._lease_version
            if not self._requests and timeout > 0:
                self._cond.wait_for(
                    lambda: bool(self._requests) or self._lease_version != version, timeout)
            requests = [(slot, aid, reason) for slot, (aid, reason) in self._requests.items()]
            self._requests.clear()
            self._expire()
            return {"requests": requests, "generation": self._generation,
                    **self._lease_summary()}

    def withdraw(self, slots: Sequence[int]) -> list[int]:
        """Take the unleased ones of ``slots`` out of the layout; returns them.

        The pool server calls this right before it removes or rebuilds actors (scale
        down): checking for leases and taking the actors out of reach of
        :meth:`acquire` is one step here, so a lease granted since the server last
        synced keeps its actors. A withdrawn slot comes back with the next layout
        the server publishes, if it keeps it.
        """
        with self._cond:
            self._expire()
            leased = self._leased_slots()
            out = [s for s in slots if s not in leased]
            if [s for s in out if self._slots.pop(s, None) is not None]:
                self._layout_changed()
            return out

    def layout(self) -> dict[str, Any]:
        """Everything a (re)starting pool server or a status page needs."""
        with self._cond:
            self._expire()
            seen = None if self._server_seen is None else self._clock() - self._server_seen
            return {
                "pool": self._pool,
                "slots": sorted(self._slots.values(), key=lambda s: s.slot),
                "pool_info": dict(self._pool_info),
                "server_seen_s_ago": seen,
                **self._lease_summary(),
            }

    # --------------------------------------------------------------- trainers
    def acquire(self, trainer: str, num_envs: int | None, ttl_s: float,
                lease_id: str | None = None) -> dict[str, Any]:
        """Lease free, ready actors holding exactly ``num_envs`` envs (all free ones if None).

        ``lease_id`` (the caller's, secret; a new one if None) makes a retry safe: a
        call whose answer was lost (the registry restarted meanwhile; Ray cannot say
        whether it ran) asked again gets the lease it was granted, not a second one.

        Returns ``{"lease_id", "slots": [SlotInfo], "pool_info", "epoch"}``.

        Raises:
            LeaseError: not enough free envs, or no subset of free actors adds up
                to ``num_envs`` (actors are leased whole).
        """
        if ttl_s <= 0:
            raise LeaseError(f"ttl_s must be > 0, got {ttl_s}")
        if num_envs is not None and num_envs < 1:
            raise LeaseError(f"num_envs must be >= 1 or None (all free envs), got {num_envs}")
        with self._cond:
            self._expire()
            granted = self._leases.get(lease_id) if lease_id is not None else None
            answer = (self._regrant(granted, ttl_s) if granted is not None
                      else self._grant(trainer, num_envs, ttl_s, lease_id))
        # Outside the lock (a Ray call per actor); before returning, so the previous
        # holder's calls are refused before the new holder's first one.
        self._fencer(answer["slots"], answer["epoch"])
        return answer

    def _grant(self, trainer: str, num_envs: int | None, ttl_s: float,
               lease_id: str | None) -> dict[str, Any]:
        """A new lease (the lock held)."""
        leased = self._leased_slots()
        free = sorted(
            (s for s in self._slots.values() if s.state == "ready" and s.slot not in leased),
            key=lambda s: (-s.num_envs, s.slot),
        )
        picked = free if num_envs is None else leases_mod.pick(free, num_envs)
        if not picked:
            raise LeaseError(leases_mod.why_not(self._pool, self._slots, leased, num_envs))
        chosen = sorted(picked, key=lambda s: s.slot)
        now = self._clock()
        lease = leases_mod.Lease(lease_id or uuid.uuid4().hex, trainer,
                                 [s.slot for s in chosen], ttl_s, now + ttl_s, now,
                                 self._next_epoch())
        self._leases[lease.lease_id] = lease
        for s in chosen:
            self._slot_epoch[s.slot] = lease.epoch
        self._leases_changed()
        return {"lease_id": lease.lease_id, "slots": chosen, "pool_info": dict(self._pool_info),
                "epoch": lease.epoch}

    def _regrant(self, lease: leases_mod.Lease, ttl_s: float) -> dict[str, Any]:
        """:meth:`acquire`'s answer for ``lease`` again (the lock held)."""
        if not all(s in self._slots for s in lease.slots):
            # a restarted registry kept the lease, the layout is on its way
            raise LeaseError(f"pool {self._pool!r}: lease granted, waiting for the pool "
                             "server to republish its actors")
        lease.ttl_s = ttl_s
        lease.expires = self._clock() + ttl_s
        return {"lease_id": lease.lease_id, "slots": [self._slots[s] for s in lease.slots],
                "pool_info": dict(self._pool_info), "epoch": lease.epoch}

    def renew(self, lease_id: str, trainer: str, slots: Sequence[int], ttl_s: float,
              epoch: int = 0) -> bool:
        """Extend a lease by ``ttl_s``.

        A lease that expired (or that a restarted registry forgot) is granted again
        when nobody took its actors meanwhile (no later grant on any of its slots);
        False means the actors are gone or someone else's now.
        """
        with self._cond:
            now = self._clock()
            lease = self._leases.get(lease_id)
            if lease is None:
                self._expire()
                taken = self._leased_slots()
                # generation 0: a restarted registry still waiting for the layout
                if any(s in taken or (self._generation and s not in self._slots)
                       or self._slot_epoch.get(s, epoch) != epoch for s in slots):
                    return False
                lease = leases_mod.Lease(lease_id, trainer, list(slots), ttl_s, now, now, epoch)
                self._leases[lease_id] = lease
                for s in slots:
                    self._slot_epoch[s] = epoch
                self._leases_changed()
            lease.ttl_s = ttl_s
            lease.expires = now + ttl_s
            return True

    def release(self, lease_id: str) -> bool:
        """End lease ``lease_id`` (its id is the holder's proof: no one else is told it)."""
        with self._cond:
            found = self._leases.pop(lease_id, None) is not None
            if found:
                self._leases_changed()
            return found

    def request_replace(self, slot: int, actor_id: str, reason: str, lease_id: str) -> bool:
        """Ask the pool server to replace ``slot``'s actor ``actor_id`` (dead or hung).

        Only for the holder of ``slot`` (lease ``lease_id``). Returns False when that
        actor is no longer the slot's (already replaced or removed): the caller can
        pick up the current one right away.

        Raises:
            LeaseLostError: ``lease_id`` does not hold ``slot`` (expired, released,
                or never did).
        """
        with self._cond:
            self._check_holder(lease_id, slot)
            current = self._slots.get(slot)
            if self._generation and (current is None or current.actor_id != actor_id):
                return False
            self._requests[slot] = (actor_id, reason)
            self._cond.notify_all()
            return True

    def wait_for_replacement(self, slot: int, old_actor_id: str, timeout: float,
                             lease_id: str) -> dict[str, Any]:
        """Wait until ``slot`` holds a ready actor other than ``old_actor_id``.

        Returns ``{"slot": SlotInfo}`` when it does, ``{"removed": True}`` when the
        slot was scaled away, ``{"failed": SlotInfo}`` when it is out of restarts,
        ``{"timeout": True, "server_seen_s_ago": ...}`` otherwise.

        Raises:
            LeaseLostError: ``lease_id`` does not hold ``slot`` (any more).
        """
        def settled() -> bool:
            cur = self._slots.get(slot)
            if cur is None:
                return self._generation > 0  # else: no layout yet (a restarted registry)
            return cur.state == "failed" or (cur.actor_id != old_actor_id and cur.state == "ready")

        with self._cond:
            self._check_holder(lease_id, slot)
            self._cond.wait_for(settled, timeout)
            self._check_holder(lease_id, slot)
            cur = self._slots.get(slot)
            if cur is None and self._generation > 0:
                return {"removed": True}
            if cur is not None and cur.state == "failed":
                return {"failed": cur}
            if cur is not None and cur.actor_id != old_actor_id and cur.state == "ready":
                return {"slot": cur}
            seen = None if self._server_seen is None else self._clock() - self._server_seen
            return {"timeout": True, "server_seen_s_ago": seen}

    def ping(self) -> str:
        return self._pool

    # -------------------------------------------------------------- internals
    def _next_epoch(self) -> int:
        self._last_epoch = max(self._last_epoch + 1, self._epoch_clock())
        return self._last_epoch

    def _check_holder(self, lease_id: str, slot: int) -> None:
        self._expire()
        lease = self._leases.get(lease_id)
        if lease is None or slot not in lease.slots:
            raise errors.LeaseLostError(
                f"pool {self._pool!r}: slot {slot} is not held by this trainer's lease (it "
                "expired or was released); attach again")

    def _layout_changed(self) -> None:
        """Kept (the store) before any caller hears of the change; wakes the waiters."""
        self._generation += 1
        self._store.save(registry_store.LAYOUT, registry_store.dump_layout(
            sorted(self._slots.values(), key=lambda s: s.slot), self._pool_info,
            self._generation))
        self._cond.notify_all()

    def _leases_changed(self) -> None:
        """Kept (the store) before any caller hears of the change; wakes the server's sync."""
        self._store.save(registry_store.LEASES, registry_store.dump_book(
            self._leases.values(), self._slot_epoch, self._last_epoch))
        self._lease_version += 1
        self._cond.notify_all()

    def _leased_slots(self) -> dict[int, str]:
        return {s: lease.lease_id for lease in self._leases.values() for s in lease.slots}

    def _lease_summary(self) -> dict[str, Any]:
        return leases_mod.summary(list(self._leases.values()), self._slots,
                                  self._leased_slots(), self._clock())

    def _expire(self) -> None:
        now = self._clock()
        expired = [lease_id for lease_id, lease in self._leases.items() if lease.expires < now]
        for lease_id in expired:
            del self._leases[lease_id]
        if expired:
            self._leases_changed()

_REGISTRY_CLS: Any = None


def remote_class() -> Any:
    """``ray.remote(PoolRegistry)`` as a threaded actor (created once per process)."""
    global _REGISTRY_CLS
    if _REGISTRY_CLS is None:
        import ray

        _REGISTRY_CLS = ray.remote(PoolRegistry)
    return _REGISTRY_CLS


def get_registry(namespace: str) -> Any:
    """The registry actor of the pool in Ray namespace ``namespace``.

    Raises:
        ValueError: no such actor (Ray's own error type for a missing named actor).
    """
    import ray

    return ray.get_actor(REGISTRY_NAME, namespace=namespace)
