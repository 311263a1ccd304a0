"""The pool's lease actor: which env actors exist and which trainer leases which.

One named, detached actor per pool (:data:`LEASE_ACTOR_NAME` in the pool's Ray
namespace), so it outlives both trainers and the pool server: a restarted pool
server finds its layout and leases here, a trainer finds the actors here. The
lease rules themselves are pure (:mod:`remote_env.pool.lease_rules`); this actor
holds a :class:`~remote_env.pool.lease_rules.LeaseBook`, the published layout, the
replacement requests, the lock the long-polls wait on and the store.

* The pool server publishes the layout (slot -> actor name, envs, state) and
  picks up replacement requests with one long-poll per supervision tick
  (:meth:`LeaseActor.server_sync`).
* Trainers :meth:`~LeaseActor.acquire` a lease on whole actors (one Ray call
  steps all envs of an actor, so an actor is the unit two trainers must not
  share), :meth:`~LeaseActor.renew` it on a heartbeat and
  :meth:`~LeaseActor.release` it on close. A lease not renewed within its
  ``ttl_s`` expires and its actors return to the pool.
* A trainer whose actor died asks for a replacement
  (:meth:`~LeaseActor.request_replace`) and waits for the pool server to
  publish it (:meth:`~LeaseActor.wait_for_replacement`): the pool server is
  the one owner of restarts.

Leases are fenced. Each grant gets an epoch larger than any before it (from the
wall clock, so a restarted lease actor keeps counting up); the lease actor raises the
fence of every leased actor to it before the grant returns, and trainers send
their epoch with every host call (:meth:`remote_env.actor.host.SubEnvHost.fenced`), so
a trainer that resumes after its lease went to someone else gets
``LeaseLostError`` from the actor itself, not a step of another trainer's env.
Only the holder (who knows the lease id, shown nowhere else) can release a lease
or ask for its actors to be replaced.

The leases and the published layout survive a restart of the lease actor itself
(Ray restarts it empty): they are written to a
:class:`~remote_env.pool.lease_store.LeaseStore` (Ray's GCS key-value store)
before any caller hears of a change, and read back when it starts.

A plain class (threaded Ray actor: the long-polls block a thread each), so it is
unit-tested in-process with a fake clock.
"""


from __future__ import annotations

import dataclasses
import functools
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final, NamedTuple

from remote_env import errors
from remote_env.pool import lease_rules, lease_store
from remote_env.pool.lease_rules import LeaseError
from remote_env.pool.slot import SlotInfo

__all__ = ["LEASE_ACTOR_NAME", "LeaseActor", "LeaseError", "PoolLayout", "Replacement",
           "ServerSync", "get_lease_actor", "remote_class"]

#: The actor's name in the pool's Ray namespace. Its old name, kept: trainers and
#: pool servers of other versions find the same actor.
LEASE_ACTOR_NAME: Final = "envpool-registry"
#: Threads of the lease actor: long-polls (pool server, trainers waiting for a
#: replacement) each hold one while they wait.
LEASE_ACTOR_CONCURRENCY: Final = 64


class Replacement(NamedTuple):
    """A trainer's request to replace ``slot``'s actor ``actor_id`` (dead or hung)."""

    slot: int
    actor_id: str
    reason: str


@dataclasses.dataclass(frozen=True)
class ServerSync:
    """:meth:`LeaseActor.server_sync`'s answer to the pool server."""

    #: replacement requests taken (each is handed out once)
    requests: list[Replacement]
    #: the layout's generation: goes up on every change, 0 before any layout
    generation: int
    #: the leases, ids shortened (:func:`~remote_env.pool.lease_rules.summary`)
    leases: list[dict[str, Any]]
    #: slot -> shortened id of the lease holding it
    leased_slots: dict[int, str]

    @classmethod
    def read(cls, reply: ServerSync | Mapping[str, Any]) -> ServerSync:
        """The answer of a lease actor of this version, or the dict an older version's
        (a local pool server restarted on a new release while Ray kept the old actor)."""
        if isinstance(reply, ServerSync):
            return reply
        return cls([Replacement(*r) for r in reply["requests"]], int(reply["generation"]),
                   list(reply["leases"]), dict(reply["leased_slots"]))


