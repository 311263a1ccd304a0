"""The socket data path in one process: real Unix sockets and threads, no Ray."""

from __future__ import annotations

import os
import socket
import stat
import threading
import time
from multiprocessing import AuthenticationError
from typing import Any

import numpy as np
import pytest

from remote_env import channel


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
        assert len(silent.recv(64)) == 32  # the challenge
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
