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

import dataclasses
import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any, Final

import yaml

from envpool_operator import access, gcs_store, names, pod_templates
from envpool_operator import settings as settings_mod
from remote_env import spec as spec_mod
from remote_env.spec.pool_report import PoolReport

#: The newest way this operator renders a pool's Ray pods. A pool keeps the render
#: generation (and the operator default image) its RayCluster was made with until
#: its pods must be replaced anyway (see :func:`render_for`): an operator upgrade
#: that renders pods differently must not restart every warm pool in the cluster.
RENDER_GENERATION: Final = 2
#: The generation that brought GCS fault tolerance (the pool outlives its head pod;
#: its Redis is rendered with it) and the lease API for trainers without Ray.
GCS_FT_GENERATION: Final = 2
LEASE_API_GENERATION: Final = 2
#: What each generation after the first changed in the pods (the PodsCurrent
#: condition quotes it to say what an older pool would gain from new pods).
GENERATION_CHANGES: Final[Mapping[int, str]] = {
    2: "GCS fault tolerance: the pool and its leases outlive the head pod "
       "(spec.headFaultTolerance); the lease API for trainers without Ray (port 8267)",
}
#: The value of the EnvPool annotation ``envpool.dev/render`` that asks for this
#: operator's rendering now (new Ray pods).
RENDER_LATEST: Final = "latest"


@dataclasses.dataclass(frozen=True)
class Render:
    """How a pool's Ray pods are rendered beyond its spec: the render generation and
    the operator default image (for a pool that leaves ``spec.ray.image`` empty)."""

    generation: int
    default_image: str

    @classmethod
    def current(cls, settings: settings_mod.Settings) -> Render:
        return cls(RENDER_GENERATION, settings.image)

    @classmethod
    def of_ray_cluster(cls, rc: Mapping[str, Any] | None) -> Render | None:
        """What ``rc`` was rendered with: its annotations; for a RayCluster of an
        operator from before them, generation 1 and the head container's image (the
        full object is needed then). None when that cannot be told."""
        if rc is None:
            return None
        ann = (rc.get("metadata") or {}).get("annotations") or {}
        image = ann.get(names.DEFAULT_IMAGE_ANNOTATION) or _head_image(rc)
        if not image:
            return None
        try:
            generation = int(ann.get(names.RENDER_GENERATION_ANNOTATION, "1"))
        except ValueError:
            return None
        return cls(generation, image)

    def settings(self, settings: settings_mod.Settings) -> settings_mod.Settings:
        """``settings`` with this render's default image."""
        if settings.image == self.default_image:
            return settings
        return dataclasses.replace(settings, image=self.default_image)


def _head_image(rc: Mapping[str, Any]) -> str | None:
    head = (((rc.get("spec") or {}).get("headGroupSpec") or {}).get("template") or {})
    for container in (head.get("spec") or {}).get("containers") or ():
        if container.get("name") == "ray-head":
            image = container.get("image")
            return image if isinstance(image, str) else None
    return None


def render_for(
    pool: spec_mod.PoolSpec, settings: settings_mod.Settings,
    existing: Mapping[str, Any] | None, *, requested: str | None = None,
) -> Render:
    """The rendering for ``pool`` whose RayCluster is ``existing`` (None: not made yet).

    A new pool, or one whose EnvPool asks for it (annotation ``envpool.dev/render:
    latest``), gets this operator's. An existing pool keeps what its RayCluster was
    rendered with as long as that renders the very pods it runs (the cluster hash
    agrees): an operator upgrade changes nothing of it. Once the user changes a field
    that needs new pods anyway (image, resources, ...), it moves to this operator's
    rendering with them. A RayCluster rendered by a newer operator (a downgrade) gets
    this one's: it cannot render what it does not know.

        >>> from envpool_operator import settings as s
        >>> pool = spec_mod.parse_spec({"env": {"id": "CartPole-v1"}, "replicas": 8}, name="cp")
        >>> old = build_ray_cluster(pool, s.Settings(), render=Render(1, "envpool:1.0"))
        >>> render_for(pool, s.Settings(image="envpool:2.0"), old)
        Render(generation=1, default_image='envpool:1.0')
        >>> render_for(pool, s.Settings(image="envpool:2.0"), old, requested="latest")
        Render(generation=2, default_image='envpool:2.0')
    """
    current = Render.current(settings)
    pinned = Render.of_ray_cluster(existing)
    if requested == RENDER_LATEST or pinned is None or pinned == current:
        return current
    if pinned.generation > RENDER_GENERATION or pinned.generation < 1:
        return current
    have = ((existing or {}).get("metadata") or {}).get("annotations", {}).get(
        names.CLUSTER_HASH_ANNOTATION)
    return pinned if have == cluster_hash(pool, settings, pinned) else current