@dataclasses.dataclass(frozen=True)
class PoolLayout:
    """:meth:`LeaseActor.layout`: everything a (re)starting pool server or a status
    page needs."""

    pool: str
    slots: list[SlotInfo]
    pool_info: dict[str, Any]
    #: seconds since the pool server last synced (None: never, since this actor started)
    server_seen_s_ago: float | None
    leases: list[dict[str, Any]]
    leased_slots: dict[int, str]

    @classmethod
    def read(cls, reply: PoolLayout | Mapping[str, Any]) -> PoolLayout:
        """As :meth:`ServerSync.read`."""
        if isinstance(reply, PoolLayout):
            return reply
        return cls(str(reply.get("pool", "")), list(reply.get("slots", [])),
                   dict(reply.get("pool_info", {})), reply.get("server_seen_s_ago"),
                   list(reply.get("leases", [])), dict(reply.get("leased_slots", {})))


class LeaseActor:
    """Layout and leases of one pool. Thread-safe; every method is one Ray call.

    Owns the published layout (slots, pool info, its generation), the replacement
    requests, when the pool server was last seen and the lock; the leases are its
    :class:`~remote_env.pool.lease_rules.LeaseBook`'s. Trainer-facing answers are
    plain dicts (trainers of other versions read them); the pool server's are typed
    (:class:`ServerSync`, :class:`PoolLayout`).
    """

    def __init__(self, pool: str, clock: Callable[[], float] = time.monotonic,
                 fencer: lease_rules.Fencer | None = None,
                 epoch_clock: Callable[[], int] = time.time_ns,
                 ray_namespace: str | None = None,
                 store: lease_store.LeaseStore | None = None,
                 restore_grace_s: float = lease_store.RESTORE_GRACE_S) -> None:
        self._pool = pool
        self._clock = clock
        self._fencer = fencer if fencer is not None else functools.partial(
            ray_fencer, namespace=ray_namespace)
        self._epoch_clock = epoch_clock
        # The leases (and the published layout) are kept across this actor's own
        # restart (Ray restarts it empty): a trainer stepping through the restart must
        # keep its envs, and a second trainer attaching meanwhile must not get them.
        self._store = store if store is not None else lease_store.MemoryStore()
        # ... and a lease read back waits its ttl plus restore_grace_s for its first
        # renewal: its trainer must reach this restarted actor first (a new head).
        book = lease_store.load_book(self._store.load(lease_store.LEASES), clock(),
                                     restore_grace_s)
        self._book = lease_rules.LeaseBook(book.leases, book.slot_epoch, book.last_epoch)
        self._cond = threading.Condition()
        layout = lease_store.load_layout(self._store.load(lease_store.LAYOUT))
        self._slots: dict[int, SlotInfo] = {s.slot: s for s in layout.slots}
        self._pool_info: dict[str, Any] = dict(layout.pool_info)
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
    ) -> ServerSync:
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
            requests = [Replacement(slot, aid, reason)
                        for slot, (aid, reason) in self._requests.items()]
            self._requests.clear()
            self._expire()
            summary = self._lease_summary()
            return ServerSync(requests, self._generation, summary["leases"],
                              summary["leased_slots"])

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
            leased = self._book.leased_slots()
            out = [s for s in slots if s not in leased]
            if [s for s in out if self._slots.pop(s, None) is not None]:
                self._layout_changed()
            return out

    def layout(self) -> PoolLayout:
        """Everything a (re)starting pool server or a status page needs."""
        with self._cond:
            self._expire()
            seen = None if self._server_seen is None else self._clock() - self._server_seen
            summary = self._lease_summary()
            return PoolLayout(self._pool, sorted(self._slots.values(), key=lambda s: s.slot),
                              dict(self._pool_info), seen, summary["leases"],
                              summary["leased_slots"])

    # --------------------------------------------------------------- trainers
    def acquire(self, trainer: str, num_envs: int | None, ttl_s: float,
                lease_id: str | None = None, holder: str = "") -> dict[str, Any]:
        """Lease free, ready actors holding exactly ``num_envs`` envs (all free ones if None).

        ``lease_id`` (the caller's, secret; a new one if None) makes a retry safe: a
        call whose answer was lost (the lease actor restarted meanwhile; Ray cannot
        say whether it ran) asked again gets the lease it was granted, not a second one.
        ``holder`` is the caller's Ray identity
        (:func:`~remote_env.pool.lease_rules.holder_id`; "" unknown): the pool server
        reclaims the lease when Ray says it died (:meth:`reclaim`).

        Returns ``{"lease_id", "slots": [SlotInfo], "pool_info", "epoch"}``.

        Raises:
            LeaseError: not enough free envs, or no subset of free actors adds up
                to ``num_envs`` (actors are leased whole).
        """
        lease_rules.check_request(num_envs, ttl_s)
        with self._cond:
            self._expire()
            granted = self._book.get(lease_id) if lease_id is not None else None
            answer = (self._regrant(granted, ttl_s) if granted is not None
                      else self._grant(trainer, num_envs, ttl_s, lease_id, holder))
        # Outside the lock (a Ray call per actor); before returning, so the previous
        # holder's calls are refused before the new holder's first one.
        self._fencer(answer["slots"], answer["epoch"])
        return answer

    def _grant(self, trainer: str, num_envs: int | None, ttl_s: float,
               lease_id: str | None, holder: str) -> dict[str, Any]:
        """A new lease (the lock held)."""
        leased = self._book.leased_slots()
        chosen = lease_rules.choose(self._slots.values(), leased, num_envs,
                                    self._pool_info.get("revision"))
        if chosen is None:
            raise LeaseError(lease_rules.why_not(self._pool, self._slots, leased, num_envs))
        lease = self._book.grant(trainer, [s.slot for s in chosen], ttl_s, self._clock(),
                                 self._epoch_clock(), lease_id, holder)
        self._leases_changed()
        return {"lease_id": lease.lease_id, "slots": chosen, "pool_info": dict(self._pool_info),
                "epoch": lease.epoch}

    def _regrant(self, lease: lease_rules.Lease, ttl_s: float) -> dict[str, Any]:
        """:meth:`acquire`'s answer for ``lease`` again (the lock held)."""
        if not all(s in self._slots for s in lease.slots):
            # a restarted lease actor kept the lease, the layout is on its way
            raise LeaseError(f"pool {self._pool!r}: lease granted, waiting for the pool "
                             "server to republish its actors")
        self._book.extend(lease, ttl_s, self._clock())
        return {"lease_id": lease.lease_id, "slots": [self._slots[s] for s in lease.slots],
                "pool_info": dict(self._pool_info), "epoch": lease.epoch}

    def renew(self, lease_id: str, trainer: str, slots: Sequence[int], ttl_s: float,
              epoch: int = 0, holder: str = "") -> bool:
        """Extend a lease by ``ttl_s``.

        A lease that expired (or that a restarted lease actor forgot) is granted again
        when nobody took its actors meanwhile (no later grant on any of its slots);
        False means the actors are gone or someone else's now. ``holder`` (the caller's
        Ray identity now) replaces the one recorded: a Ray client trainer that connected
        again after the head's loss is a new job, and the old one is dead.
        """
        with self._cond:
            now = self._clock()
            lease = self._book.get(lease_id)
            if lease is None:
                self._expire()
                # generation 0: a restarted lease actor still waiting for the layout
                lease = self._book.regrant(lease_id, trainer, slots, ttl_s, epoch, now,
                                           present=self._slots if self._generation else None,
                                           holder=holder)
                if lease is None:
                    return False
                self._leases_changed()
            elif self._book.rehold(lease, holder):
                self._leases_changed()  # kept: a restarted lease actor must not reclaim it
            self._book.extend(lease, ttl_s, now)
            return True

    def lease_of(self, lease_id: str) -> dict[str, Any] | None:
        """A lease's epoch and its actors now, ``{"epoch", "slots": [SlotInfo]}``; None:
        no such lease (released, expired, never granted). The relay's check that a
        connection is for a current actor of a lease its caller holds."""
        with self._cond:
            self._expire()
            lease = self._book.get(lease_id)
            if lease is None:
                return None
            return {"epoch": lease.epoch,
                    "slots": [self._slots[s] for s in lease.slots if s in self._slots]}

    def release(self, lease_id: str) -> bool:
        """End lease ``lease_id`` (its id is the holder's proof: no one else is told it)."""
        with self._cond:
            found = self._book.release(lease_id)
            if found:
                self._leases_changed()
            return found

    def reclaim(self, dead: Sequence[str]) -> list[dict[str, Any]]:
        """Release the leases whose holders Ray says died (the pool server's word, from
        :func:`~remote_env.pool.holders.probe`), so their envs are free at once rather
        than after their ttl. Returns their summaries (ids shortened).

        Nothing else changes: the actors keep their fences until the next grant
        raises them, which is what refuses a holder that was only paused.
        """
        with self._cond:
            gone = self._book.reclaim(set(dead))
            if not gone:
                return []
            self._leases_changed()
            shown: list[dict[str, Any]] = lease_rules.summary(gone, self._slots, {},
                                                              self._clock())["leases"]
            return shown

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
                return self._generation > 0  # else: no layout yet (a restarted lease actor)
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
    def _check_holder(self, lease_id: str, slot: int) -> None:
        self._expire()
        if not self._book.holds(lease_id, slot):
            raise errors.LeaseLostError(
                f"pool {self._pool!r}: slot {slot} is not held by this trainer's lease (it "
                "expired or was released); attach again")

    def _layout_changed(self) -> None:
        """Kept (the store) before any caller hears of the change; wakes the waiters."""
        self._generation += 1
        self._store.save(lease_store.LAYOUT, lease_store.dump_layout(
            sorted(self._slots.values(), key=lambda s: s.slot), self._pool_info,
            self._generation))
        self._cond.notify_all()

    def _leases_changed(self) -> None:
        """Kept (the store) before any caller hears of the change; wakes the server's sync."""
        self._store.save(lease_store.LEASES, lease_store.dump_book(
            self._book.leases(), self._book.slot_epochs(), self._book.last_epoch))
        self._lease_version += 1
        self._cond.notify_all()

    def _lease_summary(self) -> dict[str, Any]:
        return self._book.summary(self._slots, self._clock())

    def _expire(self) -> None:
        if self._book.expire(self._clock()):
            self._leases_changed()


_REMOTE_CLS: Any = None


def remote_class() -> Any:
    """``ray.remote(LeaseActor)`` as a threaded actor (created once per process)."""
    global _REMOTE_CLS
    if _REMOTE_CLS is None:
        import ray

        _REMOTE_CLS = ray.remote(LeaseActor)
    return _REMOTE_CLS


def get_lease_actor(namespace: str) -> Any:
    """The lease actor of the pool in Ray namespace ``namespace``.

    Raises:
        ValueError: no such actor (Ray's own error type for a missing named actor).
    """
    import ray

    return ray.get_actor(LEASE_ACTOR_NAME, namespace=namespace)


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
        ray.wait(refs, num_returns=len(refs), timeout=lease_rules.FENCE_TIMEOUT_S)
