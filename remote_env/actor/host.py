"""The actor side: one host holds ``envs_per_actor`` sub-environments.

``SubEnvHost`` is a plain class so it can be unit-tested in-process; the vector
env wraps it with ``ray.remote``. One call steps every sub-env it is given, which
is what makes Ray affordable (an actor round trip costs ~1 ms on 2 cores).

Autoreset happens here, not in the driver, so NEXT_STEP / SAME_STEP never cost an
extra round trip and a restarted env can be reset where it lives.

Envs that wait on I/O can say so by defining coroutine methods ``astep(action)`` and
``areset(*, seed=None, options=None)`` next to the usual ``step``/``reset``; a host
whose envs have both awaits them concurrently on one event loop instead of
blocking a thread per env.

The rest of the actor, each in its own module, is listed in :mod:`remote_env.actor`.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import threading
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode

from remote_env import multi_agent
from remote_env import restarts as restarts_mod
from remote_env._types import Batch, Failure
from remote_env.actor.faults import EnvFn, Slot, SlotFaults, restart_seed
from remote_env.actor.steps import MalformedResultError, reset_one, run_sync, step_one
from remote_env.actor.threads import Gang
from remote_env.actor.transport import HostTransport
from remote_env.spec.fields import DEFAULT_MAX_RESTARTS

__all__ = ["EnvFn", "MalformedResultError", "SubEnvHost", "has_async_api", "restart_seed"]


def has_async_api(env: Any) -> bool:
    """True if ``env`` defines both ``async def astep`` and ``async def areset``."""
    return inspect.iscoroutinefunction(getattr(env, "astep", None)) and inspect.iscoroutinefunction(
        getattr(env, "areset", None)
    )


class SubEnvHost(HostTransport, SlotFaults):
    """Hosts some sub-environments of one vector env.

    Args:
        env_fns: one make-env callable per sub-env; failures name sub-envs by
            their position here and the driver maps that to its env index.
        autoreset_mode: gymnasium autoreset mode, applied here.
        restart_failed: restart a sub-env that raises instead of reporting it.
        max_restarts: consecutive failed restarts allowed per sub-env.
        restart_backoff_s: first backoff; doubles per consecutive failure.
        threads: step sub-envs on this many threads (for envs that wait on I/O).
        restart_seeds: after an actor restart, the seeds the envs had, so their
            first reset is seeded as :func:`restart_seed` says.
        restarts: restart counts carried over from a dead actor.
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
        self._slots = [Slot(i, fn) for i, fn in enumerate(env_fns)]
        self._info: dict[str, Any] | None = None
        self._mode = AutoresetMode(autoreset_mode)
        self._restart = restart_failed
        self._crash_loop = restarts_mod.CrashLoop(max_restarts, restart_backoff_s)
        self._multi_agent_hint = multi_agent_hint
        self._multi_agent = False
        self._box_obs = False
        self._obs_shape: tuple[int, ...] | None = None
        self._discrete_obs = False
        self._pool = Gang(threads) if threads > 1 else None
        # envs with astep/areset: awaited together on this loop, run by a thread of its
        # own (made on first use), so it works whichever thread (Ray's or a channel's)
        # brings the call
        self._async = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: threading.Thread | None = None
        # step/reset may also arrive over a channel (its own thread): one call at a time
        self._lock = threading.RLock()
        self._channel: Any = None
        self._conn = threading.local()
        # highest lease epoch seen (pool actors): calls with an older one are refused
        self._fence = 0
        for n, slot in enumerate(self._slots):
            if restarts is not None:
                slot.restarts = restarts[n]
            if restart_seeds is not None:
                slot.seed = restart_seeds[n]
                # The envs of a dead actor come back un-reset: NEXT_STEP resets them on
                # the next step; the first reset uses a restart seed.
                slot.needs_reset = True
                slot.fresh = True

    # ----------------------------------------------------------------- set-up
    def start(self) -> dict[str, Any]:
        """Create the sub-envs; return spaces and metadata of the first one.

        Separate from ``__init__`` so a constructor that raises arrives as a normal
        task error (with its traceback) rather than as an actor that died.
        """
        if self._info is not None:
            return {**self._info, "failures": []}
        failures: list[Failure] = []
        for slot in self._slots:
            failure = self._create(slot, first=True)
            if failure is not None:
                failures.append(failure)
                if failure.permanent:
                    return {"failures": failures}
        env = self._slots[0].env
        self._multi_agent = (
            self._multi_agent_hint
            if self._multi_agent_hint is not None
            else multi_agent.is_multi_agent(env)
        )
        obs_space, act_space = self._spaces(env)
        self._box_obs = isinstance(obs_space, gym.spaces.Box)
        self._obs_shape = obs_space.shape if self._box_obs else None
        self._discrete_obs = isinstance(obs_space, gym.spaces.Discrete)
        self._async = not self._multi_agent and has_async_api(env)
        # the driver refuses spaces that differ (as SyncVectorEnv does), whichever
        # actor the envs landed in: say which slots differ from the first
        other_spaces = {}
        for slot in self._slots[1:]:
            spaces = self._spaces(slot.env)
            if spaces != (obs_space, act_space):
                other_spaces[slot.index] = spaces
        self._info = {
            "num_envs": len(self._slots),
            "observation_space": obs_space,
            "action_space": act_space,
            "metadata": dict(getattr(env, "metadata", {}) or {}),
            "render_mode": getattr(env, "render_mode", None),
            "multi_agent": self._multi_agent,
            "async_steps": self._async,
            "other_spaces": other_spaces,
            "pid": os.getpid(),
        }
        return {**self._info, "failures": failures}

    def _spaces(self, env: Any) -> tuple[Any, Any]:
        if self._multi_agent:
            return multi_agent.spaces(env)
        return env.observation_space, env.action_space

    def describe(self) -> dict[str, Any] | None:
        """What :meth:`start` returned, for a driver adopting a running host."""
        return self._info

    # ------------------------------------------------------------------ calls
    def ping(self) -> int:
        return os.getpid()

    def reset(
        self,
        positions: Sequence[int],
        seeds: Sequence[int | None],
        options: dict[str, Any] | None,
    ) -> Batch:
        """Reset the slots at ``positions`` (host-local)."""
        with self._lock:
            results = self._map(
                lambda p, s: reset_one(self, self._slots[p], s, options), positions, seeds
            )
            return self._pack(positions, results, is_reset=True)

    def step(self, positions: Sequence[int], actions: Sequence[Any]) -> Batch:
        """Step (or autoreset) the slots at ``positions`` with ``actions``."""
        with self._lock:
            results = self._map(lambda p, a: step_one(self, self._slots[p], a), positions,
                                actions)
            return self._pack(positions, results, is_reset=False)

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
        return [s.seed for s in self._slots]

    def restart_counts(self) -> list[int]:
        return [s.restarts for s in self._slots]

    def close(self) -> list[tuple[int, str]]:
        """Close every sub-env (after the call running, if any); return ``(position,
        error)`` of those whose ``close()`` raised, for the driver to report.

        The driver waits for this (``close_timeout_s``) before it kills the actor, so
        an env's own cleanup (a last video written, a simulator's state saved) runs.
        """
        if self._channel is not None:
            self._channel.close()
            self._channel = None
        failed: list[tuple[int, str]] = []
        with self._lock:  # not while a channel call is stepping these envs
            for slot in self._slots:
                close = getattr(slot.env, "close", None)  # a plain multi-agent env may have none
                if callable(close):
                    try:
                        close()
                    except Exception as exc:
                        failed.append((slot.index, f"{type(exc).__name__}: {exc}"))
                slot.env = None
        if self._pool is not None:
            self._pool.close()
        if self._loop is not None and self._loop_thread is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._loop_thread.join(timeout=10)
            if not self._loop_thread.is_alive():
                self._loop.close()
            self._loop = self._loop_thread = None
        return failed

    # --------------------------------------------------------------- internals
    def _map(
        self,
        fn: Callable[[int, Any], Coroutine[Any, Any, Any]],
        a: Sequence[int],
        b: Sequence[Any],
    ) -> list[Any]:
        """``fn`` over pairs: awaited together (async envs), on the gang, or in turn."""
        if self._async:
            if self._loop is None:
                self._loop = asyncio.new_event_loop()
                self._loop_thread = threading.Thread(target=self._loop.run_forever,
                                                     name="subenv-asyncio", daemon=True)
                self._loop_thread.start()

            async def gather() -> list[Any]:
                return list(await asyncio.gather(*(fn(x, y) for x, y in zip(a, b, strict=True))))

            return asyncio.run_coroutine_threadsafe(gather(), self._loop).result()
        if self._pool is None or len(a) == 1:
            return [run_sync(fn(x, y)) for x, y in zip(a, b, strict=True)]
        return self._pool.map(lambda x, y: run_sync(fn(x, y)), a, b)

    def _pack(self, positions: Sequence[int], results: list[Any], *, is_reset: bool) -> Batch:
        obs = [r[0] for r in results]
        failures = [r[5] for r in results if r[5] is not None]
        if self._multi_agent:
            return Batch(
                [self._slots[p].index for p in positions],
                obs,
                [r[1] for r in results],
                [r[2] for r in results],
                [r[3] for r in results],
                [r[4] for r in results],
                failures,
                is_reset,
            )
        stacked: Any = obs
        if self._box_obs and all(o is not None for o in obs):
            stacked = np.stack(obs)
        return Batch(
            [self._slots[p].index for p in positions],
            stacked,
            np.fromiter((r[1] for r in results), dtype=np.float64, count=len(results)),
            np.fromiter((bool(r[2]) for r in results), dtype=np.bool_, count=len(results)),
            np.fromiter((bool(r[3]) for r in results), dtype=np.bool_, count=len(results)),
            [r[4] for r in results],
            failures,
            is_reset,
        )

