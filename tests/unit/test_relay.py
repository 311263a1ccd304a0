"""The relay through the pool server (remote_env.wire.relay, remote_env.pool.relay):
its pure parts, and the lease API serving it for real (aiohttp on the loopback) over
an in-process lease actor and real channel servers standing for the actors; the
client is the trainer's own (RelayDialer, channel.Channel)."""

from __future__ import annotations

import socket
import time
import urllib.request
from collections.abc import Iterator, Sequence
from multiprocessing import AuthenticationError
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from remote_env import spec as spec_mod
from remote_env.driver import http_lease
from remote_env.driver.http_lease import LeaseApi, LeaseApiError, LeaseApiUnreachableError
from remote_env.metrics import PoolMetrics
from remote_env.pool import lease_api
from remote_env.pool import relay as relay_pool
from remote_env.pool.lease_actor import LeaseActor
from remote_env.pool.slot import SlotInfo
from remote_env.wire import channel, protocol, relay

TOKEN = "relay-token"

# ------------------------------------------------------------------ pure parts


def test_a_target_round_trips_through_its_query() -> None:
    target = relay.RelayTarget("ab" * 16, 3, "actor-3", 1765012345678901234)
    parsed = dict(pair.split("=") for pair in target.query().split("&"))
    assert relay.RelayTarget.parse(parsed) == target


@pytest.mark.parametrize(("query", "words"), [
    ({"slot": "1", "actor_id": "a", "epoch": "1"}, "'lease_id': missing"),
    ({"lease_id": "x", "slot": "-1", "actor_id": "a", "epoch": "1"}, "'slot': must be an integer"),
    ({"lease_id": "x", "slot": "1", "actor_id": "a", "epoch": "1e3"}, "'epoch': must be an integer"),
    ({"lease_id": "x", "slot": "1", "epoch": "1"}, "'actor_id': missing"),
])
def test_a_bad_target_names_its_field(query: dict[str, str], words: str) -> None:
    with pytest.raises(ValueError, match=words):
        relay.RelayTarget.parse(query)


def test_the_request_and_response_heads() -> None:
    head = relay.request_head("h:1", relay.RelayTarget("L" * 16, 0, "a", 5), "tok").decode()
    assert head.startswith("GET /v1/relay?lease_id=LLLLLLLLLLLLLLLL&slot=0&actor_id=a&epoch=5 ")
    assert "\r\nAuthorization: Bearer tok\r\n" in head and head.endswith("\r\n\r\n")
    assert f"\r\nUpgrade: {relay.UPGRADE}\r\n" in head
    assert relay.parse_response_head(relay.response_head()) == (
        101, {"upgrade": relay.UPGRADE, "connection": "Upgrade"})
    with pytest.raises(ValueError, match="not an HTTP response"):
        relay.parse_response_head(b"EPWIRE\x03\x00\r\n\r\n")
    with pytest.raises(ValueError, match="http://HOST:PORT"):
        relay.split_url("https://head:8267")
    assert relay.split_url("http://127.0.0.1:8267/") == ("127.0.0.1", 8267)


def test_auto_relays_only_when_the_pod_address_does_not_accept() -> None:
    assert http_lease.choose_relay("auto", ["tcp://10.0.0.1:1"], lambda a: True) is False
    assert http_lease.choose_relay("auto", ["tcp://10.0.0.1:1"], lambda a: False) is True
    assert http_lease.choose_relay(True, ["tcp://10.0.0.1:1"], lambda a: True) is True
    assert http_lease.choose_relay(False, ["tcp://10.0.0.1:1"], lambda a: False) is False
    with pytest.raises(ValueError, match="True, False or 'auto'"):
        http_lease.choose_relay("yes", [], lambda a: True)


def test_reachable_probes_for_real() -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    assert http_lease.reachable(f"tcp://127.0.0.1:{port}", 2.0)
    listener.close()
    assert not http_lease.reachable(f"tcp://127.0.0.1:{port}", 2.0)


