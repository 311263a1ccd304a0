"""The validated EnvPool spec: frozen records with every default filled in.

Built by :func:`remote_env.spec.parse.parse_spec`; read by the operator (what to
build) and the pool server (what to run). Stdlib only.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from collections.abc import Mapping
from typing import Any

from remote_env.spec import fields


@dataclasses.dataclass(frozen=True)
class Limits:
    """Bounds a CRD cannot know: the operator's settings, not schema."""

    max_workers: int = 1000


@dataclasses.dataclass(frozen=True)
class EnvSpec:
    id: str | None
    entrypoint: str | None
    kwargs: Mapping[str, Any]
    multi_agent: bool


@dataclasses.dataclass(frozen=True)
class FaultTolerance:
    restart_failed_envs: bool = fields.FIELDS["spec.faultTolerance.restartFailedEnvs"].default
    #: 0 disables hang detection.
    step_timeout_seconds: float = fields.FIELDS["spec.faultTolerance.stepTimeoutSeconds"].default
    max_restarts: int = fields.DEFAULT_MAX_RESTARTS
    restart_backoff_seconds: float = fields.FIELDS[
        "spec.faultTolerance.restartBackoffSeconds"].default
    #: 0: an actor's start may take forever.
    start_timeout_seconds: float = fields.FIELDS[
        "spec.faultTolerance.startTimeoutSeconds"].default

    @property
    def step_timeout(self) -> float | None:
        """``step_timeout_seconds`` as ``RemoteVectorEnv`` takes it (None: no hang check)."""
        return self.step_timeout_seconds or None

    @property
    def start_timeout(self) -> float | None:
        """``start_timeout_seconds``, None for no limit."""
        return self.start_timeout_seconds or None


@dataclasses.dataclass(frozen=True)
class Resources:
    """Container requests/limits, quantities kept as the user wrote them (strings)."""

    requests: Mapping[str, str]
    limits: Mapping[str, str]

    def to_manifest(self) -> dict[str, dict[str, str]]:
        out: dict[str, dict[str, str]] = {}
        if self.requests:
            out["requests"] = dict(self.requests)
        if self.limits:
            out["limits"] = dict(self.limits)
        return out


@dataclasses.dataclass(frozen=True)
class HeadSpec:
    resources: Resources
    node_selector: Mapping[str, str] = dataclasses.field(default_factory=dict)
    tolerations: tuple[Mapping[str, Any], ...] = ()


@dataclasses.dataclass(frozen=True)
class WorkerSpec:
    resources: Resources
    envs_per_worker: int
    node_selector: Mapping[str, str]
    tolerations: tuple[Mapping[str, Any], ...]


@dataclasses.dataclass(frozen=True)
class RaySpec:
    version: str
    image: str
    head: HeadSpec
    worker: WorkerSpec
    runtime_env: Mapping[str, Any]
    #: ``token`` (default): Ray token authentication (KubeRay ``authOptions``); ``disabled``.
    auth_mode: str = fields.FIELDS["spec.ray.authMode"].default
    #: Secrets whose keys become env vars of the Ray containers (credentials for envs).
    env_from_secrets: tuple[str, ...] = ()

    @property
    def token_auth(self) -> bool:
        return self.auth_mode == "token"


@dataclasses.dataclass(frozen=True)
class Autoscaling:
    """``spec.autoscaling``: keep a buffer of free warm envs above those trainers lease.

    The operator turns it into ``spec.replicas`` (written through the scale
    subresource, as ``kubectl scale`` does); exactly one of ``buffer_envs`` and
    ``buffer_percent`` is set. The sizing rule is
    :func:`envpool_operator.autoscaler.recommend`.
    """

    min_replicas: int
    max_replicas: int
    #: Free envs to keep above the leased ones.
    buffer_envs: int | None = None
    #: Share of the pool (in %) to keep free, as Agones' ``bufferSize: "20%"``.
    buffer_percent: int | None = None
    #: A lower size is applied only after it was asked for this long without a pause.
    scale_down_delay_seconds: int = fields.FIELDS["spec.autoscaling.scaleDownDelaySeconds"].default

    def to_manifest(self) -> dict[str, Any]:
        out: dict[str, Any] = {"minReplicas": self.min_replicas, "maxReplicas": self.max_replicas,
                               "scaleDownDelaySeconds": self.scale_down_delay_seconds}
        if self.buffer_envs is not None:
            out["bufferEnvs"] = self.buffer_envs
        if self.buffer_percent is not None:
            out["bufferPercent"] = self.buffer_percent
        return out


