"""remote_env.pool.lease_actor in-process, with a fake clock: leases and replacements."""

from __future__ import annotations

import threading
from collections.abc import Sequence

import pytest

from remote_env.errors import LeaseLostError
from remote_env.pool.lease_actor import LeaseActor, LeaseError
from remote_env.pool.slot import SlotInfo


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def _slots(*sizes: int, state: str = "ready") -> list[SlotInfo]:
    return [SlotInfo(i, f"host-{i:05d}-g1", f"id{i}-1", n, state) for i, n in enumerate(sizes)]  # type: ignore[arg-type]


class Fences:
    """Records what the registry fences (the actors' side in a real pool)."""

    def __init__(self) -> None:
        self.calls: list[tuple[list[str], int]] = []

    def __call__(self, slots: Sequence[SlotInfo], epoch: int) -> None:
        self.calls.append(([s.actor_name for s in slots], epoch))


def _registry(*sizes: int, fences: Fences | None = None,
              wall: list[int] | None = None) -> tuple[LeaseActor, Clock]:
    clock = Clock()
    wall_clock = (lambda: wall[0]) if wall is not None else (lambda: 5)
    reg = LeaseActor("p", clock=clock, fencer=fences or Fences(), epoch_clock=wall_clock)
    reg.server_sync(_slots(*sizes), {"signature": "s"}, timeout=0)
    return reg, clock


def test_leases_are_disjoint_and_whole_actors() -> None:
    reg, _ = _registry(2, 2, 2)
    a = reg.acquire("a", 2, ttl_s=10)
    b = reg.acquire("b", 4, ttl_s=10)
    got_a = {s.slot for s in a["slots"]}
    got_b = {s.slot for s in b["slots"]}
    assert got_a.isdisjoint(got_b) and got_a | got_b == {0, 1, 2}
    assert a["pool_info"] == {"signature": "s"}
    with pytest.raises(LeaseError, match=r"cannot lease num_envs=1: 0 free \(6 leased\)"):
        reg.acquire("c", 1, ttl_s=10)
    assert reg.release(a["lease_id"]) and not reg.release(a["lease_id"])
    assert {s.slot for s in reg.acquire("c", None, ttl_s=10)["slots"]} == got_a


def test_num_envs_must_be_a_sum_of_free_actor_sizes() -> None:
    reg, _ = _registry(4, 4, 2)
    assert [s.slot for s in reg.acquire("a", 6, ttl_s=10)["slots"]] == [0, 2]
    with pytest.raises(LeaseError, match=r"4 free .*hold \[4\] envs: ask for a sum of those"):
        reg.acquire("b", 3, ttl_s=10)
    with pytest.raises(LeaseError, match="num_envs must be >= 1"):
        reg.acquire("b", 0, ttl_s=10)
    with pytest.raises(LeaseError, match="ttl_s must be > 0"):
        reg.acquire("b", 4, ttl_s=0)


@pytest.mark.parametrize(("sizes", "want", "slots"), [
    ((6, 4, 4), 8, [1, 2]),          # largest first (6) leaves 2: no actor of 2
    ((5, 3, 3, 2), 8, [0, 1]),       # largest first works: 5 + 3
    ((7, 5, 3, 3), 6, [2, 3]),
    ((8, 8, 3), 11, [0, 2]),
    ((9, 6, 6, 6), 18, [1, 2, 3]),
])
def test_any_exact_sum_of_free_actors_is_leased(sizes: tuple[int, ...], want: int,
                                                 slots: list[int]) -> None:
    reg, _ = _registry(*sizes)
    lease = reg.acquire("a", want, ttl_s=10)
    assert [s.slot for s in lease["slots"]] == slots
    assert sum(s.num_envs for s in lease["slots"]) == want


