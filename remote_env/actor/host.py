"""The env actor's class: ``SubEnvHost``, one actor holding ``envs_per_actor`` sub-envs.

A thin shim: each method hands over to the plain :class:`~remote_env.actor.core.HostCore`
(set-up, reset/step/call, the lease fence) or to its
:class:`~remote_env.actor.endpoint.ChannelEndpoint` (socket channel, shared arrays).
It is a plain class, unit-tested in-process; :func:`actor_class` is the Ray actor
class made from it, importable without the driver.

Envs that wait on I/O can say so by defining coroutine methods ``astep(action)`` and
``areset(*, seed=None, options=None)`` next to the usual ``step``/``reset``; a host
whose envs have both awaits them concurrently on one event loop instead of
blocking a thread per env. This class itself has no ``async def`` method: Ray would
make it an asyncio actor, which does not run calls in the order they were sent.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

from gymnasium.vector import AutoresetMode

from remote_env._types import Batch
from remote_env.actor.core import HostCore
from remote_env.actor.endpoint import ChannelEndpoint
from remote_env.actor.slots import EnvFn
from remote_env.spec.fields import DEFAULT_MAX_RESTARTS
from remote_env.wire import shared_arrays

__all__ = ["EnvFn", "SubEnvHost", "actor_class"]


class SubEnvHost:
    """Hosts some sub-environments of one vector env.

    Args:
        env_fns: one make-env callable per sub-env; failures name sub-envs by
            their position here and the driver maps that to its env index.
        autoreset_mode: gymnasium autoreset mode, applied here.
        restart_failed: restart a sub-env that raises instead of reporting it.
        max_restarts: consecutive failed restarts allowed per sub-env.
        restart_backoff_s: first backoff; doubles per consecutive failure.
        threads: step sub-envs on this many threads (for envs that wait on I/O).
        restart_seeds: after an actor restart, the seeds the envs had, so their
            first reset is seeded as :func:`~remote_env.actor.slots.restart_seed` says.
        restarts: restart counts carried over from a dead actor.
        multi_agent_hint: the envs are (True) or are not (False) PettingZoo envs;
            None: look at the first one.
    """

    def __init__(
        self,
        env_fns: Sequence[EnvFn],
        *,
        autoreset_mode: str = AutoresetMode.NEXT_STEP.value,
        restart_failed: bool = False,
        max_restarts: int = DEFAULT_MAX_RESTARTS,
        restart_backoff_s: float = 0.0,
        threads: int = 1,
        restart_seeds: Sequence[int | None] | None = None,
        restarts: Sequence[int] | None = None,
        multi_agent_hint: bool | None = None,
    ) -> None:
        self._core = HostCore(
            env_fns, autoreset_mode=autoreset_mode, restart_failed=restart_failed,
            max_restarts=max_restarts, restart_backoff_s=restart_backoff_s, threads=threads,
            restart_seeds=restart_seeds, restarts=restarts, multi_agent_hint=multi_agent_hint)
        self._endpoint = ChannelEndpoint(self._core)

    @property
    def endpoint(self) -> ChannelEndpoint:
        """The channel endpoint (tests serve it without Ray: :meth:`ChannelEndpoint.listen`)."""
        return self._endpoint

    # ----------------------------------------------------------------- set-up
    def start(self) -> dict[str, Any]:
        """Create the sub-envs; return spaces and metadata of the first one.

        Separate from ``__init__`` so a constructor that raises arrives as a normal
        task error (with its traceback) rather than as an actor that died.
        """
        return self._core.start()

    def describe(self) -> dict[str, Any] | None:
        """What :meth:`start` returned, for a driver adopting a running host."""
        return self._core.describe()

    def open_channel(self, driver_node_id: str,
                     network: bool = False) -> tuple[str, bytes] | None:
        """A channel for step/reset: a Unix socket if the driver is on this node, TCP on
        this node's address if it is not and ``network`` (else None: Ray calls).

        See :mod:`remote_env.wire.channel` for why; one channel serves many drivers.
        """
        return self._endpoint.open(driver_node_id, network)

    # ------------------------------------------------------------------ calls
    def ping(self) -> int:
        return self._core.ping()

    def reset(self, positions: Sequence[int], seeds: Sequence[int | None],
              options: dict[str, Any] | None) -> Batch:
        """Reset the slots at ``positions`` (host-local)."""
        return self._core.reset(positions, seeds, options)

    def step(self, positions: Sequence[int], actions: Sequence[Any]) -> Batch:
        """Step (or autoreset) the slots at ``positions`` with ``actions``."""
        return self._core.step(positions, actions)

    def call(self, positions: Sequence[int], name: str, args: Any, kwargs: Any) -> list[Any]:
        """``name`` of each env, called if callable; through wrappers, as SyncVectorEnv."""
        return self._core.call(positions, name, args, kwargs)

    def set_attr(self, positions: Sequence[int], name: str, values: Sequence[Any]) -> None:
        """Set ``name`` where a wrapper or the env defines it (``set_wrapper_attr``)."""
        self._core.set_attr(positions, name, values)

    def is_wrapped(self, positions: Sequence[int], wrapper_class: type) -> list[bool]:
        """Whether each env has a ``wrapper_class`` wrapper (SB3's ``env_is_wrapped``)."""
        return self._core.is_wrapped(positions, wrapper_class)

    def seeds(self) -> list[int | None]:
        return self._core.seeds()

    def restart_counts(self) -> list[int]:
        return self._core.restart_counts()

    # ----------------------------------------------------------------- leases
    def fence(self, epoch: int) -> int:
        """Refuse calls of leases older than ``epoch`` from now on (the pool's registry
        calls it when it grants a lease); returns the fence."""
        return self._core.fence(epoch)

    def lease_mode(self, epoch: int, mode: str) -> dict[str, Any]:
        """Serve lease ``epoch`` in autoreset ``mode`` (:meth:`HostCore.lease_mode`; a
        pool trainer asks for its mode when it attaches)."""
        return self._core.lease_mode(epoch, mode)

    def fenced(self, epoch: int, method: str, *args: Any) -> Any:
        """``method(*args)`` for the holder of lease ``epoch`` (pool trainers call this).

        Raises:
            LeaseLostError: a newer lease was granted on this actor.
        """
        return self._endpoint.fenced(epoch, method, *args)

    # ------------------------------------------------------------ shared arrays
    def open_shared(self, name: str, spin_s: float = 0.0,
                    adaptive: bool = False) -> tuple[shared_arrays.Layout, int] | None:
        """:meth:`ChannelEndpoint.open_shared` (its callers come over the channel)."""
        return self._endpoint.open_shared(name, spin_s, adaptive)

    def shared_step(self, positions: Sequence[int], actions: Any = None) -> Batch:
        """:meth:`ChannelEndpoint.shared_step` (its callers come over the channel)."""
        return self._endpoint.shared_step(positions, actions)

    def close(self) -> list[tuple[int, str]]:
        """Close every sub-env (after the call running, if any); return ``(position,
        error)`` of those whose ``close()`` raised, for the driver to report.

        The driver waits for this (``close_timeout_s``) before it kills the actor, so
        an env's own cleanup (a last video written, a simulator's state saved) runs.
        """
        self._endpoint.close()
        return self._core.close()


@functools.cache
def actor_class() -> Any:
    """``ray.remote(SubEnvHost)``: the Ray actor class (made once per process)."""
    import ray

    return ray.remote(SubEnvHost)
