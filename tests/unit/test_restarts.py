"""The one crash-loop rule (remote_env.restarts): pure, no Ray."""

from __future__ import annotations

import pytest

from remote_env import restarts


def test_backoff_doubles_to_the_cap_and_is_zero_without_a_base() -> None:
    assert [restarts.backoff(1.0, n, 60.0) for n in range(8)] == [
        1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 60.0, 60.0]
    assert restarts.backoff(0.0, 3, 60.0) == 0.0
    assert restarts.backoff(1.0, -1, 60.0) == 0.0
    assert restarts.backoff(1.0, 10_000, 60.0) == 60.0


def test_a_failure_counts_and_gives_up_past_max_restarts() -> None:
    rule = restarts.CrashLoop(max_restarts=3, backoff_s=0.5)
    streak = restarts.Streak()
    assert [rule.failed(streak) for _ in range(3)] == [0.5, 1.0, 2.0]
    assert rule.failed(streak) is None
    assert streak.failures == 4


def test_max_restarts_zero_gives_up_at_the_first_failure() -> None:
    streak = restarts.Streak()
    assert restarts.CrashLoop(max_restarts=0).failed(streak) is None


def test_immediate_restarts_skip_the_backoff_of_the_first_ones() -> None:
    rule = restarts.CrashLoop(max_restarts=5, backoff_s=1.0, immediate_restarts=1)
    streak = restarts.Streak()
    assert [rule.failed(streak) for _ in range(4)] == [0.0, 1.0, 2.0, 4.0]


def test_the_backoff_is_capped() -> None:
    rule = restarts.CrashLoop(max_restarts=100, backoff_s=10.0, max_backoff_s=25.0)
    streak = restarts.Streak()
    assert [rule.failed(streak) for _ in range(4)] == [10.0, 20.0, 25.0, 25.0]


def test_without_healthy_after_a_success_ends_the_streak_at_once() -> None:
    rule = restarts.CrashLoop(max_restarts=2, backoff_s=1.0)
    streak = restarts.Streak()
    rule.failed(streak)
    rule.failed(streak)
    rule.succeeded(streak)
    assert streak.failures == 0
    assert rule.failed(streak) == 1.0  # a new streak starts from the first backoff


@pytest.mark.parametrize(("seen_after", "ended"), [(59.9, False), (60.0, True), (300.0, True)])
def test_with_healthy_after_a_success_ends_the_streak_only_after_that_uptime(
    seen_after: float, ended: bool
) -> None:
    rule = restarts.CrashLoop(max_restarts=2, healthy_after_s=60.0)
    streak = restarts.Streak()
    rule.failed(streak)
    streak.up(1000.0)
    rule.succeeded(streak, 1000.0 + seen_after)
    assert streak.failures == (0 if ended else 1)


def test_a_crash_loop_that_never_stays_up_long_enough_gives_up() -> None:
    rule = restarts.CrashLoop(max_restarts=2, healthy_after_s=60.0)
    streak = restarts.Streak()
    now = 0.0
    outcomes = []
    for _ in range(3):
        streak.up(now)
        now += 30.0  # pings answered, but up for 30 s only
        rule.succeeded(streak, now)
        outcomes.append(rule.failed(streak))
    assert outcomes == [0.0, 0.0, None]


def test_a_success_without_a_streak_changes_nothing() -> None:
    rule = restarts.CrashLoop(max_restarts=2, healthy_after_s=60.0)
    streak = restarts.Streak()
    rule.succeeded(streak, 5.0)
    assert streak.failures == 0
