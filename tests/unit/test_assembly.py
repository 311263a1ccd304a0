"""The driver's result assembly (pure: Batches in, gymnasium-shaped results out)."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

from remote_env._types import Batch
from remote_env.driver.assembly import Assembler

SPACE = gym.spaces.Box(-10, 10, (2,), np.float32)


def _batch(ids: list[int], infos: list[dict] | None = None) -> tuple[np.ndarray, Batch]:
    obs = np.array([[e, -e] for e in ids], dtype=np.float32)
    b = Batch(list(range(len(ids))), obs, np.array(ids, dtype=np.float64),
              np.array([e % 2 == 0 for e in ids]), np.zeros(len(ids), dtype=np.bool_),
              [] if infos is None else infos, [])
    return np.array(ids), b


@pytest.mark.parametrize("ids", [[0, 1, 2, 3], [3, 1, 2], [5, 2], [7]])
def test_partial_orders_by_env_id_and_keeps_each_env_its_own_row(ids: list[int]) -> None:
    a = Assembler(SPACE, 8, multi_agent=False, copy=True)
    obs, rew, term, trunc, infos = a.partial([_batch(ids)])
    want = sorted(ids)
    assert infos["env_id"].tolist() == want and list(infos) == ["env_id"]
    assert rew.tolist() == [float(e) for e in want]
    assert term.tolist() == [e % 2 == 0 for e in want] and not trunc.any()
    assert obs.tolist() == [[e, -e] for e in want]
    # the last observations are kept per env (what a failed step returns)
    assert a.last_obs(want[0]).tolist() == [want[0], -want[0]]


def test_partial_merges_two_hosts_and_sends_infos_only_for_envs_that_have_them() -> None:
    a = Assembler(SPACE, 8, multi_agent=False, copy=True)
    first = _batch([4, 6], infos=[{}, {"x": 1}])
    second = _batch([1, 2])  # this host sent no infos at all
    obs, rew, _, _, infos = a.partial([first, second])
    assert infos["env_id"].tolist() == [1, 2, 4, 6]
    assert rew.tolist() == [1.0, 2.0, 4.0, 6.0]
    assert infos["x"].tolist()[3] == 1 and infos["_x"].tolist() == [False, False, False, True]
    assert obs[:, 0].tolist() == [1, 2, 4, 6]


def test_partial_results_do_not_alias_the_batch_or_the_buffer() -> None:
    a = Assembler(SPACE, 4, multi_agent=False, copy=True)
    ids, b = _batch([0, 1, 2, 3])
    obs, rew, _, _, infos = a.partial([(ids, b)])
    b.rewards[:] = 99  # the reply's arrays may be shared memory the actor writes next
    ids[:] = 0
    obs[:] = 42  # the caller owns what it got
    assert rew.tolist() == [0.0, 1.0, 2.0, 3.0]
    assert infos["env_id"].tolist() == [0, 1, 2, 3]
    assert a.last_obs(3).tolist() == [3, -3]


def test_full_accepts_replies_without_infos() -> None:
    a = Assembler(SPACE, 4, multi_agent=False, copy=True)
    obs, rew, _, _, infos = a.full([_batch([0, 1]), _batch([2, 3], infos=[{"y": 2.0}, {}])])
    assert rew.tolist() == [0.0, 1.0, 2.0, 3.0] and obs[:, 0].tolist() == [0, 1, 2, 3]
    assert infos["_y"].tolist() == [False, False, True, False]
