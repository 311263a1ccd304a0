"""The Helm chart, statically: generated files in sync, values documented and
schema-checked, the CRD identical to manifests/, and `helm template` renders
what the operator needs (RBAC, image, watch namespaces, security, monitors).

Needs the helm binary (tests/cluster/build.sh builds it; or $HELM / PATH), no cluster.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "helm" / "envpool-operator"
KUBE_VERSION = "v1.36.0"  # a helm built by `go install` defaults to v1.20


def _load_generate() -> Any:
    spec = importlib.util.spec_from_file_location("helm_generate", REPO / "helm" / "generate.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules["helm_generate"] = mod
    spec.loader.exec_module(mod)
    return mod


gen = _load_generate()


@pytest.fixture(scope="module")
def helm() -> str:
    try:
        return str(gen.find_helm())
    except FileNotFoundError as exc:
        pytest.fail(str(exc), pytrace=False)


def render(helm: str, *sets: str, release: str = "rel", namespace: str = "envpool-system",
           check: bool = True) -> list[dict[str, Any]] | subprocess.CompletedProcess[str]:
    args = [helm, "template", release, str(CHART), "--namespace", namespace,
            "--kube-version", KUBE_VERSION]
    for s in sets:
        args += ["--set", s]
    proc = subprocess.run(args, capture_output=True, text=True)
    if not check:
        return proc
    assert proc.returncode == 0, proc.stderr
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


def by_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


# --------------------------------------------------------------------------- files


def test_crd_is_the_same_file_as_manifests() -> None:
    src = REPO / "manifests" / "crd" / "envpool.dev_envpools.yaml"
    assert src.exists(), "manifests/crd/envpool.dev_envpools.yaml is missing"
    copy = CHART / "crds" / src.name
    assert copy.read_bytes() == src.read_bytes(), (
        f"{copy.relative_to(REPO)} differs from {src.relative_to(REPO)}: "
        f"cp {src.relative_to(REPO)} {copy.relative_to(REPO)}")
    assert sorted(p.name for p in (CHART / "crds").iterdir()) == [src.name]


def test_dashboard_and_readme_are_generated() -> None:
    assert (CHART / "files" / "envpool-dashboard.json").read_text() == gen.dashboard_text(), \
        "dashboard stale: python helm/generate.py"
    assert (CHART / "README.md").read_text() == gen.readme_text(), \
        "README values table stale: python helm/generate.py"


def test_plain_manifests_are_helm_template(helm: str) -> None:
    assert gen.INSTALL.read_text() == gen.install_text(helm), \
        "manifests/install stale: python helm/generate.py"
    kinds = [d["kind"] for d in yaml.safe_load_all(gen.INSTALL.read_text()) if d]
    assert kinds[0] == "Namespace"
    assert {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Deployment", "Service",
            "ConfigMap"} <= set(kinds)
    assert "Job" not in kinds  # no helm test hook in plain manifests


# --------------------------------------------------------------------------- values


def _values_text() -> str:
    return (CHART / "values.yaml").read_text()


def test_every_value_is_documented_and_in_the_readme() -> None:
    rows = gen.documented_values(_values_text())  # raises on an undocumented key
    values = yaml.safe_load(_values_text())

    def leaves(node: Any, prefix: str = "") -> set[str]:
        out: set[str] = set()
        for k, v in node.items():
            key = f"{prefix}{k}"
            documented = key in {r for r, _ in rows}
            if isinstance(v, dict) and v and not documented:
                out |= leaves(v, key + ".")
            else:
                out.add(key)
        return out

    keys = [r for r, _ in rows]
    assert set(keys) == leaves(values)
    readme = (CHART / "README.md").read_text()
    for key, desc in rows:
        assert desc, key
        assert f"| `{key}` |" in readme, key
    assert len(keys) >= 30


def test_undocumented_value_is_refused() -> None:
    with pytest.raises(ValueError, match="sneaky"):
        gen.documented_values(_values_text() + "sneaky: 1\n")


def test_schema_closes_every_object_and_covers_every_value() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    values = yaml.safe_load(_values_text())

    def walk(s: dict[str, Any], v: Any, path: str) -> None:
        if "properties" in s:
            assert s.get("additionalProperties") is False, f"{path}: additionalProperties"
            assert set(v) == set(s["properties"]), f"{path}: schema {set(s['properties'])} vs values {set(v)}"
            for k, sub in s["properties"].items():
                walk(sub, v[k], f"{path}.{k}")

    walk(schema, values, "values")


@pytest.mark.parametrize("bad", [
    "unknownKey=1",
    "image.unknown=1",
    "operator.metricsPort=0",
    "operator.metricsPort=70000",
    "operator.watchNamespaces={Bad_Name}",
    "image.pullPolicy=Sometimes",
    "metrics.serviceMonitor.interval=often",
    "service.type=ExternalName",
])
def test_schema_rejects(helm: str, bad: str) -> None:
    proc = render(helm, bad, check=False)
    assert isinstance(proc, subprocess.CompletedProcess)
    assert proc.returncode != 0 and "values don't meet the specifications" in proc.stderr, proc.stderr


def test_helm_lint_strict(helm: str) -> None:
    for extra in ([], ["--set", "operator.watchNamespaces={a,b}",
                       "--set", "metrics.serviceMonitor.enabled=true",
                       "--set", "metrics.podMonitor.enabled=true",
                       "--set", "metrics.prometheusRule.enabled=true"]):
        proc = subprocess.run([helm, "lint", "--strict", str(CHART), "--kube-version", KUBE_VERSION,
                               *extra], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "0 chart(s) failed" in proc.stdout


# --------------------------------------------------------------------------- render


def test_defaults_render_the_install(helm: str) -> None:
    docs = render(helm)
    assert isinstance(docs, list)
    kinds = sorted(d["kind"] for d in docs)
    assert kinds == sorted(["ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Deployment",
                            "Service", "ConfigMap", "Job", "ValidatingAdmissionPolicy",
                            "ValidatingAdmissionPolicyBinding"])
    for d in docs:
        labels = d["metadata"]["labels"]
        assert labels["app.kubernetes.io/name"] == "envpool-operator"
        assert labels["app.kubernetes.io/instance"] == "rel"
        assert labels["app.kubernetes.io/managed-by"] == "Helm"
        assert labels["helm.sh/chart"] == "envpool-operator-0.1.0"
        assert len(d["metadata"]["name"]) <= 63
    (job,) = by_kind(docs, "Job")
    assert job["metadata"]["annotations"]["helm.sh/hook"] == "test"
    pod = job["spec"]["template"]
    assert pod["spec"]["restartPolicy"] == "Never"
    assert pod["spec"]["automountServiceAccountToken"] is False
    # neither the Deployment nor the metrics Service may select the test pod
    dep = by_kind(docs, "Deployment")[0]
    # its metrics Service "<release>-metrics" must not inject ENVPOOL_OPERATOR_METRICS_PORT=tcp://...
    assert dep["spec"]["template"]["spec"]["enableServiceLinks"] is False
    svc = by_kind(docs, "Service")[0]
    for selector in (dep["spec"]["selector"]["matchLabels"], svc["spec"]["selector"]):
        assert not selector.items() <= pod["metadata"]["labels"].items()
    (c,) = pod["spec"]["containers"]
    env = {e["name"]: e["value"] for e in c["env"]}
    assert env["METRICS_URL"] == "http://rel-envpool-operator-metrics.envpool-system.svc:9090/metrics"
    assert c["securityContext"] == dep["spec"]["template"]["spec"]["containers"][0]["securityContext"]


def test_operator_deployment_is_restricted_and_wired(helm: str) -> None:
    docs = render(helm, "image.repository=example.com/me/envpool", "image.tag=1.2.3")
    assert isinstance(docs, list)
    dep = by_kind(docs, "Deployment")[0]
    assert dep["spec"]["replicas"] == 1 and dep["spec"]["strategy"]["type"] == "Recreate"
    pod = dep["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
    (c,) = pod["containers"]
    sc = c["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"]["drop"] == ["ALL"]
    assert {m["mountPath"] for m in c["volumeMounts"]} == {"/tmp"}
    # one image setting: the operator's own image is the pool-server image it hands out
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert c["image"] == env["ENVPOOL_IMAGE"] == "example.com/me/envpool:1.2.3"
    assert env["ENVPOOL_IMAGE_PULL_POLICY"] == "IfNotPresent"
    assert c["command"] == ["envpool"]
    assert c["args"] == ["operator", "--all-namespaces", "--liveness=http://0.0.0.0:8080/healthz",
                         "--metrics-port=9090", "--standalone"]
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "liveness"}
    assert {p["name"]: p["containerPort"] for p in c["ports"]} == {"liveness": 8080, "metrics": 9090}
    sa = by_kind(docs, "ServiceAccount")[0]
    assert sa["automountServiceAccountToken"] is False
    assert pod["serviceAccountName"] == sa["metadata"]["name"] == "rel-envpool-operator"
    svc = by_kind(docs, "Service")[0]
    assert svc["spec"]["selector"] == dep["spec"]["selector"]["matchLabels"]
    assert svc["spec"]["ports"][0]["targetPort"] == "metrics"
    # default tag = appVersion
    docs = render(helm)
    assert isinstance(docs, list)
    assert by_kind(docs, "Deployment")[0]["spec"]["template"]["spec"]["containers"][0]["image"] \
        == "ghcr.io/envpool-dev/envpool:0.1.0"


def test_chart_defaults_are_the_operators_defaults(helm: str) -> None:
    # The operator's settings are its defaults everywhere else (`envpool operator`, the
    # docs): the chart must not run it differently unless a user sets a value.
    from envpool_operator import settings

    dep = by_kind(render(helm), "Deployment")[0]
    (c,) = dep["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e["value"] for e in c["env"] if "value" in e}
    passed = {k: v for k, v in env.items() if k.startswith("ENVPOOL_") and k != "ENVPOOL_IMAGE"}
    assert {"ENVPOOL_RESYNC_SECONDS", "ENVPOOL_MAX_WORKERS_PER_POOL",
            "ENVPOOL_IMAGE_PULL_POLICY"} <= passed.keys()
    from_chart = settings.from_env(passed)
    assert dataclasses.replace(from_chart, image=settings.Settings.image) == settings.Settings()


def test_default_image_is_the_operators_default(helm: str) -> None:
    """One image, one name: the chart's default is what the operator uses without the chart."""
    from envpool_operator import settings

    docs = render(helm)
    assert isinstance(docs, list)
    (c,) = by_kind(docs, "Deployment")[0]["spec"]["template"]["spec"]["containers"]
    assert c["image"] == settings.DEFAULT_IMAGE
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert settings.DEFAULT_IMAGE.endswith(f":{chart['appVersion']}")


