"""A direct data path to host actors on the driver's node: a Unix socket per actor.

Why: a Ray actor call costs ~1-2 ms on 2 cores, a Unix-socket round trip ~0.2 ms
(measured side by side, see README "Transport"). For cheap envs that overhead *is*
the throughput. So Ray keeps placing, starting, supervising and killing the actors,
and only the hot calls (``step``/``reset``/``call``) of actors on the driver's own
node go over a socket the actor opens on request, the way gymnasium's AsyncVectorEnv
talks to its workers through pipes. Actors on other nodes keep using Ray calls.

Safety: the socket lives in a fresh 0700 directory and each connection is
authenticated both ways with a random key handed over through Ray (an HMAC-SHA256
challenge, on the connection's own thread and within ``AUTH_TIMEOUT_S``: a client
that connects and says nothing never blocks the next one; at most
``MAX_HANDSHAKES`` strangers at once). Nothing listens on a network interface unless
asked (:meth:`ChannelServer.listen_tcp`, for drivers on other nodes; the same
handshake and frames). The protocol is written down in ``remote_env/wire/README.md``.

Messages: every call carries an id and every reply the id of its call, so a reply
that cannot be decoded fails its own call only and is never paired with another.
The frames, and the binary form of the hot ``shared_step`` call, are in
:mod:`remote_env.wire.protocol`.

``wait``/``get`` accept Ray ``ObjectRef`` s and :class:`ChannelCall` s alike, so the
vector env's fault handling (hangs, dead actors) is the same for both transports:
a dead actor shows up as :class:`ChannelClosedError` (the socket's EOF), which is
handled like Ray's ``RayActorError``.
"""

from __future__ import annotations

import itertools
import math
import os
import pickle
import secrets
import select
import shutil
import socket
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from multiprocessing import AuthenticationError
from typing import Any, Protocol, cast

from remote_env import errors, interrupts
from remote_env.wire import protocol

AUTH_TIMEOUT_S = 5.0
#: ``<low>-<high>``: the TCP ports :meth:`ChannelServer.listen_tcp` may take (unset: any
#: free port). The operator sets it on worker pods so that a NetworkPolicy can admit
#: trainers to the actors' data channels and to nothing else there.
DATA_PORTS_ENV = "ENVPOOL_DATA_PORTS"
#: connections authenticating at once, per server; more are closed at accept
MAX_HANDSHAKES = 32
__all__ = ["AuthenticationError", "ChannelClosedError", "RemoteCallError", "ResultDecodeError"]

# ----------------------------------------------------------------- errors

#: Errors a host raises on purpose that reach the driver as themselves.
_PASS_THROUGH = (errors.LeaseLostError,)


class ChannelClosedError(ConnectionError):
    """The actor end of a channel is gone (its process died or closed it)."""


class RemoteCallError(Exception):
    """The host raised while serving a call (outside the per-env fault handling).

    Carries the original exception, pickled apart (:attr:`cause` unpickles it), so a
    caller that re-raises it (``call``/``get_attr``/``set_attr``, as gymnasium's
    vector envs do) gives the env's own type, as ``transport="ray"`` does; one that
    cannot be unpickled here leaves only the message and traceback text.
    """

    def __init__(self, message: str, remote_traceback: str, cause_pickle: bytes = b"") -> None:
        super().__init__(message)
        self.remote_traceback = remote_traceback
        self.cause_pickle = cause_pickle

    def __reduce__(self) -> Any:
        return RemoteCallError, (str(self), self.remote_traceback, self.cause_pickle)

    @classmethod
    def of(cls, exc: BaseException) -> RemoteCallError:
        """The error to send for ``exc``, being handled now (its traceback is taken)."""
        try:
            blob = protocol.dumps(exc)
        except Exception:  # an exception holding a socket, a lock...: text only
            blob = b""
        return cls(f"{type(exc).__name__}: {exc}", traceback.format_exc(), blob)

    @property
    def cause(self) -> BaseException | None:
        """The exception the host raised, or None when it cannot be rebuilt here."""
        if not self.cause_pickle:
            return None
        try:
            exc = pickle.loads(self.cause_pickle)
        except Exception:  # its class is not importable here, or its __init__ differs
            return None
        return exc if isinstance(exc, BaseException) else None


