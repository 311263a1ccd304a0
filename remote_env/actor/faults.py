"""The actor's fault handling: one sub-env's slot, creating it, restarting it.

A sub-env that raises is closed and rebuilt where it lives (``restart_failed``),
with backoff and a cap on consecutive failures; its first reset after a restart
uses :func:`restart_seed` so a run with faults stays reproducible.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np

from remote_env import multi_agent, restarts
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


class Slot:
    """One sub-environment and the bookkeeping its restarts need."""

    __slots__ = (
        "env",
        "env_fn",
        "fresh",
        "index",
        "last_obs",
        "needs_reset",
        "restarts",
        "seed",
        "streak",
    )

    def __init__(self, index: int, env_fn: EnvFn) -> None:
        self.index = index
        self.env_fn = env_fn
        self.env: Any = None
        self.last_obs: Any = None
        self.needs_reset = False
        # recreated after a failure and not reset since
        self.fresh = False
        self.seed: int | None = None
        self.restarts = 0
        # consecutive failures: ended by a good step, not by a reset (an env that resets
        # fine but always fails its first step is still a crash loop)
        self.streak = restarts.Streak()



class SlotFaults:
    """Mixin of :class:`~remote_env.actor.host.SubEnvHost`: (re)creating its sub-envs."""

    _restart: bool
    #: a good step is the proof of health (healthy_after_s=0)
    _crash_loop: restarts.CrashLoop

    def _create(self, slot: Slot, *, first: bool) -> Failure | None:
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

    def _restart_slot(self, slot: Slot, reason: FailureReason, exc: BaseException) -> Failure:
        """Replace a failed env; the caller decides what the failed step returns."""
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


def _sleep(delay: float) -> None:
    if delay > 0:
        time.sleep(delay)


def is_actor_handle(obj: Any) -> bool:
    try:
        from ray.actor import ActorHandle
    except ImportError:  # pragma: no cover - ray is a dependency
        return False
    return isinstance(obj, ActorHandle)