def _rules(doc: dict[str, Any]) -> list[dict[str, Any]]:
    rules: list[dict[str, Any]] = doc["rules"]
    return rules


def test_rbac_is_least_privilege(helm: str) -> None:
    docs = render(helm)
    assert isinstance(docs, list)
    (cr,) = by_kind(docs, "ClusterRole")
    for rule in _rules(cr):
        assert "*" not in rule["verbs"] and "*" not in rule["resources"] and "*" not in rule["apiGroups"]
        assert not {"pods", "namespaces", "nodes", "clusterroles",
                    "clusterrolebindings"} & set(rule["resources"]), rule
        # Secrets: create only (the pools' Redis passwords and lease tokens): made, never
        # read back, listed, watched or patched
        assert "secrets" not in rule["resources"] or (
            rule["resources"] == ["secrets"] and rule["verbs"] == ["create"]), rule
        assert not {"delete", "deletecollection", "escalate", "bind", "impersonate",
                    "update"} & set(rule["verbs"]), rule
    grants = {(g, r): set(rule["verbs"]) for rule in _rules(cr)
              for g in rule["apiGroups"] for r in rule["resources"]}
    assert grants == {
        ("apiextensions.k8s.io", "customresourcedefinitions"): {"list", "watch"},
        ("envpool.dev", "envpools"): {"get", "list", "watch", "patch"},
        ("envpool.dev", "envpools/status"): {"get", "patch"},
        ("envpool.dev", "envpools/scale"): {"get", "patch"},
        ("ray.io", "rayclusters"): {"get", "list", "watch", "create", "patch"},
        ("", "configmaps"): {"create", "patch"},
        ("", "serviceaccounts"): {"create", "patch"},
        ("rbac.authorization.k8s.io", "roles"): {"create", "patch"},
        ("rbac.authorization.k8s.io", "rolebindings"): {"create", "patch"},
        ("networking.k8s.io", "networkpolicies"): {"create", "patch"},
        ("", "secrets"): {"create"},
        ("", "events"): {"create"},
        ("", "services"): {"create", "patch"},
        ("apps", "deployments"): {"create", "patch"},
    }
    (crb,) = by_kind(docs, "ClusterRoleBinding")
    assert crb["subjects"] == [{"kind": "ServiceAccount", "name": "rel-envpool-operator",
                                "namespace": "envpool-system"}]