class ResultDecodeError(Exception):
    """A reply arrived for its call but could not be unpickled on the driver."""


# --------------------------------------------------------------- actor side


def parse_port_range(text: str) -> tuple[int, int]:
    """``"20000-29999"`` -> ``(20000, 29999)``; a clear error for anything else.

        >>> parse_port_range("20000-20009")
        (20000, 20009)
    """
    low_s, sep, high_s = text.strip().partition("-")
    try:
        low, high = int(low_s), int(high_s)
    except ValueError:
        low = high = -1
    if not sep or not 1 <= low <= high <= 65535:
        raise ValueError(f"{DATA_PORTS_ENV} must be '<low>-<high>' with 1 <= low <= high "
                         f"<= 65535, got {text!r}")
    return low, high


def _bind_in_range(sock: socket.socket, host: str, ports: str) -> None:
    """Bind ``sock`` to a free port of ``ports`` (``low-high``; empty: any free port).

    Starts at a random port of the range, so the actors of one pod starting together
    do not all try the same ports first.
    """
    if not ports:
        sock.bind((host, 0))
        return
    low, high = parse_port_range(ports)
    size = high - low + 1
    start = secrets.randbelow(size)
    for i in range(size):
        try:
            sock.bind((host, low + (start + i) % size))
            return
        except OSError:  # taken (another actor of this pod): the next one
            continue
    raise OSError(f"no free TCP port in {DATA_PORTS_ENV}={ports} on {host}: every one is "
                  f"taken (more actors on this pod than ports in the range?)")


