"""The driver's actors: their records, creating them, and how calls reach them.

A :class:`Host` is one ``SubEnvHost`` actor and the env ids it holds. Calls reach
it over its Unix-socket channel (``transport="auto"``, actors on the driver's
node; see :mod:`remote_env.wire.channel`) or as Ray calls. A :class:`Call` is one call
in flight; one sent to a host whose replacement is not up yet waits under a
:class:`Deferred` key and is sent when it is (see :mod:`remote_env.driver.faults`).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from remote_env import errors, restarts
from remote_env._types import FailureReason
from remote_env.actor.host import EnvFn, SubEnvHost
from remote_env.wire import channel, shared_arrays


@dataclasses.dataclass
class Host:
    """One actor and the global env ids it holds, in its slot order."""

    handle: Any
    env_ids: np.ndarray
    owned: bool
    # start() of a replacement actor, not yet checked
    start_ref: Any = None
    # consecutive losses of this host's actor (see FaultHandling._crash_loop)
    streak: restarts.Streak = dataclasses.field(default_factory=restarts.Streak)
    lo: int = -1  # env_ids == range(lo, hi) when contiguous, else lo == -1
    hi: int = -1
    # the Unix-socket data path to this actor (same node as the driver), once opened
    channel: channel.Channel | None = None
    channel_tried: bool = False
    # the channel's shared arrays (transport="auto", spaces that batch into arrays)
    shared: shared_arrays.SharedArrays | None = None
    # bumped when the actor is lost: calls of an older generation are stale
    generation: int = 0
    # being replaced: in backoff until retry_at, or an actor_replacer call running
    retry_at: float | None = None
    reason: FailureReason = "actor_died"
    replacing: concurrent.futures.Future[Any] | None = None
    # the replacement failed for good: calls to these envs fail at once
    broken: errors.SubEnvironmentError | None = None

    def __post_init__(self) -> None:
        ids = self.env_ids
        if len(ids) and np.array_equal(ids, np.arange(ids[0], ids[0] + len(ids))):
            self.lo, self.hi = int(ids[0]), int(ids[0]) + len(ids)

    @property
    def up(self) -> bool:
        """An actor to send to exists (it may still be starting)."""
        return self.retry_at is None and self.replacing is None and self.broken is None


@dataclasses.dataclass
class FollowUp:
    """SAME_STEP: the failed step whose result waits for the replacement's reset."""

    error: str
    last_obs: list[Any]


@dataclasses.dataclass
class Call:
    """A host call in flight (or deferred until its host is replaced)."""

    host: int
    env_ids: np.ndarray
    positions: list[int]
    is_reset: bool
    sent: float
    generation: int
    method: str
    args: tuple[Any, ...]
    # sent to a replacement actor still starting: its env constructors may take long
    starting: bool = False
    follow_up: FollowUp | None = None
    error: BaseException | None = None


class Deferred:
    """The key of a call waiting for its host's replacement (stands in for a ref)."""

    __slots__ = ()


class NotOurs:
    """The make-env callable of envs in actors from :meth:`RemoteVectorEnv.from_actors`."""

    def __call__(self) -> Any:
        raise RuntimeError("this env lives in an actor given to RemoteVectorEnv.from_actors; "
                           "it is rebuilt by that actor's owner (actor_replacer), not here")


class ReturnHandle:
    """A make-env callable returning an existing env actor (picklable)."""

    def __init__(self, handle: Any) -> None:
        self.handle = handle

    def __call__(self) -> Any:
        return self.handle


_HOST_CLS: Any = None


def remote_host() -> Any:
    global _HOST_CLS
    if _HOST_CLS is None:
        import ray

        _HOST_CLS = ray.remote(SubEnvHost)
    return _HOST_CLS


def describe_existing(handle: Any) -> dict[str, Any] | None:
    """A host's description (started if needed), or None for a plain env actor."""
    import ray

    if not hasattr(handle, "describe"):
        if hasattr(handle, "step") and hasattr(handle, "reset"):
            return None
        raise TypeError(
            f"existing_actors must be SubEnvHost actors (RemoteVectorEnv.host_class()) or env "
            f"actors with reset/step methods, got {handle!r}"
        )
    desc = ray.get(handle.describe.remote())
    if desc is None:
        info = ray.get(handle.start.remote())
        bad = [f for f in info.get("failures", []) if f.permanent]
        if bad:
            raise errors.SubEnvironmentError(bad[0].index, bad[0].message, bad[0].traceback)
        desc = ray.get(handle.describe.remote())
    return dict(desc)


