"""An EnvPool manifest (or its ``spec``) as the pool server and trainers use it.

The same YAML runs in-cluster (the operator puts it in a ConfigMap for
``envpool serve --config``) and on a laptop (``envpool run -f pool.yaml``). Field
names are the CRD's (``manifests/crd/envpool.dev_envpools.yaml``). The operator
validates the whole spec; this module checks what the pool server uses and
accepts the rest (``ray.image``, resources, ...) without interpreting it.
remote_env never imports the operator, so the few shared rules are repeated here.

Example:
    >>> pool = parse_manifest({
    ...     "apiVersion": "envpool.dev/v1alpha1", "kind": "EnvPool",
    ...     "metadata": {"name": "cartpole"},
    ...     "spec": {"env": {"id": "CartPole-v1"}, "replicas": 16, "envsPerActor": 8},
    ... })
    >>> pool.replicas, pool.envs_per_actor, pool.ray_namespace
    (16, 8, 'envpool-cartpole')
    >>> env = pool.env_factory()()   # a CartPole-v1, as gymnasium.make builds it
"""

from __future__ import annotations

import dataclasses
import importlib
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

API_VERSION: Final = "envpool.dev/v1alpha1"
KIND: Final = "EnvPool"
DEFAULT_METRICS_PORT: Final = 8080
#: gymnasium ``AutoresetMode`` values, which the CRD spells the same way.
AUTORESET_MODES: Final = ("NextStep", "SameStep", "Disabled")

_NAME_RE: Final = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_IDENT: Final = r"[A-Za-z_][A-Za-z0-9_]*"
_ENTRYPOINT_RE: Final = re.compile(rf"^{_IDENT}(\.{_IDENT})*:{_IDENT}(\.{_IDENT})*$")
_SPEC_FIELDS: Final = (
    "env", "replicas", "envsPerActor", "threadsPerActor", "batchWaitMs", "autoresetMode",
    "faultTolerance", "ray", "metrics", "suspend",
)
_RAY_FIELDS: Final = ("version", "image", "head", "worker", "runtimeEnv")
_FT_FIELDS: Final = ("restartFailedEnvs", "stepTimeoutSeconds", "maxRestarts",
                     "restartBackoffSeconds")


class PoolSpecError(ValueError):
    """A pool spec the pool server cannot run; ``errors`` lists every problem."""

    def __init__(self, errors: Sequence[str], source: str = "") -> None:
        self.errors = list(errors)
        where = f"{source}: " if source else ""
        super().__init__(where + "; ".join(self.errors))


@dataclasses.dataclass(frozen=True)
class EnvSpec:
    id: str | None
    entrypoint: str | None
    kwargs: Mapping[str, Any]
    multi_agent: bool


@dataclasses.dataclass(frozen=True)
class FaultTolerance:
    restart_failed_envs: bool = True
    #: 0 disables hang detection.
    step_timeout_seconds: float = 60.0
    max_restarts: int = 100
    restart_backoff_seconds: float = 1.0

    @property
    def step_timeout(self) -> float | None:
        return self.step_timeout_seconds or None


@dataclasses.dataclass(frozen=True)
class PoolSpec:
    """What the pool server runs: one EnvPool, defaults filled in."""

    name: str
    namespace: str
    env: EnvSpec
    replicas: int
    envs_per_actor: int
    threads_per_actor: int
    batch_wait_ms: int
    autoreset_mode: str  # NextStep, SameStep, Disabled (= gymnasium AutoresetMode values)
    fault_tolerance: FaultTolerance
    runtime_env: Mapping[str, Any]
    metrics_port: int
    suspend: bool

    @property
    def desired_envs(self) -> int:
        """Envs the pool server keeps running: none while suspended."""
        return 0 if self.suspend else self.replicas

    @property
    def ray_namespace(self) -> str:
        return ray_namespace(self.name)

    def env_factory(self) -> EnvFactory:
        return EnvFactory(self.env.id, self.env.entrypoint, dict(self.env.kwargs))

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
            "runtimeEnv": dict(self.runtime_env),
        }


def ray_namespace(pool_name: str) -> str:
    """The Ray namespace holding a pool's named actors."""
    return f"envpool-{pool_name}"


