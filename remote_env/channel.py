"""A direct data path to host actors on the driver's node: a Unix socket per actor.

Why: a Ray actor call costs ~1-2 ms on 2 cores, a Unix-socket round trip ~0.2 ms
(measured side by side, see README "Transport"). For cheap envs that overhead *is*
the throughput. So Ray keeps placing, starting, supervising and killing the actors,
and only the hot calls (``step``/``reset``) of actors on the driver's own node go
over a socket the actor opens on request, the way gymnasium's AsyncVectorEnv talks
to its workers through pipes. Actors on other nodes keep using Ray calls.

Safety: the socket lives in a fresh 0700 directory and the connection is
authenticated with a random key handed over through Ray (``multiprocessing``'s
HMAC challenge), so another local user cannot step or read the envs. Nothing
listens on a network interface.

``wait``/``get`` accept Ray ``ObjectRef`` s and :class:`ChannelCall` s alike, so the
vector env's fault handling (hangs, dead actors) is the same for both transports:
a dead actor shows up as :class:`ChannelClosedError` (the socket's EOF), which is
handled like Ray's ``RayActorError``.
"""

from __future__ import annotations

import collections
import math
import os
import secrets
import select
import shutil
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from multiprocessing.connection import Client, Connection, Listener
from typing import Any

# ----------------------------------------------------------------- errors


class ChannelClosedError(ConnectionError):
    """The actor end of a channel is gone (its process died or closed it)."""


class RemoteCallError(Exception):
    """The host raised while serving a call (outside the per-env fault handling)."""

    def __init__(self, message: str, remote_traceback: str) -> None:
        super().__init__(message)
        self.remote_traceback = remote_traceback

    def __reduce__(self) -> Any:
        return RemoteCallError, (str(self), self.remote_traceback)


# --------------------------------------------------------------- actor side


class ChannelServer:
    """Serves ``handler(message)`` to the drivers that connect (one thread each).

    The handler runs on a thread of its own; the host serialises it with its
    Ray-called methods under one lock.
    """

    def __init__(self, handler: Callable[[Any], Any]) -> None:
        self._handler = handler
        self._dir = tempfile.mkdtemp(prefix="envpool-chan-")  # mkdtemp: mode 0700
        self.address = os.path.join(self._dir, "s")
        self.authkey = secrets.token_bytes(32)
        self._listener = Listener(self.address, "AF_UNIX", authkey=self.authkey)
        self._closed = False
        threading.Thread(target=self._accept, name="envpool-chan", daemon=True).start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                conn = self._listener.accept()
            except Exception:  # closed, or a client failed authentication
                if self._closed:
                    return
                continue
            threading.Thread(target=self._serve, args=(conn,), name="envpool-chan-conn",
                             daemon=True).start()

    def _serve(self, conn: Connection) -> None:
        with conn:
            while True:
                try:
                    message = conn.recv()
                except (EOFError, OSError):  # the driver closed or died
                    return
                try:
                    reply: Any = self._handler(message)
                    conn.send(reply)
                except (BrokenPipeError, ConnectionError):
                    return
                except Exception as exc:  # the handler or pickling the reply failed
                    try:
                        conn.send(RemoteCallError(f"{type(exc).__name__}: {exc}",
                                                  traceback.format_exc()))
                    except Exception:
                        return

    def close(self) -> None:
        self._closed = True
        try:
            self._listener.close()
        finally:
            shutil.rmtree(self._dir, ignore_errors=True)


# -------------------------------------------------------------- driver side


class ChannelCall:
    """One call sent over a :class:`Channel`; stands in for a Ray ``ObjectRef``."""

    __slots__ = ("channel", "done", "error", "value")

    def __init__(self, channel: Channel) -> None:
        self.channel = channel
        self.done = False
        self.value: Any = None
        self.error: BaseException | None = None


