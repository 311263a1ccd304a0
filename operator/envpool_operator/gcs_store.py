"""Where a pool's GCS keeps its state (pure builders): KubeRay GCS fault tolerance.

Without it the head pod holds the GCS in memory, and its loss takes every env actor
with it. With ``spec.headFaultTolerance.enabled`` (the default) the RayCluster gets
``spec.gcsFaultToleranceOptions``: the GCS writes its tables (actors, nodes, the
internal KV where the lease actor keeps its leases) to Redis, and a new head pod
reloads them; worker pods wait for it (KubeRay sets their reconnect timeout), so their
detached env actors keep running and trainers stepping them over TCP see nothing.

The Redis is the operator's own, one per pool, unless ``redisAddress`` names one:

* Secret ``<name>-redis`` (key ``password``): created once, never read by the
  operator (it has ``create`` on Secrets and nothing else); the password is made by
  the caller (I/O) and handed to :func:`build_password_secret`;
* Deployment and Service ``<name>-redis``: Debian's ``redis-server`` (any image with
  ``redis-server`` on the PATH), append-only file in an emptyDir, so a crashed Redis
  container restarts with its data; restricted pod security;
* NetworkPolicy ``<name>-redis``: only the pool's Ray pods (and KubeRay's cleanup Job,
  made from the head's template) reach it. The Redis pod does not carry the pool
  label, so the pool's Ray policy (which admits trainers) does not select it.

    >>> from remote_env import spec
    >>> pool = spec.parse_spec({"env": {"id": "CartPole-v1"}, "replicas": 4}, name="cp",
    ...                        namespace="ns")
    >>> gcs_fault_tolerance_options(pool)["redisAddress"]
    'cp-redis.ns.svc:6379'
    >>> [c["kind"] for c in build_redis_children(pool, settings_mod.Settings())]
    ['Service', 'NetworkPolicy', 'Deployment']
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from envpool_operator import names
from envpool_operator import settings as settings_mod
from remote_env import spec as spec_mod

REDIS_PORT: Final = 6379
#: The key of the password in the operator's Secret ``<name>-redis``.
PASSWORD_KEY: Final = "password"
#: Label of the pool's Redis pod (value: the pool's name). Not ``names.POOL_LABEL``: a
#: pod with that label is one of the pool's Ray pods to its NetworkPolicy.
REDIS_LABEL: Final = "envpool.dev/redis"
#: uid/gid of the Redis process: any non-root id works (its only writes go to the
#: emptyDir, which fsGroup makes its own).
REDIS_UID: Final = 999
REDIS_RESOURCES: Final[dict[str, dict[str, str]]] = {
    "requests": {"cpu": "50m", "memory": "64Mi"},
    # no maxmemory in Redis: an eviction would drop GCS tables; the pod limit bounds it
    "limits": {"memory": "512Mi"},
}


#: KubeRay's finalizer on a RayCluster with GCS fault tolerance: its deletion waits for
#: a Job KubeRay creates in the namespace to delete the cluster's keys from Redis.
KUBERAY_CLEANUP_FINALIZER: Final = "ray.io/gcs-ft-redis-cleanup-finalizer"


def own_redis_cleanup_pending(ray_cluster: Mapping[str, Any]) -> str | None:
    """The pool's name when ``ray_cluster`` is being deleted and KubeRay's Redis-cleanup
    finalizer holds it for a Redis of the operator's own (its Service and password
    Secret ``<pool>-redis``, in the RayCluster's namespace); None otherwise (no deletion,
    no finalizer, no fault tolerance, or a Redis the user named: its keys outlive the
    pool, and KubeRay's cleanup of them matters).

        >>> rc = {"metadata": {"name": "cp", "namespace": "ns", "deletionTimestamp": "t",
        ...                    "finalizers": [KUBERAY_CLEANUP_FINALIZER],
        ...                    "labels": {names.POOL_LABEL: "cp"}},
        ...       "spec": {"gcsFaultToleranceOptions": {
        ...           "redisAddress": "cp-redis.ns.svc:6379", "redisPassword": {"valueFrom": {
        ...               "secretKeyRef": {"name": "cp-redis", "key": "password"}}}}}}
        >>> own_redis_cleanup_pending(rc)
        'cp'
        >>> rc["spec"]["gcsFaultToleranceOptions"]["redisAddress"] = "redis.infra.svc:6379"
        >>> own_redis_cleanup_pending(rc) is None
        True
    """
    meta = ray_cluster.get("metadata") or {}
    if not meta.get("deletionTimestamp") or KUBERAY_CLEANUP_FINALIZER not in (
            meta.get("finalizers") or ()):
        return None
    return uses_own_redis(ray_cluster)


def uses_own_redis(ray_cluster: Mapping[str, Any]) -> str | None:
    """The pool's name when ``ray_cluster``'s GCS writes to the operator's own Redis for
    it (address and password Secret ``<pool>-redis`` in its namespace), else None."""
    meta = ray_cluster.get("metadata") or {}
    pool_name = str((meta.get("labels") or {}).get(names.POOL_LABEL) or "")
    opts = (ray_cluster.get("spec") or {}).get("gcsFaultToleranceOptions") or {}
    ref = ((opts.get("redisPassword") or {}).get("valueFrom") or {}).get("secretKeyRef") or {}
    own = f"{redis_name(pool_name)}.{meta.get('namespace')}.svc:{REDIS_PORT}"
    if not pool_name or opts.get("redisAddress") != own or ref.get("name") != redis_name(pool_name):
        return None
    return pool_name


def redis_goes_with_pool(ray_cluster: Mapping[str, Any], pool: Mapping[str, Any] | None) -> bool:
    """Whether the EnvPool that owns ``ray_cluster`` is gone or being deleted: ``pool`` is
    the EnvPool of its name as read now (None: absent; another uid: a new EnvPool of the
    same name). Its own Redis is garbage-collected with it, so a cleanup of the keys
    there guards nothing; in a namespace being deleted KubeRay cannot even create the
    cleanup Job, and holds the RayCluster, and the namespace, until its own timeout."""
    if pool is None:
        return True
    meta = pool.get("metadata") or {}
    owners = {ref.get("uid") for ref in (ray_cluster.get("metadata") or {}).get("ownerReferences") or ()
              if ref.get("kind") == spec_mod.KIND}
    return meta.get("uid") not in owners or bool(meta.get("deletionTimestamp"))


def redis_name(pool_name: str) -> str:
    """Deployment, Service, NetworkPolicy and Secret of the pool's own Redis."""
    return f"{pool_name}-redis"


