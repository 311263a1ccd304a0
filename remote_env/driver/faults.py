"""Fault handling on the driver: lost actors, hangs, results that cannot be received.

An actor that dies (``RayActorError``, the channel's EOF) or does not answer within
``step_timeout_s`` is replaced and its envs' step is a truncated episode end with
``info["error"]``. Replacing never blocks the driver: the host waits out its
backoff (and a pool's ``actor_replacer`` runs on a thread) while every other
host's calls keep flowing; calls sent to its envs meanwhile are held under a
:class:`~remote_env.driver.actor_set.Deferred` key and sent once the replacement is up.
A result that cannot be received (``RaySystemError``, an undecodable reply) is
an error of that call only: every other call is still consumed.
"""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from gymnasium.vector import AutoresetMode

from remote_env import errors, restarts
from remote_env._types import Batch, FailureReason
from remote_env.driver.actor_set import ActorSet, Call, Deferred, FollowUp, Host
from remote_env.driver.assembly import Assembler
from remote_env.wire import channel

# how often a running actor_replacer is looked at while other calls are waited for
_REPLACER_POLL_S = 0.005


class FaultHandling(ActorSet):
    """Mixin of :class:`~remote_env.driver.vector.RemoteVectorEnv`: call results and faults."""

    step_timeout_s: float | None
    _calls: dict[Any, Call]
    _busy: np.ndarray
    _assembler: Assembler
    _replacer: Callable[[Any, str], Any] | None
    _executor: concurrent.futures.ThreadPoolExecutor | None

    # ------------------------------------------------------------ sending
    def _enqueue(self, call: Call) -> Any:
        """Send ``call`` to its host now, or hold it until the host's replacement is up."""
        host = self._hosts[call.host]
        key: Any
        if host.broken is not None:
            key = Deferred()
            call.error = host.broken
        elif not host.up:
            key = Deferred()
            # held until the replacement is up: not a view of a buffer the caller reuses
            call.args = tuple(a.copy() if isinstance(a, np.ndarray) else a for a in call.args)
        else:
            call.sent = time.perf_counter()
            call.generation = host.generation
            call.starting = host.start_ref is not None
            key = self._host_call(host, call.method, *call.args)
        self._calls[key] = call
        self._busy[call.env_ids] = True
        return key

    def _resubmit(self, h: int) -> None:
        for key, call in list(self._calls.items()):
            if isinstance(key, Deferred) and call.host == h and call.error is None:
                del self._calls[key]
                self._enqueue(call)

    # ------------------------------------------------------- replacements
    @property
    def _crash_loop(self) -> restarts.CrashLoop:
        """The rule for lost actors: a good step is the proof of health, and the first
        replacement of a streak is immediate (backoff from the second loss in a row)."""
        return restarts.CrashLoop(self.max_restarts, self.restart_backoff_s,
                                  immediate_restarts=1)

    def _advance(self) -> float | None:
        """Move replacements on; return when one needs looking at next (None: none)."""
        wake: float | None = None
        now = time.perf_counter()
        for h, host in enumerate(self._hosts):
            if host.retry_at is not None:
                if now >= host.retry_at:
                    host.retry_at = None
                    try:
                        self._start_replacement(h, host)
                    except Exception as exc:  # raised here, its envs' calls would wait forever
                        self._break(h, host, exc)
                else:
                    wake = host.retry_at if wake is None else min(wake, host.retry_at)
            if host.replacing is not None:
                if host.replacing.done():
                    self._finish_replacement(h, host)
                else:
                    soon = now + _REPLACER_POLL_S
                    wake = soon if wake is None else min(wake, soon)
        return wake

    def _start_replacement(self, h: int, host: Host) -> None:
        if self._replacer is not None:
            if self._executor is None:
                self._executor = concurrent.futures.ThreadPoolExecutor(
                    max_workers=4, thread_name_prefix="envpool-replace")
            host.replacing = self._executor.submit(self._replacer, host.handle, host.reason)
            return
        host.handle = self._new_host(host.env_ids.tolist(), after_failure=True)
        host.owned = True
        host.start_ref = host.handle.start.remote()
        self._resubmit(h)

    def _finish_replacement(self, h: int, host: Host) -> None:
        future, host.replacing = host.replacing, None
        assert future is not None
        try:
            host.handle = future.result()
        except Exception as exc:
            self._break(h, host, exc)
            return
        host.owned = False
        self._created(host)
        self._resubmit(h)

    def _break(self, h: int, host: Host, exc: Exception) -> None:
        """The replacement of ``host`` failed for good: its envs' calls fail at once."""
        self._failed[host.env_ids] = True
        host.broken = errors.SubEnvironmentFailedError(
            int(host.env_ids[0]),
            f"the actor hosting sub-environments {host.env_ids.tolist()} could not be "
            f"replaced: {type(exc).__name__}: {exc}",
        )
        for key, call in self._calls.items():
            if isinstance(key, Deferred) and call.host == h:
                call.error = host.broken

    def _replace(self, host: Host, reason: FailureReason, message: str) -> None:
        """The actor of ``host`` is lost: count it, kill it, schedule its replacement."""
        k = len(host.env_ids)
        self.metrics.failures[reason].inc(k)
        delay = self._crash_loop.failed(host.streak)
        host.generation += 1
        host.start_ref = None
        first = int(host.env_ids[0])
        what = f"the actor hosting sub-environments {host.env_ids.tolist()}"
        self._drop_channel(host)
        if self._replacer is None and (host.owned or reason == "timeout"):
            try:
                self._ray.kill(host.handle, no_restart=True)
            except Exception:  # already gone
                pass
        if not self.restart_failed:
            self._failed[host.env_ids] = True
            raise errors.SubEnvironmentError(first, f"{what} failed ({reason}): {message}")
        if delay is None:
            self._failed[host.env_ids] = True
            raise errors.SubEnvironmentFailedError(
                first, f"{what} failed {host.streak.failures} times in a row "
                f"(max_restarts={self.max_restarts}); last: {reason}: {message}"
            )
        self._restarts[host.env_ids] += 1
        self.metrics.actor_restarts.inc()
        self.metrics.env_restarts.inc(k)
        host.reason = reason
        host.retry_at = time.perf_counter() + delay
        self._advance()

    # ------------------------------------------------------------ results
    def _deadline(self, call: Call) -> float | None:
        """When a call counts as hung (None: never): step_timeout_s after sending, plus
        start_timeout_s when it went to a replacement actor still starting. The latter
        holds even without step_timeout_s: a replacement that cannot be placed (no node
        with its resources) must not block the driver forever."""
        if call.starting:
            if self.start_timeout_s is None:  # no limit on starting: none at all
                return None
            return call.sent + (self.step_timeout_s or 0.0) + self.start_timeout_s
        if self.step_timeout_s is None:
            return None
        return call.sent + self.step_timeout_s

    def _expired(self, call: Call, now: float) -> bool:
        deadline = self._deadline(call)
        return deadline is not None and now >= deadline

    def _result(self, key: Any, call: Call, hung: bool) -> Batch | None:
        """One call's Batch; None when it waits for a replacement (SAME_STEP)."""
        if call.error is not None:
            raise call.error
        host = self._hosts[call.host]
        current = call.generation == host.generation
        if hung:
            message = (
                f"the replacement actor did not start within start_timeout_s={self.start_timeout_s}"
                " (can the cluster place it? see `ray status` for infeasible resource demands)"
                if call.starting
                else f"no answer within step_timeout_s={self.step_timeout_s}"
            )
            return self._lose_actor(call, "timeout", message)
        try:
            if current:
                self._check_started(host)
            batch: Batch = channel.get(key, self._ray)
        except (self._ray.exceptions.RayActorError, channel.ChannelClosedError) as exc:
            message = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            return self._lose_actor(call, "actor_died", message)
        except errors.LeaseLostError as exc:  # Ray's error is also an instance of its cause
            raise errors.LeaseLostError(str(getattr(exc, "cause", None) or exc)) from None
        except (self._ray.exceptions.RayTaskError, channel.RemoteCallError) as exc:
            ids = call.env_ids.tolist()
            raise errors.SubEnvironmentError(
                ids[0], f"the actor call for sub-environments {ids} failed: {exc}",
                getattr(exc, "remote_traceback", ""),
            ) from exc
        except errors.SubEnvironmentError:
            raise
        except Exception as exc:  # RaySystemError, an undecodable reply: not the env's fault
            ids = call.env_ids.tolist()
            raise errors.ResultError(
                ids[0], f"the result for sub-environments {ids} could not be received here: "
                f"{type(exc).__name__}: {str(exc).strip()}"
            ) from exc
        if current and not batch.is_reset and host.streak.failures:
            self._crash_loop.succeeded(host.streak)  # a good step ends a crash loop
        if call.follow_up is not None:
            return self._assembler.failed(call.positions, call.env_ids, call.follow_up.error,
                                          call.is_reset, reset=batch, last=call.follow_up.last_obs)
        return batch

    def _lose_actor(self, call: Call, reason: FailureReason, message: str) -> Batch | None:
        """The failed call's result: a truncated episode end (SAME_STEP: once reset)."""
        if call.generation == self._hosts[call.host].generation:
            self._replace(self._hosts[call.host], reason, message)
        error = f"{reason}: {message}"
        if self.autoreset_mode is not AutoresetMode.SAME_STEP:
            return self._assembler.failed(call.positions, call.env_ids, error, call.is_reset)
        # the replacement's first reset uses the restart seeds (host side)
        k = len(call.positions)
        last = [self._assembler.last_obs(int(e)) for e in call.env_ids]
        self._enqueue(Call(call.host, call.env_ids, call.positions, call.is_reset, 0.0, 0,
                           "reset", (call.positions, [None] * k, None),
                           follow_up=FollowUp(error, last)))
        return None

    def _check_started(self, host: Host) -> None:
        """Surface a replacement actor's start() failure before using its results."""
        if host.start_ref is None:
            return
        ref, host.start_ref = host.start_ref, None
        try:
            info = self._ray.get(ref, timeout=self.start_timeout_s)
        except self._ray.exceptions.GetTimeoutError:
            self._failed[host.env_ids] = True
            raise errors.SubEnvironmentFailedError(
                int(host.env_ids[0]),
                f"the replacement actor for sub-environments {host.env_ids.tolist()} did not "
                f"start within start_timeout_s={self.start_timeout_s} (can the cluster place "
                "it? see `ray status` for infeasible resource demands)",
            ) from None
        self._raise_start_failures(host, info)
        self._created(host)

    def _replacing_envs(self) -> int:
        return sum(len(h.env_ids) for h in self._hosts
                   if h.start_ref is not None or (not h.up and h.broken is None))
