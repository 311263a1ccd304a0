"""A trainer without Ray: lease a pool's envs over its HTTP lease API, step them over TCP.

``RemoteVectorEnv.from_pool("cartpole", url="http://cartpole-head-svc:8267",
token_file="/etc/envpool/lease-token/token")`` calls :func:`lease_pool`: it leases
whole actors through the pool server's lease API (:mod:`remote_env.pool.lease_api`;
the same lease rules and fences as a Ray trainer's lease), and builds the vector env
over stand-ins for the actors' Ray handles (:class:`TcpActor`) and for the ``ray``
module (:class:`NoRay`): every call goes over the actor's TCP channel
(:mod:`remote_env.wire.channel`), authenticated with the lease's own key. The
vector env is the same class, so steps, ``send``/``recv``, splits, failures and
metrics behave as with Ray.

* A heartbeat thread renews the lease (``POST /v1/heartbeat``); ``close()``
  releases it (``/v1/release``); a trainer that dies stops renewing and its envs go
  back after ``lease_timeout_s``.
* An actor that dies closes its socket: the step returns its envs truncated with
  ``info["error"]``, and the replacement the pool server makes comes back through
  ``/v1/replace`` (the pool server is the one owner of restarts).

Nothing here imports ``ray``: the import path of such a trainer runs in an image
without it (``pip install --no-deps envpool-k8s`` plus the ``client`` extra; see the
README). The HTTP client is the standard library's.

Example:
    >>> envs = RemoteVectorEnv.from_pool("cartpole", url="http://head:8267",
    ...                                  token_file="/etc/envpool/lease-token/token",
    ...                                  num_envs=8)  # doctest: +SKIP
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing import AuthenticationError
from typing import Any, Final

from gymnasium.vector import AutoresetMode

from remote_env import errors
from remote_env import spec as spec_mod
from remote_env.driver import attach_options, heartbeat
from remote_env.wire import channel, protocol, relay

log = logging.getLogger(__name__)

#: How long one HTTP request may take beyond the ``wait_s`` it asks the server for.
HTTP_SLACK_S: Final = 30.0
#: The longest one replace request waits on the server (asked again until the deadline).
_REPLACE_POLL_S: Final = 30.0


class LeaseApiError(RuntimeError):
    """The lease API refused a request: its HTTP status and JSON answer.

    ``retryable`` (409 too few free envs, 503 not ready / not yet): asking again later
    may succeed; ``free_envs``/``asked_envs`` say how far the pool was from granting.
    """

    def __init__(self, status: int, body: dict[str, Any], url: str,
                 message: str | None = None) -> None:
        said = str(body.get("error") or body)
        super().__init__(message or f"{url}: HTTP {status}: {said}")
        self.status = status
        self.body = body

    @property
    def retryable(self) -> bool:
        return bool(self.body.get("retryable"))

    @property
    def free_envs(self) -> int | None:
        free = self.body.get("free_envs")
        return None if free is None else int(free)

    @property
    def asked_envs(self) -> int | None:
        asked = self.body.get("asked_envs")
        return None if asked is None else int(asked)


class LeaseApiUnreachableError(LeaseApiError, ConnectionError):
    """The lease API did not answer at all (no HTTP status: refused, no route, a name
    that does not resolve, a timeout). Retryable; an ``OSError`` too, so the loops
    that ride out a restarting pool server (heartbeat, replace) go on handling it."""

    def __init__(self, url: str, cause: BaseException) -> None:
        why = getattr(cause, "reason", None) or cause
        super().__init__(
            0, {"error": str(why), "reason": "unreachable", "retryable": True}, url,
            f"the pool's lease API at {url} did not answer ({type(why).__name__}: "
            f"{why}): check the URL names the pool's head service and lease port "
            "(http://<pool>-head-svc:8267 in the cluster, in the pool's namespace); from "
            "outside the cluster, that `kubectl port-forward svc/<pool>-head-svc "
            "8267:8267` is running and the URL is http://127.0.0.1:8267")


class LeaseApi:
    """``POST`` JSON to a pool's lease API with its bearer token (the stdlib's urllib)."""

    def __init__(self, url: str, token: str | bytes) -> None:
        self.url = url.rstrip("/")
        raw = token.decode() if isinstance(token, bytes) else token
        self._token = raw.strip()
        self._auth = "Bearer " + self._token

    def dialer(self, target: relay.RelayTarget) -> relay.RelayDialer:
        """Opens ``target``'s channel through the pool server's relay (same port, token)."""
        return relay.RelayDialer(self.url, self._token, target)

    def post(self, path: str, body: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        url = f"{self.url}/v1/{path}"
        req = urllib.request.Request(
            url, data=json.dumps(body).encode(), method="POST",
            headers={"Authorization": self._auth, "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout_s) as resp:
                answer: dict[str, Any] = json.loads(resp.read())
                return answer
        except urllib.error.HTTPError as exc:
            raw = exc.read()
            try:
                parsed = json.loads(raw)
            except ValueError:
                parsed = {"error": raw.decode(errors="replace")[:500]}
            raise LeaseApiError(exc.code, parsed if isinstance(parsed, dict)
                                else {"error": str(parsed)}, url) from None
        except (urllib.error.URLError, OSError) as exc:  # no answer: no HTTP status
            raise LeaseApiUnreachableError(url, exc) from exc


def read_token(token: str | bytes | None, token_file: str | None) -> str:
    """The bearer token: ``token``, else the file's contents."""
    if token is not None and token_file is not None:
        raise ValueError("give token or token_file, not both")
    if token is not None:
        value = token.decode() if isinstance(token, bytes) else token
    elif token_file is not None:
        with open(token_file, encoding="utf-8") as f:
            value = f.read()
    else:
        raise ValueError("a pool's lease API needs its token: pass token=... or token_file=... "
                         "(the Secret <pool>-lease-token, key 'token')")
    if not value.strip():
        raise ValueError("the lease token is empty" + (f" ({token_file})" if token_file else ""))
    return value.strip()


