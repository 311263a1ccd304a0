"""Plain records that cross the actor boundary (picklable, no Ray types)."""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

FailureReason = Literal["exception", "actor_died", "timeout"]


@dataclasses.dataclass(frozen=True)
class Failure:
    """One sub-environment failure, as reported by its host or the driver."""

    index: int
    reason: FailureReason
    message: str
    traceback: str = ""
    restarted: bool = False
    # True when the env is out of restarts (or restarts are off): the driver must raise.
    permanent: bool = False


@dataclasses.dataclass
class Batch:
    """Results of one host call for some of its sub-environments.

    ``obs`` is a stacked ndarray when the observation space is a Box (one buffer
    per call, cheap to ship through the object store), else a list.
    """

    indices: list[int]
    obs: Any
    rewards: Any
    terminations: Any
    truncations: Any
    infos: list[dict[str, Any]]
    failures: list[Failure]
    is_reset: bool = False
