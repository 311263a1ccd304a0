"""The validated EnvPool spec: frozen records with every default filled in.

Built by :func:`remote_env.spec.parse.parse_spec`; read by the operator (what to
build) and the pool server (what to run). Stdlib only.
"""

from __future__ import annotations

import dataclasses
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
        }

    def to_document(self) -> dict[str, Any]:
        """The whole EnvPool document (what ``envpool serve --config`` reads)."""
        return {
            "apiVersion": fields.API_VERSION,
            "kind": fields.KIND,
            "metadata": {"name": self.name, "namespace": self.namespace},
            "spec": self.to_manifest(),
        }