def redis_address(pool: spec_mod.PoolSpec) -> str:
    """host:port the pool's GCS writes to: the user's Redis or the operator's Service."""
    hft = pool.head_fault_tolerance
    if hft.redis_address:
        return hft.redis_address
    return f"{redis_name(pool.name)}.{pool.namespace}.svc:{REDIS_PORT}"


def gcs_fault_tolerance_options(pool: spec_mod.PoolSpec) -> dict[str, Any] | None:
    """The RayCluster's ``spec.gcsFaultToleranceOptions`` (KubeRay >= 1.3), None when off.

    KubeRay turns it into ``RAY_REDIS_ADDRESS`` and ``--redis-password`` on the head,
    a longer GCS reconnect timeout on the workers, and a Job that deletes the pool's
    keys from Redis when the RayCluster is deleted. The storage namespace is left to
    KubeRay (the RayCluster's uid): a recreated RayCluster starts from empty tables.
    """
    hft = pool.head_fault_tolerance
    if not hft.enabled:
        return None
    out: dict[str, Any] = {"redisAddress": redis_address(pool)}
    if hft.provisioned:
        secret, key = redis_name(pool.name), PASSWORD_KEY
    elif hft.password_secret:
        secret, key = hft.password_secret, hft.password_key
    else:
        return out
    out["redisPassword"] = {"valueFrom": {"secretKeyRef": {"name": secret, "key": key}}}
    return out


def _labels(pool: spec_mod.PoolSpec) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "envpool-redis",
        "app.kubernetes.io/instance": pool.name,
        "app.kubernetes.io/managed-by": names.MANAGED_BY,
        REDIS_LABEL: pool.name,
    }


def _meta(pool: spec_mod.PoolSpec) -> dict[str, Any]:
    return {"name": redis_name(pool.name), "namespace": pool.namespace, "labels": _labels(pool)}


def build_password_secret(pool: spec_mod.PoolSpec, password: str) -> dict[str, Any]:
    """Secret ``<name>-redis`` with ``password`` (made by the caller: this stays pure).

    Created once and never updated (the operator cannot read it back to compare); a
    pool with a user's Redis has none.
    """
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": _meta(pool),
        "type": "Opaque",
        "stringData": {PASSWORD_KEY: password},
    }


