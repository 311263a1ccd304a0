"""The pool server: owns a pool's env actors, keeps them healthy and at size.

It runs beside the Ray head (``envpool serve``, the head pod's sidecar in-cluster;
in-process for ``envpool run``) and:

* creates ``SubEnvHost`` actors, named ``host-<slot>-g<generation>`` and detached,
  in the pool's Ray namespace, so they outlive trainers and the pool server;
* re-adopts the pool when it restarts: the lease actor's layout (every slot,
  with its restarts and streak, including those in restart backoff) and the named
  actors together; the leases stay in the lease actor (:mod:`remote_env.pool.lease_actor`);
* pings every actor; a dead one (process killed, node lost) or one that does not
  answer within ``faultTolerance.stepTimeoutSeconds`` (or does not finish ``start()``,
  its envs' constructors, within ``startTimeoutSeconds``) is killed and replaced, with
  exponential backoff and at most ``maxRestarts`` consecutive failures; trainers
  report the failures they see and wait for the replacement (one owner of restarts);
* rolls a new actor build (env, runtimeEnv, envsPerActor, actor settings) through the
  running pool: free actors are rebuilt in place, at most ``updateStrategy.maxUnavailable``
  envs at a time, a leased one only once its lease ends (:mod:`remote_env.pool.rollout`);
* scales to ``spec.replicas`` without touching surviving actors: new actors are
  added, and scaling down removes free (un-leased) actors only, newest first (a
  free actor is cut to a smaller one only when no whole actor fits the excess);
  the lease actor is asked at the moment of removal
  (:meth:`~remote_env.pool.lease_actor.LeaseActor.withdraw`), so an actor leased
  since the last pass stays; leased envs above the new size go when their lease ends;
* serves ``/metrics``, ``/healthz`` and ``/status`` (JSON) over HTTP and, in-cluster,
  patches its EnvPool's ``status.pool`` (:mod:`remote_env.pool.kube_report`).

Example (local Ray):
    >>> import ray
    >>> from remote_env import spec as spec_mod
    >>> ray.init()
    >>> spec = spec_mod.parse_spec({"env": {"id": "CartPole-v1"}, "replicas": 4,
    ...                              "envsPerActor": 2}, name="cp")
    >>> server = PoolServer(spec, http_port=0)
    >>> server.start_background()
    >>> server.wait_ready(60)
    >>> server.close(destroy=True)
"""

from __future__ import annotations

import http.server
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from prometheus_client import CollectorRegistry

from remote_env import spec as spec_mod
from remote_env.metrics import PoolMetrics
from remote_env.pool import (
    holders,
    http_server,
    launch,
    lease_actor,
    lease_api,
    lease_store,
    relay,
    slot,
    supervisor,
)
from remote_env.pool import snapshot as snapshot_mod

log = logging.getLogger(__name__)

#: Seconds between reads of Ray's node table (a GCS call) for the worker host names.
NODES_REFRESH_S = 5.0
#: How long a starting pool server waits for a restarting lease actor. With GCS fault
#: tolerance the head pod's loss restarts the pool server and the lease actor together
#: (both live on the head): the lease actor comes back once the new head's node joins
#: and has rebuilt its leases from the GCS's KV; until then Ray answers
#: ActorUnavailableError.
LEASE_ACTOR_RESTART_S = 180.0
#: Reclaimed leases kept for ``/status?detail=1`` (newest last).
RECLAIMED_SHOWN = 10