@dataclasses.dataclass(frozen=True)
class UpdateStrategy:
    """``spec.updateStrategy``: how a change of the actors' build rolls through the pool.

    The pool server replaces free actors of an older revision in place (same Ray
    pods), keeping at most ``max_unavailable`` envs out of service at once; a leased
    actor waits until its lease ends. Deployment's ``maxUnavailable``, without surge:
    the pool's pods are sized for ``replicas``.
    """

    #: An env count (int >= 1) or a share of ``replicas`` (``"25%"``, rounded down).
    max_unavailable: int | str = fields.DEFAULT_MAX_UNAVAILABLE
    #: ``WaitForRelease`` or ``ReplaceAfterGrace`` (:data:`fields.LEASED_ACTOR_POLICIES`).
    leased_actors: str = fields.LEASED_ACTOR_POLICIES[0]
    #: With ``ReplaceAfterGrace``: how long a leased outdated actor is left to its trainer.
    leased_grace_seconds: int = fields.DEFAULT_LEASED_GRACE_SECONDS

    @property
    def leased_grace(self) -> float | None:
        """Seconds after which a leased outdated actor is rebuilt anyway (None: never)."""
        return float(self.leased_grace_seconds) if self.leased_actors == "ReplaceAfterGrace" \
            else None

    def to_manifest(self) -> dict[str, Any]:
        return {"maxUnavailable": self.max_unavailable, "leasedActors": self.leased_actors,
                "leasedGraceSeconds": self.leased_grace_seconds}

    def max_unavailable_envs(self, replicas: int) -> int:
        """``max_unavailable`` in envs for a pool of ``replicas`` (a percentage rounds
        down, as a Deployment's does; 0 still lets one actor at a time through).

            >>> UpdateStrategy("25%").max_unavailable_envs(10), UpdateStrategy(3).max_unavailable_envs(10)
            (2, 3)
        """
        if isinstance(self.max_unavailable, int):
            return self.max_unavailable
        m = fields.PERCENT_RE.match(self.max_unavailable)
        assert m is not None  # the parser guarantees the form
        return replicas * int(m.group(1)) // 100


@dataclasses.dataclass(frozen=True)
class HeadFaultTolerance:
    """``spec.headFaultTolerance``: KubeRay GCS fault tolerance for the pool.

    With it the GCS keeps its tables in Redis, so the head pod's loss leaves the worker
    pods, their env actors and the leases in place; a new head reloads them. The Redis is
    the operator's own for the pool (``redis_address`` empty) or one the user names.
    """

    enabled: bool = fields.DEFAULT_HEAD_FAULT_TOLERANCE
    #: host:port of an external Redis; "": the operator runs one (``<name>-redis``).
    redis_address: str = ""
    #: With ``redis_address``: the Secret holding its password ("" : none).
    password_secret: str = ""
    password_key: str = fields.DEFAULT_REDIS_PASSWORD_KEY

    @property
    def provisioned(self) -> bool:
        """The operator runs the pool's Redis."""
        return self.enabled and not self.redis_address

    def to_manifest(self) -> dict[str, Any]:
        out: dict[str, Any] = {"enabled": self.enabled, "passwordKey": self.password_key}
        if self.redis_address:
            out["redisAddress"] = self.redis_address
        if self.password_secret:
            out["passwordSecret"] = self.password_secret
        return out


