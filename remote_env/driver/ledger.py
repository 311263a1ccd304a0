"""The env ledger: what the driver knows of each sub-env across actors and calls.

Seeds (for a replacement actor's first reset), whether an env was ever reset
(gymnasium refuses a step before it), restart counts and which envs failed for good.
One owner: every other part asks it, or tells it what happened.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np


class EnvLedger:
    """Per-env seeds, was-reset flags, restart counts and failures."""

    def __init__(self, num_envs: int, *, adopted: bool) -> None:
        self._seeds: list[int | None] = [None] * num_envs
        self._restarts = np.zeros(num_envs, dtype=np.int64)
        self._failed = np.zeros(num_envs, dtype=np.bool_)
        #: envs sent a reset at least once: gymnasium refuses a step before it, and a
        #: step of an env never reset had no observation to return when it failed. Envs
        #: of adopted actors (a warm pool) are where their last user left them.
        self._was_reset = np.full(num_envs, adopted, dtype=np.bool_)
        #: every env was reset: the check on every send is one attribute read, not a
        #: gather and a reduction (~1 us)
        self._all_reset = adopted

    # ------------------------------------------------------------- seeds, resets
    def remember_seeds(self, env_ids: np.ndarray, seeds: Sequence[Any]) -> None:
        """The seeds a reset sends: a replacement actor's first reset uses them."""
        for e, s in zip(env_ids, seeds, strict=True):
            if s is not None:
                self._seeds[int(e)] = s

    def seeds_of(self, env_ids: Sequence[int]) -> list[int | None]:
        return [self._seeds[i] for i in env_ids]

    def mark_reset(self, env_ids: np.ndarray) -> None:
        self._was_reset[env_ids] = True
        self._all_reset = bool(self._was_reset.all())

    def reset_required(self, env_ids: np.ndarray) -> None:
        """Adopted envs whose actor switched its autoreset mode for this vector env:
        their episodes mean nothing in this mode, a step before a reset is refused."""
        self._was_reset[env_ids] = False
        self._all_reset = bool(self._was_reset.all())

    def check_reset(self, env_ids: np.ndarray) -> None:
        """gymnasium's order: reset before the first step (``ResetNeeded``, before sending)."""
        if self._all_reset or self._was_reset[env_ids].all():
            return
        never = env_ids[~self._was_reset[env_ids]]
        raise gym.error.ResetNeeded(
            f"sub-environments {never.tolist()} were never reset: call reset() (or "
            "async_reset() and recv()) before step()/send(), as gymnasium requires")

    # ------------------------------------------------------- restarts, failures
    def count_restarts(self, env_ids: np.ndarray | int) -> None:
        self._restarts[env_ids] += 1

    def restarts_of(self, env_ids: Sequence[int]) -> list[int]:
        return [int(self._restarts[i]) for i in env_ids]

    def restart_counts(self) -> np.ndarray:
        """A copy: restarts per sub-env (exceptions and actor replacements)."""
        return self._restarts.copy()

    def fail(self, env_ids: np.ndarray | int) -> None:
        """These envs failed for good (no restarts left, or not allowed)."""
        self._failed[env_ids] = True

    def all_failed(self, env_ids: np.ndarray) -> bool:
        return bool(self._failed[env_ids].all())

    def failed_count(self) -> int:
        return int(self._failed.sum())
