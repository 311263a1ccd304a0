"""Checks the integration tests share: what Ray really holds, and polling.

A module of its own (not conftest): ``from conftest import`` picks whichever
conftest was imported first, so it broke when e2e and integration ran together.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np
import ray


def state_api_address() -> str:
    """The GCS address of the Ray this process is connected to.

    Without it the state API resolves ``/tmp/ray/ray_current_cluster``: the last
    cluster *started on this machine*, which may be another test's, already gone
    (CI saw "Timed out while waiting for GCS" from exactly that).
    """
    return str(ray.get_runtime_context().gcs_address)


def alive_actor_ids() -> set[str]:
    from ray.util.state import list_actors

    rows = list_actors(address=state_api_address(), filters=[("state", "=", "ALIVE")], limit=10_000)
    return {a.actor_id for a in rows}


def wait_for(pred: Callable[[], Any], timeout: float = 30.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = pred()
        if last:
            return last
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}; last={last!r}")


def assert_same_step(got: Any, want: Any) -> None:
    """One ``step`` result equal to a reference vector env's: arrays, info keys and masks."""
    for g, w in zip(got[:4], want[:4], strict=True):
        np.testing.assert_array_equal(g, w)
    assert got[4].keys() == want[4].keys()
    for key in want[4]:
        np.testing.assert_array_equal(got[4][key], want[4][key])
