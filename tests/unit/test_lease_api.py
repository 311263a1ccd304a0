"""The pool's HTTP lease API (remote_env.pool.lease_api) served for real (aiohttp on the
loopback) over an in-process lease actor, called with the trainer's own client
(remote_env.driver.http_lease.LeaseApi: the stdlib's urllib); and the per-lease key
the actors' channels take (real sockets)."""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.request
from collections.abc import Iterator, Sequence
from multiprocessing import AuthenticationError
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from remote_env import errors
from remote_env import spec as spec_mod
from remote_env.driver import http_lease
from remote_env.driver.http_lease import LeaseApi, LeaseApiError
from remote_env.metrics import PoolMetrics
from remote_env.pool import lease_api
from remote_env.pool.lease_actor import LeaseActor
from remote_env.pool.slot import SlotInfo
from remote_env.wire import channel, protocol

TOKEN = "s3cret-token"


def _slots(*sizes: int) -> list[SlotInfo]:
    return [SlotInfo(i, f"host-{i:05d}-g1", f"id{i}-1", n, "ready") for i, n in enumerate(sizes)]


class Channels:
    """The actors' TCP addresses and keys (what Ray answers in a real pool)."""

    def __init__(self) -> None:
        self.opened: list[tuple[list[int], int]] = []
        self.modes: list[tuple[list[int], int, str]] = []
        #: actors of a version before per-lease modes (RayChannels' refusal)
        self.modeless = False

    def open(self, slots: Sequence[SlotInfo], epoch: int) -> list[tuple[str, bytes]]:
        self.opened.append(([s.slot for s in slots], epoch))
        return [(f"tcp://10.0.0.{s.slot}:7000", bytes([s.slot]) * 32) for s in slots]

    def serve_mode(self, slots: Sequence[SlotInfo], epoch: int, mode: str) -> None:
        if self.modeless:
            raise lease_api.ApiError(409, "slot 0's actor predates per-lease autoreset modes",
                                     reason="mode_unsupported", field="autoreset_mode")
        self.modes.append(([s.slot for s in slots], epoch, mode))


class Pool:
    def __init__(self, *sizes: int) -> None:
        self.actor = LeaseActor("p", fencer=lambda slots, epoch: None)
        document = spec_mod.parse_spec({"env": {"id": "CartPole-v1"}, "replicas": len(sizes),
                                        "envsPerActor": sizes[0]}, name="p").to_document()
        self.actor.server_sync(_slots(*sizes), {"signature": "s", "revision": "r1",
                                                "document": document}, timeout=0)
        self.channels = Channels()
        self.registry = CollectorRegistry()
        self.metrics = PoolMetrics(self.registry, "p")
        service = lease_api.LeaseService(
            "p", lambda method, *args: getattr(self.actor, method)(*args), self.channels,
            self.metrics)
        self.server = lease_api.LeaseApiServer(service, TOKEN.encode(), "127.0.0.1", 0)
        self.server.start()
        self.api = LeaseApi(self.server.url, TOKEN)

    def attaches(self, outcome: str) -> float:
        return self.registry.get_sample_value(
            "envpool_lease_attach_seconds_count", {"pool": "p", "outcome": outcome}) or 0.0


@pytest.fixture
def pool() -> Iterator[Pool]:
    p = Pool(4, 4, 4, 4)
    yield p
    p.server.close()


