"""The stepping API of :class:`~remote_env.driver.vector.RemoteVectorEnv`: reset and step.

``reset``/``step`` (and gymnasium's ``step_async``/``step_wait``) go to every env,
as ``SyncVectorEnv``'s do; ``async_reset``/``send``/``recv`` are EnvPool-style
dynamic batching over a subset. Each checks the caller's input (:mod:`remote_env.checks`)
and its place in gymnasium's call order before anything is sent.
"""

from __future__ import annotations

import enum
import multiprocessing
import time
from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np

from remote_env import checks, errors, interrupts
from remote_env.driver.assembly import Batches, Results
from remote_env.driver.attributes import EnvAttributes


class _State(enum.Enum):
    """Who waits for the calls in flight (and the results not handed out yet)."""

    IDLE = "idle"  # nothing in flight (calls orphaned by a failed reset/step aside)
    STEP = "step"  # step_async sent every env a step: step_wait() collects
    RECV = "recv"  # send()/async_reset(): recv() collects
    RESET = "reset"  # reset() is collecting; cut short, its calls are over


class _Operation:
    """``with env._operation():`` (a class, not a generator: it runs on every call)."""

    __slots__ = ("env", "held")

    def __init__(self, env: Stepping) -> None:
        self.env = env
        self.held = interrupts.deferred()

    def __enter__(self) -> None:
        self.held.__enter__()

    def __exit__(self, *exc: object) -> None:
        try:
            kind = exc[0]
            self.env._settle(interrupted=isinstance(kind, type)
                             and issubclass(kind, KeyboardInterrupt))
        finally:
            self.held.__exit__(*exc)


