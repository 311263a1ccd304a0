"""envpool_operator.gcs_store and spec.headFaultTolerance: the pool's GCS survives its head.

What KubeRay (v1.6.2, the CRD in the test cluster's cache) reads, what the pool's Redis
runs as and who may reach it; a pool with fault tolerance off renders as before.
"""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from envpool_operator import access, builders, gcs_store, names, settings
from remote_env import spec

SETTINGS = settings.Settings(image="registry.example/envpool:1.0",
                             redis_image="registry.example/redis:7")


def _pool(name: str = "cp", **over: Any) -> spec.PoolSpec:
    raw: dict[str, Any] = {"env": {"id": "CartPole-v1"}, "replicas": 16}
    raw.update(over)
    return spec.parse_spec(raw, name=name, namespace="team-a")


def _by_kind(children: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {c["kind"]: c for c in children}


def test_fault_tolerance_is_on_by_default_with_the_operators_redis() -> None:
    pool = _pool()
    assert pool.head_fault_tolerance.enabled and pool.head_fault_tolerance.provisioned
    rc = builders.build_ray_cluster(pool, SETTINGS)
    assert rc["spec"]["gcsFaultToleranceOptions"] == {
        "redisAddress": "cp-redis.team-a.svc:6379",
        "redisPassword": {"valueFrom": {"secretKeyRef": {"name": "cp-redis", "key": "password"}}},
    }
    kids = _by_kind(gcs_store.build_redis_children(pool, SETTINGS))
    assert sorted(kids) == ["Deployment", "NetworkPolicy", "Service"]
    # the Deployment reads the Secret the reconcile creates under the name KubeRay is told
    (container,) = kids["Deployment"]["spec"]["template"]["spec"]["containers"]
    (env,) = container["env"]
    assert env["valueFrom"]["secretKeyRef"] == {"name": "cp-redis", "key": "password"}
    secret = gcs_store.build_password_secret(pool, "s3cret")
    assert secret["metadata"]["name"] == "cp-redis" and secret["stringData"] == {"password": "s3cret"}
    # the Service selects the Redis pod, on the port the RayCluster is given
    svc = kids["Service"]
    pod_labels = kids["Deployment"]["spec"]["template"]["metadata"]["labels"]
    assert svc["spec"]["selector"].items() <= pod_labels.items()
    assert kids["Deployment"]["spec"]["selector"]["matchLabels"] == svc["spec"]["selector"]
    assert svc["spec"]["ports"][0]["port"] == 6379


def test_the_options_are_fields_of_the_kuberay_crd() -> None:
    """Every key we render exists in KubeRay's RayCluster schema (a typo would be pruned
    silently by the API server, and the pool would run without fault tolerance)."""
    from pathlib import Path

    crd_path = Path.home() / ".cache/envpool-cluster/kuberay-v1.6.2/crds/ray.io_rayclusters.yaml"
    if crd_path.exists():
        crd = yaml.safe_load(crd_path.read_text())
        props = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"][
            "properties"]["gcsFaultToleranceOptions"]["properties"]
    else:  # the fields as KubeRay v1.6.2 defines them (no cluster cache on this machine)
        props = {"redisAddress": {}, "redisPassword": {"properties": {"valueFrom": {}}},
                 "redisUsername": {}, "externalStorageNamespace": {}}
    options = gcs_store.gcs_fault_tolerance_options(_pool())
    assert options is not None and set(options) <= set(props)
    assert set(options["redisPassword"]) <= set(props["redisPassword"]["properties"])