# ------------------------------------------------------ stand-ins for Ray's


@dataclass(frozen=True)
class _Done:
    """An answer known at once (a stand-in for a Ray ref that is ready)."""

    value: Any


class TcpActor:
    """A leased actor reached over TCP only: what the vector env uses a Ray handle for.

    ``handle.describe.remote()`` and other calls go over a control channel of its
    own as the lease's fenced calls; ``open_channel`` answers with the actor's address
    and the lease key, so the vector env opens its data channel as it would to an
    actor on another node.
    """

    def __init__(self, entry: dict[str, Any], epoch: int, route: Route | None = None) -> None:
        self.slot = int(entry["slot"])
        self.actor_id = str(entry["actor_id"])
        self.address = str(entry["address"])
        self.num_envs = int(entry["num_envs"])
        self.epoch = epoch
        self._key = bytes.fromhex(str(entry["key"]))
        channel.parse_tcp(self.address)  # a bad address fails here, clearly
        #: where its channels connect: the pod address, or the pool server's relay
        self.via: str | channel.Dialer = (self.address if route is None
                                          else route.dialer(self.slot, self.actor_id, epoch))
        self._control: channel.Channel | None = None
        self._lock = threading.Lock()

    def __getattr__(self, method: str) -> _Method:
        if method.startswith("_"):
            raise AttributeError(method)
        return _Method(self, method)

    def call(self, method: str, *args: Any) -> Any:
        if method == "open_channel":
            return _Done((self.via, self._key))
        if method == "close":  # the pool's actor keeps its envs for the next trainer
            return _Done([])
        message = (("fenced", *args) if method == "fenced"
                   else ("fenced", self.epoch, method, *args))
        with self._lock:
            try:
                if self._control is None or self._control.closed:
                    self._control = channel.Channel(self.via, self._key)
            except (OSError, AuthenticationError) as exc:
                # gone, or its key refused (a replacement not fenced yet): as a dead
                # actor's call fails, so the vector env reports it and gets a replacement
                return channel.failed_call(channel.ChannelClosedError(
                    f"actor at {self.address} (slot {self.slot}) unreachable: {exc}"))
            return self._control.call(message)

    def close(self) -> None:
        with self._lock:
            if self._control is not None:
                self._control.close()
                self._control = None

    def __repr__(self) -> str:
        via = "" if isinstance(self.via, str) else f" {self.via}"
        return f"TcpActor(slot={self.slot}, {self.address}{via})"


@dataclass(frozen=True)
class Route:
    """A lease's actors reached through the pool server's relay
    (:mod:`remote_env.wire.relay`), for trainers that cannot reach pod addresses."""

    api: LeaseApi
    lease_id: str

    def dialer(self, slot: int, actor_id: str, epoch: int) -> relay.RelayDialer:
        return self.api.dialer(relay.RelayTarget(self.lease_id, slot, actor_id, epoch))


