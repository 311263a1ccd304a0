"""envpool_operator.builders, .pod_templates, .access: manifests from a PoolSpec, as plain dicts."""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml

from envpool_operator import access, builders, names, pod_templates, settings
from remote_env import spec
from remote_env.spec.pool_report import PoolReport

SETTINGS = settings.Settings(image="registry.example/envpool:1.0")


def _pool(name: str = "cp", **over: Any) -> spec.PoolSpec:
    raw: dict[str, Any] = {"env": {"id": "CartPole-v1"}, "replicas": 100, "envsPerActor": 8}
    raw.update(over)
    return spec.parse_spec(raw, name=name, namespace="team-a")


def _head(rc: dict[str, Any]) -> dict[str, Any]:
    tpl: dict[str, Any] = rc["spec"]["headGroupSpec"]["template"]
    return tpl


def _containers(rc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in _head(rc)["spec"]["containers"]}


def test_config_map_holds_the_full_pool_document() -> None:
    cm = builders.build_config_map(_pool())
    assert cm["metadata"]["name"] == "cp-pool"
    assert cm["metadata"]["namespace"] == "team-a"
    doc = yaml.safe_load(cm["data"]["pool.yaml"])
    assert doc["kind"] == "EnvPool" and doc["apiVersion"] == "envpool.dev/v1alpha1"
    assert doc["metadata"] == {"name": "cp", "namespace": "team-a"}
    assert doc["spec"]["replicas"] == 100
    assert doc["spec"]["envsPerActor"] == 8
    assert doc["spec"]["faultTolerance"]["restartFailedEnvs"] is True
    # the document parses back to the same spec
    assert spec.parse_spec(doc["spec"], name="cp", namespace="team-a") == _pool()


def test_ray_cluster_groups_and_sizes() -> None:
    rc = builders.build_ray_cluster(_pool(), SETTINGS)
    assert rc["apiVersion"] == "ray.io/v1" and rc["kind"] == "RayCluster"
    assert rc["metadata"]["name"] == "cp"
    assert rc["spec"]["rayVersion"] == "2.60.0"
    assert rc["spec"]["enableInTreeAutoscaling"] is False
    assert rc["spec"]["upgradeStrategy"] == {"type": "Recreate"}
    groups = rc["spec"]["workerGroupSpecs"]
    assert [g["groupName"] for g in groups] == ["envs"]
    # 100 envs / 64 per worker -> 2 workers, pinned (no autoscaler)
    assert groups[0]["replicas"] == groups[0]["minReplicas"] == groups[0]["maxReplicas"] == 2
    # head hosts no env actors; workers advertise env slots
    assert rc["spec"]["headGroupSpec"]["rayStartParams"]["num-cpus"] == "0"
    res = json.loads(json.loads(groups[0]["rayStartParams"]["resources"]))
    assert res == {spec.ENV_RESOURCE: 64}


def test_suspend_keeps_head_and_zeroes_workers() -> None:
    rc = builders.build_ray_cluster(_pool(suspend=True), SETTINGS)
    assert rc["spec"]["workerGroupSpecs"][0]["replicas"] == 0
    assert "suspend" not in rc["spec"]  # KubeRay's suspend would delete the head too
    assert _containers(rc)["pool-server"]


