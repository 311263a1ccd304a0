"""How a send is cut into one call per split of an actor (``CallLoop._split``, pure)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from remote_env.driver.calls import CallLoop


def _loop(splits: int, env_pos: list[int]) -> SimpleNamespace:
    return SimpleNamespace(splits_per_actor=splits, _env_pos=np.array(env_pos))


def _split(loop: SimpleNamespace, host_size: int, ids: list[int], payload: object) -> list:
    host = SimpleNamespace(env_ids=np.arange(host_size))
    env_ids = np.array(ids)
    positions = loop._env_pos[env_ids].tolist()
    return CallLoop._split(loop, host, env_ids, positions, payload)  # type: ignore[arg-type]


def test_one_split_is_one_call_as_given() -> None:
    acts = np.arange(5)
    [(ids, pos, part)] = _split(_loop(1, list(range(5))), 5, [0, 1, 2, 3, 4], acts)
    assert part is acts and pos == [0, 1, 2, 3, 4] and ids.tolist() == pos


def test_ascending_ids_split_into_views_at_fixed_boundaries() -> None:
    acts = np.arange(10, 15)
    out = _split(_loop(2, list(range(5))), 5, [0, 1, 2, 3, 4], acts)  # splits of 3 and 2
    assert [(i.tolist(), p, a.tolist()) for i, p, a in out] == [
        ([0, 1, 2], [0, 1, 2], [10, 11, 12]), ([3, 4], [3, 4], [13, 14])]
    assert all(np.shares_memory(a, acts) for _, _, a in out)  # no gather


def test_ids_within_one_split_stay_one_call() -> None:
    out = _split(_loop(2, list(range(6))), 6, [4, 3], [7, 8])
    assert [(i.tolist(), p, a) for i, p, a in out] == [([4, 3], [4, 3], [7, 8])]


def test_unordered_ids_are_grouped_by_split_keeping_each_ids_payload() -> None:
    # a second host: global ids 4..7 sit at positions 0..3
    loop = _loop(2, [0, 1, 2, 3, 0, 1, 2, 3])
    out = _split(loop, 4, [7, 4, 6, 5], np.array([70, 40, 60, 50]))
    got = sorted((i.tolist(), p, a.tolist()) for i, p, a in out)
    assert got == [([4, 5], [0, 1], [40, 50]), ([7, 6], [3, 2], [70, 60])]
    seeds = _split(loop, 4, [7, 4], [None, 3])  # reset seeds are a list
    assert sorted((i.tolist(), a) for i, _, a in seeds) == [([4], [3]), ([7], [None])]


def test_more_splits_than_envs_is_one_call_per_env() -> None:
    out = _split(_loop(8, list(range(3))), 3, [0, 1, 2], np.zeros(3))
    assert [i.tolist() for i, _, _ in out] == [[0], [1], [2]]