def test_an_unreachable_lease_api_says_which_url_and_what_to_check() -> None:
    sock = socket.create_server(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()  # nothing listens there now
    api = LeaseApi(f"http://127.0.0.1:{port}", TOKEN)
    with pytest.raises(LeaseApiUnreachableError) as exc:
        api.post("lease", {"num_envs": 1}, 5)
    err = exc.value
    assert isinstance(err, LeaseApiError) and isinstance(err, OSError)  # both handlers apply
    assert err.retryable and err.status == 0
    text = str(err)
    assert f"http://127.0.0.1:{port}/v1/lease" in text and "did not answer" in text
    assert "kubectl port-forward svc/<pool>-head-svc 8267:8267" in text
    assert "head-svc:8267" in text


def test_max_connections_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(relay_pool.MAX_CONNECTIONS_ENV, raising=False)
    assert relay_pool.max_connections_from_env() == relay_pool.DEFAULT_MAX_CONNECTIONS
    monkeypatch.setenv(relay_pool.MAX_CONNECTIONS_ENV, "7")
    assert relay_pool.max_connections_from_env() == 7
    monkeypatch.setenv(relay_pool.MAX_CONNECTIONS_ENV, "lots")
    with pytest.raises(ValueError, match="integer >= 0"):
        relay_pool.max_connections_from_env()


# ------------------------------------------------------------- served for real


class Actors:
    """Real channel servers over TCP on the loopback, one per slot (the pool's actors:
    their fence is the newest grant's epoch, as the lease actor's fencer sets it)."""

    def __init__(self, n: int) -> None:
        self.fence = {i: 0 for i in range(n)}
        self.servers = [channel.ChannelServer(self._handler, lease_epoch=self._epoch_of(i))
                        for i in range(n)]
        for srv in self.servers:
            srv.listen_tcp("127.0.0.1")

    def _epoch_of(self, i: int) -> Any:
        return lambda: self.fence[i]

    @staticmethod
    def _handler(message: Any) -> Any:
        return ("echo", message)

    def fencer(self, slots: Sequence[SlotInfo], epoch: int) -> None:
        for s in slots:
            self.fence[s.slot] = epoch

    def open(self, slots: Sequence[SlotInfo], epoch: int) -> list[tuple[str, bytes]]:
        out = []
        for s in slots:
            srv = self.servers[s.slot]
            assert srv.tcp_address is not None
            out.append((srv.tcp_address, srv.authkey))
        return out

    def close(self) -> None:
        for srv in self.servers:
            srv.close()


class Pool:
    def __init__(self, max_connections: int = 8) -> None:
        self.actors = Actors(4)
        self.actor = LeaseActor("p", fencer=self.actors.fencer)
        document = spec_mod.parse_spec({"env": {"id": "CartPole-v1"}, "replicas": 4,
                                        "envsPerActor": 2}, name="p").to_document()
        slots = [SlotInfo(i, f"host-{i:05d}-g1", f"id{i}-1", 2, "ready") for i in range(4)]
        self.actor.server_sync(slots, {"signature": "s", "revision": "r1",
                                       "document": document}, timeout=0)
        self.registry = CollectorRegistry()
        metrics = PoolMetrics(self.registry, "p")
        service = lease_api.LeaseService(
            "p", lambda method, *args: getattr(self.actor, method)(*args), self.actors, metrics)
        self.server = lease_api.LeaseApiServer(service, TOKEN.encode(), "127.0.0.1", 0,
                                               metrics, max_connections)
        self.server.start()
        self.api = LeaseApi(self.server.url, TOKEN)

    def sample(self, name: str, **labels: str) -> float:
        return self.registry.get_sample_value(name, {"pool": "p", **labels}) or 0.0

    def close(self) -> None:
        self.server.close()
        self.actors.close()


@pytest.fixture
def pool() -> Iterator[Pool]:
    p = Pool()
    yield p
    p.close()


def _lease(pool: Pool, num_envs: int = 4) -> dict[str, Any]:
    return pool.api.post("lease", {"num_envs": num_envs, "trainer": "t", "ttl_s": 30}, 10)


def _target(answer: dict[str, Any], i: int = 0, **change: Any) -> relay.RelayTarget:
    a = answer["actors"][i]
    fields = {"lease_id": answer["lease_id"], "slot": a["slot"], "actor_id": a["actor_id"],
              "epoch": answer["epoch"], **change}
    return relay.RelayTarget(**fields)


def _open(pool: Pool, answer: dict[str, Any], i: int = 0, api: LeaseApi | None = None,
          **change: Any) -> channel.Channel:
    key = bytes.fromhex(answer["actors"][i]["key"])
    return channel.Channel((api or pool.api).dialer(_target(answer, i, **change)), key)


def test_a_channel_through_the_relay_is_the_actors_end_to_end(pool: Pool) -> None:
    answer = _lease(pool)
    chans = [_open(pool, answer, i) for i in range(2)]
    for i, chan in enumerate(chans):
        # pipelined calls, each reply to its own call, a large one among them
        calls = [chan.call(("ping", i, n)) for n in range(5)]
        big = chan.call(("blob", b"x" * (3 << 20)))
        assert [channel.get(c, None) for c in calls] == [("echo", ("ping", i, n))
                                                          for n in range(5)]
        assert channel.get(big, None) == ("echo", ("blob", b"x" * (3 << 20)))
    assert pool.sample("envpool_relay_connections_total", outcome="relayed") == 2
    assert pool.sample("envpool_relay_open_connections") == 2
    # A pump counts a chunk once it is sent, so the trainer can hold the reply a moment
    # before the count does (CI once read 6,157,999 of the 6,291,456+ bytes): wait for it.
    deadline = time.monotonic() + 10
    while (min(pool.sample("envpool_relay_bytes_total", direction=d)
               for d in ("to_trainer", "to_actor")) <= 2 * (3 << 20)
           and time.monotonic() < deadline):
        time.sleep(0.02)
    assert pool.sample("envpool_relay_bytes_total", direction="to_trainer") > 2 * (3 << 20)
    assert pool.sample("envpool_relay_bytes_total", direction="to_actor") > 2 * (3 << 20)
    for chan in chans:
        chan.close()
    deadline = time.monotonic() + 10
    while pool.server.splicer.open_connections and time.monotonic() < deadline:
        time.sleep(0.02)
    assert pool.server.splicer.open_connections == 0
    assert pool.sample("envpool_relay_open_connections") == 0


def test_the_relay_cannot_forge_the_handshake(pool: Pool) -> None:
    """The key stays end to end: a relayed client with a wrong key is refused by the
    actor itself, as on a direct connection."""
    answer = _lease(pool)
    dialer = pool.api.dialer(_target(answer))
    with pytest.raises(AuthenticationError, match="refused"):
        channel.Channel(dialer, b"\x00" * 32)


def test_a_wrong_token_is_refused_with_401(pool: Pool) -> None:
    answer = _lease(pool)
    with pytest.raises(relay.RelayRefusedError) as exc:
        _open(pool, answer, api=LeaseApi(pool.server.url, "not-the-token"))
    assert exc.value.status == 401 and "wrong token" in str(exc.value)
    assert pool.sample("envpool_relay_connections_total", outcome="refused") == 1
    assert pool.sample("envpool_relay_connections_total", outcome="relayed") == 0


@pytest.mark.parametrize(("change", "status", "reason", "words"), [
    ({"slot": 3}, 404, "not_leased", "slot 3 is not an actor of this lease"),
    ({"actor_id": "id0-0"}, 409, "replaced", "it was replaced; ask /v1/replace"),
    ({"epoch": 12}, 409, "stale_epoch", "epoch 12 is not the lease's"),
    ({"lease_id": "f" * 32}, 404, "no_lease", "released or expired"),
])
def test_not_a_current_actor_of_a_held_lease_is_refused(
        pool: Pool, change: dict[str, Any], status: int, reason: str, words: str) -> None:
    answer = _lease(pool)
    with pytest.raises(relay.RelayRefusedError) as exc:
        _open(pool, answer, **change)
    assert (exc.value.status, exc.value.reason) == (status, reason), exc.value.body
    assert words in str(exc.value)
    assert pool.sample("envpool_relay_connections_total", outcome="relayed") == 0


def test_a_released_lease_relays_no_more(pool: Pool) -> None:
    answer = _lease(pool)
    _open(pool, answer).close()
    pool.api.post("release", {"lease_id": answer["lease_id"]}, 10)
    with pytest.raises(relay.RelayRefusedError) as exc:
        _open(pool, answer)
    assert exc.value.status == 404 and exc.value.reason == "no_lease"


def test_a_plain_get_without_the_upgrade_is_told_what_to_send(pool: Pool) -> None:
    answer = _lease(pool)
    req = urllib.request.Request(f"{pool.server.url}/v1/relay?{_target(answer).query()}",
                                 headers={"Authorization": f"Bearer {TOKEN}"})
    with pytest.raises(urllib.error.HTTPError) as exc:
        urllib.request.urlopen(req, timeout=10)
    assert exc.value.code == 426 and relay.UPGRADE in exc.value.read().decode()
    # and the API serves on
    assert _lease(pool, 2)["num_envs"] == 2


def test_the_cap_turns_away_more_and_frees_its_places() -> None:
    p = Pool(max_connections=2)
    try:
        answer = _lease(p)
        first = [_open(p, answer, i) for i in range(2)]
        with pytest.raises(relay.RelayRefusedError) as exc:
            _open(p, answer, 0)
        assert exc.value.status == 503 and exc.value.reason == "relay_full"
        assert exc.value.body["retryable"] is True and "at most 2" in str(exc.value)
        assert p.sample("envpool_relay_connections_total", outcome="full") == 1
        first[0].close()
        deadline = time.monotonic() + 10
        while p.server.splicer.open_connections > 1 and time.monotonic() < deadline:
            time.sleep(0.02)
        again = _open(p, answer, 0)  # the place came back
        assert channel.get(again.call(("ping",)), None) == ("echo", ("ping",))
        again.close()
        first[1].close()
    finally:
        p.close()


def test_an_actor_that_is_gone_ends_the_relayed_connection_with_eof(pool: Pool) -> None:
    answer = _lease(pool)
    chan = _open(pool, answer)
    assert channel.get(chan.call(("ping",)), None) == ("echo", ("ping",))
    # the actor's end of the relayed connection closes (its process died)
    pool.server.splicer.close()
    with pytest.raises(channel.ChannelClosedError):
        channel.get(chan.call(("ping",)), None)


def test_an_unreachable_actor_is_a_retryable_503(pool: Pool) -> None:
    answer = _lease(pool)
    pool.actors.servers[answer["actors"][0]["slot"]].close()  # nothing accepts there now
    with pytest.raises(relay.RelayRefusedError) as exc:
        _open(pool, answer)
    assert exc.value.status == 503 and exc.value.reason == "actor_unreachable"
    assert "/v1/replace" in str(exc.value)
    assert pool.sample("envpool_relay_connections_total", outcome="unreachable") == 1
    assert pool.server.splicer.open_connections == 0
    # its place under the cap was given back
    assert pool.server.splicer.reserve()
    pool.server.splicer.unreserve()


def test_protocol_version_is_checked_end_to_end(pool: Pool) -> None:
    """The actor's hello reaches the relayed client unchanged (its version)."""
    answer = _lease(pool)
    sock = pool.api.dialer(_target(answer)).dial(5)
    try:
        hello = sock.recv(protocol.HELLO.size)
        assert protocol.HELLO.unpack(hello) == (protocol.MAGIC, protocol.VERSION)
    finally:
        sock.close()
