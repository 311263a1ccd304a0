"""A trainer's side of a running pool: lease warm env actors, step them directly.

``RemoteVectorEnv.from_pool("cartpole")`` calls :func:`lease_pool`: it finds the
pool's lease actor in Ray namespace ``envpool-cartpole``, leases whole env actors (two
trainers never share one) and returns a :class:`PoolGrant`: the actors, the lease
(:class:`_LeaseKeeper`, a :class:`~remote_env.driver.lease.HeldLease`) and the options
the pool decides, from which the vector env is built (same API, same metrics, no extra
hop: trainers call the actors directly). This module does not build the vector env
itself, so the driver's imports run one way (the facade over this). A heartbeat thread renews the lease; ``close()`` releases it;
a trainer that dies stops renewing; the pool server releases its lease as soon as
Ray reports its holder dead (the Ray actor it runs in, e.g. an RLlib EnvRunner, or
its driver's job: :func:`holder`), else it expires after ``lease_timeout_s``. When an actor dies or hangs, the trainer asks the pool
server for the replacement rather than creating one (one owner of restarts).

Example:
    >>> envs = RemoteVectorEnv.from_pool("cartpole", address="ray://head:10001", num_envs=16)
    >>> obs, info = envs.reset(seed=0)
    >>> obs, rew, term, trunc, info = envs.step(envs.action_space.sample())
    >>> envs.close()   # the actors stay warm for the next trainer
"""

from __future__ import annotations

import functools
import logging
import os
import socket
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final

from gymnasium.vector import AutoresetMode

from remote_env import errors, ray_connect
from remote_env import spec as spec_mod
from remote_env.driver import attach_options, heartbeat
from remote_env.pool import holders, lease_actor, lease_rules
from remote_env.pool import slot as pool_slot

log = logging.getLogger(__name__)

DEFAULT_LEASE_TIMEOUT_S: Final = 60.0
#: How long one lease request may take beyond ``wait_s``: a grant fences its actors
#: (up to leases.FENCE_TIMEOUT_S) before it returns.
ACQUIRE_TIMEOUT_S: Final = 30.0


class PoolNotFoundError(RuntimeError):
    """No pool of that name runs on the Ray cluster."""


#: This trainer's lease expired and another trainer took (some of) its envs; raised by
#: the env actors themselves (fenced leases) and by the registry.
LeaseLostError = errors.LeaseLostError


