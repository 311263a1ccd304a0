"""The CRD (on the real API server) and remote_env.spec refuse the same EnvPools.

Every bad input the suite knows goes through both: a server-side dry-run apply
with strict field validation (what ``kubectl apply`` does) and the model's
``parse_spec``. They must agree, except for what only the model can see (the
operator reports those as ``SpecValid=False``): listed in :data:`MODEL_ONLY`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from remote_env import spec

pytestmark = [pytest.mark.e2e]

CRD = Path(__file__).resolve().parents[2] / "manifests" / "crd" / "envpool.dev_envpools.yaml"


def _spec(**over: Any) -> dict[str, Any]:
    return {"env": {"id": "CartPole-v1"}, "replicas": 16, **over}


def _res(**res: Any) -> dict[str, Any]:
    return _spec(ray={"head": {"resources": res}})


#: (case id, metadata.name, spec); the good ones must pass both.
GOOD: list[tuple[str, str, dict[str, Any]]] = [
    ("minimal", "good", _spec()),
    ("env-id-module", "good", _spec(env={"id": "ale_py:ALE/Pong-v5"})),
    ("name-40", "a" * 40, _spec()),
    ("entrypoint", "good", {"env": {"entrypoint": "remote_env.examples:rps_parallel_env",
                                    "multiAgent": True}, "replicas": 4}),
    ("int-quantity", "good", _spec(ray={"worker": {"resources": {"requests": {"cpu": 2}}}})),
    ("step-timeout-int", "good", _spec(faultTolerance={"stepTimeoutSeconds": 10})),
    ("tolerations", "good", _spec(ray={"worker": {"tolerations": [
        {"key": "k", "operator": "Exists", "effect": "NoSchedule"}]}})),
    ("auth-disabled-old-ray", "good", _spec(ray={"authMode": "disabled", "version": "2.40.0"})),
    ("auth-token", "good", _spec(ray={"authMode": "token"})),
    ("metrics-port-between-ray-ranges", "good", _spec(metrics={"port": 20000})),
    ("metrics-port-above-ray-client-servers", "good", _spec(metrics={"port": 24000})),
    ("env-from-secrets", "good", _spec(ray={"envFromSecrets": ["sim-creds", "a.b-c"]})),
    ("autoscaling-envs", "good", _spec(autoscaling={"minReplicas": 8, "maxReplicas": 64,
                                                    "bufferEnvs": 8})),
    ("autoscaling-percent", "good", _spec(autoscaling={
        "maxReplicas": 64, "bufferPercent": 20, "scaleDownDelaySeconds": 0}, envsPerActor=1)),
    ("max-unavailable-int", "good", _spec(updateStrategy={"maxUnavailable": 1})),
    ("max-unavailable-percent", "good", _spec(updateStrategy={"maxUnavailable": "25%"})),
    ("max-unavailable-100", "good", _spec(updateStrategy={"maxUnavailable": "100%"})),
    ("update-strategy-empty", "good", _spec(updateStrategy={})),
    ("replace-after-grace", "good", _spec(updateStrategy={
        "leasedActors": "ReplaceAfterGrace", "leasedGraceSeconds": 0})),
]

#: Everything test_operator_spec.py, test_pool_spec.py and test_operator_crd.py refuse.
BAD: list[tuple[str, str, dict[str, Any]]] = [
    ("env-neither", "bad", {"env": {}, "replicas": 1}),
    ("env-both", "bad", {"env": {"id": "CartPole-v1", "entrypoint": "a:b"}, "replicas": 1}),
    ("entrypoint-no-colon", "bad", _spec(env={"entrypoint": "no_colon"})),
    ("entrypoint-two-colons", "bad", _spec(env={"entrypoint": "a.b:c:d"})),
    ("entrypoint-digit", "bad", _spec(env={"entrypoint": "1bad:fn"})),
    ("env-id-space", "bad", _spec(env={"id": "has space"})),
    ("env-id-empty", "bad", _spec(env={"id": ""})),
    ("env-id-two-colons", "bad", _spec(env={"id": "a:b:CartPole-v1"})),
    ("env-id-trailing-colon", "bad", _spec(env={"id": "ale_py:"})),
    ("env-unknown-field", "bad", _spec(env={"id": "CartPole-v1", "kwarg": {}})),
    ("replicas-0", "bad", _spec(replicas=0)),
    ("replicas-negative", "bad", _spec(replicas=-5)),
    ("replicas-too-many", "bad", _spec(replicas=100_001)),
    ("replicas-string", "bad", _spec(replicas="16")),
    ("replicas-bool", "bad", _spec(replicas=True)),
    ("replicas-missing", "bad", {"env": {"id": "CartPole-v1"}}),
    ("envs-per-actor-gt-replicas", "bad", _spec(replicas=4, envsPerActor=8)),
    ("envs-per-actor-gt-per-worker", "bad", _spec(replicas=200, envsPerActor=100)),
    ("envs-per-actor-2000", "bad", _spec(replicas=4000, envsPerActor=2000)),
    ("batch-wait-negative", "bad", _spec(batchWaitMs=-1)),
    ("threads-0", "bad", _spec(threadsPerActor=0)),
    ("threads-2000", "bad", _spec(threadsPerActor=2000)),
    ("autoreset-unknown", "bad", _spec(autoresetMode="Sometimes")),
    ("metrics-port-ray", "bad", _spec(metrics={"port": 6379})),
    ("metrics-port-ray-metrics", "bad", _spec(metrics={"port": 8080})),
    ("metrics-port-low", "bad", _spec(metrics={"port": 80})),
    ("metrics-port-lease-api", "bad", _spec(metrics={"port": 8267})),
    ("metrics-port-ray-workers-low", "bad", _spec(metrics={"port": 10002})),
    ("metrics-port-ray-workers-high", "bad", _spec(metrics={"port": 19999})),
    ("metrics-port-ray-client-servers", "bad", _spec(metrics={"port": 23500})),
    ("ray-version", "bad", _spec(ray={"version": "latest"})),
    ("ray-image-space", "bad", _spec(ray={"image": "bad image"})),
    ("quantity-words", "bad", _res(requests={"cpu": "lots"})),
    ("quantity-negative", "bad", _res(requests={"memory": "-1Gi"})),
    ("quantity-zero", "bad", _res(requests={"cpu": "0"})),
    ("memory-too-small", "bad", _res(limits={"memory": "100Mi"})),
    ("request-over-limit", "bad", _spec(ray={"worker": {"resources": {
        "requests": {"cpu": "2"}, "limits": {"cpu": "1"}}}})),
    ("toleration-exists-value", "bad", _spec(ray={"worker": {"tolerations": [
        {"operator": "Exists", "value": "x"}]}})),
    ("toleration-exists-no-key", "bad", _spec(ray={"worker": {"tolerations": [
        {"operator": "Exists"}]}})),
    ("toleration-exists-empty-key", "bad", _spec(ray={"worker": {"tolerations": [
        {"key": "", "operator": "Exists", "effect": "NoExecute"}]}})),
    ("auth-mode-unknown", "bad", _spec(ray={"authMode": "none"})),
    ("env-from-secret-bad-name", "bad", _spec(ray={"envFromSecrets": ["Bad_Name"]})),
    ("env-from-secrets-not-list", "bad", _spec(ray={"envFromSecrets": "creds"})),
    ("auth-token-old-ray", "bad", _spec(ray={"version": "2.51.0"})),
    ("toleration-operator", "bad", _spec(ray={"worker": {"tolerations": [{"operator": "In"}]}})),
    ("node-selector-int", "bad", _spec(ray={"worker": {"nodeSelector": {"zone": 3}}})),
    ("unknown-field", "bad", _spec(bogus=1)),
    ("ft-unknown-field", "bad", _spec(faultTolerance={"retries": 3})),
    ("max-restarts-negative", "bad", _spec(faultTolerance={"maxRestarts": -1})),
    ("suspend-string", "bad", _spec(suspend="yes")),
    ("autoscaling-min-over-max", "bad", _spec(autoscaling={
        "minReplicas": 65, "maxReplicas": 64, "bufferEnvs": 8})),
    ("autoscaling-both-buffers", "bad", _spec(autoscaling={
        "maxReplicas": 64, "bufferEnvs": 8, "bufferPercent": 20})),
    ("autoscaling-no-buffer", "bad", _spec(autoscaling={"maxReplicas": 64})),
    ("autoscaling-no-max", "bad", _spec(autoscaling={"bufferEnvs": 8})),
    ("autoscaling-percent-100", "bad", _spec(autoscaling={"maxReplicas": 64,
                                                          "bufferPercent": 100})),
    ("autoscaling-buffer-negative", "bad", _spec(autoscaling={"maxReplicas": 64,
                                                              "bufferEnvs": -1})),
    ("autoscaling-min-below-actor", "bad", _spec(envsPerActor=8, autoscaling={
        "minReplicas": 4, "maxReplicas": 64, "bufferEnvs": 8})),
    ("autoscaling-unknown-field", "bad", _spec(autoscaling={
        "maxReplicas": 64, "bufferEnvs": 8, "cooldown": 30})),
    ("autoscaling-delay-negative", "bad", _spec(autoscaling={
        "maxReplicas": 64, "bufferEnvs": 8, "scaleDownDelaySeconds": -1})),
    ("max-unavailable-0", "bad", _spec(updateStrategy={"maxUnavailable": 0})),
    ("max-unavailable-negative", "bad", _spec(updateStrategy={"maxUnavailable": -1})),
    ("max-unavailable-too-many", "bad", _spec(updateStrategy={"maxUnavailable": 100_001})),
    ("max-unavailable-0-percent", "bad", _spec(updateStrategy={"maxUnavailable": "0%"})),
    ("max-unavailable-over-100", "bad", _spec(updateStrategy={"maxUnavailable": "150%"})),
    ("max-unavailable-negative-percent", "bad", _spec(updateStrategy={"maxUnavailable": "-5%"})),
    ("max-unavailable-digits-string", "bad", _spec(updateStrategy={"maxUnavailable": "5"})),
    ("max-unavailable-words", "bad", _spec(updateStrategy={"maxUnavailable": "abc"})),
    ("max-unavailable-float", "bad", _spec(updateStrategy={"maxUnavailable": 2.5})),
    ("update-strategy-unknown-field", "bad", _spec(updateStrategy={"maxSurge": 1})),
    ("leased-actors-unknown", "bad", _spec(updateStrategy={"leasedActors": "Now"})),
    ("leased-grace-negative", "bad", _spec(updateStrategy={"leasedGraceSeconds": -1})),
    ("leased-grace-string", "bad", _spec(updateStrategy={"leasedGraceSeconds": "60"})),
    ("name-41", "a" * 41, _spec()),
    ("name-upper", "Upper", _spec()),
    ("name-digit", "1starts-with-digit", _spec()),
    ("name-dash-end", "ends-", _spec()),
    ("name-dot", "has.dot", _spec()),
]

#: What the CRD cannot express and only the model refuses (SpecValid=False): quantity
#: semantics (zero, Ray's memory floor, request above limit), Ray versions compared.
MODEL_ONLY = {"quantity-zero", "memory-too-small", "request-over-limit", "auth-token-old-ray"}


def _model_refuses(name: str, body: dict[str, Any]) -> str | None:
    try:
        spec.parse_spec(body, name=name)
    except spec.SpecError as exc:
        return str(exc)
    return None


@pytest.fixture(scope="module")
def crd_installed(kube_cluster: Any) -> Any:
    kube_cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CRD))
    kube_cluster.kubectl("wait", "--for=condition=Established", "crd/envpools.envpool.dev",
                         "--timeout=60s")
    return kube_cluster


def _crd_refuses(kube: Any, namespace: str, name: str, body: dict[str, Any]) -> str | None:
    doc = {"apiVersion": spec.API_VERSION, "kind": spec.KIND,
           "metadata": {"name": name, "namespace": namespace}, "spec": body}
    # kubectl apply validates strictly (unknown fields are errors, not pruned)
    proc = kube.kubectl("apply", "--server-side", "--dry-run=server", "--validate=strict",
                        "--field-manager=agreement", "-f", "-", input=json.dumps(doc),
                        check=False)
    return proc.stderr.strip() if proc.returncode != 0 else None


@pytest.mark.parametrize(("case", "name", "body"), GOOD + BAD, ids=[c[0] for c in GOOD + BAD])
def test_crd_and_model_refuse_the_same(crd_installed: Any, case: str, name: str,
                                       body: dict[str, Any]) -> None:
    by_model = _model_refuses(name, body)
    # a dry run creates nothing, so the default namespace serves every case
    by_crd = _crd_refuses(crd_installed, "default", name, body)
    if any(case == c[0] for c in GOOD):
        assert by_model is None and by_crd is None, (by_model, by_crd)
    elif case in MODEL_ONLY:
        assert by_model is not None and by_crd is None, (by_model, by_crd)
    else:
        assert by_model is not None, f"the CRD refuses {case} but the model accepts it: {by_crd}"
        assert by_crd is not None, f"the model refuses {case} but the CRD accepts it: {by_model}"


@pytest.mark.parametrize(("case", "message"), [
    ("autoscaling-min-over-max", spec.fields.MIN_MAX_MESSAGE),
    ("autoscaling-both-buffers", spec.fields.BUFFER_FORMS_MESSAGE),
    ("autoscaling-no-buffer", spec.fields.BUFFER_FORMS_MESSAGE),
    ("autoscaling-min-below-actor", spec.fields.MIN_ACTOR_MESSAGE),
])
def test_autoscaling_refusals_say_the_same_thing(crd_installed: Any, case: str,
                                                 message: str) -> None:
    """kubectl apply and the model (envpool run -f, the operator) word it alike."""
    (name, body), = [(c[1], c[2]) for c in BAD if c[0] == case]
    by_crd = _crd_refuses(crd_installed, "default", name, body)
    by_model = _model_refuses(name, body)
    assert by_crd is not None and message in by_crd, by_crd
    assert by_model is not None and message in by_model, by_model