def test_head_runs_pool_server_sidecar() -> None:
    rc = builders.build_ray_cluster(_pool(metrics={"port": 9100}), SETTINGS)
    containers = _head(rc)["spec"]["containers"]
    assert containers[0]["name"] == "ray-head"  # KubeRay: containers[0] is Ray
    side = _containers(rc)["pool-server"]
    assert side["command"] == ["envpool", "serve", "--config", "/etc/envpool/pool.yaml", "--env-resource"]
    # the pool server takes its port from the config it mounts
    cm = builders.build_config_map(_pool(metrics={"port": 9100}))
    assert yaml.safe_load(cm["data"]["pool.yaml"])["spec"]["metrics"]["port"] == 9100
    assert side["readinessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert side["ports"] == [{"name": "metrics", "containerPort": 9100, "protocol": "TCP"}]
    assert {"name": "pool-config", "mountPath": "/etc/envpool", "readOnly": True} in side[
        "volumeMounts"]
    vols = {v["name"]: v for v in _head(rc)["spec"]["volumes"]}
    assert vols["pool-config"]["configMap"]["name"] == "cp-pool"
    env = {e["name"]: e for e in side["env"]}
    assert env["ENVPOOL_POOL_NAME"]["value"] == "cp"
    assert env["ENVPOOL_POOL_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
    assert env["RAY_ADDRESS"]["value"] == "127.0.0.1:6379"
    ann = _head(rc)["metadata"]["annotations"]
    assert ann["prometheus.io/port"] == "9100" and ann["prometheus.io/scrape"] == "true"


def test_image_defaults_to_the_operator_setting_and_can_be_overridden() -> None:
    rc = builders.build_ray_cluster(_pool(), SETTINGS)
    assert {c["image"] for c in _head(rc)["spec"]["containers"]} == {"registry.example/envpool:1.0"}
    own = builders.build_ray_cluster(_pool(ray={"image": "me/mine:2"}), SETTINGS)
    worker = own["spec"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]
    assert worker["image"] == "me/mine:2"


def test_labels_on_everything() -> None:
    pool = _pool(name="p1")
    rc = builders.build_ray_cluster(pool, SETTINGS)
    want = {"app.kubernetes.io/name": "envpool", "app.kubernetes.io/instance": "p1",
            "envpool.dev/pool": "p1"}
    for labels in (
        rc["metadata"]["labels"],
        _head(rc)["metadata"]["labels"],
        rc["spec"]["workerGroupSpecs"][0]["template"]["metadata"]["labels"],
        *(child["metadata"]["labels"] for child in builders.build_children(pool, SETTINGS)),
    ):
        assert want.items() <= labels.items()
    assert names.selector("p1") == "envpool.dev/pool=p1"


def test_restricted_security_context() -> None:
    rc = builders.build_ray_cluster(_pool(), SETTINGS)
    templates = [_head(rc), rc["spec"]["workerGroupSpecs"][0]["template"]]
    for tpl in templates:
        pod = tpl["spec"]["securityContext"]
        assert pod["runAsNonRoot"] is True
        assert pod["seccompProfile"] == {"type": "RuntimeDefault"}
        for c in tpl["spec"]["containers"]:
            sc = c["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False
            assert sc["capabilities"] == {"drop": ["ALL"]}
    assert _containers(rc)["pool-server"]["securityContext"]["readOnlyRootFilesystem"] is True
    # no pod automounts an API token; the pool-server sidecar alone mounts one
    assert _head(rc)["spec"]["automountServiceAccountToken"] is False
    assert templates[1]["spec"]["automountServiceAccountToken"] is False
    token_dir = "/var/run/secrets/kubernetes.io/serviceaccount"
    for tpl in templates:
        for c in tpl["spec"]["containers"]:
            mounts = [m["mountPath"] for m in c.get("volumeMounts", ())]
            assert (token_dir in mounts) == (c["name"] == "pool-server"), c["name"]
    vols = {v["name"]: v for v in _head(rc)["spec"]["volumes"]}
    sources = vols["kube-api-token"]["projected"]["sources"]
    assert sources[0]["serviceAccountToken"]["path"] == "token"
    assert {"key": "ca.crt", "path": "ca.crt"} in sources[1]["configMap"]["items"]


def test_resources_pass_through_or_default() -> None:
    pool = _pool(ray={"worker": {"resources": {"requests": {"cpu": "3"}, "limits": {"cpu": 3}}}})
    rc = builders.build_ray_cluster(pool, SETTINGS)
    worker = rc["spec"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]
    assert worker["resources"] == {"requests": {"cpu": "3"}, "limits": {"cpu": "3"}}
    head = _containers(rc)["ray-head"]
    assert head["resources"] == pod_templates.DEFAULT_HEAD_RESOURCES


def test_scheduling_fields_of_each_group_go_to_its_pods_only() -> None:
    tol = {"key": "dedicated", "operator": "Equal", "value": "sim", "effect": "NoSchedule"}
    pool = _pool(ray={"worker": {"nodeSelector": {"pool": "sim"}, "tolerations": [tol]}})
    rc = builders.build_ray_cluster(pool, SETTINGS)
    wspec = rc["spec"]["workerGroupSpecs"][0]["template"]["spec"]
    assert wspec["nodeSelector"] == {"pool": "sim"}
    assert wspec["tolerations"] == [tol]
    assert "nodeSelector" not in _head(rc)["spec"]
    assert "tolerations" not in _head(rc)["spec"]

    head_tol = {"key": "control", "operator": "Exists", "effect": "NoSchedule"}
    pool = _pool(ray={"head": {"nodeSelector": {"tier": "control"}, "tolerations": [head_tol]}})
    rc = builders.build_ray_cluster(pool, SETTINGS)
    assert _head(rc)["spec"]["nodeSelector"] == {"tier": "control"}
    assert _head(rc)["spec"]["tolerations"] == [head_tol]
    assert "nodeSelector" not in rc["spec"]["workerGroupSpecs"][0]["template"]["spec"]
    # the pool server reads the same placement back from its config document
    doc = yaml.safe_load(builders.build_config_map(pool)["data"][names.CONFIG_KEY])
    assert doc["spec"]["ray"]["head"]["tolerations"] == [head_tol]


def test_head_placement_errors_name_the_head() -> None:
    with pytest.raises(spec.SpecError) as err:
        _pool(ray={"head": {"nodeSelector": {"a": 1}, "tolerations": [{"operator": "Sometimes"}]}})
    text = str(err.value)
    assert "spec.ray.head.nodeSelector.a" in text
    assert "spec.ray.head.tolerations[0].operator" in text


def test_rbac_is_least_privilege_for_own_envpool() -> None:
    pool = _pool(name="p1")
    role = access.build_role(pool)
    for rule in role["rules"]:
        assert rule["resourceNames"] == ["p1"]
        assert set(rule["verbs"]) <= {"get", "watch", "patch"}
    assert {r for rule in role["rules"] for r in rule["resources"]} == {
        "envpools", "envpools/status"}
    binding = access.build_role_binding(pool)
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"][0]["name"] == "p1-pool-server"
    rc = builders.build_ray_cluster(pool, SETTINGS)
    assert _head(rc)["spec"]["serviceAccountName"] == "p1-pool-server"


def test_children_order_and_kinds() -> None:
    kinds = [c["kind"] for c in builders.build_children(_pool(), SETTINGS)]
    assert kinds == ["ServiceAccount", "Role", "RoleBinding", "NetworkPolicy", "ConfigMap",
                     "RayCluster"]


def test_ray_token_auth_is_on_by_default_and_reaches_the_sidecar() -> None:
    rc = builders.build_ray_cluster(_pool(name="p1"), SETTINGS)
    assert rc["spec"]["authOptions"] == {"mode": "token"}
    # KubeRay sets the token on the Ray containers only; the sidecar needs it to connect
    env = {e["name"]: e for e in _containers(rc)["pool-server"]["env"]}
    assert env["RAY_AUTH_MODE"]["value"] == "token"
    assert env["RAY_AUTH_TOKEN"]["valueFrom"]["secretKeyRef"] == {
        "name": "p1", "key": "auth_token"}  # the Secret KubeRay generates
    assert "RAY_AUTH_TOKEN" not in {e["name"] for e in _containers(rc)["ray-head"].get("env", ())}


def test_ray_token_auth_opt_out() -> None:
    rc = builders.build_ray_cluster(_pool(ray={"authMode": "disabled"}), SETTINGS)
    assert "authOptions" not in rc["spec"]
    names = {e["name"] for e in _containers(rc)["pool-server"]["env"]}
    assert not names & {"RAY_AUTH_MODE", "RAY_AUTH_TOKEN"}
    assert _hash(ray={"authMode": "disabled"}) != _hash()  # new pods: Ray reads it at start


def test_network_policy_admits_only_the_pool_and_its_trainers() -> None:
    pol = access.build_network_policy(_pool(name="p1", metrics={"port": 9100}))
    assert pol["kind"] == "NetworkPolicy" and pol["metadata"]["name"] == "p1-ray"
    sp = pol["spec"]
    assert sp["podSelector"] == {"matchLabels": {"envpool.dev/pool": "p1"}}
    assert sp["policyTypes"] == ["Ingress"]
    peers, metrics, lease = sp["ingress"]
    # every port, but only from this pool's pods and pods labelled as its trainers
    # (pod selectors without a namespace selector: this namespace only)
    assert "ports" not in peers
    assert peers["from"] == [{"podSelector": {"matchLabels": {"envpool.dev/pool": "p1"}}},
                             {"podSelector": {"matchLabels": {"envpool.dev/trainer": "p1"}}}]
    # from anywhere: only the pool server's metrics port (Prometheus)
    assert metrics["ports"] == [{"protocol": "TCP", "port": 9100}]
    assert names.TRAINER_LABEL == "envpool.dev/trainer"
    # trainers without Ray (issue 30): the lease API and the actors' data ports, no Ray port
    assert lease["from"] == [{"podSelector": {"matchLabels": {"envpool.dev/trainer-of": "p1"}}}]
    assert lease["ports"] == [{"protocol": "TCP", "port": 8267},
                              {"protocol": "TCP", "port": 20000, "endPort": 29999}]
    ray_ports = {6379, 8265, 10001, 8080, 52365, *range(10002, 20000)}
    assert not any(p["port"] <= r <= p.get("endPort", p["port"])
                   for p in lease["ports"] for r in ray_ports)


def test_lease_api_reaches_the_sidecar_and_the_head_service() -> None:
    rc = builders.build_ray_cluster(_pool(name="p1"), SETTINGS)
    containers = _containers(rc)
    # KubeRay makes the head Service's ports from containers[0]'s: the sidecar listens
    assert {"name": "lease-api", "containerPort": 8267, "protocol": "TCP"} in containers[
        "ray-head"]["ports"]
    ports = [p["containerPort"] for c in containers.values() for p in c.get("ports", [])]
    assert len(ports) == len(set(ports)), "a port declared twice in the head pod"
    side = containers["pool-server"]
    env = {e["name"]: e for e in side["env"]}
    assert env["ENVPOOL_LEASE_TOKEN_FILE"]["value"] == "/etc/envpool-lease-token/token"
    assert {"name": "lease-token", "mountPath": "/etc/envpool-lease-token", "readOnly": True} in side[
        "volumeMounts"]
    vols = {v["name"]: v for v in _head(rc)["spec"]["volumes"]}
    assert vols["lease-token"]["secret"]["secretName"] == "p1-lease-token"
    assert vols["lease-token"]["secret"]["items"] == [{"key": "token", "path": "token"}]
    assert "optional" not in vols["lease-token"]["secret"]  # no pool server without it
    # only the sidecar: the Ray containers run user code
    assert all(m["name"] != "lease-token" for m in containers["ray-head"]["volumeMounts"])
    worker = rc["spec"]["workerGroupSpecs"][0]["template"]["spec"]
    assert "lease-token" not in {v["name"] for v in worker["volumes"]}


def test_workers_tell_their_actors_the_data_port_range() -> None:
    from remote_env.wire import channel

    rc = builders.build_ray_cluster(_pool(), SETTINGS)
    (worker,) = rc["spec"]["workerGroupSpecs"][0]["template"]["spec"]["containers"]
    assert {"name": channel.DATA_PORTS_ENV, "value": "20000-29999"} in worker["env"]
    assert channel.parse_port_range("20000-29999") == names.DATA_PORTS
    # room for every actor a worker may host (envsPerActor 1)
    assert names.DATA_PORTS[1] - names.DATA_PORTS[0] + 1 >= spec.fields.FIELDS[
        "spec.ray.worker.envsPerWorker"].maximum
    head_env = {e["name"] for c in _containers(rc).values() for e in c.get("env", [])}
    assert channel.DATA_PORTS_ENV not in head_env  # no actor on the head


def test_lease_token_secret() -> None:
    sec = access.build_lease_token_secret(_pool(name="p1"), "s3cret")
    assert sec["kind"] == "Secret" and sec["type"] == "Opaque"
    assert sec["metadata"]["name"] == "p1-lease-token"
    assert sec["metadata"]["namespace"] == "team-a"
    assert sec["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "envpool-operator"
    assert sec["data"] == {"token": "czNjcmV0"}
    with pytest.raises(ValueError, match="must not be empty"):
        access.build_lease_token_secret(_pool(), "")
    # not a child that is applied on every reconcile (that would replace the token)
    kinds = {c["kind"] for c in builders.build_children(_pool(), SETTINGS)}
    assert "Secret" not in kinds


def _hash(**over: Any) -> str:
    return builders.cluster_hash(_pool(**over), SETTINGS)


@pytest.mark.parametrize(
    "over",
    [
        {"replicas": 500},
        {"envsPerActor": 4},
        {"batchWaitMs": 50},
        {"autoresetMode": "SameStep"},
        {"faultTolerance": {"maxRestarts": 3}},
        {"suspend": True},
        # the pool server rolls these through the running pods (issue 32)
        {"ray": {"runtimeEnv": {"pip": ["numpy"]}}},
        {"env": {"id": "Acrobot-v1"}},
        {"env": {"id": "CartPole-v1", "kwargs": {"render_mode": "rgb_array"}}},
        {"threadsPerActor": 2},
        {"updateStrategy": {"maxUnavailable": 1}},
    ],
)
def test_hash_ignores_what_the_running_pool_can_absorb(over: dict[str, Any]) -> None:
    assert _hash(**over) == _hash()


@pytest.mark.parametrize(
    "over",
    [
        {"ray": {"image": "other:1"}},
        {"ray": {"version": "2.61.0"}},
        {"ray": {"worker": {"resources": {"requests": {"cpu": "8"}}}}},
        {"ray": {"worker": {"envsPerWorker": 32}}},
        {"metrics": {"port": 9000}},
    ],
)
def test_hash_changes_for_what_needs_new_pods(over: dict[str, Any]) -> None:
    assert _hash(**over) != _hash()


def test_an_env_change_reaches_the_pool_server_through_the_config_map_only() -> None:
    # same RayCluster (no pod recreated), a ConfigMap with the new env and revision
    old, new = _pool(), _pool(env={"id": "Acrobot-v1"}, ray={"runtimeEnv": {"env_vars": {"A": "1"}}})
    assert builders.build_ray_cluster(old, SETTINGS) == builders.build_ray_cluster(new, SETTINGS)
    doc = yaml.safe_load(builders.build_config_map(new)["data"][names.CONFIG_KEY])
    assert doc["spec"]["env"]["id"] == "Acrobot-v1"
    assert doc["spec"]["ray"]["runtimeEnv"] == {"env_vars": {"A": "1"}}
    assert "updateStrategy" not in doc["spec"]  # the default: an older pool server reads it too
    assert spec.parse_manifest(doc).revision() == new.revision() != old.revision()
    set_ = _pool(updateStrategy={"maxUnavailable": 3})
    doc = yaml.safe_load(builders.build_config_map(set_)["data"][names.CONFIG_KEY])
    assert doc["spec"]["updateStrategy"] == {"maxUnavailable": 3, "leasedActors": "WaitForRelease",
                                             "leasedGraceSeconds": 600}


def test_hash_is_on_cluster_and_pod_templates() -> None:
    rc = builders.build_ray_cluster(_pool(), SETTINGS)
    h = rc["metadata"]["annotations"][names.CLUSTER_HASH_ANNOTATION]
    assert h == _hash()
    assert _head(rc)["metadata"]["annotations"][names.CLUSTER_HASH_ANNOTATION] == h
    wt = rc["spec"]["workerGroupSpecs"][0]["template"]
    assert wt["metadata"]["annotations"][names.CLUSTER_HASH_ANNOTATION] == h


def test_builders_are_deterministic_and_do_not_share_state() -> None:
    a = builders.build_ray_cluster(_pool(), SETTINGS)
    a["spec"]["headGroupSpec"]["template"]["spec"]["volumes"].clear()
    b = builders.build_ray_cluster(_pool(), SETTINGS)
    assert b["spec"]["headGroupSpec"]["template"]["spec"]["volumes"]
    assert json.dumps(b, sort_keys=True) == json.dumps(
        builders.build_ray_cluster(_pool(), SETTINGS), sort_keys=True)


def test_the_sidecar_sees_the_raylet() -> None:
    # ray.init() in the pool-server container finds its node by the raylet's process
    rc = builders.build_ray_cluster(_pool(), SETTINGS)
    assert _head(rc)["spec"]["shareProcessNamespace"] is True
    assert "shareProcessNamespace" not in rc["spec"]["workerGroupSpecs"][0]["template"]["spec"]


def test_no_service_links_in_pool_pods() -> None:
    # A Service named e.g. "envpool-config" would otherwise inject ENVPOOL_CONFIG_PORT=tcp://...
    rc = builders.build_ray_cluster(_pool(), SETTINGS)
    assert _head(rc)["spec"]["enableServiceLinks"] is False
    assert rc["spec"]["workerGroupSpecs"][0]["template"]["spec"]["enableServiceLinks"] is False


def test_env_from_secrets_reach_the_ray_containers_only() -> None:
    rc = builders.build_ray_cluster(_pool(ray={"envFromSecrets": ["sim-creds", "license"]}),
                                    SETTINGS)
    want = [{"secretRef": {"name": "sim-creds"}}, {"secretRef": {"name": "license"}}]
    assert _containers(rc)["ray-head"]["envFrom"] == want
    worker = rc["spec"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]
    assert worker["envFrom"] == want
    assert "envFrom" not in _containers(rc)["pool-server"]
    # the names only, never the values: nothing of the Secret is in the ConfigMap
    cm = builders.build_config_map(_pool(ray={"envFromSecrets": ["sim-creds"]}))
    assert "sim-creds" in cm["data"]["pool.yaml"]
    assert "envFrom" not in _containers(builders.build_ray_cluster(_pool(), SETTINGS))["ray-head"]


# ------------------------------------------------- shrinking the worker group (worker_plan)
def _plan_pool(replicas: int, **over: Any) -> spec.PoolSpec:
    return spec.parse_spec({"env": {"id": "CartPole-v1"}, "replicas": replicas,
                            "envsPerActor": 8, **over}, name="p")


def _pods(*names: str) -> list[str]:
    return [f"p-envs-worker-{n}" for n in names]


def test_worker_plan_grows_and_shrinks_plainly_without_a_report() -> None:
    pool = _plan_pool(128)  # 2 workers of 64
    assert builders.worker_plan(pool, current=1, report=None) == (2, [])
    assert builders.worker_plan(pool, current=None, report=None) == (2, [])
    assert builders.worker_plan(pool, current=5, report=None) == (2, [])
    # Ray outside Kubernetes: host names that are no pods of this group say nothing
    assert builders.worker_plan(pool, current=5, report=PoolReport.read({
        "leasedWorkers": ["laptop"], "freeWorkers": ["other-envs-worker-x"]})) == (2, [])


def test_worker_plan_never_removes_a_pod_with_a_leased_env() -> None:
    pool = _plan_pool(64)  # 1 worker wanted
    report = PoolReport.read({"leasedWorkers": _pods("a", "b"), "freeWorkers": _pods("c", "d")})
    replicas, remove = builders.worker_plan(pool, current=4, report=report)
    assert (replicas, remove) == (2, _pods("c", "d"))  # a and b stay for their leases
    # only one free pod named (the rest unknown): only that one goes
    replicas, remove = builders.worker_plan(pool, current=4, report=PoolReport.read({
        "leasedWorkers": _pods("a"), "freeWorkers": _pods("c")}))
    assert (replicas, remove) == (3, _pods("c"))


def test_worker_plan_removes_the_emptiest_first_and_no_more_than_needed() -> None:
    pool = _plan_pool(128)  # 2 workers wanted
    report = PoolReport.read({"leasedWorkers": [], "freeWorkers": _pods("empty", "one-actor", "full")})
    assert builders.worker_plan(pool, current=3, report=report) == (2, _pods("empty"))


def test_worker_plan_lands_in_the_ray_cluster_but_not_in_its_hash() -> None:
    pool = _plan_pool(64)
    rc = builders.build_ray_cluster(pool, SETTINGS, workers=(2, _pods("c")))
    (group,) = rc["spec"]["workerGroupSpecs"]
    assert group["replicas"] == group["minReplicas"] == group["maxReplicas"] == 2
    assert group["scaleStrategy"] == {"workersToDelete": _pods("c")}
    plain = builders.build_ray_cluster(pool, SETTINGS)
    # nothing to remove: {} as KubeRay stores it (its Go type drops an empty list), so
    # that the operator's apply after KubeRay's Update changes nothing
    assert plain["spec"]["workerGroupSpecs"][0]["scaleStrategy"] == {}
    # naming the pods to remove rolls nothing
    assert rc["metadata"]["annotations"] == plain["metadata"]["annotations"]
