"""The EnvPool spec's names, defaults and bounds: each written once, here.

The parser (:mod:`remote_env.spec.parse`) reads its defaults and limits from
:data:`FIELDS` and its field names from :data:`OBJECTS`; a unit test proves that
the CRD's openAPIV3Schema (``manifests/crd/envpool.dev_envpools.yaml``) has the
same fields, types, defaults, ranges, enums and lengths. Stdlib only.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Final, Literal

GROUP: Final = "envpool.dev"
VERSION: Final = "v1alpha1"
API_VERSION: Final = f"{GROUP}/{VERSION}"
KIND: Final = "EnvPool"
PLURAL: Final = "envpools"

#: Child names are derived from the EnvPool name (``<name>-head-svc`` and pod
#: names made by KubeRay); 40 leaves room under the 63-character label limit.
MAX_NAME_LENGTH: Final = 40
MAX_REPLICAS: Final = 100_000
#: ``envsPerActor`` when unset: ``min(DEFAULT_ENVS_PER_ACTOR, replicas)`` (so not a
#: schema default).
DEFAULT_ENVS_PER_ACTOR: Final = 8
#: Ray custom resource each worker pod advertises (``envsPerWorker`` units); the pool
#: server asks one unit per env an actor hosts, so actors land on workers, never on
#: the head. The operator's builders and the pool server both read it here.
ENV_RESOURCE: Final = "envpool_env"
#: The pool server's lease API (trainers without Ray, and their relay) on the head pod;
#: the operator declares it on the head's containers[0] (its Service port).
LEASE_API_PORT: Final = 8267
#: Ports the Ray head pod already listens on (GCS, dashboard, client, the metrics
#: export (8080) and dashboard agent (52365) ports KubeRay sets, and the pool server's
#: lease API): the pool server shares the head pod's network, so its metrics port must
#: be none of them. On the real node 8080, the old default, was Ray's metrics
#: exporter: the sidecar's readiness probe got Ray's answer and the pod turned Ready
#: without a pool server; 8267 would leave the lease API or /metrics unbound.
RAY_PORTS: Final = (6379, 8080, 8265, LEASE_API_PORT, 10001, 52365)
#: who holds each of :data:`RAY_PORTS` (for the error that refuses one)
HEAD_PORT_OWNERS: Final = {6379: "Ray's GCS", 8080: "Ray's metrics export",
                           8265: "Ray's dashboard", LEASE_API_PORT: "the pool server's lease API",
                           10001: "Ray client", 52365: "Ray's dashboard agent"}
#: Port ranges (inclusive) the head pod's Ray binds besides :data:`RAY_PORTS`, and who
#: holds them: the operator's head ``rayStartParams`` leave ``ray start``'s worker
#: port range as it is (``--min-worker-port 10002 --max-worker-port 19999``: the pool
#: server's driver, the lease actor and other workers on the head take ports from it),
#: and its Ray client server (10001) starts a server per connected trainer on
#: 23000-23999 (``ray.util.client.server.proxier``). Ray's other ports on the head
#: (raylet, object manager, agents' gRPC) are picked at random at start: no fixed
#: port to refuse.
HEAD_PORT_RANGES: Final = ((10002, 19999, "Ray's worker processes (ray start's default "
                                          "--min-worker-port/--max-worker-port)"),
                           (23000, 23999, "Ray client's per-trainer servers"))


def head_port_owner(port: int) -> str | None:
    """Who holds ``port`` on the Ray head pod (:data:`RAY_PORTS`,
    :data:`HEAD_PORT_RANGES`), said as "<port> is ...", None if nothing there binds it."""
    if port in HEAD_PORT_OWNERS:
        return f"{HEAD_PORT_OWNERS[port]}'s"
    for low, high, owner in HEAD_PORT_RANGES:
        if low <= port <= high:
            return f"in the range {low}-{high} of {owner}"
    return None


def free_head_ports() -> list[tuple[int, int]]:
    """The ranges (inclusive) within ``spec.metrics.port``'s bounds that no fixed port of
    the head pod takes: where a pool's ``metrics.port`` may go."""
    bounds = FIELDS["spec.metrics.port"]
    taken = sorted([(p, p) for p in RAY_PORTS] + [(lo, hi) for lo, hi, _ in HEAD_PORT_RANGES])
    free: list[tuple[int, int]] = []
    start = int(bounds.minimum or 0)
    for low, high in taken:
        if low > start:
            free.append((start, low - 1))
        start = max(start, high + 1)
    if start <= int(bounds.maximum or 0):
        free.append((start, int(bounds.maximum or 0)))
    return free