class ChannelServer:
    """Serves ``handler(message)`` to the drivers that connect (one thread each).

    The handler runs on the connection's thread; the host serialises it with its
    Ray-called methods under one lock. ``on_disconnect()`` runs on that thread when
    its driver goes, so per-connection state (thread-local) can be released.
    """

    def __init__(self, handler: Callable[[Any], Any],
                 auth_timeout_s: float = AUTH_TIMEOUT_S,
                 on_disconnect: Callable[[], None] | None = None,
                 lease_epoch: Callable[[], int] | None = None) -> None:
        self._handler = handler
        # the actor's current lease epoch (0: none): a trainer may hold that lease's
        # key (protocol.lease_key) instead of the actor's own
        self._lease_epoch = lease_epoch
        self._on_disconnect = on_disconnect
        self._auth_timeout_s = auth_timeout_s
        self._dir = tempfile.mkdtemp(prefix="envpool-chan-")  # mkdtemp: mode 0700
        self.address = os.path.join(self._dir, "s")
        self.authkey = secrets.token_bytes(32)
        self._listeners: list[socket.socket] = []
        self._closed = False
        self._local = threading.local()  # the frames of the connection a thread serves
        # handshakes under way: more than this many strangers at once are turned away
        # at accept, so a connection flood costs a bounded number of threads
        self._handshakes = threading.BoundedSemaphore(MAX_HANDSHAKES)
        self.tcp_address: str | None = None
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(self.address)
        self._listen(sock)

    def listen_tcp(self, host: str = "0.0.0.0", advertise: str | None = None) -> str:
        """Also serve over TCP on ``host`` (a free port); returns ``tcp://advertise:port``.

        For drivers on other nodes and trainers in other pods: the same frames and the
        same key handshake as the Unix socket (both ways: a stranger cannot call, and a
        trainer cannot be fooled by a stranger posing as the actor). Only when asked:
        by default nothing listens on a network interface. Idempotent.
        """
        if self.tcp_address is None:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            _bind_in_range(sock, host, os.environ.get(DATA_PORTS_ENV, ""))
            port = sock.getsockname()[1]
            self._listen(sock)
            self.tcp_address = f"tcp://{advertise or host}:{port}"
        return self.tcp_address

    def _listen(self, sock: socket.socket) -> None:
        sock.listen(64)
        self._listeners.append(sock)
        threading.Thread(target=self._accept, args=(sock,), name="envpool-chan",
                         daemon=True).start()

    def spin(self, seconds: float, adaptive: bool = False) -> None:
        """From the handler: before sleeping for this connection's next call, look for it
        ``seconds`` first (0: sleep at once); ``adaptive``: only while the calls come
        back-to-back (:meth:`~remote_env.wire.protocol.Frames.spin_for`).

        Why: on a small VM a sleeping thread's wake-up costs ~10-20 us and comes back to
        cold caches; a driver stepping cheap envs sends the next call within a few
        hundred us. The looks yield the core, so a busy neighbour keeps it.
        """
        frames = getattr(self._local, "frames", None)
        if frames is not None:
            frames.spin_for(seconds, adaptive)

    def connection_epoch(self) -> int | None:
        """From the handler: the lease epoch the connection being served authenticated
        with (a lease's key), or None (the actor's own key: its Ray-side drivers)."""
        return getattr(self._local, "epoch", None)

    def _accept(self, listener: socket.socket) -> None:
        while not self._closed:
            try:
                sock, _ = listener.accept()
            except OSError:
                if self._closed:
                    return
                continue
            if not self._handshakes.acquire(blocking=False):
                sock.close()  # a flood: the connections that authenticated go on
                continue
            threading.Thread(target=self._serve, args=(sock,), name="envpool-chan-conn",
                             daemon=True).start()

    def _serve(self, sock: socket.socket) -> None:
        try:
            sock.settimeout(self._auth_timeout_s)
            epoch = self._lease_epoch() if self._lease_epoch is not None else 0
            others = [protocol.lease_key(self.authkey, epoch)] if epoch > 0 else []
            which = protocol.server_handshake(sock, self.authkey, others)
            # a lease's key binds the connection to that lease (connection_epoch)
            self._local.epoch = epoch if which else None
            sock.settimeout(None)
            if sock.family != socket.AF_UNIX:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except (OSError, AuthenticationError):  # wrong key or version, silent or gone
            sock.close()
            return
        finally:
            self._handshakes.release()
        try:
            self._serve_calls(sock)
        finally:
            if self._on_disconnect is not None:
                self._on_disconnect()

    def _serve_calls(self, sock: socket.socket) -> None:
        frames = protocol.Frames(sock)
        self._local.frames = frames
        with sock:
            while True:
                try:
                    call_id, op, body = frames.wait()
                except (EOFError, OSError, protocol.FrameError):  # the driver closed or died
                    return
                status, parts = self._reply(op, body)
                try:
                    protocol.send_parts(sock, call_id, status, parts)
                except OSError:
                    return

    def _reply(self, op: int, body: memoryview) -> tuple[int, list[bytes | memoryview]]:
        """(status, body parts) of the reply to one call."""
        try:
            if op in (protocol.PICKLED, protocol.PICKLED_OOB):
                message = protocol.unpack(op == protocol.PICKLED_OOB, body)
                status, parts = protocol.reply(self._handler(message))
            elif op in (protocol.STEP, protocol.FENCED_STEP):
                status, parts = protocol.step_reply(self._handler(protocol.step_message(op, body)))
                if not parts:  # the usual step's reply: a header alone
                    return status, parts
            else:
                raise ValueError(f"unknown channel op {op}: the client speaks another protocol")
            # an error the driver can read instead of a frame it would refuse
            protocol.check_size(protocol.body_size(parts), "the reply")
            return status, parts
        except Exception as exc:  # decoding the call, the handler or the reply failed
            return protocol.ERR, [pickle.dumps(
                exc if isinstance(exc, _PASS_THROUGH) else RemoteCallError.of(exc))]

    def close(self) -> None:
        self._closed = True
        try:
            for sock in self._listeners:
                try:
                    sock.shutdown(socket.SHUT_RDWR)  # wakes its accept thread
                except OSError:
                    pass
                sock.close()
        finally:
            shutil.rmtree(self._dir, ignore_errors=True)


