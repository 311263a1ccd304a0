"""The pure sizing rule of autoscaled pools (envpool_operator.autoscaler)."""

from __future__ import annotations

import itertools

import pytest

from envpool_operator import autoscaler
from remote_env import spec


def _auto(**over: object) -> spec.Autoscaling:
    args: dict[str, object] = {"min_replicas": 4, "max_replicas": 32, "buffer_envs": 4,
                               "scale_down_delay_seconds": 60}
    args.update(over)
    return spec.Autoscaling(**args)  # type: ignore[arg-type]


@pytest.mark.parametrize(("leased", "want"), [(0, 4), (2, 6), (3, 8), (16, 20), (28, 32),
                                              (40, 40)])
def test_recommend_is_leased_plus_buffer_in_whole_actors_within_bounds(leased: int,
                                                                       want: int) -> None:
    # 3 leased + 4 free = 7 -> 8 (actors of 2); 40 leased is above max 32 but stays leased
    assert autoscaler.recommend(_auto(), leased=leased, envs_per_actor=2) == want


def test_recommend_never_goes_below_leased_even_when_max_was_lowered() -> None:
    assert autoscaler.recommend(_auto(max_replicas=8), leased=12, envs_per_actor=4) == 12
    assert autoscaler.recommend(_auto(max_replicas=8), leased=2, envs_per_actor=4) == 8


@pytest.mark.parametrize(("leased", "want"), [(0, 4), (8, 10), (16, 20), (17, 22), (30, 32)])
def test_buffer_percent_is_the_share_of_the_pool_kept_free(leased: int, want: int) -> None:
    auto = _auto(buffer_envs=None, buffer_percent=20)
    got = autoscaler.recommend(auto, leased=leased, envs_per_actor=2)
    assert got == want
    if leased > 0 and got < 32:
        assert (got - leased) / got >= 0.2  # at least 20% of the pool free


def test_scale_up_is_immediate_and_down_waits_for_a_full_window() -> None:
    auto = _auto()
    s = autoscaler.Stabilizer()
    assert s.decide(auto, current=4, recommended=12, now=0.0) == 12
    # demand gone: nothing happens for 60 s
    for t in (1.0, 20.0, 40.0, 59.0):
        assert s.decide(auto, current=12, recommended=4, now=t) == 12
    assert s.decide(auto, current=12, recommended=4, now=61.0) == 4


def test_a_spike_and_release_within_the_delay_does_not_thrash() -> None:
    auto = _auto(scale_down_delay_seconds=30)
    s = autoscaler.Stabilizer()
    size, sizes = 8, []
    # steady 4 leased (size 8) for 100 s, a 5 s spike to 20 leased, then back to 4
    for t in range(0, 200):
        leased = 20 if 100 <= t < 105 else 4
        rec = autoscaler.recommend(auto, leased=leased, envs_per_actor=2)
        size = s.decide(auto, current=size, recommended=rec, now=float(t))
        sizes.append(size)
    changes = [(t, a, b) for t, (a, b) in enumerate(itertools.pairwise(sizes), 1)
               if a != b]
    # one step up at the spike, one step down 30 s after it ended: two changes, not 10
    assert changes == [(100, 8, 24), (135, 24, 8)]


def test_a_dip_shorter_than_the_delay_keeps_the_size() -> None:
    auto = _auto(scale_down_delay_seconds=30)
    s = autoscaler.Stabilizer()
    size = s.decide(auto, current=4, recommended=16, now=0.0)
    for t in range(1, 100):
        rec = 4 if t % 20 < 10 else 16  # leases end and come back every 10 s
        size = s.decide(auto, current=size, recommended=rec, now=float(t))
        assert size == 16


def test_down_goes_to_the_largest_recommendation_in_the_window() -> None:
    auto = _auto(scale_down_delay_seconds=10)
    s = autoscaler.Stabilizer()
    size = s.decide(auto, current=4, recommended=20, now=0.0)
    for t, rec in ((5.0, 12), (8.0, 8), (11.0, 8)):
        size = s.decide(auto, current=size, recommended=rec, now=t)
    assert size == 12  # 12 was asked 6 s ago: the window's largest
    assert s.decide(auto, current=size, recommended=8, now=16.0) == 8


def test_nothing_shrinks_before_one_full_window_after_a_restart() -> None:
    auto = _auto(scale_down_delay_seconds=60)
    s = autoscaler.Stabilizer()  # a fresh operator: no history
    assert s.decide(auto, current=20, recommended=4, now=1000.0) == 20
    assert s.decide(auto, current=20, recommended=4, now=1059.0) == 20
    assert s.decide(auto, current=20, recommended=4, now=1061.0) == 4


def test_bounds_hold_at_once_even_without_a_window() -> None:
    s = autoscaler.Stabilizer()
    assert s.decide(_auto(), current=2, recommended=4, now=0.0) == 4     # below min
    assert s.decide(_auto(), current=50, recommended=8, now=1.0) == 32   # above max
    # above max but leased: only down to what trainers hold
    assert s.decide(_auto(), current=50, recommended=40, now=2.0) == 40


def test_zero_delay_scales_down_on_the_next_decision() -> None:
    auto = _auto(scale_down_delay_seconds=0)
    s = autoscaler.Stabilizer()
    assert s.decide(auto, current=4, recommended=16, now=0.0) == 16
    assert s.decide(auto, current=16, recommended=8, now=0.5) == 8
