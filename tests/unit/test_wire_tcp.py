"""The channel over TCP: the same frames and handshake as the Unix socket, for drivers
and trainers on other nodes, and what it refuses (real sockets on the loopback)."""

from __future__ import annotations

import socket
import struct
import threading
import time
from collections.abc import Iterator
from multiprocessing import AuthenticationError
from typing import Any

import numpy as np
import pytest

from remote_env import errors
from remote_env._types import Batch
from remote_env.wire import channel, protocol


class _NoRay:
    def wait(self, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError("Ray must not be used for channel calls")

    get = wait


def _handler(message: Any) -> Any:
    kind = message[0]
    if kind == "echo":
        return message[1]
    if kind == "fenced":  # a lease fence at 5, as an actor's after a newer grant
        if message[1] < 5:
            raise errors.LeaseLostError(f"lease epoch {message[1]} is older than 5")
        return message[2:]
    if kind == "batch":  # a step's results without shared arrays: arrays cross raw
        n = message[1]
        obs = np.arange(n * 84 * 84, dtype=np.uint8).reshape(n, 84, 84)
        return Batch(list(range(n)), obs, np.ones(n), np.zeros(n, bool), np.zeros(n, bool),
                     [{}] * n, [], False)
    raise ValueError(f"unknown {kind}")


@pytest.fixture
def server() -> Iterator[channel.ChannelServer]:
    srv = channel.ChannelServer(_handler, auth_timeout_s=1.0)
    srv.listen_tcp("127.0.0.1")
    yield srv
    srv.close()


def _call(ch: channel.Channel, message: Any) -> Any:
    return channel.get(ch.call(message), _NoRay())


def _hostport(srv: channel.ChannelServer) -> tuple[str, int]:
    assert srv.tcp_address is not None
    where = channel.parse_tcp(srv.tcp_address)
    assert where is not None
    return where


def test_a_trainer_calls_over_tcp_with_the_key_and_gets_arrays_back_whole(server: Any) -> None:
    assert server.tcp_address.startswith("tcp://127.0.0.1:")
    assert server.listen_tcp("127.0.0.1") == server.tcp_address  # once per actor
    ch = channel.Channel(server.tcp_address, server.authkey)
    assert _call(ch, ("echo", {"a": 1})) == {"a": 1}
    big = np.random.default_rng(0).random((64, 1000))
    back = _call(ch, ("echo", big))
    np.testing.assert_array_equal(back, big)
    back[0, 0] = -1.0  # a trainer may write into what it got (its own copy)
    batch = _call(ch, ("batch", 16))
    assert batch.obs.shape == (16, 84, 84) and batch.obs.dtype == np.uint8
    assert int(batch.obs[15, 83, 83]) == (16 * 84 * 84 - 1) % 256
    ch.close()


def test_arrays_travel_as_raw_buffers_beside_a_small_pickle() -> None:
    obs = np.zeros((16, 84, 84, 4), np.uint8)
    with_buffers, parts = protocol.pack(("step", obs, np.arange(3)))
    assert with_buffers
    _head, meta, *raws = parts
    assert [memoryview(r).nbytes for r in raws] == [obs.nbytes]  # the small one stays in
    assert len(meta) < 1024, "the observation's bytes must not be copied into the pickle"
    body = memoryview(b"".join(bytes(memoryview(p).cast("B")) for p in parts))
    step, got, small = protocol.unpack(True, body)
    assert step == "step"
    np.testing.assert_array_equal(got, obs)
    np.testing.assert_array_equal(small, np.arange(3))


def test_a_wrong_key_is_refused_with_a_reason_and_the_actor_serves_on(server: Any) -> None:
    with pytest.raises(AuthenticationError, match="does not hold this actor's key"):
        channel.Channel(server.tcp_address, b"an expired lease's key")
    ch = channel.Channel(server.tcp_address, server.authkey)
    assert _call(ch, ("echo", 1)) == 1
    ch.close()


def test_a_client_of_another_protocol_version_is_told_both_versions(server: Any) -> None:
    sock = socket.create_connection(_hostport(server), timeout=5)
    try:
        hello = protocol._recv_exact(sock, protocol.HELLO.size + protocol.NONCE)
        magic, version = protocol.HELLO.unpack(hello[:protocol.HELLO.size])
        assert (magic, version) == (protocol.MAGIC, protocol.VERSION)
        sock.sendall(protocol.HELLO.pack(protocol.MAGIC, protocol.VERSION + 1))
        status = protocol._recv_exact(sock, 1)[0]
        (n,) = struct.unpack("<H", protocol._recv_exact(sock, 2))
        reason = protocol._recv_exact(sock, n).decode()
        assert status == protocol.REFUSED
        assert f"version {protocol.VERSION + 1}" in reason and f"version {protocol.VERSION}" in reason
        assert sock.recv(1) == b""  # and closed
    finally:
        sock.close()


def test_a_server_of_another_version_is_named_by_the_client(monkeypatch: Any) -> None:
    listener = socket.create_server(("127.0.0.1", 0))

    def old_server() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.sendall(protocol.HELLO.pack(protocol.MAGIC, 2) + bytes(protocol.NONCE))
            conn.recv(1024)

    threading.Thread(target=old_server, daemon=True).start()
    port = listener.getsockname()[1]
    try:
        with pytest.raises(AuthenticationError, match="speaks wire protocol version 2"):
            channel.Channel(f"tcp://127.0.0.1:{port}", b"k")
    finally:
        listener.close()


def test_a_peer_that_is_not_a_channel_is_refused_not_served(server: Any) -> None:
    sock = socket.create_connection(_hostport(server), timeout=5)
    try:
        sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" + bytes(64))
        got = b""
        while chunk := sock.recv(4096):
            got += chunk
        assert b"not an EnvPool channel" in got
    finally:
        sock.close()


def test_a_truncated_frame_drops_its_connection_only(server: Any) -> None:
    good = channel.Channel(server.tcp_address, server.authkey)
    bad = channel.Channel(server.tcp_address, server.authkey)
    raw = bad.connection
    body = protocol.dumps(("echo", "x" * 1000))
    raw.sendall(protocol.HEAD.pack(len(body), 7, protocol.PICKLED) + body[:100])  # cut short
    raw.shutdown(socket.SHUT_WR)
    raw.settimeout(5)
    assert raw.recv(1) == b"", "the actor closes a connection whose frame was cut short"
    bad.close()
    assert _call(good, ("echo", 2)) == 2  # its neighbour is untouched
    good.close()


def test_an_unknown_op_is_that_calls_error_not_a_desync(server: Any) -> None:
    ch = channel.Channel(server.tcp_address, server.authkey)
    protocol.send(ch.connection, 99, 200, b"?")
    ch.connection.settimeout(5)
    frames = protocol.Frames(ch.connection)
    call_id, status, body = frames.wait()
    assert (call_id, status) == (99, protocol.ERR)
    assert "unknown channel op 200" in str(protocol.unpack(False, body))
    ch.connection.settimeout(None)
    ch.close()


def test_a_stale_lease_epoch_is_refused_over_tcp(server: Any) -> None:
    ch = channel.Channel(server.tcp_address, server.authkey)
    with pytest.raises(errors.LeaseLostError, match="older than 5"):
        _call(ch, ("fenced", 4, "echo"))
    assert _call(ch, ("fenced", 5, "echo")) == ("echo",)
    ch.close()


def test_a_connection_flood_does_not_keep_a_trainer_out() -> None:
    srv = channel.ChannelServer(_handler, auth_timeout_s=2.0)
    srv.listen_tcp("127.0.0.1")
    where = _hostport(srv)
    flood = []
    try:
        for _ in range(channel.MAX_HANDSHAKES + 40):  # strangers that never answer
            flood.append(socket.create_connection(where, timeout=5))
        t0 = time.perf_counter()
        ch = None
        while ch is None:  # turned away while the strangers hold every handshake slot
            try:
                ch = channel.Channel(srv.tcp_address or "", srv.authkey, auth_timeout_s=1.0)
            except (AuthenticationError, OSError):
                assert time.perf_counter() - t0 < 10, "the flood kept the trainer out"
                time.sleep(0.1)
        assert _call(ch, ("echo", "in")) == "in"
        ch.close()
        # the strangers beyond the cap were closed at once, the others at the timeout
        closed = 0
        for s in flood:
            s.settimeout(5)
            try:
                while s.recv(4096):
                    pass
                closed += 1
            except OSError:
                pass
        assert closed == len(flood)
    finally:
        for s in flood:
            s.close()
        srv.close()


@pytest.mark.parametrize("bad", ["tcp://", "tcp://host", "tcp://:80", "tcp://h:x", "tcp://h:70000"])
def test_a_bad_tcp_address_is_a_clear_error(bad: str) -> None:
    with pytest.raises(ValueError, match="expected tcp://HOST:PORT"):
        channel.parse_tcp(bad)
    assert channel.parse_tcp("/tmp/x/s") is None
    assert channel.parse_tcp("tcp://[::1]:9") == ("::1", 9)