#: How long ``relay="auto"`` gives an actor's pod address to accept before it goes
#: through the relay instead (a pod address from outside the cluster is mostly
#: dropped silently, not refused: this is that wait).
RELAY_PROBE_S: Final = 2.0


def reachable(address: str, timeout_s: float = RELAY_PROBE_S) -> bool:
    """Whether ``tcp://host:port`` accepts a connection within ``timeout_s``."""
    where = channel.parse_tcp(address)
    if where is None:
        return False
    try:
        socket.create_connection(where, timeout=timeout_s).close()
    except OSError:
        return False
    return True


def choose_relay(relay_opt: bool | str, addresses: Sequence[str],
                 probe: Callable[[str], bool] = reachable) -> bool:
    """Whether a lease's channels go through the relay: ``relay`` as given, or for
    "auto" when its first actor's pod address does not accept (a trainer outside the
    cluster). Pure but for ``probe``."""
    if relay_opt is True or relay_opt is False:
        return relay_opt
    if relay_opt != "auto":
        raise ValueError(f"relay must be True, False or 'auto', got {relay_opt!r}")
    return bool(addresses) and not probe(addresses[0])


@dataclass(frozen=True)
class _Method:
    actor: TcpActor
    name: str

    def remote(self, *args: Any) -> Any:
        return self.actor.call(self.name, *args)


class _Never(Exception):
    """A Ray error type no call here raises (only Ray does)."""


class NoRay:
    """What the vector env calls on the ``ray`` module, for actors reached over TCP only.

    Its exception types are ones nothing raises: a dead actor shows as the channel's
    :class:`~remote_env.wire.channel.ChannelClosedError`, as it does under Ray.
    """

    class exceptions:
        RayActorError = type("RayActorError", (_Never,), {})
        RayTaskError = type("RayTaskError", (_Never,), {})
        GetTimeoutError = type("GetTimeoutError", (_Never,), {})
        ActorUnavailableError = type("ActorUnavailableError", (_Never,), {})

    NODE: Final = "envpool-http-trainer"

    def is_initialized(self) -> bool:
        """False: nothing here owns actors to close or kill (the pool's stay warm)."""
        return False

    def get_runtime_context(self) -> NoRay:
        return self

    def get_node_id(self) -> str:
        """No actor's node: every actor is reached over TCP."""
        return self.NODE

    def cluster_resources(self) -> dict[str, float]:
        return {"CPU": 1.0}

    def get(self, ref: Any, timeout: float | None = None) -> Any:
        if isinstance(ref, list):
            return [self.get(r, timeout) for r in ref]
        if isinstance(ref, _Done):
            return ref.value
        return channel.get(ref, self)

    def wait(self, refs: Sequence[Any], num_returns: int = 1,
             timeout: float | None = None) -> tuple[list[Any], list[Any]]:
        return list(refs), []  # only answers known at once get here

    def kill(self, handle: Any, no_restart: bool = True) -> None:
        if isinstance(handle, TcpActor):
            handle.close()


# ------------------------------------------------------------------ the lease


class HttpLease:
    """The lease (a :class:`~remote_env.driver.lease.HeldLease`), renewed on a daemon
    thread over HTTP. Holds no reference to the env (GC)."""

    def __init__(self, api: LeaseApi, answer: dict[str, Any], trainer: str,
                 ttl_s: float) -> None:
        self._api = api
        self.lease_id = str(answer["lease_id"])
        self.epoch = int(answer["epoch"])
        self.slots = [int(a["slot"]) for a in answer["actors"]]
        self.trainer = trainer
        self.ttl_s = ttl_s
        #: slot -> its actor now (replacements included): their control channels close
        #: with the lease
        self.actors: dict[int, TcpActor] = {}
        self._released = False
        self.beat = heartbeat.Heartbeat(self.lease_id[:8], ttl_s, self._renew)

    @property
    def lost(self) -> bool:
        return self.beat.lost

    def _renew(self) -> bool:
        """One heartbeat (the :class:`~remote_env.driver.heartbeat.Heartbeat`'s call): 410
        is the pool's word that the lease is over; anything else that fails (the pool
        server restarting with its head, a 503, an answer that is not JSON) is retried."""
        body = {"lease_id": self.lease_id, "trainer": self.trainer, "slots": self.slots,
                "ttl_s": self.ttl_s, "epoch": self.epoch}
        try:
            self._api.post("heartbeat", body, self.ttl_s / 3)
        except LeaseApiError as exc:
            if exc.status == 410:
                log.error("lease %s: %s", self.lease_id[:8], exc)
                return False
            raise
        return True

    def check(self) -> None:
        if self.lost:
            raise errors.LeaseLostError(
                f"the lease on slots {self.slots} expired (no heartbeat for {self.ttl_s}s) and "
                "another trainer leased some of them; attach again")

    def release(self) -> None:
        if self._released:
            return
        self._released = True
        self.beat.stop()
        for actor in self.actors.values():
            actor.close()
        try:
            self._api.post("release", {"lease_id": self.lease_id}, 10.0)
        except (LeaseApiError, OSError) as exc:  # it expires on its own anyway
            log.warning("lease %s: release failed (%s); it expires in %ss", self.lease_id[:8],
                        exc, self.ttl_s)


