"""``RemoteVectorEnv``: a gymnasium ``VectorEnv`` whose sub-envs live in Ray actors.

The driver side. Each actor is a :class:`~remote_env.host.SubEnvHost` holding
``envs_per_actor`` sub-envs; one Ray call steps all of them, autoreset happens in
the actor, and the driver only splits actions, merges results and supervises:

* ``step``/``step_async``/``step_wait`` step every env (gymnasium semantics, same
  results as ``SyncVectorEnv`` for the same seeds and actions);
* ``send(actions, env_ids)``/``recv()`` step a subset and return whichever envs are
  ready within ``batch_wait_ms`` (EnvPool-style dynamic batching; ids in
  ``info["env_id"]``);
* a sub-env that raises is restarted inside its actor (siblings keep their state);
  an actor that dies or hangs is replaced and its envs restarted.
"""

from __future__ import annotations

import dataclasses
import enum
import multiprocessing
import os
import time
from collections.abc import Callable, Mapping, Sequence
from copy import deepcopy
from typing import Any, TypeVar

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space, concatenate, create_empty_array, iterate

from remote_env import channel, errors, restarts
from remote_env._types import Batch, Failure, FailureReason
from remote_env.host import EnvFn, SubEnvHost
from remote_env.metrics import PoolMetrics

# Array action spaces are split by slicing the batched array (no per-env Python loop).
_ARRAY_SPACES = (gym.spaces.Box, gym.spaces.Discrete, gym.spaces.MultiDiscrete, gym.spaces.MultiBinary)
DEFAULT_BATCH_WAIT_MS = 2.0
TRANSPORTS = ("auto", "ray")
_E = TypeVar("_E", bound="RemoteVectorEnv")


class _State(enum.Enum):
    DEFAULT = "default"
    WAITING_STEP = "step"


class _InfoMerger:
    """Lets gymnasium's own ``VectorEnv._add_info`` build infos for a partial batch."""

    _add_info: Any = VectorEnv._add_info

    def __init__(self, num_envs: int) -> None:
        self.num_envs = num_envs


@dataclasses.dataclass
class _Host:
    """One actor and the global env ids it holds, in its slot order."""

    handle: Any
    env_ids: np.ndarray
    owned: bool
    # start() of a replacement actor, not yet checked
    start_ref: Any = None
    actor_failures: int = 0
    lo: int = -1  # env_ids == range(lo, hi) when contiguous, else lo == -1
    hi: int = -1
    # the Unix-socket data path to this actor (same node as the driver), once opened
    channel: channel.Channel | None = None
    channel_tried: bool = False

    def __post_init__(self) -> None:
        ids = self.env_ids
        if len(ids) and np.array_equal(ids, np.arange(ids[0], ids[0] + len(ids))):
            self.lo, self.hi = int(ids[0]), int(ids[0]) + len(ids)


@dataclasses.dataclass
class _Call:
    """A host call in flight."""

    host: int
    env_ids: np.ndarray
    positions: list[int]
    is_reset: bool
    sent: float
    handle: Any
    # sent to a replacement actor still starting: its env constructors may take long
    starting: bool = False