def test_redis_runs_restricted_and_keeps_its_data_across_a_container_restart() -> None:
    dep = _by_kind(gcs_store.build_redis_children(_pool(), SETTINGS))["Deployment"]
    pod = dep["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod["automountServiceAccountToken"] is False and "serviceAccountName" not in pod
    (c,) = pod["containers"]
    assert c["image"] == "registry.example/redis:7"
    assert c["securityContext"] == {"allowPrivilegeEscalation": False,
                                    "capabilities": {"drop": ["ALL"]},
                                    "readOnlyRootFilesystem": True}
    args = c["args"]
    assert args[args.index("--requirepass") + 1] == "$(REDIS_PASSWORD)"  # in no manifest
    assert args[args.index("--appendonly") + 1] == "yes"
    assert args[args.index("--dir") + 1] == "/data"
    assert {"name": "data", "mountPath": "/data"} in c["volumeMounts"]
    assert dep["spec"]["replicas"] == 1 and dep["spec"]["strategy"] == {"type": "Recreate"}


def test_only_the_pools_ray_pods_reach_its_redis() -> None:
    pool = _pool()
    kids = _by_kind(gcs_store.build_redis_children(pool, SETTINGS))
    redis_labels = kids["Deployment"]["spec"]["template"]["metadata"]["labels"]
    # not one of the pool's Ray pods: the Ray policy (which admits trainers) must not select it
    assert names.POOL_LABEL not in redis_labels
    ray_policy = access.build_network_policy(pool)
    assert not ray_policy["spec"]["podSelector"]["matchLabels"].items() <= redis_labels.items()
    np = kids["NetworkPolicy"]
    assert np["metadata"]["name"] == "cp-redis"
    assert np["spec"]["podSelector"]["matchLabels"].items() <= redis_labels.items()
    (rule,) = np["spec"]["ingress"]
    assert rule["from"] == [{"podSelector": {"matchLabels": {names.POOL_LABEL: "cp"}}}]
    assert rule["ports"] == [{"protocol": "TCP", "port": 6379}]
    # KubeRay's Ray pods carry the pool label (from the templates): they are admitted
    rc = builders.build_ray_cluster(pool, SETTINGS)
    head_labels = rc["spec"]["headGroupSpec"]["template"]["metadata"]["labels"]
    assert head_labels[names.POOL_LABEL] == "cp"


def test_redis_follows_the_heads_placement() -> None:
    tol = {"key": "control", "operator": "Exists", "effect": "NoSchedule"}
    pool = _pool(ray={"head": {"nodeSelector": {"pool": "control"}, "tolerations": [tol]}})
    pod = _by_kind(gcs_store.build_redis_children(pool, SETTINGS))["Deployment"]["spec"][
        "template"]["spec"]
    assert pod["nodeSelector"] == {"pool": "control"} and pod["tolerations"] == [tol]


def test_an_external_redis_gets_no_redis_of_ours() -> None:
    pool = _pool(headFaultTolerance={"redisAddress": "redis.infra.svc:6379",
                                     "passwordSecret": "infra-redis", "passwordKey": "pw"})
    assert not pool.head_fault_tolerance.provisioned
    assert gcs_store.build_redis_children(pool, SETTINGS) == []
    assert gcs_store.gcs_fault_tolerance_options(pool) == {
        "redisAddress": "redis.infra.svc:6379",
        "redisPassword": {"valueFrom": {"secretKeyRef": {"name": "infra-redis", "key": "pw"}}}}
    no_password = _pool(headFaultTolerance={"redisAddress": "10.0.0.7:6380"})
    assert gcs_store.gcs_fault_tolerance_options(no_password) == {"redisAddress": "10.0.0.7:6380"}


def test_opting_out_renders_the_ray_cluster_of_before() -> None:
    off = _pool(headFaultTolerance={"enabled": False})
    assert gcs_store.build_redis_children(off, SETTINGS) == []
    assert gcs_store.gcs_fault_tolerance_options(off) is None
    rc = builders.build_ray_cluster(off, SETTINGS)
    assert "gcsFaultToleranceOptions" not in rc["spec"]
    on = builders.build_ray_cluster(_pool(), SETTINGS)
    # the only difference: the options (and the hash that says the pods differ)
    on["spec"].pop("gcsFaultToleranceOptions")
    assert builders.cluster_hash(off, SETTINGS) != builders.cluster_hash(_pool(), SETTINGS)
    strip = names.CLUSTER_HASH_ANNOTATION
    for cluster in (rc, on):
        cluster["metadata"]["annotations"].pop(strip)
        cluster["spec"]["headGroupSpec"]["template"]["metadata"]["annotations"].pop(strip)
        cluster["spec"]["workerGroupSpecs"][0]["template"]["metadata"]["annotations"].pop(strip)
    assert rc == on


def test_the_spec_round_trips_and_stays_out_of_the_config_map_at_its_default() -> None:
    assert "headFaultTolerance" not in _pool().to_manifest()
    ext = _pool(headFaultTolerance={"redisAddress": "redis:6379", "passwordSecret": "r"})
    assert ext.to_manifest()["headFaultTolerance"] == {
        "enabled": True, "redisAddress": "redis:6379", "passwordSecret": "r",
        "passwordKey": "password"}
    again = spec.parse_spec(ext.to_manifest(), name="cp", namespace="team-a")
    assert again == ext


@pytest.mark.parametrize(("hft", "needle"), [
    ({"passwordSecret": "mine"}, "set redisAddress too"),
    ({"redisAddress": "no-port"}, "expected host:port"),
    ({"redisAddress": "redis:6379", "passwordSecret": "Bad_Name"}, "Secret name"),
    ({"enabled": "yes"}, "headFaultTolerance.enabled"),
    ({"redis": "x:1"}, "headFaultTolerance"),
])
def test_bad_head_fault_tolerance_is_refused_by_name(hft: dict[str, Any], needle: str) -> None:
    with pytest.raises(spec.SpecError, match=needle):
        _pool(headFaultTolerance=hft)


def test_the_crd_says_the_same_about_password_without_address() -> None:
    from pathlib import Path

    crd = yaml.safe_load((Path(__file__).parents[2] / "manifests" / "crd" /
                          "envpool.dev_envpools.yaml").read_text())
    node = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"][
        "properties"]["headFaultTolerance"]
    (rule,) = node["x-kubernetes-validations"]
    assert rule["message"] == spec.fields.PASSWORD_SECRET_MESSAGE