class PoolServer:
    """Creates, supervises and scales one pool's env actors; serves its status.

    Args:
        spec: the pool.
        registry: Prometheus registry for the pool's metrics (a private one if None).
        http_host: address of the HTTP server (``/metrics``, ``/healthz``, ``/status``).
        http_port: its port; None uses ``spec.metrics.port``, 0 any free port, -1 none.
        ray_namespace: Ray namespace of the pool's actors (default ``envpool-<name>``).
        health_interval_s: supervision tick: how often actors are pinged.
        status_reporter: called with the ``status.pool`` report on every tick
            (throttling is its business); see :class:`~remote_env.pool.kube_report.KubeStatusReporter`.
        metrics_namespace: adds a ``namespace`` label to the metrics (in-cluster).
        actor_options: extra Ray options for the env actors.
        holder_watch: tells which lease holders died, rate-limited (default: asks
            Ray's GCS at most every :data:`~remote_env.pool.holders.PROBE_INTERVAL_S`).
        lease_host: address of the lease API (:mod:`remote_env.pool.lease_api`: trainers
            without Ray lease over it); default ``$ENVPOOL_LEASE_API_HOST``, else ``http_host``.
        lease_port: its port; None: ``$ENVPOOL_LEASE_API_PORT``, else
            :data:`~remote_env.pool.lease_api.DEFAULT_PORT`; 0 any free port; -1 off.
        lease_token: its bearer token; None reads the file ``$ENVPOOL_LEASE_TOKEN_FILE``
            names, and without one the API stays off (logged).

    Requires a connected Ray (``ray.init(address=...)``).
    """

    def __init__(
        self,
        spec: spec_mod.PoolSpec,
        *,
        registry: CollectorRegistry | None = None,
        http_host: str = "127.0.0.1",
        http_port: int | None = None,
        ray_namespace: str | None = None,
        health_interval_s: float = 1.0,
        status_reporter: Callable[[dict[str, Any]], None] | None = None,
        metrics_namespace: str | None = None,
        actor_options: Mapping[str, Any] | None = None,
        env_resource: bool | None = None,
        holder_watch: holders.HolderWatch | None = None,
        lease_host: str | None = None,
        lease_port: int | None = None,
        lease_token: bytes | None = None,
    ) -> None:
        if health_interval_s <= 0:
            raise ValueError(f"health_interval_s must be > 0, got {health_interval_s}")
        self.ray_namespace = ray_namespace or spec.ray_namespace
        self.health_interval_s = health_interval_s
        self.metrics = PoolMetrics(registry, spec.name, metrics_namespace)
        self.registry = self.metrics.registry
        self._labels = (spec.name,) if metrics_namespace is None else (metrics_namespace,
                                                                       spec.name)
        self._http_host = http_host
        self._http_port = spec.metrics_port if http_port is None else http_port
        self._reporter = status_reporter
        self.supervisor = supervisor.ActorSupervisor(
            spec, ray_namespace=self.ray_namespace, metrics=self.metrics,
            health_interval_s=health_interval_s,
            launcher=launch.ActorLauncher(ray_namespace=self.ray_namespace,
                                          actor_options=actor_options or {},
                                          env_resource=env_resource))
        self._lease_actor: Any = None
        self._pending_spec: spec_mod.PoolSpec | None = None
        # specs handed to apply_spec / applied by a tick: wait_ready waits for the latest
        self._spec_asked = self._spec_applied = 0
        self._spec_lock = threading.Lock()
        self._snapshot: dict[str, Any] = {}
        self._snapshot_lock = threading.Lock()
        self._leased: dict[int, str] = {}
        self._leases: list[dict[str, Any]] = []
        #: Ray node id -> host name of the nodes that host env actors (in-cluster: the
        #: worker pods' names), refreshed every NODES_REFRESH_S.
        self._hosts: dict[str, str] = {}
        self._hosts_at = -NODES_REFRESH_S
        self._requests: list[lease_actor.Replacement] = []
        self._holder_watch = holder_watch if holder_watch is not None else holders.HolderWatch()
        #: leases released because their holder died: how many, and the latest
        self._reclaimed_count = 0
        self._reclaimed: list[dict[str, Any]] = []
        #: The supervisor's layout version last published (None: publish on the next
        #: tick) and the lease actor's layout generation that publication made.
        self._published_version: int | None = None
        self._published_generation: int | None = None
        self._last_tick: float | None = None
        self._http: http.server.ThreadingHTTPServer | None = None
        self._lease_host = lease_host or os.environ.get(lease_api.HOST_ENV) or http_host
        self._lease_port = (lease_port if lease_port is not None
                            else int(os.environ.get(lease_api.PORT_ENV) or lease_api.DEFAULT_PORT))
        self._lease_token = lease_token
        self._lease_api: lease_api.LeaseApiServer | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._started = False
        self._closed = False
        self.metrics.track_states(self._state_counts)
        http_server.pool_gauges(self.registry, len(self._labels)).add(self._labels, self._gauges)

    # ------------------------------------------------------------- lifecycle
    @property
    def spec(self) -> spec_mod.PoolSpec:
        """The spec the pool runs (the supervisor's; a new one arrives by :meth:`apply_spec`)."""
        return self.supervisor.spec

    @property
    def http_port(self) -> int | None:
        """The HTTP server's port (after :meth:`start`), None when not serving."""
        return None if self._http is None else int(self._http.server_address[1])

    @property
    def url(self) -> str:
        return f"http://{self._http_host}:{self.http_port}"

    @property
    def lease_url(self) -> str | None:
        """The lease API's URL (after :meth:`start`), None when it is off."""
        return None if self._lease_api is None else self._lease_api.url

    def start(self) -> None:
        """Connect to the lease actor, adopt existing actors, start HTTP. Idempotent."""
        import ray

        if self._started:
            return
        if not ray.is_initialized():
            raise RuntimeError("PoolServer needs a connected Ray: call ray.init(address=...) first")
        self._lease_actor = lease_actor.remote_class().options(
            name=lease_actor.LEASE_ACTOR_NAME,
            namespace=self.ray_namespace,
            lifetime="detached",
            get_if_exists=True,
            max_concurrency=lease_actor.LEASE_ACTOR_CONCURRENCY,
            # On the head, which the pool cannot outlive anyway, and without CPUs:
            # it is bookkeeping only.
            num_cpus=0,
            resources={launch.HEAD_RESOURCE: 0.001},
            # a crashed lease actor comes back with its leases and layout (the store)
            max_restarts=-1,
        ).remote(self.spec.name, ray_namespace=self.ray_namespace,
                 store=lease_store.RayKVStore(self.ray_namespace))
        layout = lease_actor.PoolLayout.read(self._lease_actor_restarted("layout"))
        self.supervisor.adopt(layout.slots, layout.pool_info, time.monotonic())
        if self._http_port >= 0:
            self._http = http_server.serve_http(self, self._http_host, self._http_port)
            log.info("pool %s: serving %s/status, /metrics and /healthz", self.spec.name, self.url)
        self._start_lease_api()
        self._started = True
        self._update_snapshot(time.monotonic())

    def _start_lease_api(self) -> None:
        """The lease API (trainers without Ray), when a token is configured."""
        if self._lease_port < 0:
            return
        token = self._lease_token if self._lease_token is not None else lease_api.read_token()
        if token is None:
            log.info("pool %s: lease API off (no token: set $%s to the token's file)",
                     self.spec.name, lease_api.TOKEN_FILE_ENV)
            return
        service = lease_api.LeaseService(
            self.spec.name, lambda method, *args: self._lease_actor_call(method, *args),
            lease_api.RayChannels(self.ray_namespace), self.metrics)
        self._lease_api = lease_api.LeaseApiServer(
            service, token, self._lease_host, self._lease_port, self.metrics,
            relay.max_connections_from_env())
        self._lease_api.start()
        log.info("pool %s: lease API at %s/v1/", self.spec.name, self._lease_api.url)

    def start_background(self) -> None:
        """:meth:`start`, then supervise on a daemon thread until :meth:`close`."""
        self.start()
        self._thread = threading.Thread(target=self.run, name=f"pool-{self.spec.name}",
                                        daemon=True)
        self._thread.start()

    def run(self, stop: threading.Event | None = None,
            on_tick: Callable[[], None] | None = None) -> None:
        """Supervise until ``stop`` (or :meth:`close`) is set."""
        self.start()
        while not self._stop.is_set() and not (stop is not None and stop.is_set()):
            try:
                self.tick()
            except Exception as exc:
                # The loop must outlive a bad tick (a Ray hiccup): say so and go on.
                self.supervisor.tick_failed(f"supervision tick failed: {type(exc).__name__}: {exc}")
                log.exception("pool %s: supervision tick failed", self.spec.name)
                self._stop.wait(self.health_interval_s)
            if on_tick is not None:
                on_tick()

    def close(self, *, destroy: bool = False, timeout: float = 30.0) -> None:
        """Stop supervising and serving. ``destroy`` also kills every actor of the pool.

        Without ``destroy`` the actors (detached) keep running for trainers and the
        next pool server, which re-adopts them.
        """
        import ray

        if self._closed:
            return
        self._closed = True
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)
        if self._lease_api is not None:
            self._lease_api.close()
            self._lease_api = None
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()
            self._http = None
        self.metrics.remove()
        http_server.pool_gauges(self.registry, len(self._labels)).remove(self._labels)
        if destroy and ray.is_initialized():
            self.supervisor.kill_all()
            if self._lease_actor is not None:
                slot.kill(self._lease_actor)
                lease_store.RayKVStore(self.ray_namespace).clear()  # the pool is gone

    def __enter__(self) -> PoolServer:
        self.start_background()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def apply_spec(self, spec: spec_mod.PoolSpec) -> None:
        """Take a new spec (e.g. the ConfigMap changed); applied on the next tick."""
        if spec.name != self.spec.name:
            raise ValueError(
                f"this pool server runs pool {self.spec.name!r}; a spec for pool {spec.name!r} "
                "needs its own pool server"
            )
        with self._spec_lock:
            self._pending_spec = spec
            self._spec_asked += 1

    def wait_ready(self, timeout: float = 120.0) -> dict[str, Any]:
        """Wait until every desired env is ready, every free one of the spec's revision;
        returns the status.

        Raises:
            TimeoutError: with the last status, when they are not ready in time.
        """
        deadline = time.monotonic() + timeout
        while True:
            st = self.status()
            # a rollout's leased actors wait for their trainers: not for us to wait on
            if (st["specVersion"] == self._spec_asked
                    and st["readyEnvs"] == st["totalEnvs"] == st["desiredEnvs"]
                    and st["actors"] == st["readyActors"]
                    and st["outdatedEnvs"] == st["outdatedLeasedEnvs"]):
                return st
            if time.monotonic() >= deadline:
                raise TimeoutError(
                    f"pool {self.spec.name!r}: {st['readyEnvs']}/{st['desiredEnvs']} envs ready "
                    f"after {timeout}s; last error: {st['lastError'] or 'none'}"
                )
            time.sleep(min(0.1, self.health_interval_s))

    def status(self) -> dict[str, Any]:
        """The latest ``/status`` document."""
        with self._snapshot_lock:
            return dict(self._snapshot)

    def healthy(self) -> bool:
        """The supervision loop ticked recently (what ``/healthz`` reports)."""
        last = self._last_tick
        limit = max(10.0, 5 * self.health_interval_s)
        return last is not None and time.monotonic() - last < limit and not self._closed

    # ------------------------------------------------------------ supervision
    def tick(self) -> None:
        """One supervision pass, then publish and wait up to a health interval."""

        if self._last_tick is None:
            # A (re)started server learns the leases before it first supervises or
            # publishes: with none known, every adopted actor looked free, to scale-down
            # and in /status (seen: readyEnvs 16, leasedEnvs 0 after a restart).
            self._take_sync(self._server_sync(None, None, 0.0))
        now = time.monotonic()
        self._apply_pending_spec()
        requests, self._requests = self._requests, []
        for slot_id, actor_id, reason in requests:
            self.supervisor.reported(slot_id, actor_id, reason, now)
        self.supervisor.supervise(now, self._leased, self._withdraw)
        self._refresh_hosts(now)
        self._update_snapshot(now)
        version = self.supervisor.layout_version
        publish = version != self._published_version
        layout = self.supervisor.layout() if publish else None
        pool_info = self._pool_info() if publish else None
        sync = self._server_sync(layout, pool_info, self.health_interval_s)
        if publish:
            self._published_version = version
            self._published_generation = sync.generation
        elif sync.generation != self._published_generation:
            self._published_version = None  # the lease actor restarted and lost the layout
        self._take_sync(sync)
        self._reclaim_dead_holders(time.monotonic())
        self._last_tick = time.monotonic()
        self._update_snapshot(self._last_tick)
        if self._reporter is not None:
            self._reporter(self.pool_report())

    def _take_sync(self, sync: lease_actor.ServerSync) -> None:
        """What the lease actor answered: trainers' replacement requests (queued for the
        next pass) and the leases."""
        self._requests = [*self._requests, *sync.requests]
        self._leased = dict(sync.leased_slots)
        self._leases = list(sync.leases)

    def _reclaim_dead_holders(self, now: float) -> None:
        """Release the leases of holders Ray says died (rate-limited by the watch), so a
        SIGKILLed trainer's envs are free now rather than after its ttl."""
        dead = self._holder_watch.dead(self._leases, now)
        if not dead:
            return
        gone: list[dict[str, Any]] = list(self._lease_actor_call("reclaim", sorted(dead)))
        if not gone:
            return
        for lease in gone:
            log.warning("pool %s: lease %s of trainer %r reclaimed: its holder %s died",
                        self.spec.name, lease["lease_id"], lease["trainer"],
                        lease.get("holder"))
            self.metrics.leases_reclaimed.inc()
        self._reclaimed_count += len(gone)
        self._reclaimed = [*self._reclaimed, *gone][-RECLAIMED_SHOWN:]
        # shown free now, not after the next sync
        ids = {lease["lease_id"] for lease in gone}
        self._leases = [x for x in self._leases if x["lease_id"] not in ids]
        self._leased = {s: i for s, i in self._leased.items() if i not in ids}

    def _server_sync(self, layout: list[slot.SlotInfo] | None, pool_info: dict[str, Any] | None,
                     timeout: float) -> lease_actor.ServerSync:
        return lease_actor.ServerSync.read(
            self._lease_actor_call("server_sync", layout, pool_info, timeout))

    def _withdraw(self, slots: list[int]) -> list[int]:
        """The lease actor's word, at the moment of removal, on which slots are free."""
        return list(self._lease_actor_call("withdraw", slots))

    def _lease_actor_call(self, method: str, *args: Any) -> Any:
        """A lease actor call (each one idempotent), asked again once when Ray says the
        actor restarted since our last call: Ray fails the first call after a restart
        even once the actor is back (with its layout and leases), and a failed tick
        would show that transient as the pool's lastError."""
        import ray

        try:
            return ray.get(getattr(self._lease_actor, method).remote(*args))
        except ray.exceptions.ActorUnavailableError:
            return ray.get(getattr(self._lease_actor, method).remote(*args))

    def _lease_actor_restarted(self, method: str, *args: Any) -> Any:
        """A lease actor call that waits (up to :data:`LEASE_ACTOR_RESTART_S`) for a lease
        actor Ray is restarting: a pool server that starts with a new head finds it so."""
        import ray

        deadline = time.monotonic() + LEASE_ACTOR_RESTART_S
        while True:
            try:
                return ray.get(getattr(self._lease_actor, method).remote(*args))
            except ray.exceptions.ActorUnavailableError as exc:
                if time.monotonic() > deadline:
                    raise
                log.info("pool %s: the lease actor is restarting (%s); waiting",
                         self.spec.name, slot.first_line(exc))
                time.sleep(0.5)

    def pool_report(self) -> dict[str, Any]:
        """``status.pool`` of the EnvPool (see :func:`remote_env.pool.snapshot.pool_report`)."""
        return snapshot_mod.pool_report(self.status())

    def _refresh_hosts(self, now: float) -> None:
        import ray

        if now - self._hosts_at < NODES_REFRESH_S:
            return
        self._hosts_at = now
        self._hosts = {n["NodeID"]: str(n.get("NodeManagerHostname") or "")
                       for n in ray.nodes()  # type: ignore[no-untyped-call]
                       if n.get("Alive") and spec_mod.ENV_RESOURCE in (n.get("Resources") or {})}

    def _apply_pending_spec(self) -> None:
        with self._spec_lock:
            spec, self._pending_spec = self._pending_spec, None
            self._spec_applied = self._spec_asked
        if spec is None or spec == self.spec:
            return
        old = self.spec
        log.info("pool %s: spec changed: replicas %d -> %d, envsPerActor %d -> %d",
                 spec.name, old.replicas, spec.replicas, old.envs_per_actor, spec.envs_per_actor)
        if old.metrics_port != spec.metrics_port:
            log.warning("pool %s: metrics.port changed to %d: takes effect when the pool server "
                        "restarts", spec.name, spec.metrics_port)
        self.supervisor.respec(spec, time.monotonic())

    # ---------------------------------------------------------------- status
    def _pool_info(self) -> dict[str, Any]:
        """What trainers need to drive the pool's actors like their own: the spec itself
        (as a document, which :func:`remote_env.spec.parse_manifest` reads back)."""
        return {"signature": slot.signature(self.spec), "revision": self.spec.revision(),
                "document": self.spec.to_document()}

    def _update_snapshot(self, now: float) -> None:
        snap = snapshot_mod.snapshot(
            self.spec, ray_namespace=self.ray_namespace,
            slots=self.supervisor.slots(),
            leased=self._leased, leases=self._leases, hosts=self._hosts,
            last_error=self.supervisor.last_error, healthy=self.healthy(),
            spec_version=self._spec_applied, reclaimed=self._reclaimed,
            reclaimed_count=self._reclaimed_count)
        with self._snapshot_lock:
            self._snapshot = snap

    def _state_counts(self) -> dict[str, int]:
        st = self.status()
        return {"running": st.get("readyEnvs", 0), "restarting": st.get("startingEnvs", 0),
                "failed": st.get("failedEnvs", 0)}

    def _gauges(self) -> dict[str, float]:
        st = self.status()
        return {"desired": st.get("desiredEnvs", 0), "leased": st.get("leasedEnvs", 0),
                "free": st.get("freeEnvs", 0), "leases": len(st.get("leases", [])),
                "outdated": st.get("outdatedEnvs", 0)}