class HttpReplacer:
    """``actor_replacer``: the pool server replaces a failed actor; we ask and wait."""

    def __init__(self, api: LeaseApi, lease: HttpLease, first_env: dict[int, int],
                 timeout_s: float, route: Route | None = None,
                 autoreset_mode: str | None = None) -> None:
        self._api = api
        self._route = route
        #: the mode the trainer asked for (None: the spec's): the replacement, built in
        #: the pool's own, serves the lease in it too
        self._mode = autoreset_mode
        self._lease = lease
        self._first_env = first_env
        self._timeout_s = timeout_s

    def __call__(self, failed: TcpActor, reason: str) -> TcpActor:
        failed.close()
        env = self._first_env[failed.slot]
        deadline = time.monotonic() + self._timeout_s
        while True:
            wait_s = max(0.0, min(deadline - time.monotonic(), _REPLACE_POLL_S))
            body = {"lease_id": self._lease.lease_id, "slot": failed.slot,
                    "actor_id": failed.actor_id, "epoch": self._lease.epoch,
                    "reason": reason, "wait_s": wait_s}
            if self._mode is not None:
                body["autoreset_mode"] = self._mode
            try:
                answer = self._api.post("replace", body, wait_s + HTTP_SLACK_S)
                actor = TcpActor(answer["actor"], self._lease.epoch, self._route)
                self._lease.actors[actor.slot] = actor
                return actor
            except OSError as exc:  # the pool server restarting: ask again until the deadline
                if time.monotonic() >= deadline:
                    raise errors.SubEnvironmentFailedError(
                        env, f"its actor failed ({reason}); the pool's lease API did not "
                        f"answer: {exc}") from None
                time.sleep(0.5)
            except LeaseApiError as exc:
                if exc.status == 410:
                    raise errors.LeaseLostError(str(exc)) from None
                if not exc.retryable or time.monotonic() >= deadline:
                    raise errors.SubEnvironmentFailedError(
                        env, f"its actor failed ({reason}) and the pool did not replace it "
                        f"within {self._timeout_s:.0f}s: {exc}") from None


@dataclass(frozen=True)
class HttpGrant:
    """What an HTTP lease gives: ``RemoteVectorEnv.from_actors(**grant.from_actors())``."""

    handles: list[TcpActor]
    lease: HttpLease
    replacer: HttpReplacer
    options: dict[str, Any]
    #: the channels go through the pool server's relay (not to the pod addresses)
    relayed: bool = False

    def from_actors(self) -> dict[str, Any]:
        return {"actors": self.handles, "sizes": [h.num_envs for h in self.handles],
                "lease": self.lease, "actor_replacer": self.replacer, "runtime": NoRay(),
                **self.options}


