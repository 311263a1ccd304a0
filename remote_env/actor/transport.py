"""How calls reach the actor besides Ray: its channel, lease fences, shared arrays.

A driver on the actor's node steps it over a Unix socket (:mod:`remote_env.wire.channel`)
and, when the spaces batch into plain arrays, through shared memory
(:mod:`remote_env.wire.shared_arrays`): ``shared_step`` reads actions from and writes
results into the connection's arrays and replies with only what is not an array.
Pool trainers wrap hot calls in ``fenced(epoch, ...)`` so a lapsed lease cannot step
envs another trainer now holds.

``shared_step`` of sync envs takes a lean loop (:func:`_step_lean`): per env just
``env.step`` and the checks a good result passes at a glance, the rest handed to
the generic per-env code of :mod:`remote_env.actor.steps`. Channel calls reach the
methods as written, past the tracing wrappers Ray puts on every actor method.
"""

from __future__ import annotations

import functools
import inspect
import threading
from collections.abc import Callable, Coroutine, Sequence
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from remote_env import errors
from remote_env._types import Batch, Failure
from remote_env.actor.steps import FLAGS, SCALARS, failed_step, run_sync, step_one, stepped
from remote_env.wire import shared_arrays

if TYPE_CHECKING:
    from remote_env.actor.host import SubEnvHost
    from remote_env.actor.threads import Gang

# what a driver may call over a channel (the hot calls; lifecycle stays with Ray)
FENCED_METHODS = frozenset({"step", "reset", "call", "set_attr", "shared_step", "is_wrapped"})
CHANNEL_METHODS = FENCED_METHODS | {"fenced", "open_shared"}


class HostTransport:
    """Mixin of :class:`~remote_env.actor.host.SubEnvHost`: its channel and shared arrays."""

    _lock: threading.RLock
    _channel: Any
    _fence: int
    _info: dict[str, Any] | None
    _multi_agent: bool
    _async: bool
    _pool: Gang | None
    _obs_shape: tuple[int, ...] | None
    _slots: list[Any]
    # per connection (each is served on its own thread): that driver's shared arrays
    _conn: threading.local

    _map: Callable[[Callable[[int, Any], Coroutine[Any, Any, Any]], Sequence[int],
                    Sequence[Any]], list[Any]]
    _pack: Callable[..., Batch]

    def open_channel(self, driver_node_id: str) -> tuple[str, bytes] | None:
        """A Unix-socket channel for step/reset if the driver is on this node, else None.

        See :mod:`remote_env.wire.channel` for why; one channel serves many drivers.
        """
        try:
            import ray

            if ray.get_runtime_context().get_node_id() != driver_node_id:
                return None
        except Exception:  # not in a Ray actor (unit tests): no node to compare
            return None
        if self._channel is None:
            from remote_env.wire.channel import ChannelServer

            serve = functools.partial(_unwrapped(type(self))["_serve_channel"], self)
            self._channel = ChannelServer(serve, on_disconnect=self._release_shared)
        return self._channel.address, self._channel.authkey

    def _serve_channel(self, message: tuple[Any, ...]) -> Any:
        name, *args = message
        method = _unwrapped(type(self)).get(name) if name in CHANNEL_METHODS else None
        if method is None:
            raise ValueError(f"unknown channel call {name!r}; expected one of {sorted(CHANNEL_METHODS)}")
        return method(self, *args)

    def fence(self, epoch: int) -> int:
        """Refuse calls of leases older than ``epoch`` from now on (the pool's registry
        calls it when it grants a lease); returns the fence."""
        with self._lock:
            self._fence = max(self._fence, int(epoch))
            return self._fence

    def fenced(self, epoch: int, method: str, *args: Any) -> Any:
        """``method(*args)`` for the holder of lease ``epoch`` (pool trainers call this).

        Raises:
            LeaseLostError: a newer lease was granted on this actor.
        """
        if method not in FENCED_METHODS:
            raise ValueError(f"unknown fenced call {method!r}; expected one of "
                             f"{sorted(FENCED_METHODS)}")
        with self._lock:  # the check and the call are one step for other callers
            if epoch < self._fence:
                raise errors.LeaseLostError(
                    f"this actor's envs were leased to another trainer (lease epoch "
                    f"{self._fence} > this call's {epoch}): the lease expired; attach again")
            self._fence = epoch
            return _unwrapped(type(self))[method](self, *args)

    # ------------------------------------------------------------ shared arrays
    def open_shared(self, name: str, spin_s: float = 0.0) -> tuple[shared_arrays.Layout, int] | None:
        """Create segment ``name`` for this connection's driver; None: not for these envs.

        Only over a channel (its thread is the connection): the driver maps the
        segment, unlinks its name, then calls :meth:`shared_step`. ``spin_s``: how long
        this connection looks for the driver's next call before sleeping
        (:meth:`~remote_env.wire.channel.ChannelServer.spin`).
        """
        if self._channel is not None:
            self._channel.spin(spin_s)
        info = self._info
        if info is None or self._multi_agent or info["other_spaces"]:
            return None  # per-env shapes differ, or results are dicts: keep pickling
        where = shared_arrays.layout(info["observation_space"], info["action_space"],
                                     len(self._slots))
        if where is None:
            return None
        self._release_shared()
        self._conn.arrays = shared_arrays.SharedArrays(name, *where, create=True)
        self._conn.unlinked = False
        return where

    def shared_step(self, positions: Sequence[int], actions: Any = None) -> Batch:
        """:meth:`step` through the shared arrays: actions read from them unless given,
        results written into them; the reply holds only infos (if any) and failures."""
        arrays = getattr(self._conn, "arrays", None)
        if arrays is None:
            raise RuntimeError("shared_step before open_shared on this connection")
        if not self._conn.unlinked:  # the driver has mapped it: no name may outlive us
            shared_arrays.unlink(arrays.name)
            self._conn.unlinked = True
        with self._lock:
            if actions is None:
                actions = arrays.actions[shared_arrays.rows(positions)].copy()
            if not (self._async or self._multi_agent or self._pool is not None):
                return _step_lean(cast("SubEnvHost", self), arrays, positions, actions)
            slots, host = self._slots, cast("SubEnvHost", self)
            results = self._map(lambda p, a: step_one(host, slots[p], a), positions, actions)
            return self._write_shared(arrays, positions, results)

    def _write_shared(self, arrays: shared_arrays.SharedArrays, positions: Sequence[int],
                      results: list[Any]) -> Batch:
        """Write the generic code's results (async envs, threads, ...) into the arrays."""
        if any(r[0] is None for r in results):  # out of restarts before any observation
            return self._pack(positions, results, is_reset=False)
        obs = arrays.obs
        for p, r in zip(positions, results, strict=True):
            obs[p] = r[0]
        idx = shared_arrays.rows(positions)
        arrays.rewards[idx] = [r[1] for r in results]
        arrays.terminations[idx] = [bool(r[2]) for r in results]
        arrays.truncations[idx] = [bool(r[3]) for r in results]
        infos = [r[4] for r in results]
        return Batch(list(positions), None, None, None, None,
                     infos if any(infos) else [],  # all empty: nothing to ship
                     [r[5] for r in results if r[5] is not None], False)

    def _release_shared(self) -> None:
        """Drop this connection's arrays (its driver is gone or opened new ones)."""
        arrays = getattr(self._conn, "arrays", None)
        if arrays is not None:
            self._conn.arrays = None
            shared_arrays.unlink(arrays.name)  # a driver that died before mapping it
            arrays.close()


