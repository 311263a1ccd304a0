"""The vector env's validated options: checked once, read everywhere, never changed."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode

from remote_env import checks

#: :class:`~remote_env.driver.vector.RemoteVectorEnv`'s ``batch_wait_ms`` when none is
#: given: ``recv()`` returns what is ready with the first call to finish, waiting for no
#: more (RLlib's ``remote_env_batch_wait_ms`` default, "continue when at least one env
#: is ready"). Why 0: with a wait, ``recv()`` gathers every call that finishes within it,
#: so an actor's splits (and the actors) come back together and the driver and the
#: actors take turns instead of overlapping; the self-tuned layout pays only without it
#: (README "Benchmarks", issue 34). Not the pools' default: ``spec.batchWaitMs`` (2) is
#: part of the EnvPool CRD and of the rendered pods, and a pool's trainer gets its spec's.
DEFAULT_BATCH_WAIT_MS = 0.0
#: ``spin_us="auto"``: how long (µs) an actor looks for the next call before it sleeps,
#: while the calls come back-to-back (the hand-tuned value of README "Benchmarks")
AUTO_SPIN_US = 500.0
#: ``spin_us="auto"`` spins only if a call's observations are at most this many bytes:
#: past that the driver's share of a call (storing the frames) needs the core a spinning
#: actor would hold (image 84x84x4 in calls of 8, one run on 2 cores: 42,842 steps/s
#: with a 500 µs adaptive spin, 45,576 without; README "Benchmarks", issue 34)
AUTO_SPIN_MAX_OBS_BYTES = 64 * 1024


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
    spin_us: float | str
    splits_per_actor: int
    actor_options: Mapping[str, Any]


def check(**options: Any) -> None:
    """Bad options raise here, before Ray is touched or any actor exists."""
    checks.options(**options)


def auto_spin_us(obs_space: Any, envs_per_actor: int, splits_per_actor: int) -> float:
    """What ``spin_us="auto"`` spins (µs, while calls come back-to-back): AUTO_SPIN_US
    for calls whose observations are small, none for big ones (see above). Spaces
    that are not Box (pickled, sizes unknown) count as small."""
    nbytes = 0
    if isinstance(obs_space, gym.spaces.Box):
        per_call = -(-envs_per_actor // max(1, splits_per_actor))
        nbytes = int(np.prod(obs_space.shape, dtype=np.int64)) * obs_space.dtype.itemsize * per_call
    return AUTO_SPIN_US if nbytes <= AUTO_SPIN_MAX_OBS_BYTES else 0.0
