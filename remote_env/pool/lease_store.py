"""What the pool's lease actor keeps outside itself, so that its restart loses nothing.

Ray restarts a crashed lease actor (:class:`~remote_env.pool.lease_actor.LeaseActor`,
``max_restarts=-1``) empty. It writes two records to a :class:`LeaseStore` and reads
them back when it starts:

* the lease book (:class:`Book`: leases, the epoch each slot was last granted at,
  the last epoch), written before any caller hears of a change, so a live
  trainer keeps its envs and nobody else is granted them;
* the layout the pool server last published (:class:`StoredLayout`), so a pool server
  that restarts with it (the head pod) still finds every slot, those in restart
  backoff included. The pool server stays its owner: it republishes on restart.

In a Ray cluster the store is Ray's GCS key-value store (:class:`RayKVStore`),
which outlives the actor, and, with GCS fault tolerance, the head; Ray Serve's
controller keeps its checkpoints the same way. The records are JSON, read and
written by pure functions here.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final, Protocol

from remote_env.pool.lease_rules import Lease
from remote_env.pool.slot import SlotInfo

LEASES: Final = "leases"
LAYOUT: Final = "layout"


class LeaseStore(Protocol):
    """Named text records (``LEASES``, ``LAYOUT``) kept outside the lease actor."""

    def load(self, record: str) -> str | None: ...

    def save(self, record: str, doc: str) -> None: ...


class MemoryStore:
    """A :class:`LeaseStore` in memory: in-process tests, or shared by several
    :class:`~remote_env.pool.lease_actor.LeaseActor` objects to play a restart."""

    def __init__(self) -> None:
        self.records: dict[str, str] = {}

    def load(self, record: str) -> str | None:
        return self.records.get(record)

    def save(self, record: str, doc: str) -> None:
        self.records[record] = doc


#: Ray KV namespace of the lease actors' records; the key is ``<pool's Ray
#: namespace>/<record>``. Named after the lease actor's old name, and kept: a pool
#: server of this version reads what one of an older version wrote.
KV_NAMESPACE: Final = "envpool-registry"


@dataclasses.dataclass(frozen=True)
class RayKVStore:
    """A :class:`LeaseStore` in Ray's GCS key-value store."""

    prefix: str

    def load(self, record: str) -> str | None:
        from ray.experimental import internal_kv

        raw = internal_kv._internal_kv_get(f"{self.prefix}/{record}", namespace=KV_NAMESPACE)
        return None if raw is None else raw.decode()

    def save(self, record: str, doc: str) -> None:
        from ray.experimental import internal_kv

        internal_kv._internal_kv_put(f"{self.prefix}/{record}", doc, overwrite=True,
                                     namespace=KV_NAMESPACE)

    def clear(self) -> None:
        """Forget the pool (it is destroyed)."""
        from ray.experimental import internal_kv

        for record in (LEASES, LAYOUT):
            internal_kv._internal_kv_del(f"{self.prefix}/{record}", namespace=KV_NAMESPACE)


# ------------------------------------------------------------------ leases
@dataclasses.dataclass(frozen=True)
class Book:
    """The leases, the epoch each slot was last granted at (the actors' fences) and
    the last epoch handed out."""

    leases: tuple[Lease, ...] = ()
    slot_epoch: Mapping[int, int] = dataclasses.field(default_factory=dict)
    last_epoch: int = 0


def dump_book(leases: Iterable[Lease], slot_epoch: Mapping[int, int], last_epoch: int) -> str:
    return json.dumps({
        "leases": [{"lease_id": x.lease_id, "trainer": x.trainer, "slots": list(x.slots),
                    "ttl_s": x.ttl_s, "epoch": x.epoch, "holder": x.holder} for x in leases],
        "slot_epoch": {str(s): e for s, e in slot_epoch.items()},
        "last_epoch": last_epoch,
    })


#: How much longer than its ttl a lease read back by a restarted lease actor runs
#: before its first renewal. The actor restarts with the head pod (its loss under GCS
#: fault tolerance), and a Ray client trainer must connect to the new head before it
#: can renew: Ray client's own reconnect tries for 30 s, and the new head's proxier
#: sometimes fails to start the client's server ("SpecificServer startup failed") and
#: answers only after its 30 s channel timeout. On the test cluster's real node one
#: trainer that stepped on with 0 errors went 108 s without a renewal (60 s ttl): its
#: lease ran out meanwhile. Once renewed, a lease runs on its ttl alone.
RESTORE_GRACE_S: Final = 120.0


def load_book(doc: str | None, now: float, grace_s: float = RESTORE_GRACE_S) -> Book:
    """The :class:`Book` in ``doc``. Each lease runs its ttl plus ``grace_s`` from
    ``now``: when it was last renewed is not kept (a renewal writes nothing), so its
    holder gets the benefit of the doubt, and the time to reach the restarted actor
    (:data:`RESTORE_GRACE_S`)."""
    if not doc:
        return Book()
    raw = json.loads(doc)
    # "holder" came later: an older record's leases have none (ttl only)
    leases = tuple(Lease(x["lease_id"], x["trainer"], [int(s) for s in x["slots"]],
                         float(x["ttl_s"]), now + float(x["ttl_s"]) + grace_s, now,
                         int(x["epoch"]), str(x.get("holder") or ""))
                   for x in raw.get("leases", []))
    return Book(leases, {int(s): int(e) for s, e in raw.get("slot_epoch", {}).items()},
                int(raw.get("last_epoch", 0)))


# ------------------------------------------------------------------ layout
@dataclasses.dataclass(frozen=True)
class StoredLayout:
    """The pool server's last published layout and pool info; generation 0: none."""

    slots: tuple[SlotInfo, ...] = ()
    pool_info: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    generation: int = 0


_SLOT_FIELDS: Final = frozenset(f.name for f in dataclasses.fields(SlotInfo))


def dump_layout(slots: Sequence[SlotInfo], pool_info: Mapping[str, Any], generation: int) -> str:
    return json.dumps({"slots": [dataclasses.asdict(s) for s in slots],
                       "pool_info": dict(pool_info), "generation": generation}, default=str)


def load_layout(doc: str | None) -> StoredLayout:
    if not doc:
        return StoredLayout()
    raw = json.loads(doc)
    slots = tuple(SlotInfo(**{k: v for k, v in s.items() if k in _SLOT_FIELDS})
                  for s in raw.get("slots", []))
    return StoredLayout(slots, dict(raw.get("pool_info", {})), int(raw.get("generation", 0)))
