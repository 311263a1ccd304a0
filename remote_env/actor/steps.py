"""The actor's per-env stepping: reset, step, autoreset, failed steps, result checks.

Written once as coroutines: envs with ``astep``/``areset`` are awaited together on
the host's event loop; for ordinary envs they never suspend and :func:`run_sync`
runs them to completion without one (~1 us per step).

The host's lean shared-memory loop calls ``env.step`` itself and hands the results
it does not take as they are to :func:`stepped` (or an exception to
:func:`failed_step`), so both ways run the same checks and autoreset.

Module functions, not SubEnvHost methods: Ray turns a class with any ``async def``
method into an asyncio actor, which does not run calls in the order they were sent
(a replacement actor's step() could run before its start()).
"""

from __future__ import annotations

from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
from gymnasium.vector import AutoresetMode

from remote_env import multi_agent
from remote_env.actor.faults import Slot, restart_seed

if TYPE_CHECKING:
    from remote_env.actor.host import SubEnvHost

T = TypeVar("T")


def run_sync(coro: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine that never suspends (the host's per-env logic on a sync env)."""
    try:
        coro.send(None)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]
    coro.close()
    raise RuntimeError("a sub-env step awaited outside the host's event loop")


async def _do_reset(
    host: SubEnvHost, slot: Slot, seed: int | None, options: dict[str, Any] | None
) -> Any:
    if seed is None and slot.fresh and slot.seed is not None:
        # first reset after a restart: keep the run reproducible
        seed = restart_seed(slot.seed, slot.restarts)
    elif seed is not None:
        slot.seed = seed
    if host._multi_agent:
        obs, info = multi_agent.reset(slot.env, seed, options)
    elif host._async:
        obs, info = await slot.env.areset(seed=seed, options=options)
    else:
        obs, info = slot.env.reset(seed=seed, options=options)
    if not host._multi_agent:
        check_obs(host, obs, "reset")
        if not isinstance(info, dict):
            raise MalformedResultError(f"reset returned info of type {type(info).__name__}, "
                                       "expected a dict")
    slot.needs_reset = False
    slot.fresh = False
    slot.last_obs = obs
    return obs, info


async def reset_one(
    host: SubEnvHost, slot: Slot, seed: int | None, options: dict[str, Any] | None
) -> Any:
    failure = None
    while True:
        try:
            obs, info = await _do_reset(host, slot, seed, options)
            # a reset does not end a crash loop; a good step does (see Slot.streak)
            if failure is not None:
                info = {**info, "error": failure.message}
            return obs, 0.0, False, False, info, failure
        except Exception as exc:
            failure = host._restart_slot(slot, "exception", exc)
            if failure.permanent:
                return slot.last_obs, 0.0, False, False, {"error": failure.message}, failure
            seed = None


async def step_one(host: SubEnvHost, slot: Slot, action: Any) -> Any:
    if slot.needs_reset and host._mode is AutoresetMode.NEXT_STEP:
        obs, _, _, _, info, failure = await reset_one(host, slot, None, None)
        if host._multi_agent:
            agents = multi_agent.agent_ids(obs)
            flags = {**{a: False for a in agents}, multi_agent.ALL: False}
            return obs, {a: 0.0 for a in agents}, flags, dict(flags), info, failure
        return obs, 0.0, False, False, info, failure
    try:
        if host._multi_agent:
            obs, rew, term, trunc, info = multi_agent.step(slot.env, action)
            done = multi_agent.episode_over(slot.env, term, trunc)
        elif host._async:
            obs, rew, term, trunc, info = await slot.env.astep(action)
        else:
            obs, rew, term, trunc, info = slot.env.step(action)
    except Exception as exc:
        return await failed_step(host, slot, exc)
    if not host._multi_agent:  # the checks and bookkeeping the lean loop hands over too
        return await stepped(host, slot, obs, rew, term, trunc, info)
    return await _ended(host, slot, obs, rew, term, trunc, info, done)


async def stepped(host: SubEnvHost, slot: Slot, obs: Any, rew: Any, term: Any, trunc: Any,
                  info: Any) -> Any:
    """The rest of :func:`step_one` for a single-agent env whose step returned these;
    the host's lean loop (:meth:`~remote_env.actor.transport.HostTransport.shared_step`)
    hands over each result it does not take as it is (malformed, or an episode end)."""
    try:
        check_step(host, obs, rew, term, trunc, info)
        done = bool(term or trunc)
    except Exception as exc:
        return await failed_step(host, slot, exc)
    return await _ended(host, slot, obs, rew, term, trunc, info, done)


async def _ended(host: SubEnvHost, slot: Slot, obs: Any, rew: Any, term: Any, trunc: Any,
                 info: Any, done: bool) -> Any:
    """A good step's result, once its bookkeeping is done (SAME_STEP: reset at its end)."""
    if _good_step(host, slot, obs, done):
        return await _same_step_end(host, slot, obs, rew, term, trunc, info)
    return obs, rew, term, trunc, info, None


def _good_step(host: SubEnvHost, slot: Slot, obs: Any, done: bool) -> bool:
    """A step's bookkeeping; True: SAME_STEP mode resets the env now."""
    if slot.streak.failures:  # a good step ends a crash loop
        host._crash_loop.succeeded(slot.streak)
    slot.last_obs = obs
    if done:
        if host._mode is AutoresetMode.NEXT_STEP:
            slot.needs_reset = True
        elif host._mode is AutoresetMode.SAME_STEP:
            return True
    return False


async def _same_step_end(host: SubEnvHost, slot: Slot, obs: Any, rew: Any, term: Any,
                         trunc: Any, info: Any) -> Any:
    final = {"final_obs": obs, "final_info": info}
    obs, info, failure = await _same_step_reset(host, slot)
    return obs, rew, term, trunc, {**final, **info}, failure


async def _same_step_reset(host: SubEnvHost, slot: Slot) -> Any:
    obs, _, _, _, info, failure = await reset_one(host, slot, None, None)
    return obs, info, failure


async def failed_step(host: SubEnvHost, slot: Slot, exc: BaseException) -> Any:
    """A failed step ends the episode: truncated, with the error in info.

    Call it in the ``except`` block: the failure's traceback is the one being handled.
    """
    failure = host._restart_slot(slot, "exception", exc)
    info: dict[str, Any] = {"error": failure.message}
    term: Any = False
    trunc: Any = True
    rew: Any = 0.0
    if host._multi_agent:
        agents = multi_agent.agent_ids(slot.last_obs)
        term, trunc, rew = multi_agent.ended_dicts(agents)
    obs = slot.last_obs
    if failure.restarted and host._mode is AutoresetMode.SAME_STEP:
        final = {"final_obs": obs, "final_info": dict(info)}
        obs, reset_info, again = await _same_step_reset(host, slot)
        info = {**final, **reset_info, "error": failure.message}
        if again is not None:
            failure = again
    elif not failure.permanent and host._mode is AutoresetMode.DISABLED:
        slot.needs_reset = True
    return obs, rew, term, trunc, info, failure


class MalformedResultError(TypeError):
    """An env's step/reset returned something gymnasium's contract does not allow."""


#: what check_step takes without looking further (the lean loop's cheap checks too)
SCALARS = (float, int, np.floating, np.integer)
FLAGS = (bool, np.bool_)


def check_obs(host: SubEnvHost, obs: Any, where: str) -> None:
    if host._obs_shape is not None:
        shape = getattr(obs, "shape", None)
        if shape != host._obs_shape and np.shape(obs) != host._obs_shape:
            raise MalformedResultError(
                f"{where} returned an observation of shape {np.shape(obs)}, expected "
                f"{host._obs_shape} (the observation space's shape)")
    elif host._discrete_obs and np.ndim(obs) != 0:
        raise MalformedResultError(
            f"{where} returned an observation of shape {np.shape(obs)} for a Discrete space")


def check_step(host: SubEnvHost, obs: Any, rew: Any, term: Any, trunc: Any, info: Any) -> None:
    """Refuse a malformed result here, as this env's failure: packed with its siblings'
    it would fail the whole actor's call."""
    if not isinstance(rew, SCALARS) and (
        isinstance(rew, (str, bytes)) or np.ndim(rew) != 0
        or np.asarray(rew).dtype.kind not in "biuf"
    ):
        raise MalformedResultError(
                f"step returned reward {rew!r} ({type(rew).__name__}), expected a real number")
    for name, flag in (("terminated", term), ("truncated", trunc)):
        if not isinstance(flag, FLAGS) and (
            isinstance(flag, (str, bytes)) or np.ndim(flag) != 0
            or np.asarray(flag).dtype.kind not in "biu"
        ):
            raise MalformedResultError(
                f"step returned {name}={flag!r} ({type(flag).__name__}), expected a bool")
    if not isinstance(info, dict):
        raise MalformedResultError(f"step returned info of type {type(info).__name__}, "
                                   "expected a dict")
    check_obs(host, obs, "step")