class ActorSet:
    """Mixin of :class:`~remote_env.driver.vector.RemoteVectorEnv`: creating hosts, reaching them."""

    num_envs: int
    env_fns: list[EnvFn]
    envs_per_actor: int
    autoreset_mode: Any
    restart_failed: bool
    max_restarts: int
    restart_backoff_s: float
    start_timeout_s: float | None
    close_timeout_s: float | None
    metrics: Any
    transport: str
    spin_us: float
    _ray: Any
    _node_id: str | None
    _threads: int
    _actor_options: dict[str, Any]
    _on_created: Callable[[Any, int], None] | None
    _hosts: list[Host]
    _env_host: np.ndarray
    _env_pos: np.ndarray
    _seeds: list[int | None]
    _restarts: np.ndarray
    _failed: np.ndarray
    #: Lease epoch sent with every hot call (envs leased from a pool, see
    #: remote_env.pool.attach); the actors refuse older ones. None: not fenced.
    _lease_epoch: int | None = None

    def _error(self, host: Host, f: Any) -> errors.SubEnvironmentError:
        e = int(host.env_ids[f.index])
        cls = errors.SubEnvironmentFailedError if self.restart_failed else errors.SubEnvironmentError
        return cls(e, f"{f.reason}: {f.message}", f.traceback)

    def _new_host(self, env_ids: Sequence[int], *, after_failure: bool) -> Any:
        kwargs: dict[str, Any] = {
            "autoreset_mode": self.autoreset_mode.value,
            "restart_failed": self.restart_failed,
            "max_restarts": self.max_restarts,
            "restart_backoff_s": self.restart_backoff_s,
            "threads": self._threads,
        }
        if after_failure:
            kwargs["restart_seeds"] = [self._seeds[i] for i in env_ids]
            kwargs["restarts"] = [int(self._restarts[i]) for i in env_ids]
        options = {"max_concurrency": 1, **self._actor_options}
        return remote_host().options(**options).remote(
            [self.env_fns[i] for i in env_ids], **kwargs
        )

    def _create_hosts(self, existing: list[Any]) -> list[dict[str, Any]]:
        """Create (or adopt) every host; return each one's start() description."""
        next_id = 0
        starts: list[tuple[int, Any]] = []
        for handle in existing:
            if next_id >= self.num_envs:
                raise ValueError(
                    f"existing_actors hold more envs than num_envs={self.num_envs} (len(env_fns))"
                )
            desc = describe_existing(handle)
            if desc is None:  # an env actor, not a host: host it as one sub-env
                self.env_fns[next_id] = ReturnHandle(handle)
                host_handle = self._new_host([next_id], after_failure=False)
                self._add_host(host_handle, [next_id], owned=True)
                starts.append((len(self._hosts) - 1, host_handle.start.remote()))
                next_id += 1
                continue
            k = int(desc["num_envs"])
            env_ids = list(range(next_id, min(next_id + k, self.num_envs)))
            if len(env_ids) < k:
                raise ValueError(
                    f"existing actor {len(self._hosts)} hosts {k} envs but only "
                    f"{len(env_ids)} of num_envs={self.num_envs} are left"
                )
            self._add_host(handle, env_ids, owned=False)
            starts.append((len(self._hosts) - 1, None))
            next_id += len(env_ids)
        while next_id < self.num_envs:
            env_ids = list(range(next_id, min(next_id + self.envs_per_actor, self.num_envs)))
            handle = self._new_host(env_ids, after_failure=False)
            self._add_host(handle, env_ids, owned=True)
            starts.append((len(self._hosts) - 1, handle.start.remote()))
            next_id += len(env_ids)

        infos = []
        for h, ref in starts:
            host = self._hosts[h]
            info = (
                self._ray.get(ref)
                if ref is not None
                else {**self._ray.get(host.handle.describe.remote()), "failures": []}
            )
            self._raise_start_failures(host, info)
            infos.append(info)
            self._created(host)
        return infos

    def _env_spaces(self, infos: list[dict[str, Any]]) -> tuple[list[Any], list[Any]]:
        """Every env's (observation, action) space, from its host's start() report."""
        obs: list[Any] = []
        act: list[Any] = []
        for host, info in zip(self._hosts, infos, strict=True):
            other = info.get("other_spaces", {})
            for pos in range(len(host.env_ids)):
                o, a = other.get(pos, (info["observation_space"], info["action_space"]))
                obs.append(o)
                act.append(a)
        return obs, act

    def _add_host(self, handle: Any, env_ids: list[int], *, owned: bool) -> None:
        h = len(self._hosts)
        self._hosts.append(Host(handle, np.asarray(env_ids, dtype=np.int64), owned))
        for pos, e in enumerate(env_ids):
            self._env_host[e] = h
            self._env_pos[e] = pos

    def _raise_start_failures(self, host: Host, info: Mapping[str, Any]) -> None:
        for f in info.get("failures", []):
            self.metrics.failures[f.reason].inc()
            if f.permanent:
                self._failed[host.env_ids[f.index]] = True
                raise self._error(host, f)

    def _created(self, host: Host) -> None:
        if self._on_created is not None:
            for e in host.env_ids:
                self._on_created(host.handle, int(e))

    def _kill_owned(self) -> None:
        for h in self._hosts:
            if h.owned:
                try:
                    self._ray.kill(h.handle, no_restart=True)
                except Exception:  # already dead
                    pass

    # -------------------------------------------------------------- transport
    def _host_call(self, host: Host, method: str, *args: Any) -> Any:
        """Call a host method over its channel if it has one, else through Ray.

        ``call``/``set_attr`` take the same path as steps, so they run after them.
        """
        chan = self._channel(host)
        epoch = self._lease_epoch
        if chan is not None:
            decode = None
            if host.shared is not None and method == "step":
                positions, acts = args
                if shared_arrays.write_actions(host.shared, positions, acts):
                    acts = None
                method, args = "shared_step", (positions, acts)
                decode = functools.partial(shared_arrays.read_batch, host.shared)
            message = (method, *args) if epoch is None else ("fenced", epoch, method, *args)
            return chan.call(message, decode)
        if epoch is not None:
            return host.handle.fenced.remote(epoch, method, *args)
        return getattr(host.handle, method).remote(*args)

    def _channel(self, host: Host) -> channel.Channel | None:
        """The host's socket channel, opened on first use; None: use Ray calls."""
        if self._node_id is None or host.start_ref is not None or not host.up:
            return None  # Ray only, or a replacement whose start() is not checked yet
        if host.channel is None and not host.channel_tried:
            host.channel_tried = True
            try:
                where = self._ray.get(host.handle.open_channel.remote(self._node_id),
                                      timeout=self.start_timeout_s)
                if where is not None:
                    host.channel = channel.Channel(*where)
            except Exception:  # a dead actor surfaces through the Ray call instead
                host.channel = None
            if host.channel is not None and self.transport == "auto":
                host.shared = self._open_shared(host.channel)
        if host.channel is not None and host.channel.closed:
            return None
        return host.channel

    def _open_shared(self, chan: channel.Channel) -> shared_arrays.SharedArrays | None:
        """Shared arrays with the host at the channel's other end; None: keep pickling.

        This side names the segment and unlinks the name once both ends mapped it,
        so no process death can leave it in /dev/shm.
        """
        name = shared_arrays.new_name()
        try:
            where = channel.get(chan.call(("open_shared", name, self.spin_us / 1e6)), self._ray)
            return None if where is None else shared_arrays.SharedArrays(name, *where,
                                                                         create=False)
        except Exception:  # an older host, or it died: the socket path still works
            return None
        finally:
            shared_arrays.unlink(name)

    def _drop_channel(self, host: Host) -> None:
        if host.channel is not None:
            host.channel.close()
        if host.shared is not None:
            host.shared.close()
        host.channel, host.channel_tried, host.shared = None, False, None

    def _get(self, ref: Any) -> Any:
        return channel.get(ref, self._ray)