def lease_pool(
    name: str,
    *,
    url: str,
    token: str | bytes | None = None,
    token_file: str | None = None,
    num_envs: int | None = None,
    lease_timeout_s: float = 60.0,
    wait_s: float = 0.0,
    replace_timeout_s: float = 300.0,
    trainer: str | None = None,
    relay: bool | str = "auto",
    autoreset_mode: str | AutoresetMode | None = None,
    **kwargs: Any,
) -> HttpGrant:
    """Lease envs of pool ``name`` through its lease API at ``url``
    (``RemoteVectorEnv.from_pool(name, url=...)``'s work).

    Args:
        url: the lease API, ``http://<pool>-head-svc:8267`` in-cluster.
        token, token_file: its bearer token, or the file holding it (the Secret
            ``<pool>-lease-token``, key ``token``).
        num_envs: envs to lease (whole actors: a sum of their sizes); None: all free.
        lease_timeout_s: the lease ends this long after the last heartbeat.
        wait_s: the server waits up to this long for enough free envs; 0 answers at once.
        replace_timeout_s: how long a step waits for a failed actor's replacement.
        trainer: a name for this trainer in the pool's ``/status`` (default host:pid).
        relay: open the actor channels through the pool server (one hop, on the lease
            API's port: a trainer outside the cluster needs one port-forward) rather
            than to the actors' pod addresses; "auto" (default): when the first actor's
            pod address does not accept within :data:`RELAY_PROBE_S`.
        autoreset_mode: the gymnasium ``AutoresetMode`` (or its value) the leased actors
            serve this lease in, as for a Ray lease; None: the pool spec's.
        **kwargs: :class:`RemoteVectorEnv` options, as for a Ray lease.

    Raises:
        LeaseApiError: the API refused (``retryable``: too few free envs, with
            ``free_envs``/``asked_envs``, or the pool not ready); 401 a wrong token.
        ValueError: ``autoreset_mode`` is not a mode (before any lease), or the pool's
            lease API or actors predate per-lease modes and serve only the spec's.
    """
    attach_options.check_kwargs(kwargs, lease_timeout_s)
    for key in ("address", "namespace", "reclaim"):
        if key in kwargs:
            raise TypeError(f"from_pool(url=...) does not take {key!r}: it leases over HTTP, "
                            "without Ray")
    if not (relay is True or relay is False or relay == "auto"):
        raise ValueError(f"relay must be True, False or 'auto', got {relay!r}")
    # before a lease is taken: a typo costs nobody's envs
    asked = (None if autoreset_mode is None
             else attach_options.autoreset_mode(name, autoreset_mode).value)
    api = LeaseApi(url, read_token(token, token_file))
    who = trainer or f"{socket.gethostname()}:{os.getpid()}"
    body = {"num_envs": num_envs, "trainer": who, "ttl_s": lease_timeout_s, "wait_s": wait_s,
            # ours: a retry of a request whose answer was lost is the same lease
            "lease_id": os.urandom(16).hex(), "protocol": protocol.VERSION}
    if asked is not None:
        body["autoreset_mode"] = asked
    answer = api.post("lease", body, wait_s + HTTP_SLACK_S)
    lease = HttpLease(api, answer, who, lease_timeout_s)
    try:
        mode = granted_mode(name, api.url, asked, answer)
        options = attach_options.pool_options(name, answer["spec"], kwargs, mode=mode)
        relayed = choose_relay(relay, [str(a["address"]) for a in answer["actors"]])
        if relayed and relay == "auto":
            log.info("lease %s: the actors' pod addresses do not accept from here: "
                     "through the pool server's relay at %s", lease.lease_id[:8], api.url)
        route = Route(api, lease.lease_id) if relayed else None
        handles = [TcpActor(a, lease.epoch, route) for a in answer["actors"]]
        lease.actors.update((h.slot, h) for h in handles)
        first_env = {h.slot: int(a["env_ids"][0]) for h, a in zip(handles, answer["actors"],
                                                                  strict=True)}
        return HttpGrant(handles, lease,
                         HttpReplacer(api, lease, first_env, replace_timeout_s, route, mode),
                         options, relayed)
    except BaseException:
        lease.release()
        raise


def granted_mode(name: str, url: str, asked: str | None, answer: dict[str, Any]) -> str | None:
    """The autoreset mode the lease is served in (None: the spec's, nothing asked).

    A lease API before per-lease modes ignores ``autoreset_mode`` and names none in its
    answer: its actors serve the spec's mode only, which is fine when that was asked.

    Raises:
        ValueError: the pool granted another mode than ``asked``.
    """
    if asked is None:
        return None
    served = answer.get("autoreset_mode")
    if served == asked:
        return asked
    spec_mode = spec_mod.parse_manifest(answer["spec"]).autoreset_mode
    if served is None and spec_mode == asked:
        return asked
    raise ValueError(
        f"pool {name!r} cannot serve autoreset_mode={asked!r} over HTTP: its lease API at "
        f"{url} " + ("predates per-lease autoreset modes (its answer names no "
                     "autoreset_mode)" if served is None else f"granted {served!r}")
        + f" and serves the spec's {spec_mode!r} only; ask for {spec_mode!r} (or leave "
        "autoreset_mode out), or update the pool")
