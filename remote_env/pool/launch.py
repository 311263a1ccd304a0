"""Creating a pool's env actors: Ray options, placement, names, ``start()``.

:class:`ActorLauncher` asks Ray for one actor: detached, named
``host-<slot>-g<generation>`` in the pool's namespace, placed by the env resource
where workers advertise it, and sends it ``start()``. It answers what it created
(:class:`Launched`) or why not (:class:`LaunchFailed`); the slot record is the
supervisor's (:class:`~remote_env.pool.supervisor.ActorSupervisor`) to update.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Mapping
from typing import Any, Final

from remote_env import entrypoints
from remote_env import spec as spec_mod
from remote_env.pool.slot import first_line, host_name

log = logging.getLogger("remote_env.pool.server")

#: Ray's marker resource of the head node.
HEAD_RESOURCE: Final = "node:__internal_head__"
#: How long a look at the cluster's resources (a GCS call) is trusted.
ENV_RESOURCE_RECHECK_S: Final = 5.0


@dataclasses.dataclass(frozen=True)
class Launched:
    """A created actor, its ``start()`` sent."""

    generation: int
    handle: Any
    actor_id: str  # hex
    start_ref: Any


class LaunchFailed(Exception):
    """Ray would not create the actor; ``generation`` is the last one tried."""

    def __init__(self, message: str, generation: int) -> None:
        super().__init__(message)
        self.generation = generation


class ActorLauncher:
    """Creates env actors in Ray namespace ``ray_namespace``.

    Owns how actors are placed: ``env_resource`` True places them by the env
    resource always (the operator's clusters, whose workers advertise it); None
    detects it, cached for :data:`ENV_RESOURCE_RECHECK_S` (a pool server that
    started before any worker joined then placed actors by CPU, and two landed on
    one worker pod).
    """

    def __init__(self, *, ray_namespace: str, actor_options: Mapping[str, Any],
                 env_resource: bool | None = None) -> None:
        self.ray_namespace = ray_namespace
        self._actor_options = dict(actor_options)
        self._env_resource_required = env_resource
        self._env_resource_seen: tuple[float, bool] = (-ENV_RESOURCE_RECHECK_S, False)

    def launch(self, spec: spec_mod.PoolSpec, *, slot: int, num_envs: int, generation: int,
               after_failure: bool, restarts: int) -> Launched:
        """Create slot ``slot``'s next actor (after ``generation``) and send it ``start()``.

        ``after_failure``: its envs replace failed ones, and must be reset before
        stepping (NEXT_STEP does it on their next step), counting ``restarts``.

        Raises:
            LaunchFailed: Ray refused the actor (no retry will do better).
        """
        ft = spec.fault_tolerance
        options: dict[str, Any] = {
            "namespace": self.ray_namespace,
            "lifetime": "detached",
            "max_concurrency": 1,
            "max_restarts": 0,  # restarts are ours: Ray's would come back un-started
        }
        if spec.ray.runtime_env:
            options["runtime_env"] = dict(spec.ray.runtime_env)
        if self.has_env_resource():
            # The env units are the placement; num_cpus=0 because Ray holds 1 CPU per
            # actor for its lifetime once any resource is named, which would cap a
            # worker pod at one actor per CPU instead of envsPerWorker envs.
            options["resources"] = {spec_mod.ENV_RESOURCE: num_envs}
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
        if after_failure:
            # Fresh envs must be reset before stepping; NEXT_STEP does it on the next step.
            kwargs["restart_seeds"] = [None] * num_envs
            kwargs["restarts"] = [restarts] * num_envs
        host_cls = self.actor_class()
        factory = entrypoints.EnvFactory.from_spec(spec.env)
        bad_env = runtime_env_error(spec.ray.runtime_env)
        if bad_env is not None:
            raise LaunchFailed(f"spec.ray.runtimeEnv: {bad_env}", generation)
        for _ in range(3):
            generation += 1
            name = host_name(slot, generation)
            try:
                handle = host_cls.options(name=name, **options).remote(
                    [factory] * num_envs, **kwargs)
                break
            except ValueError as exc:
                if "already taken" not in str(exc):
                    raise LaunchFailed(first_line(exc), generation) from exc
                log.warning("pool %s: %s", spec.name, exc)  # a stale actor: skip a generation
            except Exception as exc:  # Ray refused the actor: no retry will do better
                raise LaunchFailed(first_line(exc), generation) from exc
        else:
            raise RuntimeError(f"pool {spec.name}: cannot name a new actor for slot {slot}")
        return Launched(generation, handle, handle._actor_id.hex(), handle.start.remote())

    def actor_class(self) -> Any:
        """The Ray actor class, from the actor side itself: the pool server loads no
        trainer code to create actors."""
        from remote_env.actor import host as actor_host

        return actor_host.actor_class()

    def has_env_resource(self) -> bool:
        """Place actors by the env resource (see the class)."""
        if self._env_resource_required is not None:
            return self._env_resource_required
        import ray

        checked, has = self._env_resource_seen
        if time.monotonic() - checked > ENV_RESOURCE_RECHECK_S:
            has = spec_mod.ENV_RESOURCE in ray.cluster_resources()  # type: ignore[no-untyped-call]
            self._env_resource_seen = (time.monotonic(), has)
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


def env_id_error(env: spec_mod.EnvSpec, runtime_env: Mapping[str, Any]) -> str | None:
    """What gymnasium says is wrong with ``spec.env.id`` (None: nothing, or not
    decidable here), where a spec is loaded to be run, before any actor starts.

    Decided only for a plain id (no ``module:`` part) and no ``runtimeEnv``: then the
    actors see the registry this process sees (same image, same packages). A
    ``module:EnvId`` would import user code, which the pool server never does, and a
    ``runtimeEnv`` may bring the package that registers the id: the actor's failure
    (``lastError``) says it then, with the same text.
    """
    if env.id is None or ":" in env.id or runtime_env:
        return None
    import gymnasium as gym

    try:
        entrypoints.env_spec(env.id)
    except gym.error.Error as exc:
        return str(exc)
    return None