def test_operator_grants_cover_the_pool_server_role(helm: str) -> None:
    """RBAC escalation check: the operator may only create a Role whose rules it holds."""
    from envpool_operator import access, builders
    from remote_env import spec

    role = access.build_role(spec.parse_spec({"env": {"id": "CartPole-v1"}, "replicas": 4},
                                             name="p", namespace="ns"))
    docs = render(helm)
    assert isinstance(docs, list)
    held = {(g, r, v) for rule in _rules(by_kind(docs, "ClusterRole")[0])
            for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]}
    for rule in role["rules"]:
        for g in rule["apiGroups"]:
            for r in rule["resources"]:
                for v in rule["verbs"]:
                    assert (g, r, v) in held, f"operator lacks {v} {g}/{r} it grants pool servers"
    children = {c["kind"] for c in builders.build_children(
        spec.parse_spec({"env": {"id": "CartPole-v1"}, "replicas": 4}, name="p", namespace="ns"),
        __import__("envpool_operator.settings", fromlist=["Settings"]).Settings())}
    plural = {"ServiceAccount": ("", "serviceaccounts"), "Role": ("rbac.authorization.k8s.io", "roles"),
              "RoleBinding": ("rbac.authorization.k8s.io", "rolebindings"),
              "ConfigMap": ("", "configmaps"), "RayCluster": ("ray.io", "rayclusters"),
              "NetworkPolicy": ("networking.k8s.io", "networkpolicies")}
    for kind in children:
        g, r = plural[kind]
        assert {(g, r, "create"), (g, r, "patch")} <= held, f"server-side apply of {kind}"