class _LeaseKeeper:
    """A Ray trainer's lease, renewed by a :class:`~remote_env.driver.heartbeat.Heartbeat`.
    Holds no reference to the env (GC).

    The vector env's :class:`~remote_env.driver.lease.HeldLease`: its epoch goes with every
    call, ``check()`` before each public call, ``release()`` on close.
    """

    def __init__(self, registry: Any, lease_id: str, trainer: str, slots: Sequence[int],
                 ttl_s: float, epoch: int = 0, holder: str = "",
                 client_address: str | None = None, namespace: str | None = None) -> None:
        self.registry = registry
        self.holder = holder
        #: A Ray client address (``ray://...``) this trainer attached through: its
        #: connection ends at the head's client server, so the head's loss ends it while
        #: the trainer steps on over TCP; a renewal connects again (see _reconnect).
        self.client_address = client_address
        self.namespace = namespace
        self.lease_id = lease_id
        self.epoch = epoch
        self.trainer = trainer
        self.slots = list(slots)
        self.ttl_s = ttl_s
        #: connections to Ray made again by renewals (the head restarted)
        self.reconnects = 0
        self.beat = heartbeat.Heartbeat(lease_id[:8], ttl_s, self._renew)

    @property
    def lost(self) -> bool:
        return self.beat.lost

    @property
    def _client(self) -> bool:
        return (self.client_address or "").startswith("ray://") and self.namespace is not None

    def _renew(self) -> bool:
        """One renewal (the heartbeat's call). A Ray client trainer whose connection ended
        (the head pod was lost) connects again first, and renews at once on the new one."""
        import ray

        if self._client and not ray.is_initialized():
            self._reconnect()
        try:
            return self._ask()
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError,
                ray.exceptions.RayTaskError):
            raise  # the lease actor restarting (or failing): the connection is fine
        except Exception:
            # Anything else is Ray client's own: a ConnectionError ("the Ray client has
            # already been disconnected", after a new head's client server answered
            # NOT_FOUND to this client's id), or, seen once after that, a RuntimeError
            # ("release unlocked lock") on every call. ray.is_initialized() may still say
            # True: the connection is gone for good.
            if not self._client:
                raise
            self._reconnect()
            return self._ask()

    def _ask(self) -> bool:
        import ray

        args = (self.lease_id, self.trainer, self.slots, self.ttl_s, self.epoch)
        return bool(_with_holder(lambda *a: ray.get(self.registry.renew.remote(*a),
                                                    timeout=self.ttl_s / 3),
                                 args, self.holder))

    def _reconnect(self) -> None:
        """Connect again when the Ray client connection is gone (the head pod was lost and
        a new one serves, under GCS fault tolerance), find the lease actor again, and
        take this process's new Ray identity as the lease's holder (the old job died with
        the old head; the pool server would reclaim a lease whose holder it sees dead).

        Only for a Ray client trainer: a driver on a Ray node keeps its connection (its
        raylet waits for the GCS). The env actors' handles of the old connection are not
        needed for stepping over TCP; the lease is renewed through the new one.

        Raises:
            ConnectionError: the new head is not serving yet (the heartbeat tries again).
        """
        import ray

        assert self.client_address is not None and self.namespace is not None
        ray.shutdown()  # the dead client's state
        ray_connect.connect(self.client_address, wait_s=self.ttl_s / 3)
        self.registry = lease_actor.get_lease_actor(self.namespace)
        if self.holder:
            self.holder = holder() or self.holder
        self.reconnects += 1
        log.warning("lease %s: connected to Ray again at %s (the head restarted); holder %s",
                    self.lease_id[:8], self.client_address, self.holder or "-")

    def check(self) -> None:
        if self.lost:
            raise LeaseLostError(
                f"the lease on slots {self.slots} expired (no heartbeat for {self.ttl_s}s) and "
                "another trainer leased some of them; attach again"
            )

    def release(self) -> None:
        import ray

        self.beat.stop()
        if not ray.is_initialized():
            return
        try:
            ray.get(self.registry.release.remote(self.lease_id), timeout=10)
        except Exception as exc:  # it expires on its own anyway
            log.warning("lease %s: release failed (%s); it expires in %ss", self.lease_id[:8],
                        exc, self.ttl_s)


