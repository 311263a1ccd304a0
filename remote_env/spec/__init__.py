"""The EnvPool spec: one model that the operator and the pool server both import.

Pure (stdlib and PyYAML: no ray, gymnasium, kubernetes or kopf; an import
contract checks it). :mod:`~remote_env.spec.fields` holds every name, default
and bound once; :mod:`~remote_env.spec.parse` turns a document into the frozen
records of :mod:`~remote_env.spec.model`, reporting every problem at once
(:class:`SpecError`). A unit test proves the CRD's schema agrees field by field.

    >>> from remote_env import spec
    >>> pool = spec.parse_spec({"env": {"id": "CartPole-v1"}, "replicas": 16}, name="cp")
    >>> pool.envs_per_actor, pool.fault_tolerance.max_restarts
    (8, 100)
"""

from __future__ import annotations

from remote_env.spec.checker import SpecError, parse_quantity
from remote_env.spec.fields import (
    API_VERSION,
    AUTORESET_MODES,
    DEFAULT_BATCH_WAIT_MS,
    DEFAULT_ENVS_PER_ACTOR,
    DEFAULT_ENVS_PER_WORKER,
    DEFAULT_MAX_RESTARTS,
    DEFAULT_METRICS_PORT,
    DEFAULT_RAY_VERSION,
    ENV_RESOURCE,
    GROUP,
    KIND,
    LEASE_API_PORT,
    MAX_NAME_LENGTH,
    MAX_REPLICAS,
    PLURAL,
    RAY_PORTS,
    VERSION,
    ray_namespace,
)
from remote_env.spec.model import (
    Autoscaling,
    EnvSpec,
    FaultTolerance,
    HeadFaultTolerance,
    HeadSpec,
    Limits,
    PoolSpec,
    RaySpec,
    Resources,
    UpdateStrategy,
    WorkerSpec,
)
from remote_env.spec.parse import load, loads, parse_manifest, parse_spec

__all__ = [
    "API_VERSION", "AUTORESET_MODES", "DEFAULT_BATCH_WAIT_MS", "DEFAULT_ENVS_PER_ACTOR",
    "DEFAULT_ENVS_PER_WORKER", "DEFAULT_MAX_RESTARTS", "DEFAULT_METRICS_PORT",
    "DEFAULT_RAY_VERSION", "ENV_RESOURCE", "GROUP", "KIND", "LEASE_API_PORT", "MAX_NAME_LENGTH", "MAX_REPLICAS",
    "PLURAL", "RAY_PORTS", "VERSION", "Autoscaling", "EnvSpec", "FaultTolerance", "HeadFaultTolerance",
    "HeadSpec", "Limits",
    "PoolSpec", "RaySpec", "Resources", "SpecError", "UpdateStrategy", "WorkerSpec", "load", "loads",
    "parse_manifest", "parse_quantity", "parse_spec", "ray_namespace",
]
