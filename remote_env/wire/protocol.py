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
#: the first bytes each end sends: a peer that is not an EnvPool channel (an HTTP
#: client, a port scanner) is told apart from one of another version
MAGIC = b"EPWIRE"
#: the wire protocol's version; a peer of another version is refused with a message
#: that names both (remote_env/wire/README.md says what each version changed)
VERSION = 3
#: in the handshake's digests too, so a peer that skipped the version check fails
PROTOCOL = b"/frames-%d" % VERSION
HELLO = struct.Struct("<6sH")  # magic, version
ACCEPTED, REFUSED = 0, 1
#: every frame: body size, call id, op (calls) or status (replies)
HEAD = struct.Struct("<IQB")
#: a shared_step call's body: epoch (0: not fenced), count, first position (-1: listed)
STEP_ARGS = struct.Struct("<qii")
PICKLED, STEP, FENCED_STEP, PICKLED_OOB = 0, 1, 2, 3  # calls
OK, ERR, STEPPED, STEPPED_MORE, OK_OOB = 0, 1, 2, 3, 4  # replies
BUFFER = 1 << 16  # per connection; a bigger frame gets a buffer of its own
#: the largest body a frame may carry. A header read out of step would otherwise be
#: taken as a size of up to 4 GiB, allocated and waited for forever; a real reply this
#: big belongs in Ray's object store (``transport="ray"``).
MAX_FRAME = 1 << 30
#: arrays at least this big travel as raw buffers beside their pickle (no copy into it)
OOB_MIN = 1 << 12


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


def pack(value: Any) -> tuple[bool, list[bytes | memoryview]]:
    """A value's frame body as parts: (with raw buffers?, parts).

    Arrays of :data:`OOB_MIN` bytes or more (numpy's pickle protocol 5 buffers) go as
    raw buffers after the pickle of the rest, never copied into it: an observation
    batch crosses a TCP connection as its own bytes, sent straight from the array
    (``sendmsg``). Layout: ``<I`` count of buffers, ``<Q`` each one's size, the pickle,
    the buffers back to back.
    """
    buffers: list[pickle.PickleBuffer] = []

    def out_of_band(buf: pickle.PickleBuffer) -> bool:
        if buf.raw().nbytes < OOB_MIN:
            return True  # in the pickle: a small array is cheaper copied than framed
        buffers.append(buf)
        return False

    try:
        meta = pickle.dumps(value, protocol=5, buffer_callback=out_of_band)
    except Exception:  # a local or __main__ class, a lambda: Ray pickles those by value too
        buffers.clear()
        meta = cloudpickle.dumps(value, protocol=5, buffer_callback=out_of_band)
    if not buffers:
        return False, [meta]
    raws = [b.raw() for b in buffers]
    head = struct.pack(f"<I{len(raws)}Q", len(raws), *(r.nbytes for r in raws))
    return True, [head, meta, *raws]


def unpack(with_buffers: bool, body: memoryview) -> Any:
    """The value of a body :func:`pack` made. Raw buffers are copied out of a frame read
    into the connection's shared buffer (it is reused); a big frame's own is kept."""
    if not with_buffers:
        return pickle.loads(body)
    (n,) = struct.unpack_from("<I", body)
    sizes = struct.unpack_from(f"<{n}Q", body, 4)
    end = len(body)
    own = len(body) + HEAD.size > BUFFER  # read into a buffer of its own (Frames.next)
    parts: list[Any] = []
    for size in reversed(sizes):
        part = body[end - size:end]
        parts.append(part if own else bytearray(part))
        end -= size
    parts.reverse()
    return pickle.loads(body[4 + 8 * n:end], buffers=parts)


def _digest(key: bytes, role: bytes, nonce: bytes) -> bytes:
    return hmac.new(key, role + PROTOCOL + nonce, hashlib.sha256).digest()


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise AuthenticationError("the peer closed the connection during the handshake")
        buf += chunk
    return buf


def _hello_version(hello: bytes, who: str) -> int:
    magic, version = HELLO.unpack(hello)
    if magic != MAGIC:
        raise AuthenticationError(
            f"the {who} is not an EnvPool channel (it sent {hello!r}, expected {MAGIC!r} "
            f"and a protocol version): a wrong address or port?")
    return int(version)


def _refuse(sock: socket.socket, reason: str) -> None:
    """Send the refusal, then read what the peer had sent on (briefly): closing with
    unread bytes would reset the connection and lose the reason on its way."""
    text = reason.encode()[:4096]
    try:
        sock.sendall(bytes([REFUSED]) + struct.pack("<H", len(text)) + text)
        sock.shutdown(socket.SHUT_WR)
        sock.settimeout(0.5)
        left = 1 << 16
        while left > 0 and (chunk := sock.recv(4096)):
            left -= len(chunk)
    except OSError:
        pass


