"""Lease reclaim (#33): a dead holder's lease released before its ttl; pure parts
(holder identity, the reclaim rule, the old record, the rate-limited watch) and the
lease actor in-process."""

from __future__ import annotations

import json

import pytest

from remote_env.pool import holders, lease_rules, lease_store
from remote_env.pool.lease_actor import LeaseActor
from remote_env.pool.lease_rules import LeaseBook
from remote_env.pool.slot import SlotInfo


def _slots(*sizes: int) -> list[SlotInfo]:
    return [SlotInfo(i, f"host-{i:05d}-g1", f"id{i}-1", n, "ready") for i, n in enumerate(sizes)]


def test_holder_is_the_actor_else_a_drivers_job_else_unknown() -> None:
    assert lease_rules.holder_id("ab12", "01000000", is_driver=False) == "actor:ab12"
    held = lease_rules.holder_id("ab12", "01000000", True, restarts=0)
    assert held == "actor:ab12#0"
    assert lease_rules.actor_holder(held) == ("ab12", 0)
    assert lease_rules.actor_holder("actor:ab12") == ("ab12", None)
    assert lease_rules.holder_id(None, "01000000", is_driver=True) == "job:01000000"
    # a task's worker dies without its job: no identity, the ttl alone ends the lease
    assert lease_rules.holder_id(None, "01000000", is_driver=False) == ""
    assert lease_rules.holders_to_probe([{"holder": "job:1"}, {}, {"holder": "job:1"},
                                         {"holder": "actor:a"}]) == ["job:1", "actor:a"]


def test_reclaim_drops_only_the_dead_holders_leases_and_keeps_the_epochs() -> None:
    book = LeaseBook()
    book.grant("a", [0], ttl_s=60, now=0.0, wall_epoch=5, lease_id="A", holder="actor:x")
    book.grant("b", [1], ttl_s=60, now=0.0, wall_epoch=5, lease_id="B", holder="job:2")
    book.grant("c", [2], ttl_s=60, now=0.0, wall_epoch=5, lease_id="C")  # holder unknown
    gone = book.reclaim({"actor:x", ""})
    assert [x.lease_id for x in gone] == ["A"]
    assert book.leased_slots() == {1: "B", 2: "C"}
    assert book.slot_epochs() == {0: 5, 1: 6, 2: 7} and book.last_epoch == 7  # no bump
    assert book.reclaim({"actor:y"}) == []


def test_an_older_record_without_holders_still_loads() -> None:
    old = json.dumps({"leases": [{"lease_id": "A", "trainer": "a", "slots": [0], "ttl_s": 10,
                                  "epoch": 3}], "slot_epoch": {"0": 3}, "last_epoch": 3})
    book = lease_store.load_book(old, now=1.0)
    assert book.leases[0].holder == "" and book.leases[0].expires == 11.0 + lease_store.RESTORE_GRACE_S
    again = LeaseBook(book.leases)
    again.grant("b", [1], 10, now=1.0, wall_epoch=4, lease_id="B", holder="actor:q")
    doc = lease_store.dump_book(again.leases(), {}, 4)
    assert [x.holder for x in lease_store.load_book(doc, 2.0).leases] == ["", "actor:q"]


def _actor(state: str, restarts: int = 0) -> dict[str, object]:
    return {"State": state, "NumRestarts": restarts, "Pid": 7}


def test_dead_from_tables_needs_rays_definite_word() -> None:
    held = ["actor:a", "actor:b", "actor:c", "actor:gone", "job:01", "job:02", "job:09",
            "node:z"]
    dead = holders.dead_from_tables(
        held, {"a": _actor("DEAD"), "b": _actor("RESTARTING"), "c": _actor("ALIVE")},
        {"01": True, "02": False})
    assert dead == {"actor:a", "job:01"}  # b: no incarnation recorded, only DEAD tells