def test_admission_policy_covers_every_write_of_the_operator_and_only_it(helm: str) -> None:
    """What RBAC grants by kind, the policy narrows to the operator's own children."""
    from envpool_operator import builders, settings
    from remote_env import spec

    docs = render(helm)
    assert isinstance(docs, list)
    (vap,) = by_kind(docs, "ValidatingAdmissionPolicy")
    (binding,) = by_kind(docs, "ValidatingAdmissionPolicyBinding")
    assert binding["spec"]["policyName"] == vap["metadata"]["name"]
    assert binding["spec"]["validationActions"] == ["Deny"]
    assert vap["spec"]["failurePolicy"] == "Fail"
    (cond,) = vap["spec"]["matchConditions"]
    assert cond["expression"] == (
        "request.userInfo.username == 'system:serviceaccount:envpool-system:rel-envpool-operator'")
    covered = {(g, r) for rule in vap["spec"]["matchConstraints"]["resourceRules"]
               for g in rule["apiGroups"] for r in rule["resources"]}
    (cr,) = by_kind(docs, "ClusterRole")
    writable = {(g, r) for rule in _rules(cr) if {"create", "patch"} & set(rule["verbs"])
                for g in rule["apiGroups"] for r in rule["resources"]}
    # every kind it may write, except its own EnvPools (status, kopf annotations) and Events
    assert covered == writable - {("envpool.dev", "envpools"), ("envpool.dev", "envpools/status"),
                                  ("envpool.dev", "envpools/scale"), ("", "events")}
    pool = spec.parse_spec({"env": {"id": "CartPole-v1"}, "replicas": 4}, name="p", namespace="n")
    for child in builders.build_children(pool, settings.Settings()):
        # the policy's label rule holds for what the builders make
        assert child["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "envpool-operator"
    assert all(v["reason"] == "Forbidden" for v in vap["spec"]["validations"])  # a 403, not 422
    docs = render(helm, "rbac.admissionPolicy=false")
    assert isinstance(docs, list)
    assert not by_kind(docs, "ValidatingAdmissionPolicy")


def test_watch_namespaces_use_roles(helm: str) -> None:
    docs = render(helm, "operator.watchNamespaces={team-a,team-b}")
    assert isinstance(docs, list)
    (cr,) = by_kind(docs, "ClusterRole")
    assert [r["resources"] for r in _rules(cr)] == [["customresourcedefinitions"]]
    roles = by_kind(docs, "Role")
    assert sorted(r["metadata"]["namespace"] for r in roles) == ["team-a", "team-b"]
    bindings = by_kind(docs, "RoleBinding")
    assert sorted(b["metadata"]["namespace"] for b in bindings) == ["team-a", "team-b"]
    for b in bindings:
        assert b["subjects"][0]["namespace"] == "envpool-system"
    args = by_kind(docs, "Deployment")[0]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--namespace=team-a" in args and "--namespace=team-b" in args
    assert "--all-namespaces" not in args


def test_names_cut_at_63_and_two_releases_do_not_collide(helm: str) -> None:
    long = "r" * 53
    docs = render(helm, release=long)
    assert isinstance(docs, list)
    names = [d["metadata"]["name"] for d in docs]
    assert all(len(n) <= 63 and not n.endswith("-") for n in names), names
    assert len(set((d["kind"], n) for d, n in zip(docs, names, strict=True))) == len(docs)
    a, b = render(helm, release="one"), render(helm, release="two")
    assert isinstance(a, list) and isinstance(b, list)
    assert not {(d["kind"], d["metadata"]["name"]) for d in a} & {(d["kind"], d["metadata"]["name"]) for d in b}
    # release name containing the chart name is not doubled
    docs = render(helm, release="envpool-operator")
    assert isinstance(docs, list)
    assert by_kind(docs, "Deployment")[0]["metadata"]["name"] == "envpool-operator"


def test_monitoring_objects_render_when_enabled(helm: str) -> None:
    docs = render(helm)
    assert isinstance(docs, list)
    assert not {"ServiceMonitor", "PodMonitor", "PrometheusRule"} & {d["kind"] for d in docs}
    docs = render(helm, "metrics.serviceMonitor.enabled=true", "metrics.podMonitor.enabled=true",
                  "metrics.prometheusRule.enabled=true", "metrics.serviceMonitor.labels.release=kps")
    assert isinstance(docs, list)
    (sm,) = by_kind(docs, "ServiceMonitor")
    assert sm["metadata"]["labels"]["release"] == "kps"
    assert sm["spec"]["jobLabel"] == "app.kubernetes.io/name"  # -> job="envpool-operator"
    assert sm["spec"]["endpoints"][0]["port"] == "metrics"
    svc = by_kind(docs, "Service")[0]
    assert svc["metadata"]["labels"]["app.kubernetes.io/name"] == "envpool-operator"
    assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    (pm,) = by_kind(docs, "PodMonitor")
    assert pm["spec"]["namespaceSelector"] == {"any": True}
    ep = pm["spec"]["podMetricsEndpoints"][0]
    assert ep["port"] == "metrics" and ep["honorLabels"] is True
    (pr,) = by_kind(docs, "PrometheusRule")
    alerts = yaml.safe_load((CHART / "files" / "envpool-alerts.yaml").read_text())
    assert pr["spec"]["groups"] == alerts["groups"]


def test_pod_monitor_matches_the_operators_head_pod(helm: str) -> None:
    from envpool_operator import builders, settings
    from remote_env import spec

    pool = spec.parse_spec({"env": {"id": "CartPole-v1"}, "replicas": 4}, name="p", namespace="ns")
    head = builders.build_ray_cluster(pool, settings.Settings())["spec"]["headGroupSpec"]["template"]
    docs = render(helm, "metrics.podMonitor.enabled=true")
    assert isinstance(docs, list)
    (pm,) = by_kind(docs, "PodMonitor")
    assert pm["spec"]["selector"]["matchLabels"].items() <= head["metadata"]["labels"].items()
    ep = pm["spec"]["podMetricsEndpoints"][0]
    keep = next(r for r in ep["relabelings"] if r.get("action") == "keep")
    (container,) = [c for c in head["spec"]["containers"] if c["name"] == keep["regex"]]
    assert ep["port"] in {p["name"] for p in container["ports"]}


def test_dashboard_configmap(helm: str) -> None:
    docs = render(helm, "dashboard.namespace=monitoring", "dashboard.annotations.grafana_folder=EnvPool")
    assert isinstance(docs, list)
    (cm,) = by_kind(docs, "ConfigMap")
    assert cm["metadata"]["namespace"] == "monitoring"
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert cm["metadata"]["annotations"] == {"grafana_folder": "EnvPool"}
    assert json.loads(cm["data"]["envpool.json"]) == gen.build_dashboard()
    docs = render(helm, "dashboard.enabled=false", "tests.enabled=false")
    assert isinstance(docs, list)
    assert not by_kind(docs, "ConfigMap") and not by_kind(docs, "Job")


# --------------------------------------------------------------------------- alerts and metric names

ALERTS = CHART / "files" / "envpool-alerts.yaml"
ALERT_TESTS = REPO / "helm" / "tests" / "envpool-alerts.test.yaml"


@pytest.fixture(scope="module")
def promtool() -> str:
    found = shutil.which("promtool") or "/usr/bin/promtool"
    if not Path(found).exists():
        pytest.fail("promtool not found: apt-get install -y prometheus", pytrace=False)
    return found


def _alert_rules() -> list[dict[str, Any]]:
    groups = yaml.safe_load(ALERTS.read_text())["groups"]
    return [r for g in groups for r in g["rules"] if "alert" in r]


def test_promtool_check_rules(promtool: str) -> None:
    proc = subprocess.run([promtool, "check", "rules", str(ALERTS)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"SUCCESS: {len(_alert_rules())} rules found" in proc.stdout


def test_promtool_test_rules(promtool: str) -> None:
    proc = subprocess.run([promtool, "test", "rules", str(ALERT_TESTS)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout


def test_every_alert_fires_in_a_test_and_is_quiet_in_another() -> None:
    tests = yaml.safe_load(ALERT_TESTS.read_text())["tests"]
    cases = [c for t in tests for c in t["alert_rule_test"]]
    names = {r["alert"] for r in _alert_rules()}
    assert names == {"EnvPoolActorRestartStorm", "EnvPoolEnvFailureRateHigh", "EnvPoolEnvsFailed",
                     "EnvPoolDegraded", "EnvPoolBufferEmpty", "EnvPoolOperatorDown",
                     "EnvPoolOperatorReconcileErrors"}
    for name in names:
        assert any(c["alertname"] == name and c["exp_alerts"] for c in cases), f"{name} never fires"
        assert any(c["alertname"] == name and not c["exp_alerts"] for c in cases), f"{name} never quiet"
    for rule in _alert_rules():
        assert rule["labels"]["severity"] in {"warning", "critical"}, rule["alert"]
        assert rule.get("for"), rule["alert"]
        assert {"summary", "description"} <= set(rule["annotations"]), rule["alert"]


@pytest.mark.parametrize("alert", [r["alert"] for r in _alert_rules()])
def test_alert_tests_fail_without_the_alert(promtool: str, tmp_path: Path, alert: str) -> None:
    """The promtool tests depend on each rule: neutralise one and its test must fail."""
    doc = yaml.safe_load(ALERTS.read_text())
    for group in doc["groups"]:
        for rule in group["rules"]:
            if rule.get("alert") == alert:
                rule["expr"] = "vector(1) > 2"
    rules = tmp_path / "rules.yaml"
    rules.write_text(yaml.safe_dump(doc))
    tests = yaml.safe_load(ALERT_TESTS.read_text())
    tests["rule_files"] = [str(rules)]
    test_file = tmp_path / "test.yaml"
    test_file.write_text(yaml.safe_dump(tests))
    proc = subprocess.run([promtool, "test", "rules", str(test_file)], capture_output=True, text=True)
    assert proc.returncode != 0, proc.stdout
    assert f"alertname: {alert}," in proc.stdout + proc.stderr


def _exported_sample_names() -> set[str]:
    """Sample names the pool metrics and the operator metrics really expose."""
    from prometheus_client import CollectorRegistry

    from envpool_operator import metrics as operator_metrics
    from remote_env import metrics as pool_metrics
    from remote_env.pool import http_server

    names: set[str] = set()
    reg = CollectorRegistry()
    pm = pool_metrics.PoolMetrics(reg, pool="p", namespace="ns")
    pm.track_states(lambda: {"running": 1})
    pm.observe_poll(1, 0.001)
    # the pool server's own gauges (leased, free, desired)
    http_server.pool_gauges(reg, 2).add(
        ("ns", "p"), lambda: {"desired": 1, "leased": 0, "free": 1, "leases": 0})
    om = operator_metrics.OperatorMetrics(op_reg := CollectorRegistry())
    om.track_pools(lambda: [("ns", "p", "Ready")])
    om.track_heads(lambda: [("ns", "p", True, "HeadReady")])
    for registry in (reg, op_reg):
        for family in registry.collect():
            names |= {s.name for s in family.samples}
    return names


_METRIC = re.compile(r"\b(envpool_[a-z_]+)\b")


def test_dashboard_and_alerts_use_only_exported_metrics() -> None:
    exported = _exported_sample_names()
    used: dict[str, str] = {}
    for title, expr in gen.panel_queries(gen.build_dashboard()):
        used |= {m: f"panel {title!r}" for m in _METRIC.findall(expr)}
    for rule in _alert_rules():
        used |= {m: f"alert {rule['alert']}" for m in _METRIC.findall(rule["expr"])}
    missing = {m: where for m, where in used.items() if m not in exported}
    assert not missing, f"queried but exported by nobody: {missing}"
    # and the DESIGN.md names are all on the dashboard
    for name in ("envpool_polls_total", "envpool_poll_batch_size_bucket", "envpool_poll_wait_seconds_bucket",
                 "envpool_env_steps_total", "envpool_env_failures_total", "envpool_actor_restarts_total",
                 "envpool_envs", "envpool_operator_reconciles_total",
                 "envpool_operator_reconcile_duration_seconds_bucket",
                 # the head's outages (issue 31)
                 "envpool_pool_head_available"):
        assert name in used, f"{name} has no panel"


# --------------------------------------------------------------------------- image


def test_dockerfile_is_the_one_image() -> None:
    text = (REPO / "Dockerfile").read_text()
    base = re.search(r"^ARG RAY_IMAGE=rayproject/ray:(\d+\.\d+\.\d+)-py3(\d+)$", text, re.M)
    assert base, "Dockerfile: ARG RAY_IMAGE=rayproject/ray:<version>-py3<minor>"
    ray_version = tuple(int(x) for x in base.group(1).split("."))
    req = re.search(r'^\s*"(ray\[default\]>=([\d.]+),<([\d.]+))"', (REPO / "pyproject.toml").read_text(), re.M)
    assert req, "pyproject.toml: ray[default]>=X,<Y"
    ray_req, low, high = req.groups()
    assert tuple(int(x) for x in low.split(".")) <= ray_version < tuple(int(x) for x in high.split(".")), \
        f"base image Ray {base.group(1)} outside {ray_req}"
    # every package directory is copied in, and the image runs as the chart's user
    for folder in ("remote_env", "operator"):
        assert re.search(rf"^COPY .*\b{folder}\b", text, re.M), folder
    values = yaml.safe_load(_values_text())
    user = f"{values['podSecurityContext']['runAsUser']}:{values['podSecurityContext']['runAsGroup']}"
    assert re.search(rf"^USER {user}$", text, re.M), f"USER {user}"
    assert not re.search(r"^ENTRYPOINT", text, re.M)  # KubeRay and the chart set the commands


def test_the_lease_token_secret_is_covered_by_rbac_and_the_policy(helm: str) -> None:
    """The one Secret the operator writes: RBAC lets it create Secrets (and nothing
    else on them), the admission policy only its <pool>-lease-token, owned and labelled."""
    from envpool_operator import access
    from remote_env import spec

    docs = render(helm)
    assert isinstance(docs, list)
    held = {(g, r, v) for rule in _rules(by_kind(docs, "ClusterRole")[0])
            for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]}
    assert {v for g, r, v in held if r == "secrets"} == {"create"}
    (vap,) = by_kind(docs, "ValidatingAdmissionPolicy")
    covered = {(g, r) for rule in vap["spec"]["matchConstraints"]["resourceRules"]
               for g in rule["apiGroups"] for r in rule["resources"]}
    assert ("", "secrets") in covered
    suffixes = next(v["expression"] for v in vap["spec"]["variables"] if v["name"] == "suffixes")
    assert "'secrets': ['-redis', '-lease-token']" in suffixes
    secret = access.build_lease_token_secret(
        spec.parse_spec({"env": {"id": "CartPole-v1"}, "replicas": 4}, name="p", namespace="n"), "t")
    assert secret["metadata"]["name"] == "p" + "-lease-token"
    assert secret["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "envpool-operator"
