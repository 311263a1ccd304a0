"""The result reader: one finished call into a Batch, or the error it is.

A result that cannot be received (``RaySystemError``, an undecodable reply) is an
error of that call only; an actor lost (dead, or hung past its deadline) is told to
:class:`~remote_env.driver.recovery.Recovery` and its envs' result is a truncated
episode end with ``info["error"]`` (SAME_STEP: once the replacement has reset them,
by a follow-up call the dispatcher sends).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from gymnasium.vector import AutoresetMode

from remote_env import errors
from remote_env._types import Batch, FailureReason
from remote_env.driver.assembly import Assembler
from remote_env.driver.hosts import HostTable
from remote_env.driver.inflight import Call, Deferred, FollowUp
from remote_env.driver.ledger import EnvLedger
from remote_env.driver.recovery import Recovery
from remote_env.metrics import PoolMetrics
from remote_env.wire import channel


class ResultReader:
    """Reads finished calls: their Batch, a lost actor's stand-in, or their error."""

    def __init__(self, autoreset_mode: AutoresetMode, hosts: HostTable, recovery: Recovery,
                 ledger: EnvLedger, metrics: PoolMetrics, assembler: Assembler,
                 ray: Any) -> None:
        self._same_step = autoreset_mode is AutoresetMode.SAME_STEP
        self._hosts = hosts
        self._recovery = recovery
        self._ledger = ledger
        self._metrics = metrics
        self._assembler = assembler
        self._ray = ray

    def read(self, key: Any, call: Call, hung: bool) -> Batch | Call:
        """The call's Batch; a :class:`Call` to send instead when its result waits for a
        replacement's reset (SAME_STEP). Raises the call's error."""
        h = call.host
        if isinstance(key, Deferred):  # held for a replacement that failed for good
            broken = self._recovery.broken(h)
            assert broken is not None
            raise broken
        health = self._recovery.health(h)  # read at once: this runs on every call
        current = call.generation == health.generation
        if hung:
            return self._lose(call, "timeout", self._recovery.hung_message(call))
        ray = self._ray
        try:
            if current and health.start_ref is not None:
                self._recovery.check_started(h)
            batch: Batch = channel.get(key, ray)
        except (ray.exceptions.RayActorError, channel.ChannelClosedError) as exc:
            message = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            return self._lose(call, "actor_died", message)
        except errors.LeaseLostError as exc:  # Ray's error is also an instance of its cause
            raise errors.LeaseLostError(str(getattr(exc, "cause", None) or exc)) from None
        except (ray.exceptions.RayTaskError, channel.RemoteCallError) as exc:
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
        if current and not batch.is_reset:
            self._recovery.succeeded(h)  # a good step ends a crash loop
        if call.follow_up is not None:
            return self._assembler.failed(call.positions, call.env_ids, call.follow_up.error,
                                          call.is_reset, reset=batch,
                                          last=call.follow_up.last_obs)
        return batch

    def _lose(self, call: Call, reason: FailureReason, message: str) -> Batch | Call:
        """The failed call's result: a truncated episode end (SAME_STEP: once reset)."""
        if call.generation == self._recovery.generation(call.host):
            self._recovery.lost(call.host, reason, message)
        error = f"{reason}: {message}"
        if not self._same_step:
            return self._assembler.failed(call.positions, call.env_ids, error, call.is_reset)
        # the replacement's first reset uses the restart seeds (host side)
        k = len(call.positions)
        last = [self._assembler.last_obs(int(e)) for e in call.env_ids]
        return Call(call.host, call.env_ids, call.positions, call.is_reset, "reset",
                    (call.positions, [None] * k, None), follow_up=FollowUp(error, last))

    def account(self, call: Call, batch: Batch) -> tuple[np.ndarray, list[Exception]]:
        """The batch's global env ids; its envs' failures counted, permanent ones raised
        (returned, to be raised once every finished call is consumed)."""
        raised: list[Exception] = []
        if batch.failures:
            host_envs = self._hosts.env_ids(call.host)
            for f in batch.failures:
                e = int(host_envs[f.index])
                if f.reason == "exception":
                    self._metrics.failures["exception"].inc()
                if f.restarted:
                    self._ledger.count_restarts(e)
                    self._metrics.env_restarts.inc()
                if f.permanent:
                    self._ledger.fail(e)
                    raised.append(self._hosts.error(call.host, f))
        # the reply's positions are the call's, in its order (the usual case): its ids
        if isinstance(batch.indices, list) and batch.indices == call.positions:
            return call.env_ids, raised
        return self._hosts.env_ids(call.host)[batch.indices], raised
