"""The lease a vector env may hold on its actors (envs leased from a pool).

A :class:`HeldLease` is given to :meth:`RemoteVectorEnv.from_actors` (``lease=``): its
epoch goes with every hot call (the actors refuse older ones), every public call
first checks it is still held, and ``close()`` releases it. The pool's trainer side
(:mod:`remote_env.driver.attach`) provides one; the vector env needs no subclass.
"""

from __future__ import annotations

from typing import Protocol


class HeldLease(Protocol):
    """A lease on the slots whose actors the vector env steps."""

    @property
    def lease_id(self) -> str: ...

    @property
    def epoch(self) -> int:
        """Sent with every call; an actor refuses a call of an older epoch."""
        ...

    @property
    def slots(self) -> list[int]: ...

    @property
    def lost(self) -> bool:
        """Expired, and another trainer took some of its envs."""
        ...

    def check(self) -> None:
        """Raise :class:`~remote_env.errors.LeaseLostError` when :attr:`lost`."""

    def release(self) -> None:
        """Give the slots back (close); idempotent."""
