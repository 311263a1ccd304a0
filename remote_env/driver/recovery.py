"""Recovery: lost actors, hangs, backoff and replacement, without stalling the driver.

An actor that dies (``RayActorError``, the channel's EOF) or does not answer within
``step_timeout_s`` is replaced and its envs' step is a truncated episode end with
``info["error"]``. Replacing never blocks the driver: the host waits out its
backoff (and a pool's ``actor_replacer`` runs on a thread) while every other
host's calls keep flowing; calls sent to its envs meanwhile wait in flight under a
:class:`~remote_env.driver.inflight.Deferred` key and are sent once the replacement
is up (the dispatcher asks :meth:`Recovery.take_came_up`).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import time
from collections.abc import Callable, Iterable
from typing import Any

from remote_env import errors, restarts
from remote_env._types import FailureReason
from remote_env.driver.hosts import HostTable
from remote_env.driver.inflight import Call
from remote_env.driver.ledger import EnvLedger
from remote_env.driver.links import Links
from remote_env.driver.options import Options
from remote_env.metrics import PoolMetrics

# how often a running actor_replacer is looked at while other calls are waited for
_REPLACER_POLL_S = 0.005


@dataclasses.dataclass
class Health:
    """One host's actor: which one it is and where its replacement stands."""

    #: bumped when the actor is lost: calls of an older generation are stale
    generation: int = 0
    #: consecutive losses of this host's actor
    streak: restarts.Streak = dataclasses.field(default_factory=restarts.Streak)
    #: start() of a replacement actor, not yet checked
    start_ref: Any = None
    #: being replaced: in backoff until retry_at, or an actor_replacer call running
    retry_at: float | None = None
    reason: FailureReason = "actor_died"
    replacing: concurrent.futures.Future[Any] | None = None
    #: the replacement failed for good: calls to these envs fail at once
    broken: errors.SubEnvironmentError | None = None

    @property
    def up(self) -> bool:
        """An actor to send to exists (it may still be starting)."""
        return self.retry_at is None and self.replacing is None and self.broken is None