def render_lag(pool: spec_mod.PoolSpec, settings: settings_mod.Settings,
               render: Render) -> str | None:
    """What the pool's pods miss of this operator's rendering (None: nothing)."""
    current = Render.current(settings)
    if render.generation >= current.generation and (
            pool.ray.image or render.default_image == current.default_image):
        return None
    missing = []
    if render.generation < current.generation:
        gains = "; ".join(GENERATION_CHANGES.get(g, f"generation {g}")
                          for g in range(render.generation + 1, current.generation + 1))
        missing.append(f"render generation {current.generation} ({gains}); its pods are "
                       f"generation {render.generation}")
    if not pool.ray.image and render.default_image != current.default_image:
        missing.append(f"the operator's image {current.default_image}; its pods run "
                       f"{render.default_image}")
    return ("kept as an older operator rendered it, so that the upgrade did not restart "
            "the pool; new Ray pods would bring " + " and ".join(missing) + ". To take "
            f"them: annotate the EnvPool {names.RENDER_ANNOTATION}={RENDER_LATEST} (or "
            "change a field that needs new pods); attached trainers are cut off then")


def build_config_map(pool: spec_mod.PoolSpec) -> dict[str, Any]:
    """ConfigMap ``<name>-pool`` holding the pool's EnvPool document under ``pool.yaml``."""
    text = yaml.safe_dump(pool.to_document(), sort_keys=True, default_flow_style=False)
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": names.object_meta(pool, names.config_map_name(pool.name)),
        "data": {names.CONFIG_KEY: text},
    }


def _scale_strategy(workers_to_delete: Sequence[str], generation: int) -> dict[str, Any]:
    """A worker group's ``scaleStrategy`` as KubeRay writes it back: ``{}`` when no pod is
    to go (render generation 2 on; generation 1 keeps its ``[]``, below).

    KubeRay's Go type has ``workersToDelete,omitempty``: its every full Update of the
    RayCluster (the GCS fault-tolerance finalizer, added once) stores ``{}`` for our
    ``{"workersToDelete": []}``. Our next server-side apply put the empty list back, a
    spec change: a generation bump KubeRay had to observe again before the operator
    trusted its status ("KubeRay has not reconciled ... generation 3 (observed 2)"),
    which once kept a pool not Ready for minutes. Rendering what KubeRay stores makes
    the apply a no-op. Not in the pods: KubeRay's Recreate hash leaves
    ``workersToDelete`` out, so this changes no pod of any render generation.

    Generation 1 keeps the ``[]`` its operators applied: it has no fault tolerance, so
    KubeRay never rewrites its spec, and dropping the list from our apply would change
    the spec (a generation) of every pool an older operator made, which an upgrade
    must not (``tests/e2e/test_upgrade_walk.py``).

        >>> _scale_strategy([], 2), _scale_strategy(["w-1"], 2), _scale_strategy([], 1)
        ({}, {'workersToDelete': ['w-1']}, {'workersToDelete': []})
    """
    if workers_to_delete or generation < GCS_FT_GENERATION:
        return {"workersToDelete": list(workers_to_delete)}
    return {}


