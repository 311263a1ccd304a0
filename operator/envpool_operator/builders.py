"""Pure builders: a validated :class:`~remote_env.spec.model.PoolSpec` -> manifest dicts.

No Kubernetes client and no kopf here; ownerReferences are added by the caller
(``kopf.adopt``), so these functions are unit-tested on plain dicts::

    >>> from envpool_operator import settings
    >>> from remote_env import spec
    >>> pool = spec.parse_spec({"env": {"id": "CartPole-v1"}, "replicas": 100}, name="cp")
    >>> rc = build_ray_cluster(pool, settings.Settings())
    >>> rc["spec"]["workerGroupSpecs"][0]["replicas"]   # ceil(100 / 64)
    2

Children of EnvPool ``<name>``: RayCluster ``<name>``, ConfigMap
``<name>-pool`` (key ``pool.yaml``), ServiceAccount/Role/RoleBinding
``<name>-pool-server`` that let the pool server patch only its own EnvPool's
status, and NetworkPolicy ``<name>-ray`` that lets only the pool's own pods and
its trainers (label :data:`TRAINER_LABEL`) reach the Ray pods.

With ``spec.ray.authMode: token`` (the default) the RayCluster carries KubeRay's
``authOptions: {mode: token}``: KubeRay generates Secret ``<name>`` (key
``auth_token``) and puts it into every Ray container; the pool-server sidecar,
which KubeRay does not touch, gets it here.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any, Final

import yaml

from envpool_operator import settings as settings_mod
from remote_env import spec as spec_mod

RAY_API_VERSION: Final = "ray.io/v1"
WORKER_GROUP: Final = "envs"
#: The file ``envpool serve --config`` reads: an EnvPool document, the same
#: format ``envpool run -f pool.yaml`` takes, with every default filled in.
CONFIG_KEY: Final = "pool.yaml"
CONFIG_DIR: Final = "/etc/envpool"
POOL_LABEL: Final = "envpool.dev/pool"
CLUSTER_HASH_ANNOTATION: Final = "envpool.dev/cluster-hash"
RAY_CLIENT_PORT: Final = 10001
RAY_GCS_PORT: Final = 6379
RAY_DASHBOARD_PORT: Final = 8265
#: Pods with this label (value: the pool's name) in the pool's namespace may reach
#: the pool's Ray pods through its NetworkPolicy: put it on your trainer pods.
TRAINER_LABEL: Final = "envpool.dev/trainer"
#: Key of the token in the Secret KubeRay generates for ``authOptions.mode: token``.
RAY_TOKEN_KEY: Final = "auth_token"
SERVICE_ACCOUNT_TOKEN_DIR: Final = "/var/run/secrets/kubernetes.io/serviceaccount"
MANAGED_BY: Final = "envpool-operator"

DEFAULT_HEAD_RESOURCES: Final[dict[str, dict[str, str]]] = {
    "requests": {"cpu": "1", "memory": "2Gi"},
    "limits": {"memory": "4Gi"},
}
DEFAULT_WORKER_RESOURCES: Final[dict[str, dict[str, str]]] = {
    "requests": {"cpu": "2", "memory": "2Gi"},
    "limits": {"memory": "4Gi"},
}
SIDECAR_RESOURCES: Final[dict[str, dict[str, str]]] = {
    "requests": {"cpu": "100m", "memory": "256Mi"},
    "limits": {"memory": "1Gi"},
}


def ray_cluster_name(name: str) -> str:
    return name


def config_map_name(name: str) -> str:
    return f"{name}-pool"


def service_account_name(name: str) -> str:
    return f"{name}-pool-server"


def network_policy_name(name: str) -> str:
    return f"{name}-ray"


def ray_token_secret_name(name: str) -> str:
    """The Secret KubeRay generates for a RayCluster with ``authOptions.mode: token``."""
    return ray_cluster_name(name)


def head_service_name(name: str) -> str:
    """The head Service KubeRay creates for RayCluster ``name``."""
    return f"{ray_cluster_name(name)}-head-svc"


def labels(name: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "envpool",
        "app.kubernetes.io/instance": name,
        "app.kubernetes.io/managed-by": MANAGED_BY,
        POOL_LABEL: name,
    }


def selector(name: str) -> str:
    """``status.selector`` for the scale subresource: every pod of the pool."""
    return f"{POOL_LABEL}={name}"


def _meta(pool: spec_mod.PoolSpec, name: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "namespace": pool.namespace, "labels": labels(pool.name), **extra}


def build_config_map(pool: spec_mod.PoolSpec) -> dict[str, Any]:
    """ConfigMap ``<name>-pool`` holding the pool's EnvPool document under ``pool.yaml``."""
    text = yaml.safe_dump(pool.to_document(), sort_keys=True, default_flow_style=False)
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _meta(pool, config_map_name(pool.name)),
        "data": {CONFIG_KEY: text},
    }


