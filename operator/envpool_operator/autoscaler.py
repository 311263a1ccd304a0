"""Pure sizing of autoscaled pools (``spec.autoscaling``): leases in, ``spec.replicas`` out.

The rule (after Agones' Buffer FleetAutoscaler and the HPA's scale-down window):

* **Recommendation** (:func:`recommend`): the leased envs plus the buffer
  (``bufferEnvs``, or ``bufferPercent`` of the pool: ``ceil(leased / (1 - p/100))``),
  rounded up to whole actors (trainers lease whole actors, so a partial one is a
  buffer nobody can take whole), clamped to ``[minReplicas, maxReplicas]``, and
  never below the leased envs (a lowered maxReplicas does not evict a trainer).
* **Up at once, down after a delay** (:class:`Stabilizer`): a larger recommendation
  is applied on the spot; a smaller size only once every recommendation of the
  last ``scaleDownDelaySeconds`` was smaller, and then to the largest of them.
  A spike of leases and their release within the delay changes nothing, and a
  pool never shrinks from one short dip. After an operator restart the window
  starts empty, so nothing shrinks before one full delay has been observed.

No clock, no API: callers pass ``now`` (monotonic seconds).

    >>> from remote_env import spec
    >>> auto = spec.Autoscaling(min_replicas=4, max_replicas=32, buffer_envs=4,
    ...                         scale_down_delay_seconds=60)
    >>> recommend(auto, leased=6, envs_per_actor=2)   # 6 leased + 4 free
    10
    >>> s = Stabilizer()
    >>> s.decide(auto, current=4, recommended=10, now=0.0)   # up: immediately
    10
    >>> s.decide(auto, current=10, recommended=4, now=30.0)  # down: not before 60 s
    10
    >>> s.decide(auto, current=10, recommended=4, now=61.0)  # 10 was asked at t=0 (> 60 s ago)
    4
"""

from __future__ import annotations

import collections
import dataclasses
import math

from remote_env import spec as spec_mod


def buffer_target(auto: spec_mod.Autoscaling, leased: int) -> int:
    """Envs wanted for ``leased`` leased envs and the buffer, before rounding and bounds."""
    if auto.buffer_envs is not None:
        return leased + auto.buffer_envs
    pct = auto.buffer_percent or 0
    # Integer arithmetic: 20% of a 10-env pool is 2 free envs, not 1.9999.
    return -(-leased * 100 // (100 - pct))


def recommend(auto: spec_mod.Autoscaling, *, leased: int, envs_per_actor: int) -> int:
    """The pool size the buffer asks for now (whole actors, within bounds, >= leased)."""
    want = buffer_target(auto, max(0, leased))
    want = math.ceil(want / envs_per_actor) * envs_per_actor
    return max(leased, min(auto.max_replicas, max(auto.min_replicas, want)))


@dataclasses.dataclass
class Stabilizer:
    """One pool's recent recommendations: scale up at once, down after the delay."""

    #: (now, recommendation), oldest first; kept for one scale-down delay.
    history: collections.deque[tuple[float, int]] = dataclasses.field(
        default_factory=collections.deque)
    #: When this stabilizer saw its first recommendation (the window's start).
    since: float | None = None

    def decide(self, auto: spec_mod.Autoscaling, *, current: int, recommended: int,
               now: float) -> int:
        """The size to write (``current`` when nothing should change).

        Args:
            current: ``spec.replicas`` now.
            recommended: :func:`recommend`'s answer now.
            now: monotonic seconds.
        """
        delay = float(auto.scale_down_delay_seconds)
        if self.since is None:
            self.since = now
        self.history.append((now, recommended))
        while self.history and self.history[0][0] < now - delay:
            self.history.popleft()
        # Outside the bounds (a hand-written replicas, changed bounds): back inside at
        # once, except that leased envs stay (recommended is never below them).
        if current > auto.max_replicas:
            return max(auto.max_replicas, recommended)
        if recommended >= current or current < auto.min_replicas:
            return max(recommended, auto.min_replicas)
        if now - self.since < delay:
            return current  # not one full window observed yet (operator just started)
        return min(current, max(r for _, r in self.history))
