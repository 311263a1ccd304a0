"""The socket data path in one process: real Unix sockets and threads, no Ray."""

from __future__ import annotations

import os
import stat
import threading
import time
from multiprocessing import AuthenticationError
from multiprocessing.connection import Client
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
    raise KeyError(f"no such call {kind}")


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
        Client(server.address, "AF_UNIX", authkey=b"not the key")
    # the server survives the bad client and still serves the right one
    ch = channel.Channel(server.address, server.authkey)
    assert channel.get(ch.call(("echo", "ok")), _NoRay()) == "ok"
    ch.close()