def _raw(url: str, body: bytes, auth: str | None) -> tuple[int, dict[str, Any]]:
    headers = {"Content-Type": "application/json"}
    if auth is not None:
        headers["Authorization"] = auth
    req = urllib.request.Request(url, data=body, method="POST", headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_lease_grants_whole_actors_with_addresses_and_lease_keys(pool: Pool) -> None:
    answer = pool.api.post("lease", {"num_envs": 8, "trainer": "t1", "ttl_s": 30}, 10)
    assert answer["num_envs"] == 8 and answer["pool"] == "p"
    assert answer["protocol"] == protocol.VERSION and answer["api"] == 1
    assert spec_mod.parse_manifest(answer["spec"]).name == "p"
    actors = answer["actors"]
    assert [a["slot"] for a in actors] == [0, 1]
    assert [a["env_ids"] for a in actors] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert actors[1]["address"] == "tcp://10.0.0.1:7000"
    epoch = answer["epoch"]
    # the lease's key, never the actor's own
    assert actors[1]["key"] == protocol.lease_key(bytes([1]) * 32, epoch).hex()
    assert actors[1]["key"] != (bytes([1]) * 32).hex()
    assert pool.channels.opened == [([0, 1], epoch)]
    assert pool.actor.layout().leased_slots == {0: answer["lease_id"][:8],
                                                1: answer["lease_id"][:8]}
    assert pool.attaches("granted") == 1


def test_wrong_or_missing_token_is_refused_and_nothing_changes(pool: Pool) -> None:
    url = pool.server.url + "/v1/lease"
    status, body = _raw(url, b'{"num_envs": 4}', "Bearer wrong")
    assert status == 401 and "wrong token" in body["error"]
    status, body = _raw(url, b'{"num_envs": 4}', None)
    assert status == 401 and "no Authorization header" in body["error"]
    assert pool.actor.layout().leases == []
    # the right token still works
    assert pool.api.post("lease", {"num_envs": 4}, 10)["num_envs"] == 4


@pytest.mark.parametrize(("body", "field", "words"), [
    (b"{not json", "body", "not JSON"),
    (b"[1, 2]", "body", "JSON object"),
    (b'{"num_envs": "eight"}', "num_envs", "must be int or null"),
    (b'{"num_envs": true}', "num_envs", "must be int"),
    (b'{"num_envs": 0}', "num_envs", ">= 1"),
    (b'{"num_envs": 4, "ttl_s": -1}', "ttl_s", "> 0"),
    (b'{"num_envs": 4, "wait_s": 1e9}', "wait_s", "<= 600"),
    (b'{"num_envs": 4, "protocol": 2}', "protocol", "version 3, the client 2"),
])
def test_malformed_bodies_are_refused_naming_the_field(pool: Pool, body: bytes, field: str,
                                                      words: str) -> None:
    status, answer = _raw(pool.server.url + "/v1/lease", body, f"Bearer {TOKEN}")
    assert status == 400, answer
    assert answer["field"] == field and words in answer["error"], answer
    assert pool.actor.layout().leases == []


def test_heartbeat_and_replace_name_missing_fields(pool: Pool) -> None:
    with pytest.raises(LeaseApiError) as exc:
        pool.api.post("heartbeat", {"lease_id": "x" * 32, "epoch": 1}, 10)
    assert exc.value.status == 400 and exc.value.body["field"] == "slots"
    with pytest.raises(LeaseApiError) as exc:
        pool.api.post("replace", {"lease_id": "x" * 32, "slot": "0"}, 10)
    assert exc.value.status == 400 and exc.value.body["field"] == "slot"


def test_asking_more_than_free_answers_at_once_with_free_and_asked(pool: Pool) -> None:
    pool.api.post("lease", {"num_envs": 8}, 10)
    start = time.monotonic()
    with pytest.raises(LeaseApiError) as exc:
        pool.api.post("lease", {"num_envs": 12}, 10)
    assert time.monotonic() - start < 2
    err = exc.value
    assert err.status == 409 and err.retryable
    assert (err.free_envs, err.asked_envs) == (8, 12)
    assert "asked 12, 8 free" in str(err)
    assert pool.attaches("exhausted") == 1
    # the lease granted before is untouched, the free envs still lease
    assert pool.api.post("lease", {"num_envs": 8}, 10)["num_envs"] == 8


def test_wait_s_waits_for_envs_to_come_free(pool: Pool) -> None:
    first = pool.api.post("lease", {"num_envs": 16}, 10)
    threading.Timer(0.5, lambda: pool.api.post("release", {"lease_id": first["lease_id"]},
                                               10)).start()
    answer = pool.api.post("lease", {"num_envs": 8, "wait_s": 10}, 20)
    assert answer["num_envs"] == 8
    assert pool.attaches("waited") == 1 and pool.attaches("granted") == 1


def test_heartbeat_release_and_a_lost_lease(pool: Pool) -> None:
    answer = pool.api.post("lease", {"num_envs": 4, "ttl_s": 30}, 10)
    beat = {"lease_id": answer["lease_id"], "slots": [0], "epoch": answer["epoch"], "ttl_s": 30}
    assert pool.api.post("heartbeat", beat, 10)["ok"] is True
    assert pool.api.post("release", {"lease_id": answer["lease_id"]}, 10) == {"released": True}
    assert pool.api.post("release", {"lease_id": answer["lease_id"]}, 10) == {"released": False}
    pool.api.post("lease", {"num_envs": 16}, 10)  # another trainer took the actor
    with pytest.raises(LeaseApiError) as exc:
        pool.api.post("heartbeat", beat, 10)
    assert exc.value.status == 410 and "lease again" in str(exc.value)


def test_replace_waits_for_the_pool_servers_replacement(pool: Pool) -> None:
    answer = pool.api.post("lease", {"num_envs": 4}, 10)
    body = {"lease_id": answer["lease_id"], "slot": 0, "actor_id": "id0-1",
            "epoch": answer["epoch"], "reason": "actor_died", "wait_s": 10}

    def pool_server_replaces() -> None:
        time.sleep(0.3)
        new = _slots(4, 4, 4, 4)
        new[0] = SlotInfo(0, "host-00000-g2", "id0-2", 4, "ready")
        pool.actor.server_sync(new, None, timeout=0)

    threading.Thread(target=pool_server_replaces).start()
    got = pool.api.post("replace", body, 20)["actor"]
    assert got["actor_id"] == "id0-2" and got["slot"] == 0
    assert got["key"] == protocol.lease_key(bytes([0]) * 32, answer["epoch"]).hex()
    # someone else's lease id may not ask
    with pytest.raises(LeaseApiError) as exc:
        pool.api.post("replace", {**body, "lease_id": "y" * 32, "actor_id": "id0-2"}, 10)
    assert exc.value.status == 410
    # not replaced within wait_s: retryable
    with pytest.raises(LeaseApiError) as exc:
        pool.api.post("replace", {**body, "actor_id": "id0-2", "wait_s": 0.2}, 10)
    assert exc.value.status == 503 and exc.value.retryable


def test_a_lease_asking_an_autoreset_mode_has_its_actors_serve_it_and_says_so(
        pool: Pool) -> None:
    default = pool.api.post("lease", {"num_envs": 4}, 10)
    assert default["autoreset_mode"] == "NextStep"  # the spec's; the actors left alone
    assert pool.channels.modes == []
    same = pool.api.post("lease", {"num_envs": 8, "autoreset_mode": "SameStep"}, 10)
    assert same["autoreset_mode"] == "SameStep"
    assert pool.channels.modes == [([1, 2], same["epoch"], "SameStep")]
    # the replacement (built in the pool's mode) is switched to the lease's too
    body = {"lease_id": same["lease_id"], "slot": 2, "actor_id": "id2-1",
            "epoch": same["epoch"], "wait_s": 10, "autoreset_mode": "SameStep"}
    new = _slots(4, 4, 4, 4)
    new[2] = SlotInfo(2, "host-00002-g2", "id2-2", 4, "ready")
    pool.actor.server_sync(new, None, timeout=0)
    got = pool.api.post("replace", body, 20)
    assert got["actor"]["actor_id"] == "id2-2" and got["autoreset_mode"] == "SameStep"
    assert pool.channels.modes[-1] == ([2], same["epoch"], "SameStep")
    with pytest.raises(LeaseApiError, match="field 'autoreset_mode'") as exc:
        pool.api.post("replace", {**body, "actor_id": "id2-2", "autoreset_mode": "x"}, 10)
    assert exc.value.status == 400


@pytest.mark.parametrize("bad", ["SAME_STEP", "nextstep", "", 1, True, ["SameStep"]])
def test_a_bad_autoreset_mode_is_refused_before_anything_is_leased(pool: Pool,
                                                                   bad: Any) -> None:
    with pytest.raises(LeaseApiError, match="field 'autoreset_mode'") as exc:
        pool.api.post("lease", {"num_envs": 4, "autoreset_mode": bad}, 10)
    assert exc.value.status == 400 and exc.value.body["field"] == "autoreset_mode"
    if isinstance(bad, str):
        assert (f"must be one of 'NextStep', 'SameStep', 'Disabled' (gymnasium AutoresetMode "
                f"values) or null for the pool spec's, got {bad!r}") in str(exc.value)
    assert pool.actor.layout().leased_slots == {} and pool.channels.opened == []


def test_actors_that_cannot_switch_modes_refuse_the_lease_and_keep_no_envs(pool: Pool) -> None:
    pool.channels.modeless = True
    with pytest.raises(LeaseApiError, match="predates per-lease autoreset modes") as exc:
        pool.api.post("lease", {"num_envs": 4, "autoreset_mode": "Disabled"}, 10)
    assert exc.value.status == 409 and exc.value.body["reason"] == "mode_unsupported"
    assert pool.actor.layout().leased_slots == {}  # released: no half-handed lease
    assert pool.api.post("lease", {"num_envs": 16}, 10)["autoreset_mode"] == "NextStep"


def test_the_client_tells_a_lease_api_before_per_lease_modes() -> None:
    """An older pool server ignores ``autoreset_mode`` and names none in its answer."""
    document = spec_mod.parse_spec({"env": {"id": "CartPole-v1"}, "replicas": 2,
                                    "autoresetMode": "SameStep"}, name="p").to_document()
    old = {"spec": document}
    assert http_lease.granted_mode("p", "http://h:8267", None, old) is None
    assert http_lease.granted_mode("p", "http://h:8267", "SameStep", old) == "SameStep"
    with pytest.raises(ValueError, match=r"cannot serve autoreset_mode='Disabled' over HTTP: "
                                         r"its lease API at http://h:8267 predates per-lease "
                                         r"autoreset modes.*serves the spec's 'SameStep' only"):
        http_lease.granted_mode("p", "http://h:8267", "Disabled", old)
    new = {**old, "autoreset_mode": "Disabled"}
    assert http_lease.granted_mode("p", "http://h:8267", "Disabled", new) == "Disabled"
    with pytest.raises(ValueError, match="granted 'SameStep'"):
        http_lease.granted_mode("p", "http://h:8267", "Disabled",
                                {**old, "autoreset_mode": "SameStep"})


def test_no_token_no_api(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    monkeypatch.delenv(lease_api.TOKEN_FILE_ENV, raising=False)
    assert lease_api.read_token() is None
    path = tmp_path / "token"
    path.write_text("  tok\n")
    monkeypatch.setenv(lease_api.TOKEN_FILE_ENV, str(path))
    assert lease_api.read_token() == b"tok"
    path.write_text("")
    with pytest.raises(ValueError, match="is empty"):
        lease_api.read_token()
    with pytest.raises(ValueError, match="non-empty token"):
        lease_api.make_app(lease_api.LeaseService("p", lambda *a: None, Channels()), b"")


# ------------------------------------------------- the lease key at the actor


class _Fence:
    def __init__(self) -> None:
        self.epoch = 0


def _server(fence: _Fence, seen: list[int | None]) -> channel.ChannelServer:
    server: channel.ChannelServer

    def handler(message: Any) -> Any:
        seen.append(server.connection_epoch())
        return message

    server = channel.ChannelServer(handler, lease_epoch=lambda: fence.epoch)
    return server


class _NoRay:
    def get(self, *args: Any) -> Any:
        raise AssertionError("no Ray here")


def test_a_lease_key_opens_the_channel_only_while_its_lease_is_the_newest() -> None:
    fence, seen = _Fence(), []
    server = _server(fence, seen)
    try:
        address = server.listen_tcp("127.0.0.1")
        key = server.authkey
        # no lease yet: no lease key is taken
        with pytest.raises(AuthenticationError, match="does not hold this actor's key"):
            channel.Channel(address, protocol.lease_key(key, 7))
        fence.epoch = 7
        chan = channel.Channel(address, protocol.lease_key(key, 7))
        assert channel.get(chan.call(("ping",)), _NoRay()) == ("ping",)
        assert seen == [7]  # bound to its lease
        own = channel.Channel(address, key)  # the actor's own key: Ray-side drivers
        channel.get(own.call(("ping",)), _NoRay())
        assert seen == [7, None]
        fence.epoch = 9  # a newer lease: the old key opens nothing more
        with pytest.raises(AuthenticationError, match="another lease is newer"):
            channel.Channel(address, protocol.lease_key(key, 7))
        channel.Channel(address, protocol.lease_key(key, 9)).close()
        with pytest.raises(AuthenticationError):
            channel.Channel(address, protocol.lease_key(b"x" * 32, 9))
        chan.close()
        own.close()
    finally:
        server.close()


def test_lease_key_connections_make_their_own_leases_fenced_calls_only() -> None:
    import gymnasium as gym

    from remote_env.actor.core import HostCore
    from remote_env.actor.endpoint import ChannelEndpoint

    core = HostCore([lambda: gym.make("CartPole-v1")] * 2)
    core.start()
    endpoint = ChannelEndpoint(core)
    try:
        address, key = endpoint.listen_tcp("127.0.0.1")
        core.fence(5)
        chan = channel.Channel(address, protocol.lease_key(key, 5))
        info = channel.get(chan.call(("fenced", 5, "describe")), _NoRay())
        assert info["num_envs"] == 2
        with pytest.raises(errors.LeaseLostError, match="makes only"):
            channel.get(chan.call(("reset", [0], [None], None)), _NoRay())
        with pytest.raises(errors.LeaseLostError, match="for epoch 6"):
            channel.get(chan.call(("fenced", 6, "reset", [0], [None], None)), _NoRay())
        assert core.current_fence() == 5  # the refused call did not move the fence
        out = channel.get(chan.call(("fenced", 5, "reset", [0, 1], [1, 2], None)), _NoRay())
        assert len(out.obs) == 2
        chan.close()
    finally:
        endpoint.close()
        core.close()


def test_an_unreachable_leased_actor_fails_its_call_as_a_dead_one() -> None:
    """A Ray-free trainer's call to an actor it cannot reach fails like a dead actor's
    (ChannelClosedError when read), so the vector env reports it and gets a replacement."""
    from remote_env.driver.http_lease import NoRay, TcpActor

    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    actor = TcpActor({"slot": 2, "actor_id": "a", "address": f"tcp://127.0.0.1:{port}",
                      "key": "00" * 32, "num_envs": 1}, epoch=5)
    ref = actor.describe.remote()
    ready, _ = channel.wait([ref], 1, 1.0, NoRay())
    assert ready == [ref]
    with pytest.raises(channel.ChannelClosedError, match="slot 2"):
        NoRay().get(ref)
    assert NoRay().get(actor.open_channel.remote("n", True)) == (
        f"tcp://127.0.0.1:{port}", bytes(32))
