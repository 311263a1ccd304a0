"""The driver's state owners on their own (no Ray): the env ledger and the calls in flight."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

from remote_env.driver.inflight import Call, Deferred, InFlight
from remote_env.driver.ledger import EnvLedger


def _call(host: int, ids: list[int]) -> Call:
    return Call(host, np.array(ids), list(range(len(ids))), False, "step", ())


def test_ledger_refuses_a_step_before_a_reset_naming_the_envs() -> None:
    ledger = EnvLedger(4, adopted=False)
    ledger.mark_reset(np.array([0, 2]))
    ledger.check_reset(np.array([2, 0]))
    with pytest.raises(gym.error.ResetNeeded, match=r"\[1, 3\]"):
        ledger.check_reset(np.arange(4))
    EnvLedger(4, adopted=True).check_reset(np.arange(4))  # a warm pool's envs were reset


def test_ledger_keeps_the_last_seed_given_and_counts_restarts_and_failures() -> None:
    ledger = EnvLedger(3, adopted=False)
    ledger.remember_seeds(np.array([0, 1]), [5, None])
    ledger.remember_seeds(np.array([1, 0]), [None, None])  # unseeded resets keep the seed
    assert ledger.seeds_of([0, 1, 2]) == [5, None, None]
    ledger.count_restarts(np.array([0, 1]))
    ledger.count_restarts(1)
    counts = ledger.restart_counts()
    counts[:] = 99  # a copy: the ledger is not changed through it
    assert ledger.restarts_of([0, 1, 2]) == [1, 2, 0]
    ledger.fail(np.array([1, 2]))
    assert ledger.failed_count() == 2 and ledger.all_failed(np.array([1, 2]))
    assert not ledger.all_failed(np.array([0, 1]))


def test_inflight_keeps_envs_busy_until_their_results_are_handed_out() -> None:
    inflight = InFlight(4)
    inflight.add("a", _call(0, [0, 1]))
    inflight.add("b", _call(1, [3]))
    assert inflight.busy(np.arange(4)).tolist() == [0, 1, 3]
    inflight.remove("a")  # its result is in hand, not handed out: still busy
    inflight.deliver(np.array([0, 1]), "batch-a")
    assert inflight.busy(np.arange(4)).tolist() == [0, 1, 3] and len(inflight) == 1
    inflight.drop("b")  # an error ended it: free to send again
    assert inflight.busy(np.arange(4)).tolist() == [0, 1]
    handed = inflight.take_ready()
    assert not inflight.busy_mask().any() and not inflight.has_ready
    inflight.put_back(handed)  # an interrupt while handing out: returned next time
    assert inflight.has_ready and inflight.busy(np.arange(4)).tolist() == [0, 1]


def test_orphans_are_waited_out_apart_and_the_callers_calls_come_back() -> None:
    inflight = InFlight(4)
    inflight.add("old", _call(0, [0]))
    inflight.orphan_all()
    assert not inflight and inflight.has_orphans and not inflight.busy_mask().any()
    inflight.add("new", _call(1, [2]))
    mine, ready = inflight.adopt_orphans()
    assert inflight.all_keys() == ["old"] and list(mine) == ["new"]
    inflight.remove("old")
    inflight.restore(mine, ready)
    assert inflight.all_keys() == ["new"] and not inflight.has_orphans
    assert inflight.busy(np.arange(4)).tolist() == [2]


def test_views_show_deferred_calls_and_are_copies() -> None:
    inflight = InFlight(2)
    key = Deferred()
    inflight.add(key, _call(1, [1]))
    [view] = inflight.views()
    assert (view.host, view.env_ids.tolist(), view.deferred) == (1, [1], True)
    view.env_ids[:] = 0
    assert inflight[key].env_ids.tolist() == [1]
    assert inflight.live() == [] and inflight.deferred(1) == [(key, inflight[key])]