class RemoteVectorEnv(VectorEnv[Any, Any, Any]):
    """Vector env with sub-environments in Ray actors, dynamic batching and restarts.

    Args:
        env_fns: one make-env callable per sub-env, exactly as for
            ``gymnasium.vector.AsyncVectorEnv``. A callable may return a gymnasium
            env, a PettingZoo ``ParallelEnv`` / RLlib-style multi-agent env, or a Ray
            actor handle of an env (stepped through Ray from the host actor).
        envs_per_actor: sub-envs hosted by one actor; one Ray call steps them all.
            None (default): ``ceil(num_envs / CPUs of the Ray cluster)``, about one actor
            per core: a Ray call costs ~1-3 ms, so few, large calls win for cheap envs.
        batch_wait_ms: how long :meth:`recv` waits for more envs once called.
        autoreset_mode: gymnasium autoreset mode (NEXT_STEP, SAME_STEP, DISABLED).
        copy: return copies of observations (as ``SyncVectorEnv`` does).
        restart_failed_sub_environments: restart a sub-env that raises, or whose
            actor dies or hangs, instead of raising.
        max_restarts: consecutive failed restarts allowed per sub-env (and per actor).
        restart_backoff_s: first restart backoff; doubles per consecutive failure.
        step_timeout_s: an actor that does not answer a call within this is killed
            and replaced (hang detection); None waits forever.
        start_timeout_s: extra time a replacement actor gets to start (its env
            constructors may boot a simulator) before its first call counts as hung.
        threads_per_actor: step an actor's sub-envs on this many threads (for envs
            that wait on I/O or release the GIL). Envs with ``async def astep`` and
            ``areset`` need none: they are awaited together on one event loop per
            actor (``async_steps`` says whether they were).
        transport: how step/reset reach the actors. ``"auto"`` (default): over a
            Unix socket for actors on the driver's node (~0.2 ms a round trip instead
            of a Ray call's ~1-2 ms), Ray calls for actors on other nodes. ``"ray"``:
            Ray calls only. Either way Ray creates, supervises and kills the actors.
        existing_actors: ``SubEnvHost`` actors (from :meth:`host_class`) or env
            actors to use as-is for the first envs; only the missing ones are created.
            Existing actors are not killed on :meth:`close`.
        on_sub_environment_created: ``fn(actor, env_index)`` called once the actor
            hosting ``env_index`` is up (also after a restart).
        actor_options: Ray actor options (``num_cpus``, ``resources``,
            ``scheduling_strategy``, ...).
        address: Ray address to connect to when Ray is not initialized yet; a local
            Ray is started when neither is given.
        actor_replacer: ``fn(failed_actor, reason) -> actor`` returning a started
            replacement host for the same envs. Used when someone else owns the actors'
            restarts (a pool server); by default this env kills and re-creates them.
        registry: Prometheus registry for the pool's metrics (a private one if None).
        pool: the ``pool`` label of the metrics.

    Example:
        >>> import gymnasium as gym
        >>> envs = RemoteVectorEnv([lambda: gym.make("CartPole-v1")] * 4, envs_per_actor=2)
        >>> obs, info = envs.reset(seed=0)
        >>> obs, rew, term, trunc, info = envs.step(envs.action_space.sample())
        >>> envs.close()
    """

    def __init__(
        self,
        env_fns: Sequence[EnvFn],
        *,
        envs_per_actor: int | None = None,
        batch_wait_ms: float = DEFAULT_BATCH_WAIT_MS,
        autoreset_mode: str | AutoresetMode = AutoresetMode.NEXT_STEP,
        copy: bool = True,
        restart_failed_sub_environments: bool = False,
        max_restarts: int = 10,
        restart_backoff_s: float = 0.0,
        step_timeout_s: float | None = None,
        start_timeout_s: float = 300.0,
        threads_per_actor: int = 1,
        transport: str = "auto",
        existing_actors: Sequence[Any] | None = None,
        on_sub_environment_created: Callable[[Any, int], None] | None = None,
        actor_options: Mapping[str, Any] | None = None,
        address: str | None = None,
        actor_replacer: Callable[[Any, str], Any] | None = None,
        registry: Any = None,
        pool: str = "default",
        metrics: PoolMetrics | None = None,
    ) -> None:
        self.closed = True  # until construction succeeds: __del__ must not close twice
        env_fns = list(env_fns)
        if not env_fns:
            raise ValueError("env_fns must hold at least one make-env callable, got an empty list")
        for i, fn in enumerate(env_fns):
            if not callable(fn):
                raise TypeError(
                    f"env_fns[{i}] must be a callable returning an env (as for AsyncVectorEnv), "
                    f"got {type(fn).__name__}"
                )
        if envs_per_actor is not None:
            _positive_int("envs_per_actor", envs_per_actor)
        _positive_int("threads_per_actor", threads_per_actor)
        if max_restarts < 0:
            raise ValueError(f"max_restarts must be >= 0, got {max_restarts}")
        if batch_wait_ms < 0:
            raise ValueError(f"batch_wait_ms must be >= 0, got {batch_wait_ms}")
        if step_timeout_s is not None and step_timeout_s <= 0:
            raise ValueError(f"step_timeout_s must be > 0 or None, got {step_timeout_s}")
        if restart_backoff_s < 0:
            raise ValueError(f"restart_backoff_s must be >= 0, got {restart_backoff_s}")
        if transport not in TRANSPORTS:
            raise ValueError(
                f"transport must be 'auto' (a Unix socket to actors on this node, Ray calls to "
                f"others) or 'ray' (Ray calls only), got {transport!r}"
            )

        self.num_envs = len(env_fns)
        self.env_fns = env_fns
        self.batch_wait_ms = float(batch_wait_ms)
        self.autoreset_mode = AutoresetMode(autoreset_mode)
        self.copy = copy
        self.restart_failed = restart_failed_sub_environments
        self.max_restarts = max_restarts
        self.restart_backoff_s = restart_backoff_s
        self.step_timeout_s = step_timeout_s
        self.start_timeout_s = start_timeout_s
        self._threads = threads_per_actor
        self._on_created = on_sub_environment_created
        self._actor_options = dict(actor_options or {})
        self._replacer = actor_replacer
        self.metrics = metrics if metrics is not None else PoolMetrics(registry, pool)
        self._ray = _ensure_ray(address)
        self.transport = transport
        self._node_id = (
            self._ray.get_runtime_context().get_node_id() if transport == "auto" else None
        )
        if envs_per_actor is None:
            cpus = max(1, int(self._ray.cluster_resources().get("CPU", 1)))
            envs_per_actor = -(-self.num_envs // cpus)
        self.envs_per_actor: int = envs_per_actor

        self._seeds: list[int | None] = [None] * self.num_envs
        self._restarts = np.zeros(self.num_envs, dtype=np.int64)
        self._failed = np.zeros(self.num_envs, dtype=np.bool_)
        self._busy = np.zeros(self.num_envs, dtype=np.bool_)
        self._calls: dict[Any, _Call] = {}
        self._state = _State.DEFAULT
        self._hosts: list[_Host] = []
        self._env_host = np.zeros(self.num_envs, dtype=np.int64)
        self._env_pos = np.zeros(self.num_envs, dtype=np.int64)
        try:
            info = self._create_hosts(list(existing_actors or []))
        except BaseException:
            self._kill_owned()
            raise

        self.multi_agent = bool(info["multi_agent"])
        # the sub-envs have astep/areset and the actors await them (see host.py)
        self.async_steps = bool(info.get("async_steps", False))
        self.single_observation_space = info["observation_space"]
        self.single_action_space = info["action_space"]
        if self.multi_agent:
            # results are dicts keyed env id -> agent id
            self.observation_space = gym.spaces.Dict(
                {str(i): self.single_observation_space for i in range(self.num_envs)}
            )
            self.action_space = gym.spaces.Dict(
                {str(i): self.single_action_space for i in range(self.num_envs)}
            )
        else:
            self.observation_space = batch_space(self.single_observation_space, self.num_envs)
            self.action_space = batch_space(self.single_action_space, self.num_envs)
        self.metadata = dict(info["metadata"])
        self.metadata["autoreset_mode"] = self.autoreset_mode
        self.render_mode = info["render_mode"]
        self._box_obs = isinstance(self.single_observation_space, gym.spaces.Box)
        self._array_actions = isinstance(self.single_action_space, _ARRAY_SPACES)
        self._env_obs: list[Any] = [None] * self.num_envs
        self._observations: Any = (
            None
            if self.multi_agent
            else create_empty_array(self.single_observation_space, self.num_envs, fn=np.zeros)
        )
        self.metrics.track_states(self._state_counts)
        self.closed = False

    # ------------------------------------------------------------------ set-up
    @staticmethod
    def host_class() -> Any:
        """The Ray actor class hosting sub-envs (for ``existing_actors``)."""
        return _remote_host()

    @classmethod
    def from_actors(cls: type[_E], actors: Sequence[Any], *, sizes: Sequence[int] | None = None,
                    **kwargs: Any) -> _E:
        """A vector env over started host actors someone else owns (a pool's, say).

        No make-env callables are needed: the actors already hold their envs.
        ``sizes`` are their env counts when known (else each is asked); pass an
        ``actor_replacer`` so a failed actor is replaced by its owner, since this env
        cannot rebuild it. Other keywords are :class:`RemoteVectorEnv`'s.
        """
        if sizes is None:
            ray = _ensure_ray(kwargs.get("address"))
            sizes = [int(d["num_envs"]) for d in ray.get([a.describe.remote() for a in actors])]
        return cls([_NotOurs()] * sum(sizes), existing_actors=actors, **kwargs)

    @staticmethod
    def from_pool(name: str, **kwargs: Any) -> RemoteVectorEnv:
        """Attach to the running pool ``name`` (see :func:`remote_env.pool.attach.attach`).

        Example:
            >>> envs = RemoteVectorEnv.from_pool("cartpole", num_envs=16)  # doctest: +SKIP
        """
        from remote_env.pool.attach import attach

        return attach(name, **kwargs)

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
        return _remote_host().options(**options).remote(
            [self.env_fns[i] for i in env_ids], **kwargs
        )

    def _create_hosts(self, existing: list[Any]) -> dict[str, Any]:
        next_id = 0
        starts: list[tuple[int, Any]] = []
        for handle in existing:
            if next_id >= self.num_envs:
                raise ValueError(
                    f"existing_actors hold more envs than num_envs={self.num_envs} (len(env_fns))"
                )
            desc = _describe_existing(handle)
            if desc is None:  # an env actor, not a host: host it as one sub-env
                env_ids = [next_id]
                host_handle = self._new_host_for_env_actor(handle, next_id)
                self._add_host(host_handle, env_ids, owned=True)
                starts.append((len(self._hosts) - 1, host_handle.start.remote()))
            else:
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

        first: dict[str, Any] | None = None
        for h, ref in starts:
            host = self._hosts[h]
            info = (
                self._ray.get(ref)
                if ref is not None
                else {**self._ray.get(host.handle.describe.remote()), "failures": []}
            )
            self._raise_start_failures(host, info)
            if first is None:
                first = info
            elif not info.get("multi_agent") and (
                info["observation_space"] != first["observation_space"]
                or info["action_space"] != first["action_space"]
            ):
                raise RuntimeError(
                    f"sub-environment {int(host.env_ids[0])} has observation space "
                    f"{info['observation_space']} and action space {info['action_space']}; "
                    f"expected those of sub-environment 0: {first['observation_space']}, "
                    f"{first['action_space']}"
                )
            self._created(host)
        assert first is not None
        return first

    def _new_host_for_env_actor(self, handle: Any, env_id: int) -> Any:
        self.env_fns[env_id] = _ReturnHandle(handle)
        return self._new_host([env_id], after_failure=False)

    def _add_host(self, handle: Any, env_ids: list[int], *, owned: bool) -> None:
        h = len(self._hosts)
        self._hosts.append(_Host(handle, np.asarray(env_ids, dtype=np.int64), owned))
        for pos, e in enumerate(env_ids):
            self._env_host[e] = h
            self._env_pos[e] = pos

    def _raise_start_failures(self, host: _Host, info: Mapping[str, Any]) -> None:
        for f in info.get("failures", []):
            self.metrics.failures[f.reason].inc()
            if f.permanent:
                self._failed[host.env_ids[f.index]] = True
                raise self._error(host, f)

    def _created(self, host: _Host) -> None:
        if self._on_created is not None:
            for e in host.env_ids:
                self._on_created(host.handle, int(e))

    # ----------------------------------------------------------------- reset
    def reset(
        self,
        *,
        seed: int | Sequence[int | None] | None = None,
        options: dict[str, Any] | None = None,
    ) -> tuple[Any, dict[str, Any]]:
        """Reset all sub-envs (or those in ``options["reset_mask"]``), like ``SyncVectorEnv``."""
        self._check_open()
        if self._calls:
            raise errors.AlreadyPendingCallError(
                "reset() called while calls are in flight; finish them with step_wait() or recv()",
                "reset",
            )
        seeds = self._seed_list(seed)
        options = dict(options) if options is not None else None
        mask = np.ones(self.num_envs, dtype=np.bool_)
        if options is not None and "reset_mask" in options:
            mask = _check_reset_mask(options.pop("reset_mask"), self.num_envs)
        env_ids = np.flatnonzero(mask)
        self._submit(env_ids, [seeds[i] for i in env_ids], options, is_reset=True)
        batches = self._collect(list(self._calls), timeout=None)
        obs, _, _, _, infos = self._assemble_full(batches, env_ids)
        return obs, infos

    def async_reset(
        self, *, seed: int | Sequence[int | None] | None = None, options: dict[str, Any] | None = None
    ) -> None:
        """Send a reset to every sub-env; :meth:`recv` returns them as they come (EnvPool style)."""
        self._check_open()
        if self._calls:
            raise errors.AlreadyPendingCallError(
                "async_reset() called while calls are in flight", "reset"
            )
        seeds = self._seed_list(seed)
        ids = np.arange(self.num_envs)
        self._submit(ids, seeds, dict(options) if options else None, is_reset=True)

    def _seed_list(self, seed: int | Sequence[int | None] | None) -> list[int | None]:
        if seed is None:
            return [None] * self.num_envs
        if isinstance(seed, (int, np.integer)):
            return [int(seed) + i for i in range(self.num_envs)]
        seeds = list(seed)
        if len(seeds) != self.num_envs:
            raise ValueError(
                f"If seeds are passed as a list the length must match num_envs={self.num_envs} "
                f"but got length={len(seeds)}."
            )
        return seeds

    # ------------------------------------------------------------------ step
    def step(self, actions: Any) -> tuple[Any, Any, Any, Any, dict[str, Any]]:
        """Step every sub-env with ``actions`` (batched as ``action_space``)."""
        self.step_async(actions)
        return self.step_wait()

    def step_async(self, actions: Any) -> None:
        """Send ``actions`` to every sub-env; collect with :meth:`step_wait`."""
        self._check_open()
        if self._calls:
            raise errors.AlreadyPendingCallError(
                "Calling `step_async` while waiting for a pending call to "
                f"`{self._pending_name()}` to complete",
                self._pending_name(),
            )
        ids = np.arange(self.num_envs)
        self._submit(ids, self._split_actions(actions, self.num_envs), None, is_reset=False)
        self._state = _State.WAITING_STEP

    def step_wait(self, timeout: float | None = None) -> tuple[Any, Any, Any, Any, dict[str, Any]]:
        """Wait for the step sent by :meth:`step_async`.

        Raises:
            multiprocessing.TimeoutError: not all envs answered within ``timeout``
                seconds (the call stays pending; call ``step_wait`` again).
        """
        self._check_open()
        if self._state is not _State.WAITING_STEP:
            raise errors.NoAsyncCallError(
                "Calling `step_wait` without any prior call to `step_async`.", "step"
            )
        t0 = time.perf_counter()
        try:
            batches = self._collect(list(self._calls), timeout=timeout)
        except multiprocessing.TimeoutError:
            raise  # still pending
        except BaseException:
            self._state = _State.DEFAULT
            raise
        self._state = _State.DEFAULT
        result = self._assemble_full(batches, np.arange(self.num_envs))
        self.metrics.observe_poll(self.num_envs, time.perf_counter() - t0)
        self.metrics.steps.inc(self.num_envs)
        return result

    # ----------------------------------------------- dynamic batching (EnvPool)
    def send(self, actions: Any, env_ids: Sequence[int] | np.ndarray | None = None) -> None:
        """Step the sub-envs ``env_ids`` (all when None) with ``actions``, without waiting.

        ``actions`` holds one action per id, in the order of ``env_ids``.
        """
        self._check_open()
        if self._state is _State.WAITING_STEP:
            raise errors.AlreadyPendingCallError(
                "send() called while a step_async() is pending; call step_wait() first", "step"
            )
        ids = self._check_env_ids(env_ids)
        busy = ids[self._busy[ids]]
        if len(busy):
            raise errors.AlreadyPendingCallError(
                f"env ids {busy.tolist()} already have a call in flight; recv() their results "
                "before sending them again",
                "step",
            )
        self._submit(ids, self._split_actions(actions, len(ids)), None, is_reset=False)

    def recv(self, timeout: float | None = None) -> tuple[Any, Any, Any, Any, dict[str, Any]]:
        """Return the sub-envs that are ready within ``batch_wait_ms`` (at least one).

        Returns ``(obs, rewards, terminations, truncations, infos)`` for the ready
        envs only; their ids are in ``infos["env_id"]`` (ascending).

        Raises:
            NoAsyncCallError: nothing was sent.
            multiprocessing.TimeoutError: no env was ready within ``timeout`` seconds.
        """
        self._check_open()
        if not self._calls or self._state is _State.WAITING_STEP:
            raise errors.NoAsyncCallError(
                "recv() called with nothing sent; call send() or async_reset() first", "step"
            )
        t0 = time.perf_counter()
        refs = list(self._calls)
        ready, _ = channel.wait(refs, len(refs), self.batch_wait_ms / 1000, self._ray)
        if not ready:
            ready = self._wait_first(refs, timeout, t0)
        batches = self._collect(ready, timeout=None)
        ids = np.concatenate([b[0] for b in batches])
        order = np.argsort(ids, kind="stable")
        obs, rew, term, trunc, infos = self._assemble_partial(batches, order)
        infos["env_id"] = ids[order]
        n = len(ids)
        is_step = any(not b[1].is_reset for b in batches)
        self.metrics.observe_poll(n, time.perf_counter() - t0)
        if is_step:
            self.metrics.steps.inc(sum(len(b[0]) for b in batches if not b[1].is_reset))
        return obs, rew, term, trunc, infos

    def _wait_first(self, refs: list[Any], timeout: float | None, t0: float) -> list[Any]:
        """Block until one call is ready, a call hangs past step_timeout_s, or timeout."""
        while True:
            now = time.perf_counter()
            limit = None if timeout is None else t0 + timeout - now
            deadlines = [d for c in self._calls.values() if (d := self._deadline(c)) is not None]
            if deadlines:
                hang = min(deadlines) - now
                limit = hang if limit is None else min(limit, hang)
            ready, _ = channel.wait(
                refs, 1, None if limit is None else max(limit, 0.0), self._ray
            )
            if ready:
                more, _ = channel.wait(refs, len(refs), 0, self._ray)
                return list(more) or list(ready)
            now = time.perf_counter()
            hung = [r for r, c in self._calls.items() if self._expired(c, now)]
            if hung:
                return hung  # _collect turns them into timeout failures
            if timeout is not None and now - t0 >= timeout:
                raise multiprocessing.TimeoutError(
                    f"recv() timed out after {timeout}s with no sub-env ready"
                )

    # ------------------------------------------------------------ submission
    def _check_env_ids(self, env_ids: Sequence[int] | np.ndarray | None) -> np.ndarray:
        if env_ids is None:
            return np.arange(self.num_envs)
        ids = np.asarray(env_ids)
        if ids.ndim != 1 or (ids.size and not np.issubdtype(ids.dtype, np.integer)):
            raise TypeError(f"env_ids must be a 1-D sequence of ints, got {env_ids!r}")
        ids = ids.astype(np.int64, copy=False)
        bad = ids[(ids < 0) | (ids >= self.num_envs)]
        if len(bad):
            raise ValueError(
                f"unknown env ids {bad.tolist()}: expected ids in [0, {self.num_envs})"
            )
        if len(ids) > 1:
            ordered = np.sort(ids)  # a sort, not np.unique: this runs on every send()
            if (ordered[1:] == ordered[:-1]).any():
                raise ValueError(f"env_ids must not repeat an id, got {ids.tolist()}")
        if not len(ids):
            raise ValueError("env_ids is empty: send at least one env id")
        return ids

    def _split_actions(self, actions: Any, n: int) -> Any:
        """Validate the batch of ``n`` actions; return something indexable per env."""
        if self.multi_agent:
            # a dict keyed by env id (as action_space.sample() gives) or a list in send order
            acts = list(actions.values()) if isinstance(actions, Mapping) else list(actions)
            if len(acts) != n:
                raise ValueError(
                    f"expected actions for {n} envs (a dict keyed by env id or a list of "
                    f"per-agent action dicts), got {len(acts)}"
                )
            for j, a in enumerate(acts):
                if not isinstance(a, Mapping):
                    raise TypeError(
                        f"multi-agent actions must be dicts keyed by agent id; item {j} is "
                        f"{type(a).__name__}"
                    )
            return acts
        space = self.single_action_space
        if self._array_actions:
            try:
                arr = np.asarray(actions)
            except Exception as exc:
                raise TypeError(
                    f"actions must be array-like for {space}, got {type(actions).__name__}"
                ) from exc
            expected = (n, *(space.shape or ()))
            if arr.shape != expected:
                raise ValueError(
                    f"actions must have shape {expected} (num_envs={n} x {space}) "
                    f"but got shape {arr.shape}"
                )
            if arr.dtype == object or not (
                np.issubdtype(arr.dtype, np.number) or arr.dtype == np.bool_
            ):
                raise TypeError(f"actions must be numeric for {space}, got dtype {arr.dtype}")
            if isinstance(space, gym.spaces.Discrete) and not np.issubdtype(arr.dtype, np.integer):
                raise TypeError(f"actions for {space} must be integers, got dtype {arr.dtype}")
            return arr
        try:
            acts = list(iterate(batch_space(space, n), actions))
        except Exception as exc:
            raise TypeError(
                f"actions must be a batch of {n} actions of {space}: {type(exc).__name__}: {exc}"
            ) from exc
        if len(acts) != n:
            raise ValueError(f"expected {n} actions, got {len(acts)}")
        return acts

    def _submit(self, ids: np.ndarray, per_env: Any, options: dict[str, Any] | None, *,
                is_reset: bool) -> None:
        """One call per host for the envs ``ids``; ``per_env[j]`` belongs to ``ids[j]``."""
        now = time.perf_counter()
        hosts_of = self._env_host[ids]
        groups: list[tuple[int, np.ndarray | None]]
        if len(ids) == self.num_envs and not is_reset:
            groups = [(h, None) for h in range(len(self._hosts))]  # every env, in host order
        elif (hosts_of == hosts_of[0]).all():  # the usual recv/send loop: one actor's envs
            groups = [(int(hosts_of[0]), np.arange(len(ids)))]
        else:
            groups = [(int(h), np.flatnonzero(hosts_of == h)) for h in np.unique(hosts_of)]
        for h, sel in groups:
            host = self._hosts[h]
            payload: Any
            if sel is None:
                env_ids = host.env_ids
                if host.lo >= 0 and isinstance(per_env, np.ndarray):
                    payload = per_env[host.lo:host.hi]
                else:
                    payload = [per_env[int(e)] for e in env_ids]
            else:
                env_ids = ids[sel]
                payload = _take(per_env, sel)
            positions = self._env_pos[env_ids].tolist()
            if is_reset:
                for e, s in zip(env_ids, payload, strict=True):
                    if s is not None:
                        self._seeds[int(e)] = s
                ref = self._host_call(host, "reset", positions, list(payload), options)
            else:
                ref = self._host_call(host, "step", positions, payload)
            self._calls[ref] = _Call(h, env_ids, positions, is_reset, now, host.handle,
                                     starting=host.start_ref is not None)
            self._busy[env_ids] = True

    def _channel(self, host: _Host) -> channel.Channel | None:
        """The host's socket channel, opened on first use; None: use Ray calls."""
        if self._node_id is None or host.start_ref is not None:
            return None  # Ray only, or a replacement whose start() is not checked yet
        if host.channel is None and not host.channel_tried:
            host.channel_tried = True
            try:
                where = self._ray.get(host.handle.open_channel.remote(self._node_id))
                if where is not None:
                    host.channel = channel.Channel(*where)
            except Exception:  # a dead actor surfaces through the Ray call instead
                host.channel = None
        if host.channel is not None and host.channel.closed:
            return None
        return host.channel

    def _drop_channel(self, host: _Host) -> None:
        if host.channel is not None:
            host.channel.close()
        host.channel, host.channel_tried = None, False

    # ------------------------------------------------------------ collection
    def _collect(self, refs: list[Any], timeout: float | None) -> list[tuple[np.ndarray, Batch]]:
        """Results of ``refs`` as (global env ids, Batch); faults handled here.

        Every ref given is consumed (even when one raises), so a failure never
        leaves stale calls behind.
        """
        hung: set[Any] = set()
        t_end = None if timeout is None else time.perf_counter() + timeout
        waiting = list(refs)
        while waiting and (len(refs) > 1 or timeout is not None
                           or any(self._deadline(self._calls[r]) is not None for r in waiting)):
            deadlines = [d for r in waiting if (d := self._deadline(self._calls[r])) is not None]
            hang_at = max(deadlines) if deadlines else None
            ends = [x for x in (t_end, hang_at) if x is not None]
            wait_s = max(0.0, min(ends) - time.perf_counter()) if ends else None
            _, waiting = channel.wait(waiting, len(waiting), wait_s, self._ray)
            if not waiting:
                break
            now = time.perf_counter()
            if t_end is not None and now >= t_end and (hang_at is None or t_end < hang_at):
                raise multiprocessing.TimeoutError(
                    f"timed out after {timeout}s: {len(waiting)} of {len(refs)} actor "
                    "calls still pending (the call stays pending: wait again)"
                )
            expired = {r for r in waiting if self._expired(self._calls[r], now)}
            hung |= expired
            waiting = [r for r in waiting if r not in expired]
        out: list[tuple[np.ndarray, Batch]] = []
        permanent: list[Exception] = []
        for ref in refs:
            call = self._calls.pop(ref)
            self._busy[call.env_ids] = False
            host = self._hosts[call.host]
            try:
                batch = self._result(ref, call, host, ref in hung)
            except errors.SubEnvironmentError as exc:
                permanent.append(exc)
                continue
            for f in batch.failures:
                e = int(host.env_ids[f.index])
                if f.reason == "exception":
                    self.metrics.failures["exception"].inc()
                if f.restarted:
                    self._restarts[e] += 1
                    self.metrics.env_restarts.inc()
                if f.permanent:
                    self._failed[e] = True
                    permanent.append(self._error(host, f))
            out.append((host.env_ids[batch.indices], batch))
        if permanent:
            raise permanent[0]
        return out

    def _deadline(self, call: _Call) -> float | None:
        """When a call counts as hung (None: never): step_timeout_s after sending, plus
        start_timeout_s when it went to a replacement actor still starting. The latter
        holds even without step_timeout_s: a replacement that cannot be placed (no node
        with its resources) must not block the driver forever."""
        if call.starting:
            return call.sent + (self.step_timeout_s or 0.0) + self.start_timeout_s
        if self.step_timeout_s is None:
            return None
        return call.sent + self.step_timeout_s

    def _expired(self, call: _Call, now: float) -> bool:
        deadline = self._deadline(call)
        return deadline is not None and now >= deadline

    def _result(self, ref: Any, call: _Call, host: _Host, hung: bool) -> Batch:
        """One call's Batch; a dead or hung actor is replaced and reported here."""
        stale = call.handle is not host.handle  # its actor was already replaced
        if hung:
            message = (
                f"the replacement actor did not start within start_timeout_s={self.start_timeout_s}"
                " (can the cluster place it? see `ray status` for infeasible resource demands)"
                if call.starting
                else f"no answer within step_timeout_s={self.step_timeout_s}"
            )
            if stale:
                return self._failed_result(call, "timeout", message)
            return self._replace_host(call, "timeout", message)
        try:
            if not stale:
                self._check_started(host)
            batch: Batch = channel.get(ref, self._ray)
            if not batch.is_reset:
                host.actor_failures = 0  # a good step ends a crash loop
            return batch
        except (self._ray.exceptions.RayActorError, channel.ChannelClosedError) as exc:
            message = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            if stale:
                return self._failed_result(call, "actor_died", message)
            return self._replace_host(call, "actor_died", message)
        except (self._ray.exceptions.RayTaskError, channel.RemoteCallError) as exc:
            raise errors.SubEnvironmentError(
                int(call.env_ids[0]), f"the actor call failed: {exc}",
                getattr(exc, "remote_traceback", ""),
            ) from exc

    def _check_started(self, host: _Host) -> None:
        """Surface a replacement actor's start() failure before using its results."""
        if host.start_ref is None:
            return
        ref, host.start_ref = host.start_ref, None
        try:
            info = self._ray.get(ref, timeout=self.start_timeout_s)
        except self._ray.exceptions.GetTimeoutError:
            self._failed[host.env_ids] = True
            raise errors.SubEnvironmentFailedError(
                int(host.env_ids[0]),
                f"the replacement actor for sub-environments {host.env_ids.tolist()} did not "
                f"start within start_timeout_s={self.start_timeout_s} (can the cluster place "
                "it? see `ray status` for infeasible resource demands)",
            ) from None
        self._raise_start_failures(host, info)
        self._created(host)

    # ---------------------------------------------------------- actor faults
    def _replace_host(self, call: _Call, reason: FailureReason, message: str) -> Batch:
        """Kill and re-create the actor of ``call``; return the failed step's result."""
        host = self._hosts[call.host]
        k = len(host.env_ids)
        self.metrics.failures[reason].inc(k)
        host.actor_failures += 1
        first = int(host.env_ids[0])
        what = f"the actor hosting sub-environments {host.env_ids.tolist()}"
        self._drop_channel(host)
        if self._replacer is None and (host.owned or reason == "timeout"):
            try:
                self._ray.kill(host.handle, no_restart=True)
            except Exception:  # already gone
                pass
        if not self.restart_failed:
            self._failed[host.env_ids] = True
            raise errors.SubEnvironmentError(first, f"{what} failed ({reason}): {message}")
        if host.actor_failures > self.max_restarts:
            self._failed[host.env_ids] = True
            raise errors.SubEnvironmentFailedError(
                first, f"{what} failed {host.actor_failures} times in a row "
                f"(max_restarts={self.max_restarts}); last: {reason}: {message}"
            )
        if self.restart_backoff_s > 0 and host.actor_failures > 1:
            time.sleep(restarts.backoff(self.restart_backoff_s, host.actor_failures - 2, 60.0))
        self._restarts[host.env_ids] += 1
        if self._replacer is not None:
            host.handle = self._replacer(host.handle, reason)
            host.owned = False
            self._created(host)
        else:
            host.handle = self._new_host(host.env_ids.tolist(), after_failure=True)
            host.owned = True
            host.start_ref = host.handle.start.remote()
        self.metrics.actor_restarts.inc()
        self.metrics.env_restarts.inc(k)
        return self._failed_result(call, reason, message)

    def _failed_result(self, call: _Call, reason: FailureReason, message: str) -> Batch:
        """The step result of envs whose actor was replaced: a truncated episode end."""
        host = self._hosts[call.host]
        ids = call.env_ids
        infos: list[dict[str, Any]] = [{"error": f"{reason}: {message}"} for _ in ids]
        obs = [self._last_obs(int(e)) for e in ids]
        if self.autoreset_mode is AutoresetMode.SAME_STEP:
            # the replacement's first reset uses the restart seeds (host side)
            self._check_started(host)
            reset = self._ray.get(host.handle.reset.remote(call.positions, [None] * len(ids), None))
            new_obs = _rows(reset.obs)
            infos = [
                {"final_obs": o, "final_info": dict(i), **ri, "error": i["error"]}
                for o, i, ri in zip(obs, infos, reset.infos, strict=True)
            ]
            obs = new_obs
        if self.multi_agent:
            ended = [
                {"terms": t, "truncs": tr, "rew": r}
                for t, tr, r in (_ma_ended(o) for o in obs)
            ]
            return Batch(
                list(call.positions), obs, [x["rew"] for x in ended],
                [x["terms"] for x in ended], [x["truncs"] for x in ended], infos, [],
                call.is_reset,
            )
        stacked: Any = np.stack(obs) if self._box_obs else obs
        return Batch(
            list(call.positions), stacked, np.zeros(len(ids)), np.zeros(len(ids), dtype=np.bool_),
            np.ones(len(ids), dtype=np.bool_), infos, [], call.is_reset,
        )

    def _last_obs(self, e: int) -> Any:
        if self._box_obs:
            return self._observations[e].copy()
        if self._env_obs[e] is not None:
            return self._env_obs[e]
        return {} if self.multi_agent else self.single_observation_space.sample()

    def _error(self, host: _Host, f: Failure) -> errors.SubEnvironmentError:
        e = int(host.env_ids[f.index])
        cls = errors.SubEnvironmentFailedError if self.restart_failed else errors.SubEnvironmentError
        return cls(e, f"{f.reason}: {f.message}", f.traceback)

    # -------------------------------------------------------------- assembly
    def _assemble_full(
        self, batches: list[tuple[np.ndarray, Batch]], env_ids: np.ndarray
    ) -> tuple[Any, Any, Any, Any, dict[str, Any]]:
        """Results for all envs in env-id order (``env_ids`` were stepped/reset)."""
        if self.multi_agent:
            return self._assemble_multi_agent(batches, None)
        n = self.num_envs
        rewards = np.zeros(n, dtype=np.float64)
        terms = np.zeros(n, dtype=np.bool_)
        truncs = np.zeros(n, dtype=np.bool_)
        merger = _InfoMerger(n)
        infos: dict[str, Any] = {}
        per_env_infos: list[tuple[int, dict[str, Any]]] = []
        for ids, b in batches:
            self._store_obs(ids, b.obs)
            rewards[ids] = b.rewards
            terms[ids] = b.terminations
            truncs[ids] = b.truncations
            per_env_infos.extend(zip(ids.tolist(), b.infos, strict=True))
        per_env_infos.sort(key=lambda x: x[0])
        for e, info in per_env_infos:
            if info:
                infos = merger._add_info(infos, info, e)
        if not self._box_obs:
            out: Any = self._observations
            self._observations = concatenate(self.single_observation_space, self._env_obs, out)
        if not self.copy:
            obs = self._observations
        elif self._box_obs:
            obs = self._observations.copy()
        else:
            obs = deepcopy(self._observations)
        return obs, rewards, terms, truncs, infos

    def _assemble_partial(
        self, batches: list[tuple[np.ndarray, Batch]], order: np.ndarray
    ) -> tuple[Any, Any, Any, Any, dict[str, Any]]:
        if self.multi_agent:
            return self._assemble_multi_agent(batches, order)
        for ids, b in batches:
            self._store_obs(ids, b.obs)
        ids = np.concatenate([ids for ids, _ in batches])[order]
        m = len(ids)
        rewards = np.concatenate([np.asarray(b.rewards, dtype=np.float64) for _, b in batches])[order]
        terms = np.concatenate([np.asarray(b.terminations, dtype=np.bool_) for _, b in batches])[order]
        truncs = np.concatenate([np.asarray(b.truncations, dtype=np.bool_) for _, b in batches])[order]
        all_infos = [i for _, b in batches for i in b.infos]
        merger = _InfoMerger(m)
        infos: dict[str, Any] = {}
        for j, src in enumerate(order):
            if all_infos[src]:
                infos = merger._add_info(infos, all_infos[src], j)
        if self._box_obs:
            obs = self._observations[ids].copy()
        else:
            buf: Any = create_empty_array(self.single_observation_space, m, fn=np.zeros)
            obs = concatenate(self.single_observation_space, [self._env_obs[int(e)] for e in ids], buf)
        return obs, rewards, terms, truncs, infos

    def _assemble_multi_agent(
        self, batches: list[tuple[np.ndarray, Batch]], order: np.ndarray | None
    ) -> tuple[Any, Any, Any, Any, dict[str, Any]]:
        obs: dict[int, Any] = {}
        rew: dict[int, Any] = {}
        term: dict[int, Any] = {}
        trunc: dict[int, Any] = {}
        infos: dict[Any, Any] = {}
        for ids, b in batches:
            for j, e in enumerate(ids.tolist()):
                obs[e] = b.obs[j]
                self._env_obs[e] = b.obs[j]
                rew[e], term[e], trunc[e], infos[e] = (
                    b.rewards[j], b.terminations[j], b.truncations[j], b.infos[j]
                )
        keys = sorted(obs)
        result = tuple({k: d[k] for k in keys} for d in (obs, rew, term, trunc, infos))
        out_infos: dict[Any, Any] = dict(result[4])
        return result[0], result[1], result[2], result[3], out_infos

    def _store_obs(self, ids: np.ndarray, obs: Any) -> None:
        if self._box_obs:
            self._observations[ids] = obs  # the buffer row is the truth for Box spaces
        else:
            for e, o in zip(ids.tolist(), obs, strict=True):
                self._env_obs[e] = o

    # -------------------------------------------------------- env attributes
    def call(self, name: str, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
        """Call ``name`` on every sub-env (or read it if not callable)."""
        self._check_open()
        refs = [self._host_call(h, "call", list(range(len(h.env_ids))), name, args, kwargs)
                for h in self._hosts]
        return tuple(x for ref in refs for x in channel.get(ref, self._ray))

    def get_attr(self, name: str) -> tuple[Any, ...]:
        return self.call(name)

    def set_attr(self, name: str, values: list[Any] | tuple[Any, ...] | Any) -> None:
        self._check_open()
        if not isinstance(values, (list, tuple)):
            values = [values] * self.num_envs
        if len(values) != self.num_envs:
            raise ValueError(
                f"values must be a list of length num_envs={self.num_envs}, got length={len(values)}"
            )
        refs = [
            self._host_call(h, "set_attr", list(range(len(h.env_ids))), name,
                            [values[int(e)] for e in h.env_ids])
            for h in self._hosts
        ]
        for ref in refs:
            channel.get(ref, self._ray)

    def _host_call(self, host: _Host, method: str, *args: Any) -> Any:
        """Call a host method over its channel if it has one, else through Ray.

        ``call``/``set_attr`` take the same path as steps, so they run after them.
        """
        chan = self._channel(host)
        if chan is not None:
            return chan.call((method, *args))
        return getattr(host.handle, method).remote(*args)

    def render(self) -> tuple[Any, ...] | None:
        return self.call("render")

    @property
    def actors(self) -> list[Any]:
        """The host actor handles, in env order."""
        return [h.handle for h in self._hosts]

    def actor_of(self, env_id: int) -> Any:
        return self._hosts[int(self._env_host[env_id])].handle

    @property
    def restart_counts(self) -> np.ndarray:
        """Restarts per sub-env (exceptions and actor replacements)."""
        return self._restarts.copy()

    # ------------------------------------------------------------------ close
    def close_extras(self, **kwargs: Any) -> None:
        for h in self._hosts:
            self._drop_channel(h)
        self._calls.clear()
        self._busy[:] = False
        self.metrics.untrack_states()
        if self._ray.is_initialized():
            for h in self._hosts:
                if h.owned:
                    try:
                        h.handle.close.remote()
                    except Exception:
                        pass
            self._kill_owned()

    def _kill_owned(self) -> None:
        for h in self._hosts:
            if h.owned:
                try:
                    self._ray.kill(h.handle, no_restart=True)
                except Exception:  # already dead
                    pass

    def _check_open(self) -> None:
        if self.closed:
            raise errors.ClosedEnvironmentError(
                f"Trying to operate on `{type(self).__name__}`, after a call to `close()`."
            )

    def _pending_name(self) -> str:
        calls = list(self._calls.values())
        return "reset" if calls and calls[0].is_reset else "step"

    def _state_counts(self) -> dict[str, int]:
        restarting = sum(len(h.env_ids) for h in self._hosts if h.start_ref is not None)
        failed = int(self._failed.sum())
        return {"running": self.num_envs - restarting - failed, "restarting": restarting,
                "failed": failed}

    def __repr__(self) -> str:
        return (f"RemoteVectorEnv(num_envs={self.num_envs}, actors={len(self._hosts)}, "
                f"envs_per_actor={self.envs_per_actor})")


# ----------------------------------------------------------------- helpers
class _NotOurs:
    """The make-env callable of envs in actors from :meth:`RemoteVectorEnv.from_actors`."""

    def __call__(self) -> Any:
        raise RuntimeError("this env lives in an actor given to RemoteVectorEnv.from_actors; "
                           "it is rebuilt by that actor's owner (actor_replacer), not here")


class _ReturnHandle:
    """A make-env callable returning an existing env actor (picklable)."""

    def __init__(self, handle: Any) -> None:
        self.handle = handle

    def __call__(self) -> Any:
        return self.handle


_HOST_CLS: Any = None


def _remote_host() -> Any:
    global _HOST_CLS
    if _HOST_CLS is None:
        import ray

        _HOST_CLS = ray.remote(SubEnvHost)
    return _HOST_CLS


def _ensure_ray(address: str | None) -> Any:
    import ray

    if not ray.is_initialized():
        # RAY_ADDRESS (set in Ray pods) wins; else a fresh local Ray, not the cluster that
        # ray.init() would find through /tmp/ray/ray_current_cluster
        address = address or os.environ.get("RAY_ADDRESS") or "local"
        if address == "local":
            ray.init(address="local", include_dashboard=False)
        else:
            ray.init(address=address)
    return ray


def _describe_existing(handle: Any) -> dict[str, Any] | None:
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


def _check_reset_mask(mask: Any, n: int) -> np.ndarray:
    if not isinstance(mask, np.ndarray):
        raise TypeError(f"`options['reset_mask']` must be a numpy array, got {type(mask)}")
    if mask.shape != (n,):
        raise ValueError(f"`options['reset_mask']` must have shape `({n},)`, got {mask.shape}")
    if mask.dtype != np.bool_:
        raise TypeError(f"`options['reset_mask']` must have `dtype=np.bool_`, got {mask.dtype}")
    if not np.any(mask):
        raise ValueError(
            "`options['reset_mask']` must contain a boolean array with at least one True "
            f"value, got reset_mask={mask}"
        )
    return mask


def _take(per_env: Any, sel: np.ndarray) -> Any:
    if isinstance(per_env, np.ndarray):
        return per_env[sel]
    return [per_env[int(j)] for j in sel]


def _rows(obs: Any) -> list[Any]:
    return list(obs)


def _ma_ended(obs: Any) -> tuple[dict[str, bool], dict[str, bool], dict[str, float]]:
    from remote_env import multi_agent

    return multi_agent.ended_dicts(multi_agent.agent_ids(obs))


def _positive_int(name: str, value: Any) -> None:
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}")
