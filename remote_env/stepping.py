"""The stepping API of :class:`~remote_env.vector.RemoteVectorEnv`: reset and step.

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

from remote_env import checks, errors
from remote_env.assembly import Results
from remote_env.attributes import EnvAttributes


class _State(enum.Enum):
    DEFAULT = "default"
    WAITING_STEP = "step"


class Stepping(EnvAttributes):
    """Mixin of :class:`~remote_env.vector.RemoteVectorEnv`: reset, step, send and recv."""

    closed: bool
    batch_wait_ms: float
    multi_agent: bool
    single_action_space: Any
    _busy: np.ndarray
    _was_reset: np.ndarray
    _state: _State = _State.DEFAULT

    # ----------------------------------------------------------------- reset
    def reset(
        self,
        *,
        seed: int | Sequence[int | None] | None = None,
        options: dict[str, Any] | None = None,
    ) -> tuple[Any, dict[str, Any]]:
        """Reset all sub-envs (or those in ``options["reset_mask"]``), like ``SyncVectorEnv``."""
        self._check_idle("reset")
        seeds = checks.seeds(seed, self.num_envs)
        options = dict(options) if options is not None else None
        mask = np.ones(self.num_envs, dtype=np.bool_)
        if options is not None and "reset_mask" in options:
            mask = checks.reset_mask(options.pop("reset_mask"), self.num_envs)
        env_ids = np.flatnonzero(mask)
        self._submit(env_ids, [seeds[i] for i in env_ids], options, is_reset=True)
        self._was_reset[env_ids] = True
        obs, _, _, _, infos = self._assembler.full(self._collect_all(None))
        return obs, infos

    def async_reset(
        self, *, seed: int | Sequence[int | None] | None = None, options: dict[str, Any] | None = None
    ) -> None:
        """Send a reset to every sub-env; :meth:`recv` returns them as they come (EnvPool style)."""
        self._check_idle("async_reset")
        seeds = checks.seeds(seed, self.num_envs)
        ids = np.arange(self.num_envs)
        self._submit(ids, seeds, dict(options) if options else None, is_reset=True)
        self._was_reset[ids] = True

    def _check_idle(self, what: str) -> None:
        self._check_open()
        if self._calls:
            raise errors.AlreadyPendingCallError(
                f"Calling `{what}` while waiting for a pending call to `{self._pending_name()}` "
                "to complete (finish it with step_wait() or recv())",
                self._pending_name(),
            )

    # ------------------------------------------------------------------ step
    def step(self, actions: Any) -> Results:
        """Step every sub-env with ``actions`` (batched as ``action_space``)."""
        self.step_async(actions)
        return self.step_wait()

    def step_async(self, actions: Any) -> None:
        """Send ``actions`` to every sub-env; collect with :meth:`step_wait`."""
        self._check_idle("step_async")
        ids = np.arange(self.num_envs)
        self._check_reset(ids)
        self._submit(ids, self._actions(actions, ids), None, is_reset=False)
        self._state = _State.WAITING_STEP

    def step_wait(self, timeout: float | None = None) -> Results:
        """Wait for the step sent by :meth:`step_async`.

        Raises:
            multiprocessing.TimeoutError: not all envs answered within ``timeout``
                seconds (the call stays pending; call ``step_wait`` again).
        """
        self._check_open()
        if self._state is not _State.WAITING_STEP:
            raise errors.NoAsyncCallError(
                "Calling `step_wait` without any prior call to `step_async`.", "step"
            )
        t0 = time.perf_counter()
        try:
            batches = self._collect_all(timeout)
        except multiprocessing.TimeoutError:
            raise  # still pending
        except BaseException:
            self._state = _State.DEFAULT
            raise
        self._state = _State.DEFAULT
        result = self._assembler.full(batches)
        self.metrics.observe_poll(self.num_envs, time.perf_counter() - t0)
        self.metrics.steps.inc(self.num_envs)
        return result

    # ----------------------------------------------- dynamic batching (EnvPool)
    def send(self, actions: Any, env_ids: Sequence[int] | np.ndarray | None = None) -> None:
        """Step the sub-envs ``env_ids`` (all when None) with ``actions``, without waiting.

        ``actions`` holds one action per id, in the order of ``env_ids``.
        """
        self._check_open()
        if self._state is _State.WAITING_STEP:
            raise errors.AlreadyPendingCallError(
                "send() called while a step_async() is pending; call step_wait() first", "step"
            )
        ids = checks.env_ids(env_ids, self.num_envs)
        if self._busy[ids].any():  # the message's mask only when it is needed
            busy = ids[self._busy[ids]]
            raise errors.AlreadyPendingCallError(
                f"env ids {busy.tolist()} already have a call in flight; recv() their results "
                "before sending them again",
                "step",
            )
        self._check_reset(ids)
        self._submit(ids, self._actions(actions, ids), None, is_reset=False)

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
            multiprocessing.TimeoutError: no env was ready within ``timeout`` seconds.
        """
        self._check_open()
        if not self._calls or self._state is _State.WAITING_STEP:
            raise errors.NoAsyncCallError(
                "recv() called with nothing sent; call send() or async_reset() first", "step"
            )
        t0 = time.perf_counter()
        batches: list[Any] = []
        while not batches:  # a lost actor's envs may still be waiting for its replacement
            left = None if timeout is None else max(0.0, t0 + timeout - time.perf_counter())
            try:
                keys, hung = self._poll(every=False, timeout=left,
                                        gather_s=self.batch_wait_ms / 1000)
            except multiprocessing.TimeoutError:
                raise multiprocessing.TimeoutError(
                    f"recv() timed out after {timeout}s with no sub-env ready") from None
            batches = self._collect(keys, hung)
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