class _PoolReplacer:
    """``actor_replacer`` for RemoteVectorEnv: the pool server replaces, we wait."""

    def __init__(self, registry_of: Callable[[], Any], namespace: str, slot_of: dict[str, int],
                 first_env: dict[int, int], timeout_s: float, lease_id: str,
                 serve_mode: Callable[[Sequence[Any]], None] = lambda handles: None) -> None:
        #: the lease actor's handle now: the lease's, which a renewal that connected to
        #: Ray again (the head restarted) replaced
        self.registry_of = registry_of
        #: the replacement (built in the pool's own mode) serves this lease's mode too
        self.serve_mode = serve_mode
        self.lease_id = lease_id
        self.namespace = namespace
        self.slot_of = slot_of
        self.first_env = first_env
        self.timeout_s = timeout_s

    def __call__(self, failed: Any, reason: str) -> Any:
        import ray

        actor_id = failed._actor_id.hex()
        slot = self.slot_of[actor_id]
        env = self.first_env[slot]
        deadline = time.monotonic() + self.timeout_s
        self._registry_call(deadline, "request_replace", slot, actor_id, reason, self.lease_id)
        while True:
            left = deadline - time.monotonic()
            res = self._registry_call(deadline, "wait_for_replacement", slot, actor_id,
                                      max(0.0, min(left, 10.0)), self.lease_id)
            if "slot" in res:
                info: pool_slot.SlotInfo = res["slot"]
                handle = ray.get_actor(info.actor_name, namespace=self.namespace)
                self.serve_mode([handle])
                self.slot_of[info.actor_id] = slot
                return handle
            if "removed" in res:
                raise errors.SubEnvironmentFailedError(
                    env, f"the pool scaled away the actor hosting it ({reason} reported); "
                    "attach again for new envs")
            if "failed" in res:
                raise errors.SubEnvironmentFailedError(
                    env, f"the pool server gave up on its actor: {res['failed'].last_error}")
            if time.monotonic() >= deadline:
                seen = res.get("server_seen_s_ago")
                hint = ("the pool server has never synced" if seen is None
                        else f"the pool server last synced {seen:.0f}s ago")
                raise errors.SubEnvironmentFailedError(
                    env, f"its actor failed ({reason}) and the pool server did not replace it "
                    f"within {self.timeout_s:.0f}s ({hint}; is `envpool serve` running?)")

    def _registry_call(self, deadline: float, method: str, *args: Any) -> Any:
        """Call the registry, riding out its restart (Ray brings it back, empty)."""
        import ray

        while True:
            try:
                return ray.get(getattr(self.registry_of(), method).remote(*args))
            except errors.LeaseLostError as exc:  # Ray's error is also an instance of it
                raise errors.LeaseLostError(str(getattr(exc, "cause", None) or exc)) from None
            except ray.exceptions.RayActorError:
                if time.monotonic() >= deadline:
                    raise
                time.sleep(0.2)


@dataclass(frozen=True)
class PoolGrant:
    """What a lease gives a trainer: ``RemoteVectorEnv.from_actors(**grant.from_actors())``."""

    handles: list[Any]
    sizes: list[int]
    lease: _LeaseKeeper
    replacer: _PoolReplacer
    options: dict[str, Any]

    def from_actors(self) -> dict[str, Any]:
        return {"actors": self.handles, "sizes": self.sizes, "lease": self.lease,
                "actor_replacer": self.replacer, **self.options}


