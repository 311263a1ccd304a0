"""The actor's per-env stepping: reset, step, autoreset, failed steps, result checks.

Written once as coroutines: envs with ``astep``/``areset`` are awaited together on
the batch runner's event loop; for ordinary envs they never suspend and
:func:`run_sync` runs them to completion without one (~1 us per step).

:meth:`EnvStepper.step_lean` (shared-memory steps of sync envs) calls ``env.step``
itself and hands the results it does not take as they are to :meth:`EnvStepper._stepped`
(or an exception to :meth:`EnvStepper._failed_step`), so both ways run the same checks
and autoreset.

Coroutines live here, not on the Ray actor class: Ray turns a class with any
``async def`` method into an asyncio actor, which does not run calls in the order
they were sent (a replacement actor's step() could run before its start()).
"""

from __future__ import annotations

from collections.abc import Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
from gymnasium.vector import AutoresetMode

from remote_env import multi_agent
from remote_env._types import Batch, Failure
from remote_env.actor.slots import EnvSlot, EnvSlots
from remote_env.wire import shared_arrays

T = TypeVar("T")

#: what check_step takes without looking further (the lean loop's cheap checks too)
SCALARS = (float, int, np.floating, np.integer)
FLAGS = (bool, np.bool_)


class MalformedResultError(TypeError):
    """An env's step/reset returned something gymnasium's contract does not allow."""


@dataclass(frozen=True)
class EnvKind:
    """What the first env's spaces and methods say about every env of the actor
    (learnt at start; the defaults hold until then)."""

    multi_agent: bool = False
    #: envs with ``astep``/``areset``: awaited on the runner's event loop
    asynchronous: bool = False
    #: a Box observation space's shape (results are checked against it and stacked)
    obs_shape: tuple[int, ...] | None = None
    discrete_obs: bool = False


