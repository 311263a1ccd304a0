"""How calls reach the actor besides Ray: its channel, shared arrays, fenced calls.

A driver on the actor's node steps it over a Unix socket (:mod:`remote_env.wire.channel`)
and, when the spaces batch into plain arrays, through shared memory
(:mod:`remote_env.wire.shared_arrays`): ``shared_step`` reads actions from and writes
results into the connection's arrays and replies with only what is not an array.
Pool trainers wrap hot calls in ``fenced(epoch, ...)`` so a lapsed lease cannot step
envs another trainer now holds.

Channel calls go to the :class:`~remote_env.actor.core.HostCore` directly, never
through the Ray actor class: Ray wraps each of its methods for tracing
(``_resume_span``, even with tracing off), which cost a fifth of the actor's CPU per
call with cheap envs.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

from remote_env import errors
from remote_env._types import Batch
from remote_env.actor.core import HostCore
from remote_env.wire import channel, shared_arrays

# what a driver may call over a channel (the hot calls; lifecycle stays with Ray)
FENCED_METHODS = frozenset({"step", "reset", "call", "set_attr", "shared_step", "is_wrapped",
                            "describe"})
CHANNEL_METHODS = FENCED_METHODS | {"fenced", "open_shared"}


class ChannelEndpoint:
    """The actor's end of the channel: its socket server, each connection's shared
    arrays, and the hot calls by name (over the channel, or ``fenced`` through Ray)."""

    def __init__(self, core: HostCore) -> None:
        self._core = core
        self._server: channel.ChannelServer | None = None
        # per connection (each is served on its own thread): that driver's shared arrays
        self._conn = threading.local()
        self._calls: dict[str, Callable[..., Any]] = {
            "step": core.step,
            "reset": core.reset,
            "call": core.call,
            "set_attr": core.set_attr,
            "is_wrapped": core.is_wrapped,
            # spaces and metadata: what a trainer without Ray reads before it steps
            "describe": core.describe,
            "shared_step": self.shared_step,
            "open_shared": self.open_shared,
            "fenced": self.fenced,
        }

    def open(self, driver_node_id: str, network: bool = False) -> tuple[str, bytes] | None:
        """The channel's address and key: its Unix socket if the driver is on this node;
        else, if ``network``, ``tcp://<this node's IP>:<port>``; else None (Ray calls)."""
        try:
            import ray

            here = ray.get_runtime_context().get_node_id()
            ip = ray.util.get_node_ip_address()  # type: ignore[no-untyped-call]
        except Exception:  # not in a Ray actor (unit tests): no node to compare
            return None
        if here == driver_node_id:
            return self.listen()
        if not network:
            return None
        return self.listen_tcp(ip)

    def listen_tcp(self, ip: str) -> tuple[str, bytes]:
        """Serve the channel over TCP too, on ``ip`` (this node's address, not every
        interface): for drivers on other nodes. Same key and handshake as the socket."""
        self.listen()
        assert self._server is not None
        return self._server.listen_tcp(ip), self._server.authkey

    def listen(self) -> tuple[str, bytes]:
        """Serve the channel (once; one channel serves many drivers): address and key."""
        if self._server is None:
            self._server = channel.ChannelServer(self.serve, on_disconnect=self.release_shared,
                                                 lease_epoch=self._core.current_fence)
        return self._server.address, self._server.authkey

    def serve(self, message: tuple[Any, ...]) -> Any:
        """One channel message: ``(method, *args)``, ``method`` one of the hot calls."""
        name, *args = message
        bound = None if self._server is None else self._server.connection_epoch()
        if bound is not None and (name != "fenced" or not args or args[0] != bound):
            # a lease's key opened this connection: that lease's fenced calls only
            raise errors.LeaseLostError(
                f"this connection holds the key of lease epoch {bound}: it makes only "
                f"('fenced', {bound}, ...) calls, got {name!r}"
                + (f" for epoch {args[0]}" if name == "fenced" and args else ""))
        call = self._calls.get(name)
        if call is None:
            raise ValueError(f"unknown channel call {name!r}; expected one of {sorted(CHANNEL_METHODS)}")
        return call(*args)

    def fenced(self, epoch: int, method: str, *args: Any) -> Any:
        """``method(*args)`` for the holder of lease ``epoch`` (pool trainers call this).

        Raises:
            LeaseLostError: a newer lease was granted on this actor.
        """
        if method not in FENCED_METHODS:
            raise ValueError(f"unknown fenced call {method!r}; expected one of "
                             f"{sorted(FENCED_METHODS)}")
        return self._core.fenced(epoch, self._calls[method], *args)

    # ------------------------------------------------------------ shared arrays
    def open_shared(self, name: str, spin_s: float = 0.0) -> tuple[shared_arrays.Layout, int] | None:
        """Create segment ``name`` for this connection's driver; None: not for these envs.

        Only over a channel (its thread is the connection): the driver maps the
        segment, unlinks its name, then calls :meth:`shared_step`. ``spin_s``: how long
        this connection looks for the driver's next call before sleeping
        (:meth:`~remote_env.wire.channel.ChannelServer.spin`).
        """
        if self._server is not None:
            self._server.spin(spin_s)
        info = self._core.describe()
        if info is None or info["multi_agent"] or info["other_spaces"]:
            return None  # per-env shapes differ, or results are dicts: keep pickling
        where = shared_arrays.layout(info["observation_space"], info["action_space"],
                                     info["num_envs"])
        if where is None:
            return None
        self.release_shared()
        self._conn.arrays = shared_arrays.SharedArrays(name, *where, create=True)
        self._conn.unlinked = False
        return where

    def shared_step(self, positions: Sequence[int], actions: Any = None) -> Batch:
        """A step through this connection's shared arrays (:meth:`HostCore.step_shared`)."""
        arrays = getattr(self._conn, "arrays", None)
        if arrays is None:
            raise RuntimeError("shared_step before open_shared on this connection")
        if not self._conn.unlinked:  # the driver has mapped it: no name may outlive us
            shared_arrays.unlink(arrays.name)
            self._conn.unlinked = True
        return self._core.step_shared(arrays, positions, actions)

    def release_shared(self) -> None:
        """Drop this connection's arrays (its driver is gone or opened new ones)."""
        arrays = getattr(self._conn, "arrays", None)
        if arrays is not None:
            self._conn.arrays = None
            shared_arrays.unlink(arrays.name)  # a driver that died before mapping it
            arrays.close()

    def close(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