#: Ray's raylet, GCS and object store do not start in less.
MIN_RAY_MEMORY_BYTES: Final = 256 * 2**20
#: gymnasium ``AutoresetMode`` values, which the CRD spells the same way.
AUTORESET_MODES: Final = ("NextStep", "SameStep", "Disabled")
TOLERATION_OPERATORS: Final = ("Exists", "Equal")
#: KubeRay's ``spec.authOptions.mode`` values, spelled as KubeRay spells them.
RAY_AUTH_MODES: Final = ("token", "disabled")
#: Ray token authentication needs Ray >= 2.52 (KubeRay refuses older with ``mode: token``).
MIN_RAY_TOKEN_AUTH: Final = (2, 52, 0)
TOLERATION_EFFECTS: Final = ("NoSchedule", "PreferNoSchedule", "NoExecute")
#: Most entries of a resources ``requests``/``limits`` map, and the longest quantity.
MAX_QUANTITIES: Final = 16
MAX_QUANTITY_LENGTH: Final = 64
MAX_NODE_SELECTOR: Final = 32
MAX_LABEL_VALUE_LENGTH: Final = 63
MAX_TOLERATIONS: Final = 32
MAX_TOLERATION_KEY_LENGTH: Final = 316
#: ``ray.envFromSecrets``: Secret names (DNS subdomains) whose keys become env vars.
MAX_ENV_FROM_SECRETS: Final = 16
MAX_SECRET_NAME_LENGTH: Final = 253
SECRET_NAME_RE: Final = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
#: ``headFaultTolerance.redisAddress``: a host (name or IPv4) and a port.
REDIS_ADDRESS_RE: Final = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9.]*[A-Za-z0-9])?:[0-9]{1,5}$")
#: Said the same way by the model and the CRD's CEL rule (a test compares them).
PASSWORD_SECRET_MESSAGE: Final = (
    "headFaultTolerance.passwordSecret is the password of an external Redis: set redisAddress "
    "too (the operator's own Redis has its own Secret)")

#: ``spec.headFaultTolerance.enabled`` when unset: on. Not a CRD schema default, so that
#: EnvPools stay readable by an operator from before the field (an upgrade walk's).
DEFAULT_HEAD_FAULT_TOLERANCE: Final = True
#: ``spec.headFaultTolerance.passwordKey`` when unset.
DEFAULT_REDIS_PASSWORD_KEY: Final = "password"
#: ``spec.updateStrategy.maxUnavailable`` when unset: Deployment's default.
DEFAULT_MAX_UNAVAILABLE: Final = "25%"
#: ``spec.updateStrategy.leasedActors``: what a rollout does with a leased outdated actor.
#: WaitForRelease: nothing until its lease ends (a trainer is never cut off).
#: ReplaceAfterGrace: rebuilt ``leasedGraceSeconds`` after the rollout reached it, lease or
#: not (its trainer sees those envs fail once and steps the new ones).
LEASED_ACTOR_POLICIES: Final = ("WaitForRelease", "ReplaceAfterGrace")
DEFAULT_LEASED_GRACE_SECONDS: Final = 600
#: A percentage form of ``maxUnavailable`` (the range, 1-100, is checked apart).
PERCENT_RE: Final = re.compile(r"^(0|[1-9][0-9]*)%$")
#: The CRD's CEL message (a test compares them); the model says which part was wrong.
MAX_UNAVAILABLE_MESSAGE: Final = (
    "updateStrategy.maxUnavailable must be an integer >= 1 or a percentage from 1% to 100% "
    "(envs out of service at once while a new env spec rolls out)")

