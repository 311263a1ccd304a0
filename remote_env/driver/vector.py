"""``RemoteVectorEnv``: a gymnasium ``VectorEnv`` whose sub-envs live in Ray actors.

The public API. Each actor is a :class:`~remote_env.actor.host.SubEnvHost` holding
``envs_per_actor`` sub-envs; one call steps all of them, autoreset happens in the
actor, and the driver only checks input, splits actions, merges results and
supervises. Where the rest lives (each imports only those above it):

* :mod:`remote_env.checks` -- caller input (actions, seeds, ids, spaces, options);
* :mod:`remote_env.driver.actor_set` -- the actors: creating them, channel or Ray calls;
* :mod:`remote_env.driver.faults` -- lost actors, hangs, replacement without stalling;
* :mod:`remote_env.driver.calls` -- the calls in flight and the one wait loop;
* :mod:`remote_env.driver.assembly` -- host results into gymnasium's batched results;
* :mod:`remote_env.driver.attributes` -- ``call``/``get_attr``/``set_attr`` and seeds;
* :mod:`remote_env.driver.stepping` -- ``reset``, ``step``, ``send``/``recv``.

``step``/``step_async``/``step_wait`` step every env (same results as
``SyncVectorEnv`` for the same seeds and actions); ``send(actions, env_ids)``/
``recv()`` step a subset and return whichever envs are ready within
``batch_wait_ms`` (EnvPool-style dynamic batching; ids in ``info["env_id"]``).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode, VectorEnv

from remote_env import checks, interrupts, ray_connect
from remote_env.actor.host import EnvFn
from remote_env.driver import actor_set as _actors
from remote_env.driver.assembly import Assembler
from remote_env.driver.stepping import Stepping
from remote_env.metrics import PoolMetrics
from remote_env.spec.fields import DEFAULT_BATCH_WAIT_MS, DEFAULT_MAX_RESTARTS

TRANSPORTS = checks.TRANSPORTS
_E = TypeVar("_E", bound="RemoteVectorEnv")


class RemoteVectorEnv(Stepping, VectorEnv[Any, Any, Any]):  # type: ignore[misc]
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
        observation_mode: ``"same"``, ``"different"`` or ``(observation_space,
            single_observation_space)``, as for ``SyncVectorEnv``.
        restart_failed_sub_environments: restart a sub-env that raises, or whose
            actor dies or hangs, instead of raising.
        max_restarts: consecutive failed restarts allowed per sub-env (and per actor).
        restart_backoff_s: first restart backoff; doubles per consecutive failure.
            An actor in backoff holds only its own envs' calls; the others go on.
        step_timeout_s: an actor that does not answer a call within this is killed
            and replaced (hang detection); None waits forever.
        start_timeout_s: extra time a replacement actor gets to start (its env
            constructors may boot a simulator) before its first call counts as hung;
            None: no limit.
        close_timeout_s: how long :meth:`close` waits for the sub-envs' own ``close()``
            (a last video written, a simulator's state saved) before it kills the actors
            it created; envs whose close raised or did not finish are named in a
            warning. None: wait for all of them.
        threads_per_actor: step an actor's sub-envs on this many threads (for envs
            that wait on I/O or release the GIL). Envs with ``async def astep`` and
            ``areset`` need none: they are awaited together on one event loop per
            actor (``async_steps`` says whether they were).
        transport: how step/reset reach the actors. ``"auto"`` (default): for
            actors on the driver's node, observations, rewards, flags and actions in
            shared memory laid out like the batched spaces, with a Unix socket (~0.2 ms
            a round trip instead of a Ray call's ~1-2 ms) saying "batch ready" and
            carrying infos and errors; Ray calls for actors on other nodes.
            ``"pickle"``: the socket alone, arrays pickled through it. ``"ray"``: Ray
            calls only. Either way Ray creates, supervises and kills the actors.
        spin_us: with ``transport="auto"``, how long (µs) a host actor on this node
            looks for the next call before it sleeps, yielding its core between looks.
            0 (default): it sleeps at once. For cheap envs stepped in a tight loop a few
            hundred µs spares each call a wake-up and cold caches (CartPole, 64 envs in
            two actors on 2 cores: see README "Benchmarks"), at the price of that CPU
            when the next call is late.
        splits_per_actor: send each actor's envs as this many calls (Sample Factory's
            ``worker_num_splits``): an actor steps one split while the driver handles
            the reply of another, so with one actor per spare core the driver and the
            actors keep their cores busy instead of taking turns (images, 16 envs in one
            actor on 2 cores: see README "Benchmarks"). 1 (default): one call per actor.
            Each split is a fixed range of an actor's envs; each call costs ~100 µs of
            driver CPU, so splits of fewer than ~8 cheap envs cost more than they overlap.
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
        observation_mode: str | tuple[gym.spaces.Space[Any], gym.spaces.Space[Any]] = "same",
        restart_failed_sub_environments: bool = False,
        max_restarts: int = DEFAULT_MAX_RESTARTS,
        restart_backoff_s: float = 0.0,
        step_timeout_s: float | None = None,
        start_timeout_s: float | None = 300.0,
        close_timeout_s: float | None = 5.0,
        threads_per_actor: int = 1,
        transport: str = "auto",
        spin_us: float = 0.0,
        splits_per_actor: int = 1,
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
        checks.options(envs_per_actor=envs_per_actor, threads_per_actor=threads_per_actor,
                       max_restarts=max_restarts, batch_wait_ms=batch_wait_ms,
                       step_timeout_s=step_timeout_s, restart_backoff_s=restart_backoff_s,
                       transport=transport, observation_mode=observation_mode,
                       spin_us=spin_us, splits_per_actor=splits_per_actor,
                       start_timeout_s=start_timeout_s, close_timeout_s=close_timeout_s)
        self.num_envs = len(env_fns)
        self.env_fns = env_fns
        self.batch_wait_ms = float(batch_wait_ms)
        self.autoreset_mode = AutoresetMode(autoreset_mode)
        self.copy = copy
        self.observation_mode = observation_mode
        self.restart_failed = restart_failed_sub_environments
        self.max_restarts = max_restarts
        self.restart_backoff_s = restart_backoff_s
        self.step_timeout_s = step_timeout_s
        self.start_timeout_s = start_timeout_s
        self.close_timeout_s = close_timeout_s
        self._threads = threads_per_actor
        self._on_created = on_sub_environment_created
        self._actor_options = dict(actor_options or {})
        self._replacer = actor_replacer
        self._executor = None
        self.metrics = metrics if metrics is not None else PoolMetrics(registry, pool)
        self._ray = ray_connect.connect(address)
        self.transport = transport
        self.spin_us = float(spin_us)
        self.splits_per_actor = int(splits_per_actor)
        self._node_id = (
            self._ray.get_runtime_context().get_node_id() if transport != "ray" else None
        )
        if envs_per_actor is None:
            cpus = max(1, int(self._ray.cluster_resources().get("CPU", 1)))
            envs_per_actor = -(-self.num_envs // cpus)
        self.envs_per_actor: int = envs_per_actor

        n = self.num_envs
        self._seeds: list[int | None] = [None] * n
        self._restarts = np.zeros(n, dtype=np.int64)
        self._failed = np.zeros(n, dtype=np.bool_)
        self._busy = np.zeros(n, dtype=np.bool_)
        #: envs sent a reset at least once: gymnasium refuses a step before it, and a
        #: step of an env never reset had no observation to return when it failed. Envs
        #: of existing actors (a warm pool) are where their last user left them.
        self._was_reset = np.full(n, existing_actors is not None, dtype=np.bool_)
        self._calls: dict[Any, _actors.Call] = {}
        self._ready = []
        self._orphans = {}
        self._hosts: list[_actors.Host] = []
        self._env_host = np.zeros(n, dtype=np.int64)
        self._env_pos = np.zeros(n, dtype=np.int64)
        try:
            # anything raised (an interrupt included) before the env is whole kills the
            # actors created so far: nothing outlives a constructor that failed
            self._set_up(list(existing_actors or []), observation_mode, copy)
        except BaseException:
            self._kill_owned()
            raise
        self.closed = False

    # ------------------------------------------------------------------ set-up
    def _set_up(self, existing: list[Any], observation_mode: Any, copy: bool) -> None:
        n = self.num_envs
        infos = self._create_hosts(existing)
        info = infos[0]
        self.multi_agent = bool(info["multi_agent"])
        if not self.multi_agent:
            obs_spaces, act_spaces = self._env_spaces(infos)
            self.single_observation_space, self.observation_space = checks.spaces(
                observation_mode, obs_spaces, act_spaces, n)
        # the sub-envs have astep/areset and the actors await them (see actor/host.py)
        self.async_steps = bool(info.get("async_steps", False))
        self.single_action_space = info["action_space"]
        if self.multi_agent:
            # results are dicts keyed env id (an int, as in the results) -> agent id
            self.single_observation_space = info["observation_space"]
            self.observation_space = gym.spaces.Dict(
                {i: self.single_observation_space for i in range(n)})  # type: ignore[misc]
            self.action_space = gym.spaces.Dict(
                {i: self.single_action_space for i in range(n)})  # type: ignore[misc]
        else:
            self.action_space = gym.vector.utils.batch_space(self.single_action_space, n)
        self.metadata = dict(info["metadata"])
        self.metadata["autoreset_mode"] = self.autoreset_mode
        self.render_mode = info["render_mode"]
        self._assembler = Assembler(self.single_observation_space, n,
                                    multi_agent=self.multi_agent, copy=copy)
        self.metrics.track_states(self._state_counts)

    @staticmethod
    def host_class() -> Any:
        """The Ray actor class hosting sub-envs (for ``existing_actors``)."""
        return _actors.remote_host()

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
            ray = ray_connect.connect(kwargs.get("address"))
            sizes = [int(d["num_envs"]) for d in ray.get([a.describe.remote() for a in actors])]
        return cls([_actors.NotOurs()] * sum(sizes), existing_actors=actors, **kwargs)

    @staticmethod
    def from_pool(name: str, **kwargs: Any) -> RemoteVectorEnv:
        """Attach to the running pool ``name`` (see :func:`remote_env.pool.attach.attach`).

        Example:
            >>> envs = RemoteVectorEnv.from_pool("cartpole", num_envs=16)  # doctest: +SKIP
        """
        from remote_env.pool.attach import attach

        return attach(name, **kwargs)

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
    def close(self, **kwargs: Any) -> None:
        """Close the sub-envs (each one's own ``close()``, within ``close_timeout_s``) and
        kill the actors this vector env created. Idempotent; interrupted, it is done
        all the same (the actors are killed) and the interrupt is raised."""
        if self.closed:
            return
        try:
            self.close_extras(**kwargs)
        finally:
            self.closed = True

    def close_extras(self, **kwargs: Any) -> None:
        with interrupts.deferred():  # raised in the wait for the envs' close(), or after
            try:
                for h in self._hosts:
                    self._drop_channel(h)
                self._abandon()
                self.metrics.untrack_states()
                if self._executor is not None:
                    self._executor.shutdown(wait=False, cancel_futures=True)
                if self._ray.is_initialized():
                    self._close_envs()
            finally:
                if self._ray.is_initialized():
                    self._kill_owned()

    def _close_envs(self) -> None:
        """Each owned actor's sub-envs closed (bounded by ``close_timeout_s``), before the
        actors are killed; envs whose close raised or did not finish are named in a
        warning. Actors someone else owns (a pool's) keep their envs for the next user."""
        refs: dict[Any, _actors.Host] = {}
        for h in self._hosts:
            # not the actors this env killed itself (failed envs, no restarts): nothing to close
            if h.owned and h.up and not self._failed[h.env_ids].all():
                try:
                    refs[h.handle.close.remote()] = h
                except Exception:  # the actor is gone: nothing to close there
                    pass
        if not refs:
            return
        with interrupts.interruptible():
            done, late = self._ray.wait(list(refs), num_returns=len(refs),
                                        timeout=self.close_timeout_s)
        problems: list[str] = []
        for ref in done:
            host = refs[ref]
            try:
                failed = self._ray.get(ref)
            except Exception as exc:  # the actor died while closing
                problems.append(f"sub-environments {host.env_ids.tolist()}: "
                                f"{type(exc).__name__}: {str(exc).splitlines()[0]}")
                continue
            for pos, message in failed or []:
                problems.append(f"sub-environment {int(host.env_ids[pos])}: {message}")
        for ref in late:
            problems.append(f"sub-environments {refs[ref].env_ids.tolist()}: close() did not "
                            f"finish within close_timeout_s={self.close_timeout_s}")
        if problems:
            warnings.warn("RemoteVectorEnv.close(): some sub-environments did not close "
                          "cleanly: " + "; ".join(problems), RuntimeWarning, stacklevel=3)

    def _state_counts(self) -> dict[str, int]:
        restarting = self._replacing_envs()
        failed = int(self._failed.sum())
        return {"running": self.num_envs - restarting - failed, "restarting": restarting,
                "failed": failed}

    def __enter__(self) -> RemoteVectorEnv:
        """``with RemoteVectorEnv(...) as envs:`` closes the envs (and the actors this
        vector env created) on the way out, as ``with gym.make(...)`` does for one env."""
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()  # an exception inside the block propagates

    def __repr__(self) -> str:
        return (f"RemoteVectorEnv(num_envs={self.num_envs}, actors={len(self._hosts)}, "
                f"envs_per_actor={self.envs_per_actor})")