def _step_lean(host: SubEnvHost, arrays: shared_arrays.SharedArrays,
               positions: Sequence[int], actions: Any) -> Batch:
    """:meth:`HostTransport.shared_step` of sync envs, one after the other, each result written
    as it comes.

    Why: with cheap envs the generic per-env code (a coroutine, ``run_sync``,
    ``check_step``, then loops over the results) cost more than the envs. Here a
    good step is ``env.step`` and a few ``isinstance``; anything else (a reset
    due, a crash loop, an exception, an episode's end, a result the cheap checks
    do not take) goes to that generic code (:mod:`remote_env.actor.steps`), so
    what envs see and return is the same either way. A module function, as the
    others on the channel's path: Ray wraps every method of an actor class.
    """
    slots, shape = host._slots, host._obs_shape
    results: list[Any] = []  # (obs, reward, terminated, truncated, info) per env
    failures: list[Failure] = []
    missing = False  # an env out of restarts before its first observation
    for p, action in zip(positions, actions, strict=True):
        slot = slots[p]
        if slot.needs_reset or slot.streak.failures:
            r = run_sync(step_one(host, slot, action))
        else:
            try:
                result = slot.env.step(action)
                obs, rew, term, trunc, info = result
            except Exception as exc:
                r = run_sync(failed_step(host, slot, exc))
            else:
                # exactly what check_step takes without looking further (an
                # ndarray of the space's shape: a scalar would broadcast into a row)
                if (type(result) is tuple and type(obs) is np.ndarray and obs.shape == shape
                        and (type(rew) is float or isinstance(rew, SCALARS))
                        and (term is False or isinstance(term, FLAGS))
                        and (trunc is False or isinstance(trunc, FLAGS))
                        and type(info) is dict and not (term or trunc)):
                    slot.last_obs = obs
                    results.append(result)
                    continue
                r = run_sync(stepped(host, slot, obs, rew, term, trunc, info))
        obs, rew, term, trunc, info, failure = r
        if failure is not None:
            failures.append(failure)
        if obs is None:
            missing = True
        results.append((obs, rew, bool(term), bool(trunc), info))
    if missing:  # no row to write: send them all packed, as the generic code does
        by_index = {f.index: f for f in failures}
        return host._pack(positions, [(*r, by_index.get(slots[p].index))
                                      for p, r in zip(positions, results, strict=True)],
                          is_reset=False)
    if not results:
        return Batch([], None, None, None, None, [], failures, False)
    observations, rewards, terms, truncs, infos = zip(*results, strict=True)  # columns, in C
    idx = shared_arrays.rows(positions)
    # all rows at once: a row at a time cost ~0.2 us an env more (each passed
    # check_obs: the space's shape, as the rows)
    arrays.obs[idx] = observations
    arrays.rewards[idx] = rewards
    arrays.terminations[idx] = terms
    arrays.truncations[idx] = truncs
    return Batch(list(positions), None, None, None, None,
                 list(infos) if any(infos) else [],  # all empty: nothing to ship
                 failures, False)


_UNWRAPPED: dict[type, dict[str, Callable[..., Any]]] = {}


def _unwrapped(cls: type) -> dict[str, Callable[..., Any]]:
    """The channel's methods of ``cls`` as written, without Ray's wrappers.

    Ray's actor class wraps every method for tracing (``_resume_span``, even with
    tracing off): on the channel's path those wrappers cost a fifth of the actor's
    CPU per call with cheap envs. Channel calls go through these functions instead.
    """
    methods = _UNWRAPPED.get(cls)
    if methods is None:
        methods = _UNWRAPPED[cls] = {name: inspect.unwrap(getattr(cls, name))
                                     for name in (*CHANNEL_METHODS, "_serve_channel")}
    return methods
