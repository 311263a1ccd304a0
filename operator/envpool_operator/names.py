"""Names, labels and fixed values of an EnvPool's children (pure).

Everything that derives a Kubernetes name or label from an EnvPool lives here,
so the builders, the status and the handlers that select on labels agree by
construction::

    >>> ray_cluster_name("cp"), config_map_name("cp"), service_account_name("cp")
    ('cp', 'cp-pool', 'cp-pool-server')
    >>> selector("cp")
    'envpool.dev/pool=cp'
"""

from __future__ import annotations

from typing import Any, Final

from remote_env import spec as spec_mod

RAY_API_VERSION: Final = "ray.io/v1"
WORKER_GROUP: Final = "envs"
#: The file ``envpool serve --config`` reads: an EnvPool document, the same
#: format ``envpool run -f pool.yaml`` takes, with every default filled in.
CONFIG_KEY: Final = "pool.yaml"
CONFIG_DIR: Final = "/etc/envpool"
POOL_LABEL: Final = "envpool.dev/pool"
CLUSTER_HASH_ANNOTATION: Final = "envpool.dev/cluster-hash"
#: On the RayCluster: how its pods were rendered (builders.Render), so that a newer
#: operator renders the same pods for it.
RENDER_GENERATION_ANNOTATION: Final = "envpool.dev/render-generation"
DEFAULT_IMAGE_ANNOTATION: Final = "envpool.dev/default-image"
#: On the EnvPool, set by its user: "latest" asks for this operator's rendering.
RENDER_ANNOTATION: Final = "envpool.dev/render"
RAY_CLIENT_PORT: Final = 10001
RAY_GCS_PORT: Final = 6379
RAY_DASHBOARD_PORT: Final = 8265
#: Pods with this label (value: the pool's name) in the pool's namespace may reach
#: the pool's Ray pods through its NetworkPolicy: put it on your trainer pods.
TRAINER_LABEL: Final = "envpool.dev/trainer"
#: Pods with this label (value: the pool's name) in the pool's namespace may reach the
#: pool's lease API on the head and its env actors' data ports on the workers, and no
#: other port of the Ray pods: for trainers without Ray (``RemoteVectorEnv.from_pool``
#: with a URL). :data:`TRAINER_LABEL` admits every port (Ray client trainers).
LEASE_TRAINER_LABEL: Final = "envpool.dev/trainer-of"
#: The pool server's HTTP lease API (lease, heartbeat, release, replace), on the head.
LEASE_API_PORT: Final = spec_mod.LEASE_API_PORT  # 8267
LEASE_API_PORT_NAME: Final = "lease-api"
#: Key of the lease API's bearer token in Secret :func:`lease_token_secret_name`.
LEASE_TOKEN_KEY: Final = "token"
#: Where the pool-server sidecar finds that token, and the env var that names the file.
#: Not under :data:`CONFIG_DIR`: a mount point inside the read-only ConfigMap volume
#: cannot be created.
LEASE_TOKEN_DIR: Final = "/etc/envpool-lease-token"
LEASE_TOKEN_ENV: Final = "ENVPOOL_LEASE_TOKEN_FILE"
#: TCP ports the env actors on a worker pod serve their data channel on (inclusive),
#: told to them through :data:`DATA_PORTS_ENV`: a fixed range, so the NetworkPolicy can
#: admit trainers to it and to nothing else of the worker. Above Ray's worker ports
#: (10002-19999) and below the ephemeral range (32768-60999), as many as envsPerWorker
#: allows actors on one pod.
DATA_PORTS: Final = (20000, 29999)
DATA_PORTS_ENV: Final = "ENVPOOL_DATA_PORTS"
#: Key of the token in the Secret KubeRay generates for ``authOptions.mode: token``.
RAY_TOKEN_KEY: Final = "auth_token"
SERVICE_ACCOUNT_TOKEN_DIR: Final = "/var/run/secrets/kubernetes.io/serviceaccount"
MANAGED_BY: Final = "envpool-operator"


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


def lease_token_secret_name(name: str) -> str:
    """The Secret (key :data:`LEASE_TOKEN_KEY`) with the pool's lease API token."""
    return f"{name}-lease-token"


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


def object_meta(pool: spec_mod.PoolSpec, name: str, **extra: Any) -> dict[str, Any]:
    """``metadata`` of a child called ``name``: the pool's namespace and labels."""
    return {"name": name, "namespace": pool.namespace, "labels": labels(pool.name), **extra}
