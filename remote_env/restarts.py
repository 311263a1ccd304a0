"""The one backoff rule and the one crash-loop rule, for everything that retries.

Pure (stdlib only): the env actors, the driver, the pool server, the operator's
reconcile retries and the pool server's EnvPool watch use these.

    >>> [backoff(1.0, n, 60.0) for n in range(8)]
    [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 60.0, 60.0]

A :class:`CrashLoop` is the rule, a :class:`Streak` one restartable thing's state
under it (a sub-env in its actor, an actor of the driver's, a pool's actor):

    >>> rule, streak = CrashLoop(max_restarts=2, backoff_s=1.0), Streak()
    >>> [rule.failed(streak) for _ in range(3)]  # delays before each restart; None: give up
    [1.0, 2.0, None]
    >>> rule.succeeded(streak); streak.failures
    0
"""

from __future__ import annotations

import dataclasses

#: Exponents past this change nothing after the cap but could overflow a float.
_MAX_EXPONENT = 30
#: The longest wait before a restart.
MAX_BACKOFF_S = 60.0


def backoff(base: float, attempt: int, cap: float) -> float:
    """``base * 2**attempt`` seconds, at most ``cap``; 0 when ``base`` is 0.

    ``attempt`` counts from 0 (the first retry waits ``base``).
    """
    if base <= 0 or attempt < 0:
        return 0.0
    return float(min(base * 2.0 ** min(attempt, _MAX_EXPONENT), cap))


class Streak:
    """One restartable thing's consecutive failures, under a :class:`CrashLoop` rule."""

    __slots__ = ("failures", "up_since")

    def __init__(self) -> None:
        #: failures since the last proof of health; 0: no streak
        self.failures = 0
        #: when the thing last came up (read only by rules with ``healthy_after_s``)
        self.up_since = 0.0

    def up(self, now: float) -> None:
        """The thing (a replacement, say) is up from ``now``: its health clock starts."""
        self.up_since = now


@dataclasses.dataclass(frozen=True)
class CrashLoop:
    """When to stop restarting something that keeps failing, and how long to wait first.

    A failure adds one to the streak; more than ``max_restarts`` in a row gives up.
    A success ends the streak when it is seen at least ``healthy_after_s`` after the
    thing came up (:meth:`Streak.up`): 0 where a good step is the proof of health
    (sub-envs, the driver's actors), longer where only pings are seen (the pool
    server's actors). The first ``immediate_restarts`` restarts of a streak wait no
    backoff; later ones wait ``backoff_s`` doubling per failure, at most
    ``max_backoff_s``.
    """

    max_restarts: int
    backoff_s: float = 0.0
    healthy_after_s: float = 0.0
    immediate_restarts: int = 0
    max_backoff_s: float = MAX_BACKOFF_S

    def failed(self, streak: Streak) -> float | None:
        """Count a failure: seconds to wait before restarting, or None to give up."""
        streak.failures += 1
        if streak.failures > self.max_restarts:
            return None
        return backoff(self.backoff_s, streak.failures - 1 - self.immediate_restarts,
                       self.max_backoff_s)

    def succeeded(self, streak: Streak, now: float = 0.0) -> None:
        """A proof of health seen at ``now``: ends the streak once the thing was up long enough.

        Hot callers check ``streak.failures`` first (no streak: nothing to end).
        """
        if streak.failures and (self.healthy_after_s <= 0
                                or now - streak.up_since >= self.healthy_after_s):
            streak.failures = 0
