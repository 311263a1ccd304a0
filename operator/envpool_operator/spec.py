"""Parse and validate an EnvPool ``spec`` into a frozen :class:`PoolSpec`.

The CRD schema rejects what the API server can check (types, ranges, enums,
CEL rules). This module repeats those checks, because the same YAML also runs
without an API server (``envpool run -f pool.yaml``) and an old CRD may be
installed, and adds the checks a schema cannot express: resource quantities
that make sense together, and the worker count against the operator's limits.

Pure: no Kubernetes client, no kopf. Every problem is reported at once, each
saying what was wrong, where, and what was expected::

    >>> parse_spec({"env": {"id": "CartPole-v1"}, "replicas": 16}, name="cp").workers
    1
    >>> try:
    ...     parse_spec({"env": {}, "replicas": 0}, name="cp")
    ... except SpecError as exc:
    ...     for error in exc.errors:
    ...         print(error)
    spec.env: exactly one of env.id or env.entrypoint must be set, got neither
    spec.replicas: must be in [1, 100000], got 0
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any, Final

GROUP: Final = "envpool.dev"
VERSION: Final = "v1alpha1"
API_VERSION: Final = f"{GROUP}/{VERSION}"
KIND: Final = "EnvPool"
PLURAL: Final = "envpools"

#: Child names are derived from the EnvPool name (``<name>-head-svc`` and pod
#: names made by KubeRay); 40 leaves room under the 63-character label limit.
MAX_NAME_LENGTH: Final = 40
MAX_REPLICAS: Final = 100_000
DEFAULT_ENVS_PER_ACTOR: Final = 8
DEFAULT_ENVS_PER_WORKER: Final = 64
DEFAULT_RAY_VERSION: Final = "2.60.0"
DEFAULT_METRICS_PORT: Final = 8080
#: Ports the Ray head container already listens on (GCS, dashboard, client).
RAY_PORTS: Final = frozenset({6379, 8265, 10001})
AUTORESET_MODES: Final = ("NextStep", "SameStep", "Disabled")

_NAME_RE: Final = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_IDENT: Final = r"[A-Za-z_][A-Za-z0-9_]*"
ENTRYPOINT_RE: Final = re.compile(rf"^{_IDENT}(\.{_IDENT})*:{_IDENT}(\.{_IDENT})*$")
ENV_ID_RE: Final = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.:/-]*$")
RAY_VERSION_RE: Final = re.compile(r"^[0-9]+\.[0-9]+\.[0-9]+$")
#: A Kubernetes quantity without a sign (negative resources make no sense).
QUANTITY_RE: Final = re.compile(
    r"^(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)
_SUFFIX: Final[dict[str, float]] = {
    "": 1.0, "n": 1e-9, "u": 1e-6, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12,
    "P": 1e15, "E": 1e18, "Ki": 2.0**10, "Mi": 2.0**20, "Gi": 2.0**30, "Ti": 2.0**40,
    "Pi": 2.0**50, "Ei": 2.0**60,
}
#: Ray's raylet, GCS and object store do not start in less.
MIN_RAY_MEMORY_BYTES: Final = 256 * 2**20
_TOLERATION_OPERATORS: Final = ("Exists", "Equal")
_TOLERATION_EFFECTS: Final = ("NoSchedule", "PreferNoSchedule", "NoExecute")


class SpecError(ValueError):
    """An EnvPool spec that cannot be reconciled; ``errors`` lists every problem."""

    def __init__(self, errors: Sequence[str]) -> None:
        self.errors = list(errors)
        super().__init__("; ".join(self.errors))


@dataclasses.dataclass(frozen=True)
class Limits:
    """Operator-side bounds a CRD cannot know (they are settings, not schema)."""

    max_workers: int = 1000


@dataclasses.dataclass(frozen=True)
class EnvSpec:
    id: str | None
    entrypoint: str | None
    kwargs: Mapping[str, Any]
    multi_agent: bool


@dataclasses.dataclass(frozen=True)
class FaultTolerance:
    restart_failed_envs: bool = True
    step_timeout_seconds: float = 60.0
    max_restarts: int = 100
    restart_backoff_seconds: float = 1.0


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
    autoreset_mode: str
    fault_tolerance: FaultTolerance
    ray: RaySpec
    metrics_port: int
    suspend: bool

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
        return math.ceil(self.actors / self.actors_per_worker)

    @property
    def workers(self) -> int:
        """Worker pods to run now: suspend scales workers to zero, the head stays."""
        return 0 if self.suspend else self.desired_workers

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
                "maxRestarts": ft.max_restarts,
                "restartBackoffSeconds": ft.restart_backoff_seconds,
            },
            "ray": {
                "version": self.ray.version,
                "image": self.ray.image,
                "head": {"resources": self.ray.head.resources.to_manifest()},
                "worker": {
                    "resources": worker.resources.to_manifest(),
                    "envsPerWorker": worker.envs_per_worker,
                    "nodeSelector": dict(worker.node_selector),
                    "tolerations": [dict(t) for t in worker.tolerations],
                },
                "runtimeEnv": dict(self.ray.runtime_env),
            },
            "metrics": {"port": self.metrics_port},
            "suspend": self.suspend,
        }


def parse_quantity(text: str) -> float:
    """A Kubernetes quantity as a float (``"500m"`` -> 0.5, ``"1Gi"`` -> 2**30).

    Raises:
        ValueError: ``text`` is not an unsigned quantity.
    """
    if not QUANTITY_RE.match(text):
        raise ValueError(f"not a quantity: {text!r}")
    m = re.match(r"^([0-9.]+)(.*)$", text)
    assert m is not None  # QUANTITY_RE guarantees a leading number
    number, suffix = m.group(1), m.group(2)
    if suffix in _SUFFIX:
        return float(number) * _SUFFIX[suffix]
    return float(number + suffix)  # decimal exponent, e.g. "1e3"


class _Checker:
    """Collects problems so the user sees all of them in one condition."""

    def __init__(self) -> None:
        self.errors: list[str] = []

    def fail(self, path: str, message: str) -> None:
        self.errors.append(f"{path}: {message}")

    def mapping(self, value: Any, path: str) -> Mapping[str, Any]:
        if value is None:
            return {}
        if not isinstance(value, Mapping):
            self.fail(path, f"expected an object, got {type(value).__name__} {value!r}")
            return {}
        return value

    def unknown(self, value: Mapping[str, Any], path: str, known: Sequence[str]) -> None:
        for key in value:
            if key not in known:
                self.fail(f"{path}.{key}", f"unknown field (expected one of {', '.join(known)})")

    def boolean(self, value: Mapping[str, Any], key: str, path: str, default: bool) -> bool:
        got = value.get(key, default)
        if not isinstance(got, bool):
            self.fail(f"{path}.{key}", f"expected true or false, got {got!r}")
            return default
        return got

    def integer(
        self, value: Mapping[str, Any], key: str, path: str, default: int | None,
        lo: int, hi: int,
    ) -> int:
        got = value.get(key, default)
        if got is None:
            self.fail(f"{path}.{key}", f"required: an integer in [{lo}, {hi}]")
            return lo
        if isinstance(got, bool) or not isinstance(got, int):
            self.fail(f"{path}.{key}", f"expected an integer in [{lo}, {hi}], got {got!r}")
            return lo
        if not lo <= got <= hi:
            self.fail(f"{path}.{key}", f"must be in [{lo}, {hi}], got {got}")
            return max(lo, min(hi, got))
        return got

    def number(
        self, value: Mapping[str, Any], key: str, path: str, default: float,
        lo: float, hi: float,
    ) -> float:
        got = value.get(key, default)
        if isinstance(got, bool) or not isinstance(got, (int, float)):
            self.fail(f"{path}.{key}", f"expected a number in [{lo:g}, {hi:g}], got {got!r}")
            return default
        if not lo <= got <= hi:
            self.fail(f"{path}.{key}", f"must be in [{lo:g}, {hi:g}], got {got:g}")
            return default
        return float(got)

    def string(
        self, value: Mapping[str, Any], key: str, path: str, default: str | None,
    ) -> str | None:
        got = value.get(key, default)
        if got is not None and not isinstance(got, str):
            self.fail(f"{path}.{key}", f"expected a string, got {got!r}")
            return default
        return got

    def resources(self, value: Any, path: str) -> Resources:
        res = self.mapping(value, path)
        self.unknown(res, path, ("requests", "limits"))
        parsed: dict[str, dict[str, str]] = {}
        amounts: dict[str, dict[str, float]] = {}
        for part in ("requests", "limits"):
            parsed[part], amounts[part] = {}, {}
            for res_name, qty in self.mapping(res.get(part), f"{path}.{part}").items():
                where = f"{path}.{part}.{res_name}"
                if isinstance(qty, bool) or not isinstance(qty, (int, str)):
                    self.fail(where, f"expected a quantity such as 500m or 2Gi, got {qty!r}")
                    continue
                text = str(qty)
                try:
                    amount = parse_quantity(text)
                except ValueError:
                    self.fail(where, f"expected a quantity such as 500m or 2Gi, got {text!r}")
                    continue
                if amount <= 0:
                    self.fail(where, f"must be greater than zero, got {text!r}")
                    continue
                if res_name == "memory" and amount < MIN_RAY_MEMORY_BYTES:
                    self.fail(where, f"Ray needs at least 256Mi of memory, got {text!r}")
                parsed[part][res_name] = text
                amounts[part][res_name] = amount
        for res_name, req in amounts["requests"].items():
            lim = amounts["limits"].get(res_name)
            if lim is not None and req > lim:
                self.fail(
                    f"{path}.requests.{res_name}",
                    f"request {parsed['requests'][res_name]} exceeds limit "
                    f"{parsed['limits'][res_name]}",
                )
        return Resources(requests=parsed["requests"], limits=parsed["limits"])


def _parse_env(c: _Checker, raw: Any) -> EnvSpec:
    env = c.mapping(raw, "spec.env")
    c.unknown(env, "spec.env", ("id", "entrypoint", "kwargs", "multiAgent"))
    env_id = c.string(env, "id", "spec.env", None)
    entrypoint = c.string(env, "entrypoint", "spec.env", None)
    if (env_id is None) == (entrypoint is None):
        got = "both" if env_id is not None else "neither"
        c.fail("spec.env", f"exactly one of env.id or env.entrypoint must be set, got {got}")
    if env_id is not None and not ENV_ID_RE.match(env_id):
        c.fail("spec.env.id", f"expected a gymnasium id such as CartPole-v1, got {env_id!r}")
    if entrypoint is not None and not ENTRYPOINT_RE.match(entrypoint):
        c.fail(
            "spec.env.entrypoint",
            f"expected 'package.module:callable' (importable names), got {entrypoint!r}",
        )
    kwargs = c.mapping(env.get("kwargs"), "spec.env.kwargs")
    multi_agent = c.boolean(env, "multiAgent", "spec.env", False)
    return EnvSpec(id=env_id, entrypoint=entrypoint, kwargs=dict(kwargs), multi_agent=multi_agent)


def _parse_tolerations(c: _Checker, raw: Any) -> tuple[Mapping[str, Any], ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        c.fail("spec.ray.worker.tolerations", f"expected a list, got {raw!r}")
        return ()
    out: list[Mapping[str, Any]] = []
    for i, item in enumerate(raw):
        path = f"spec.ray.worker.tolerations[{i}]"
        tol = c.mapping(item, path)
        c.unknown(tol, path, ("key", "operator", "value", "effect", "tolerationSeconds"))
        op = tol.get("operator", "Equal")
        if op not in _TOLERATION_OPERATORS:
            c.fail(f"{path}.operator", f"expected Exists or Equal, got {op!r}")
        effect = tol.get("effect")
        if effect is not None and effect not in _TOLERATION_EFFECTS:
            c.fail(f"{path}.effect", f"expected one of {', '.join(_TOLERATION_EFFECTS)}")
        if op == "Exists" and tol.get("value"):
            c.fail(f"{path}.value", "must be empty when operator is Exists")
        out.append(dict(tol))
    return tuple(out)


def _parse_ray(c: _Checker, raw: Any) -> RaySpec:
    ray = c.mapping(raw, "spec.ray")
    c.unknown(ray, "spec.ray", ("version", "image", "head", "worker", "runtimeEnv"))
    version = c.string(ray, "version", "spec.ray", DEFAULT_RAY_VERSION) or DEFAULT_RAY_VERSION
    if not RAY_VERSION_RE.match(version):
        c.fail("spec.ray.version", f"expected a Ray release such as 2.60.0, got {version!r}")
    image = c.string(ray, "image", "spec.ray", "") or ""
    if any(ch.isspace() for ch in image):
        c.fail("spec.ray.image", f"an image reference has no whitespace, got {image!r}")
    head = c.mapping(ray.get("head"), "spec.ray.head")
    c.unknown(head, "spec.ray.head", ("resources",))
    worker = c.mapping(ray.get("worker"), "spec.ray.worker")
    c.unknown(
        worker, "spec.ray.worker", ("resources", "envsPerWorker", "nodeSelector", "tolerations"),
    )
    node_selector = c.mapping(worker.get("nodeSelector"), "spec.ray.worker.nodeSelector")
    for key, val in node_selector.items():
        if not isinstance(val, str):
            c.fail(f"spec.ray.worker.nodeSelector.{key}", f"expected a string, got {val!r}")
    return RaySpec(
        version=version,
        image=image,
        head=HeadSpec(resources=c.resources(head.get("resources"), "spec.ray.head.resources")),
        worker=WorkerSpec(
            resources=c.resources(worker.get("resources"), "spec.ray.worker.resources"),
            envs_per_worker=c.integer(
                worker, "envsPerWorker", "spec.ray.worker", DEFAULT_ENVS_PER_WORKER, 1, 10_000,
            ),
            node_selector={str(k): str(v) for k, v in node_selector.items()},
            tolerations=_parse_tolerations(c, worker.get("tolerations")),
        ),
        runtime_env=dict(c.mapping(ray.get("runtimeEnv"), "spec.ray.runtimeEnv")),
    )


_SPEC_FIELDS: Final = (
    "env", "replicas", "envsPerActor", "threadsPerActor", "batchWaitMs", "autoresetMode",
    "faultTolerance", "ray", "metrics", "suspend",
)


def parse_spec(
    spec: Mapping[str, Any], *, name: str, namespace: str = "default",
    limits: Limits | None = None,
) -> PoolSpec:
    """Validate an EnvPool's ``spec`` and fill its defaults.

    Args:
        spec: the ``spec`` mapping as stored by the API server (or read from YAML).
        name: the EnvPool's ``metadata.name`` (children are named after it).
        namespace: the EnvPool's namespace.
        limits: operator-side bounds, e.g. the most worker pods one pool may ask for.

    Raises:
        SpecError: with every problem found, each naming the field and what was expected.
    """
    limits = limits or Limits()
    c = _Checker()
    if not _NAME_RE.match(name) or len(name) > MAX_NAME_LENGTH:
        c.fail(
            "metadata.name",
            f"expected a DNS label of at most {MAX_NAME_LENGTH} characters starting with a "
            f"letter (children are named after it), got {name!r} ({len(name)} characters)",
        )
    spec = c.mapping(spec, "spec")
    c.unknown(spec, "spec", _SPEC_FIELDS)
    env = _parse_env(c, spec.get("env"))
    replicas = c.integer(spec, "replicas", "spec", None, 1, MAX_REPLICAS)
    envs_per_actor = c.integer(
        spec, "envsPerActor", "spec", min(DEFAULT_ENVS_PER_ACTOR, replicas), 1, 1024,
    )
    if envs_per_actor > replicas:
        c.fail(
            "spec.envsPerActor",
            f"must be <= replicas={replicas} (an actor hosts envsPerActor of the pool's "
            f"sub-envs), got {envs_per_actor}",
        )
    autoreset = c.string(spec, "autoresetMode", "spec", "NextStep") or "NextStep"
    if autoreset not in AUTORESET_MODES:
        c.fail("spec.autoresetMode", f"expected one of {', '.join(AUTORESET_MODES)}, got "
                                     f"{autoreset!r}")
    ft_raw = c.mapping(spec.get("faultTolerance"), "spec.faultTolerance")
    c.unknown(ft_raw, "spec.faultTolerance", (
        "restartFailedEnvs", "stepTimeoutSeconds", "maxRestarts", "restartBackoffSeconds",
    ))
    ft = FaultTolerance(
        restart_failed_envs=c.boolean(ft_raw, "restartFailedEnvs", "spec.faultTolerance", True),
        step_timeout_seconds=c.number(
            ft_raw, "stepTimeoutSeconds", "spec.faultTolerance", 60.0, 0.0, 86_400.0),
        max_restarts=c.integer(ft_raw, "maxRestarts", "spec.faultTolerance", 100, 0, 1_000_000),
        restart_backoff_seconds=c.number(
            ft_raw, "restartBackoffSeconds", "spec.faultTolerance", 1.0, 0.0, 3600.0),
    )
    ray = _parse_ray(c, spec.get("ray"))
    if envs_per_actor > ray.worker.envs_per_worker:
        c.fail(
            "spec.envsPerActor",
            f"must be <= ray.worker.envsPerWorker={ray.worker.envs_per_worker} (an actor "
            f"cannot span worker pods), got {envs_per_actor}",
        )
    metrics = c.mapping(spec.get("metrics"), "spec.metrics")
    c.unknown(metrics, "spec.metrics", ("port",))
    port = c.integer(metrics, "port", "spec.metrics", DEFAULT_METRICS_PORT, 1024, 65535)
    if port in RAY_PORTS:
        c.fail("spec.metrics.port", f"{port} is taken by the Ray head (6379, 8265, 10001)")
    pool = PoolSpec(
        name=name,
        namespace=namespace,
        env=env,
        replicas=replicas,
        envs_per_actor=envs_per_actor,
        threads_per_actor=c.integer(spec, "threadsPerActor", "spec", 1, 1, 1024),
        batch_wait_ms=c.integer(spec, "batchWaitMs", "spec", 2, 0, 60_000),
        autoreset_mode=autoreset,
        fault_tolerance=ft,
        ray=ray,
        metrics_port=port,
        suspend=c.boolean(spec, "suspend", "spec", False),
    )
    if not c.errors and pool.desired_workers > limits.max_workers:
        c.fail(
            "spec.replicas",
            f"needs {pool.desired_workers} worker pods ({replicas} envs / "
            f"{pool.actors_per_worker * envs_per_actor} per worker) but this operator allows "
            f"at most {limits.max_workers}; raise ray.worker.envsPerWorker or lower replicas",
        )
    if c.errors:
        raise SpecError(c.errors)
    return pool
