"""The channel's wire format: the handshake, frames, and the ``shared_step`` codec.

Pure encoding over a socket, apart from :mod:`remote_env.wire.channel` (who serves and
who calls, waiting on both kinds of calls).

Messages: every call carries an id and every reply the id of its call, so a reply
that cannot be decoded fails its own call only and is never paired with another.
Each frame is a fixed header ``<IQB`` (body size, call id, op or status) and a body:

* most calls (op ``_PICKLED``) and their replies (status ``_OK``/``_ERR``) carry a
  pickle, encoded as Ray encodes values: by reference where plain pickle can, by
  value (cloudpickle) where it cannot (classes of ``__main__`` or local ones), so
  whatever crosses ``transport="ray"`` crosses the socket too;
* the hot call, ``("shared_step", positions, actions)`` and its fenced form
  ``("fenced", epoch, "shared_step", positions, actions)``, is op ``_STEP`` or
  ``_FENCED_STEP``: a body ``<qii`` (epoch or 0, count, first position or -1), then
  the positions as int32 unless they are the range first..first+count, then the
  actions pickled if they were not written to the shared arrays. Its usual reply
  (no infos, no failures: the results are in the shared arrays) is status
  ``_STEPPED``, a header alone; ``_STEPPED_MORE`` carries ``(infos, failures)``
  pickled; from those and the call's positions the driver rebuilds the
  :class:`~remote_env._types.Batch` the host returned. A batch the host packed
  whole (an env with no observation yet) and errors go pickled, as above. No
  pickle for the common step: it saved ~10 us of the actor's CPU per call with
  32 cheap envs (``multiprocessing.connection`` and pickle, measured).

Reads go into one preallocated buffer per connection, one ``recv_into`` a frame
when it fits (``multiprocessing.connection`` spends two system calls a message).
"""

from __future__ import annotations

import hashlib
import hmac
import operator
import os
import pickle
import secrets
import socket
import struct
import time
from array import array
from collections.abc import Sequence
from multiprocessing import AuthenticationError
from typing import Any

import cloudpickle

from remote_env._types import Batch

NONCE = 32
#: in the handshake's digests: a peer speaking other frames fails to authenticate
#: (the driver then uses Ray calls) instead of hanging on frames it cannot read
PROTOCOL = b"/frames-2"
#: every frame: body size, call id, op (calls) or status (replies)
HEAD = struct.Struct("<IQB")
#: a shared_step call's body: epoch (0: not fenced), count, first position (-1: listed)
STEP_ARGS = struct.Struct("<qii")
PICKLED, STEP, FENCED_STEP = 0, 1, 2  # calls
OK, ERR, STEPPED, STEPPED_MORE = 0, 1, 2, 3  # replies
BUFFER = 1 << 16  # per connection; a bigger frame gets a buffer of its own
#: the largest body a frame may carry. A header read out of step would otherwise be
#: taken as a size of up to 4 GiB, allocated and waited for forever; a real reply this
#: big belongs in Ray's object store (``transport="ray"``).
MAX_FRAME = 1 << 30


class FrameError(ValueError):
    """A frame over :data:`MAX_FRAME` (a desynced stream, or a value too big for it)."""


def check_size(size: int, what: str) -> None:
    if size > MAX_FRAME:
        raise FrameError(
            f"{what} of {size} bytes is over the channel's frame cap of {MAX_FRAME} bytes "
            "(a reply this big belongs in Ray's object store: use transport='ray')")


# ----------------------------------------------------------------- encoding


def dumps(value: Any) -> bytes:
    """Plain pickle where it can (fast), cloudpickle (by value) where it cannot."""
    try:
        return pickle.dumps(value, protocol=5)
    except Exception:  # a local or __main__ class, a lambda: Ray pickles those by value too
        return cloudpickle.dumps(value, protocol=5)  # type: ignore[no-any-return]


