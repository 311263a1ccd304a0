"""The actor's env slots: one record per sub-env, and the one object that changes them.

:class:`EnvSlots` creates the sub-envs, restarts one that raised (``restart_failed``,
with backoff and a cap on consecutive failures), chooses the seed of a reset and
keeps what autoreset and a failed step need (last observation, reset due). It is the
only writer of the :class:`EnvSlot` records; the stepper and the channel endpoint
read them and report what happened through its methods.

A restarted env's first reset uses :func:`restart_seed` so a run with faults stays
reproducible.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode

from remote_env import multi_agent
from remote_env import restarts as restart_rules
from remote_env._types import Failure, FailureReason

EnvFn = Callable[[], Any]


def restart_seed(seed: int | None, restarts: int) -> int | None:
    """Seed for an env's first reset after its ``restarts``-th restart.

    Deterministic, so a run with faults is reproducible, and different from the
    original seed, so a restarted env does not replay the episode that killed it.
    """
    if seed is None:
        return None
    return int(np.random.SeedSequence([seed, restarts]).generate_state(1)[0])


class ActorEnvProxy(gym.Env[Any, Any]):
    """Lets a make-env callable return a Ray actor handle instead of an env."""

    def __init__(self, handle: Any) -> None:
        import ray

        self._ray = ray
        self._handle = handle
        self.observation_space, self.action_space, self.metadata, self.render_mode = ray.get(
            handle.__ray_call__.remote(
                lambda env: (
                    env.observation_space,
                    env.action_space,
                    getattr(env, "metadata", {}),
                    getattr(env, "render_mode", None),
                )
            )
        )

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        return self._ray.get(self._handle.reset.remote(seed=seed, options=options))

    def step(self, action: Any) -> Any:
        return self._ray.get(self._handle.step.remote(action))

    def close(self) -> None:
        self._ray.kill(self._handle)


@dataclass(slots=True, eq=False)
class EnvSlot:
    """One sub-environment and the bookkeeping its restarts need (written by
    :class:`EnvSlots` only)."""

    #: its position in the actor; failures name it by this
    index: int
    env_fn: EnvFn
    env: Any = None
    last_obs: Any = None
    needs_reset: bool = False
    #: recreated after a failure and not reset since
    fresh: bool = False
    #: the autoreset mode its episode started in (its last reset; the actor's own before)
    episode_mode: AutoresetMode = AutoresetMode.NEXT_STEP
    #: the actor serves another mode now (a lease's): its episode means nothing in that
    #: one (one NEXT_STEP ended, one DISABLED left over), so it is reset before a step
    mode_changed: bool = False
    seed: int | None = None
    restarts: int = 0
    #: consecutive failures: ended by a good step, not by a reset (an env that resets
    #: fine but always fails its first step is still a crash loop)
    streak: restart_rules.Streak = field(default_factory=restart_rules.Streak)


class EnvSlots:
    """The actor's sub-envs: creating, restarting and closing them, their seeds and
    what autoreset needs of each.

    Args:
        env_fns: one make-env callable per sub-env.
        restart_failed: restart a sub-env that raises instead of reporting it.
        max_restarts: consecutive failed restarts allowed per sub-env.
        restart_backoff_s: first backoff; doubles per consecutive failure.
        restart_seeds: after an actor restart, the seeds the envs had: they come back
            un-reset (NEXT_STEP resets them on the next step) and their first reset
            uses a restart seed.
        restart_counts: restart counts carried over from a dead actor.
    """

    def __init__(
        self,
        env_fns: Sequence[EnvFn],
        *,
        restart_failed: bool,
        max_restarts: int,
        restart_backoff_s: float,
        restart_seeds: Sequence[int | None] | None = None,
        restart_counts: Sequence[int] | None = None,
        mode: AutoresetMode = AutoresetMode.NEXT_STEP,
    ) -> None:
        self._restart = restart_failed
        # some env's mode_changed is set: the stepper's lean loop leaves them to the
        # generic code (one check a call rather than one an env)
        self._mode_changed = False
        # a good step is the proof of health (healthy_after_s=0)
        self._crash_loop = restart_rules.CrashLoop(max_restarts, restart_backoff_s)
        self._slots = [
            EnvSlot(
                i,
                fn,
                restarts=0 if restart_counts is None else restart_counts[i],
                seed=None if restart_seeds is None else restart_seeds[i],
                needs_reset=restart_seeds is not None,
                fresh=restart_seeds is not None,
                episode_mode=mode,
            )
            for i, fn in enumerate(env_fns)
        ]

    # ------------------------------------------------------------------ views
    def __len__(self) -> int:
        return len(self._slots)

    def __getitem__(self, position: int) -> EnvSlot:
        return self._slots[position]

    @property
    def by_position(self) -> list[EnvSlot]:
        """The slots, indexed by position (the shared-memory loop's: no call an env)."""
        return self._slots

    def __iter__(self) -> Iterator[EnvSlot]:
        return iter(self._slots)

    def seeds(self) -> list[int | None]:
        return [s.seed for s in self._slots]

    def restart_counts(self) -> list[int]:
        return [s.restarts for s in self._slots]

    def reset_required(self) -> list[int]:
        """Positions of the envs not reset since the autoreset mode changed."""
        return [s.index for s in self._slots if s.mode_changed]

    @property
    def mode_changed(self) -> bool:
        """Some env is due for a reset because the autoreset mode changed."""
        return self._mode_changed

    # ------------------------------------------------------------- lifecycle
    def create_all(self) -> list[Failure]:
        """Create every sub-env; stop at the first that fails for good."""
        failures: list[Failure] = []
        for slot in self._slots:
            failure = self._create(slot, first=True)
            if failure is not None:
                failures.append(failure)
                if failure.permanent:
                    break
        return failures

    def restart(self, slot: EnvSlot, reason: FailureReason, exc: BaseException) -> Failure:
        """Replace a failed env; the caller decides what the failed step returns.

        Call it in the ``except`` block: the failure's traceback is the one being handled.
        """
        tb = traceback.format_exc()
        message = f"{type(exc).__name__}: {exc}"
        delay = self._crash_loop.failed(slot.streak)
        if not self._restart or delay is None:
            return Failure(slot.index, reason, message, tb, permanent=True)
        try:
            slot.env.close()
        except Exception:  # a broken env may not close cleanly; it is replaced anyway
            pass
        _sleep(delay)
        slot.env = None
        failure = self._create(slot, first=False)
        if failure is not None:
            return Failure(slot.index, reason, f"{message}; then {failure.message}", tb, permanent=True)
        slot.restarts += 1
        slot.needs_reset = True
        slot.fresh = True
        return Failure(slot.index, reason, message, tb, restarted=True)

    def close_all(self) -> list[tuple[int, str]]:
        """Close every sub-env; ``(position, error)`` of those whose ``close()`` raised."""
        failed: list[tuple[int, str]] = []
        for slot in self._slots:
            close = getattr(slot.env, "close", None)  # a plain multi-agent env may have none
            if callable(close):
                try:
                    close()
                except Exception as exc:
                    failed.append((slot.index, f"{type(exc).__name__}: {exc}"))
            slot.env = None
        return failed

    # ------------------------------------------------- what a call did to a slot
    def reset_seed(self, slot: EnvSlot, seed: int | None) -> int | None:
        """The seed ``slot``'s reset uses: a given one (remembered for its restarts),
        else, first after a restart, :func:`restart_seed` to keep the run reproducible."""
        if seed is None and slot.fresh and slot.seed is not None:
            return restart_seed(slot.seed, slot.restarts)
        if seed is not None:
            slot.seed = seed
        return seed

    def was_reset(self, slot: EnvSlot, obs: Any, mode: AutoresetMode) -> None:
        """``slot`` was reset, its new episode stepped in ``mode``."""
        slot.needs_reset = False
        slot.fresh = False
        slot.episode_mode = mode
        slot.last_obs = obs
        if slot.mode_changed:
            slot.mode_changed = False
            self._mode_changed = any(s.mode_changed for s in self._slots)

    def stepped(self, slot: EnvSlot, obs: Any) -> None:
        """A good step: it ends a crash loop."""
        if slot.streak.failures:
            self._crash_loop.succeeded(slot.streak)
        slot.last_obs = obs

    def observed(self, slots: Sequence[EnvSlot], observations: Sequence[Any]) -> None:
        """Good steps of envs in no crash loop (the shared-memory loop's, at once)."""
        for slot, obs in zip(slots, observations, strict=True):
            slot.last_obs = obs

    def reset_due(self, slot: EnvSlot) -> None:
        """Its episode ended (NEXT_STEP) or its step failed (DISABLED): reset first."""
        slot.needs_reset = True

    def serving(self, mode: AutoresetMode) -> None:
        """The actor steps in ``mode`` from now on: an env whose episode started in
        another must be reset before its next step (an episode a NEXT_STEP lease left
        ended, or a DISABLED one left over, is not one another mode can continue;
        gymnasium asks for a reset after a switch too). Back in its episode's mode, an
        env goes on where it was."""
        for slot in self._slots:
            slot.mode_changed = slot.episode_mode is not mode
        self._mode_changed = any(s.mode_changed for s in self._slots)

    # --------------------------------------------------------------- internals
    def _create(self, slot: EnvSlot, *, first: bool) -> Failure | None:
        """(Re)create a slot's env, retrying with backoff when restarts are on."""
        while True:
            try:
                env = slot.env_fn()
                if is_actor_handle(env):
                    env = ActorEnvProxy(env)
                slot.env = multi_agent.as_parallel(env)  # PettingZoo AEC: converted or refused
                return None
            except Exception as exc:
                delay = self._crash_loop.failed(slot.streak)
                tb = traceback.format_exc()
                if not self._restart or delay is None:
                    what = "constructor raised" if first else "constructor raised on restart"
                    tries = "" if not self._restart else f" ({slot.streak.failures} tries)"
                    return Failure(
                        slot.index,
                        "exception",
                        f"{what}{tries}: {type(exc).__name__}: {exc}",
                        tb,
                        permanent=True,
                    )
                _sleep(delay)


def _sleep(delay: float) -> None:
    if delay > 0:
        time.sleep(delay)


def is_actor_handle(obj: Any) -> bool:
    try:
        from ray.actor import ActorHandle
    except ImportError:  # pragma: no cover - ray is a dependency
        return False
    return isinstance(obj, ActorHandle)