def test_an_actor_ray_restarted_in_a_new_process_is_a_dead_holder() -> None:
    # RLlib's EnvRunners: Ray restarts the actor under the same id (max_restarts)
    first = "actor:a#0"
    assert not holders.actor_died(first, _actor("ALIVE", 0))
    assert holders.actor_died(first, _actor("RESTARTING", 1))
    assert holders.actor_died(first, _actor("ALIVE", 1))
    # the new incarnation leases in its constructor, while Ray still says RESTARTING
    assert not holders.actor_died("actor:a#1", _actor("RESTARTING", 1))
    assert not holders.actor_died("actor:a#1", _actor("ALIVE", 1))
    assert holders.actor_died("actor:a", _actor("DEAD", 0))
    assert not holders.actor_died("actor:a", _actor("ALIVE", 3))  # no count: only DEAD tells
    assert not holders.actor_died(first, _actor("PENDING_CREATION"))
    assert not holders.actor_died(first, None)


class _Probe:
    def __init__(self, dead: set[str], fail: bool = False) -> None:
        self.dead, self.fail = dead, fail
        self.asked: list[list[str]] = []

    def __call__(self, holders_: list[str]) -> set[str]:
        self.asked.append(holders_)
        if self.fail:
            raise RuntimeError("GCS unavailable")
        return self.dead & set(holders_)


def test_the_watch_is_rate_limited_asks_only_about_known_holders_and_survives_errors() -> None:
    probe = _Probe({"actor:a"})
    watch = holders.HolderWatch(probe, interval_s=2.0)
    leases = [{"holder": "actor:a"}, {"holder": "job:1"}, {"lease_id": "x"}]
    assert watch.dead(leases, now=10.0) == {"actor:a"}
    assert watch.dead(leases, now=11.0) == set()  # not due yet
    assert watch.dead(leases, now=12.0) == {"actor:a"}
    assert probe.asked == [["actor:a", "job:1"]] * 2
    assert watch.dead([{"lease_id": "x"}], now=20.0) == set() and len(probe.asked) == 2
    failing = holders.HolderWatch(_Probe(set(), fail=True), interval_s=0.0)
    assert failing.dead(leases, now=0.0) == set()  # cannot tell: the ttl applies


def test_the_lease_actor_reclaims_a_dead_holders_lease_and_frees_its_actors() -> None:
    store = lease_store.MemoryStore()
    reg = LeaseActor("p", clock=lambda: 100.0, fencer=lambda s, e: None,
                     epoch_clock=lambda: 5, store=store)
    reg.server_sync(_slots(2, 2), {"signature": "s"}, timeout=0)
    a = reg.acquire("a", 2, 60.0, holder="actor:dead")
    b = reg.acquire("b", 2, 60.0, holder="job:live")
    assert reg.layout().leases[0]["holder"] == "actor:dead"
    assert json.loads(store.records["leases"])["leases"][0]["holder"] == "actor:dead"
    gone = reg.reclaim(["actor:dead"])
    assert [(x["lease_id"], x["trainer"], x["holder"]) for x in gone] == [
        (a["lease_id"][:8], "a", "actor:dead")]
    assert reg.reclaim(["actor:dead"]) == []
    # free at once, for a new grant at a newer epoch (the fence refuses the old holder)
    c = reg.acquire("c", 2, 60.0)
    assert [s.slot for s in c["slots"]] == [s.slot for s in a["slots"]]
    assert c["epoch"] > b["epoch"] > a["epoch"]
    # the old holder's renew finds its actors taken
    assert not reg.renew(a["lease_id"], "a", [s.slot for s in a["slots"]], 60.0, a["epoch"])
    assert reg.renew(b["lease_id"], "b", [s.slot for s in b["slots"]], 60.0, b["epoch"])