class Recovery:
    """Each host's health; losing, replacing and checking actors; call deadlines."""

    def __init__(self, options: Options, hosts: HostTable, links: Links, ledger: EnvLedger,
                 metrics: PoolMetrics, ray: Any,
                 replacer: Callable[[Any, str], Any] | None) -> None:
        self._options = options
        self._hosts = hosts
        self._links = links
        self._ledger = ledger
        self._metrics = metrics
        self._ray = ray
        self._replacer = replacer
        self._health = [Health() for _ in range(len(hosts))]
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        #: hosts whose replacement is up since the dispatcher last asked (their
        #: deferred calls are to be sent)
        self._came_up: list[int] = []
        #: hosts in backoff or being replaced: none, and advance() has nothing to do
        self._recovering = 0
        # the rule for lost actors: a good step is the proof of health, and the first
        # replacement of a streak is immediate (backoff from the second loss in a row)
        self._crash_loop = restarts.CrashLoop(options.max_restarts, options.restart_backoff_s,
                                              immediate_restarts=1)

    # ---------------------------------------------------------------- reading
    def health(self, h: int) -> Health:
        """Host ``h``'s record, to read (its fields at once where every call is sent; the
        methods below ask one each). Only this class changes it."""
        return self._health[h]

    def up(self, h: int) -> bool:
        return self._health[h].up

    def direct_ok(self, h: int) -> bool:
        """Up and started: its channel may be used (a replacement's start() is checked
        through Ray first)."""
        health = self._health[h]
        return health.start_ref is None and health.up

    def starting(self, h: int) -> bool:
        return self._health[h].start_ref is not None

    def generation(self, h: int) -> int:
        return self._health[h].generation

    def broken(self, h: int) -> errors.SubEnvironmentError | None:
        return self._health[h].broken

    def retry_at(self, h: int) -> float | None:
        return self._health[h].retry_at

    def waiting(self) -> bool:
        """A replacement is still due (not up, not given up on)."""
        return any(not x.up and x.broken is None for x in self._health)

    def replacing_envs(self) -> int:
        return sum(len(self._hosts.env_ids(h)) for h, x in enumerate(self._health)
                   if x.start_ref is not None or (not x.up and x.broken is None))

    @property
    def came_up_pending(self) -> bool:
        return bool(self._came_up)

    def take_came_up(self) -> list[int]:
        """Hosts whose replacement is up since the last ask: send their deferred calls."""
        out, self._came_up = self._came_up, []
        return out

    # -------------------------------------------------------------- deadlines
    def deadline(self, call: Call) -> float | None:
        """When a call counts as hung (None: never): step_timeout_s after sending, plus
        start_timeout_s when it went to a replacement actor still starting. The latter
        holds even without step_timeout_s: a replacement that cannot be placed (no node
        with its resources) must not block the driver forever."""
        step_timeout_s = self._options.step_timeout_s
        if call.starting:
            start_timeout_s = self._options.start_timeout_s
            if start_timeout_s is None:  # no limit on starting: none at all
                return None
            return call.sent + (step_timeout_s or 0.0) + start_timeout_s
        if step_timeout_s is None:
            return None
        return call.sent + step_timeout_s

    def next_deadline(self, calls: Iterable[Call]) -> float | None:
        """The earliest :meth:`deadline` of ``calls`` (None: none can hang)."""
        step_timeout_s = self._options.step_timeout_s
        wake: float | None = None
        for call in calls:
            if step_timeout_s is None and not call.starting:
                continue  # no deadline (the usual case: no step_timeout_s)
            d = self.deadline(call)
            if d is not None and (wake is None or d < wake):
                wake = d
        return wake

    def expired(self, call: Call, now: float) -> bool:
        deadline = self.deadline(call)
        return deadline is not None and now >= deadline

    def hung_message(self, call: Call) -> str:
        o = self._options
        if call.starting:
            return (f"the replacement actor did not start within start_timeout_s="
                    f"{o.start_timeout_s} (can the cluster place it? see `ray status` for "
                    "infeasible resource demands)")
        return f"no answer within step_timeout_s={o.step_timeout_s}"

    # ----------------------------------------------------------- health events
    def succeeded(self, h: int) -> None:
        """A good step of host ``h``'s current actor: it ends a crash loop."""
        streak = self._health[h].streak
        if streak.failures:
            self._crash_loop.succeeded(streak)

    def lost(self, h: int, reason: FailureReason, message: str) -> None:
        """Host ``h``'s actor is lost: count it, kill it, schedule its replacement.

        Raises when it is not to be replaced (restarts off, or out of them).
        """
        health = self._health[h]
        env_ids = self._hosts.env_ids(h)
        k = len(env_ids)
        self._metrics.failures[reason].inc(k)
        delay = self._crash_loop.failed(health.streak)
        health.generation += 1
        health.start_ref = None
        first = int(env_ids[0])
        what = f"the actor hosting sub-environments {env_ids.tolist()}"
        self._links.drop(h)
        if self._replacer is None and (self._hosts.owned(h) or reason == "timeout"):
            self._hosts.kill(h)
        if not self._options.restart_failed:
            self._ledger.fail(env_ids)
            raise errors.SubEnvironmentError(first, f"{what} failed ({reason}): {message}")
        if delay is None:
            self._ledger.fail(env_ids)
            raise errors.SubEnvironmentFailedError(
                first, f"{what} failed {health.streak.failures} times in a row "
                f"(max_restarts={self._options.max_restarts}); last: {reason}: {message}"
            )
        self._ledger.count_restarts(env_ids)
        self._metrics.actor_restarts.inc()
        self._metrics.env_restarts.inc(k)
        health.reason = reason
        health.retry_at = time.perf_counter() + delay
        self._recovering += 1
        self.advance()

    def check_started(self, h: int) -> None:
        """Surface a replacement actor's start() failure before using its results."""
        health = self._health[h]
        if health.start_ref is None:
            return
        ref, health.start_ref = health.start_ref, None
        timeout_s = self._options.start_timeout_s
        try:
            info = self._ray.get(ref, timeout=timeout_s)
        except self._ray.exceptions.GetTimeoutError:
            env_ids = self._hosts.env_ids(h)
            self._ledger.fail(env_ids)
            raise errors.SubEnvironmentFailedError(
                int(env_ids[0]),
                f"the replacement actor for sub-environments {env_ids.tolist()} did not "
                f"start within start_timeout_s={timeout_s} (can the cluster place "
                "it? see `ray status` for infeasible resource demands)",
            ) from None
        self._hosts.check_start(h, info)
        self._hosts.created(h)

    # ------------------------------------------------------------ replacements
    def advance(self) -> float | None:
        """Move replacements on; return when one needs looking at next (None: none)."""
        if not self._recovering:
            return None
        wake: float | None = None
        now = time.perf_counter()
        for h, health in enumerate(self._health):
            if health.retry_at is not None:
                if now >= health.retry_at:
                    health.retry_at = None
                    try:
                        self._start_replacement(h, health)
                    except Exception as exc:  # raised here, its envs' calls would wait forever
                        self._break(h, health, exc)
                else:
                    wake = health.retry_at if wake is None else min(wake, health.retry_at)
            if health.replacing is not None:
                if health.replacing.done():
                    self._finish_replacement(h, health)
                else:
                    soon = now + _REPLACER_POLL_S
                    wake = soon if wake is None else min(wake, soon)
        return wake

    def _start_replacement(self, h: int, health: Health) -> None:
        if self._replacer is not None:
            if self._executor is None:
                self._executor = concurrent.futures.ThreadPoolExecutor(
                    max_workers=4, thread_name_prefix="envpool-replace")
            health.replacing = self._executor.submit(self._replacer, self._hosts.handle(h),
                                                     health.reason)
            return
        handle = self._hosts.new_actor(self._hosts.env_ids(h).tolist(), after_failure=True)
        self._hosts.install(h, handle, owned=True)
        self._links.install(h, handle)
        health.start_ref = handle.start.remote()
        self._recovering -= 1
        self._came_up.append(h)

    def _finish_replacement(self, h: int, health: Health) -> None:
        future, health.replacing = health.replacing, None
        assert future is not None
        try:
            handle = future.result()
        except Exception as exc:
            self._break(h, health, exc)
            return
        self._hosts.install(h, handle, owned=False)
        self._links.install(h, handle)
        self._recovering -= 1
        self._hosts.created(h)
        self._came_up.append(h)

    def _break(self, h: int, health: Health, exc: Exception) -> None:
        """The replacement of host ``h`` failed for good: its envs' calls fail at once."""
        env_ids = self._hosts.env_ids(h)
        self._ledger.fail(env_ids)
        self._recovering -= 1
        health.broken = errors.SubEnvironmentFailedError(
            int(env_ids[0]),
            f"the actor hosting sub-environments {env_ids.tolist()} could not be "
            f"replaced: {type(exc).__name__}: {exc}",
        )

    def shutdown(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