class Channel:
    """The driver's connection to one host actor. Replies come back in call order."""

    def __init__(self, address: str, authkey: bytes) -> None:
        self._conn = Client(address, "AF_UNIX", authkey=authkey)
        self._pending: collections.deque[ChannelCall] = collections.deque()
        self.closed = False

    def call(self, message: Any) -> ChannelCall:
        call = ChannelCall(self)
        if self.closed:
            call.done, call.error = True, ChannelClosedError("the channel was closed")
            return call
        try:
            self._conn.send(message)
        except (OSError, EOFError) as exc:
            self._fail_all(ChannelClosedError(f"the host actor is gone: {exc}"))
            call.done, call.error = True, ChannelClosedError(f"the host actor is gone: {exc}")
            return call
        self._pending.append(call)
        return call

    @property
    def waiting(self) -> bool:
        return bool(self._pending)

    @property
    def connection(self) -> Connection:
        return self._conn

    def read_one(self) -> None:
        """Read the next reply (the connection is readable) into the oldest call."""
        try:
            reply = self._conn.recv()
        except (EOFError, OSError) as exc:
            self._fail_all(ChannelClosedError(
                f"the host actor closed its channel ({type(exc).__name__}): it died"))
            return
        call = self._pending.popleft()
        call.done = True
        if isinstance(reply, RemoteCallError):
            call.error = reply
        else:
            call.value = reply

    def _fail_all(self, error: BaseException) -> None:
        self.close()
        while self._pending:
            call = self._pending.popleft()
            call.done, call.error = True, error

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            try:
                self._conn.close()
            except OSError:
                pass
            self._fail_all(ChannelClosedError("the channel was closed"))


# ------------------------------------------- waiting on both kinds of calls


def _drain(calls: Sequence[ChannelCall], timeout: float | None) -> None:
    """Read what has arrived for ``calls``; block up to ``timeout`` s for the first reply.

    One ``poll`` system call, no selector object: on a 2-core VM this loop is most
    of the driver's CPU per round trip.
    """
    by_fd: dict[int, Channel] = {}
    for c in calls:
        ch = c.channel
        if not c.done and ch.waiting:
            by_fd[ch.connection.fileno()] = ch
    if not by_fd:
        return
    poller = select.poll()
    for fd in by_fd:
        poller.register(fd, select.POLLIN)
    ms = -1 if timeout is None else max(0, math.ceil(timeout * 1000))
    for fd, _ in poller.poll(ms):
        by_fd[fd].read_one()


def wait(refs: Sequence[Any], num_returns: int, timeout: float | None,
         ray: Any) -> tuple[list[Any], list[Any]]:
    """``ray.wait`` over Ray refs and :class:`ChannelCall` s; input order kept."""
    calls = [r for r in refs if isinstance(r, ChannelCall)]
    if not calls:
        return ray.wait(list(refs), num_returns=num_returns, timeout=timeout)  # type: ignore[no-any-return]
    ray_refs = [r for r in refs if not isinstance(r, ChannelCall)]
    deadline = None if timeout is None else time.perf_counter() + timeout
    polled = False
    while True:
        ray_ready: set[Any] = set()
        if ray_refs:
            ray_ready = set(ray.wait(ray_refs, num_returns=len(ray_refs), timeout=0)[0])
        n_ready = len(ray_ready) + sum(c.done for c in calls)
        left = None if deadline is None else deadline - time.perf_counter()
        timed_out = left is not None and left <= 0
        if n_ready >= num_returns or (timed_out and polled):
            ready = [r for r in refs if (r.done if isinstance(r, ChannelCall) else r in ray_ready)]
            pending = [r for r in refs if not (r.done if isinstance(r, ChannelCall)
                                               else r in ray_ready)]
            return ready, pending
        polled = True
        if timed_out:
            _drain(calls, 0)  # a zero timeout still reads what has arrived
        elif ray_refs and not all(c.done for c in calls):
            # both kinds pending (actors on this node and on others): take turns
            step = 0.0005 if left is None else min(left, 0.0005)
            _drain(calls, step)
            ray.wait(ray_refs, num_returns=1, timeout=step)
        elif ray_refs:
            ray.wait(ray_refs, num_returns=min(len(ray_refs), num_returns - n_ready),
                     timeout=left)
        else:
            _drain(calls, left)


def get(ref: Any, ray: Any) -> Any:
    """``ray.get`` for one Ray ref or :class:`ChannelCall` (blocking)."""
    if not isinstance(ref, ChannelCall):
        return ray.get(ref)
    while not ref.done:
        _drain([ref], None)
    if ref.error is not None:
        raise ref.error
    return ref.value