def test_no_exact_sum_is_refused_with_the_free_sizes() -> None:
    reg, _ = _registry(6, 4, 4)
    for want in (2, 3, 5, 7, 9, 11, 13):
        with pytest.raises(LeaseError, match=r"hold \[6, 4, 4\] envs: ask for a sum of those"):
            reg.acquire("a", want, ttl_s=10)
    with pytest.raises(LeaseError, match=r"cannot lease num_envs=15: 14 free \(14 ready\)$"):
        reg.acquire("a", 15, ttl_s=10)
    assert [s.slot for s in reg.acquire("a", 14, ttl_s=10)["slots"]] == [0, 1, 2]


def test_only_ready_actors_are_leased() -> None:
    clock = Clock()
    reg = LeaseActor("p", clock=clock)
    reg.server_sync(_slots(2, 2, state="starting"), None, timeout=0)
    with pytest.raises(LeaseError, match=r"0 free \(4 starting\)"):
        reg.acquire("a", None, ttl_s=10)


def test_a_lease_expires_without_heartbeats_and_revives_if_untouched() -> None:
    reg, clock = _registry(2, 2)
    a = reg.acquire("a", 2, ttl_s=5)
    slots_a = [s.slot for s in a["slots"]]
    clock.t += 4
    assert reg.renew(a["lease_id"], "a", slots_a, 5, a["epoch"])  # heartbeat in time
    clock.t += 5.5
    assert reg.layout().leases == []  # expired
    # nobody took the envs: a late heartbeat gets them back
    assert reg.renew(a["lease_id"], "a", slots_a, 5, a["epoch"])
    assert [lease["trainer"] for lease in reg.layout().leases] == ["a"]
    clock.t += 6
    b = reg.acquire("b", 4, ttl_s=5)  # a expired again; b takes everything
    assert len(b["slots"]) == 2
    assert not reg.renew(a["lease_id"], "a", slots_a, 5, a["epoch"])


def test_every_grant_fences_its_actors_with_a_larger_epoch_before_it_returns() -> None:
    fences = Fences()
    wall = [100]
    reg, clock = _registry(2, 2, fences=fences, wall=wall)
    a = reg.acquire("a", 2, ttl_s=5)
    assert fences.calls == [(["host-00000-g1"], a["epoch"])] and a["epoch"] == 100
    clock.t += 6  # a expires
    wall[0] = 50  # the wall clock stepped back: epochs still grow
    b = reg.acquire("b", 2, ttl_s=5)
    assert b["slots"] == a["slots"] and b["epoch"] == 101
    assert fences.calls[-1] == (["host-00000-g1"], 101)
    # a registry restarted later counts on from the wall clock, above the old epochs
    fresh = LeaseActor("p", clock=clock, fencer=fences, epoch_clock=lambda: 10**18)
    fresh.server_sync(_slots(2, 2), None, timeout=0)
    assert fresh.acquire("c", 2, ttl_s=5)["epoch"] > b["epoch"]


def test_a_lapsed_lease_does_not_revive_over_a_later_one() -> None:
    reg, clock = _registry(2)
    a = reg.acquire("a", 2, ttl_s=5)
    clock.t += 6
    b = reg.acquire("b", 2, ttl_s=5)  # takes a's actor after a lapsed ...
    assert reg.release(b["lease_id"])  # ... and gives it back
    # nothing is leased now, but a's epoch is older than the actor's fence: no revival
    assert not reg.renew(a["lease_id"], "a", [0], 5, a["epoch"])


