"""The pool server: owns a pool's env actors, keeps them healthy and at size.

It runs beside the Ray head (``envpool serve``, the head pod's sidecar in-cluster;
in-process for ``envpool run``) and:

* creates ``SubEnvHost`` actors, named ``host-<slot>-g<generation>`` and detached,
  in the pool's Ray namespace, so they outlive trainers and the pool server;
* re-adopts the actors it finds there when it restarts (the registry actor keeps
  the layout and the leases, see :mod:`remote_env.pool_registry`);
* pings every actor; a dead one (process killed, node lost) or one that does not
  answer within ``faultTolerance.stepTimeoutSeconds`` is killed and replaced, with
  exponential backoff and at most ``maxRestarts`` consecutive failures; trainers
  report the failures they see and wait for the replacement (one owner of restarts);
* scales to ``spec.replicas`` without touching surviving actors: new actors are
  added, and scaling down removes un-leased actors first (an actor is cut to a
  smaller one only when no whole actor fits the excess);
* serves ``/metrics``, ``/healthz`` and ``/status`` (JSON) over HTTP and, in-cluster,
  patches its EnvPool's ``status.pool`` (:mod:`remote_env.pool_status`).

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

import dataclasses
import datetime
import hashlib
import http.server
import json
import logging
import re
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, Final

from prometheus_client import CollectorRegistry

from remote_env import entrypoints, pool_registry, pool_status
from remote_env import spec as spec_mod
from remote_env.metrics import PoolMetrics

log = logging.getLogger(__name__)

#: Ray's marker resource of the head node.
HEAD_RESOURCE: Final = "node:__internal_head__"
HOST_NAME_RE: Final = re.compile(r"^host-(\d+)-g(\d+)$")
#: An actor that stayed healthy this long starts its failure count afresh.
HEALTHY_RESET_S: Final = 60.0
MAX_BACKOFF_S: Final = 60.0
#: Without hang detection, an actor Ray calls unavailable this long is dead.
UNAVAILABLE_DEAD_S: Final = 60.0

FAILURE_REASONS: Final = ("exception", "actor_died", "timeout")


def host_name(slot: int, generation: int) -> str:
    return f"host-{slot:05d}-g{generation}"


def _now_iso() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _node_id(_host: Any) -> str:
    import ray

    return str(ray.get_runtime_context().get_node_id())


@dataclasses.dataclass
class _Slot:
    """One env actor position of the pool and its supervision state."""

    slot: int
    num_envs: int
    generation: int = 0
    handle: Any = None
    actor_id: str = ""
    state: pool_registry.SlotState = "starting"
    start_ref: Any = None
    ping_ref: Any = None
    ping_sent: float = 0.0
    # when the actor stopped answering (first unanswered ping), for hang detection
    silent_since: float | None = None
    ready_since: float = 0.0
    restarts: int = 0
    failures: int = 0  # consecutive
    retry_at: float = 0.0
    last_error: str = ""
    node_id: str = ""
    after_failure: bool = False
    # False for an adopted actor the registry had no record of, until start() tells
    size_known: bool = True

    @property
    def name(self) -> str:
        return host_name(self.slot, self.generation)

    def info(self) -> pool_registry.SlotInfo:
        return pool_registry.SlotInfo(
            self.slot, self.name, self.actor_id, self.num_envs, self.state, self.restarts,
            self.node_id, self.last_error,
        )


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
            (throttling is its business); see :class:`~remote_env.pool_status.KubeStatusReporter`.
        metrics_namespace: adds a ``namespace`` label to the metrics (in-cluster).
        actor_options: extra Ray options for the env actors.

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
    ) -> None:
        if health_interval_s <= 0:
            raise ValueError(f"health_interval_s must be > 0, got {health_interval_s}")
        self.spec = spec
        self.ray_namespace = ray_namespace or spec.ray_namespace
        self.health_interval_s = health_interval_s
        self.metrics = PoolMetrics(registry, spec.name, metrics_namespace)
        self.registry = self.metrics.registry
        self._labels = (spec.name,) if metrics_namespace is None else (metrics_namespace,
                                                                       spec.name)
        self._http_host = http_host
        self._http_port = spec.metrics_port if http_port is None else http_port
        self._reporter = status_reporter
        self._actor_options = dict(actor_options or {})
        self._slots: dict[int, _Slot] = {}
        self._registry_actor: Any = None
        self._pending_spec: spec_mod.PoolSpec | None = None
        # specs handed to apply_spec / applied by a tick: wait_ready waits for the latest
        self._spec_asked = self._spec_applied = 0
        self._spec_lock = threading.Lock()
        self._snapshot: dict[str, Any] = {}
        self._snapshot_lock = threading.Lock()
        self._leased: dict[int, str] = {}
        self._leases: list[dict[str, Any]] = []
        self._requests: list[tuple[int, str, str]] = []
        self._dirty = True
        self._published_generation: int | None = None
        self._last_error = ""
        self._last_tick: float | None = None
        self._env_resource: tuple[float, bool] = (0.0, False)
        self._http: http.server.ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._started = False
        self._closed = False
        self.metrics.track_states(self._state_counts)
        pool_status.pool_gauges(self.registry, len(self._labels)).add(self._labels, self._gauges)

    # ------------------------------------------------------------- lifecycle
    @property
    def http_port(self) -> int | None:
        """The HTTP server's port (after :meth:`start`), None when not serving."""
        return None if self._http is None else int(self._http.server_address[1])

    @property
    def url(self) -> str:
        return f"http://{self._http_host}:{self.http_port}"

    def start(self) -> None:
        """Connect to the registry, adopt existing actors, start HTTP. Idempotent."""
        import ray

        if self._started:
            return
        if not ray.is_initialized():
            raise RuntimeError("PoolServer needs a connected Ray: call ray.init(address=...) first")
        self._registry_actor = pool_registry.remote_class().options(
            name=pool_registry.REGISTRY_NAME,
            namespace=self.ray_namespace,
            lifetime="detached",
            get_if_exists=True,
            max_concurrency=pool_registry.REGISTRY_CONCURRENCY,
            # On the head, which the pool cannot outlive anyway, and without CPUs:
            # it is bookkeeping only.
            num_cpus=0,
            resources={HEAD_RESOURCE: 0.001},
            # a crashed registry comes back empty; the pool server republishes its layout
            max_restarts=-1,
        ).remote(self.spec.name)
        layout = ray.get(self._registry_actor.layout.remote())
        self._adopt(layout)
        if self._http_port >= 0:
            self._http = pool_status.serve_http(self, self._http_host, self._http_port)
            log.info("pool %s: serving %s/status, /metrics and /healthz", self.spec.name, self.url)
        self._started = True
        self._update_snapshot(time.monotonic())

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
                self._last_error = f"supervision tick failed: {type(exc).__name__}: {exc}"
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
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()
            self._http = None
        self.metrics.remove()
        pool_status.pool_gauges(self.registry, len(self._labels)).remove(self._labels)
        if destroy and ray.is_initialized():
            for s in self._slots.values():
                _kill(s.handle)
            if self._registry_actor is not None:
                _kill(self._registry_actor)
            self._slots.clear()

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
        """Wait until every desired env is ready; returns the status.

        Raises:
            TimeoutError: with the last status, when they are not ready in time.
        """
        deadline = time.monotonic() + timeout
        while True:
            st = self.status()
            if (st["specVersion"] == self._spec_asked
                    and st["readyEnvs"] == st["totalEnvs"] == st["desiredEnvs"]
                    and st["actors"] == st["readyActors"]):
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
        import ray

        now = time.monotonic()
        self._apply_pending_spec()
        requests, self._requests = self._requests, []
        for slot, actor_id, reason in requests:
            s = self._slots.get(slot)
            if s is not None and s.actor_id == actor_id and s.state == "ready":
                why = "no answer within the trainer's step timeout" if reason == "timeout" \
                    else "a trainer's call to it failed"
                self._fail(s, reason if reason in FAILURE_REASONS else "actor_died", why, now)
        self._check_starts(now)
        self._check_pings(now)
        self._send_pings(now)
        self._retry_backoffs(now)
        self._scale(now)
        self._update_snapshot(now)
        layout = [s.info() for s in sorted(self._slots.values(), key=lambda x: x.slot)] \
            if self._dirty else None
        pool_info = self._pool_info() if self._dirty else None
        sync = ray.get(self._registry_actor.server_sync.remote(
            layout, pool_info, self.health_interval_s))
        if layout is not None:
            self._dirty = False
            self._published_generation = sync["generation"]
        elif sync["generation"] != self._published_generation:
            self._dirty = True  # the registry restarted and lost the layout: republish
        self._requests = list(sync["requests"])
        self._leased = dict(sync["leased_slots"])
        self._leases = list(sync["leases"])
        self._last_tick = time.monotonic()
        self._update_snapshot(self._last_tick)
        if self._reporter is not None:
            self._reporter(self.pool_report())

    def pool_report(self) -> dict[str, Any]:
        """``status.pool`` of the EnvPool: the operator reads it."""
        st = self.status()
        return {key: st[key] for key in ("readyEnvs", "desiredEnvs", "restarts", "lastError",
                                         "updatedAt")}

    def _apply_pending_spec(self) -> None:
        with self._spec_lock:
            spec, self._pending_spec = self._pending_spec, None
            self._spec_applied = self._spec_asked
        if spec is None or spec == self.spec:
            return
        old, self.spec = self.spec, spec
        log.info("pool %s: spec changed: replicas %d -> %d, envsPerActor %d -> %d",
                 spec.name, old.replicas, spec.replicas, old.envs_per_actor, spec.envs_per_actor)
        if old.metrics_port != spec.metrics_port:
            log.warning("pool %s: metrics.port changed to %d: takes effect when the pool server "
                        "restarts", spec.name, spec.metrics_port)
        now = time.monotonic()
        if _signature(old) != _signature(spec):
            log.info("pool %s: env or actor settings changed: replacing every actor", spec.name)
            for s in self._slots.values():
                s.failures = 0
                self._relaunch(s, after_failure=False)
        for s in self._slots.values():
            if s.state == "failed":  # a new spec is the user's retry
                s.failures = 0
                s.retry_at = now
                s.state = "backoff"
        self._dirty = True

    def _adopt(self, layout: Mapping[str, Any]) -> None:
        """Take over the actors a previous pool server left in the namespace."""
        import ray

        known = {s.slot: s for s in layout.get("slots", [])}
        latest: dict[int, int] = {}
        names: list[tuple[int, int, str]] = []
        for entry in ray.util.list_named_actors(all_namespaces=True):
            if entry["namespace"] != self.ray_namespace:
                continue
            m = HOST_NAME_RE.match(entry["name"])
            if m:
                slot, gen = int(m.group(1)), int(m.group(2))
                names.append((slot, gen, entry["name"]))
                latest[slot] = max(gen, latest.get(slot, -1))
        # Rebuild only actors known to be built from another spec; a registry that lost
        # its record (restarted with the head) cannot tell, so they are kept.
        built_from = layout.get("pool_info", {}).get("signature")
        same_build = built_from is None or built_from == _signature(self.spec)
        for slot, gen, name in names:
            try:
                handle = ray.get_actor(name, namespace=self.ray_namespace)
            except ValueError:  # died meanwhile
                continue
            if gen != latest[slot]:
                _kill(handle)  # an older generation a crashed server did not finish replacing
                continue
            prev = known.get(slot)
            s = _Slot(slot, prev.num_envs if prev else self.spec.envs_per_actor, gen,
                      restarts=prev.restarts if prev else 0)
            s.handle = handle
            s.actor_id = handle._actor_id.hex()
            s.node_id = prev.node_id if prev else ""
            s.size_known = prev is not None
            # start() is idempotent: it answers with the description of a started host
            s.start_ref = handle.start.remote()
            self._slots[slot] = s
            if not same_build:
                self._relaunch(s, after_failure=False)
        if self._slots:
            log.info("pool %s: adopted %d actors (%d envs) from namespace %s%s", self.spec.name,
                     len(self._slots), sum(s.num_envs for s in self._slots.values()),
                     self.ray_namespace, "" if same_build else "; rebuilding them: spec changed")

    def _check_starts(self, now: float) -> None:
        import ray

        starting = {s.start_ref: s for s in self._slots.values()
                    if s.state == "starting" and s.start_ref is not None}
        if not starting:
            return
        ready, _ = ray.wait(list(starting), num_returns=len(starting), timeout=0)
        for ref in ready:
            s = starting[ref]
            s.start_ref = None
            try:
                info = ray.get(ref)
            except ray.exceptions.RayActorError as exc:
                self._fail(s, "actor_died", _first_line(exc), now)
                continue
            except ray.exceptions.RayError as exc:
                self._fail(s, "exception", _first_line(exc), now)
                continue
            permanent = [f for f in info.get("failures", []) if f.permanent]
            if permanent:
                f = permanent[0]
                log.warning("pool %s: %s: sub-env %d failed to start: %s\n%s", self.spec.name,
                            s.name, f.index, f.message, f.traceback)
                self._fail(s, "exception", f"sub-env {f.index}: {f.message}", now)
                continue
            s.num_envs = int(info["num_envs"])
            s.size_known = True
            try:
                s.node_id = ray.get(s.handle.__ray_call__.remote(_node_id), timeout=10)
            except Exception:  # only informational
                s.node_id = ""
            s.state = "ready"
            s.ready_since = now
            s.silent_since = None
            s.last_error = ""
            self._dirty = True
            if s.after_failure:
                self.metrics.actor_restarts.inc()
                self.metrics.env_restarts.inc(s.num_envs)
                s.after_failure = False

    def _check_pings(self, now: float) -> None:
        import ray

        pinged = {s.ping_ref: s for s in self._slots.values()
                  if s.state == "ready" and s.ping_ref is not None}
        if pinged:
            ready, _ = ray.wait(list(pinged), num_returns=len(pinged), timeout=0)
            for ref in ready:
                s = pinged[ref]
                s.ping_ref = None
                try:
                    ray.get(ref)
                    s.silent_since = None
                except ray.exceptions.ActorUnavailableError:
                    pass  # maybe transient (network); the silence timer keeps running
                except ray.exceptions.RayActorError as exc:
                    self._fail(s, "actor_died", _first_line(exc), now)
        timeout = self.spec.fault_tolerance.step_timeout
        for s in list(self._slots.values()):
            if s.state != "ready" or s.silent_since is None:
                continue
            silent = now - s.silent_since
            if timeout is not None and silent > timeout:
                self._fail(s, "timeout", f"no answer to a health ping within "
                                         f"stepTimeoutSeconds={timeout:g}", now)
            elif timeout is None and silent > UNAVAILABLE_DEAD_S and s.ping_ref is None:
                self._fail(s, "actor_died", f"unreachable for {silent:.0f}s", now)

    def _send_pings(self, now: float) -> None:
        for s in self._slots.values():
            if s.state == "ready" and s.ping_ref is None \
                    and now - s.ping_sent >= self.health_interval_s:
                s.ping_ref = s.handle.ping.remote()
                s.ping_sent = now
                if s.silent_since is None:
                    s.silent_since = now

    def _retry_backoffs(self, now: float) -> None:
        for s in self._slots.values():
            if s.state == "backoff" and now >= s.retry_at:
                self._launch(s)

    def _fail(self, s: _Slot, reason: str, message: str, now: float) -> None:
        """``s``'s actor failed: kill it and restart it (backoff), or give up."""
        ft = self.spec.fault_tolerance
        self.metrics.failures[reason].inc(s.num_envs)
        _kill(s.handle)
        s.ping_ref = s.start_ref = None
        s.silent_since = None
        if s.state == "ready" and now - s.ready_since >= HEALTHY_RESET_S:
            s.failures = 0
        s.failures += 1
        s.last_error = f"{s.name}: {reason}: {message}"
        self._last_error = s.last_error
        self._dirty = True
        if not ft.restart_failed_envs or s.failures > ft.max_restarts:
            s.state = "failed"
            why = ("faultTolerance.restartFailedEnvs is false" if not ft.restart_failed_envs
                   else f"{s.failures} failures in a row (maxRestarts={ft.max_restarts})")
            s.last_error += f"; not restarted: {why}"
            self._last_error = s.last_error
            log.error("pool %s: %s", self.spec.name, s.last_error)
            return
        delay = min(ft.restart_backoff_seconds * 2 ** (s.failures - 1), MAX_BACKOFF_S) \
            if ft.restart_backoff_seconds > 0 else 0.0
        log.warning("pool %s: %s; restarting its %d envs in %.1fs", self.spec.name,
                    s.last_error, s.num_envs, delay)
        s.after_failure = True
        s.restarts += 1
        s.state = "backoff"
        s.retry_at = now + delay
        if delay == 0:
            self._launch(s)

    def _relaunch(self, s: _Slot, *, after_failure: bool) -> None:
        _kill(s.handle)
        s.ping_ref = s.start_ref = None
        s.silent_since = None
        s.after_failure = after_failure
        self._launch(s)

    def _launch(self, s: _Slot) -> None:
        """Create ``s``'s next-generation actor and send it ``start()``."""
        from remote_env.vector import RemoteVectorEnv

        spec = self.spec
        ft = spec.fault_tolerance
        options: dict[str, Any] = {
            "namespace": self.ray_namespace,
            "lifetime": "detached",
            "max_concurrency": 1,
            "max_restarts": 0,  # restarts are ours: Ray's would come back un-started
        }
        if spec.ray.runtime_env:
            options["runtime_env"] = dict(spec.ray.runtime_env)
        if self._has_env_resource():
            # The env units are the placement; num_cpus=0 because Ray holds 1 CPU per
            # actor for its lifetime once any resource is named, which would cap a
            # worker pod at one actor per CPU instead of envsPerWorker envs.
            options["resources"] = {spec_mod.ENV_RESOURCE: s.num_envs}
            options["num_cpus"] = 0
        options.update(self._actor_options)
        kwargs: dict[str, Any] = {
            "autoreset_mode": spec.autoreset_mode,
            "threads": spec.threads_per_actor,
            "restart_failed": ft.restart_failed_envs,
            "max_restarts": ft.max_restarts,
            "restart_backoff_s": ft.restart_backoff_seconds,
            "multi_agent_hint": True if spec.env.multi_agent else None,
        }
        if s.after_failure:
            # Fresh envs must be reset before stepping; NEXT_STEP does it on the next step.
            kwargs["restart_seeds"] = [None] * s.num_envs
            kwargs["restarts"] = [s.restarts] * s.num_envs
        host_cls = RemoteVectorEnv.host_class()
        factory = entrypoints.EnvFactory.from_spec(spec.env)
        for _ in range(3):
            s.generation += 1
            try:
                s.handle = host_cls.options(name=s.name, **options).remote(
                    [factory] * s.num_envs, **kwargs)
                break
            except ValueError as exc:  # the name is taken: a stale actor; skip a generation
                log.warning("pool %s: %s", spec.name, exc)
        else:
            raise RuntimeError(f"pool {spec.name}: cannot name a new actor for slot {s.slot}")
        s.actor_id = s.handle._actor_id.hex()
        s.start_ref = s.handle.start.remote()
        s.state = "starting"
        s.node_id = ""
        self._dirty = True

    def _has_env_resource(self) -> bool:
        import ray

        checked, has = self._env_resource
        if time.monotonic() - checked > 5.0:
            has = spec_mod.ENV_RESOURCE in ray.cluster_resources()  # type: ignore[no-untyped-call]
            self._env_resource = (time.monotonic(), has)
        return has

    def _scale(self, now: float) -> None:
        """Add or remove actors until the pool holds ``desired_envs`` envs."""
        if not all(s.size_known for s in self._slots.values()):
            return  # adopted actors still to report how many envs they hold
        desired = self.spec.desired_envs
        total = sum(s.num_envs for s in self._slots.values())
        if total < desired:
            slot = max(self._slots, default=-1) + 1
            while total < desired:
                n = min(self.spec.envs_per_actor, desired - total)
                s = _Slot(slot, n)
                self._slots[slot] = s
                self._launch(s)
                total += n
                slot += 1
            log.info("pool %s: scaled up to %d envs in %d actors", self.spec.name, total,
                     len(self._slots))
        elif total > desired:
            excess = total - desired
            # un-leased first, then the newest
            order = sorted(self._slots.values(),
                           key=lambda s: (s.slot in self._leased, -s.slot))
            for s in order:
                if excess == 0:
                    break
                if s.num_envs <= excess:
                    _kill(s.handle)
                    del self._slots[s.slot]
                    excess -= s.num_envs
                    if s.slot in self._leased:
                        log.warning("pool %s: scaled away %s, leased by %s", self.spec.name,
                                    s.name, self._leased[s.slot])
            if excess:
                # no whole actor fits the excess: rebuild one with fewer envs
                s = next(s for s in order if s.slot in self._slots and s.num_envs > excess)
                s.num_envs -= excess
                self._relaunch(s, after_failure=False)
            self._dirty = True
            log.info("pool %s: scaled down to %d envs in %d actors", self.spec.name, desired,
                     len(self._slots))

    # ---------------------------------------------------------------- status
    def _pool_info(self) -> dict[str, Any]:
        """What trainers need to drive the pool's actors like their own."""
        spec = self.spec
        ft = spec.fault_tolerance
        return {
            "name": spec.name,
            "signature": _signature(spec),
            "env": {"id": spec.env.id, "entrypoint": spec.env.entrypoint,
                    "kwargs": dict(spec.env.kwargs), "multiAgent": spec.env.multi_agent},
            "autoreset_mode": spec.autoreset_mode,
            "batch_wait_ms": spec.batch_wait_ms,
            "step_timeout_s": ft.step_timeout,
            "restart_failed_envs": ft.restart_failed_envs,
            "max_restarts": ft.max_restarts,
            "desired_envs": spec.desired_envs,
        }

    def _update_snapshot(self, now: float) -> None:
        slots = sorted(self._slots.values(), key=lambda s: s.slot)
        by_state = {"ready": 0, "starting": 0, "backoff": 0, "failed": 0}
        for s in slots:
            by_state[s.state] += s.num_envs
        trainers = {lease["lease_id"]: lease["trainer"] for lease in self._leases}
        leased_envs = sum(s.num_envs for s in slots if s.slot in self._leased)
        snap = {
            "pool": self.spec.name,
            "namespace": self.spec.namespace,
            "rayNamespace": self.ray_namespace,
            "desiredEnvs": self.spec.desired_envs,
            "totalEnvs": sum(by_state.values()),
            "readyEnvs": by_state["ready"],
            "startingEnvs": by_state["starting"] + by_state["backoff"],
            "failedEnvs": by_state["failed"],
            "leasedEnvs": leased_envs,
            "actors": len(slots),
            "readyActors": sum(1 for s in slots if s.state == "ready"),
            "restarts": sum(s.restarts for s in slots),
            "lastError": self._last_error,
            "updatedAt": _now_iso(),
            "healthy": self.healthy(),
            "specVersion": self._spec_applied,
            "spec": {"replicas": self.spec.replicas, "envsPerActor": self.spec.envs_per_actor,
                     "suspend": self.spec.suspend},
            "slots": [
                {"slot": s.slot, "name": s.name, "actorId": s.actor_id, "envs": s.num_envs,
                 "state": s.state, "restarts": s.restarts, "nodeId": s.node_id,
                 "leasedBy": trainers.get(self._leased.get(s.slot, "")),
                 "lastError": s.last_error}
                for s in slots
            ],
            "leases": [dict(lease) for lease in self._leases],
        }
        with self._snapshot_lock:
            self._snapshot = snap

    def _state_counts(self) -> dict[str, int]:
        st = self.status()
        return {"running": st.get("readyEnvs", 0), "restarting": st.get("startingEnvs", 0),
                "failed": st.get("failedEnvs", 0)}

    def _gauges(self) -> dict[str, float]:
        st = self.status()
        return {"desired": st.get("desiredEnvs", 0), "leased": st.get("leasedEnvs", 0),
                "leases": len(st.get("leases", []))}


def _signature(spec: spec_mod.PoolSpec) -> str:
    blob = json.dumps(spec.host_signature(), sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def _kill(handle: Any) -> None:
    if handle is None:
        return
    import ray

    try:
        ray.kill(handle, no_restart=True)
    except Exception:  # already dead
        pass


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"
