"""Pod templates of a pool's RayCluster (pure): the head with its pool-server
sidecar, and the workers that host the env actors.

Secure by default (non-root, no privilege escalation, all capabilities dropped,
seccomp RuntimeDefault). Only the pool-server sidecar gets a Kubernetes API
token, from a projected volume: the Ray containers run user code.

With ``spec.ray.authMode: token`` (the default) the RayCluster carries KubeRay's
``authOptions: {mode: token}``: KubeRay generates Secret ``<name>`` (key
``auth_token``) and puts it into every Ray container; the pool-server sidecar,
which KubeRay does not touch, gets it here::

    >>> from envpool_operator import settings
    >>> from remote_env import spec
    >>> pool = spec.parse_spec({"env": {"id": "CartPole-v1"}, "replicas": 4}, name="cp")
    >>> [c["name"] for c in head_template(pool, settings.Settings())["spec"]["containers"]]
    ['ray-head', 'pool-server']
"""

from __future__ import annotations

from typing import Any, Final

from envpool_operator import names
from envpool_operator import settings as settings_mod
from remote_env import spec as spec_mod

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


def head_template(pool: spec_mod.PoolSpec, settings: settings_mod.Settings, *,
                  lease_api: bool = True) -> dict[str, Any]:
    """The head pod: ``ray-head`` (GCS, dashboard, client) and the pool-server sidecar.

    ``lease_api``: the lease API's port and token (render generation 2; an older
    pool's head is rendered without them, see ``builders.render_for``)."""
    image = _image(pool, settings)
    port = pool.metrics_port
    pod_labels = {**names.labels(pool.name), "app.kubernetes.io/component": "head",
                  "envpool.dev/metrics": "true"}
    ray_head = {
        "name": "ray-head",
        "image": image,
        "imagePullPolicy": settings.image_pull_policy,
        "ports": [
            {"name": "gcs-server", "containerPort": names.RAY_GCS_PORT},
            {"name": "dashboard", "containerPort": names.RAY_DASHBOARD_PORT},
            {"name": "client", "containerPort": names.RAY_CLIENT_PORT},
            # The pool-server sidecar listens on it (one network namespace). Declared
            # here because KubeRay builds the head Service from containers[0]'s ports
            # (and a second declaration in the sidecar would be a duplicate port):
            # trainers reach http://<pool>-head-svc:8267.
            *([{"name": names.LEASE_API_PORT_NAME, "containerPort": names.LEASE_API_PORT,
                "protocol": "TCP"}] if lease_api else []),
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
        # --env-resource: the workers advertise envpool_env (their rayStartParams,
        # set in builders), and
        # actors must wait for them rather than land anywhere while none has joined
        "command": ["envpool", "serve", "--config", f"{names.CONFIG_DIR}/{names.CONFIG_KEY}",
                    "--env-resource"],
        "env": [
            {"name": "ENVPOOL_POOL_NAME", "value": pool.name},
            {"name": "ENVPOOL_POOL_NAMESPACE",
             "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
            {"name": "ENVPOOL_POD_NAME",
             "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "ENVPOOL_CONFIG", "value": f"{names.CONFIG_DIR}/{names.CONFIG_KEY}"},
            # The sidecar shares the pod network with the head's GCS.
            {"name": "RAY_ADDRESS", "value": f"127.0.0.1:{names.RAY_GCS_PORT}"},
            {"name": "HOME", "value": "/tmp"},
            # the lease API's bearer token (Secret <pool>-lease-token, made by the operator)
            *([{"name": names.LEASE_TOKEN_ENV,
                "value": f"{names.LEASE_TOKEN_DIR}/{names.LEASE_TOKEN_KEY}"}] if lease_api else []),
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
            {"name": "pool-config", "mountPath": names.CONFIG_DIR, "readOnly": True},
            *([{"name": "lease-token", "mountPath": names.LEASE_TOKEN_DIR, "readOnly": True}]
              if lease_api else []),
            # The only container with an API token: the Ray head runs user code.
            {"name": "kube-api-token", "mountPath": names.SERVICE_ACCOUNT_TOKEN_DIR,
             "readOnly": True},
        ],
    }
    pod_spec: dict[str, Any] = {
        # Ray (2.60) finds the node a driver joins by scanning the process table for
        # the raylet's --node_id: the pool-server sidecar must see the head's
        # processes, or ray.init() waits 60 s and fails (seen on the real node).
        "shareProcessNamespace": True,
        "enableServiceLinks": False,
        "serviceAccountName": names.service_account_name(pool.name),
        # Not automounted (that would put it into every container, the Ray head's
        # included): the pool-server sidecar mounts it from a projected volume.
        "automountServiceAccountToken": False,
        "securityContext": _pod_security(),
        # KubeRay treats containers[0] as the Ray container.
        "containers": [ray_head, pool_server],
        "volumes": [*_volumes(config=names.config_map_name(pool.name)), _api_token_volume(),
                    *([_lease_token_volume(pool)] if lease_api else [])],
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
            "name": names.ray_token_secret_name(pool.name), "key": names.RAY_TOKEN_KEY}}},
    ]


def _lease_token_volume(pool: spec_mod.PoolSpec) -> dict[str, Any]:
    """The lease API token, for the pool-server sidecar only (the kubelet reads the
    Secret; the Ray containers, which run user code, do not mount it). Not optional:
    a pool server without it could not authenticate a trainer."""
    return {
        "name": "lease-token",
        "secret": {
            "secretName": names.lease_token_secret_name(pool.name),
            "items": [{"key": names.LEASE_TOKEN_KEY, "path": names.LEASE_TOKEN_KEY}],
            # owner root, group fsGroup (100): the sidecar's user reads it, no one writes
            "defaultMode": 0o440,
        },
    }


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


def worker_template(pool: spec_mod.PoolSpec, settings: settings_mod.Settings, *,
                    lease_api: bool = True) -> dict[str, Any]:
    """A worker pod: one ``ray-worker`` container that hosts env actors (``lease_api``:
    the data port range trainers without Ray reach, render generation 2)."""
    worker = pool.ray.worker
    data_ports = [{"name": names.DATA_PORTS_ENV,
                   "value": f"{names.DATA_PORTS[0]}-{names.DATA_PORTS[1]}"}]
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
            # The env actors serve trainers' TCP data channels on ports of this range
            # (inherited from the raylet): the one the NetworkPolicy opens to trainers.
            **({"env": data_ports} if lease_api else {}),
            **_env_from(pool),
            "securityContext": _container_security(read_only_root=False),
            "volumeMounts": [dict(m) for m in _RAY_MOUNTS],
        }],
        "volumes": _volumes(config=None),
    }
    _place(pod_spec, worker.node_selector, worker.tolerations)
    return {
        "metadata": {"labels": {**names.labels(pool.name),
                                "app.kubernetes.io/component": "worker"}},
        "spec": pod_spec,
    }