def build_redis_children(pool: spec_mod.PoolSpec,
                         settings: settings_mod.Settings) -> list[dict[str, Any]]:
    """Service, NetworkPolicy and Deployment of the pool's own Redis; none when the pool
    names its own Redis or turns fault tolerance off (a Redis made before stays: the
    operator deletes nothing but through the EnvPool's ownerReferences)."""
    if not pool.head_fault_tolerance.provisioned:
        return []
    return [_service(pool), _network_policy(pool), _deployment(pool, settings)]


def _service(pool: spec_mod.PoolSpec) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(pool),
        "spec": {
            "type": "ClusterIP",
            "selector": {REDIS_LABEL: pool.name},
            "ports": [{"name": "redis", "port": REDIS_PORT, "targetPort": "redis",
                       "protocol": "TCP"}],
        },
    }


def _network_policy(pool: spec_mod.PoolSpec) -> dict[str, Any]:
    """Ingress to the Redis: the pool's own Ray pods, on the Redis port only."""
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": _meta(pool),
        "spec": {
            "podSelector": {"matchLabels": {REDIS_LABEL: pool.name}},
            "policyTypes": ["Ingress"],
            "ingress": [{
                "from": [{"podSelector": {"matchLabels": {names.POOL_LABEL: pool.name}}}],
                "ports": [{"protocol": "TCP", "port": REDIS_PORT}],
            }],
        },
    }


def _deployment(pool: spec_mod.PoolSpec, settings: settings_mod.Settings) -> dict[str, Any]:
    container = {
        "name": "redis",
        "image": settings.redis_image,
        "imagePullPolicy": settings.image_pull_policy,
        "command": ["redis-server"],
        # $(REDIS_PASSWORD): expanded by the kubelet from the env below, so the password
        # is in no manifest. No config file: Debian's binds loopback only.
        "args": ["--port", str(REDIS_PORT), "--bind", "0.0.0.0", "--protected-mode", "no",
                 "--requirepass", "$(REDIS_PASSWORD)", "--dir", "/data",
                 # every write in the append-only file: a restarted container (OOM, crash)
                 # comes back with the GCS tables; no RDB snapshots on top
                 "--appendonly", "yes", "--appendfsync", "everysec", "--save", ""],
        "env": [{"name": "REDIS_PASSWORD", "valueFrom": {"secretKeyRef": {
            "name": redis_name(pool.name), "key": PASSWORD_KEY}}}],
        "ports": [{"name": "redis", "containerPort": REDIS_PORT, "protocol": "TCP"}],
        "readinessProbe": {"tcpSocket": {"port": "redis"}, "periodSeconds": 5},
        "livenessProbe": {"tcpSocket": {"port": "redis"}, "periodSeconds": 10,
                          "failureThreshold": 6},
        "resources": REDIS_RESOURCES,
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
            "readOnlyRootFilesystem": True,
        },
        "volumeMounts": [{"name": "data", "mountPath": "/data"}],
    }
    pod_spec: dict[str, Any] = {
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": REDIS_UID,
            "runAsGroup": REDIS_UID,
            "fsGroup": REDIS_UID,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [container],
        "volumes": [{"name": "data", "emptyDir": {}}],
        # Away from the head if it can be: a node lost with both loses the GCS tables.
        "affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{
            "weight": 100,
            "podAffinityTerm": {
                "topologyKey": "kubernetes.io/hostname",
                "labelSelector": {"matchLabels": {names.POOL_LABEL: pool.name,
                                                  "ray.io/node-type": "head"}},
            },
        }]}},
    }
    # Where the head may go (the control pods' nodes), so the Redis can schedule too.
    head = pool.ray.head
    if head.node_selector:
        pod_spec["nodeSelector"] = dict(head.node_selector)
    if head.tolerations:
        pod_spec["tolerations"] = [dict(t) for t in head.tolerations]
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _meta(pool),
        "spec": {
            "replicas": 1,
            # one Redis at a time: two would be two stores, the GCS writing to either
            "strategy": {"type": "Recreate"},
            "selector": {"matchLabels": {REDIS_LABEL: pool.name}},
            "template": {"metadata": {"labels": _labels(pool)}, "spec": pod_spec},
        },
    }