def _digest(key: bytes, role: bytes, nonce: bytes) -> bytes:
    return hmac.new(key, role + nonce, hashlib.sha256).digest()


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise AuthenticationError("the peer closed the connection during authentication")
        buf += chunk
    return buf


def server_handshake(sock: socket.socket, key: bytes) -> None:
    nonce = secrets.token_bytes(NONCE)
    sock.sendall(nonce)
    answer = _recv_exact(sock, 32 + NONCE)
    if not hmac.compare_digest(answer[:32], _digest(key, b"client" + PROTOCOL, nonce)):
        raise AuthenticationError("the client does not hold the channel key")
    sock.sendall(_digest(key, b"server" + PROTOCOL, answer[32:]))


def client_handshake(sock: socket.socket, key: bytes) -> None:
    nonce = _recv_exact(sock, NONCE)
    mine = secrets.token_bytes(NONCE)
    sock.sendall(_digest(key, b"client" + PROTOCOL, nonce) + mine)
    if not hmac.compare_digest(_recv_exact(sock, 32), _digest(key, b"server" + PROTOCOL, mine)):
        raise AuthenticationError("the channel server does not hold the key")


# ------------------------------------------------------------------ framing


def frame(call_id: int, op: int, body: bytes = b"") -> bytes:
    return HEAD.pack(len(body), call_id, op) + body


def send(sock: socket.socket, call_id: int, op: int, body: bytes = b"") -> None:
    check_size(len(body), "a frame")
    if len(body) < BUFFER:
        sock.sendall(frame(call_id, op, body))  # one system call
    else:  # no copy of a big body just to prepend 13 bytes
        sock.sendall(HEAD.pack(len(body), call_id, op))
        sock.sendall(body)


class Frames:
    """Reads frames from a socket into one reusable buffer.

    A frame's body is handed out as a view of the buffer: it must be used up (its
    values unpickled or copied) before the next read, as both ends do. A frame
    bigger than the buffer is read into a buffer of its own, kept here between
    reads, so a reader that stops halfway (an interrupt) resumes where it stopped.
    """

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._buf = bytearray(BUFFER)
        self._view = memoryview(self._buf)
        self._start = self._end = 0  # the bytes read and not handed out yet
        # a big frame being read: its call id, op, body and how much of it has arrived
        self._big: tuple[int, int, memoryview] | None = None
        self._big_got = 0
        #: before sleeping in ``recv``, look for the next frame this long (s), giving the
        #: core away between looks (see :meth:`~remote_env.wire.channel.ChannelServer.spin`)
        self.spin_s = 0.0

    @property
    def mid_frame(self) -> bool:
        """Part of a frame has been read (the rest is on its way)."""
        return self._big is not None or self._end > self._start

    def fill(self) -> None:
        """One ``recv`` (blocks until something arrives). Raises EOFError at the end."""
        if self._big is not None:  # the rest of a big frame goes into its own buffer
            n = self._sock.recv_into(self._big[2][self._big_got:])
            if n == 0:
                raise EOFError("the peer closed the connection")
            self._big_got += n
            return
        if self._start == self._end:
            self._start = self._end = 0
        elif self._end == len(self._buf):  # a partial frame at the end: move it first
            n = self._end - self._start
            self._buf[:n] = self._buf[self._start:self._end]
            self._start, self._end = 0, n
        n = self._spin() if self.spin_s else -1
        if n < 0:
            n = self._sock.recv_into(self._view[self._end:])
        if n == 0:
            raise EOFError("the peer closed the connection")
        self._end += n

    def _spin(self) -> int:
        """A non-blocking ``recv`` until something arrives or ``spin_s`` is over (-1),
        yielding the core between tries: whoever else is runnable on it runs."""
        end = time.perf_counter() + self.spin_s
        view = self._view[self._end:]
        while True:
            try:
                return self._sock.recv_into(view, 0, socket.MSG_DONTWAIT)
            except BlockingIOError:
                if time.perf_counter() >= end:
                    return -1
                os.sched_yield()

    def next(self) -> tuple[int, int, memoryview] | None:
        """The next frame read whole, as (call id, op or status, body); None: not yet.

        Raises:
            FrameError: the next header announces a body over :data:`MAX_FRAME`.
        """
        big = self._big
        if big is not None:
            if self._big_got < len(big[2]):
                return None
            self._big, self._big_got = None, 0
            return big
        have = self._end - self._start
        if have < HEAD.size:
            return None
        size, call_id, op = HEAD.unpack_from(self._buf, self._start)
        check_size(size, "a frame announced by the peer")
        total = HEAD.size + size
        if have < total:
            if total > len(self._buf):  # too big for the buffer: read the rest apart
                body = memoryview(bytearray(size))
                got = have - HEAD.size
                body[:got] = self._view[self._start + HEAD.size:self._end]
                self._start = self._end = 0
                self._big, self._big_got = (call_id, op, body), got
            return None
        body = self._view[self._start + HEAD.size:self._start + total]
        self._start += total
        return call_id, op, body

    def wait(self) -> tuple[int, int, memoryview]:
        """The next frame, reading as long as it takes."""
        while (frame := self.next()) is None:
            self.fill()
        return frame