def lease_key(actor_key: bytes, epoch: int) -> bytes:
    """The key of the lease at ``epoch`` on the actor whose channel key is ``actor_key``:
    ``HMAC-SHA256(actor_key, "envpool-lease/<epoch>")``.

    A pool hands this, never the actor's own key, to a trainer that leases over HTTP:
    the actor accepts it only while ``epoch`` is its fence (the lease is the newest on
    it), and a connection it opened makes only that lease's fenced calls. So a key
    outlives neither its lease nor its actor, and is worth nothing on another actor.
    """
    return hmac.new(actor_key, b"envpool-lease/%d" % epoch, hashlib.sha256).digest()


def server_handshake(sock: socket.socket, key: bytes,
                     others: Sequence[bytes] = ()) -> int:
    """The serving end's half: hello and challenge, then check the client's answer.

    A client of another version or without the key gets a refusal that says why
    before the connection closes (an error it can show its user), and nothing else.
    ``others`` are further keys a client may hold (a lease's, :func:`lease_key`);
    every one is compared (constant time each), so the answer's timing tells nothing.

    Returns:
        which key the client holds: 0 for ``key``, ``i + 1`` for ``others[i]``.

    Raises:
        AuthenticationError: the client was refused (the reason is the message).
    """
    nonce = secrets.token_bytes(NONCE)
    sock.sendall(HELLO.pack(MAGIC, VERSION) + nonce)
    hello = _recv_exact(sock, HELLO.size)
    try:
        version = _hello_version(hello, "client")
    except AuthenticationError as exc:
        _refuse(sock, str(exc))
        raise
    if version != VERSION:
        reason = (f"wire protocol version {version} is not spoken here: this actor speaks "
                  f"version {VERSION} (upgrade the trainer's envpool-k8s to the pool's)")
        _refuse(sock, reason)
        raise AuthenticationError(reason)
    answer = _recv_exact(sock, 32 + NONCE)
    keys = [key, *others]
    held = [hmac.compare_digest(answer[:32], _digest(k, b"client", nonce)) for k in keys]
    if not any(held):
        reason = ("the client does not hold this actor's key (a wrong key, or a lease's key "
                  "whose lease is over: another lease is newer on this actor)")
        _refuse(sock, reason)
        raise AuthenticationError(reason)
    which = held.index(True)
    sock.sendall(bytes([ACCEPTED]) + _digest(keys[which], b"server", answer[32:]))
    return which


def client_handshake(sock: socket.socket, key: bytes) -> None:
    """The calling end's half: check the server's hello, answer its challenge, check
    the server holds the key too (both ways: a stranger cannot pose as an actor).

    Raises:
        AuthenticationError: the server refused (its reason), speaks another version,
            is not an EnvPool channel, or does not hold the key.
    """
    greeting = _recv_exact(sock, HELLO.size + NONCE)
    version = _hello_version(greeting[:HELLO.size], "server")
    mine = secrets.token_bytes(NONCE)
    sock.sendall(HELLO.pack(MAGIC, VERSION))
    if version != VERSION:
        raise AuthenticationError(
            f"the actor speaks wire protocol version {version}, this client version "
            f"{VERSION}: use the pool's envpool-k8s version in the trainer")
    sock.sendall(_digest(key, b"client", greeting[HELLO.size:]) + mine)
    status = _recv_exact(sock, 1)[0]
    if status == REFUSED:
        (n,) = struct.unpack("<H", _recv_exact(sock, 2))
        raise AuthenticationError(f"the actor refused the connection: {_recv_exact(sock, n).decode(errors='replace')}")
    if status != ACCEPTED or not hmac.compare_digest(
            _recv_exact(sock, 32), _digest(key, b"server", mine)):
        raise AuthenticationError("the channel server does not hold the key")


# ------------------------------------------------------------------ framing


def frame(call_id: int, op: int, body: bytes = b"") -> bytes:
    return HEAD.pack(len(body), call_id, op) + body


def body_size(parts: Sequence[bytes | memoryview]) -> int:
    """The bytes of a body made of ``parts`` (bytes alone on the hot path: a step's)."""
    if len(parts) == 1 and type(parts[0]) is bytes:
        return len(parts[0])
    return sum(memoryview(p).nbytes for p in parts)