class Stepping(EnvAttributes):
    """Mixin of :class:`~remote_env.driver.vector.RemoteVectorEnv`: reset, step, send and recv.

    Every public call is an *operation* (:meth:`_operation`): whatever it raises, an
    env error or an interrupt at any point, it ends in one consistent state. Either
    its calls are still pending and ``step_wait()``/``recv()`` resumes them (an
    interrupt or timeout while waiting, as gymnasium's AsyncVectorEnv after a
    timeout), or it is over and the next call works (an env's error, a ``reset()``
    cut short). An env is in flight, ready (its result received, not handed out) or
    failed; never lost.
    """

    closed: bool
    batch_wait_ms: float
    multi_agent: bool
    single_action_space: Any
    _busy: np.ndarray
    _was_reset: np.ndarray
    _state: _State = _State.IDLE
    # the results being handed out by this operation and the state to go back to if
    # an interrupt arrives before it returns (see _settle)
    _handed: tuple[Batches, _State] | None = None

    def _operation(self) -> _Operation:
        """One public call: interrupts held until its state is whole (raised in its
        waits, or at its end: :mod:`remote_env.interrupts`), and settled at its end."""
        return _Operation(self)

    def _settle(self, *, interrupted: bool = False) -> None:
        handed, self._handed = self._handed, None
        if handed is not None and (interrupted or interrupts.pending()):
            # interrupted while handing results out: they are put back and returned by
            # the next step_wait()/recv(), never lost (an error there ends the call: a
            # result that cannot be assembled would fail every retry)
            batches, state = handed
            self._ready[:0] = batches
            for ids, _ in batches:
                self._busy[ids] = True
            self._state = state
        if self._state is _State.RESET:  # reset() cut short: its calls are over
            self._orphan_all()
            self._state = _State.IDLE
        if not self._calls and not self._ready:
            self._state = _State.IDLE

    def _give_up(self, exc: BaseException) -> None:
        """A step/reset raised an env's error: that call is over. What arrived rides on
        the exception (``exc.results``, as :meth:`recv` returns them); calls still in
        flight (a replacement's follow-up) are waited out before the next send."""
        batches = self._take_ready()
        if batches and isinstance(exc, Exception):
            try:
                exc.results = self._assembler.partial(batches)  # type: ignore[attr-defined]
            except Exception:  # the error is what matters
                pass
        self._orphan_all()
        self._state = _State.IDLE

    # ----------------------------------------------------------------- reset
    def reset(
        self,
        *,
        seed: int | Sequence[int | None] | None = None,
        options: dict[str, Any] | None = None,
    ) -> tuple[Any, dict[str, Any]]:
        """Reset all sub-envs (or those in ``options["reset_mask"]``), like ``SyncVectorEnv``.

        Cut short (an interrupt) or raising, the reset is over: the next call works
        (the calls it sent are waited out first).
        """
        with self._operation():
            self._check_idle("reset")
            seeds = checks.seeds(seed, self.num_envs)
            options = dict(options) if options is not None else None
            mask = np.ones(self.num_envs, dtype=np.bool_)
            if options is not None and "reset_mask" in options:
                mask = checks.reset_mask(options.pop("reset_mask"), self.num_envs)
            env_ids = np.flatnonzero(mask)
            self._state = _State.RESET
            try:
                self._submit(env_ids, [seeds[i] for i in env_ids], options, is_reset=True)
                self._was_reset[env_ids] = True
                self._wait_all(None)
            except Exception as exc:
                self._give_up(exc)
                raise
            obs, _, _, _, infos = self._assembler.full(self._take_ready())
            self._state = _State.IDLE
            return obs, infos

    def async_reset(
        self, *, seed: int | Sequence[int | None] | None = None, options: dict[str, Any] | None = None
    ) -> None:
        """Send a reset to every sub-env; :meth:`recv` returns them as they come (EnvPool style)."""
        with self._operation():
            self._check_idle("async_reset")
            seeds = checks.seeds(seed, self.num_envs)
            ids = np.arange(self.num_envs)
            self._state = _State.RECV  # what was sent is recv()'s, even if sending fails part way
            self._submit(ids, seeds, dict(options) if options else None, is_reset=True)
            self._was_reset[ids] = True

    def _check_idle(self, what: str) -> None:
        self._check_open()
        if self._calls or self._ready:
            raise errors.AlreadyPendingCallError(
                f"Calling `{what}` while waiting for a pending call to `{self._pending_name()}` "
                f"to complete (finish it with {self._finish_with()})",
                self._pending_name(),
            )

    # ------------------------------------------------------------------ step
    def step(self, actions: Any) -> Results:
        """Step every sub-env with ``actions`` (batched as ``action_space``).

        Interrupted while waiting, the step stays pending: ``step_wait()`` returns it.
        """
        self.step_async(actions)
        return self.step_wait()

    def step_async(self, actions: Any) -> None:
        """Send ``actions`` to every sub-env; collect with :meth:`step_wait`."""
        with self._operation():
            self._check_idle("step_async")
            ids = np.arange(self.num_envs)
            self._check_reset(ids)
            acts = self._actions(actions, ids)
            self._state = _State.STEP
            try:
                self._submit(ids, acts, None, is_reset=False)
            except Exception as exc:  # some envs sent, not all: no whole step to wait for
                self._give_up(exc)
                raise

    def step_wait(self, timeout: float | None = None) -> Results:
        """Wait for the step sent by :meth:`step_async`.

        Raises:
            multiprocessing.TimeoutError: not all envs answered within ``timeout``
                seconds (the call stays pending; call ``step_wait`` again). An
                interrupt (Ctrl-C) leaves it pending the same way.
            SubEnvironmentError: an env failed (restarts off, or out of them): the step
                is over; the results of the envs that did step are on the exception
                (``results``, as :meth:`recv` returns them, ids in ``info["env_id"]``).
        """
        with self._operation():
            self._check_open()
            if self._state is not _State.STEP:
                raise errors.NoAsyncCallError(
                    "Calling `step_wait` without any prior call to `step_async`.", "step"
                )
            checks.duration("timeout", timeout, none="wait as long as it takes")
            t0 = time.perf_counter()
            try:
                self._wait_all(timeout)
            except multiprocessing.TimeoutError:
                raise  # still pending
            except Exception as exc:
                self._give_up(exc)
                raise
            batches = self._take_ready()
            self._handed = (batches, _State.STEP)
            self._state = _State.IDLE
            result = self._assembler.full(batches)
            self.metrics.observe_poll(self.num_envs, time.perf_counter() - t0)
            self.metrics.steps.inc(self.num_envs)
            return result

    # ----------------------------------------------- dynamic batching (EnvPool)
    def send(self, actions: Any, env_ids: Sequence[int] | np.ndarray | None = None) -> None:
        """Step the sub-envs ``env_ids`` (all when None) with ``actions``, without waiting.

        ``actions`` holds one action per id, in the order of ``env_ids``: the action
        follows the id, whatever the order (as ``SyncVectorEnv`` given them in id order).
        """
        with self._operation():
            self._check_open()
            if self._state is _State.STEP:
                raise errors.AlreadyPendingCallError(
                    "send() called while a step_async() is pending; call step_wait() first",
                    "step")
            ids = checks.env_ids(env_ids, self.num_envs)
            if self._busy[ids].any():  # the message's mask only when it is needed
                busy = ids[self._busy[ids]]
                raise errors.AlreadyPendingCallError(
                    f"env ids {busy.tolist()} already have a call in flight; recv() their "
                    "results before sending them again",
                    "step",
                )
            self._check_reset(ids)
            acts = self._actions(actions, ids)
            self._state = _State.RECV  # what was sent is recv()'s, even if sending fails part way
            self._submit(ids, acts, None, is_reset=False)

    def _check_reset(self, ids: np.ndarray) -> None:
        """gymnasium's order: reset before the first step (``ResetNeeded``, before sending)."""
        if self._was_reset[ids].all():
            return
        never = ids[~self._was_reset[ids]]
        if len(never):
            raise gym.error.ResetNeeded(
                f"sub-environments {never.tolist()} were never reset: call reset() (or "
                "async_reset() and recv()) before step()/send(), as gymnasium requires")

    def recv(self, timeout: float | None = None) -> Results:
        """Return the sub-envs that are ready within ``batch_wait_ms`` (at least one).

        Returns ``(obs, rewards, terminations, truncations, infos)`` for the ready
        envs only; their ids are in ``infos["env_id"]`` (ascending). An env whose
        actor hangs comes back within ``step_timeout_s + batch_wait_ms`` as a
        truncated step with ``info["error"]``, whatever the other envs do.

        Raises:
            NoAsyncCallError: nothing was sent.
            multiprocessing.TimeoutError: no env was ready within ``timeout`` seconds
                (the calls stay pending, as after an interrupt: recv() again).
            SubEnvironmentError: an env failed (restarts off, or out of them); that
                env's call is over, and what arrived with it is returned by the next
                ``recv()``.
        """
        with self._operation():
            self._check_open()
            if self._state is _State.STEP or not (self._calls or self._ready):
                raise errors.NoAsyncCallError(
                    "recv() called with nothing sent; call send() or async_reset() first",
                    "step")
            checks.duration("timeout", timeout, none="wait as long as it takes")
            t0 = time.perf_counter()
            # results that arrived beside an error last time come first, without waiting;
            # a lost actor's envs may still be waiting for its replacement
            while not self._ready:
                left = None if timeout is None else max(0.0, t0 + timeout - time.perf_counter())
                try:
                    keys, hung = self._poll(every=False, timeout=left,
                                            gather_s=self.batch_wait_ms / 1000)
                except multiprocessing.TimeoutError:
                    raise multiprocessing.TimeoutError(
                        f"recv() timed out after {timeout}s with no sub-env ready") from None
                self._collect(keys, hung)
            batches = self._take_ready()
            self._handed = (batches, _State.RECV)
            result = self._assembler.partial(batches)
            self.metrics.observe_poll(len(result[4]["env_id"]), time.perf_counter() - t0)
            stepped = sum(len(ids) for ids, b in batches if not b.is_reset)
            if stepped:
                self.metrics.steps.inc(stepped)
            return result

    def _actions(self, actions: Any, ids: np.ndarray) -> Any:
        if self.multi_agent:
            return checks.multi_agent_actions(actions, len(ids), ids)
        return checks.actions(self.single_action_space, actions, ids)

    def _check_open(self) -> None:
        if self.closed:
            raise errors.ClosedEnvironmentError(
                f"Trying to operate on `{type(self).__name__}`, after a call to `close()`."
            )

    def _pending_name(self) -> str:
        calls = list(self._calls.values())
        return "reset" if calls and calls[0].is_reset else "step"

    def _finish_with(self) -> str:
        return "step_wait()" if self._state is _State.STEP else "recv()"