def test_only_the_holder_releases_or_replaces() -> None:
    reg, _ = _registry(2, 2)
    a = reg.acquire("a", 2, ttl_s=10)
    b = reg.acquire("b", 2, ttl_s=10)
    (slot_a,) = [s.slot for s in a["slots"]]
    (slot_b,) = [s.slot for s in b["slots"]]
    # what /status shows is not enough to act on a lease
    shown = {lease["lease_id"] for lease in reg.layout().leases}
    assert shown == {a["lease_id"][:8], b["lease_id"][:8]}
    assert set(reg.layout().leased_slots.values()) == shown
    for short in shown:
        assert not reg.release(short)
    with pytest.raises(LeaseLostError, match=f"slot {slot_b} is not held by this trainer"):
        reg.request_replace(slot_b, f"id{slot_b}-1", "actor_died", a["lease_id"])
    with pytest.raises(LeaseLostError):
        reg.wait_for_replacement(slot_b, f"id{slot_b}-1", 0, a["lease_id"])
    assert reg.server_sync(None, None, timeout=0).requests == []  # nothing reached it
    assert reg.request_replace(slot_a, f"id{slot_a}-1", "actor_died", a["lease_id"])
    assert reg.release(a["lease_id"])
    with pytest.raises(LeaseLostError):  # released: not the holder any more
        reg.request_replace(slot_a, f"id{slot_a}-1", "actor_died", a["lease_id"])


def test_replacement_requests_reach_the_server_and_trainers_wait_for_the_new_actor() -> None:
    reg, _ = _registry(2, 2)
    lease = reg.acquire("a", 4, ttl_s=100)["lease_id"]
    assert not reg.request_replace(0, "stale-id", "actor_died", lease)  # not the slot's actor
    results: list[dict[str, object]] = []
    waiter = threading.Thread(target=lambda: results.append(
        reg.wait_for_replacement(1, "id1-1", timeout=10, lease_id=lease)))
    waiter.start()
    assert reg.request_replace(1, "id1-1", "timeout", lease)
    sync = reg.server_sync(None, None, timeout=10)  # returns at once: a request is waiting
    assert sync.requests == [(1, "id1-1", "timeout")]
    new = _slots(2, 2)
    new[1] = SlotInfo(1, "host-00001-g2", "id1-2", 2, "starting")
    reg.server_sync(new, None, timeout=0)
    assert waiter.is_alive()  # not ready yet
    new[1] = SlotInfo(1, "host-00001-g2", "id1-2", 2, "ready")
    reg.server_sync(new, None, timeout=0)
    waiter.join(5)
    assert results == [{"slot": new[1]}]
    assert reg.wait_for_replacement(0, "id0-1", timeout=0, lease_id=lease) == {
        "timeout": True, "server_seen_s_ago": 0.0}
    reg.server_sync(new[1:], None, timeout=0)
    assert reg.wait_for_replacement(0, "id0-1", timeout=0, lease_id=lease) == {"removed": True}


def test_a_restarted_registry_waits_for_the_layout_instead_of_failing_trainers() -> None:
    reg = LeaseActor("p", clock=Clock(), fencer=Fences())  # empty, as after a crash
    assert reg.renew("lease-1", "a", [0, 1], 5, 7)  # cannot check slots yet: keep the lease
    assert reg.request_replace(0, "id0-1", "actor_died", "lease-1")
    assert reg.wait_for_replacement(0, "id0-1", timeout=0, lease_id="lease-1")["timeout"] is True
    assert reg.server_sync(_slots(2, 2), None, timeout=0).requests == [
        (0, "id0-1", "actor_died")]


def test_env_resource_required_places_by_it_without_asking_ray() -> None:
    # the operator's pool servers start before any worker pod has joined: asking the
    # cluster then found no env resource, and actors were placed by CPU (two per pod)
    from remote_env.pool.launch import ActorLauncher

    required = ActorLauncher(ray_namespace="ns", actor_options={}, env_resource=True)
    assert required.has_env_resource() is True  # no Ray connected: it did not ask