def _deleting(pool: spec.PoolSpec, owner_uid: str = "uid-1",
              finalizers: tuple[str, ...] = (gcs_store.KUBERAY_CLEANUP_FINALIZER,)) -> dict[str, Any]:
    """The pool's RayCluster as rendered, owned by EnvPool ``owner_uid``, being deleted."""
    rc = builders.build_ray_cluster(pool, SETTINGS)
    rc["metadata"].update(
        deletionTimestamp="2026-12-06T20:00:00Z", finalizers=list(finalizers),
        ownerReferences=[{"apiVersion": spec.API_VERSION, "kind": spec.KIND,
                          "name": pool.name, "uid": owner_uid}])
    return rc


def _envpool(uid: str = "uid-1", deleting: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "cp", "namespace": "team-a", "uid": uid}
    if deleting:
        meta["deletionTimestamp"] = "2026-12-06T20:00:00Z"
    return {"apiVersion": spec.API_VERSION, "kind": spec.KIND, "metadata": meta}


def test_kuberays_redis_cleanup_is_waived_only_for_the_operators_redis_going_with_its_pool() -> None:
    """KubeRay's cleanup finalizer deletes the RayCluster's keys from Redis through a Job in
    the pool's namespace. For the operator's own Redis, deleted with the EnvPool, there is
    nothing to keep clean, and a terminating namespace refuses the Job (15-22 min held):
    the operator lifts it then. Not for a Redis the user named, not while the EnvPool lives
    (the RayCluster deleted by hand: the Redis stays), not for anything else KubeRay holds."""
    own = _deleting(_pool())
    assert gcs_store.own_redis_cleanup_pending(own) == "cp"
    # the EnvPool gone, being deleted, or replaced by a new one of the same name
    assert gcs_store.redis_goes_with_pool(own, None)
    assert gcs_store.redis_goes_with_pool(own, _envpool(deleting=True))
    assert gcs_store.redis_goes_with_pool(own, _envpool(uid="uid-2"))
    # the EnvPool lives: its Redis stays, and KubeRay cleans the old cluster's keys there
    assert not gcs_store.redis_goes_with_pool(own, _envpool())

    # a Redis the user named, even with a password Secret named like ours
    external = _deleting(_pool(headFaultTolerance={
        "redisAddress": "redis.infra.svc:6379", "passwordSecret": "cp-redis"}))
    assert gcs_store.own_redis_cleanup_pending(external) is None
    # ours by address, not by the Secret: not ours
    odd = _deleting(_pool(headFaultTolerance={
        "redisAddress": "cp-redis.team-a.svc:6379", "passwordSecret": "infra"}))
    assert gcs_store.own_redis_cleanup_pending(odd) is None
    # not being deleted, or no such finalizer (another one of KubeRay's stays too)
    alive = _deleting(_pool())
    del alive["metadata"]["deletionTimestamp"]
    assert gcs_store.own_redis_cleanup_pending(alive) is None
    assert gcs_store.own_redis_cleanup_pending(
        _deleting(_pool(), finalizers=("ray.io/other",))) is None
    # no fault tolerance: no options to be ours
    assert gcs_store.own_redis_cleanup_pending(
        _deleting(_pool(headFaultTolerance={"enabled": False}))) is None