# ------------------------------------------------------- the shared_step call


def step_call(message: Any) -> tuple[int, bytes, list[int]] | None:
    """(op, body, positions) for a plain or fenced ``shared_step``; None: pickle it."""
    if type(message) is not tuple:
        return None
    if len(message) == 3 and message[0] == "shared_step":
        op, epoch, positions, actions = STEP, 0, message[1], message[2]
    elif len(message) == 5 and message[0] == "fenced" and message[2] == "shared_step":
        op, epoch, positions, actions = FENCED_STEP, message[1], message[3], message[4]
    else:
        return None
    try:
        positions = [operator.index(p) for p in positions]
        n = len(positions)
        first = positions[0] if n else 0
        if positions == list(range(first, first + n)):
            body = STEP_ARGS.pack(epoch, n, first)
        else:
            body = STEP_ARGS.pack(epoch, n, -1) + array("i", positions).tobytes()
    except (TypeError, ValueError, OverflowError, struct.error):
        return None  # not plain int32 positions or int64 epoch: let pickle carry them
    if actions is not None:
        body += dumps(actions)
    return op, body, positions


def step_message(op: int, body: memoryview) -> tuple[Any, ...]:
    """The message tuple of a ``STEP``/``FENCED_STEP`` frame, as :func:`step_call` got it."""
    epoch, n, first = STEP_ARGS.unpack_from(body)
    at = STEP_ARGS.size
    positions: Sequence[int]
    if first >= 0:
        positions = range(first, first + n)  # iterates as ints, and rows() sees a slice
    else:
        listed = array("i")
        listed.frombytes(body[at:at + 4 * n])
        positions, at = listed.tolist(), at + 4 * n
    actions = pickle.loads(body[at:]) if len(body) > at else None
    if op == STEP:
        return "shared_step", positions, actions
    if op == FENCED_STEP:
        return "fenced", epoch, "shared_step", positions, actions
    raise ValueError(f"unknown channel op {op}")


def step_reply(value: Any) -> tuple[int, bytes]:
    """(status, body) of a shared_step's reply: nothing but infos and failures when
    the results are in the shared arrays, else the whole value pickled."""
    if type(value) is not Batch or value.obs is not None or value.is_reset:
        return OK, dumps(value)
    if not value.infos and not value.failures:
        return STEPPED, b""
    return STEPPED_MORE, dumps((value.infos, value.failures))


def step_batch(positions: list[int], status: int, body: memoryview) -> Batch:
    """The Batch the host returned, from a ``STEPPED``/``STEPPED_MORE`` reply."""
    infos, failures = ([], []) if status == STEPPED else pickle.loads(body)
    return Batch(list(positions), None, None, None, None, infos, failures, False)