def _ray_cluster_spec(
    pool: spec_mod.PoolSpec, settings: settings_mod.Settings, workers: int,
    spec_hash: str | None = None, workers_to_delete: Sequence[str] = (),
    render: Render | None = None,
) -> dict[str, Any]:
    # Everything below renders generation ``render.generation``: a change to the
    # pods goes under ``if render.generation >= N`` with RENDER_GENERATION = N.
    render = render or Render.current(settings)
    settings = render.settings(settings)
    env_units = pool.ray.worker.envs_per_worker
    lease_api = render.generation >= LEASE_API_GENERATION
    head = pod_templates.head_template(pool, settings, lease_api=lease_api)
    worker = pod_templates.worker_template(pool, settings, lease_api=lease_api)
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
            "scaleStrategy": _scale_strategy(workers_to_delete, render.generation),
        }],
    }
    if pool.ray.token_auth:
        out["authOptions"] = {"mode": "token"}
    gcs_ft = gcs_store.gcs_fault_tolerance_options(pool)
    if gcs_ft is not None and render.generation >= GCS_FT_GENERATION:
        out["gcsFaultToleranceOptions"] = gcs_ft
    return out


def cluster_hash(pool: spec_mod.PoolSpec, settings: settings_mod.Settings,
                 render: Render | None = None) -> str:
    """Hash of everything that needs new Ray pods to change.

    That is the RayCluster with the worker count left out: image, Ray version,
    resources, scheduling, metrics port. The env, runtimeEnv, envsPerActor and the
    other actor settings are not in it: they reach the running pool server through
    the ConfigMap (and its watch of the EnvPool), which rolls new actors through the
    same pods (``spec.updateStrategy``; a leased actor when its lease ends), so a
    trainer is never cut off by an env change. Nor are replicas and suspend (the
    worker count) or batchWaitMs. ``render``: the rendering (default: this operator's).
    """
    cluster = _ray_cluster_spec(pool, settings, workers=0, render=render)
    for group in cluster["workerGroupSpecs"]:
        group.pop("scaleStrategy")  # which pods go when shrinking: no new pods for that
    blob = json.dumps(cluster, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def build_ray_cluster(
    pool: spec_mod.PoolSpec, settings: settings_mod.Settings, *,
    workers: tuple[int, Sequence[str]] | None = None, render: Render | None = None,
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
    ``workers``: a :func:`worker_plan` to use instead of ``pool.workers``;
    ``render``: a :func:`render_for` to use instead of this operator's (recorded in
    the RayCluster's annotations, never in its pods).
    """
    render = render or Render.current(settings)
    spec_hash = cluster_hash(pool, settings, render)
    replicas, to_delete = workers if workers is not None else (pool.workers, ())
    return {
        "apiVersion": names.RAY_API_VERSION,
        "kind": "RayCluster",
        "metadata": names.object_meta(
            pool, names.ray_cluster_name(pool.name),
            annotations={names.CLUSTER_HASH_ANNOTATION: spec_hash,
                         names.RENDER_GENERATION_ANNOTATION: str(render.generation),
                         names.DEFAULT_IMAGE_ANNOTATION: render.default_image},
        ),
        "spec": _ray_cluster_spec(pool, settings, workers=replicas, spec_hash=spec_hash,
                                  workers_to_delete=to_delete, render=render),
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
    workers: tuple[int, Sequence[str]] | None = None, render: Render | None = None,
) -> list[dict[str, Any]]:
    """Every child in apply order: RBAC and config before the pods that need them."""
    return [
        access.build_service_account(pool),
        access.build_role(pool),
        access.build_role_binding(pool),
        access.build_network_policy(pool),
        build_config_map(pool),
        build_ray_cluster(pool, settings, workers=workers, render=render),
    ]
