"""The vector env's validated options: checked once, read everywhere, never changed."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import gymnasium as gym
from gymnasium.vector import AutoresetMode

from remote_env import checks


@dataclasses.dataclass(frozen=True)
class Options:
    """:class:`~remote_env.driver.vector.RemoteVectorEnv`'s options, as checked
    (see its docstring for what each does)."""

    num_envs: int
    envs_per_actor: int
    batch_wait_ms: float
    autoreset_mode: AutoresetMode
    copy: bool
    observation_mode: str | tuple[gym.spaces.Space[Any], gym.spaces.Space[Any]]
    restart_failed: bool
    max_restarts: int
    restart_backoff_s: float
    step_timeout_s: float | None
    start_timeout_s: float | None
    close_timeout_s: float | None
    threads_per_actor: int
    transport: str
    spin_us: float
    splits_per_actor: int
    actor_options: Mapping[str, Any]


def check(**options: Any) -> None:
    """Bad options raise here, before Ray is touched or any actor exists."""
    checks.options(**options)


def envs_per_actor_for(num_envs: int, cpus: int) -> int:
    """The default: about one actor per core of the Ray cluster (a Ray call costs
    ~1-3 ms, so few, large calls win for cheap envs)."""
    return -(-num_envs // max(1, cpus))