def test_a_trainer_newer_than_its_pool_leases_without_a_holder() -> None:
    """Mid-upgrade, the pool's lease actor may predate reclaim: its acquire/renew take no
    holder. The trainer leases all the same (its lease then ends with its TTL only)."""
    from remote_env.driver import attach

    seen: list[tuple[object, ...]] = []

    def old_acquire(*args: object) -> str:  # the older signature: four arguments
        seen.append(args)
        if len(args) > 4:
            raise TypeError("too many positional arguments")
        return "granted"

    assert attach._with_holder(old_acquire, ("t", 2, 60.0, "id"), "actor:ab#0") == "granted"
    assert seen == [("t", 2, 60.0, "id", "actor:ab#0"), ("t", 2, 60.0, "id")]

    def broken(*args: object) -> str:
        raise TypeError("unsupported operand type(s)")  # not about the signature

    with pytest.raises(TypeError, match="unsupported operand"):
        attach._with_holder(broken, ("t",), "job:01")


def test_a_job_that_died_with_its_drivers_node_is_left_to_its_ttl() -> None:
    """A Ray client trainer's driver is a server on the head: with GCS fault tolerance
    the head's loss marks its job dead while the trainer steps on (issue 31)."""
    entry = {"JobID": "02000000", "IsDead": True, "DriverIPAddress": "10.0.0.5"}
    assert holders.job_died(entry, {"10.0.0.5", "10.0.0.6"})  # its node lives: it died
    assert not holders.job_died(entry, {"10.0.0.9", "10.0.0.6"})  # the old head is gone
    assert not holders.job_died(dict(entry, IsDead=False), {"10.0.0.5"})
    assert not holders.job_died({"JobID": "03000000", "IsDead": True}, {"10.0.0.5"})


def test_a_renewal_with_a_new_identity_moves_the_holder_and_keeps_it() -> None:
    """A Ray client trainer that connected again after its head's loss is a new job (the
    old one died with the old head): its renewal records the new holder, kept in the
    store (a restarted lease actor has it), so the pool server does not reclaim the lease
    of a trainer that lives on; a renewal without an identity changes nothing."""
    store = lease_store.MemoryStore()
    reg = LeaseActor("p", clock=lambda: 100.0, fencer=lambda s, e: None,
                     epoch_clock=lambda: 5, store=store)
    reg.server_sync(_slots(2), {"signature": "s"}, timeout=0)
    a = reg.acquire("a", 2, 60.0, holder="job:01000000")
    slots = [s.slot for s in a["slots"]]
    assert reg.renew(a["lease_id"], "a", slots, 60.0, a["epoch"], "job:05000000")
    assert reg.reclaim(["job:01000000"]) == []
    assert reg.renew(a["lease_id"], "a", slots, 60.0, a["epoch"])
    restarted = LeaseActor("p", clock=lambda: 200.0, fencer=lambda s, e: None,
                           epoch_clock=lambda: 6, store=store)
    assert [x["holder"] for x in restarted.layout().leases] == ["job:05000000"]


def test_a_restarted_lease_actor_answers_a_renewal_from_its_rebuilt_leases() -> None:
    """The restore comes before any answer (the constructor reads the store): the first
    renewal a restarted lease actor gets finds the lease, never "gone", and a second
    trainer cannot take its envs meanwhile."""
    store = lease_store.MemoryStore()
    reg = LeaseActor("p", clock=lambda: 100.0, fencer=lambda s, e: None,
                     epoch_clock=lambda: 5, store=store)
    reg.server_sync(_slots(2, 2), {"signature": "s"}, timeout=0)
    a = reg.acquire("a", 2, 60.0, holder="job:01000000")
    restarted = LeaseActor("p", clock=lambda: 500.0, fencer=lambda s, e: None,
                           epoch_clock=lambda: 6, store=store)
    b = restarted.acquire("b", 2, 60.0)
    assert {s.slot for s in b["slots"]}.isdisjoint(s.slot for s in a["slots"])
    assert restarted.renew(a["lease_id"], "a", [s.slot for s in a["slots"]], 60.0, a["epoch"])
    with pytest.raises(lease_rules.LeaseError):
        restarted.acquire("c", 2, 60.0)