def send_parts(sock: socket.socket, call_id: int, op: int,
               parts: Sequence[bytes | memoryview]) -> None:
    """One frame whose body is ``parts`` back to back, in as few system calls as the
    socket takes (``sendmsg`` gathers them: no copy of a big array into one body)."""
    if not parts:  # a header alone (a step's usual reply): one sendall, nothing to check
        sock.sendall(HEAD.pack(0, call_id, op))
        return
    first = parts[0]
    if len(parts) == 1 and isinstance(first, bytes):
        send(sock, call_id, op, first)  # the hot path (a step, its reply): one sendall
        return
    views = [memoryview(p).cast("B") for p in parts]
    size = sum(v.nbytes for v in views)
    check_size(size, "a frame")
    pending = [memoryview(HEAD.pack(size, call_id, op)), *views]
    while pending:
        sent = sock.sendmsg(pending)
        while pending and sent >= pending[0].nbytes:
            sent -= pending[0].nbytes
            pending.pop(0)
        if pending and sent:
            pending[0] = pending[0][sent:]


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
        #: spin only after a short gap (see :meth:`spin_for`)
        self.adaptive = False
        #: the last wait for a frame ended within ``spin_s`` (adaptive: spin in the next)
        self._came_soon = False

    def spin_for(self, seconds: float, adaptive: bool = False) -> None:
        """Look for the next frame this long before sleeping in ``recv`` (0: sleep at once).

        ``adaptive``: only while calls come back-to-back, i.e. when the last frame came
        within ``seconds`` of the wait for it. A gap longer than that (the trainer
        busy with a learner update, or pacing its steps) turns the spin off until a
        frame comes soon again, so a waiting actor sleeps instead of burning a core;
        the price is one sleeping wait (a wake-up) when the steps resume.
        """
        self.spin_s = max(0.0, float(seconds))
        self.adaptive = bool(adaptive)
        self._came_soon = False

    @property
    def spins_next(self) -> bool:
        """The next wait for a frame looks for it before it sleeps."""
        return bool(self.spin_s) and (self._came_soon or not self.adaptive)

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
        n = self._spin() if self.spins_next else -1
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
        if not self.adaptive:
            while (frame := self.next()) is None:
                self.fill()
            return frame
        t0 = time.perf_counter()
        while (frame := self.next()) is None:
            self.fill()
        self._came_soon = time.perf_counter() - t0 < self.spin_s
        return frame


# ------------------------------------------------------- the shared_step call


def step_call(message: Any) -> tuple[int, bytes, Sequence[int]] | None:
    """(op, body, positions) for a plain or fenced ``shared_step``; None: pickle it.

    Positions given as a ``range`` (step 1: the driver's consecutive rows) go as the
    range they are, with no list built and compared (this runs on every step).
    """
    if type(message) is not tuple:
        return None
    if len(message) == 3 and message[0] == "shared_step":
        op, epoch, positions, actions = STEP, 0, message[1], message[2]
    elif len(message) == 5 and message[0] == "fenced" and message[2] == "shared_step":
        op, epoch, positions, actions = FENCED_STEP, message[1], message[3], message[4]
    else:
        return None
    try:
        if type(positions) is range and positions.step == 1:
            n = len(positions)
            body = STEP_ARGS.pack(epoch, n, positions.start if n else 0)
        else:
            positions = list(map(operator.index, positions))
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


def step_reply(value: Any) -> tuple[int, list[bytes | memoryview]]:
    """(status, body parts) of a shared_step's reply: nothing but infos and failures
    when the results are in the shared arrays, else the whole value (see :func:`reply`)."""
    if type(value) is not Batch or value.obs is not None or value.is_reset:
        return reply(value)
    if not value.infos and not value.failures:
        return STEPPED, []
    return STEPPED_MORE, [dumps((value.infos, value.failures))]


def reply(value: Any) -> tuple[int, list[bytes | memoryview]]:
    """(status, body parts) of a value's reply: its arrays as raw buffers if it has big ones."""
    with_buffers, parts = pack(value)
    return (OK_OOB if with_buffers else OK), parts


def call_body(message: Any) -> tuple[int, list[bytes | memoryview]]:
    """(op, body parts) of a call that is not a ``shared_step``."""
    with_buffers, parts = pack(message)
    return (PICKLED_OOB if with_buffers else PICKLED), parts


def step_batch(positions: Sequence[int], status: int, body: memoryview) -> Batch:
    """The Batch the host returned, from a ``STEPPED``/``STEPPED_MORE`` reply."""
    infos, failures = ([], []) if status == STEPPED else pickle.loads(body)
    return Batch(list(positions), None, None, None, None, infos, failures, False)