@dataclasses.dataclass(frozen=True)
class EnvFactory:
    """A picklable make-env callable; the entrypoint is imported where it is called.

    So the pool server never imports user code: only the env actors (whose
    ``runtimeEnv`` may bring it) do.
    """

    env_id: str | None
    entrypoint: str | None
    kwargs: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def __call__(self) -> Any:
        if self.env_id is not None:
            import gymnasium as gym

            return gym.make(self.env_id, **self.kwargs)
        assert self.entrypoint is not None
        return resolve_entrypoint(self.entrypoint)(**self.kwargs)

    def __repr__(self) -> str:
        what = self.env_id if self.env_id is not None else self.entrypoint
        return f"EnvFactory({what!r}, kwargs={dict(self.kwargs)!r})"


def resolve_entrypoint(entrypoint: str) -> Any:
    """``"package.module:callable"`` (or ``:Class.method``) -> the callable.

    Raises:
        ValueError: naming what could not be imported or found.
    """
    module_name, sep, attr = entrypoint.partition(":")
    if not sep or not _ENTRYPOINT_RE.match(entrypoint):
        raise ValueError(f"entrypoint must look like 'package.module:callable', got {entrypoint!r}")
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"entrypoint {entrypoint!r}: cannot import {module_name!r}: {exc}") from exc
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ValueError(f"entrypoint {entrypoint!r}: {module_name} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise ValueError(f"entrypoint {entrypoint!r}: {attr} is not callable")
    return obj


class _Checker:
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

    def integer(self, value: Mapping[str, Any], key: str, path: str, default: int | None,
                lo: int, hi: int) -> int:
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

    def number(self, value: Mapping[str, Any], key: str, path: str, default: float,
               lo: float, hi: float) -> float:
        got = value.get(key, default)
        if isinstance(got, bool) or not isinstance(got, (int, float)):
            self.fail(f"{path}.{key}", f"expected a number in [{lo:g}, {hi:g}], got {got!r}")
            return default
        if not lo <= got <= hi:
            self.fail(f"{path}.{key}", f"must be in [{lo:g}, {hi:g}], got {got:g}")
            return default
        return float(got)

    def string(self, value: Mapping[str, Any], key: str, path: str) -> str | None:
        got = value.get(key)
        if got is not None and not isinstance(got, str):
            self.fail(f"{path}.{key}", f"expected a string, got {got!r}")
            return None
        return got


def parse_spec(spec: Mapping[str, Any], *, name: str, namespace: str = "default") -> PoolSpec:
    """Validate an EnvPool ``spec`` mapping (camelCase, as in the CRD).

    Raises:
        PoolSpecError: every problem found, each naming the field and what was expected.
    """
    c = _Checker()
    if not isinstance(name, str) or not _NAME_RE.match(name) or len(name) > 40:
        c.fail("metadata.name", f"expected a DNS label of at most 40 characters starting with "
                                f"a letter, got {name!r}")
    spec = c.mapping(spec, "spec")
    c.unknown(spec, "spec", _SPEC_FIELDS)

    env_raw = c.mapping(spec.get("env"), "spec.env")
    c.unknown(env_raw, "spec.env", ("id", "entrypoint", "kwargs", "multiAgent"))
    env_id = c.string(env_raw, "id", "spec.env")
    entrypoint = c.string(env_raw, "entrypoint", "spec.env")
    if (env_id is None) == (entrypoint is None):
        got = "both" if env_id is not None else "neither"
        c.fail("spec.env", f"exactly one of env.id (a gymnasium id, e.g. CartPole-v1) or "
                           f"env.entrypoint ('package.module:callable') must be set, got {got}")
    if entrypoint is not None and not _ENTRYPOINT_RE.match(entrypoint):
        c.fail("spec.env.entrypoint",
               f"expected 'package.module:callable' (importable names), got {entrypoint!r}")
    if env_id is not None and not env_id:
        c.fail("spec.env.id", "must not be empty")
    kwargs = c.mapping(env_raw.get("kwargs"), "spec.env.kwargs")
    env = EnvSpec(env_id, entrypoint, dict(kwargs),
                  c.boolean(env_raw, "multiAgent", "spec.env", False))

    replicas = c.integer(spec, "replicas", "spec", None, 1, 100_000)
    envs_per_actor = c.integer(spec, "envsPerActor", "spec", min(8, replicas), 1, 1024)
    if envs_per_actor > replicas:
        c.fail("spec.envsPerActor", f"must be <= replicas={replicas} (an actor hosts "
                                    f"envsPerActor of the pool's sub-envs), got {envs_per_actor}")
    autoreset = spec.get("autoresetMode", "NextStep")
    if autoreset not in AUTORESET_MODES:
        c.fail("spec.autoresetMode",
               f"expected one of {', '.join(AUTORESET_MODES)}, got {autoreset!r}")
        autoreset = "NextStep"

    ft_raw = c.mapping(spec.get("faultTolerance"), "spec.faultTolerance")
    c.unknown(ft_raw, "spec.faultTolerance", _FT_FIELDS)
    p = "spec.faultTolerance"
    ft = FaultTolerance(
        restart_failed_envs=c.boolean(ft_raw, "restartFailedEnvs", p, True),
        step_timeout_seconds=c.number(ft_raw, "stepTimeoutSeconds", p, 60.0, 0.0, 86_400.0),
        max_restarts=c.integer(ft_raw, "maxRestarts", p, 100, 0, 1_000_000),
        restart_backoff_seconds=c.number(ft_raw, "restartBackoffSeconds", p, 1.0, 0.0, 3600.0),
    )

    ray_raw = c.mapping(spec.get("ray"), "spec.ray")
    c.unknown(ray_raw, "spec.ray", _RAY_FIELDS)
    runtime_env = c.mapping(ray_raw.get("runtimeEnv"), "spec.ray.runtimeEnv")

    metrics = c.mapping(spec.get("metrics"), "spec.metrics")
    c.unknown(metrics, "spec.metrics", ("port",))
    port = c.integer(metrics, "port", "spec.metrics", DEFAULT_METRICS_PORT, 1024, 65535)
    if port in (6379, 8265, 10001):
        c.fail("spec.metrics.port", f"{port} is taken by the Ray head (6379, 8265, 10001)")

    pool = PoolSpec(
        name=name,
        namespace=namespace,
        env=env,
        replicas=replicas,
        envs_per_actor=envs_per_actor,
        threads_per_actor=c.integer(spec, "threadsPerActor", "spec", 1, 1, 1024),
        batch_wait_ms=c.integer(spec, "batchWaitMs", "spec", 2, 0, 60_000),
        autoreset_mode=str(autoreset),
        fault_tolerance=ft,
        runtime_env=dict(runtime_env),
        metrics_port=port,
        suspend=c.boolean(spec, "suspend", "spec", False),
    )
    if c.errors:
        raise PoolSpecError(c.errors)
    return pool


def parse_manifest(doc: Mapping[str, Any], *, name: str | None = None) -> PoolSpec:
    """An EnvPool document (``apiVersion``/``kind``/``metadata``/``spec``) or a bare spec.

    A bare spec (no ``spec`` key, e.g. ``{"env": ..., "replicas": 4}``) needs ``name``.
    ``name`` also overrides ``metadata.name`` when given.

    Raises:
        PoolSpecError: the document is not an EnvPool or its spec is invalid.
    """
    if not isinstance(doc, Mapping):
        raise PoolSpecError([f"expected an EnvPool document (a mapping), got "
                             f"{type(doc).__name__}"])
    if "spec" not in doc:
        if name is None:
            raise PoolSpecError(["a bare spec needs a pool name (metadata.name is missing)"])
        return parse_spec(doc, name=name)
    errors: list[str] = []
    kind = doc.get("kind", KIND)
    if kind != KIND:
        errors.append(f"kind: expected {KIND}, got {kind!r}")
    api = doc.get("apiVersion", API_VERSION)
    if not isinstance(api, str) or not api.startswith("envpool.dev/"):
        errors.append(f"apiVersion: expected {API_VERSION}, got {api!r}")
    meta = doc.get("metadata") or {}
    if not isinstance(meta, Mapping):
        errors.append(f"metadata: expected an object, got {meta!r}")
        meta = {}
    pool_name = name if name is not None else meta.get("name")
    if pool_name is None:
        errors.append("metadata.name: required (the pool's name)")
    if errors:
        raise PoolSpecError(errors)
    return parse_spec(doc["spec"], name=str(pool_name),
                      namespace=str(meta.get("namespace") or "default"))


def load(path: str | Path, *, name: str | None = None) -> PoolSpec:
    """Read an EnvPool YAML file (one document) into a :class:`PoolSpec`.

    Raises:
        PoolSpecError: unreadable file, bad YAML, not an EnvPool, or an invalid spec;
            the message starts with the path.
    """
    import yaml

    text_path = str(path)
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise PoolSpecError([f"cannot read: {exc.strerror or exc}"], text_path) from exc
    try:
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as exc:
        raise PoolSpecError([f"invalid YAML: {exc}"], text_path) from exc
    if len(docs) != 1:
        raise PoolSpecError([f"expected one EnvPool document, found {len(docs)}"], text_path)
    try:
        return parse_manifest(docs[0], name=name)
    except PoolSpecError as exc:
        raise PoolSpecError(exc.errors, text_path) from None
