"""How a send is cut into one call per host and per split of it (the planner, pure)."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from remote_env.driver import planner


class _Loop(NamedTuple):
    splits_per_actor: int
    env_pos: np.ndarray


def _loop(splits: int, env_pos: list[int]) -> _Loop:
    return _Loop(splits, np.array(env_pos))


def _split(loop: _Loop, host_size: int, ids: list[int], payload: object) -> list:
    env_ids = np.array(ids)
    positions = loop.env_pos[env_ids].tolist()
    return planner.split(host_size, env_ids, positions, payload, loop.splits_per_actor)


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


def _layout() -> planner.Layout:
    # host 0: envs 0..2, host 1: envs 3..4 (contiguous), host 2: envs 5 and 7, host 3: 6
    return planner.Layout.of([[0, 1, 2], [3, 4], [5, 7], [6]], 8)


def test_layout_knows_each_envs_host_position_and_contiguous_spans() -> None:
    layout = _layout()
    assert layout.env_host.tolist() == [0, 0, 0, 1, 1, 2, 3, 2]
    assert layout.env_pos.tolist() == [0, 1, 2, 0, 1, 0, 0, 1]
    assert layout.spans == ((0, 3), (3, 5), (-1, -1), (6, 7))


def test_every_env_in_order_is_sliced_per_host_without_a_gather() -> None:
    acts = np.arange(100, 108)
    out = planner.plan(_layout(), np.arange(8), acts, splits_per_actor=1, is_reset=False)
    assert [(c.host, c.env_ids.tolist(), c.positions) for c in out] == [
        (0, [0, 1, 2], [0, 1, 2]), (1, [3, 4], [0, 1]), (2, [5, 7], [0, 1]), (3, [6], [0])]
    assert np.shares_memory(out[0].payload, acts) and np.shares_memory(out[1].payload, acts)
    # a host whose envs are not contiguous gets its own envs' actions, gathered
    assert [list(c.payload) for c in out] == [[100, 101, 102], [103, 104], [105, 107], [106]]


def test_one_hosts_envs_are_sent_as_given_in_the_callers_order() -> None:
    acts = np.array([14, 13])
    [call] = planner.plan(_layout(), np.array([4, 3]), acts, splits_per_actor=1,
                          is_reset=False)
    assert (call.host, call.env_ids.tolist(), call.positions) == (1, [4, 3], [1, 0])
    assert call.payload is acts


def test_a_subset_over_hosts_is_one_call_per_host_each_with_its_own_payload() -> None:
    out = planner.plan(_layout(), np.array([7, 1, 3]), np.array([70, 10, 30]),
                       splits_per_actor=1, is_reset=False)
    assert sorted((c.host, c.env_ids.tolist(), c.positions, c.payload.tolist()) for c in out) \
        == [(0, [1], [1], [10]), (1, [3], [0], [30]), (2, [7], [1], [70])]


def test_every_env_out_of_order_or_a_reset_is_gathered_per_host() -> None:
    ids = np.array([1, 0, 2, 3, 4, 5, 6, 7])
    out = planner.plan(_layout(), ids, np.arange(8) * 10, splits_per_actor=1, is_reset=False)
    # per_env[j] stays with ids[j]: env 1 gets 0, env 0 gets 10
    assert (out[0].env_ids.tolist(), out[0].payload.tolist()) == ([1, 0, 2], [0, 10, 20])
    seeds = planner.plan(_layout(), np.arange(8), [None, 1, 2, 3, 4, 5, 6, 7],
                         splits_per_actor=1, is_reset=True)
    assert [c.payload for c in seeds] == [[None, 1, 2], [3, 4], [5, 7], [6]]


def test_splits_apply_per_host_after_the_host_cut() -> None:
    out = planner.plan(_layout(), np.arange(8), np.arange(8), splits_per_actor=2,
                       is_reset=False)
    assert [(c.host, c.env_ids.tolist()) for c in out] == [
        (0, [0, 1]), (0, [2]), (1, [3]), (1, [4]), (2, [5]), (2, [7]), (3, [6])]
