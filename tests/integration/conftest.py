"""Real local Ray for the remote_env integration tests (DESIGN.md, test pyramid 2).

``ray_local`` starts (or reuses) one local Ray with 2 CPUs. Tests that need a
multi-node ``ray.cluster_utils.Cluster`` shut it down and bring their own; the
next ``ray_local`` user starts it again.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import ray


@pytest.fixture
def ray_local() -> Iterator[Any]:
    if not ray.is_initialized():
        # the dashboard serves the state API (list_actors) the leak checks use
        ray.init(address="local", num_cpus=2, include_dashboard=True)
    yield ray


def alive_actor_ids() -> set[str]:
    from ray.util.state import list_actors

    return {a.actor_id for a in list_actors(filters=[("state", "=", "ALIVE")], limit=10_000)}


def wait_for(pred: Callable[[], Any], timeout: float = 30.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = pred()
        if last:
            return last
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}; last={last!r}")