def build_service_account(pool: spec_mod.PoolSpec) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": _meta(pool, service_account_name(pool.name)),
        "automountServiceAccountToken": False,  # only the pool-server sidecar mounts it
    }


def build_role(pool: spec_mod.PoolSpec) -> dict[str, Any]:
    """Least privilege for the pool server: read its EnvPool, patch its status."""
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": _meta(pool, service_account_name(pool.name)),
        "rules": [
            {
                "apiGroups": [spec_mod.GROUP],
                "resources": [spec_mod.PLURAL],
                "resourceNames": [pool.name],
                "verbs": ["get", "watch"],
            },
            {
                "apiGroups": [spec_mod.GROUP],
                "resources": [f"{spec_mod.PLURAL}/status"],
                "resourceNames": [pool.name],
                "verbs": ["get", "patch"],
            },
        ],
    }


def build_role_binding(pool: spec_mod.PoolSpec) -> dict[str, Any]:
    sa = service_account_name(pool.name)
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": _meta(pool, sa),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": sa},
        "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": pool.namespace}],
    }


def _pod_security() -> dict[str, Any]:
    # The Ray images run as user "ray" (uid 1000, gid 100).
    return {
        "runAsNonRoot": True,
        "runAsUser": 1000,
        "runAsGroup": 100,
        "fsGroup": 100,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def _container_security(*, read_only_root: bool) -> dict[str, Any]:
    return {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        # Ray writes sessions, logs and runtime envs under /tmp and $HOME.
        "readOnlyRootFilesystem": read_only_root,
    }


def _volumes(*, config: str | None) -> list[dict[str, Any]]:
    vols: list[dict[str, Any]] = [
        {"name": "tmp", "emptyDir": {}},
        # The object store lives in /dev/shm; the runtime's default 64Mi is too small.
        {"name": "dshm", "emptyDir": {"medium": "Memory"}},
    ]
    if config is not None:
        vols.append({"name": "pool-config", "configMap": {"name": config}})
    return vols


_RAY_MOUNTS: Final = [
    {"name": "tmp", "mountPath": "/tmp"},
    {"name": "dshm", "mountPath": "/dev/shm"},
]


def _resources(res: spec_mod.Resources, default: dict[str, dict[str, str]]) -> dict[str, Any]:
    out = res.to_manifest()
    return out if out else {k: dict(v) for k, v in default.items()}


def _image(pool: spec_mod.PoolSpec, settings: settings_mod.Settings) -> str:
    return pool.ray.image or settings.image


def _head_template(pool: spec_mod.PoolSpec, settings: settings_mod.Settings) -> dict[str, Any]:
    image = _image(pool, settings)
    port = pool.metrics_port
    pod_labels = {**labels(pool.name), "app.kubernetes.io/component": "head",
                  "envpool.dev/metrics": "true"}
    ray_head = {
        "name": "ray-head",
        "image": image,
        "imagePullPolicy": settings.image_pull_policy,
        "ports": [
            {"name": "gcs-server", "containerPort": RAY_GCS_PORT},
            {"name": "dashboard", "containerPort": RAY_DASHBOARD_PORT},
            {"name": "client", "containerPort": RAY_CLIENT_PORT},
        ],
        "resources": _resources(pool.ray.head.resources, DEFAULT_HEAD_RESOURCES),
        **_env_from(pool),
        "securityContext": _container_security(read_only_root=False),
        "volumeMounts": [dict(m) for m in _RAY_MOUNTS],
    }
    pool_server = {
        "name": "pool-server",
        "image": image,
        "imagePullPolicy": settings.image_pull_policy,
        # The metrics port and everything else come from the config file
        # (spec.metrics.port), so a spec change needs no new command line.
        # --env-resource: the workers advertise envpool_env (rayStartParams below), and
        # actors must wait for them rather than land anywhere while none has joined
        "command": ["envpool", "serve", "--config", f"{CONFIG_DIR}/{CONFIG_KEY}", "--env-resource"],
        "env": [
            {"name": "ENVPOOL_POOL_NAME", "value": pool.name},
            {"name": "ENVPOOL_POOL_NAMESPACE",
             "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
            {"name": "ENVPOOL_POD_NAME",
             "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "ENVPOOL_CONFIG", "value": f"{CONFIG_DIR}/{CONFIG_KEY}"},
            # The sidecar shares the pod network with the head's GCS.
            {"name": "RAY_ADDRESS", "value": f"127.0.0.1:{RAY_GCS_PORT}"},
            {"name": "HOME", "value": "/tmp"},
            *_token_env(pool),
        ],
        "ports": [{"name": "metrics", "containerPort": port, "protocol": "TCP"}],
        "readinessProbe": {
            "httpGet": {"path": "/healthz", "port": "metrics"},
            "periodSeconds": 10,
            "failureThreshold": 3,
        },
        "resources": {k: dict(v) for k, v in SIDECAR_RESOURCES.items()},
        "securityContext": _container_security(read_only_root=True),
        "volumeMounts": [
            {"name": "tmp", "mountPath": "/tmp"},
            {"name": "pool-config", "mountPath": CONFIG_DIR, "readOnly": True},
            # The only container with an API token: the Ray head runs user code.
            {"name": "kube-api-token", "mountPath": SERVICE_ACCOUNT_TOKEN_DIR, "readOnly": True},
        ],
    }
    pod_spec: dict[str, Any] = {
        # Ray (2.60) finds the node a driver joins by scanning the process table for
        # the raylet's --node_id: the pool-server sidecar must see the head's
        # processes, or ray.init() waits 60 s and fails (seen on the real node).
        "shareProcessNamespace": True,
        "enableServiceLinks": False,
        "serviceAccountName": service_account_name(pool.name),
        # Not automounted (that would put it into every container, the Ray head's
        # included): the pool-server sidecar mounts it from a projected volume.
        "automountServiceAccountToken": False,
        "securityContext": _pod_security(),
        # KubeRay treats containers[0] as the Ray container.
        "containers": [ray_head, pool_server],
        "volumes": [*_volumes(config=config_map_name(pool.name)), _api_token_volume()],
    }
    _place(pod_spec, pool.ray.head.node_selector, pool.ray.head.tolerations)
    return {
        "metadata": {
            "labels": pod_labels,
            "annotations": {
                "prometheus.io/scrape": "true",
                "prometheus.io/port": str(port),
                "prometheus.io/path": "/metrics",
            },
        },
        "spec": pod_spec,
    }


def _env_from(pool: spec_mod.PoolSpec) -> dict[str, Any]:
    """``spec.ray.envFromSecrets`` on a Ray container: the kubelet reads the Secrets,
    the operator never does (and the pool-server sidecar does not get them)."""
    if not pool.ray.env_from_secrets:
        return {}
    return {"envFrom": [{"secretRef": {"name": n}} for n in pool.ray.env_from_secrets]}


def _token_env(pool: spec_mod.PoolSpec) -> list[dict[str, Any]]:
    """The Ray token for a container KubeRay does not set up (the pool-server sidecar)."""
    if not pool.ray.token_auth:
        return []
    return [
        {"name": "RAY_AUTH_MODE", "value": "token"},
        {"name": "RAY_AUTH_TOKEN", "valueFrom": {"secretKeyRef": {
            "name": ray_token_secret_name(pool.name), "key": RAY_TOKEN_KEY}}},
    ]


def _api_token_volume() -> dict[str, Any]:
    """What automounting would give, as a volume only the pool-server sidecar mounts."""
    return {
        "name": "kube-api-token",
        "projected": {
            "defaultMode": 0o444,
            "sources": [
                {"serviceAccountToken": {"path": "token", "expirationSeconds": 3607}},
                {"configMap": {"name": "kube-root-ca.crt",
                               "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {
                    "apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}},
            ],
        },
    }


def _place(pod_spec: dict[str, Any], node_selector: Any, tolerations: Any) -> None:
    if node_selector:
        pod_spec["nodeSelector"] = dict(node_selector)
    if tolerations:
        pod_spec["tolerations"] = [dict(t) for t in tolerations]


def _worker_template(pool: spec_mod.PoolSpec, settings: settings_mod.Settings) -> dict[str, Any]:
    worker = pool.ray.worker
    pod_spec: dict[str, Any] = {
        # Service env vars (<SVC>_PORT=tcp://...) would shadow ENVPOOL_*/RAY_* settings
        # whenever a Service in the namespace has a matching name.
        "enableServiceLinks": False,
        "automountServiceAccountToken": False,
        "securityContext": _pod_security(),
        "containers": [{
            "name": "ray-worker",
            "image": _image(pool, settings),
            "imagePullPolicy": settings.image_pull_policy,
            "resources": _resources(worker.resources, DEFAULT_WORKER_RESOURCES),
            **_env_from(pool),
            "securityContext": _container_security(read_only_root=False),
            "volumeMounts": [dict(m) for m in _RAY_MOUNTS],
        }],
        "volumes": _volumes(config=None),
    }
    _place(pod_spec, worker.node_selector, worker.tolerations)
    return {
        "metadata": {"labels": {**labels(pool.name), "app.kubernetes.io/component": "worker"}},
        "spec": pod_spec,
    }


def _ray_cluster_spec(
    pool: spec_mod.PoolSpec, settings: settings_mod.Settings, workers: int,
    spec_hash: str | None = None, workers_to_delete: Sequence[str] = (),
) -> dict[str, Any]:
    env_units = pool.ray.worker.envs_per_worker
    head = _head_template(pool, settings)
    worker = _worker_template(pool, settings)
    if spec_hash is not None:
        # In the pod templates so that env/runtimeEnv changes, which are not
        # otherwise part of the RayCluster spec, also trigger KubeRay's Recreate.
        head["metadata"].setdefault("annotations", {})[CLUSTER_HASH_ANNOTATION] = spec_hash
        worker["metadata"].setdefault("annotations", {})[CLUSTER_HASH_ANNOTATION] = spec_hash
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
            "groupName": WORKER_GROUP,
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
    return out


def cluster_hash(pool: spec_mod.PoolSpec, settings: settings_mod.Settings) -> str:
    """Hash of everything that needs new Ray pods to change.

    That is the RayCluster with the worker count left out (image, Ray version,
    resources, scheduling, metrics port), plus the env and runtimeEnv: a
    running actor cannot swap the code it hosts. replicas, envsPerActor,
    batchWaitMs, autoresetMode, faultTolerance and suspend are not in it; they
    reach the running pool through the ConfigMap and the worker count.
    """
    cluster = _ray_cluster_spec(pool, settings, workers=0)
    for group in cluster["workerGroupSpecs"]:
        group.pop("scaleStrategy")  # which pods go when shrinking: no new pods for that
    material = {
        "cluster": cluster,
        "env": pool.to_manifest()["env"],
        "runtimeEnv": dict(pool.ray.runtime_env),
    }
    blob = json.dumps(material, sort_keys=True, separators=(",", ":")).encode()
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
    Image, Ray version, resources, env or runtimeEnv changes change the
    ``envpool.dev/cluster-hash`` annotation in the pod templates, and KubeRay's
    ``upgradeStrategy: Recreate`` replaces the pods of the same RayCluster
    (same name, same head Service, so trainers' endpoint stays valid).
    ``workers``: a :func:`worker_plan` to use instead of ``pool.workers``.
    """
    spec_hash = cluster_hash(pool, settings)
    replicas, to_delete = workers if workers is not None else (pool.workers, ())
    return {
        "apiVersion": RAY_API_VERSION,
        "kind": "RayCluster",
        "metadata": _meta(
            pool, ray_cluster_name(pool.name), annotations={CLUSTER_HASH_ANNOTATION: spec_hash},
        ),
        "spec": _ray_cluster_spec(pool, settings, workers=replicas, spec_hash=spec_hash,
                                  workers_to_delete=to_delete),
    }


def worker_plan(
    pool: spec_mod.PoolSpec, *, current: int | None, report: Mapping[str, Any] | None,
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
        >>> worker_plan(pool, current=3, report={"leasedWorkers": ["p-envs-worker-a"],
        ...     "freeWorkers": ["p-envs-worker-c", "p-envs-worker-b"]})
        (1, ['p-envs-worker-c', 'p-envs-worker-b'])
        >>> worker_plan(pool, current=3, report={"leasedWorkers": ["p-envs-worker-a",
        ...     "p-envs-worker-b"], "freeWorkers": ["p-envs-worker-c"]})
        (2, ['p-envs-worker-c'])
    """
    want = pool.workers
    if current is None or want >= current or report is None or pool.suspend:
        return want, []
    # Ray knows its nodes by host name, which is the pod's name in a pod; hosts that are
    # not this group's pods (Ray outside Kubernetes) say nothing about them.
    prefix = f"{ray_cluster_name(pool.name)}-{WORKER_GROUP}-"
    held = {h for h in report.get("leasedWorkers") or () if str(h).startswith(prefix)}
    free = [str(h) for h in report.get("freeWorkers") or () if str(h).startswith(prefix)]
    if not held and not free:
        return want, []
    keep = max(want, len(held))
    remove = free[:max(0, min(current - keep, len(free)))]
    return current - len(remove), remove


def build_network_policy(pool: spec_mod.PoolSpec) -> dict[str, Any]:
    """Ingress to the pool's Ray pods: from the pool's own pods and its trainers only.

    Ray uses many ports (GCS 6379, dashboard 8265, client 10001, raylets, object
    managers, workers), so peers get every port; the pool server's metrics port is
    open to any pod (Prometheus; ``/status`` shows no lease ids or trainer
    addresses unless asked). Kubelet probes come from the node. Enforced only by a
    policy-enforcing CNI (Calico, Cilium, ...); policies add up, so a wider one of
    yours (trainers in another namespace) works beside it.
    """
    pool_pods = {"matchLabels": {POOL_LABEL: pool.name}}
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": _meta(pool, network_policy_name(pool.name)),
        "spec": {
            "podSelector": pool_pods,
            "policyTypes": ["Ingress"],
            "ingress": [
                {"from": [{"podSelector": pool_pods},
                          {"podSelector": {"matchLabels": {TRAINER_LABEL: pool.name}}}]},
                {"from": [{"namespaceSelector": {}}],
                 "ports": [{"protocol": "TCP", "port": pool.metrics_port}]},
            ],
        },
    }


def build_children(
    pool: spec_mod.PoolSpec, settings: settings_mod.Settings, *,
    workers: tuple[int, Sequence[str]] | None = None,
) -> list[dict[str, Any]]:
    """Every child in apply order: RBAC and config before the pods that need them."""
    return [
        build_service_account(pool),
        build_role(pool),
        build_role_binding(pool),
        build_network_policy(pool),
        build_config_map(pool),
        build_ray_cluster(pool, settings, workers=workers),
    ]
