"""Links: how a call reaches a host actor, one link per host.

A :class:`Link` takes a host method and its arguments and returns a *key*: what the
wait loop waits on and reads the result from (:func:`remote_env.wire.channel.wait`
and :func:`~remote_env.wire.channel.get` take Ray refs and channel calls alike).
Two kinds:

* :class:`RayLink` -- Ray actor calls; always there (Ray creates, supervises and
  kills the actors whatever the data path), and the only one with
  ``transport="ray"``;
* :class:`ChannelLink` -- the channel (``transport="auto"``/``"pickle"``): the Unix
  socket to an actor on the driver's node, with shared arrays for steps when the
  spaces batch into arrays (``"auto"``); TCP to an actor on another node (its
  arrays travel as raw buffers in the frames). A Ray call costs ~1-2 ms here, a
  channel round trip a fraction of that, so off-node actors gain as much as
  on-node ones.

A leased env (a pool's, see :mod:`remote_env.driver.attach`) sends the lease epoch
with every call; the actors refuse older ones.
"""

from __future__ import annotations

import functools
from typing import Any, Protocol

from remote_env.wire import channel, shared_arrays


class Link(Protocol):
    """How calls reach one host actor."""

    def call(self, method: str, *args: Any) -> Any:
        """Send ``method(*args)`` to the host; a key to wait on and read the result from."""
        ...

    def close(self) -> None:
        """Release what the link holds (sockets, shared memory); idempotent."""
        ...


class RayLink:
    """Ray actor calls (``fenced`` ones under a lease)."""

    __slots__ = ("_epoch", "_handle")

    def __init__(self, handle: Any, epoch: int | None) -> None:
        self._handle = handle
        self._epoch = epoch

    @property
    def handle(self) -> Any:
        return self._handle

    def call(self, method: str, *args: Any) -> Any:
        if self._epoch is not None:
            return self._handle.fenced.remote(self._epoch, method, *args)
        return getattr(self._handle, method).remote(*args)

    def close(self) -> None:
        """Nothing to release: Ray owns the actor's lifetime."""


class ChannelLink:
    """The socket channel to a host on this node, with its shared arrays if any."""

    __slots__ = ("_chan", "_decode", "_epoch", "_shared", "tcp")

    def __init__(self, chan: channel.Channel, shared: shared_arrays.SharedArrays | None,
                 epoch: int | None, tcp: bool = False) -> None:
        self._chan = chan
        self._shared = shared
        self._epoch = epoch
        self.tcp = tcp
        #: how a shared_step's reply is read (made once: this runs on every step)
        self._decode = (None if shared is None
                        else functools.partial(shared_arrays.read_batch, shared))

    @property
    def closed(self) -> bool:
        return self._chan.closed

    @property
    def has_shared(self) -> bool:
        return self._shared is not None

    def call(self, method: str, *args: Any) -> Any:
        """``call``/``set_attr`` take the same path as steps, so they run after them."""
        decode = None
        shared = self._shared
        if shared is not None and method == "step":
            positions, acts = args
            rows = shared_arrays.rows(positions) if len(positions) else None
            if type(rows) is slice:  # consecutive: said as the range it is, checked once
                positions = range(rows.start, rows.stop)
            if shared_arrays.write_actions(shared, positions, acts):
                acts = None
            method, args = "shared_step", (positions, acts)
            decode = self._decode
        epoch = self._epoch
        message = (method, *args) if epoch is None else ("fenced", epoch, method, *args)
        return self._chan.call(message, decode)

    def close(self) -> None:
        self._chan.close()
        if self._shared is not None:
            self._shared.close()


class Links:
    """One link per host: its channel once opened (actors on this node), Ray calls
    otherwise, and while a replacement's start is not checked yet."""

    def __init__(self, ray: Any, *, transport: str, spin_us: float, adaptive: bool,
                 open_timeout_s: float | None, epoch: int | None) -> None:
        self._ray = ray
        self._transport = transport
        #: the actors' spin (s); ``adaptive``: only while calls come back-to-back
        self._spin_s = spin_us / 1e6
        self._adaptive = adaptive
        self._open_timeout_s = open_timeout_s
        self._epoch = epoch
        self._node_id: str | None = (
            ray.get_runtime_context().get_node_id() if transport != "ray" else None)
        self._ray_links: list[RayLink] = []
        #: host -> its channel link; None: tried, none (another node, or it failed);
        #: absent: not tried since the host's actor was (re)placed
        self._direct: dict[int, ChannelLink | None] = {}

    def add(self, handle: Any) -> None:
        """The next host's actor (hosts are added in order)."""
        self._ray_links.append(RayLink(handle, self._epoch))

    def install(self, h: int, handle: Any) -> None:
        """Host ``h``'s actor was replaced: links to the new one."""
        self.drop(h)
        self._ray_links[h] = RayLink(handle, self._epoch)

    def call(self, h: int, method: str, *args: Any, direct: bool) -> Any:
        """``method(*args)`` on host ``h``: over its channel if it has one and ``direct``
        (its actor is up and checked), else through Ray."""
        if direct and self._node_id is not None:
            if h in self._direct:
                link = self._direct[h]
            else:
                link = self._direct[h] = self._open(self._ray_links[h].handle)
            if link is not None and not link.closed:
                return link.call(method, *args)
        return self._ray_links[h].call(method, *args)

    def _open(self, handle: Any) -> ChannelLink | None:
        try:
            # network=True: an actor on another node serves TCP on its node's address
            where = self._ray.get(handle.open_channel.remote(self._node_id, True),
                                  timeout=self._open_timeout_s)
            if where is None:
                return None
            chan = channel.Channel(*where)
        except Exception:  # a dead actor surfaces through the Ray call instead
            return None
        # shared memory is per machine: a Unix socket's path only (not TCP, not a relay)
        same_node = isinstance(where[0], str) and channel.parse_tcp(where[0]) is None
        shared = (self._open_shared(chan) if self._transport == "auto" and same_node
                  else None)
        return ChannelLink(chan, shared, self._epoch, tcp=not same_node)

    def _open_shared(self, chan: channel.Channel) -> shared_arrays.SharedArrays | None:
        """Shared arrays with the host at the channel's other end; None: keep pickling.

        This side names the segment and unlinks the name once both ends mapped it,
        so no process death can leave it in /dev/shm.
        """
        name = shared_arrays.new_name()
        try:
            # the flag only when set: a host from before it still opens plain spins
            message = (("open_shared", name, self._spin_s, True) if self._adaptive
                       else ("open_shared", name, self._spin_s))
            where = channel.get(chan.call(message), self._ray)
            return None if where is None else shared_arrays.SharedArrays(name, *where,
                                                                         create=False)
        except Exception:  # an older host, or it died: the socket path still works
            return None
        finally:
            shared_arrays.unlink(name)

    def drop(self, h: int) -> None:
        """Close host ``h``'s channel (its actor is lost); reopened on the next call."""
        link = self._direct.pop(h, None)
        if link is not None:
            link.close()

    def close_all(self) -> None:
        for h in list(self._direct):
            self.drop(h)

    def describe(self, h: int) -> tuple[bool, bool, bool]:
        """(an open channel, shared arrays, over TCP) of host ``h``."""
        link = self._direct.get(h)
        return (False, False, False) if link is None else (True, link.has_shared, link.tcp)
