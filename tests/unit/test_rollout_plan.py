"""remote_env.pool.rollout: which actors a rolling env update takes down, and when."""

from __future__ import annotations

from remote_env.pool import rollout
from remote_env.pool.slot import ActorSlot as Slot

OLD, NEW = "old", "new"


def _slots(*specs: tuple[int, str, str]) -> list[Slot]:
    """(envs, revision, state) per slot, slots numbered from 0."""
    out = []
    for i, (envs, rev, state) in enumerate(specs):
        s = Slot(i, envs, revision=rev)
        s.state = state  # type: ignore[assignment]
        out.append(s)
    return out


def _plan(slots: list[Slot], *, leased: dict[int, str] | None = None, max_unavailable: int = 4,
          envs_per_actor: int = 2, desired: int | None = None,
          overdue: set[int] | None = None) -> rollout.Plan:
    return rollout.plan(slots, revision=NEW, envs_per_actor=envs_per_actor,
                        desired_envs=sum(s.num_envs for s in slots) if desired is None
                        else desired, max_unavailable=max_unavailable, leased=leased or {},
                        overdue=overdue or set())


def test_free_outdated_actors_go_first_within_max_unavailable() -> None:
    slots = _slots(*[(2, OLD, "ready")] * 8)  # 16 envs, maxUnavailable 4 envs
    plan = _plan(slots, leased={0: "a", 1: "a"})
    assert plan.rebuild == (2, 3) and plan.remove == ()


def test_leased_outdated_actors_are_never_taken_until_released() -> None:
    slots = _slots(*[(2, OLD, "ready")] * 4)
    leased = {0: "a", 1: "a", 2: "b", 3: "b"}
    assert _plan(slots, leased=leased).slots == []
    del leased[3]  # lease b gave slot 3 back (the whole lease ended: both go)
    del leased[2]
    assert _plan(slots, leased=leased).rebuild == (2, 3)


def test_envs_already_out_of_service_count_against_the_budget() -> None:
    # 2 envs starting (new), budget 4: one more actor of 2 may go, not two
    slots = _slots((2, NEW, "starting"), *[(2, OLD, "ready")] * 7)
    assert _plan(slots).rebuild == (1,)
    # a missing actor (removed for a resize) counts too
    slots = _slots(*[(2, OLD, "ready")] * 7)
    assert _plan(slots, desired=16).rebuild == (0,)
    # the budget spent: nothing this pass
    slots = _slots((2, NEW, "starting"), (2, NEW, "starting"), *[(2, OLD, "ready")] * 6)
    assert _plan(slots).slots == []


def test_one_actor_at_a_time_when_the_budget_is_below_an_actor() -> None:
    slots = _slots(*[(8, OLD, "ready")] * 2)
    assert _plan(slots, max_unavailable=1, envs_per_actor=8).rebuild == (0,)
    slots[0].state, slots[0].revision = "starting", NEW
    assert _plan(slots, max_unavailable=1, envs_per_actor=8).slots == []


def test_updated_and_unready_actors_are_left_alone() -> None:
    slots = _slots((2, NEW, "ready"), (2, OLD, "backoff"), (2, OLD, "failed"), (2, OLD, "ready"))
    # backoff/failed ones restart on the new spec by themselves; one is down: 2 + 2 <= 4
    assert _plan(slots, max_unavailable=8).rebuild == (3,)


def test_actors_of_another_size_are_removed_for_the_scaling_pass_to_refill() -> None:
    # envsPerActor 4 -> 8: two free 4-env actors go together (one new 8-env actor's worth)
    slots = _slots(*[(4, OLD, "ready")] * 4)
    plan = _plan(slots, envs_per_actor=8, max_unavailable=4)
    assert plan.remove == (0, 1) and plan.rebuild == ()
    # envsPerActor 8 -> 4 with a budget of 2: one actor still goes (progress)
    slots = _slots(*[(8, OLD, "ready")] * 2)
    assert _plan(slots, envs_per_actor=4, max_unavailable=2).remove == (0,)


def test_progress_counts_updated_outdated_and_leased() -> None:
    slots = _slots((2, NEW, "ready"), (2, NEW, "starting"), (2, OLD, "ready"), (4, OLD, "ready"))
    p = rollout.progress(slots, NEW, {3: "a"})
    assert (p.updated_envs, p.outdated_envs, p.outdated_leased_envs) == (4, 6, 4)
    assert not p.complete
    assert rollout.progress(slots[:2], NEW, {}).complete


def test_leased_actors_past_their_grace_are_evicted_after_the_free_ones() -> None:
    slots = _slots(*[(2, OLD, "ready")] * 4)
    leased = {0: "a", 1: "a"}
    # budget 4: the two free ones first; the overdue leased ones wait for the budget
    plan = _plan(slots, leased=leased, overdue={0, 1})
    assert (plan.rebuild, plan.evict) == ((2, 3), ())
    slots[2].revision = slots[3].revision = NEW
    plan = _plan(slots, leased=leased, overdue={0, 1})
    assert (plan.rebuild, plan.remove, plan.evict) == ((), (), (0, 1))
    assert plan.slots == []  # nothing to withdraw: the lease stays
    # not overdue: untouched
    assert _plan(slots, leased=leased, overdue={1}).evict == (1,)
    assert _plan(slots, leased=leased).evict == ()


def test_an_evicted_leased_actor_keeps_its_size() -> None:
    # envsPerActor changed: a free actor of the old size is removed, a leased one is
    # rebuilt at its size (its trainer keeps as many envs)
    slots = _slots((4, OLD, "ready"), (4, OLD, "ready"))
    plan = _plan(slots, leased={0: "a"}, overdue={0}, envs_per_actor=2, max_unavailable=8)
    assert (plan.remove, plan.evict) == ((1,), (0,))
