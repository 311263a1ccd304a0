"""The pool server's half of the relay (:mod:`remote_env.wire.relay`): splice a
trainer's upgraded connection to one actor's data address, bytes both ways.

Two threads per relayed connection, each a blocking ``recv_into``/``sendall`` loop:
the hop adds two system calls per chunk and no event-loop turn, and a slow trainer
blocks only its own connection (the kernel's socket buffers are the back-pressure).
At most ``max_connections`` at once (each costs two threads and two sockets);
more are refused with 503 before anything is connected.

Who may be relayed where is the lease API's decision
(:meth:`~remote_env.pool.lease_api.LeaseService.relay_target`); this only carries
bytes, which it cannot read or forge: the channel's handshake is end to end.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from typing import Final

from remote_env.metrics import PoolMetrics

log = logging.getLogger(__name__)

#: relayed connections open at once unless told otherwise
DEFAULT_MAX_CONNECTIONS: Final = 128
MAX_CONNECTIONS_ENV: Final = "ENVPOOL_RELAY_MAX_CONNECTIONS"
#: how long the head waits for an actor's data port to accept
CONNECT_TIMEOUT_S: Final = 5.0
_CHUNK: Final = 1 << 18


def max_connections_from_env() -> int:
    raw = os.environ.get(MAX_CONNECTIONS_ENV, "")
    if not raw:
        return DEFAULT_MAX_CONNECTIONS
    if not raw.isdigit():
        raise ValueError(f"{MAX_CONNECTIONS_ENV} must be an integer >= 0 (0: no relay), "
                         f"got {raw!r}")
    return int(raw)


class Splicer:
    """The relayed connections of one pool server: the cap, the threads, the counts."""

    def __init__(self, metrics: PoolMetrics | None = None,
                 max_connections: int = DEFAULT_MAX_CONNECTIONS) -> None:
        self.max_connections = max_connections
        self._metrics = metrics
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()
        self._reserved = 0

    @property
    def open_connections(self) -> int:
        with self._lock:
            return len(self._open) // 2

    def reserve(self) -> bool:
        """A place under the cap (False: full); give it back with :meth:`unreserve`
        unless :meth:`splice` takes it."""
        with self._lock:
            if self._reserved >= self.max_connections:
                return False
            self._reserved += 1
            return True

    def unreserve(self) -> None:
        with self._lock:
            self._reserved -= 1

    def count(self, outcome: str) -> None:
        if self._metrics is not None:
            self._metrics.relay_connections[outcome].inc()

    def splice(self, trainer: socket.socket, actor: socket.socket, greeting: bytes) -> None:
        """Send ``greeting`` (the 101) to the trainer, then carry bytes both ways until
        either end closes; takes a reserved place and both sockets."""
        try:
            for sock in (trainer, actor):
                sock.settimeout(None)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            # before any byte of the actor's (its hello comes as soon as it accepted)
            trainer.sendall(greeting)
        except OSError:  # the trainer left already
            trainer.close()
            actor.close()
            self.unreserve()
            return
        with self._lock:
            self._open.update((trainer, actor))
        if self._metrics is not None:
            self._metrics.relay_open.inc()
        state = {"left": 2}
        for src, dst, direction in ((trainer, actor, "to_actor"),
                                    (actor, trainer, "to_trainer")):
            threading.Thread(target=self._pump, args=(src, dst, direction, state),
                             name=f"envpool-relay-{direction}", daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, direction: str,
              state: dict[str, int]) -> None:
        buf = bytearray(_CHUNK)
        view = memoryview(buf)
        counter = None if self._metrics is None else self._metrics.relay_bytes[direction]
        try:
            while True:
                n = src.recv_into(buf)
                if not n:
                    break
                dst.sendall(view[:n])
                if counter is not None:
                    counter.inc(n)
        except OSError:
            pass  # either end went: the other is shut below, so its pump ends too
        finally:
            # one end closed (an actor that died, a trainer that left): the other end
            # sees EOF, as it would on a direct connection
            self._shut(src, dst)
            with self._lock:
                state["left"] -= 1
                last = state["left"] == 0
                if last:
                    self._open.difference_update((src, dst))
                    self._reserved -= 1
            if last:
                src.close()
                dst.close()
                if self._metrics is not None:
                    self._metrics.relay_open.dec()

    @staticmethod
    def _shut(*socks: socket.socket) -> None:
        for sock in socks:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self) -> None:
        """End every relayed connection (the pool server stops)."""
        with self._lock:
            socks = list(self._open)
        self._shut(*socks)


def connect(address: tuple[str, int], timeout_s: float = CONNECT_TIMEOUT_S) -> socket.socket:
    """A connection to an actor's data address from the head."""
    return socket.create_connection(address, timeout=timeout_s)
