"""Pure builders: a validated :class:`~remote_env.spec.model.PoolSpec` -> manifest dicts.

No Kubernetes client and no kopf here; ownerReferences are added by the caller
(``kopf.adopt``), so these functions are unit-tested on plain dicts::

    >>> from envpool_operator import settings
    >>> from remote_env import spec
    >>> pool = spec.parse_spec({"env": {"id": "CartPole-v1"}, "replicas": 100}, name="cp")
    >>> rc = build_ray_cluster(pool, settings.Settings())
    >>> rc["spec"]["workerGroupSpecs"][0]["replicas"]   # ceil(100 / 64)
    2

Children of EnvPool ``<name>``: RayCluster ``<name>`` and ConfigMap
``<name>-pool`` (key ``pool.yaml``), built here, with pod templates from
:mod:`~envpool_operator.pod_templates`; ServiceAccount/Role/RoleBinding
``<name>-pool-server`` and NetworkPolicy ``<name>-ray`` from
:mod:`~envpool_operator.access`. :func:`worker_plan` picks the worker pods to
remove when a pool shrinks. Names and labels come from :mod:`~envpool_operator.names`.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any

import yaml

from envpool_operator import access, gcs_store, names, pod_templates
from envpool_operator import settings as settings_mod
from remote_env import spec as spec_mod
from remote_env.spec.pool_report import PoolReport


def build_config_map(pool: spec_mod.PoolSpec) -> dict[str, Any]:
    """ConfigMap ``<name>-pool`` holding the pool's EnvPool document under ``pool.yaml``."""
    text = yaml.safe_dump(pool.to_document(), sort_keys=True, default_flow_style=False)
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": names.object_meta(pool, names.config_map_name(pool.name)),
        "data": {names.CONFIG_KEY: text},
    }


def _ray_cluster_spec(
    pool: spec_mod.PoolSpec, settings: settings_mod.Settings, workers: int,
    spec_hash: str | None = None, workers_to_delete: Sequence[str] = (),
) -> dict[str, Any]:
    env_units = pool.ray.worker.envs_per_worker
    head = pod_templates.head_template(pool, settings)
    worker = pod_templates.worker_template(pool, settings)
    if spec_hash is not None:
        # In the pod templates, so that KubeRay's Recreate certainly sees a change
        # that needs new pods (image, Ray version, resources, scheduling).
        for template in (head, worker):
            template["metadata"].setdefault("annotations", {})[
                names.CLUSTER_HASH_ANNOTATION] = spec_hash
    out: dict[str, Any] = {
        "rayVersion": pool.ray.version,
        # Sizing is the operator's job (from spec.replicas), not the autoscaler's.
        "enableInTreeAutoscaling": False,
        # KubeRay (>= 1.5) replaces every pod when the spec minus replicas
        # changes; it does not touch running pods otherwise.
        "upgradeStrategy": {"type": "Recreate"},
        "headGroupSpec": {
            "serviceType": "ClusterIP",
            # No env actors on the head: it runs GCS and the pool server.
            "rayStartParams": {"dashboard-host": "0.0.0.0", "num-cpus": "0"},
            "template": head,
        },
        "workerGroupSpecs": [{
            "groupName": names.WORKER_GROUP,
            "replicas": workers,
            "minReplicas": workers,
            "maxReplicas": workers,
            # KubeRay passes this through as --resources='{"envpool_env": N}'.
            "rayStartParams": {"resources": json.dumps(json.dumps({spec_mod.ENV_RESOURCE: env_units}))},
            "template": worker,
            # The pods to remove when the group shrinks (worker_plan): never one that
            # hosts a leased env. KubeRay deletes them whatever replicas says.
            "scaleStrategy": {"workersToDelete": list(workers_to_delete)},
        }],
    }
    if pool.ray.token_auth:
        out["authOptions"] = {"mode": "token"}
    gcs_ft = gcs_store.gcs_fault_tolerance_options(pool)
    if gcs_ft is not None:
        out["gcsFaultToleranceOptions"] = gcs_ft
    return out


