"""The constructor's option checks and the per-send input checks (pure functions)."""

from __future__ import annotations

import math
from typing import Any

import gymnasium as gym
import numpy as np
import pytest

from remote_env import checks

_OK = {"envs_per_actor": None, "threads_per_actor": 1, "max_restarts": 3,
       "batch_wait_ms": 0.0, "step_timeout_s": None, "restart_backoff_s": 0.0,
       "transport": "auto", "observation_mode": "same", "spin_us": 0.0}


#: time options where None means "no limit" (every other one refuses None)
_NONE_OK = {"step_timeout_s", "start_timeout_s", "close_timeout_s"}


@pytest.mark.parametrize("name", ["batch_wait_ms", "restart_backoff_s", "spin_us",
                                  "step_timeout_s", "start_timeout_s", "close_timeout_s"])
@pytest.mark.parametrize("bad", [-1, -0.5, math.nan, math.inf, -math.inf, True, False,
                                 np.bool_(True), "5", None, [1.0]])
def test_time_options_must_be_finite_non_negative_numbers(name: str, bad: Any) -> None:
    # one rule for every time option (issue #28: start_timeout_s=None used to pass here
    # and fail as float + NoneType on the first actor replacement)
    if bad is None and name in _NONE_OK:
        checks.options(**{**_OK, name: bad})  # None is "no limit" for these
        return
    with pytest.raises(ValueError, match=f"{name}.* must be a finite number") as err:
        checks.options(**{**_OK, name: bad})
    assert repr(bad) in str(err.value)  # says what it got


@pytest.mark.parametrize("name", ["start_timeout_s", "close_timeout_s", "restart_backoff_s"])
def test_zero_is_a_valid_time_option_where_not_positive(name: str) -> None:
    checks.options(**{**_OK, name: 0})


def test_good_options_pass_and_step_timeout_must_be_positive() -> None:
    checks.options(**{**_OK, "spin_us": 500, "batch_wait_ms": np.float32(2.5),
                      "step_timeout_s": 10})
    with pytest.raises(ValueError, match="> 0"):
        checks.options(**{**_OK, "step_timeout_s": 0})


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "2", None])
def test_splits_per_actor_must_be_a_positive_int(bad: Any) -> None:
    with pytest.raises(ValueError, match="splits_per_actor must be an int >= 1") as err:
        checks.options(**{**_OK, "splits_per_actor": bad})
    assert repr(bad) in str(err.value)


@pytest.mark.parametrize("bad", [-1, 1.5, True, "2"])
def test_max_restarts_must_be_a_non_negative_int(bad: Any) -> None:
    with pytest.raises(ValueError, match="max_restarts must be an int >= 0"):
        checks.options(**{**_OK, "max_restarts": bad})


def test_env_ids_are_copied_checked_and_kept_in_the_callers_order() -> None:
    mine = np.array([3, 1, 2])
    ids = checks.env_ids(mine, 4)
    assert ids.tolist() == [3, 1, 2] and ids.dtype == np.int64
    mine[0] = 0  # a call in flight holds its own copy
    assert ids[0] == 3
    for bad, what in (([4], "unknown env ids \\[4\\]"), ([-1, 0], "unknown env ids \\[-1\\]"),
                      ([1, 1], "must not repeat"), ([], "empty")):
        with pytest.raises(ValueError, match=what):
            checks.env_ids(bad, 4)
    with pytest.raises(TypeError, match="1-D sequence of ints"):
        checks.env_ids([0.5], 4)


def test_discrete_actions_outside_the_space_name_their_env_ids() -> None:
    space = gym.spaces.Discrete(3, start=1)
    ids = np.array([5, 6, 7])
    assert checks.actions(space, [1, 2, 3], ids).tolist() == [1, 2, 3]
    with pytest.raises(ValueError, match=r"env ids \[5, 7\] are outside"):
        checks.actions(space, [0, 2, 4], ids)
    with pytest.raises(TypeError, match="must be integers"):
        checks.actions(space, [1.0, 2.0, 3.0], ids)
    with pytest.raises(TypeError, match="must be numeric"):
        checks.actions(space, ["a", "b", "c"], ids)