def lease_pool(
    name: str,
    *,
    address: str | None = None,
    num_envs: int | None = None,
    namespace: str | None = None,
    lease_timeout_s: float = DEFAULT_LEASE_TIMEOUT_S,
    wait_s: float = 0.0,
    replace_timeout_s: float = 300.0,
    trainer: str | None = None,
    reclaim: bool = True,
    autoreset_mode: str | AutoresetMode | None = None,
    **kwargs: Any,
) -> PoolGrant:
    """Lease envs of the running pool ``name`` (``RemoteVectorEnv.from_pool``'s work).

    Args:
        name: the pool (the EnvPool's ``metadata.name``).
        address: Ray address when Ray is not initialized yet: ``"ray://host:10001"``
            (Ray client), ``"host:6379"`` or ``"auto"``; default ``$RAY_ADDRESS``, else
            ``"auto"`` (the local Ray / in-cluster head).
        num_envs: envs to lease (whole actors: a sum of their sizes); None leases all
            free ones.
        namespace: Ray namespace of the pool (default ``envpool-<name>``).
        lease_timeout_s: the lease expires this long after the last heartbeat (a
            dead trainer's envs return to the pool after it).
        wait_s: wait up to this long for the Ray cluster to answer, the pool to exist
            and enough free envs (others' leases ending, the pool starting); 0 fails
            at once. To ask for free envs at once but give the connection time (a
            Ray client's head starts a server per client), connect first:
            ``remote_env.ray_connect.connect(address, default="auto", wait_s=60)``.
        replace_timeout_s: how long a step waits for the pool server to replace a
            failed actor before raising.
        trainer: a name for this trainer in the pool's ``/status`` (default host:pid).
        reclaim: record this process's Ray identity (:func:`holder`) with the lease,
            so the pool server frees it as soon as Ray reports this actor or driver
            dead; False: the lease ends only by ``close()`` or ``lease_timeout_s``.
        autoreset_mode: the gymnasium ``AutoresetMode`` (or its value: ``"NextStep"``,
            ``"SameStep"``, ``"Disabled"``) this trainer steps in; the leased actors
            serve this lease in it (TorchRL wants SameStep or Disabled, RLlib NextStep).
            None: the pool spec's ``autoresetMode``. When the actors last served
            another mode, every env must be reset before its first step.
        **kwargs: :class:`RemoteVectorEnv` options (``batch_wait_ms``, ``copy``,
            ``step_timeout_s``, ``registry``, ...). Defaults come from the pool spec.

    Raises:
        ValueError: ``autoreset_mode`` is not an autoreset mode, or the pool's actors
            (of a version before per-lease modes) cannot serve it.
        PoolNotFoundError: no pool ``name`` on this Ray cluster.
        lease_actor.LeaseError: not enough free envs within ``wait_s``, or the
            pool's registry did not answer within it (it was restarting).
    """
    attach_options.check_kwargs(kwargs, lease_timeout_s)
    # before a lease is taken: a typo costs nobody's envs
    asked = (None if autoreset_mode is None
             else attach_options.autoreset_mode(name, autoreset_mode))
    # the local Ray / in-cluster head; a head still starting is waited for like the pool
    ray_connect.connect(address, default="auto", wait_s=wait_s)
    ns = namespace or spec_mod.ray_namespace(name)
    # a trainer started with its pool (a Job beside `kubectl apply`) waits for it too
    deadline = time.monotonic() + wait_s
    while True:
        try:
            registry = lease_actor.get_lease_actor(ns)
            break
        except ValueError:
            if time.monotonic() >= deadline:
                raise PoolNotFoundError(
                    f"no pool {name!r} on this Ray cluster (no actor {lease_actor.LEASE_ACTOR_NAME!r} "
                    f"in Ray namespace {ns!r}) after waiting {wait_s:g}s: is `envpool serve` "
                    "running for it?"
                ) from None
            time.sleep(0.5)
    who = trainer or f"{socket.gethostname()}:{os.getpid()}"
    ray_holder = holder() if reclaim else ""
    lease = _acquire(registry, who, num_envs, lease_timeout_s, wait_s, ray_holder)
    keeper = _LeaseKeeper(registry, lease["lease_id"], who,
                          [s.slot for s in lease["slots"]], lease_timeout_s, lease["epoch"],
                          ray_holder, client_address=address or os.environ.get("RAY_ADDRESS"),
                          namespace=ns)
    try:
        return _build(name, ns, lease, keeper, replace_timeout_s, asked, kwargs)
    except BaseException:
        keeper.release()
        raise


def holder() -> str:
    """This process's Ray identity as a lease holder
    (:func:`~remote_env.pool.lease_rules.holder_id`): the actor it runs in, else its
    job when it is the driver; "" otherwise (a task's worker dies without its job):
    such a lease ends only by its ttl."""
    import ray

    try:
        ctx = ray.get_runtime_context()
        worker = getattr(ctx, "worker", None)  # None: a Ray client's context
        is_driver = worker is not None and worker.mode == ray.SCRIPT_MODE
        actor_id = ctx.get_actor_id()
        restarts = holders.actor_restarts(actor_id) if actor_id else None
        return lease_rules.holder_id(actor_id, ctx.get_job_id(), is_driver, restarts)
    except Exception as exc:  # no identity: the ttl alone ends the lease
        log.debug("no Ray identity for the lease holder: %s", exc)
        return ""


def _with_holder(call: Callable[..., Any], args: tuple[Any, ...], ray_holder: str) -> Any:
    """``call(*args, ray_holder)``; a lease actor older than lease reclaim takes no holder
    (a trainer newer than its pool, mid-upgrade): then ``call(*args)``, without reclaim."""
    if not ray_holder:
        return call(*args)
    try:
        return call(*args, ray_holder)
    except Exception as exc:
        # Ray client checks the signature here (TypeError); Ray raises it from the actor
        # (a RayTaskError that is also a TypeError)
        if not isinstance(exc, TypeError) or "argument" not in str(exc):
            raise
        log.warning("the pool's lease actor predates lease reclaim: this lease ends with its "
                    "TTL only (upgrade the pool)")
        return call(*args)