# ------------------------------------------- the registry's own restart (#28)
def test_leases_survive_a_restart_of_the_registry() -> None:
    """Ray restarts a crashed registry empty; its store gives the leases back, so a
    second trainer is not granted the envs of a live one that has not renewed yet."""
    from remote_env.pool.lease_store import MemoryStore

    store, clock, fences = MemoryStore(), Clock(), Fences()
    reg = LeaseActor("p", clock=clock, fencer=fences, epoch_clock=lambda: 5, store=store)
    reg.server_sync(_slots(2, 2), {"signature": "s"}, timeout=0)
    a = reg.acquire("a", 2, ttl_s=30)

    clock.t += 25  # a's lease has 5 s left; the restart gives it a full ttl again
    again = LeaseActor("p", clock=clock, fencer=fences, epoch_clock=lambda: 5, store=store)
    # the layout is kept too: what a restarted pool server adopts, what B is granted from
    layout = again.layout()
    assert layout.slots == _slots(2, 2) and layout.pool_info == {"signature": "s"}
    b = again.acquire("b", 2, ttl_s=30)
    assert b["pool_info"] == {"signature": "s"}
    assert {s.slot for s in b["slots"]}.isdisjoint(s.slot for s in a["slots"])
    assert b["epoch"] > a["epoch"]  # epochs count on from the store
    with pytest.raises(LeaseError, match=r"0 free \(4 leased\)"):
        again.acquire("c", 2, ttl_s=30)
    assert again.renew(a["lease_id"], "a", [s.slot for s in a["slots"]], 30, a["epoch"])
    (slot_a,) = [s.slot for s in a["slots"]]
    assert again.request_replace(slot_a, f"id{slot_a}-1", "actor_died", a["lease_id"])
    clock.t += 29  # a full ttl from the restart: still a's
    assert again.layout().leased_slots[slot_a] == a["lease_id"][:8]
    assert again.release(a["lease_id"])
    # a release is kept too, and so is a withdrawal (scale-down)
    assert again.withdraw([0, 1]) == [slot_a]
    third = LeaseActor("p", clock=clock, fencer=fences, epoch_clock=lambda: 5, store=store)
    assert sorted(lease["trainer"] for lease in third.layout().leases) == ["b"]
    assert [s.slot for s in third.layout().slots] == [1 - slot_a]


def test_a_restored_lease_waits_ttl_plus_the_grace_for_its_first_renewal() -> None:
    """A lease read back by a restarted lease actor (the head pod's loss) runs its ttl
    plus RESTORE_GRACE_S before its first renewal: its Ray client trainer must connect
    to the new head first (seen on the real node: 108 s without a renewal, 60 s ttl).
    Once renewed it runs on its ttl alone, and an unrenewed one still ends."""
    from remote_env.pool.lease_store import RESTORE_GRACE_S, MemoryStore

    store, clock, fences = MemoryStore(), Clock(), Fences()
    reg = LeaseActor("p", clock=clock, fencer=fences, epoch_clock=lambda: 5, store=store)
    reg.server_sync(_slots(2, 2), {"signature": "s"}, timeout=0)
    a = reg.acquire("a", 2, ttl_s=30)
    b = reg.acquire("b", 2, ttl_s=30)
    again = LeaseActor("p", clock=clock, fencer=fences, epoch_clock=lambda: 5, store=store)
    clock.t += 30 + RESTORE_GRACE_S - 1  # past the ttl, inside the grace: both still held
    assert sorted(again.layout().leased_slots.values()) == sorted([a["lease_id"][:8], b["lease_id"][:8]])
    with pytest.raises(LeaseError, match=r"0 free"):
        again.acquire("c", 2, ttl_s=30)
    assert again.renew(a["lease_id"], "a", [s.slot for s in a["slots"]], 30, a["epoch"])
    clock.t += 2  # b's grace is over; a renewed: one ttl from its renewal
    assert list(again.layout().leased_slots.values()) == [a["lease_id"][:8]]
    c = again.acquire("c", 2, ttl_s=30)
    assert {s.slot for s in c["slots"]} == {s.slot for s in b["slots"]}
    clock.t += 27  # 29 s since a's renewal: a's ttl from it (not the grace again)
    assert a["lease_id"][:8] in again.layout().leased_slots.values()
    clock.t += 2
    assert a["lease_id"][:8] not in again.layout().leased_slots.values()