# -------------------------------------------------------------- driver side


def parse_tcp(address: str) -> tuple[str, int] | None:
    """(host, port) of a ``tcp://host:port`` address; None for a Unix socket's path.

    Raises:
        ValueError: a ``tcp://`` address without a host or a numeric port.
    """
    if not address.startswith("tcp://"):
        return None
    host, sep, port = address[len("tcp://"):].rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"bad channel address {address!r}: expected tcp://HOST:PORT")
    return host.strip("[]"), int(port)


class ChannelCall:
    """One call sent over a :class:`Channel`; stands in for a Ray ``ObjectRef``.

    ``decode(value)`` runs on the reply as it is read (shared-memory calls copy their
    rows out then, before the env can be sent again).
    """

    __slots__ = ("channel", "decode", "done", "error", "positions", "value")

    def __init__(self, channel: Channel, decode: Callable[[Any], Any] | None = None,
                 positions: Sequence[int] | None = None) -> None:
        self.channel = channel
        self.decode = decode
        self.done = False
        self.value: Any = None
        self.error: BaseException | None = None
        self.positions = positions  # a shared_step's: its reply omits them

    def fail(self, error: BaseException) -> None:
        self.done, self.error = True, error

    def settle(self, status: int, body: memoryview) -> None:
        """Take the reply: its value (decoded), or the error it stands for."""
        self.done = True
        value: Any
        try:
            if status in (protocol.STEPPED, protocol.STEPPED_MORE) and self.positions is not None:
                value = protocol.step_batch(self.positions, status, body)
            else:
                value = protocol.unpack(status == protocol.OK_OOB, body)
        except Exception as exc:  # e.g. a class only the actor's runtime env can import
            self.error = ResultDecodeError(
                f"the actor's reply could not be decoded here: {type(exc).__name__}: {exc}")
            return
        if status == protocol.ERR:
            self.error = value
        elif self.decode is None:
            self.value = value
        else:
            try:
                self.value = self.decode(value)
            except Exception as exc:
                self.error = ResultDecodeError(
                    f"the actor's reply could not be read here: {type(exc).__name__}: {exc}")


def failed_call(error: BaseException) -> ChannelCall:
    """A call that failed before it was sent (its actor unreachable): waited on and read
    like one whose actor died on it, so callers handle both the same way."""
    call = ChannelCall(cast(Channel, None))  # done already: its channel is never read
    call.fail(error)
    return call


class Dialer(Protocol):
    """Opens a connection some other way than to the actor's own address (the pool
    server's relay, :class:`remote_env.wire.relay.RelayDialer`): the handshake and
    frames then run over it end to end, as over a direct connection."""

    def dial(self, timeout_s: float) -> socket.socket:
        """A connected socket whose next bytes are the actor's channel hello."""
        ...