def run_sync(coro: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine that never suspends (the per-env logic on a sync env)."""
    try:
        coro.send(None)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]
    coro.close()
    raise RuntimeError("a sub-env step awaited outside the host's event loop")


class EnvStepper:
    """Resets and steps one env at a time as gymnasium's autoreset ``mode`` says; a
    failure is that env's alone (restarted by ``slots`` if allowed), never the call's.

    Each result is ``(obs, reward, terminated, truncated, info, failure or None)``;
    :meth:`pack` makes a call's results one :class:`~remote_env._types.Batch`.
    """

    def __init__(self, slots: EnvSlots, mode: AutoresetMode) -> None:
        self._slots = slots
        self._mode = mode
        self._kind = EnvKind()

    @property
    def kind(self) -> EnvKind:
        return self._kind

    @property
    def mode(self) -> AutoresetMode:
        return self._mode

    def switch(self, mode: AutoresetMode) -> None:
        """Step in ``mode`` from now on (a lease's); envs whose episode started in
        another mode are due for a reset (:meth:`EnvSlots.serving`)."""
        if mode is not self._mode:
            self._mode = mode
            self._slots.serving(mode)

    def learned(self, kind: EnvKind) -> None:
        """What the actor's start found out about its envs."""
        self._kind = kind

    # ------------------------------------------------------------------ reset
    async def reset_one(self, position: int, seed: int | None,
                        options: dict[str, Any] | None) -> Any:
        return await self._reset(self._slots[position], seed, options)

    async def _reset(self, slot: EnvSlot, seed: int | None,
                     options: dict[str, Any] | None) -> Any:
        failure = None
        while True:
            try:
                obs, info = await self._do_reset(slot, seed, options)
                # a reset does not end a crash loop; a good step does (see EnvSlot.streak)
                if failure is not None:
                    info = {**info, "error": failure.message}
                return obs, 0.0, False, False, info, failure
            except Exception as exc:
                failure = self._slots.restart(slot, "exception", exc)
                if failure.permanent:
                    return slot.last_obs, 0.0, False, False, {"error": failure.message}, failure
                seed = None

    async def _do_reset(self, slot: EnvSlot, seed: int | None,
                        options: dict[str, Any] | None) -> Any:
        seed = self._slots.reset_seed(slot, seed)
        kind = self._kind
        if kind.multi_agent:
            obs, info = multi_agent.reset(slot.env, seed, options)
        elif kind.asynchronous:
            obs, info = await slot.env.areset(seed=seed, options=options)
        else:
            obs, info = slot.env.reset(seed=seed, options=options)
        if not kind.multi_agent:
            self.check_obs(obs, "reset")
            if not isinstance(info, dict):
                raise MalformedResultError(f"reset returned info of type {type(info).__name__}, "
                                           "expected a dict")
        self._slots.was_reset(slot, obs, self._mode)
        return obs, info

    # ------------------------------------------------------------------- step
    async def step_one(self, position: int, action: Any) -> Any:
        return await self._step(self._slots[position], action)

    async def _step(self, slot: EnvSlot, action: Any) -> Any:
        kind = self._kind
        # NEXT_STEP's pending autoreset; in any mode, the reset a mode switch makes due
        # (the lease's driver asks for it first: a trainer of an older version may not)
        if slot.mode_changed or (slot.needs_reset and self._mode is AutoresetMode.NEXT_STEP):
            obs, _, _, _, info, failure = await self._reset(slot, None, None)
            if kind.multi_agent:
                agents = multi_agent.agent_ids(obs)
                flags = {**{a: False for a in agents}, multi_agent.ALL: False}
                return obs, {a: 0.0 for a in agents}, flags, dict(flags), info, failure
            return obs, 0.0, False, False, info, failure
        try:
            if kind.multi_agent:
                obs, rew, term, trunc, info = multi_agent.step(slot.env, action)
                done = multi_agent.episode_over(slot.env, term, trunc)
            elif kind.asynchronous:
                obs, rew, term, trunc, info = await slot.env.astep(action)
            else:
                obs, rew, term, trunc, info = slot.env.step(action)
        except Exception as exc:
            return await self._failed_step(slot, exc)
        if not kind.multi_agent:  # the checks and bookkeeping the lean loop hands over too
            return await self._stepped(slot, obs, rew, term, trunc, info)
        return await self._ended(slot, obs, rew, term, trunc, info, done)

    async def _stepped(self, slot: EnvSlot, obs: Any, rew: Any, term: Any, trunc: Any,
                      info: Any) -> Any:
        """The rest of :meth:`step_one` for a single-agent env whose step returned these;
        :meth:`step_lean` hands over each result it does not take as it is (malformed,
        or an episode end)."""
        try:
            self.check_step(obs, rew, term, trunc, info)
            done = bool(term or trunc)
        except Exception as exc:
            return await self._failed_step(slot, exc)
        return await self._ended(slot, obs, rew, term, trunc, info, done)

    async def _ended(self, slot: EnvSlot, obs: Any, rew: Any, term: Any, trunc: Any,
                     info: Any, done: bool) -> Any:
        """A good step's result, once its bookkeeping is done (SAME_STEP: reset at its end)."""
        self._slots.stepped(slot, obs)
        if done:
            if self._mode is AutoresetMode.NEXT_STEP:
                self._slots.reset_due(slot)
            elif self._mode is AutoresetMode.SAME_STEP:
                final = {"final_obs": obs, "final_info": info}
                obs, info, failure = await self._same_step_reset(slot)
                return obs, rew, term, trunc, {**final, **info}, failure
        return obs, rew, term, trunc, info, None

    async def _same_step_reset(self, slot: EnvSlot) -> Any:
        obs, _, _, _, info, failure = await self._reset(slot, None, None)
        return obs, info, failure

    async def _failed_step(self, slot: EnvSlot, exc: BaseException) -> Any:
        """A failed step ends the episode: truncated, with the error in info.

        Call it in the ``except`` block: the failure's traceback is the one being handled.
        """
        failure = self._slots.restart(slot, "exception", exc)
        info: dict[str, Any] = {"error": failure.message}
        term: Any = False
        trunc: Any = True
        rew: Any = 0.0
        if self._kind.multi_agent:
            agents = multi_agent.agent_ids(slot.last_obs)
            term, trunc, rew = multi_agent.ended_dicts(agents)
        obs = slot.last_obs
        if failure.restarted and self._mode is AutoresetMode.SAME_STEP:
            final = {"final_obs": obs, "final_info": dict(info)}
            obs, reset_info, again = await self._same_step_reset(slot)
            info = {**final, **reset_info, "error": failure.message}
            if again is not None:
                failure = again
        elif not failure.permanent and self._mode is AutoresetMode.DISABLED:
            self._slots.reset_due(slot)
        return obs, rew, term, trunc, info, failure

    # ---------------------------------------------------- shared-memory steps
    def step_lean(self, arrays: shared_arrays.SharedArrays, positions: Sequence[int],
                  actions: Any) -> Batch:
        """A step of sync single-agent envs through shared ``arrays``, one env after the
        other, each result written as it comes.

        Why: with cheap envs the generic per-env code (a coroutine, ``run_sync``,
        ``check_step``, then loops over the results) cost more than the envs. Here a
        good step is ``env.step`` and a few ``isinstance``; anything else (a reset
        due, a crash loop, an exception, an episode's end, a result the cheap checks
        do not take) goes to that generic code, so what envs see and return is the
        same either way.
        """
        slots, shape = self._slots, self._kind.obs_shape
        by_position = slots.by_position  # a list: no method call an env
        results: list[Any] = []  # (obs, reward, terminated, truncated, info) per env
        failures: list[Failure] = []
        seen: list[EnvSlot] = []  # good steps taken here: their obs is the last seen
        seen_obs: list[Any] = []
        generic = False  # a result came from the generic code: its flags may be set
        missing = False  # an env out of restarts before its first observation
        switched = slots.mode_changed  # resets a mode switch made due: the generic code's
        for p, action in zip(positions, actions, strict=True):
            slot = by_position[p]
            if slot.needs_reset or slot.streak.failures or switched:
                r = run_sync(self._step(slot, action))
            else:
                try:
                    result = slot.env.step(action)
                    obs, rew, term, trunc, info = result
                except Exception as exc:
                    r = run_sync(self._failed_step(slot, exc))
                else:
                    # exactly what check_step takes without looking further (an
                    # ndarray of the space's shape: a scalar would broadcast into a row)
                    if (type(result) is tuple and type(obs) is np.ndarray
                            and obs.shape == shape
                            and (type(rew) is float or isinstance(rew, SCALARS))
                            and (term is False or isinstance(term, FLAGS))
                            and (trunc is False or isinstance(trunc, FLAGS))
                            and type(info) is dict and not (term or trunc)):
                        seen.append(slot)
                        seen_obs.append(obs)
                        results.append(result)
                        continue
                    r = run_sync(self._stepped(slot, obs, rew, term, trunc, info))
            generic = True
            obs, rew, term, trunc, info, failure = r
            if failure is not None:
                failures.append(failure)
            if obs is None:
                missing = True
            results.append((obs, rew, bool(term), bool(trunc), info))
        slots.observed(seen, seen_obs)  # EnvSlots owns the records: one call, not one an env
        if missing:  # no row to write: send them all packed, as the generic code does
            by_index = {f.index: f for f in failures}
            return self.pack(positions, [(*r, by_index.get(slots[p].index))
                                         for p, r in zip(positions, results, strict=True)],
                             is_reset=False)
        if not results:
            return Batch([], None, None, None, None, [], failures, False)
        observations, rewards, terms, truncs, infos = zip(*results, strict=True)  # columns, in C
        idx = shared_arrays.rows(positions)
        # all rows at once: a row at a time cost ~0.2 us an env more (each passed
        # check_obs: the space's shape, as the rows)
        arrays.obs[idx] = observations
        arrays.rewards[idx] = rewards
        if generic:
            arrays.terminations[idx] = terms
            arrays.truncations[idx] = truncs
        else:  # every step taken here: none ended (a scalar fill, no sequence read)
            arrays.terminations[idx] = False
            arrays.truncations[idx] = False
        return Batch(list(positions), None, None, None, None,
                     list(infos) if any(infos) else [],  # all empty: nothing to ship
                     failures, False)

    def write_shared(self, arrays: shared_arrays.SharedArrays, positions: Sequence[int],
                     results: list[Any]) -> Batch:
        """Write the generic code's results (async envs, threads, ...) into the arrays."""
        if any(r[0] is None for r in results):  # out of restarts before any observation
            return self.pack(positions, results, is_reset=False)
        obs = arrays.obs
        for p, r in zip(positions, results, strict=True):
            obs[p] = r[0]
        idx = shared_arrays.rows(positions)
        arrays.rewards[idx] = [r[1] for r in results]
        arrays.terminations[idx] = [bool(r[2]) for r in results]
        arrays.truncations[idx] = [bool(r[3]) for r in results]
        infos = [r[4] for r in results]
        return Batch(list(positions), None, None, None, None,
                     infos if any(infos) else [],  # all empty: nothing to ship
                     [r[5] for r in results if r[5] is not None], False)

    # ---------------------------------------------------------------- results
    def pack(self, positions: Sequence[int], results: list[Any], *, is_reset: bool) -> Batch:
        """One call's per-env results as a batch (arrays unless multi-agent)."""
        indices = [self._slots[p].index for p in positions]
        obs = [r[0] for r in results]
        failures = [r[5] for r in results if r[5] is not None]
        if self._kind.multi_agent:
            return Batch(
                indices,
                obs,
                [r[1] for r in results],
                [r[2] for r in results],
                [r[3] for r in results],
                [r[4] for r in results],
                failures,
                is_reset,
            )
        stacked: Any = obs
        if self._kind.obs_shape is not None and all(o is not None for o in obs):
            stacked = np.stack(obs)
        return Batch(
            indices,
            stacked,
            np.fromiter((r[1] for r in results), dtype=np.float64, count=len(results)),
            np.fromiter((bool(r[2]) for r in results), dtype=np.bool_, count=len(results)),
            np.fromiter((bool(r[3]) for r in results), dtype=np.bool_, count=len(results)),
            [r[4] for r in results],
            failures,
            is_reset,
        )

    def check_obs(self, obs: Any, where: str) -> None:
        shape = self._kind.obs_shape
        if shape is not None:
            if getattr(obs, "shape", None) != shape and np.shape(obs) != shape:
                raise MalformedResultError(
                    f"{where} returned an observation of shape {np.shape(obs)}, expected "
                    f"{shape} (the observation space's shape)")
        elif self._kind.discrete_obs and np.ndim(obs) != 0:
            raise MalformedResultError(
                f"{where} returned an observation of shape {np.shape(obs)} for a Discrete space")

    def check_step(self, obs: Any, rew: Any, term: Any, trunc: Any, info: Any) -> None:
        """Refuse a malformed result here, as this env's failure: packed with its
        siblings' it would fail the whole actor's call."""
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
        self.check_obs(obs, "step")
