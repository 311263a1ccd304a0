"""The socket data path in one process: real Unix sockets and threads, no Ray."""

from __future__ import annotations

import _thread
import hashlib
import hmac
import os
import pickle
import socket
import stat
import threading
import time
from multiprocessing import AuthenticationError
from typing import Any

import numpy as np
import pytest

from remote_env import errors, interrupts
from remote_env._types import Batch, Failure
from remote_env.wire import channel, protocol


class _NoRay:
    """``wait``/``get`` only touch Ray for Ray refs; none are passed here."""

    def wait(self, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError("Ray must not be used for channel calls")

    get = wait


def _handler(message: Any) -> Any:
    kind = message[0]
    if kind == "echo":
        return message[1]
    if kind == "sleep":
        time.sleep(message[1])
        return message[1]
    if kind == "zeros":
        return bytes(message[1])
    if kind == "unpicklable":
        return threading.Lock()  # the reply itself cannot be pickled
    if kind == "undecodable":
        return _Undecodable()  # pickles on the server, raises when the driver loads it
    if kind == "local":
        class Local:  # a class plain pickle cannot find by name (as one in __main__)
            def __init__(self) -> None:
                self.x = 3

        return Local()
    raise KeyError(f"no such call {kind}")


def _explode() -> None:
    raise ImportError("No module named 'only_in_the_actors_runtime_env'")


class _Undecodable:
    def __reduce__(self) -> Any:
        return _explode, ()


@pytest.fixture
def server() -> Any:
    srv = channel.ChannelServer(_handler)
    yield srv
    srv.close()


def test_replies_come_back_in_call_order_and_arrays_survive(server: Any) -> None:
    ch = channel.Channel(server.address, server.authkey)
    arrays = [np.full((4, 84, 84), i, dtype=np.uint8) for i in range(5)]
    calls = [ch.call(("echo", a)) for a in arrays]
    ready, pending = channel.wait(calls, len(calls), 5.0, _NoRay())
    assert ready == calls and pending == []
    for a, c in zip(arrays, calls, strict=True):
        np.testing.assert_array_equal(channel.get(c, _NoRay()), a)
    ch.close()


def test_wait_returns_what_is_ready_within_the_timeout(server: Any) -> None:
    slow = channel.Channel(server.address, server.authkey)
    fast = channel.Channel(server.address, server.authkey)  # two drivers, one server
    s, f = slow.call(("sleep", 0.5)), fast.call(("echo", 1))
    t0 = time.perf_counter()
    ready, pending = channel.wait([s, f], 2, 0.1, _NoRay())
    waited = time.perf_counter() - t0
    assert ready == [f] and pending == [s]
    assert 0.09 <= waited < 0.4, waited
    assert channel.get(s, _NoRay()) == 0.5
    slow.close()
    fast.close()


def test_a_failing_handler_is_a_remote_error_and_the_channel_goes_on(server: Any) -> None:
    ch = channel.Channel(server.address, server.authkey)
    bad, unpicklable, good = ch.call(("nope",)), ch.call(("unpicklable",)), ch.call(("echo", 7))
    with pytest.raises(channel.RemoteCallError, match="KeyError: 'no such call nope'") as info:
        channel.get(bad, _NoRay())
    assert "Traceback" in info.value.remote_traceback
    with pytest.raises(channel.RemoteCallError, match="pickle"):
        channel.get(unpicklable, _NoRay())
    assert channel.get(good, _NoRay()) == 7
    ch.close()


def test_a_closed_server_ends_pending_calls_as_closed(server: Any) -> None:
    ch = channel.Channel(server.address, server.authkey)
    call = ch.call(("sleep", 0.3))
    ch.close()  # our side goes away: the call can never be answered
    with pytest.raises(channel.ChannelClosedError):
        channel.get(call, _NoRay())
    with pytest.raises(channel.ChannelClosedError):
        channel.get(ch.call(("echo", 1)), _NoRay())


def test_the_socket_is_private_and_needs_the_key(server: Any) -> None:
    mode = stat.S_IMODE(os.stat(os.path.dirname(server.address)).st_mode)
    assert mode == 0o700, oct(mode)
    with pytest.raises(AuthenticationError):
        channel.Channel(server.address, b"not the key")
    # the server survives the bad client and still serves the right one
    ch = channel.Channel(server.address, server.authkey)
    assert channel.get(ch.call(("echo", "ok")), _NoRay()) == "ok"
    ch.close()


def test_a_silent_client_blocks_no_one_and_is_dropped_after_the_auth_timeout() -> None:
    srv = channel.ChannelServer(_handler, auth_timeout_s=0.5)
    try:
        silent = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        silent.connect(srv.address)  # connects, never answers the challenge
        t0 = time.perf_counter()
        ch = channel.Channel(srv.address, srv.authkey)
        assert channel.get(ch.call(("echo", 1)), _NoRay()) == 1
        assert time.perf_counter() - t0 < 0.4, "the new channel waited for the silent client"
        silent.settimeout(5)
        assert len(silent.recv(64)) == protocol.HELLO.size + protocol.NONCE  # hello, challenge
        assert silent.recv(64) == b"", "the silent client is dropped after auth_timeout_s"
        silent.close()
        ch.close()
    finally:
        srv.close()


def test_an_undecodable_reply_fails_its_own_call_only(server: Any) -> None:
    ch = channel.Channel(server.address, server.authkey)
    bad, good = ch.call(("undecodable",)), ch.call(("echo", 7))
    with pytest.raises(channel.ResultDecodeError, match="only_in_the_actors_runtime_env"):
        channel.get(bad, _NoRay())
    assert channel.get(good, _NoRay()) == 7  # never paired with the failed call
    assert channel.get(ch.call(("echo", 8)), _NoRay()) == 8
    ch.close()


def test_values_plain_pickle_cannot_name_cross_by_value(server: Any) -> None:
    ch = channel.Channel(server.address, server.authkey)
    assert channel.get(ch.call(("local",)), _NoRay()).x == 3
    # and the other way: a lambda in the call itself
    assert channel.get(ch.call(("echo", lambda: 5)), _NoRay())() == 5
    ch.close()


# ------------------------------------------------ the binary shared_step call


class _Stepper:
    """A handler that records the messages and answers shared_step like a host."""

    def __init__(self) -> None:
        self.messages: list[Any] = []
        self.infos: list[Any] = []
        self.failures: list[Any] = []
        self.raise_: BaseException | None = None
        self.packed = False

    def __call__(self, message: Any) -> Any:
        self.messages.append(message)
        if self.raise_ is not None:
            raise self.raise_
        positions = message[-2]
        obs = np.zeros((len(positions), 2)) if self.packed else None
        return Batch(list(positions), obs, None, None, None, self.infos, self.failures, False)


@pytest.fixture
def stepper() -> Any:
    handler = _Stepper()
    srv = channel.ChannelServer(handler)
    ch = channel.Channel(srv.address, srv.authkey)
    yield handler, ch
    ch.close()
    srv.close()


def test_a_shared_step_is_a_header_and_positions_not_a_pickle() -> None:
    step = protocol.step_call(("shared_step", [4, 5, 6], None))
    assert step is not None
    op, body, positions = step
    assert op == protocol.STEP and positions == [4, 5, 6]
    assert len(body) == protocol.STEP_ARGS.size  # a range: no positions listed
    step = protocol.step_call(("fenced", 9, "shared_step", [2, 0, 1], None))
    assert step is not None
    op, body, _ = step
    assert op == protocol.FENCED_STEP and len(body) == protocol.STEP_ARGS.size + 3 * 4
    assert protocol.step_message(op, memoryview(body)) == (
        "fenced", 9, "shared_step", [2, 0, 1], None)
    # not int32 positions: the pickled path carries them as they are
    assert protocol.step_call(("shared_step", [0.5], None)) is None
    assert protocol.step_call(("shared_step", [2**40], None)) is None
    assert protocol.step_call(("step", [0], [1])) is None


@pytest.mark.parametrize("positions", [[0, 1, 2, 3], [3, 1, 2], [7], []])
def test_shared_step_calls_round_trip(stepper: Any, positions: list[int]) -> None:
    handler, ch = stepper
    acts = np.arange(len(positions), dtype=np.int64)
    plain = channel.get(ch.call(("shared_step", positions, None)), _NoRay())
    fenced = channel.get(ch.call(("fenced", 3, "shared_step", positions, acts)), _NoRay())
    for batch in (plain, fenced):
        assert batch == Batch(positions, None, None, None, None, [], [], False)
        assert type(batch.indices) is list
    (name, got, none), (fence, epoch, name2, got2, got_acts) = handler.messages
    assert (name, list(got), none) == ("shared_step", positions, None)
    assert (fence, epoch, name2, list(got2)) == ("fenced", 3, "shared_step", positions)
    np.testing.assert_array_equal(got_acts, acts)
    assert got_acts.dtype == acts.dtype


def test_a_shared_step_reply_carries_infos_and_failures_when_there_are_some(stepper: Any) -> None:
    handler, ch = stepper
    handler.infos = [{"t": 1}, {}]
    handler.failures = [Failure(1, "exception", "boom", "tb", restarted=True)]
    decoded: list[Any] = []
    batch = channel.get(ch.call(("shared_step", [5, 6], None), decoded.append), _NoRay())
    assert batch is None and decoded == [Batch([5, 6], None, None, None, None, handler.infos,
                                               handler.failures, False)]
    # an env with no observation: the host packs the whole batch, and it crosses whole
    handler.infos, handler.failures, handler.packed = [], [], True
    batch = channel.get(ch.call(("shared_step", [5, 6], None)), _NoRay())
    assert batch.obs.shape == (2, 2)


def test_a_shared_step_that_raises_reaches_the_driver_as_today(stepper: Any) -> None:
    handler, ch = stepper
    handler.raise_ = errors.LeaseLostError("leased to another trainer")
    with pytest.raises(errors.LeaseLostError, match="another trainer"):
        channel.get(ch.call(("fenced", 1, "shared_step", [0], None)), _NoRay())
    handler.raise_ = KeyError("nope")
    with pytest.raises(channel.RemoteCallError, match="KeyError") as info:
        channel.get(ch.call(("shared_step", [0], None)), _NoRay())
    assert "Traceback" in info.value.remote_traceback
    handler.raise_ = None
    assert channel.get(ch.call(("shared_step", [0], None)), _NoRay()).indices == [0]


def test_a_reply_that_cannot_be_decoded_fails_its_call_only(stepper: Any) -> None:
    handler, ch = stepper
    handler.infos = [{"x": _Undecodable()}]
    with pytest.raises(channel.ResultDecodeError, match="only_in_the_actors_runtime_env"):
        channel.get(ch.call(("shared_step", [0], None)), _NoRay())
    handler.infos = []
    assert channel.get(ch.call(("shared_step", [1], None)), _NoRay()).indices == [1]


# ----------------------------------------------------------------- framing


def test_frames_split_across_reads_joined_in_one_read_and_bigger_than_the_buffer() -> None:
    a, b = socket.socketpair()
    try:
        frames = protocol.Frames(b)
        big = os.urandom(3 * protocol.BUFFER + 7)
        stream = (protocol.frame(1, 0, b"one") + protocol.frame(2, 3, b"")
                  + protocol.frame(3, 1, big) + protocol.frame(4, 2, b"four"))

        def send() -> None:  # a byte at a time at first, then the rest in chunks
            for i in range(40):
                a.sendall(stream[i:i + 1])
                time.sleep(0.001)
            for i in range(40, len(stream), 10_000):
                a.sendall(stream[i:i + 10_000])

        t = threading.Thread(target=send)
        t.start()
        got = []
        for _ in range(4):
            call_id, op, body = frames.wait()
            got.append((call_id, op, bytes(body)))
        t.join()
        assert got == [(1, 0, b"one"), (2, 3, b""), (3, 1, big), (4, 2, b"four")]
        a.sendall(protocol.frame(5, 0, b"x") + protocol.frame(6, 0, b"y"))  # one read, two
        frames.fill()
        x, y = frames.next(), frames.next()
        assert x is not None and y is not None
        assert (bytes(x[2]), bytes(y[2])) == (b"x", b"y")
        assert frames.next() is None
        a.close()
        with pytest.raises(EOFError):
            frames.fill()
    finally:
        a.close()
        b.close()


def test_big_values_cross_both_ways_between_small_ones(server: Any) -> None:
    ch = channel.Channel(server.address, server.authkey)
    big = np.random.default_rng(0).integers(0, 255, size=(3, 400_000), dtype=np.uint8)
    calls = [ch.call(("echo", 1)), ch.call(("echo", big)), ch.call(("echo", 2))]
    assert channel.get(calls[0], _NoRay()) == 1
    np.testing.assert_array_equal(channel.get(calls[1], _NoRay()), big)
    assert channel.get(calls[2], _NoRay()) == 2
    ch.close()


def test_a_peer_speaking_other_frames_fails_to_authenticate(server: Any) -> None:
    """A driver of the older frames (no hello, a bare challenge answer): refused at the
    handshake and the connection closed, not left hanging on frames it cannot read (it
    then uses Ray calls)."""
    old = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old.settimeout(5)
    old.connect(server.address)
    try:
        nonce = protocol._recv_exact(old, protocol.NONCE)
        old.sendall(hmac.new(server.authkey, b"client/frames-2" + nonce, hashlib.sha256).digest()
                    + bytes(protocol.NONCE))
        got = b""
        while chunk := old.recv(4096):
            got += chunk
        assert b"not an EnvPool channel" in got, got  # refused, then closed
    finally:
        old.close()
    ch = channel.Channel(server.address, server.authkey)  # the server goes on
    assert channel.get(ch.call(("echo", "ok")), _NoRay()) == "ok"
    ch.close()


def test_a_spinning_reader_takes_a_frame_that_comes_within_its_spin_and_sleeps_after() -> None:
    a, b = socket.socketpair()
    try:
        frames = protocol.Frames(b)
        frames.spin_for(0.05)
        threading.Timer(0.01, lambda: a.sendall(protocol.frame(1, 0, b"soon"))).start()
        c0 = time.process_time()
        assert bytes(frames.wait()[2]) == b"soon"  # read by a non-blocking look
        # a frame that comes after the spin is over is read by the sleeping recv
        threading.Timer(0.3, lambda: a.sendall(protocol.frame(2, 0, b"late"))).start()
        t0 = time.perf_counter()
        assert bytes(frames.wait()[2]) == b"late"
        assert time.perf_counter() - t0 >= 0.25
        # spinning yields the core and stops after spin_s: far less CPU than the wait
        assert time.process_time() - c0 < 0.2
        a.close()
        with pytest.raises(EOFError):  # the end of the stream still ends a spin
            frames.wait()
    finally:
        a.close()
        b.close()


def test_an_adaptive_spin_spins_only_after_a_frame_that_came_soon() -> None:
    a, b = socket.socketpair()
    try:
        frames = protocol.Frames(b)
        frames.spin_for(0.2, adaptive=True)

        def wait_for(after_s: float, body: bytes) -> float:
            """CPU seconds of a wait for a frame sent ``after_s`` from now."""
            threading.Timer(after_s, lambda: a.sendall(protocol.frame(1, 0, body))).start()
            c0 = time.process_time()
            assert bytes(frames.wait()[2]) == body
            return time.process_time() - c0

        assert not frames.spins_next  # no gap seen yet: it sleeps at once
        assert wait_for(0.15, b"first") < 0.05  # (a spin would burn most of 0.15 s)
        assert frames.spins_next  # that one came within the spin: the next wait spins
        wait_for(0.01, b"second")
        assert frames.spins_next
        wait_for(0.4, b"late")  # a gap past the spin (a learner update) ...
        assert not frames.spins_next  # ... and the next wait sleeps at once
        assert wait_for(0.3, b"still idle") < 0.05  # an idle trainer costs no spinning
        assert not frames.spins_next
        wait_for(0.01, b"resumed")  # back-to-back calls again: spinning again
        assert frames.spins_next
        frames.spin_for(0.2)  # not adaptive: every wait spins, whatever the gap
        wait_for(0.4, b"fixed")
        assert frames.spins_next
        frames.spin_for(0.0, adaptive=True)  # no spin at all
        wait_for(0.0, b"none")
        assert not frames.spins_next
    finally:
        a.close()
        b.close()


def test_the_handler_sets_the_spin_of_its_own_connection_only(server: Any) -> None:
    seen: list[float] = []

    def handler(message: Any) -> Any:
        srv.spin(message[1])
        seen.append(srv._local.frames.spin_s)
        return message[1]

    srv = channel.ChannelServer(handler)
    try:
        one = channel.Channel(srv.address, srv.authkey)
        two = channel.Channel(srv.address, srv.authkey)
        assert channel.get(one.call(("spin", 0.0005)), _NoRay()) == 0.0005
        assert channel.get(two.call(("spin", -1.0)), _NoRay()) == -1.0
        assert channel.get(one.call(("spin", 0.0005)), _NoRay()) == 0.0005
        assert seen == [0.0005, 0.0, 0.0005]  # negative: no spin; per connection
        one.close()
        two.close()
    finally:
        srv.close()


# --------------------------------------------- interrupts and frames out of step
def _raw_peer(tmp_path: Any) -> tuple[channel.Channel, socket.socket]:
    """A driver Channel whose other end is a bare socket this test writes by hand."""
    path, key = str(tmp_path / "s"), b"k" * 32
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(1)
    box: dict[str, socket.socket] = {}

    def accept() -> None:
        conn, _ = listener.accept()
        protocol.server_handshake(conn, key)
        box["conn"] = conn

    t = threading.Thread(target=accept)
    t.start()
    ch = channel.Channel(path, key)
    t.join()
    listener.close()
    return ch, box["conn"]


def _half_sent_reply(ch: channel.Channel, peer: socket.socket,
                     value: Any) -> tuple[channel.ChannelCall, bytes]:
    call = ch.call(("echo", 0))
    call_id, _, _ = protocol.Frames(peer).wait()
    reply = protocol.frame(call_id, protocol.OK, pickle.dumps(value))
    peer.sendall(reply[:len(reply) // 2])
    return call, reply[len(reply) // 2:]


def test_an_interrupt_mid_frame_keeps_the_partial_reply_and_the_read_resumes(
        tmp_path: Any) -> None:
    # issue #28: Ctrl-C while a big reply was read lost the partial frame; the next
    # header was garbage taken as a size of up to 4 GiB and read forever
    ch, peer = _raw_peer(tmp_path)
    value = os.urandom(4 * protocol.BUFFER)
    call, rest = _half_sent_reply(ch, peer, value)
    timer = threading.Timer(0.2, _thread.interrupt_main)
    with pytest.raises(KeyboardInterrupt), interrupts.deferred():
        timer.start()
        channel.get(call, _NoRay())  # half a frame arrived; the rest does not come yet
    timer.join()
    assert not call.done and not ch.closed
    peer.sendall(rest)
    assert channel.get(call, _NoRay()) == value
    nxt = ch.call(("echo", 1))  # the stream is in step: the next reply pairs with its call
    call_id, _, _ = protocol.Frames(peer).wait()
    peer.sendall(protocol.frame(call_id, protocol.OK, pickle.dumps("next")))
    assert channel.get(nxt, _NoRay()) == "next"
    ch.close()
    peer.close()


def test_a_read_that_fails_mid_frame_closes_the_connection_never_reads_out_of_step(
        tmp_path: Any) -> None:
    ch, peer = _raw_peer(tmp_path)
    call, _ = _half_sent_reply(ch, peer, os.urandom(4 * protocol.BUFFER))
    timer = threading.Timer(0.2, _thread.interrupt_main)
    with pytest.raises(KeyboardInterrupt):  # not held (no operation): raised mid-read
        timer.start()
        channel.get(call, _NoRay())
    timer.join()
    assert ch.closed and isinstance(call.error, channel.ChannelClosedError)
    assert "failed part way" in str(call.error)
    later = ch.call(("echo", 1))
    assert isinstance(later.error, channel.ChannelClosedError)
    peer.close()


def test_a_frame_over_the_cap_closes_the_connection_with_a_clear_error(tmp_path: Any) -> None:
    ch, peer = _raw_peer(tmp_path)
    call = ch.call(("echo", 0))
    call_id, _, _ = protocol.Frames(peer).wait()
    peer.sendall(protocol.HEAD.pack(protocol.MAX_FRAME + 1, call_id, protocol.OK))  # a garbage size
    with pytest.raises(channel.ChannelClosedError, match="over the channel's frame cap"):
        channel.get(call, _NoRay())
    assert ch.closed
    peer.close()


def test_a_reply_over_the_cap_is_its_calls_error_and_the_channel_goes_on(
        server: Any, monkeypatch: Any) -> None:
    monkeypatch.setattr(protocol, "MAX_FRAME", 10_000)
    ch = channel.Channel(server.address, server.authkey)
    try:
        too_big = ch.call(("zeros", 20_000))
        with pytest.raises(channel.RemoteCallError, match="frame cap"):
            channel.get(too_big, _NoRay())
        assert channel.get(ch.call(("zeros", 10)), _NoRay()) == bytes(10)
        refused = ch.call(("echo", bytes(20_000)))  # a call over the cap is not sent
        assert isinstance(refused.error, protocol.FrameError) and not ch.closed
    finally:
        ch.close()