def test_a_registry_without_a_store_record_starts_empty() -> None:
    from remote_env.pool import lease_store

    assert lease_store.load_book(None, 0.0) == lease_store.Book()
    assert lease_store.load_layout(None) == lease_store.StoredLayout()
    # a record written by an older SlotInfo (fewer fields) or a newer one (more) loads
    doc = lease_store.dump_layout(_slots(2), {"document": {"a": 1}}, 3)
    doc = doc.replace('"streak": 0', '"streak": 0, "from_the_future": 1')
    assert lease_store.load_layout(doc) == lease_store.StoredLayout(
        tuple(_slots(2)), {"document": {"a": 1}}, 3)


def test_an_acquire_asked_again_with_its_lease_id_is_the_same_lease() -> None:
    """A retry of a grant whose answer was lost (Ray: 'may or may not have been
    executed') must not hold a second set of envs."""
    fences = Fences()
    reg, _ = _registry(2, 2, fences=fences)
    first = reg.acquire("a", 2, ttl_s=10, lease_id="mine")
    again = reg.acquire("a", 2, ttl_s=10, lease_id="mine")
    assert (again["lease_id"], again["slots"], again["epoch"]) == (
        "mine", first["slots"], first["epoch"])
    assert len(reg.layout().leases) == 1
    assert fences.calls[-1] == (["host-00000-g1"], first["epoch"])  # fenced again: idempotent
    assert [s.slot for s in reg.acquire("b", 2, ttl_s=10)["slots"]] == [1]


def test_withdraw_takes_only_unleased_actors_out_of_reach_of_grants() -> None:
    """The pool server's scale-down asks at the moment of removal: a lease granted
    since its last sync keeps its actor; a withdrawn actor is granted to no one."""
    reg, _ = _registry(2, 2, 2)
    late = reg.acquire("late", 2, ttl_s=10)  # after the server's last sync
    (held,) = [s.slot for s in late["slots"]]
    assert reg.withdraw([2, 1, 0]) == [s for s in (2, 1, 0) if s != held]
    assert sorted(reg.layout().leased_slots) == [held]
    with pytest.raises(LeaseError, match="cannot lease num_envs=2: 0 free"):
        reg.acquire("b", 2, ttl_s=10)
    assert reg.withdraw([held]) == []


def test_scale_down_plans_whole_free_actors_newest_first_then_a_cut() -> None:
    from remote_env.pool.slot import ActorSlot as Slot
    from remote_env.pool.supervisor import plan_scale_down

    slots = [Slot(0, 4), Slot(1, 4), Slot(2, 4), Slot(3, 2)]
    remove, cut, by = plan_scale_down(slots, 6, leased={})
    assert ([s.slot for s in remove], cut, by) == ([3, 2], None, 0)
    remove, cut, by = plan_scale_down(slots, 3, leased={3: "x"})
    assert ([s.slot for s in remove], cut is not None and cut.slot, by) == ([], 2, 3)
    remove, cut, by = plan_scale_down(slots, 5, leased={2: "x", 1: "y"})
    assert ([s.slot for s in remove], cut is not None and cut.slot, by) == ([3], 0, 3)
    assert plan_scale_down(slots, 4, leased={0: "a", 1: "b", 2: "c", 3: "d"}) == ([], None, 0)


def test_during_a_rollout_actors_of_the_new_revision_are_leased_first() -> None:
    # an old actor leased now would run the old env until the lease ends
    slots = [SlotInfo(i, f"host-{i:05d}-g1", f"id{i}-1", 2, "ready",  # type: ignore[arg-type]
                      revision="new" if i in (1, 3) else "old") for i in range(4)]
    reg = LeaseActor("p", clock=Clock(), fencer=Fences(), epoch_clock=lambda: 5)
    reg.server_sync(slots, {"signature": "s", "revision": "new"}, timeout=0)
    assert [s.slot for s in reg.acquire("a", 4, ttl_s=10)["slots"]] == [1, 3]
    assert [s.slot for s in reg.acquire("b", 2, ttl_s=10)["slots"]] == [0]
