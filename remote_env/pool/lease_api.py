"""The pool's lease API over HTTP: trainers without Ray lease, renew, release and
replace env actors, then step them over TCP (:mod:`remote_env.wire`).

It runs in the pool server's process on a port of its own (default
:data:`DEFAULT_PORT`), apart from the unauthenticated ``/metrics``/``/healthz``/
``/status`` server (:mod:`remote_env.pool.http_server`). The rules are the lease
actor's (:class:`~remote_env.pool.lease_actor.LeaseActor`, over the pure
:mod:`~remote_env.pool.lease_rules`): every request here is the same call a Ray
trainer makes (:mod:`remote_env.driver.attach`), so both kinds of trainer share one
book of leases and one fence per actor. What this adds is the door: a bearer token
(the pool's Secret), JSON in and out, errors with a status a client can act on, and
per leased actor its TCP address and a key for that lease only.

**The per-lease key** is ``HMAC-SHA256(actor key, "envpool-lease/<epoch>")``
(:func:`remote_env.wire.protocol.lease_key`), not the actor's own key. The actor
accepts it only while the lease's epoch is its fence (the newest grant on it), and a
connection opened with it makes only that lease's fenced calls. Handing out the
actor key would rely on the fence alone, and the fence guards only *fenced* calls:
a trainer whose lease ended could still connect and step unfenced, or open shared
memory, forever. With the lease key, a lease that ended leaves its holder nothing.

The endpoints, their JSON and errors are written down in ``remote_env/wire/README.md``.
The protocol lives in :class:`LeaseService` (plain, synchronous: unit-tested against
an in-process lease actor); :func:`make_app` is its aiohttp face and
:class:`LeaseApiServer` runs that on a thread of its own.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import hmac
import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final, Protocol

from remote_env import errors
from remote_env import spec as spec_mod
from remote_env.metrics import PoolMetrics
from remote_env.pool import lease_rules
from remote_env.pool import relay as relay_mod
from remote_env.pool.slot import SlotInfo
from remote_env.wire import channel, protocol, relay

log = logging.getLogger(__name__)

#: The lease API's port unless told otherwise (``--lease-port``, ``$ENVPOOL_LEASE_API_PORT``).
DEFAULT_PORT: Final = spec_mod.LEASE_API_PORT  # 8267
#: The file holding the bearer token (the operator mounts the pool's Secret there).
TOKEN_FILE_ENV: Final = "ENVPOOL_LEASE_TOKEN_FILE"
#: The address the API binds to (in a pod: its IP or 0.0.0.0; a NetworkPolicy guards it).
HOST_ENV: Final = "ENVPOOL_LEASE_API_HOST"
PORT_ENV: Final = "ENVPOOL_LEASE_API_PORT"
API_VERSION: Final = 1
#: The longest a request may ask to wait (lease's and replace's ``wait_s``).
MAX_WAIT_S: Final = 600.0
DEFAULT_TTL_S: Final = 60.0
#: how often a waiting lease request asks again (as the Ray trainer's loop does)
_RETRY_S: Final = 0.2
_MAX_BODY: Final = 1 << 20
#: requests served at once (each blocks a thread while the lease actor answers)
_THREADS: Final = 64


class ApiError(Exception):
    """An answer other than 200: its HTTP status and JSON body."""

    def __init__(self, status: int, message: str, **fields: Any) -> None:
        super().__init__(message)
        self.status = status
        self.body: dict[str, Any] = {"error": message, **fields}


def bad_request(field: str, message: str) -> ApiError:
    return ApiError(400, f"field {field!r}: {message}", field=field)


# ------------------------------------------------------------- request bodies


def _field(body: Mapping[str, Any], name: str, kind: type | tuple[type, ...], *,
           default: Any = ..., allow_none: bool = False) -> Any:
    """``body[name]`` checked against ``kind`` (a bool is no int here)."""
    if name not in body:
        if default is ...:
            raise bad_request(name, "missing")
        return default
    value = body[name]
    if value is None and allow_none:
        return None
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if (isinstance(value, bool) and bool not in kinds) or not isinstance(value, kinds):
        names = " or ".join(k.__name__ for k in kinds) + (" or null" if allow_none else "")
        raise bad_request(name, f"must be {names}, got {type(value).__name__} {value!r}")
    return value


def _seconds(body: Mapping[str, Any], name: str, default: float, *, low: float,
             high: float = MAX_WAIT_S, open_low: bool = False) -> float:
    value = float(_field(body, name, (int, float), default=default))
    if value != value or value > high or value < low or (open_low and value == low):
        sign = ">" if open_low else ">="
        raise bad_request(name, f"must be {sign} {low:g} and <= {high:g} seconds, got {value}")
    return value


def _autoreset_mode(body: Mapping[str, Any]) -> str | None:
    """``autoreset_mode``: a gymnasium ``AutoresetMode`` value, or None (absent or null:
    the pool spec's)."""
    mode: str | None = _field(body, "autoreset_mode", str, default=None, allow_none=True)
    if mode is not None and mode not in spec_mod.AUTORESET_MODES:
        modes = ", ".join(repr(m) for m in spec_mod.AUTORESET_MODES)
        raise bad_request("autoreset_mode", f"must be one of {modes} (gymnasium "
                          f"AutoresetMode values) or null for the pool spec's, got {mode!r}")
    return mode


@dataclasses.dataclass(frozen=True)
class LeaseRequest:
    num_envs: int | None
    trainer: str
    ttl_s: float
    wait_s: float
    lease_id: str | None
    #: the mode the leased actors serve this lease in; None: the pool spec's
    autoreset_mode: str | None = None

    @classmethod
    def parse(cls, body: Mapping[str, Any]) -> LeaseRequest:
        num_envs = _field(body, "num_envs", int, allow_none=True, default=None)
        if num_envs is not None and num_envs < 1:
            raise bad_request("num_envs", f"must be >= 1 or null (all free envs), got {num_envs}")
        version = _field(body, "protocol", int, default=protocol.VERSION)
        if version != protocol.VERSION:
            raise bad_request("protocol", f"this pool's actors speak wire protocol version "
                              f"{protocol.VERSION}, the client {version}: use the pool's "
                              "envpool-k8s version in the trainer")
        lease_id = _field(body, "lease_id", str, default=None, allow_none=True)
        if lease_id is not None and not 16 <= len(lease_id) <= 64:
            raise bad_request("lease_id", "must be 16 to 64 characters (a random id of yours)")
        return cls(num_envs, _field(body, "trainer", str, default="http-trainer")[:200],
                   _seconds(body, "ttl_s", DEFAULT_TTL_S, low=0, high=86400, open_low=True),
                   _seconds(body, "wait_s", 0.0, low=0), lease_id, _autoreset_mode(body))


def _lease_id(body: Mapping[str, Any]) -> str:
    lease_id: str = _field(body, "lease_id", str)
    if not lease_id:
        raise bad_request("lease_id", "must not be empty")
    return lease_id


# ------------------------------------------------------------------ service


class Leases(Protocol):
    """The lease actor's calls (a Ray handle's in the pool server; the actor itself in
    tests): ``call("acquire", ...)`` runs ``LeaseActor.acquire(...)``."""

    def __call__(self, method: str, *args: Any) -> Any: ...


class Channels(Protocol):
    """The leased actors' data path, from the pool server's side (Ray in production)."""

    def open(self, slots: Sequence[SlotInfo], epoch: int) -> list[tuple[str, bytes]]:
        """Each actor's ``tcp://host:port`` and channel key, its fence raised to ``epoch``
        (so the lease's key is the one it takes)."""
        ...

    def serve_mode(self, slots: Sequence[SlotInfo], epoch: int, mode: str) -> None:
        """Have the actors serve lease ``epoch`` in autoreset ``mode`` (the actor call a
        Ray trainer makes at attach, ``lease_mode``).

        Raises:
            ApiError: 409, an actor predates per-lease modes.
        """
        ...


class LeaseService:
    """The lease API's requests, synchronous: each answers a JSON-able dict or raises
    :class:`ApiError`. Holds no lease state: that is the lease actor's."""

    def __init__(self, pool: str, leases: Leases, channels: Channels,
                 metrics: PoolMetrics | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self._pool = pool
        self._leases = leases
        self._channels = channels
        self._metrics = metrics
        self._clock = clock
        self._sleep = sleep

    def lease(self, body: Mapping[str, Any]) -> dict[str, Any]:
        req = LeaseRequest.parse(body)
        start = self._clock()
        deadline = start + req.wait_s
        # ours unless given: a retry of a request whose answer was lost is the same lease
        lease_id = req.lease_id or os.urandom(16).hex()
        tries = 0
        while True:
            tries += 1
            try:
                grant = self._leases("acquire", req.trainer, req.num_envs, req.ttl_s, lease_id)
                break
            except lease_rules.LeaseError as exc:
                if self._clock() >= deadline:
                    self._observe("exhausted", start)
                    raise self._exhausted(str(exc), req.num_envs) from None
            self._sleep(min(_RETRY_S, max(0.0, deadline - self._clock())))
        try:
            answer = self._answer(grant, req.ttl_s, req.autoreset_mode)
        except Exception:
            self._leases("release", grant["lease_id"])  # no half-handed lease
            raise
        self._observe("granted" if tries == 1 else "waited", start)
        return answer

    def heartbeat(self, body: Mapping[str, Any]) -> dict[str, Any]:
        lease_id = _lease_id(body)
        slots = _field(body, "slots", list)
        if not all(isinstance(s, int) and not isinstance(s, bool) for s in slots):
            raise bad_request("slots", f"must be a list of slot numbers, got {slots!r}")
        epoch = _field(body, "epoch", int)
        ttl_s = _seconds(body, "ttl_s", DEFAULT_TTL_S, low=0, high=86400, open_low=True)
        trainer = _field(body, "trainer", str, default="http-trainer")[:200]
        if not self._leases("renew", lease_id, trainer, slots, ttl_s, epoch):
            raise ApiError(410, "the lease expired and another trainer leased some of its envs "
                           "(or they left the pool): lease again", reason="lease_lost")
        return {"ok": True, "ttl_s": ttl_s}

    def release(self, body: Mapping[str, Any]) -> dict[str, Any]:
        return {"released": bool(self._leases("release", _lease_id(body)))}

    def replace(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """Ask for a failed actor's replacement and wait for it (up to ``wait_s``)."""
        lease_id = _lease_id(body)
        slot = _field(body, "slot", int)
        actor_id = _field(body, "actor_id", str)
        epoch = _field(body, "epoch", int)
        reason = _field(body, "reason", str, default="actor_died")[:500]
        wait_s = _seconds(body, "wait_s", 30.0, low=0)
        # the lease's mode (the server keeps no lease state): the replacement starts in
        # the pool's own and must serve this lease in the one its trainer asked for
        mode = _autoreset_mode(body)
        try:
            self._leases("request_replace", slot, actor_id, reason, lease_id)
            res = self._leases("wait_for_replacement", slot, actor_id, wait_s, lease_id)
        except errors.LeaseLostError as exc:
            raise ApiError(410, str(getattr(exc, "cause", None) or exc),
                           reason="lease_lost") from None
        if "slot" in res:
            info: SlotInfo = res["slot"]
            [(address, key)] = self._channels.open([info], epoch)
            out: dict[str, Any] = {"actor": _actor(info, address, key, epoch, first_env=None)}
            if mode is not None:
                self._channels.serve_mode([info], epoch, mode)
                out["autoreset_mode"] = mode
            return out
        if "removed" in res:
            raise ApiError(404, f"the pool scaled away slot {slot}: lease again for new envs",
                           reason="removed")
        if "failed" in res:
            raise ApiError(500, f"the pool server gave up on slot {slot}'s actor: "
                           f"{res['failed'].last_error}", reason="failed")
        seen = res.get("server_seen_s_ago")
        raise ApiError(503, f"slot {slot}'s actor was not replaced within wait_s={wait_s:g}s "
                       f"({'the pool server never synced' if seen is None else f'the pool server last synced {seen:.0f}s ago'}): "
                       "ask again", reason="not_yet", retryable=True,
                       server_seen_s_ago=seen)

    def relay_target(self, target: relay.RelayTarget) -> tuple[str, int]:
        """The data address to relay a connection to: the current actor of the caller's
        lease only (never an address the caller names: the relay is no open proxy).

        Raises:
            ApiError: 404 no such lease (released or expired) or the slot is not in
                it; 409 another epoch than the lease's, or the slot's actor was replaced.
        """
        found = self._leases("lease_of", target.lease_id)
        if found is None:
            raise ApiError(404, f"no lease {target.lease_id[:8]}... in pool {self._pool!r}: "
                           "it was released or expired (or never granted): lease again",
                           reason="no_lease")
        epoch = int(found["epoch"])
        if epoch != target.epoch:
            raise ApiError(409, f"epoch {target.epoch} is not the lease's ({epoch}): the "
                           "pool leased these actors again since; lease again",
                           reason="stale_epoch")
        slots: list[SlotInfo] = list(found["slots"])
        info = next((s for s in slots if s.slot == target.slot), None)
        if info is None:
            raise ApiError(404, f"slot {target.slot} is not an actor of this lease (its "
                           f"slots: {sorted(s.slot for s in slots)})", reason="not_leased")
        if info.actor_id != target.actor_id:
            raise ApiError(409, f"slot {target.slot}'s actor {target.actor_id} is not its "
                           f"current one ({info.actor_id}): it was replaced; ask /v1/replace",
                           reason="replaced")
        [(address, _key)] = self._channels.open([info], epoch)
        tcp = channel.parse_tcp(address)
        if tcp is None:
            raise ApiError(503, f"slot {target.slot}'s actor serves no TCP channel "
                           f"({address!r})", reason="actor_unreachable", retryable=True)
        return tcp

    # ------------------------------------------------------------ internals
    def _answer(self, grant: Mapping[str, Any], ttl_s: float,
                mode: str | None) -> dict[str, Any]:
        slots: list[SlotInfo] = list(grant["slots"])
        epoch = int(grant["epoch"])
        where = self._channels.open(slots, epoch)
        pool_info = grant["pool_info"]
        if mode is not None:  # asked for; else the fence left them in the pool's own
            self._channels.serve_mode(slots, epoch, mode)
        actors = []
        first = 0
        for info, (address, key) in zip(slots, where, strict=True):
            actors.append(_actor(info, address, key, epoch, first_env=first))
            first += info.num_envs
        document = pool_info.get("document")
        # the mode granted, said back: a client asking for one can tell this server from
        # one before per-lease modes (which ignores the field and serves the spec's)
        served = mode or (spec_mod.parse_manifest(document).autoreset_mode
                          if document is not None else None)
        return {"lease_id": grant["lease_id"], "epoch": epoch, "pool": self._pool,
                "ttl_s": ttl_s, "protocol": protocol.VERSION, "api": API_VERSION,
                "num_envs": first, "actors": actors, "autoreset_mode": served,
                "spec": document, "revision": pool_info.get("revision")}

    def _exhausted(self, why: str, asked: int | None) -> ApiError:
        free, total = self._free_envs()
        return ApiError(
            409 if total else 503,
            f"{why} (asked {'all free envs' if asked is None else asked}, {free} free); "
            "retryable: ask again, or give wait_s to wait for envs",
            reason="exhausted", retryable=True, free_envs=free, asked_envs=asked,
            total_envs=total)

    def _free_envs(self) -> tuple[int, int]:
        layout = self._leases("layout")
        slots = getattr(layout, "slots", None) or layout["slots"]
        leased = getattr(layout, "leased_slots", None)
        leased = leased if leased is not None else layout["leased_slots"]
        return lease_rules.free_envs(slots, leased), sum(s.num_envs for s in slots)

    def _observe(self, outcome: str, start: float) -> None:
        if self._metrics is not None:
            self._metrics.attach[outcome].observe(self._clock() - start)


def _actor(info: SlotInfo, address: str, key: bytes, epoch: int,
           first_env: int | None) -> dict[str, Any]:
    """One leased actor as the API shows it; its key is the lease's only."""
    out: dict[str, Any] = {"slot": info.slot, "actor_id": info.actor_id,
                           "address": address,
                           "key": protocol.lease_key(key, epoch).hex(),
                           "num_envs": info.num_envs}
    if first_env is not None:
        out["env_ids"] = list(range(first_env, first_env + info.num_envs))
    return out


# --------------------------------------------------------------------- HTTP


def make_app(service: LeaseService, token: bytes,
             splicer: relay_mod.Splicer | None = None) -> Any:
    """The aiohttp application: ``POST /v1/{lease,heartbeat,release,replace}`` and the
    relay's upgrade, ``GET /v1/relay`` (:func:`relay_handler`; none without ``splicer``)."""
    from aiohttp import web

    if not token:
        raise ValueError("the lease API needs a non-empty token")
    expected = b"Bearer " + token

    def error(exc: ApiError) -> Any:
        return web.json_response(exc.body, status=exc.status)

    @web.middleware
    async def guard(request: Any, handler: Any) -> Any:
        given = request.headers.get("Authorization", "").strip().encode()
        if not hmac.compare_digest(given, expected):
            what = "no Authorization header" if not given else "a wrong token"
            if splicer is not None and request.path == relay.PATH:
                splicer.count("refused")
            return error(ApiError(401, f"{what}: send 'Authorization: Bearer <token>' with "
                                  "the pool's lease token (Secret <pool>-lease-token, key "
                                  "'token')", reason="unauthorized"))
        try:
            return await handler(request)
        except ApiError as exc:
            return error(exc)
        except web.HTTPException:
            raise
        except Exception as exc:  # a Ray hiccup: retryable, and said so
            log.exception("lease API: %s failed", request.path)
            return error(ApiError(503, f"{type(exc).__name__}: {exc}", reason="unavailable",
                                  retryable=True))

    def route(method: Callable[[Mapping[str, Any]], dict[str, Any]]) -> Any:
        async def handle(request: Any) -> Any:
            raw = await request.read()
            try:
                body = json.loads(raw or b"{}")
            except ValueError as exc:
                raise ApiError(400, f"the body is not JSON: {exc}", field="body") from None
            if not isinstance(body, dict):
                raise ApiError(400, f"the body must be a JSON object, got "
                               f"{type(body).__name__}", field="body")
            return web.json_response(await asyncio.to_thread(method, body))
        return handle

    app = web.Application(middlewares=[guard], client_max_size=_MAX_BODY)
    app.router.add_post("/v1/lease", route(service.lease))
    app.router.add_post("/v1/heartbeat", route(service.heartbeat))
    app.router.add_post("/v1/release", route(service.release))
    app.router.add_post("/v1/replace", route(service.replace))
    if splicer is not None:
        app.router.add_get(relay.PATH, relay_handler(service, splicer))
    return app


def relay_handler(service: LeaseService, splicer: relay_mod.Splicer) -> Any:
    """``GET /v1/relay``: check the lease, connect to its actor, answer 101 and splice.

    Why the socket is taken over: aiohttp upgrades only to WebSocket; a WebSocket
    would frame (and the client mask) every byte, and need a client library.
    After the checks the handler takes a duplicate of the connection's socket and
    aborts aiohttp's transport (which stops reading it at once and closes its own
    descriptor only): from there on the connection is the relay's, and aiohttp writes
    nothing more on it. Everything here is asyncio's public API.
    """
    from aiohttp import web

    async def handle(request: Any) -> Any:
        if request.headers.get("Upgrade", "").strip().lower() != relay.UPGRADE:
            raise ApiError(426, f"the relay is an upgrade: send 'Connection: Upgrade' and "
                           f"'Upgrade: {relay.UPGRADE}'", reason="upgrade_required")
        try:
            target = relay.RelayTarget.parse(request.query)
        except ValueError as exc:
            splicer.count("refused")
            raise ApiError(400, str(exc), field="query") from None
        if not splicer.reserve():
            splicer.count("full")
            raise ApiError(503, f"the pool server relays at most {splicer.max_connections} "
                           "connections at once, all in use: ask again later, reach the "
                           "actors' pod addresses directly (in the cluster), or raise "
                           f"${relay_mod.MAX_CONNECTIONS_ENV}", reason="relay_full",
                           retryable=True)
        try:
            address = await asyncio.to_thread(service.relay_target, target)
            try:
                actor = await asyncio.to_thread(relay_mod.connect, address)
            except OSError as exc:
                splicer.count("unreachable")
                raise ApiError(503, f"slot {target.slot}'s actor at tcp://{address[0]}:"
                               f"{address[1]} did not accept from the pool server ({exc}): "
                               "it may have died; report it with /v1/replace",
                               reason="actor_unreachable", retryable=True) from None
        except ApiError as exc:
            if exc.body.get("reason") != "actor_unreachable":
                splicer.count("refused")
            splicer.unreserve()
            raise
        except BaseException:
            splicer.unreserve()
            raise
        transport = request.transport
        try:
            if transport is None or transport.is_closing():
                raise ConnectionResetError("the trainer left before its relay was set up")
            raw = transport.get_extra_info("socket")
            trainer = socket.socket(fileno=os.dup(raw.fileno()))
        except BaseException:
            actor.close()
            splicer.unreserve()
            raise
        transport.abort()  # aiohttp stops reading now; closes its descriptor only
        splicer.count("relayed")
        splicer.splice(trainer, actor, relay.response_head())
        return web.Response(status=101)  # not sent: the transport is gone
    return handle


def read_token(path: str | None = None) -> bytes | None:
    """The bearer token from ``path`` (default ``$ENVPOOL_LEASE_TOKEN_FILE``); None when
    no file is configured (the API stays off).

    Raises:
        ValueError: the file is configured but empty or unreadable.
    """
    path = path or os.environ.get(TOKEN_FILE_ENV)
    if not path:
        return None
    try:
        with open(path, "rb") as f:
            token = f.read().strip()
    except OSError as exc:
        raise ValueError(f"lease API token file {path!r} (${TOKEN_FILE_ENV}): {exc}") from exc
    if not token:
        raise ValueError(f"lease API token file {path!r} (${TOKEN_FILE_ENV}) is empty")
    return token


class LeaseApiServer:
    """Runs :func:`make_app` on a daemon thread with its own event loop."""

    def __init__(self, service: LeaseService, token: bytes, host: str, port: int,
                 metrics: PoolMetrics | None = None,
                 relay_max_connections: int = relay_mod.DEFAULT_MAX_CONNECTIONS) -> None:
        #: the relayed connections (its own threads: they outlive no server)
        self.splicer = relay_mod.Splicer(metrics, relay_max_connections)
        self._app = make_app(service, token, self.splicer)
        self._host = host
        self._want_port = port
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: Any = None
        self._thread: threading.Thread | None = None
        self.port: int | None = None

    def start(self, timeout: float = 30.0) -> None:
        from aiohttp import web

        ready = threading.Event()
        failed: list[BaseException] = []

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            asyncio.set_event_loop(loop)
            # requests block a thread each on the lease actor (a replace waits up to its
            # wait_s): more than asyncio's default few, so waits do not queue up leases
            loop.set_default_executor(concurrent.futures.ThreadPoolExecutor(
                max_workers=_THREADS, thread_name_prefix="envpool-lease-api"))
            try:
                runner = web.AppRunner(self._app, access_log=None)
                loop.run_until_complete(runner.setup())
                site = web.TCPSite(runner, self._host, self._want_port)
                loop.run_until_complete(site.start())
                self._runner = runner
                self.port = int(runner.addresses[0][1])
            except BaseException as exc:
                failed.append(exc)
                ready.set()
                loop.close()
                return
            ready.set()
            loop.run_forever()
            loop.run_until_complete(runner.cleanup())
            loop.close()

        self._thread = threading.Thread(target=run, name="envpool-lease-api", daemon=True)
        self._thread.start()
        if not ready.wait(timeout):
            raise TimeoutError("the lease API did not start")
        if failed:
            raise failed[0]

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self._host in ("0.0.0.0", "") else self._host
        return f"http://{host}:{self.port}"

    def close(self) -> None:
        self.splicer.close()
        loop, thread = self._loop, self._thread
        if loop is not None and thread is not None and thread.is_alive():
            loop.call_soon_threadsafe(loop.stop)
            thread.join(10)
        self._thread = None


# ------------------------------------------------------ the Ray-side parts


class RayChannels:
    """:class:`Channels` through Ray: each actor serves TCP on its node's (pod's) address
    once asked; its address and key are kept per actor id."""

    #: a driver node id no actor has: the actor answers with TCP, never its Unix socket
    NODE: Final = "envpool-lease-api"

    def __init__(self, namespace: str, timeout_s: float = lease_rules.FENCE_TIMEOUT_S) -> None:
        self._namespace = namespace
        self._timeout_s = timeout_s
        self._known: dict[str, tuple[str, bytes]] = {}
        self._lock = threading.Lock()

    def open(self, slots: Sequence[SlotInfo], epoch: int) -> list[tuple[str, bytes]]:
        import ray

        handles = [ray.get_actor(s.actor_name, namespace=self._namespace) for s in slots]
        # the grant fenced them already; again here (cheap, idempotent), so a replacement
        # or an actor that was busy then takes this lease's key now
        refs = [h.fence.remote(epoch) for h in handles]
        with self._lock:
            missing = [(s, h) for s, h in zip(slots, handles, strict=True)
                       if s.actor_id not in self._known]
        opened: list[Any] = ray.get([h.open_channel.remote(self.NODE, True) for _, h in missing],
                         timeout=self._timeout_s)
        ray.get(refs, timeout=self._timeout_s)
        with self._lock:
            for (s, _), where in zip(missing, opened, strict=True):
                if where is None:
                    raise RuntimeError(f"actor {s.actor_name} serves no TCP channel")
                self._known[s.actor_id] = (str(where[0]), bytes(where[1]))
            return [self._known[s.actor_id] for s in slots]

    def serve_mode(self, slots: Sequence[SlotInfo], epoch: int, mode: str) -> None:
        """Each actor's ``lease_mode(epoch, mode)``: the call a Ray trainer makes at attach
        (:func:`remote_env.driver.attach.serve_mode`), so both serve a lease's mode alike."""
        import ray

        refs: list[Any] = []
        for s in slots:
            handle = ray.get_actor(s.actor_name, namespace=self._namespace)
            try:
                refs.append(handle.lease_mode.remote(epoch, mode))
            except AttributeError:  # an actor of an older version: no such method
                raise ApiError(
                    409, f"slot {s.slot}'s actor predates per-lease autoreset modes and "
                    f"serves only the pool spec's: leave autoreset_mode out (or ask for the "
                    f"spec's), or update the pool", reason="mode_unsupported",
                    field="autoreset_mode") from None
        ray.get(refs, timeout=self._timeout_s)
