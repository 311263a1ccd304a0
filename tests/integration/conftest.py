"""Real local Ray for the remote_env integration tests (DESIGN.md, test pyramid 2).

``ray_local`` starts (or reuses) one local Ray with 2 CPUs. Tests that need a
multi-node ``ray.cluster_utils.Cluster`` shut it down and bring their own; the
next ``ray_local`` user starts it again.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import ray


@pytest.fixture
def ray_local() -> Iterator[Any]:
    if not ray.is_initialized():
        # the dashboard serves the state API (list_actors) the leak checks use
        ray.init(address="local", num_cpus=2, include_dashboard=True)
    yield ray
