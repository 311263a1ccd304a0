"""``RemoteVectorEnv``: a gymnasium ``VectorEnv`` whose sub-envs live in Ray actors.

The public API, a facade over collaborators that each own their state. Each actor
is a :class:`~remote_env.actor.host.SubEnvHost` holding ``envs_per_actor`` sub-envs;
one call steps all of them, autoreset happens in the actor, and the driver only
checks input, splits actions, merges results and supervises. One ``recv()``:
:class:`~remote_env.driver.dispatch.Dispatcher` waits (``poll``) and reads
(``collect``, through :class:`~remote_env.driver.results.ResultReader`) into
:class:`~remote_env.driver.inflight.InFlight`; the facade takes the ready results
and :class:`~remote_env.driver.assembly.Assembler` batches them. The parts (each
imports only those below it):

* :mod:`remote_env.checks` -- caller input (actions, seeds, ids, spaces, options);
* :mod:`remote_env.driver.dispatch` -- sending planned calls, the one wait loop;
* :mod:`remote_env.driver.results` -- one finished call into a Batch or its error;
* :mod:`remote_env.driver.recovery` -- lost actors, hangs, backoff, replacement;
* :mod:`remote_env.driver.inflight` -- the calls in flight, ready results, busy envs;
* :mod:`remote_env.driver.links` -- how a call reaches a host (Ray, socket, shared arrays);
* :mod:`remote_env.driver.hosts` -- the actors: creating, adopting, killing them;
* :mod:`remote_env.driver.planner` -- env ids into one call per host split (pure);
* :mod:`remote_env.driver.ledger` -- per-env seeds, resets, restart counts, failures;
* :mod:`remote_env.driver.assembly` -- host results into gymnasium's batched results;
* :mod:`remote_env.driver.options` -- the validated options.

``step``/``step_async``/``step_wait`` step every env (same results as
``SyncVectorEnv`` for the same seeds and actions); ``send(actions, env_ids)``/
``recv()`` step a subset and return whichever envs are ready within
``batch_wait_ms`` (EnvPool-style dynamic batching; ids in ``info["env_id"]``).
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import multiprocessing
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode, VectorEnv

from remote_env import checks, errors, interrupts, ray_connect
from remote_env.actor.host import EnvFn
from remote_env.driver import hosts as hosts_mod
from remote_env.driver import options as options_mod
from remote_env.driver import tuning as tuning_mod
from remote_env.driver.assembly import Assembler, Batches, Results
from remote_env.driver.dispatch import Dispatcher
from remote_env.driver.hosts import HostTable
from remote_env.driver.inflight import CallView, InFlight
from remote_env.driver.lease import HeldLease
from remote_env.driver.ledger import EnvLedger
from remote_env.driver.links import Links
from remote_env.driver.recovery import Recovery
from remote_env.driver.results import ResultReader
from remote_env.metrics import PoolMetrics
from remote_env.spec.fields import DEFAULT_MAX_RESTARTS

TRANSPORTS = checks.TRANSPORTS
log = logging.getLogger(__name__)
_E = TypeVar("_E", bound="RemoteVectorEnv")

#: sub-env ids for ``call``/``get_attr``/``set_attr``; None: all of them
EnvIds = Sequence[int] | np.ndarray | int | None


class _State(enum.Enum):
    """Who waits for the calls in flight (and the results not handed out yet)."""

    IDLE = "idle"  # nothing in flight (calls orphaned by a failed reset/step aside)
    STEP = "step"  # step_async sent every env a step: step_wait() collects
    RECV = "recv"  # send()/async_reset(): recv() collects
    RESET = "reset"  # reset() is collecting; cut short, its calls are over


class _PublicCall:
    """``with env._public_call():`` (a class, not a generator: it runs on every call)."""

    __slots__ = ("env", "held")

    def __init__(self, env: RemoteVectorEnv) -> None:
        self.env = env
        self.held = interrupts.deferred()

    def __enter__(self) -> None:
        self.held.__enter__()

    def __exit__(self, *exc: object) -> None:
        try:
            kind = exc[0]
            self.env._settle(interrupted=isinstance(kind, type)
                             and issubclass(kind, KeyboardInterrupt))
        finally:
            self.held.__exit__(*exc)


@dataclasses.dataclass(frozen=True)
class HostView:
    """One host actor as :meth:`RemoteVectorEnv.hosts` shows it (a snapshot)."""

    handle: Any
    env_ids: np.ndarray
    owned: bool
    #: a socket channel to it is open / with shared arrays for steps
    channel: bool
    shared: bool
    #: an actor to send to exists (not in backoff, being replaced or given up on)
    up: bool
    #: in backoff until this ``time.perf_counter()``; None: not
    retry_at: float | None
    broken: bool
    #: the channel is TCP (the actor is on another node), not the Unix socket
    tcp: bool = False


class RemoteVectorEnv(VectorEnv[Any, Any, Any]):
    """Vector env with sub-environments in Ray actors, dynamic batching and restarts.

    Args:
        env_fns: one make-env callable per sub-env, exactly as for
            ``gymnasium.vector.AsyncVectorEnv``. A callable may return a gymnasium
            env, a PettingZoo ``ParallelEnv`` / RLlib-style multi-agent env, or a Ray
            actor handle of an env (stepped through Ray from the host actor).
        envs_per_actor: sub-envs hosted by one actor; one call steps them all.
            None (default): the library picks (:mod:`remote_env.driver.tuning`, shown in
            ``repr(envs)``, ``envs.tuning`` and the log). On a one-node Ray with
            ``transport="auto"``, ``batch_wait_ms=0`` (the default) and no
            ``actor_options``/``threads_per_actor``, one env
            is built here, as gymnasium's ``AsyncVectorEnv`` builds one to read its
            spaces, and stepped a few times (at most 32 steps or 50 ms, its own seed,
            then closed) to measure its step and observation size: envs whose data
            cost the driver a core's share get one actor per *spare* core in two
            splits, the others one actor per core. Otherwise (or if that env cannot be
            built or stepped here): ``ceil(num_envs / CPUs of the Ray cluster)``.
            Pass a number to skip the measuring.
        batch_wait_ms: how long :meth:`recv` waits for more envs once called: it returns
            the calls that finished within it (at once if they all did), else the first
            to finish after it. 0 (default, as RLlib's ``remote_env_batch_wait_ms``):
            whatever is ready with the first call to finish, so an actor's splits and
            the actors overlap with the driver instead of coming back together (smaller
            batches, more of them). :meth:`step` always returns every env, whatever this
            is. A pool's trainer (:meth:`from_pool`) gets the pool's ``spec.batchWaitMs``
            (2 unless set). Before issue 34 the default was 2.
        autoreset_mode: gymnasium autoreset mode (NEXT_STEP, SAME_STEP, DISABLED).
        copy: return copies of observations (as ``SyncVectorEnv`` does). False (as
            ``AsyncVectorEnv(copy=False)``): no copy out. :meth:`recv` returns the
            rows of the shared-memory batch the actor wrote (``transport="auto"`` on
            the driver's node, one call's envs in id order: the usual ``recv``); they
            stay valid until those envs are sent again (``send``/``step``/``reset``
            of them: the actor writes their next rows in place), so the views of one
            split survive the ``recv`` of another. ``step``/``reset`` return the
            driver's batch buffer, valid until the next ``step``/``reset``. Where there
            is no shared memory (``transport="pickle"``/``"ray"``, other nodes) or a
            ``recv`` gathers several calls, what is returned is an array of its own
            (as with ``copy=True``: Ray's read-only arrays are copied).
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
            carrying infos and errors; for actors on other nodes, the same channel over
            TCP to the actor's node (key-authenticated both ways; arrays as raw
            buffers), Ray calls only if that cannot be opened. ``"pickle"``: the
            channel alone, arrays pickled through it. ``"ray"``: Ray calls only.
            Either way Ray creates, supervises and kills the actors.
        spin_us: with ``transport="auto"``, how long (µs) a host actor on this node
            looks for the next call before it sleeps, yielding its core between looks.
            For cheap envs stepped in a tight loop a few hundred µs spares each call a
            wake-up and cold caches (CartPole, 64 envs in two actors on 2 cores: see
            README "Benchmarks"), at the price of that CPU when the next call is late.
            None (default): the library picks (0 today: a spin did not measure faster
            on the 2-core test machine); 0: it sleeps at once; a number: it always
            spins that long.
            ``"auto"``: 500 µs, but only while the calls come back-to-back (the last
            one came within it); after a longer gap (a learner update, a trainer
            pacing its steps) the actor sleeps at once until they do again. No spin
            when a call's observations pass 64 KiB (8 Atari-sized frames): the driver
            then needs the core a spinning actor would hold. Not the default: on the
            shared 2-core test machine it did not measure faster than 0 (README
            "Benchmarks", issue 34).
        splits_per_actor: send each actor's envs as this many calls (Sample Factory's
            ``worker_num_splits``): an actor steps one split while the driver handles
            the reply of another, so with one actor per spare core the driver and the
            actors keep their cores busy instead of taking turns (images, 16 envs in one
            actor on 2 cores: see README "Benchmarks"). None (default): the library
            picks (2 where it leaves the driver a core, else 1; see ``envs_per_actor``).
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
        lease: a :class:`~remote_env.driver.lease.HeldLease` on the actors (a pool's, see
            :meth:`from_pool`): its epoch goes with every call,
            each public call checks it is held, and :meth:`close` releases it.
        runtime: what stands in for the ``ray`` module (None: Ray itself). A pool leased
            over HTTP passes :class:`~remote_env.driver.http_lease.NoRay`: its actors
            are reached over TCP only, and no Ray is imported.

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
        batch_wait_ms: float = options_mod.DEFAULT_BATCH_WAIT_MS,
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
        spin_us: float | str | None = None,
        splits_per_actor: int | None = None,
        existing_actors: Sequence[Any] | None = None,
        on_sub_environment_created: Callable[[Any, int], None] | None = None,
        actor_options: Mapping[str, Any] | None = None,
        address: str | None = None,
        actor_replacer: Callable[[Any, str], Any] | None = None,
        registry: Any = None,
        pool: str = "default",
        metrics: PoolMetrics | None = None,
        lease: HeldLease | None = None,
        runtime: Any = None,
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
        options_mod.check(envs_per_actor=envs_per_actor, threads_per_actor=threads_per_actor,
                          max_restarts=max_restarts, batch_wait_ms=batch_wait_ms,
                          step_timeout_s=step_timeout_s, restart_backoff_s=restart_backoff_s,
                          transport=transport, observation_mode=observation_mode,
                          # None: the library picks (tuning); a value is checked as given
                          spin_us=0.0 if spin_us is None else spin_us,
                          splits_per_actor=1 if splits_per_actor is None else splits_per_actor,
                          start_timeout_s=start_timeout_s, close_timeout_s=close_timeout_s)
        n = len(env_fns)
        self.pool = pool
        self._lease = lease
        self.metrics = metrics if metrics is not None else PoolMetrics(registry, pool)
        # the ray module, or what stands in for it where actors are reached over TCP
        # only (a pool leased over HTTP: remote_env.driver.http_lease.NoRay)
        self._ray = runtime if runtime is not None else ray_connect.connect(address)
        #: the layout, splits and spin this env runs with and why (see :mod:`tuning`)
        self.tuning = self._tune(env_fns, n, envs_per_actor, splits_per_actor, spin_us,
                                 float(batch_wait_ms),
                                 existing=existing_actors is not None, transport=transport,
                                 threads=threads_per_actor, actor_options=actor_options)
        log.info("RemoteVectorEnv(pool=%r): %s", pool, self.tuning.describe(n))
        envs_per_actor = self.tuning.envs_per_actor
        spin_us, splits_per_actor = self.tuning.spin_us, self.tuning.splits_per_actor
        o = self._options = options_mod.Options(
            num_envs=n, envs_per_actor=envs_per_actor, batch_wait_ms=float(batch_wait_ms),
            autoreset_mode=AutoresetMode(autoreset_mode), copy=copy,
            observation_mode=observation_mode, restart_failed=restart_failed_sub_environments,
            max_restarts=max_restarts, restart_backoff_s=restart_backoff_s,
            step_timeout_s=step_timeout_s, start_timeout_s=start_timeout_s,
            close_timeout_s=close_timeout_s, threads_per_actor=threads_per_actor,
            transport=transport, spin_us=spin_us if spin_us == "auto" else float(spin_us),
            splits_per_actor=int(splits_per_actor),
            actor_options=dict(actor_options or {}))
        self._state = _State.IDLE
        # the results being handed out by this public call and the state to go back to
        # if an interrupt arrives before it returns (see _settle)
        self._handed: tuple[Batches, _State] | None = None
        self._ledger = EnvLedger(n, adopted=existing_actors is not None)
        self._hosts = HostTable(o, env_fns, self._ray, self._ledger, self.metrics,
                                on_sub_environment_created)
        try:
            # anything raised (an interrupt included) before the env is whole kills the
            # actors created so far: nothing outlives a constructor that failed
            infos = self._hosts.create(list(existing_actors or []))
            self._set_up(infos, actor_replacer)
        except BaseException:
            self._hosts.kill_owned()
            raise
        self.closed = False

    # ------------------------------------------------------------------ set-up
    def _tune(self, env_fns: list[EnvFn], n: int, envs_per_actor: int | None,
              splits_per_actor: int | None, spin_us: float | str | None,
              batch_wait_ms: float, *, existing: bool,
              transport: str, threads: int,
              actor_options: Mapping[str, Any] | None) -> tuning_mod.Tuning:
        """What the options left to the library (None) are: measured on one env built
        here when the layout is ours to choose and the rule's measurements hold (the
        actors on this node, reached through shared memory), else the defaults of before."""
        cores = int(self._ray.cluster_resources().get("CPU", 1))
        why = ""
        if envs_per_actor is not None:
            why = "envs_per_actor given"
        elif existing:
            why = "existing actors"
        elif batch_wait_ms > 0:  # recv gathers the splits: the rule keeps the layout
            why = f"batch_wait_ms={batch_wait_ms:g}"
        elif transport != "auto":
            why = f"transport={transport!r}"
        elif threads != 1:
            why = "threads_per_actor given"
        elif actor_options:
            why = "actor_options given (placement, CPUs)"
        elif len([x for x in self._ray.nodes() if x.get("Alive")]) != 1:
            why = "several nodes"
        measured = (tuning_mod.Measured(cores, n, unmeasured=why) if why
                    else tuning_mod.probe(env_fns[0], cores, n))
        return tuning_mod.choose(measured, envs_per_actor=envs_per_actor,
                                 splits_per_actor=splits_per_actor, spin_us=spin_us,
                                 batch_wait_ms=batch_wait_ms)

    def _set_up(self, infos: list[dict[str, Any]],
                replacer: Callable[[Any, str], Any] | None) -> None:
        o, n = self._options, self._options.num_envs
        info = infos[0]
        self.multi_agent = bool(info["multi_agent"])
        if not self.multi_agent:
            obs_spaces, act_spaces = self._hosts.env_spaces(infos)
            self.single_observation_space, self.observation_space = checks.spaces(
                o.observation_mode, obs_spaces, act_spaces, n)
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
        self.metadata["autoreset_mode"] = o.autoreset_mode
        self.render_mode = info["render_mode"]
        self._assembler = Assembler(self.single_observation_space, n,
                                    multi_agent=self.multi_agent, copy=o.copy)
        auto = o.spin_us == "auto"
        spin_us = (options_mod.auto_spin_us(self.single_observation_space, o.envs_per_actor,
                                            o.splits_per_actor)
                   if auto else float(o.spin_us))
        self._links = Links(self._ray, transport=o.transport, spin_us=spin_us, adaptive=auto,
                            open_timeout_s=o.start_timeout_s,
                            epoch=None if self._lease is None else self._lease.epoch)
        for handle in self._hosts.handles():
            self._links.add(handle)
        self._recovery = Recovery(o, self._hosts, self._links, self._ledger, self.metrics,
                                  self._ray, replacer)
        self._inflight = InFlight(n)
        reader = ResultReader(o.autoreset_mode, self._hosts, self._recovery, self._ledger,
                              self.metrics, self._assembler, self._ray)
        self._dispatch = Dispatcher(splits_per_actor=o.splits_per_actor, hosts=self._hosts,
                                    links=self._links, recovery=self._recovery,
                                    inflight=self._inflight, reader=reader,
                                    ledger=self._ledger, ray=self._ray)
        self.metrics.track_states(self._state_counts)

    @staticmethod
    def host_class() -> Any:
        """The Ray actor class hosting sub-envs (for ``existing_actors``)."""
        return hosts_mod.remote_host()

    @classmethod
    def from_actors(cls: type[_E], actors: Sequence[Any], *, sizes: Sequence[int] | None = None,
                    lease: HeldLease | None = None, **kwargs: Any) -> _E:
        """A vector env over started host actors someone else owns (a pool's, say).

        No make-env callables are needed: the actors already hold their envs.
        ``sizes`` are their env counts when known (else each is asked); pass an
        ``actor_replacer`` so a failed actor is replaced by its owner, since this env
        cannot rebuild it, and the ``lease`` it holds on them if any. Other keywords are
        :class:`RemoteVectorEnv`'s.
        """
        if sizes is None:
            ray = ray_connect.connect(kwargs.get("address"))
            sizes = [int(d["num_envs"]) for d in ray.get([a.describe.remote() for a in actors])]
        return cls([hosts_mod.NotOurs()] * sum(sizes), existing_actors=actors, lease=lease,
                   **kwargs)

    @staticmethod
    def from_pool(name: str, *, url: str | None = None, **kwargs: Any) -> RemoteVectorEnv:
        """Lease envs of the running pool ``name`` and return a vector env over them.

        Through Ray (arguments: :func:`remote_env.driver.attach.lease_pool`), or, given
        ``url`` (the pool's lease API, ``http://<pool>-head-svc:8267``), over HTTP
        and TCP with no Ray in this process (arguments, ``token``/``token_file``
        among them: :func:`remote_env.driver.http_lease.lease_pool`). From outside
        the cluster (one ``kubectl port-forward`` of the head service's lease port),
        ``relay=True`` (or the default "auto") steps through the pool server.

        Example:
            >>> envs = RemoteVectorEnv.from_pool("cartpole", num_envs=16)  # doctest: +SKIP
            >>> envs = RemoteVectorEnv.from_pool(  # doctest: +SKIP
            ...     "cartpole", url="http://cartpole-head-svc:8267",
            ...     token_file="/etc/envpool/lease-token/token", num_envs=8)
        """
        grant: Any
        if url is not None:
            from remote_env.driver import http_lease

            grant = http_lease.lease_pool(name, url=url, **kwargs)
        else:
            from remote_env.driver import attach

            grant = attach.lease_pool(name, **kwargs)
        try:
            return RemoteVectorEnv.from_actors(**grant.from_actors())
        except BaseException:
            grant.lease.release()
            raise

    # ---------------------------------------------------------------- options
    @property
    def num_envs(self) -> int:  # type: ignore[override]
        return self._options.num_envs

    @property
    def env_fns(self) -> list[EnvFn]:
        return self._hosts.env_fns

    @property
    def envs_per_actor(self) -> int:
        return self._options.envs_per_actor

    @property
    def batch_wait_ms(self) -> float:
        return self._options.batch_wait_ms

    @property
    def autoreset_mode(self) -> AutoresetMode:
        return self._options.autoreset_mode

    @property
    def copy(self) -> bool:
        return self._options.copy

    @property
    def observation_mode(self) -> Any:
        return self._options.observation_mode

    @property
    def restart_failed(self) -> bool:
        return self._options.restart_failed

    @property
    def max_restarts(self) -> int:
        return self._options.max_restarts

    @property
    def restart_backoff_s(self) -> float:
        return self._options.restart_backoff_s

    @property
    def step_timeout_s(self) -> float | None:
        return self._options.step_timeout_s

    @property
    def start_timeout_s(self) -> float | None:
        return self._options.start_timeout_s

    @property
    def close_timeout_s(self) -> float | None:
        return self._options.close_timeout_s

    @property
    def transport(self) -> str:
        return self._options.transport

    @property
    def spin_us(self) -> float | str:
        return self._options.spin_us

    @property
    def splits_per_actor(self) -> int:
        return self._options.splits_per_actor

    # ------------------------------------------------------------ read-only views
    @property
    def actors(self) -> list[Any]:
        """The host actor handles, in env order."""
        return self._hosts.handles()

    def actor_of(self, env_id: int) -> Any:
        return self._hosts.handle(int(self._hosts.layout.env_host[env_id]))

    @property
    def restart_counts(self) -> np.ndarray:
        """Restarts per sub-env (exceptions and actor replacements)."""
        return self._ledger.restart_counts()

    def hosts(self) -> list[HostView]:
        """A snapshot of each host actor: its envs, data path and health (debugging, tests)."""
        out = []
        for h in range(len(self._hosts)):
            chan, shared, tcp = self._links.describe(h)
            out.append(HostView(self._hosts.handle(h), self._hosts.env_ids(h).copy(),
                                self._hosts.owned(h), chan, shared, self._recovery.up(h),
                                self._recovery.retry_at(h), self._recovery.broken(h) is not None,
                                tcp))
        return out

    def in_flight(self) -> list[CallView]:
        """A snapshot of the host calls in flight (one per host split of each send)."""
        return self._inflight.views()

    def busy(self) -> np.ndarray:
        """A copy of which envs have a call in flight or a result not handed out yet."""
        return self._inflight.busy_mask()

    # ------------------------------------------------------------------- lease
    @property
    def lease(self) -> HeldLease | None:
        """The lease held on the actors (a pool's), or None."""
        return self._lease

    @property
    def lease_lost(self) -> bool:
        """The lease expired and another trainer took some of its envs: stop using them."""
        return self._lease is not None and self._lease.lost

    @property
    def lease_id(self) -> str | None:
        return None if self._lease is None else self._lease.lease_id

    @property
    def slots(self) -> list[int] | None:
        """The pool slots leased (None: not leased)."""
        return None if self._lease is None else list(self._lease.slots)

    def _check_lease(self) -> None:
        if self._lease is not None:
            self._lease.check()

    # ---------------------------------------------------------- public calls
    def _public_call(self) -> _PublicCall:
        """One public call: interrupts held until its state is whole (raised in its
        waits, or at its end: :mod:`remote_env.interrupts`), and settled at its end.

        Whatever it raises, an env error or an interrupt at any point, it ends in one
        consistent state. Either its calls are still pending and ``step_wait()``/
        ``recv()`` resumes them (an interrupt or timeout while waiting, as gymnasium's
        AsyncVectorEnv after a timeout), or it is over and the next call works (an env's
        error, a ``reset()`` cut short). An env is in flight, ready (its result
        received, not handed out) or failed; never lost.
        """
        return _PublicCall(self)

    def _settle(self, *, interrupted: bool = False) -> None:
        handed, self._handed = self._handed, None
        if handed is not None and (interrupted or interrupts.pending()):
            # interrupted while handing results out: they are put back and returned by
            # the next step_wait()/recv(), never lost (an error there ends the call: a
            # result that cannot be assembled would fail every retry)
            batches, state = handed
            self._inflight.put_back(batches)
            self._state = state
        if self._state is _State.RESET:  # reset() cut short: its calls are over
            self._inflight.orphan_all()
            self._state = _State.IDLE
        if not self._inflight and not self._inflight.has_ready:
            self._state = _State.IDLE

    def _give_up(self, exc: BaseException) -> None:
        """A step/reset raised an env's error: that call is over. What arrived rides on
        the exception (``exc.results``, as :meth:`recv` returns them); calls still in
        flight (a replacement's follow-up) are waited out before the next send."""
        batches = self._inflight.take_ready()
        if batches and isinstance(exc, Exception):
            try:
                exc.results = self._assembler.partial(batches)  # type: ignore[attr-defined]
            except Exception:  # the error is what matters
                pass
        self._inflight.orphan_all()
        self._state = _State.IDLE

    # ----------------------------------------------------------------- reset
    def reset(
        self,
        *,
        seed: int | Sequence[int | None] | None = None,
        options: dict[str, Any] | None = None,
    ) -> tuple[Any, dict[str, Any]]:
        """Reset all sub-envs (or those in ``options["reset_mask"]``), like ``SyncVectorEnv``.

        Cut short (an interrupt) or raising, the reset is over: the next call works
        (the calls it sent are waited out first).
        """
        self._check_lease()
        with self._public_call():
            self._check_idle("reset")
            n = self.num_envs
            seeds = checks.seeds(seed, n)
            options = dict(options) if options is not None else None
            mask = np.ones(n, dtype=np.bool_)
            if options is not None and "reset_mask" in options:
                mask = checks.reset_mask(options.pop("reset_mask"), n)
            env_ids = np.flatnonzero(mask)
            self._state = _State.RESET
            try:
                self._dispatch.submit(env_ids, [seeds[i] for i in env_ids], options,
                                      is_reset=True)
                self._ledger.mark_reset(env_ids)
                self._dispatch.wait_all(None)
            except Exception as exc:
                self._give_up(exc)
                raise
            obs, _, _, _, infos = self._assembler.full(self._inflight.take_ready())
            self._state = _State.IDLE
            return obs, infos

    def async_reset(
        self, *, seed: int | Sequence[int | None] | None = None, options: dict[str, Any] | None = None
    ) -> None:
        """Send a reset to every sub-env; :meth:`recv` returns them as they come (EnvPool style)."""
        self._check_lease()
        with self._public_call():
            self._check_idle("async_reset")
            seeds = checks.seeds(seed, self.num_envs)
            ids = np.arange(self.num_envs)
            self._state = _State.RECV  # what was sent is recv()'s, even if sending fails part way
            self._dispatch.submit(ids, seeds, dict(options) if options else None, is_reset=True)
            self._ledger.mark_reset(ids)

    def _check_idle(self, what: str) -> None:
        self._check_open()
        if self._inflight or self._inflight.has_ready:
            raise errors.AlreadyPendingCallError(
                f"Calling `{what}` while waiting for a pending call to `{self._pending_name()}` "
                f"to complete (finish it with {self._finish_with()})",
                self._pending_name(),
            )

    # ------------------------------------------------------------------ step
    def step(self, actions: Any) -> Results:
        """Step every sub-env with ``actions`` (batched as ``action_space``).

        Interrupted while waiting, the step stays pending: ``step_wait()`` returns it.
        """
        self.step_async(actions)
        return self.step_wait()

    def step_async(self, actions: Any) -> None:
        """Send ``actions`` to every sub-env; collect with :meth:`step_wait`."""
        self._check_lease()
        with self._public_call():
            self._check_idle("step_async")
            ids = np.arange(self.num_envs)
            self._ledger.check_reset(ids)
            acts = self._actions(actions, ids)
            self._state = _State.STEP
            try:
                self._dispatch.submit(ids, acts, None, is_reset=False)
            except Exception as exc:  # some envs sent, not all: no whole step to wait for
                self._give_up(exc)
                raise

    def step_wait(self, timeout: float | None = None) -> Results:
        """Wait for the step sent by :meth:`step_async`.

        Raises:
            multiprocessing.TimeoutError: not all envs answered within ``timeout``
                seconds (the call stays pending; call ``step_wait`` again). An
                interrupt (Ctrl-C) leaves it pending the same way.
            SubEnvironmentError: an env failed (restarts off, or out of them): the step
                is over; the results of the envs that did step are on the exception
                (``results``, as :meth:`recv` returns them, ids in ``info["env_id"]``).
        """
        with self._public_call():
            self._check_open()
            if self._state is not _State.STEP:
                raise errors.NoAsyncCallError(
                    "Calling `step_wait` without any prior call to `step_async`.", "step"
                )
            checks.duration("timeout", timeout, none="wait as long as it takes")
            t0 = time.perf_counter()
            try:
                self._dispatch.wait_all(timeout)
            except multiprocessing.TimeoutError:
                raise  # still pending
            except Exception as exc:
                self._give_up(exc)
                raise
            batches = self._inflight.take_ready()
            self._handed = (batches, _State.STEP)
            self._state = _State.IDLE
            result = self._assembler.full(batches)
            self.metrics.observe_poll(self.num_envs, time.perf_counter() - t0)
            self.metrics.steps.inc(self.num_envs)
            return result

    # ----------------------------------------------- dynamic batching (EnvPool)
    def send(self, actions: Any, env_ids: Sequence[int] | np.ndarray | None = None) -> None:
        """Step the sub-envs ``env_ids`` (all when None) with ``actions``, without waiting.

        ``actions`` holds one action per id, in the order of ``env_ids``: the action
        follows the id, whatever the order (as ``SyncVectorEnv`` given them in id order).
        """
        self._check_lease()
        with self._public_call():
            self._check_open()
            if self._state is _State.STEP:
                raise errors.AlreadyPendingCallError(
                    "send() called while a step_async() is pending; call step_wait() first",
                    "step")
            ids = checks.env_ids(env_ids, self.num_envs)
            busy = self._inflight.busy(ids)
            if len(busy):
                raise errors.AlreadyPendingCallError(
                    f"env ids {busy.tolist()} already have a call in flight; recv() their "
                    "results before sending them again",
                    "step",
                )
            self._ledger.check_reset(ids)
            acts = self._actions(actions, ids)
            self._state = _State.RECV  # what was sent is recv()'s, even if sending fails part way
            self._dispatch.submit(ids, acts, None, is_reset=False)

    def recv(self, timeout: float | None = None) -> Results:
        """Return the sub-envs that are ready within ``batch_wait_ms`` (at least one).

        At ``batch_wait_ms=0`` (the default) that is what is ready with the first call
        to finish: one actor's envs (one split's) or a few, not every env sent.

        Returns ``(obs, rewards, terminations, truncations, infos)`` for the ready
        envs only; their ids are in ``infos["env_id"]`` (ascending). An env whose
        actor hangs comes back within ``step_timeout_s + batch_wait_ms`` as a
        truncated step with ``info["error"]``, whatever the other envs do.

        Raises:
            NoAsyncCallError: nothing was sent.
            multiprocessing.TimeoutError: no env was ready within ``timeout`` seconds
                (the calls stay pending, as after an interrupt: recv() again).
            SubEnvironmentError: an env failed (restarts off, or out of them); that
                env's call is over, and what arrived with it is returned by the next
                ``recv()``.
        """
        with self._public_call():
            self._check_open()
            inflight = self._inflight
            if self._state is _State.STEP or not (inflight or inflight.has_ready):
                raise errors.NoAsyncCallError(
                    "recv() called with nothing sent; call send() or async_reset() first",
                    "step")
            checks.duration("timeout", timeout, none="wait as long as it takes")
            t0 = time.perf_counter()
            # results that arrived beside an error last time come first, without waiting;
            # a lost actor's envs may still be waiting for its replacement
            gather_s = self._options.batch_wait_ms / 1000
            while not inflight.has_ready:
                left = None if timeout is None else max(0.0, t0 + timeout - time.perf_counter())
                try:
                    keys, hung = self._dispatch.poll(every=False, timeout=left,
                                                     gather_s=gather_s)
                except multiprocessing.TimeoutError:
                    raise multiprocessing.TimeoutError(
                        f"recv() timed out after {timeout}s with no sub-env ready") from None
                self._dispatch.collect(keys, hung)
            batches = inflight.take_ready()
            self._handed = (batches, _State.RECV)
            result = self._assembler.partial(batches)
            self.metrics.observe_poll(len(result[4]["env_id"]), time.perf_counter() - t0)
            stepped = 0
            for ids, b in batches:
                if not b.is_reset:
                    stepped += len(ids)
            if stepped:
                self.metrics.steps.inc(stepped)
            return result

    def _actions(self, actions: Any, ids: np.ndarray) -> Any:
        if self.multi_agent:
            return checks.multi_agent_actions(actions, len(ids), ids)
        return checks.actions(self.single_action_space, actions, ids)

    def _check_open(self) -> None:
        if self.closed:
            raise errors.ClosedEnvironmentError(
                f"Trying to operate on `{type(self).__name__}`, after a call to `close()`."
            )

    def _pending_name(self) -> str:
        return "reset" if self._inflight.pending_reset else "step"

    def _finish_with(self) -> str:
        return "step_wait()" if self._state is _State.STEP else "recv()"

    # ------------------------------------------- call / get_attr / set_attr
    # As SyncVectorEnv: through the envs' wrappers (get_wrapper_attr /
    # set_wrapper_attr), so set_attr("gravity", 20.0) reaches the physics and not the
    # outermost wrapper; np_random_seed is the sub-envs' seeds.
    def call(self, name: str, *args: Any, env_ids: EnvIds = None, **kwargs: Any) -> tuple[Any, ...]:
        """Call ``name`` on every sub-env (or read it if not callable), through wrappers
        (``get_wrapper_attr``), as ``SyncVectorEnv`` does.

        ``env_ids`` (not in gymnasium's API, which always takes every env): only these
        sub-envs, results in their order, as SB3's ``env_method(..., indices=)``. Like
        SB3's ``indices``, the keyword is taken here: an env method's own ``env_ids``
        argument cannot be passed through ``call``.
        """
        ids = self._attr_ids(env_ids)
        if ids is not None and not len(ids):
            return ()
        self._check_open()
        by_env = self._dispatch.on_each_host("call", name, args, kwargs, env_ids=ids)
        return tuple(by_env[int(e)] for e in (range(self.num_envs) if ids is None else ids))

    def get_attr(self, name: str, *, env_ids: EnvIds = None) -> tuple[Any, ...]:
        """``name`` of every sub-env (of ``env_ids`` only, in their order, when given)."""
        return self.call(name, env_ids=env_ids)

    def set_attr(self, name: str, values: list[Any] | tuple[Any, ...] | Any, *,
                 env_ids: EnvIds = None) -> None:
        """Set ``name`` on every sub-env where a wrapper or the env has it
        (``set_wrapper_attr``); one value for all, or a list of ``num_envs`` (of
        ``len(env_ids)`` in their order when ``env_ids`` names some sub-envs)."""
        self._check_open()
        ids = self._attr_ids(env_ids)
        n = self.num_envs if ids is None else len(ids)
        if not isinstance(values, (list, tuple)):
            values = [values] * n
        if len(values) != n:
            raise ValueError(
                "Values must be a list or tuple with length equal to the number of environments. "
                f"Got `{len(values)}` values for {n} environments."
            )
        if not n:
            return
        value_of = dict(zip(range(n) if ids is None else ids.tolist(), values, strict=True))
        self._dispatch.on_each_host("set_attr", name,
                                    lambda mine: [value_of[int(e)] for e in mine], env_ids=ids)

    def env_is_wrapped(self, wrapper_class: type, *, env_ids: EnvIds = None) -> tuple[bool, ...]:
        """Whether each sub-env (of ``env_ids``) is wrapped in ``wrapper_class``
        somewhere in its gymnasium wrapper chain, as SB3's ``env_is_wrapped`` asks."""
        ids = self._attr_ids(env_ids)
        if ids is not None and not len(ids):
            return ()
        self._check_open()
        by_env = self._dispatch.on_each_host("is_wrapped", wrapper_class,  # type: ignore[arg-type]
                                             env_ids=ids)
        return tuple(bool(by_env[int(e)]) for e in (range(self.num_envs) if ids is None else ids))

    def _attr_ids(self, env_ids: EnvIds) -> np.ndarray | None:
        """``env_ids`` checked (distinct, in range); empty is allowed here (no call)."""
        if env_ids is None:
            return None
        if isinstance(env_ids, (int, np.integer)):
            env_ids = [int(env_ids)]
        if not len(env_ids):
            return np.zeros(0, dtype=np.int64)
        return checks.env_ids(env_ids, self.num_envs)

    @property
    def np_random_seed(self) -> tuple[int, ...]:  # type: ignore[override]
        """The sub-envs' seeds (``np_random_seed`` of each), as ``SyncVectorEnv`` gives."""
        return self.get_attr("np_random_seed")

    @property  # type: ignore[misc]
    def np_random(self) -> tuple[np.random.Generator, ...]:  # type: ignore[override]
        """Copies of the sub-envs' generators (they live in the actors)."""
        return self.get_attr("np_random")

    def render(self) -> tuple[Any, ...] | None:
        return self.call("render")

    # ------------------------------------------------------------------ close
    def close(self, **kwargs: Any) -> None:
        """Close the sub-envs (each one's own ``close()``, within ``close_timeout_s``) and
        kill the actors this vector env created. Idempotent; interrupted, it is done
        all the same (the actors are killed) and the interrupt is raised. A lease held
        on the actors is released (they stay warm for the next trainer)."""
        if self.closed:
            return
        try:
            self.close_extras(**kwargs)
        finally:
            self.closed = True

    def close_extras(self, **kwargs: Any) -> None:
        try:
            with interrupts.deferred():  # raised in the wait for the envs' close(), or after
                try:
                    self._links.close_all()
                    self._inflight.abandon()
                    self.metrics.untrack_states()
                    self._recovery.shutdown()
                    if self._ray.is_initialized():
                        self._close_envs()
                finally:
                    if self._ray.is_initialized():
                        self._hosts.kill_owned()
        finally:
            if self._lease is not None:
                self._lease.release()

    def _close_envs(self) -> None:
        """Each owned actor's sub-envs closed (bounded by ``close_timeout_s``), before the
        actors are killed; envs whose close raised or did not finish are named in a
        warning. Actors someone else owns (a pool's) keep their envs for the next user."""
        # not the actors this env killed itself (failed envs, no restarts): nothing to close
        closable = [h for h in range(len(self._hosts))
                    if self._hosts.owned(h) and self._recovery.up(h)
                    and not self._ledger.all_failed(self._hosts.env_ids(h))]
        problems = self._hosts.close_envs(closable, self._options.close_timeout_s)
        if problems:
            warnings.warn("RemoteVectorEnv.close(): some sub-environments did not close "
                          "cleanly: " + "; ".join(problems), RuntimeWarning, stacklevel=3)

    def _state_counts(self) -> dict[str, int]:
        restarting = self._recovery.replacing_envs()
        failed = self._ledger.failed_count()
        return {"running": self.num_envs - restarting - failed, "restarting": restarting,
                "failed": failed}

    def __enter__(self) -> RemoteVectorEnv:
        """``with RemoteVectorEnv(...) as envs:`` closes the envs (and the actors this
        vector env created) on the way out, as ``with gym.make(...)`` does for one env."""
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()  # an exception inside the block propagates

    def __repr__(self) -> str:
        pool = "" if self._lease is None else f"pool={self.pool!r}, "
        o = self._options
        return (f"RemoteVectorEnv({pool}num_envs={self.num_envs}, actors={len(self._hosts)}, "
                f"envs_per_actor={self.envs_per_actor}, splits_per_actor={o.splits_per_actor}, "
                f"spin_us={o.spin_us!r}; {self.tuning.why})")
