"""What an env actor does, as a plain object: set-up, reset/step/call, the lease fence.

:class:`HostCore` holds the call lock and the lease fence and composes the env
slots (:mod:`remote_env.actor.slots`), the per-env stepper
(:mod:`remote_env.actor.steps`) and the batch runner (:mod:`remote_env.actor.runner`).
The Ray actor class (:mod:`remote_env.actor.host`) delegates to it, and so does the
channel endpoint (:mod:`remote_env.actor.endpoint`), without Ray's method wrappers.

One call steps every sub-env it is given, which is what makes Ray affordable (an
actor round trip costs ~1 ms on 2 cores). Autoreset happens here, not in the driver,
so NEXT_STEP / SAME_STEP never cost an extra round trip and a restarted env can be
reset where it lives.
"""

from __future__ import annotations

import inspect
import os
import threading
from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym
from gymnasium.vector import AutoresetMode

from remote_env import errors, multi_agent
from remote_env._types import Batch
from remote_env.actor.runner import BatchRunner
from remote_env.actor.slots import EnvFn, EnvSlots
from remote_env.actor.steps import EnvKind, EnvStepper
from remote_env.spec.fields import DEFAULT_MAX_RESTARTS
from remote_env.wire import shared_arrays


def has_async_api(env: Any) -> bool:
    """True if ``env`` defines both ``async def astep`` and ``async def areset``."""
    return inspect.iscoroutinefunction(getattr(env, "astep", None)) and inspect.iscoroutinefunction(
        getattr(env, "areset", None)
    )