def cluster_hash(pool: spec_mod.PoolSpec, settings: settings_mod.Settings) -> str:
    """Hash of everything that needs new Ray pods to change.

    That is the RayCluster with the worker count left out: image, Ray version,
    resources, scheduling, metrics port. The env, runtimeEnv, envsPerActor and the
    other actor settings are not in it: they reach the running pool server through
    the ConfigMap (and its watch of the EnvPool), which rolls new actors through the
    same pods (``spec.updateStrategy``; a leased actor when its lease ends), so a
    trainer is never cut off by an env change. Nor are replicas and suspend (the
    worker count) or batchWaitMs.
    """
    cluster = _ray_cluster_spec(pool, settings, workers=0)
    for group in cluster["workerGroupSpecs"]:
        group.pop("scaleStrategy")  # which pods go when shrinking: no new pods for that
    blob = json.dumps(cluster, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def build_ray_cluster(
    pool: spec_mod.PoolSpec, settings: settings_mod.Settings, *,
    workers: tuple[int, Sequence[str]] | None = None,
) -> dict[str, Any]:
    """The ``ray.io/v1`` RayCluster: a head (Ray + pool-server sidecar), one worker group.

    Worker replicas: enough workers for ``ceil(replicas / envsPerActor)`` actors
    at ``envsPerWorker // envsPerActor`` actors per worker (equal to
    ``ceil(replicas / envsPerWorker)`` when envsPerActor divides envsPerWorker);
    zero while suspended. The head stays up when suspended so resuming is quick
    and trainers see a pool that reports Suspended rather than a missing one
    (KubeRay's own ``spec.suspend`` would delete the head and pool server too).
    Image, Ray version or resources changes change the ``envpool.dev/cluster-hash``
    annotation in the pod templates, and KubeRay's ``upgradeStrategy: Recreate``
    replaces the pods of the same RayCluster (same name, same head Service, so
    trainers' endpoint stays valid). Env and runtimeEnv changes do not: the pool
    server rolls them through the running pods (see :func:`cluster_hash`).
    ``workers``: a :func:`worker_plan` to use instead of ``pool.workers``.
    """
    spec_hash = cluster_hash(pool, settings)
    replicas, to_delete = workers if workers is not None else (pool.workers, ())
    return {
        "apiVersion": names.RAY_API_VERSION,
        "kind": "RayCluster",
        "metadata": names.object_meta(
            pool, names.ray_cluster_name(pool.name),
            annotations={names.CLUSTER_HASH_ANNOTATION: spec_hash},
        ),
        "spec": _ray_cluster_spec(pool, settings, workers=replicas, spec_hash=spec_hash,
                                  workers_to_delete=to_delete),
    }


def worker_plan(
    pool: spec_mod.PoolSpec, *, current: int | None, report: PoolReport | None,
) -> tuple[int, list[str]]:
    """(worker replicas, worker pods to remove) for a RayCluster with ``current`` workers.

    Growing, or without a fresh pool-server report that names this RayCluster's
    worker pods, it is ``pool.workers`` and no names (KubeRay picks the pods).
    Shrinking with one, only pods without a leased actor go, named in KubeRay's
    ``scaleStrategy.workersToDelete`` (emptiest first, as the report orders them):
    the group keeps every pod that hosts a leased env, and any pod it cannot name,
    until a later report frees them. Without this KubeRay deletes random worker pods
    when ``replicas`` drops, leased envs included.

        >>> pool = spec_mod.parse_spec({"env": {"id": "CartPole-v1"}, "replicas": 64}, name="p")
        >>> read = PoolReport.read
        >>> worker_plan(pool, current=3, report=read({"leasedWorkers": ["p-envs-worker-a"],
        ...     "freeWorkers": ["p-envs-worker-c", "p-envs-worker-b"]}))
        (1, ['p-envs-worker-c', 'p-envs-worker-b'])
        >>> worker_plan(pool, current=3, report=read({"leasedWorkers": ["p-envs-worker-a",
        ...     "p-envs-worker-b"], "freeWorkers": ["p-envs-worker-c"]}))
        (2, ['p-envs-worker-c'])
    """
    want = pool.workers
    if current is None or want >= current or report is None or pool.suspend:
        return want, []
    # Ray knows its nodes by host name, which is the pod's name in a pod; hosts that are
    # not this group's pods (Ray outside Kubernetes) say nothing about them.
    prefix = f"{names.ray_cluster_name(pool.name)}-{names.WORKER_GROUP}-"
    held = {h for h in report.leased_workers if h.startswith(prefix)}
    free = [h for h in report.free_workers if h.startswith(prefix)]
    if not held and not free:
        return want, []
    keep = max(want, len(held))
    remove = free[:max(0, min(current - keep, len(free)))]
    return current - len(remove), remove


def build_children(
    pool: spec_mod.PoolSpec, settings: settings_mod.Settings, *,
    workers: tuple[int, Sequence[str]] | None = None,
) -> list[dict[str, Any]]:
    """Every child in apply order: RBAC and config before the pods that need them."""
    return [
        access.build_service_account(pool),
        access.build_role(pool),
        access.build_role_binding(pool),
        access.build_network_policy(pool),
        build_config_map(pool),
        build_ray_cluster(pool, settings, workers=workers),
    ]