@dataclasses.dataclass(frozen=True)
class PoolSpec:
    """A validated EnvPool spec with every default filled in."""

    name: str
    namespace: str
    env: EnvSpec
    replicas: int
    envs_per_actor: int
    threads_per_actor: int
    batch_wait_ms: int
    autoreset_mode: str  # NextStep, SameStep, Disabled (= gymnasium AutoresetMode values)
    fault_tolerance: FaultTolerance
    ray: RaySpec
    metrics_port: int
    suspend: bool
    #: None: a fixed size (``replicas``, changed by hand or by an HPA).
    autoscaling: Autoscaling | None = None
    update_strategy: UpdateStrategy = UpdateStrategy()
    head_fault_tolerance: HeadFaultTolerance = HeadFaultTolerance()

    @property
    def desired_envs(self) -> int:
        """Envs the pool server keeps running: none while suspended."""
        return 0 if self.suspend else self.replicas

    @property
    def ray_namespace(self) -> str:
        return fields.ray_namespace(self.name)

    @property
    def actors(self) -> int:
        """Env actors the pool server creates (the last one may be partly filled)."""
        return math.ceil(self.replicas / self.envs_per_actor)

    @property
    def actors_per_worker(self) -> int:
        return self.ray.worker.envs_per_worker // self.envs_per_actor

    @property
    def desired_workers(self) -> int:
        """Worker pods needed to host every actor, ignoring ``suspend``."""
        return self.workers_for(self.replicas)

    def workers_for(self, envs: int) -> int:
        """Worker pods needed to host ``envs`` envs in actors of ``envsPerActor``."""
        return math.ceil(math.ceil(envs / self.envs_per_actor) / self.actors_per_worker)

    @property
    def workers(self) -> int:
        """Worker pods to run now: suspend scales workers to zero, the head stays."""
        return 0 if self.suspend else self.desired_workers

    def host_signature(self) -> dict[str, Any]:
        """What a running env actor was built with; a change needs new actors."""
        ft = self.fault_tolerance
        return {
            "env": {"id": self.env.id, "entrypoint": self.env.entrypoint,
                    "kwargs": dict(self.env.kwargs), "multiAgent": self.env.multi_agent},
            "autoresetMode": self.autoreset_mode,
            "threadsPerActor": self.threads_per_actor,
            "restartFailedEnvs": ft.restart_failed_envs,
            "maxRestarts": ft.max_restarts,
            "restartBackoffSeconds": ft.restart_backoff_seconds,
            "runtimeEnv": dict(self.ray.runtime_env),
        }

    def revision(self) -> str:
        """A short hash of how the pool's actors are built (:meth:`host_signature` and
        ``envsPerActor``): actors of another revision are rolled, a few at a time.

        The pool server stamps each actor with it; the operator compares it with the
        one the pool server reports to tell whether a rollout is done.
        """
        material = {**self.host_signature(), "envsPerActor": self.envs_per_actor}
        blob = json.dumps(material, sort_keys=True, default=str).encode()
        return hashlib.sha256(blob).hexdigest()[:12]

    def to_manifest(self) -> dict[str, Any]:
        """The spec back in CRD (camelCase) form, defaults included."""
        env: dict[str, Any] = {"kwargs": dict(self.env.kwargs), "multiAgent": self.env.multi_agent}
        if self.env.id is not None:
            env["id"] = self.env.id
        if self.env.entrypoint is not None:
            env["entrypoint"] = self.env.entrypoint
        ft = self.fault_tolerance
        worker = self.ray.worker
        return {
            "env": env,
            "replicas": self.replicas,
            "envsPerActor": self.envs_per_actor,
            "threadsPerActor": self.threads_per_actor,
            "batchWaitMs": self.batch_wait_ms,
            "autoresetMode": self.autoreset_mode,
            "faultTolerance": {
                "restartFailedEnvs": ft.restart_failed_envs,
                "stepTimeoutSeconds": ft.step_timeout_seconds,
                "startTimeoutSeconds": ft.start_timeout_seconds,
                "maxRestarts": ft.max_restarts,
                "restartBackoffSeconds": ft.restart_backoff_seconds,
            },
            "ray": {
                "version": self.ray.version,
                "image": self.ray.image,
                "authMode": self.ray.auth_mode,
                "head": {
                    "resources": self.ray.head.resources.to_manifest(),
                    "nodeSelector": dict(self.ray.head.node_selector),
                    "tolerations": [dict(t) for t in self.ray.head.tolerations],
                },
                "worker": {
                    "resources": worker.resources.to_manifest(),
                    "envsPerWorker": worker.envs_per_worker,
                    "nodeSelector": dict(worker.node_selector),
                    "tolerations": [dict(t) for t in worker.tolerations],
                },
                "runtimeEnv": dict(self.ray.runtime_env),
                "envFromSecrets": list(self.ray.env_from_secrets),
            },
            "metrics": {"port": self.metrics_port},
            "suspend": self.suspend,
            **({"autoscaling": self.autoscaling.to_manifest()} if self.autoscaling else {}),
            # left out at its default, so the ConfigMap stays readable by an older pool server
            **({"updateStrategy": self.update_strategy.to_manifest()}
               if self.update_strategy != UpdateStrategy() else {}),
            # likewise
            **({"headFaultTolerance": self.head_fault_tolerance.to_manifest()}
               if self.head_fault_tolerance != HeadFaultTolerance() else {}),
        }

    def to_document(self) -> dict[str, Any]:
        """The whole EnvPool document (what ``envpool serve --config`` reads)."""
        return {
            "apiVersion": fields.API_VERSION,
            "kind": fields.KIND,
            "metadata": {"name": self.name, "namespace": self.namespace},
            "spec": self.to_manifest(),
        }
