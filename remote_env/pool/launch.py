"""Creating a pool's env actors: Ray options, placement, names, ``start()``.

:class:`Launcher` is the part of :class:`~remote_env.pool.actors.ActorSet` that
asks Ray for an actor: detached, named ``host-<slot>-g<generation>`` in the pool's
namespace, placed by the env resource where workers advertise it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any, Final

from remote_env import entrypoints
from remote_env import spec as spec_mod
from remote_env.metrics import PoolMetrics
from remote_env.pool.slot import Slot, first_line, kill

log = logging.getLogger("remote_env.pool.server")

#: Ray's marker resource of the head node.
HEAD_RESOURCE: Final = "node:__internal_head__"


class Launcher:
    """Mixin of :class:`~remote_env.pool.actors.ActorSet`: launching slots' actors."""

    spec: spec_mod.PoolSpec
    ray_namespace: str
    metrics: PoolMetrics
    dirty: bool
    last_error: str
    _actor_options: dict[str, Any]
    _env_resource_required: bool | None
    _env_resource: tuple[float, bool]

    def relaunch(self, s: Slot, *, after_failure: bool) -> None:
        kill(s.handle)
        s.ping_ref = s.start_ref = None
        s.silent_since = None
        s.after_failure = after_failure
        self._launch(s)


    def _launch(self, s: Slot) -> None:
        """Create ``s``'s next-generation actor and send it ``start()``."""
        from remote_env.driver.vector import RemoteVectorEnv

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
        bad_env = runtime_env_error(spec.ray.runtime_env)
        if bad_env is not None:
            self._launch_failed(s, f"spec.ray.runtimeEnv: {bad_env}")
            return
        for _ in range(3):
            s.generation += 1
            try:
                s.handle = host_cls.options(name=s.name, **options).remote(
                    [factory] * s.num_envs, **kwargs)
                break
            except ValueError as exc:
                if "already taken" not in str(exc):
                    self._launch_failed(s, first_line(exc))
                    return
                log.warning("pool %s: %s", spec.name, exc)  # a stale actor: skip a generation
            except Exception as exc:  # Ray refused the actor: no retry will do better
                self._launch_failed(s, first_line(exc))
                return
        else:
            raise RuntimeError(f"pool {spec.name}: cannot name a new actor for slot {s.slot}")
        s.actor_id = s.handle._actor_id.hex()
        s.revision = spec.revision()
        s.start_ref = s.handle.start.remote()
        s.start_seen = None
        s.state = "starting"
        s.node_id = ""
        self.dirty = True


    def _launch_failed(self, s: Slot, message: str) -> None:
        """Ray would not create ``s``'s actor: the slot is failed, with the reason."""
        s.handle = s.ping_ref = s.start_ref = None
        s.state = "failed"
        s.last_error = f"{s.name}: launch failed: {message}"
        self.last_error = s.last_error
        self.metrics.failures["exception"].inc(s.num_envs)
        self.dirty = True
        log.error("pool %s: %s", self.spec.name, s.last_error)

    def _has_env_resource(self) -> bool:
        import ray

        if self._env_resource_required is not None:
            return self._env_resource_required
        checked, has = self._env_resource
        if time.monotonic() - checked > 5.0:
            has = spec_mod.ENV_RESOURCE in ray.cluster_resources()  # type: ignore[no-untyped-call]
            self._env_resource = (time.monotonic(), has)
        return has


def runtime_env_error(runtime_env: Mapping[str, Any]) -> str | None:
    """What Ray's own ``RuntimeEnv`` says is wrong with ``runtime_env`` (None: nothing).

    Here, not in the spec parser: the spec model is pure (no Ray import); this runs
    where a spec is loaded to be run (``envpool run -f``, ``envpool serve``) and
    again before each actor launch.
    """
    if not runtime_env:
        return None
    from ray.runtime_env import RuntimeEnv

    try:
        RuntimeEnv(**dict(runtime_env))
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return None