class Channel:
    """The driver's connection to one host actor; replies are matched by call id."""

    def __init__(self, address: str | Dialer, authkey: bytes,
                 auth_timeout_s: float = AUTH_TIMEOUT_S) -> None:
        """``address``: a Unix socket's path, ``tcp://host:port``
        (:meth:`ChannelServer.listen_tcp`), or a :class:`Dialer`."""
        if isinstance(address, str):
            tcp = parse_tcp(address)
            sock = socket.socket(socket.AF_UNIX if tcp is None else socket.AF_INET,
                                 socket.SOCK_STREAM)
        else:
            tcp, sock = None, address.dial(auth_timeout_s)
        try:
            sock.settimeout(auth_timeout_s)
            if isinstance(address, str):
                sock.connect(address if tcp is None else tcp)
            if sock.family != socket.AF_UNIX:  # frames are small, answered at once: no Nagle
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            protocol.client_handshake(sock, authkey)
            sock.settimeout(None)
        except BaseException:
            sock.close()
            raise
        self._sock = sock
        self._frames = protocol.Frames(sock)
        self._pending: dict[int, ChannelCall] = {}
        self._ids = itertools.count(1)
        self.closed = False

    def call(self, message: Any, decode: Callable[[Any], Any] | None = None) -> ChannelCall:
        """Send ``message`` (a tuple naming a host method, as a Ray call would)."""
        if self.closed:
            call = ChannelCall(self, decode)
            call.fail(ChannelClosedError("the channel was closed"))
            return call
        call_id = next(self._ids)
        step = protocol.step_call(message)
        parts: list[bytes | memoryview]
        positions = None
        if step is None:
            op, parts = protocol.call_body(message)
        else:
            op, body, positions = step
            parts = [body]
        call = ChannelCall(self, decode, positions)
        try:
            protocol.check_size(protocol.body_size(parts), "the call")
        except protocol.FrameError as exc:  # this call's failure only: nothing was sent
            call.fail(exc)
            return call
        try:
            protocol.send_parts(self._sock, call_id, op, parts)
        except OSError as exc:
            self._fail_all(ChannelClosedError(f"the host actor is gone: {exc}"))
            call.fail(ChannelClosedError(f"the host actor is gone: {exc}"))
            return call
        except BaseException as exc:
            # stopped part way through a frame: the actor would read the next call out of
            # step, so this connection is done (the actor is reached by Ray calls or replaced)
            self._fail_all(ChannelClosedError(
                f"a call was cut short while being sent ({type(exc).__name__})"))
            call.fail(ChannelClosedError("the call was cut short"))
            raise
        self._pending[call_id] = call
        return call

    @property
    def waiting(self) -> bool:
        return bool(self._pending)

    @property
    def connection(self) -> socket.socket:
        """The socket (for ``fileno()``; reading it is :meth:`read_one`'s)."""
        return self._sock

    def fileno(self) -> int:
        return self._sock.fileno()

    def read_one(self) -> None:
        """Read what arrived (the socket is readable): at least one whole reply, each
        into its call.

        An interrupt held meanwhile (:mod:`remote_env.interrupts`) stops it between two
        reads with the partial frame kept, so the next read resumes it. Any other
        failure part way closes the connection: a stream read out of step is never
        read again (its calls fail as if the actor died; it is replaced).
        """
        frames = self._frames
        try:
            frames.fill()
            while (frame := frames.next()) is None:  # the rest of a frame is on its way
                if interrupts.pending():
                    return  # resumed by the next read; the interrupt is raised by the caller
                if self._readable(0.05):  # a look now and then for a held interrupt
                    frames.fill()
            while frame is not None:
                self._settle(*frame)
                frame = frames.next()
        except (EOFError, OSError) as exc:
            self._fail_all(ChannelClosedError(
                f"the host actor closed its channel ({type(exc).__name__}): it died"))
        except protocol.FrameError as exc:
            self._fail_all(ChannelClosedError(f"the channel's stream is unreadable: {exc}"))
        except BaseException as exc:
            self._fail_all(ChannelClosedError(
                f"a read of the channel failed part way ({type(exc).__name__}: {exc})"))
            raise

    def _readable(self, timeout_s: float) -> bool:
        poller = select.poll()
        poller.register(self._sock.fileno(), select.POLLIN)
        return bool(poller.poll(math.ceil(timeout_s * 1000)))

    def _settle(self, call_id: int, status: int, body: memoryview) -> None:
        """Give one reply to its call."""
        call = self._pending.pop(call_id, None)
        if call is not None:  # else not ours (a call dropped on our side): nobody waits
            call.settle(status, body)

    def _fail_all(self, error: BaseException) -> None:
        pending, self._pending = self._pending, {}
        for call in pending.values():  # with this error, not close()'s own
            call.fail(error)
        self.close()

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            try:
                self._sock.close()
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
            by_fd[ch.fileno()] = ch
    if not by_fd:
        return
    poller = select.poll()
    for fd in by_fd:
        poller.register(fd, select.POLLIN)
    with interrupts.interruptible():  # nothing is half read while polling
        ready = _poll(poller, timeout)
    for fd, _ in ready:
        by_fd[fd].read_one()


