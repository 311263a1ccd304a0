"""spec.autoscaling in the one spec model, and the CRD's CEL rules that say the same."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from remote_env import spec

CRD = Path(__file__).resolve().parents[2] / "manifests" / "crd" / "envpool.dev_envpools.yaml"


def _spec(**auto: Any) -> dict[str, Any]:
    return {"env": {"id": "CartPole-v1"}, "replicas": 8, "autoscaling": auto}


def _errors(body: dict[str, Any]) -> list[str]:
    with pytest.raises(spec.SpecError) as exc:
        spec.parse_spec(body, name="auto")
    return exc.value.errors


def test_defaults_and_round_trip() -> None:
    pool = spec.parse_spec(_spec(maxReplicas=64, bufferEnvs=8), name="auto")
    assert pool.autoscaling == spec.Autoscaling(min_replicas=1, max_replicas=64, buffer_envs=8,
                                                scale_down_delay_seconds=300)
    # the default actor size follows the floor (min 1 -> 1), not the moving replicas
    assert pool.envs_per_actor == 1
    again = spec.parse_spec(pool.to_manifest(), name="auto")
    assert again == pool
    assert "autoscaling" not in spec.parse_spec(
        {"env": {"id": "CartPole-v1"}, "replicas": 8}, name="fixed").to_manifest()


def test_percent_form() -> None:
    pool = spec.parse_spec(_spec(minReplicas=16, maxReplicas=64, bufferPercent=25,
                                 scaleDownDelaySeconds=0), name="auto")
    assert pool.autoscaling is not None
    assert (pool.autoscaling.buffer_percent, pool.autoscaling.buffer_envs) == (25, None)
    assert pool.envs_per_actor == 8


@pytest.mark.parametrize(("auto", "where", "says"), [
    ({"maxReplicas": 8, "bufferEnvs": 1, "bufferPercent": 10}, "spec.autoscaling",
     spec.fields.BUFFER_FORMS_MESSAGE + ", got both"),
    ({"maxReplicas": 8}, "spec.autoscaling", spec.fields.BUFFER_FORMS_MESSAGE + ", got neither"),
    ({"minReplicas": 9, "maxReplicas": 8, "bufferEnvs": 1}, "spec.autoscaling.minReplicas",
     spec.fields.MIN_MAX_MESSAGE + ", got 9 > 8"),
    ({"bufferEnvs": 1}, "spec.autoscaling.maxReplicas", "required"),
    ({"maxReplicas": 8, "bufferPercent": 100}, "spec.autoscaling.bufferPercent", "[1, 99]"),
    ({"maxReplicas": 8, "bufferEnvs": -1}, "spec.autoscaling.bufferEnvs", "[0, 100000]"),
    ({"maxReplicas": 8, "bufferEnvs": 1, "scaleDownDelaySeconds": -1},
     "spec.autoscaling.scaleDownDelaySeconds", "[0, 86400]"),
    ({"maxReplicas": 8, "bufferEnvs": 1, "cooldown": 3}, "spec.autoscaling.cooldown",
     "unknown field"),
])
def test_bad_autoscaling_is_refused_with_what_to_fix(auto: dict[str, Any], where: str,
                                                     says: str) -> None:
    errors = _errors(_spec(**auto))
    assert any(e.startswith(f"{where}: ") and says in e for e in errors), errors


def test_min_below_one_actor_is_refused() -> None:
    errors = _errors({**_spec(minReplicas=2, maxReplicas=16, bufferEnvs=2), "envsPerActor": 4})
    assert errors == [
        f"spec.autoscaling.minReplicas: {spec.fields.MIN_ACTOR_MESSAGE} (envsPerActor=4), got 2"]


def test_max_needing_more_workers_than_the_operator_allows() -> None:
    body = _spec(maxReplicas=1000, bufferEnvs=1)
    with pytest.raises(spec.SpecError, match=r"spec.autoscaling.maxReplicas: needs 16 worker"):
        spec.parse_spec(body, name="auto", limits=spec.Limits(max_workers=10))


def test_the_crd_says_the_same_as_the_model() -> None:
    (version,) = yaml.safe_load(CRD.read_text())["spec"]["versions"]
    schema = version["schema"]["openAPIV3Schema"]["properties"]["spec"]
    auto_rules = {r["message"]: r["rule"] for r in
                  schema["properties"]["autoscaling"]["x-kubernetes-validations"]}
    assert auto_rules[spec.fields.BUFFER_FORMS_MESSAGE] == (
        "has(self.bufferEnvs) != has(self.bufferPercent)")
    assert auto_rules[spec.fields.MIN_MAX_MESSAGE] == "self.minReplicas <= self.maxReplicas"
    spec_rules = {r["message"]: r["rule"] for r in schema["x-kubernetes-validations"]}
    assert "self.envsPerActor <= self.autoscaling.minReplicas" in spec_rules[
        spec.fields.MIN_ACTOR_MESSAGE]
    assert schema["properties"]["autoscaling"]["required"] == ["maxReplicas"]
    cols = {c["name"]: c["jsonPath"] for c in version["additionalPrinterColumns"]}
    assert (cols["Leased"], cols["Free"], cols["Desired"]) == (
        ".status.leasedEnvs", ".status.freeEnvs", ".spec.replicas")