NAME_RE: Final = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_IDENT: Final = r"[A-Za-z_][A-Za-z0-9_]*"
ENTRYPOINT_RE: Final = re.compile(rf"^{_IDENT}(\.{_IDENT})*:{_IDENT}(\.{_IDENT})*$")
#: A gymnasium id, or "module:EnvId" (one ":" at most: gymnasium splits it once, and a
#: trailing ":" names nothing). The CRD's CEL rule is this pattern (test_operator_crd).
ENV_ID_RE: Final = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_./-]*(:[A-Za-z0-9_./-]+)?$")
RAY_VERSION_RE: Final = re.compile(r"^[0-9]+\.[0-9]+\.[0-9]+$")
#: A Kubernetes quantity without a sign (negative resources make no sense).
QUANTITY_RE: Final = re.compile(
    r"^(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)

FieldType = Literal["integer", "number", "boolean", "string"]


@dataclasses.dataclass(frozen=True)
class Field:
    """One scalar field: its schema type, default (None: none) and bounds."""

    type: FieldType
    default: Any = None
    minimum: float | None = None
    maximum: float | None = None
    enum: tuple[str, ...] | None = None
    min_length: int | None = None
    max_length: int | None = None


#: Every scalar field of ``spec`` with a default or a bound, by its path.
FIELDS: Final[dict[str, Field]] = {
    "spec.env.id": Field("string", min_length=1, max_length=253),
    "spec.env.entrypoint": Field("string", min_length=3, max_length=256),
    "spec.env.multiAgent": Field("boolean", False),
    "spec.replicas": Field("integer", minimum=1, maximum=MAX_REPLICAS),
    "spec.envsPerActor": Field("integer", minimum=1, maximum=1024),
    "spec.threadsPerActor": Field("integer", 1, 1, 1024),
    "spec.batchWaitMs": Field("integer", 2, 0, 60_000),
    "spec.autoresetMode": Field("string", "NextStep", enum=AUTORESET_MODES),
    "spec.faultTolerance.restartFailedEnvs": Field("boolean", True),
    #: 0 disables hang detection.
    "spec.faultTolerance.stepTimeoutSeconds": Field("number", 60.0, 0, 86_400),
    #: How long an env actor's start (its envs' constructors) may take; 0: no limit.
    #: Simulators start slowly, so longer than a step's.
    "spec.faultTolerance.startTimeoutSeconds": Field("number", 300.0, 0, 86_400),
    "spec.faultTolerance.maxRestarts": Field("integer", 100, 0, 1_000_000),
    "spec.faultTolerance.restartBackoffSeconds": Field("number", 1.0, 0, 3600),
    "spec.ray.version": Field("string", "2.60.0", max_length=32),
    "spec.ray.image": Field("string", "", max_length=512),
    #: token: KubeRay generates a Secret and every Ray process requires it.
    "spec.ray.authMode": Field("string", "token", enum=RAY_AUTH_MODES),
    "spec.ray.worker.envsPerWorker": Field("integer", 64, 1, 10_000),
    "spec.metrics.port": Field("integer", 9480, 1024, 65535),
    "spec.suspend": Field("boolean", False),
    # Present: the operator sizes the pool (spec.replicas, through the scale
    # subresource) from the envs trainers lease; see remote_env.spec.model.Autoscaling.
    "spec.autoscaling.minReplicas": Field("integer", 1, 1, MAX_REPLICAS),
    "spec.autoscaling.maxReplicas": Field("integer", minimum=1, maximum=MAX_REPLICAS),
    "spec.autoscaling.bufferEnvs": Field("integer", minimum=0, maximum=MAX_REPLICAS),
    #: Agones' bufferSize percentage: the share of the pool kept free (not of the leased).
    "spec.autoscaling.bufferPercent": Field("integer", minimum=1, maximum=99),
    #: HPA's default scale-down stabilization window.
    "spec.autoscaling.scaleDownDelaySeconds": Field("integer", 300, 0, 86_400),
    # No schema defaults under updateStrategy (see the CRD): the model's apply.
    "spec.updateStrategy.leasedActors": Field("string", enum=LEASED_ACTOR_POLICIES),
    "spec.updateStrategy.leasedGraceSeconds": Field("integer", minimum=0, maximum=7 * 86_400),
    #: GCS fault tolerance (KubeRay gcsFaultToleranceOptions): the head's loss keeps the envs.
    #: No schema defaults under headFaultTolerance (see the CRD): the model's apply
    #: (DEFAULT_HEAD_FAULT_TOLERANCE, DEFAULT_REDIS_PASSWORD_KEY).
    "spec.headFaultTolerance.enabled": Field("boolean"),
    #: host:port of an external Redis; empty: the operator runs one per pool.
    "spec.headFaultTolerance.redisAddress": Field("string", max_length=260),
    "spec.headFaultTolerance.passwordSecret": Field("string", max_length=MAX_SECRET_NAME_LENGTH),
    "spec.headFaultTolerance.passwordKey": Field("string", min_length=1, max_length=253),
}

#: The fields of each object of ``spec`` (``resources`` and ``toleration`` stand for
#: every resources block and every item of ``tolerations``).
OBJECTS: Final[dict[str, tuple[str, ...]]] = {
    "spec": ("env", "replicas", "envsPerActor", "threadsPerActor", "batchWaitMs",
             "autoresetMode", "faultTolerance", "ray", "metrics", "suspend",
             "headFaultTolerance", "autoscaling", "updateStrategy"),
    "spec.env": ("id", "entrypoint", "kwargs", "multiAgent"),
    "spec.faultTolerance": ("restartFailedEnvs", "stepTimeoutSeconds", "startTimeoutSeconds",
                            "maxRestarts", "restartBackoffSeconds"),
    "spec.ray": ("version", "image", "authMode", "head", "worker", "runtimeEnv",
                 "envFromSecrets"),
    "spec.ray.head": ("resources", "nodeSelector", "tolerations"),
    "spec.ray.worker": ("resources", "envsPerWorker", "nodeSelector", "tolerations"),
    "spec.metrics": ("port",),
    "spec.autoscaling": ("minReplicas", "maxReplicas", "bufferEnvs", "bufferPercent",
                         "scaleDownDelaySeconds"),
    "spec.updateStrategy": ("maxUnavailable", "leasedActors", "leasedGraceSeconds"),
    "spec.headFaultTolerance": ("enabled", "redisAddress", "passwordSecret", "passwordKey"),
    "resources": ("requests", "limits"),
    "toleration": ("key", "operator", "value", "effect", "tolerationSeconds"),
}

#: Values used where the library and the pool share a default.
DEFAULT_MAX_RESTARTS: Final[int] = FIELDS["spec.faultTolerance.maxRestarts"].default
DEFAULT_BATCH_WAIT_MS: Final[int] = FIELDS["spec.batchWaitMs"].default
DEFAULT_METRICS_PORT: Final[int] = FIELDS["spec.metrics.port"].default
DEFAULT_RAY_VERSION: Final[str] = FIELDS["spec.ray.version"].default
DEFAULT_ENVS_PER_WORKER: Final[int] = FIELDS["spec.ray.worker.envsPerWorker"].default


#: Said the same way by the model and the CRD's CEL rules (a test compares them).
BUFFER_FORMS_MESSAGE: Final = (
    "exactly one of autoscaling.bufferEnvs (free envs kept above those leased) or "
    "autoscaling.bufferPercent (share of the pool kept free) must be set")
MIN_MAX_MESSAGE: Final = "autoscaling.minReplicas must be <= autoscaling.maxReplicas"
MIN_ACTOR_MESSAGE: Final = (
    "autoscaling.minReplicas must be >= envsPerActor: the pool never shrinks below one actor")


def ray_namespace(pool_name: str) -> str:
    """The Ray namespace holding a pool's named actors."""
    return f"envpool-{pool_name}"