class HostCore:
    """One actor's sub-envs and the calls on them; one call at a time.

    Args: as :class:`remote_env.actor.host.SubEnvHost`.
    """

    def __init__(
        self,
        env_fns: Sequence[EnvFn],
        *,
        autoreset_mode: str = AutoresetMode.NEXT_STEP.value,
        restart_failed: bool = False,
        max_restarts: int = DEFAULT_MAX_RESTARTS,
        restart_backoff_s: float = 0.0,
        threads: int = 1,
        restart_seeds: Sequence[int | None] | None = None,
        restarts: Sequence[int] | None = None,
        multi_agent_hint: bool | None = None,
    ) -> None:
        self._slots = EnvSlots(env_fns, restart_failed=restart_failed,
                               max_restarts=max_restarts, restart_backoff_s=restart_backoff_s,
                               restart_seeds=restart_seeds, restart_counts=restarts)
        self._stepper = EnvStepper(self._slots, AutoresetMode(autoreset_mode))
        self._runner = BatchRunner(threads)
        self._multi_agent_hint = multi_agent_hint
        self._info: dict[str, Any] | None = None
        # calls arrive from Ray's thread and from channel connections (a thread each):
        # one at a time
        self._lock = threading.RLock()
        # highest lease epoch seen (pool actors): calls with an older one are refused
        self._fence = 0

    # ----------------------------------------------------------------- set-up
    def start(self) -> dict[str, Any]:
        """Create the sub-envs; return spaces and metadata of the first one."""
        with self._lock:
            if self._info is not None:
                return {**self._info, "failures": []}
            failures = self._slots.create_all()
            if any(f.permanent for f in failures):
                return {"failures": failures}
            env = self._slots[0].env
            is_multi_agent = (self._multi_agent_hint if self._multi_agent_hint is not None
                              else multi_agent.is_multi_agent(env))
            obs_space, act_space = _spaces(env, is_multi_agent)
            box = isinstance(obs_space, gym.spaces.Box)
            kind = EnvKind(
                multi_agent=is_multi_agent,
                asynchronous=not is_multi_agent and has_async_api(env),
                obs_shape=obs_space.shape if box else None,
                discrete_obs=isinstance(obs_space, gym.spaces.Discrete),
            )
            self._stepper.learned(kind)
            if kind.asynchronous:
                self._runner.await_together()
            # the driver refuses spaces that differ (as SyncVectorEnv does), whichever
            # actor the envs landed in: say which slots differ from the first
            other_spaces = {}
            for slot in list(self._slots)[1:]:
                spaces = _spaces(slot.env, is_multi_agent)
                if spaces != (obs_space, act_space):
                    other_spaces[slot.index] = spaces
            self._info = {
                "num_envs": len(self._slots),
                "observation_space": obs_space,
                "action_space": act_space,
                "metadata": dict(getattr(env, "metadata", {}) or {}),
                "render_mode": getattr(env, "render_mode", None),
                "multi_agent": is_multi_agent,
                "async_steps": kind.asynchronous,
                "other_spaces": other_spaces,
                "pid": os.getpid(),
            }
            return {**self._info, "failures": failures}

    def describe(self) -> dict[str, Any] | None:
        """What :meth:`start` returned, None before it succeeded."""
        return self._info

    # ------------------------------------------------------------------ calls
    def ping(self) -> int:
        return os.getpid()

    def reset(self, positions: Sequence[int], seeds: Sequence[int | None],
              options: dict[str, Any] | None) -> Batch:
        """Reset the slots at ``positions`` (host-local)."""
        stepper = self._stepper
        with self._lock:
            results = self._runner.map(
                lambda p, s: stepper.reset_one(p, s, options), positions, seeds)
            return stepper.pack(positions, results, is_reset=True)

    def step(self, positions: Sequence[int], actions: Sequence[Any]) -> Batch:
        """Step (or autoreset) the slots at ``positions`` with ``actions``."""
        stepper = self._stepper
        with self._lock:
            results = self._runner.map(stepper.step_one, positions, actions)
            return stepper.pack(positions, results, is_reset=False)

    def step_shared(self, arrays: shared_arrays.SharedArrays, positions: Sequence[int],
                    actions: Any = None) -> Batch:
        """:meth:`step` through shared ``arrays``: actions read from them unless given,
        results written into them; the batch holds only infos (if any) and failures."""
        stepper = self._stepper
        with self._lock:
            if actions is None:
                actions = arrays.actions[shared_arrays.rows(positions)].copy()
            if self._runner.inline and not stepper.kind.multi_agent:
                return stepper.step_lean(arrays, positions, actions)
            results = self._runner.map(stepper.step_one, positions, actions)
            return stepper.write_shared(arrays, positions, results)

    def call(self, positions: Sequence[int], name: str, args: Any, kwargs: Any) -> list[Any]:
        """``name`` of each env, called if callable; through wrappers, as SyncVectorEnv."""
        with self._lock:
            out = []
            for p in positions:
                env = self._slots[p].env
                get = getattr(env, "get_wrapper_attr", None)
                attr = get(name) if get is not None else getattr(env, name)
                out.append(attr(*args, **kwargs) if callable(attr) else attr)
            return out

    def set_attr(self, positions: Sequence[int], name: str, values: Sequence[Any]) -> None:
        """Set ``name`` where a wrapper or the env defines it (``set_wrapper_attr``)."""
        with self._lock:
            for p, v in zip(positions, values, strict=True):
                env = self._slots[p].env
                if hasattr(env, "set_wrapper_attr"):
                    env.set_wrapper_attr(name, v)
                else:
                    setattr(env, name, v)

    def is_wrapped(self, positions: Sequence[int], wrapper_class: type) -> list[bool]:
        """Whether each env has a ``wrapper_class`` wrapper (SB3's ``env_is_wrapped``)."""
        with self._lock:
            out = []
            for p in positions:
                env, found = self._slots[p].env, False
                while env is not None and not found:
                    found = isinstance(env, wrapper_class)
                    env = getattr(env, "env", None) if isinstance(env, gym.Wrapper) else None
                out.append(found)
            return out

    def seeds(self) -> list[int | None]:
        return self._slots.seeds()

    def restart_counts(self) -> list[int]:
        return self._slots.restart_counts()

    # ----------------------------------------------------------------- leases
    def fence(self, epoch: int) -> int:
        """Refuse calls of leases older than ``epoch`` from now on; returns the fence."""
        with self._lock:
            self._fence = max(self._fence, int(epoch))
            return self._fence

    def current_fence(self) -> int:
        """The fence now (0: never leased). Without the lock (an int read): the channel's
        handshake asks it while a step may hold the lock."""
        return self._fence

    def fenced(self, epoch: int, call: Callable[..., Any], *args: Any) -> Any:
        """``call(*args)`` for the holder of lease ``epoch``, which raises the fence to it.

        Raises:
            LeaseLostError: a newer lease was granted on this actor.
        """
        with self._lock:  # the check and the call are one step for other callers
            if epoch < self._fence:
                raise errors.LeaseLostError(
                    f"this actor's envs were leased to another trainer (lease epoch "
                    f"{self._fence} > this call's {epoch}): the lease expired; attach again")
            self._fence = epoch
            return call(*args)

    def close(self) -> list[tuple[int, str]]:
        """Close every sub-env (after the call running, if any); ``(position, error)`` of
        those whose ``close()`` raised."""
        with self._lock:  # not while a channel call is stepping these envs
            failed = self._slots.close_all()
        self._runner.close()
        return failed


def _spaces(env: Any, is_multi_agent: bool) -> tuple[Any, Any]:
    if is_multi_agent:
        return multi_agent.spaces(env)
    return env.observation_space, env.action_space