def _acquire(registry: Any, who: str, num_envs: int | None, ttl_s: float,
             wait_s: float, ray_holder: str = "") -> dict[str, Any]:
    import ray

    deadline = time.monotonic() + wait_s
    told_restarted = False
    # ours, so a retry of a call that ran without our hearing is the same lease
    lease_id = uuid.uuid4().hex
    while True:
        try:
            left = max(0.0, deadline - time.monotonic()) + ACQUIRE_TIMEOUT_S
            lease: dict[str, Any] = _with_holder(
                lambda *a, t=left: ray.get(registry.acquire.remote(*a), timeout=t),
                (who, num_envs, ttl_s, lease_id), ray_holder)
            return lease
        except lease_actor.LeaseError:
            if time.monotonic() >= deadline:
                raise
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError) as exc:
            # The registry is restarting (Ray brings it back, with its leases): a
            # transient like a pool still starting. Ray fails each caller's first call
            # after a restart even once the registry is back: ask again, even at wait_s=0.
            if isinstance(exc, ray.exceptions.ActorUnavailableError) and not told_restarted:
                told_restarted = True
                continue
            if time.monotonic() >= deadline:
                raise lease_actor.LeaseError(
                    f"the pool's registry did not answer within wait_s={wait_s:g}s "
                    f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}); "
                    "it restarts on its own: attach again, or give wait_s") from exc
        time.sleep(min(0.2, max(0.0, deadline - time.monotonic())))


def serve_mode(name: str, handles: Sequence[Any], epoch: int, mode: AutoresetMode,
               pool_mode: AutoresetMode) -> None:
    """Have the leased actors serve lease ``epoch`` in ``mode`` (each one switches, and a
    newer lease starts again in the pool's own mode).

    Raises:
        ValueError: an actor of a version before per-lease modes serves only the pool's.
    """
    import ray

    refs = []
    for handle in handles:
        try:
            refs.append(handle.lease_mode.remote(epoch, mode.value))
        except AttributeError:  # an actor of an older version: no such method
            if mode is not pool_mode:
                raise ValueError(
                    f"pool {name!r} cannot serve autoreset_mode={mode.value!r}: its actors "
                    f"predate per-lease autoreset modes and serve only the spec's "
                    f"{pool_mode.value!r}; ask for {pool_mode.value!r} (or leave "
                    "autoreset_mode out), or update the pool") from None
    ray.get(refs)


def _build(name: str, ns: str, lease: dict[str, Any], keeper: _LeaseKeeper,
           replace_timeout_s: float, asked: AutoresetMode | None,
           kwargs: dict[str, Any]) -> PoolGrant:
    import ray

    slots: list[pool_slot.SlotInfo] = lease["slots"]
    pool_mode = AutoresetMode(spec_mod.parse_manifest(lease["pool_info"]["document"]).autoreset_mode)
    mode = pool_mode if asked is None else asked
    options = attach_options.pool_options(name, lease["pool_info"]["document"], kwargs,
                                          mode=mode.value)
    handles = [ray.get_actor(s.actor_name, namespace=ns) for s in slots]
    serve_mode(name, handles, keeper.epoch, mode, pool_mode)
    first_env: dict[int, int] = {}
    n = 0
    for s in slots:
        first_env[s.slot] = n
        n += s.num_envs
    replacer = _PoolReplacer(lambda: keeper.registry, ns, {s.actor_id: s.slot for s in slots}, first_env,
                             replace_timeout_s, keeper.lease_id,
                             functools.partial(serve_mode, name, epoch=keeper.epoch, mode=mode,
                                               pool_mode=pool_mode))
    return PoolGrant(handles, [s.num_envs for s in slots], keeper, replacer, options)