#: the longest a poll blocks at once. Why: an interrupt raised by Python alone
#: (``_thread.interrupt_main``, a debugger) wakes no system call, so one long poll
#: would hold it until a reply came; between slices it is raised.
_SLICE_S = 0.1


def _poll(poller: select.poll, timeout: float | None) -> list[tuple[int, int]]:
    if timeout is not None and timeout <= _SLICE_S:
        return poller.poll(max(0, math.ceil(timeout * 1000)))
    end = None if timeout is None else time.perf_counter() + timeout
    while True:
        left = _SLICE_S if end is None else min(_SLICE_S, end - time.perf_counter())
        ready = poller.poll(max(0, math.ceil(left * 1000)))
        if ready or (end is not None and time.perf_counter() >= end):
            return ready


def wait(refs: Sequence[Any], num_returns: int, timeout: float | None,
         ray: Any) -> tuple[list[Any], list[Any]]:
    """``ray.wait`` over Ray refs and :class:`ChannelCall` s; input order kept."""
    calls = [r for r in refs if isinstance(r, ChannelCall)]
    if not calls:
        if not refs:
            return [], []
        with interrupts.interruptible():
            return ray.wait(list(refs), num_returns=num_returns, timeout=timeout)  # type: ignore[no-any-return]
    if len(calls) == len(refs):
        return _wait_calls(calls, num_returns, timeout)
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
            with interrupts.interruptible():
                ray.wait(ray_refs, num_returns=1, timeout=step)
        elif ray_refs:
            with interrupts.interruptible():
                ray.wait(ray_refs, num_returns=min(len(ray_refs), num_returns - n_ready),
                         timeout=left)
        else:
            _drain(calls, left)


def _wait_calls(calls: list[ChannelCall], num_returns: int,
                timeout: float | None) -> tuple[list[Any], list[Any]]:
    """:func:`wait` over channel calls only (actors on this node or reached over TCP):
    the same rules without the Ray refs' turns (this runs on every ``recv``)."""
    deadline = None if timeout is None else time.perf_counter() + timeout
    polled = False
    while True:
        ready = [c for c in calls if c.done]
        left = None if deadline is None else deadline - time.perf_counter()
        timed_out = left is not None and left <= 0
        if len(ready) >= num_returns or (timed_out and polled):
            return ready, ([] if len(ready) == len(calls) else
                           [c for c in calls if not c.done])
        polled = True
        _drain(calls, 0 if timed_out else left)


def only_calls(refs: Sequence[Any]) -> bool:
    """Every one of ``refs`` is a :class:`ChannelCall` (no Ray ref among them)."""
    # a loop, not all() over a generator (~0.4 us more): this runs on every recv
    for r in refs:  # noqa: SIM110
        if not isinstance(r, ChannelCall):
            return False
    return True


def get(ref: Any, ray: Any) -> Any:
    """``ray.get`` for one Ray ref or :class:`ChannelCall` (blocking)."""
    if not isinstance(ref, ChannelCall):
        with interrupts.interruptible():
            return ray.get(ref)
    while not ref.done:
        _drain([ref], None)
    if ref.error is not None:
        raise ref.error
    return ref.value
