"""remote_env.pool.lease_rules as pure functions: no actor, no lock, times passed in."""

from __future__ import annotations

import pytest

from remote_env.pool import lease_rules
from remote_env.pool.lease_rules import LeaseBook, LeaseError
from remote_env.pool.slot import SlotInfo, SlotState


def _slot(i: int, envs: int, state: SlotState = "ready", revision: str = "") -> SlotInfo:
    return SlotInfo(i, f"host-{i:05d}-g1", f"id{i}", envs, state, revision=revision)


@pytest.mark.parametrize(("num_envs", "ttl_s", "match"), [
    (2, 0.0, "ttl_s must be > 0"), (0, 1.0, "num_envs must be >= 1"),
])
def test_bad_requests_are_refused_before_any_state(num_envs: int, ttl_s: float, match: str) -> None:
    with pytest.raises(LeaseError, match=match):
        lease_rules.check_request(num_envs, ttl_s)


def test_choose_takes_free_ready_actors_new_revision_first_in_slot_order() -> None:
    slots = [_slot(0, 2, revision="old"), _slot(1, 2, revision="new"), _slot(2, 2, "starting"),
             _slot(3, 2, revision="new"), _slot(4, 4, revision="new")]
    assert [s.slot for s in lease_rules.choose(slots, {4: "x"}, 4, "new") or []] == [1, 3]
    assert [s.slot for s in lease_rules.choose(slots, {}, None, "new") or []] == [0, 1, 3, 4]
    assert lease_rules.choose(slots, {1: "x", 3: "x", 4: "x"}, 4, "new") is None
    assert lease_rules.choose([], {}, None, None) is None  # nothing free: no empty lease


def test_pick_finds_an_exact_sum_over_mixed_sizes() -> None:
    free = [_slot(0, 6), _slot(1, 4), _slot(2, 4)]
    assert [s.slot for s in lease_rules.pick(free, 8) or []] == [1, 2]
    assert lease_rules.pick(free, 7) is None


def test_grants_take_growing_epochs_and_fence_each_slot() -> None:
    book = LeaseBook()
    a = book.grant("a", [0, 1], ttl_s=10, now=100.0, wall_epoch=5, lease_id="A")
    b = book.grant("b", [2], ttl_s=10, now=100.0, wall_epoch=5)  # wall clock went nowhere
    assert (a.epoch, b.epoch) == (5, 6) and a.expires == 110.0
    assert book.leased_slots() == {0: "A", 1: "A", 2: b.lease_id}
    assert book.slot_epochs() == {0: 5, 1: 5, 2: 6}
    assert book.holds("A", 1) and not book.holds("A", 2)


def test_expiry_and_extension() -> None:
    book = LeaseBook()
    lease = book.grant("a", [0], ttl_s=10, now=0.0, wall_epoch=1, lease_id="A")
    assert not book.expire(10.0)  # at the deadline: still held
    book.extend(lease, 5, now=10.0)
    assert not book.expire(15.0) and book.expire(15.5)
    assert book.leased_slots() == {} and not book.release("A")


def test_a_lapsed_lease_is_granted_again_only_while_nobody_took_its_actors() -> None:
    book = LeaseBook()
    book.grant("a", [0, 1], ttl_s=1, now=0.0, wall_epoch=7, lease_id="A")
    assert book.expire(5.0)
    # as it was: same slots, same epoch, the actors still in the layout
    again = book.regrant("A", "a", [0, 1], 10, 7, now=5.0, present={0, 1, 2})
    assert again is not None and again.epoch == 7 and book.holds("A", 0)
    assert book.release("A")
    book.grant("b", [1], ttl_s=10, now=6.0, wall_epoch=7, lease_id="B")  # epoch 8 on slot 1
    assert book.release("B")
    assert book.regrant("A", "a", [0, 1], 10, 7, now=7.0, present={0, 1}) is None  # 1 re-granted
    assert book.regrant("A", "a", [0], 10, 7, now=7.0, present={1}) is None  # 0 gone
    # no layout yet (a restarted lease actor): the epochs alone decide
    assert book.regrant("A", "a", [0], 10, 7, now=7.0, present=None) is not None


def test_the_book_round_trips_through_its_record() -> None:
    book = LeaseBook()
    book.grant("a", [3], ttl_s=4, now=0.0, wall_epoch=9, lease_id="A")
    again = LeaseBook(book.leases(), book.slot_epochs(), book.last_epoch)
    assert again.leased_slots() == {3: "A"} and again.last_epoch == 9
    summary = again.summary({3: _slot(3, 2)}, now=1.0)
    assert summary == {"leases": [{"lease_id": "A", "trainer": "a", "slots": [3], "envs": 2,
                                   "expires_in_s": 3.0, "age_s": 1.0}],
                       "leased_slots": {3: "A"}}
