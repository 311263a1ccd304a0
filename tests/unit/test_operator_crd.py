"""The CRD file and the examples: names that are contracts; the schema agrees with
remote_env.spec field by field (types, defaults, ranges, enums, lengths)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from remote_env import spec

ROOT = Path(__file__).resolve().parents[2]
CRD_PATH = ROOT / "manifests" / "crd" / "envpool.dev_envpools.yaml"
EXAMPLES = sorted((ROOT / "manifests" / "examples").glob("*.yaml"))


@pytest.fixture(scope="module")
def crd() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(CRD_PATH.read_text())
    return loaded


def _version(crd: dict[str, Any]) -> dict[str, Any]:
    (version,) = crd["spec"]["versions"]
    assert isinstance(version, dict)
    return version


def _spec_schema(crd: dict[str, Any]) -> dict[str, Any]:
    schema: dict[str, Any] = _version(crd)["schema"]["openAPIV3Schema"]["properties"]["spec"]
    return schema


def test_names_are_the_contract(crd: dict[str, Any]) -> None:
    assert crd["metadata"]["name"] == "envpools.envpool.dev"
    names = crd["spec"]["names"]
    assert crd["spec"]["group"] == spec.GROUP
    assert (names["kind"], names["plural"], names["singular"]) == ("EnvPool", "envpools", "envpool")
    assert names["shortNames"] == ["epool"]  # never "ep" (Endpoints)
    assert "all" in names["categories"]
    assert _version(crd)["name"] == spec.VERSION


def test_subresources(crd: dict[str, Any]) -> None:
    sub = _version(crd)["subresources"]
    assert sub["status"] == {}
    assert sub["scale"] == {
        "specReplicasPath": ".spec.replicas",
        "statusReplicasPath": ".status.replicas",
        "labelSelectorPath": ".status.selector",
    }


def test_status_preserves_unknown_fields_for_kopf(crd: dict[str, Any]) -> None:
    st = _version(crd)["schema"]["openAPIV3Schema"]["properties"]["status"]
    assert st["x-kubernetes-preserve-unknown-fields"] is True


def test_printer_columns(crd: dict[str, Any]) -> None:
    cols = {c["name"]: c for c in _version(crd)["additionalPrinterColumns"]}
    assert cols["Phase"]["jsonPath"] == ".status.phase"
    assert cols["Ready"]["jsonPath"] == ".status.readyEnvs"
    assert cols["Desired"]["jsonPath"] == ".spec.replicas"
    assert cols["RayCluster"]["jsonPath"] == ".status.rayCluster"
    assert cols["Age"]["type"] == "date"


def test_phase_enum_matches_status_module(crd: dict[str, Any]) -> None:
    from envpool_operator import status

    st = _version(crd)["schema"]["openAPIV3Schema"]["properties"]["status"]
    assert tuple(st["properties"]["phase"]["enum"]) == status.PHASES


def _defaults(schema: dict[str, Any]) -> Any:
    """What the API server's structural defaulting would produce for an empty object."""
    out: dict[str, Any] = {}
    for key, prop in (schema.get("properties") or {}).items():
        if "default" in prop:
            value = prop["default"]
            if isinstance(value, dict) and prop.get("type") == "object":
                value = {**_defaults(prop), **value}
            out[key] = value
    return out


def test_crd_defaults_agree_with_spec_module(crd: dict[str, Any]) -> None:
    schema = _spec_schema(crd)
    defaulted = {**_defaults(schema), "env": {"id": "CartPole-v1"}, "replicas": 16}
    from_crd = spec.parse_spec(defaulted, name="cp")
    from_code = spec.parse_spec({"env": {"id": "CartPole-v1"}, "replicas": 16}, name="cp")
    assert from_crd == from_code
    assert defaulted["ray"]["worker"]["envsPerWorker"] == spec.DEFAULT_ENVS_PER_WORKER
    assert defaulted["ray"]["version"] == spec.DEFAULT_RAY_VERSION
    assert defaulted["metrics"]["port"] == spec.DEFAULT_METRICS_PORT


def _node(schema: dict[str, Any], path: str) -> dict[str, Any]:
    """The schema node of a ``spec.a.b`` path (``resources``/``toleration``: the shared ones)."""
    shared = {"resources": "spec.ray.head.resources", "toleration": "spec.ray.worker.tolerations"}
    node = schema
    for part in shared.get(path, path).split(".")[1:]:
        node = node["properties"][part]
    return node["items"] if path == "toleration" else node


def test_every_model_field_has_the_crd_type_default_and_bounds(crd: dict[str, Any]) -> None:
    schema = _spec_schema(crd)
    for path, field in spec.fields.FIELDS.items():
        node = _node(schema, path)
        assert node["type"] == field.type, path
        assert node.get("default") == field.default, path
        assert node.get("minimum") == field.minimum, path
        assert node.get("maximum") == field.maximum, path
        assert (tuple(node["enum"]) if "enum" in node else None) == field.enum, path
        assert node.get("minLength") == field.min_length, path
        assert node.get("maxLength") == field.max_length, path


def test_every_crd_object_has_the_model_fields(crd: dict[str, Any]) -> None:
    schema = _spec_schema(crd)
    for path, names in spec.fields.OBJECTS.items():
        assert tuple(_node(schema, path)["properties"]) == names, path


def test_every_crd_bound_is_in_the_model(crd: dict[str, Any]) -> None:
    # the other direction: a default or bound in the CRD that the model lacks
    bounded = ("default", "minimum", "maximum", "enum", "minLength", "maxLength")
    model_paths = set(spec.fields.FIELDS) | {
        f"spec.ray.{group}.tolerations[].{key}"
        for group in ("head", "worker") for key in ("operator", "effect")}
    found: list[str] = []

    def walk(node: dict[str, Any], path: str) -> None:
        if node.get("type") in ("integer", "number", "boolean", "string") and any(
                k in node for k in bounded):
            found.append(path)
        for key, child in (node.get("properties") or {}).items():
            walk(child, f"{path}.{key}")
        if isinstance(node.get("items"), dict):
            walk(node["items"], f"{path}[]")

    walk(_spec_schema(crd), "spec")
    # label values and toleration keys: the model checks them with fields.MAX_* constants
    lengths: dict[str, int] = {}
    schema = _spec_schema(crd)
    for group in ("head", "worker"):  # both pods' placement, checked alike
        group_lengths = {f"spec.ray.{group}.tolerations[].key": spec.fields.MAX_TOLERATION_KEY_LENGTH,
                         f"spec.ray.{group}.tolerations[].value": spec.fields.MAX_LABEL_VALUE_LENGTH}
        lengths.update(group_lengths)
        tol = schema["properties"]["ray"]["properties"][group]["properties"]["tolerations"]
        assert tol["maxItems"] == spec.fields.MAX_TOLERATIONS
        for key, most in group_lengths.items():
            assert tol["items"]["properties"][key.rsplit(".", 1)[1]]["maxLength"] == most
        assert tuple(tol["items"]["properties"]["operator"]["enum"]) == \
            spec.fields.TOLERATION_OPERATORS
        assert tuple(tol["items"]["properties"]["effect"]["enum"]) == spec.fields.TOLERATION_EFFECTS
        sel = schema["properties"]["ray"]["properties"][group]["properties"]["nodeSelector"]
        assert sel["maxProperties"] == spec.fields.MAX_NODE_SELECTOR
        assert sel["additionalProperties"]["maxLength"] == spec.fields.MAX_LABEL_VALUE_LENGTH
    secrets = schema["properties"]["ray"]["properties"]["envFromSecrets"]
    assert secrets["maxItems"] == spec.fields.MAX_ENV_FROM_SECRETS
    lengths["spec.ray.envFromSecrets[]"] = secrets["items"]["maxLength"]
    assert secrets["items"]["maxLength"] == spec.fields.MAX_SECRET_NAME_LENGTH
    assert spec.fields.SECRET_NAME_RE.pattern in secrets["items"]["x-kubernetes-validations"][0][
        "rule"]
    quantities = _node(schema, "resources")["properties"]["requests"]
    assert quantities["maxProperties"] == spec.fields.MAX_QUANTITIES
    assert quantities["additionalProperties"]["maxLength"] == spec.fields.MAX_QUANTITY_LENGTH
    assert set(found) <= model_paths | set(lengths), sorted(set(found) - model_paths)


def test_crd_rules_use_the_model_constants(crd: dict[str, Any]) -> None:
    props = _spec_schema(crd)["properties"]
    assert "envsPerActor" not in _defaults(_spec_schema(crd))  # min(8, replicas) in code
    name = _version(crd)["schema"]["openAPIV3Schema"]["properties"]["metadata"]["properties"][
        "name"]
    rules = [v["rule"] for v in name["x-kubernetes-validations"]]
    assert any(f"<= {spec.MAX_NAME_LENGTH}" in r for r in rules)
    assert any(spec.fields.NAME_RE.pattern in r for r in rules)
    (port_rule,) = props["metrics"]["properties"]["port"]["x-kubernetes-validations"]
    # the head's fixed ports and its port ranges, as the spec check refuses them
    ranges = [f"!(self >= {lo} && self <= {hi})" for lo, hi, _ in spec.fields.HEAD_PORT_RANGES]
    assert port_rule["rule"] == " && ".join(
        [f"!(self in {list(spec.RAY_PORTS)})".replace(",", ", ").replace(",  ", ", "), *ranges])
    free = ", ".join(str(lo) if lo == hi else f"{lo}-{hi}"
                     for lo, hi in spec.fields.free_head_ports())
    assert port_rule["message"].endswith(f"free: {free}")
    id_rule = props["env"]["properties"]["id"]["x-kubernetes-validations"][0]["rule"]
    assert spec.fields.ENV_ID_RE.pattern in id_rule
    ep_rule = props["env"]["properties"]["entrypoint"]["x-kubernetes-validations"][0]["rule"]
    assert ep_rule == f"self.matches('{spec.fields.ENTRYPOINT_RE.pattern}')".replace(
        r"\.", "[.]")
    version_rule = props["ray"]["properties"]["version"]["x-kubernetes-validations"][0]["rule"]
    assert version_rule == f"self.matches('{spec.fields.RAY_VERSION_RE.pattern}')".replace(
        r"\.", "[.]")


def test_every_schema_object_is_structural(crd: dict[str, Any]) -> None:
    # every property has a type (or int-or-string / preserve-unknown)
    def walk(node: dict[str, Any], path: str) -> None:
        ok = ("type" in node or node.get("x-kubernetes-int-or-string")
              or node.get("x-kubernetes-preserve-unknown-fields"))
        assert ok, f"{path} has no type"
        for key, child in (node.get("properties") or {}).items():
            walk(child, f"{path}.{key}")
        if isinstance(node.get("additionalProperties"), dict):
            walk(node["additionalProperties"], f"{path}[*]")
        if isinstance(node.get("items"), dict):
            walk(node["items"], f"{path}[]")

    walk(_version(crd)["schema"]["openAPIV3Schema"], "")


def test_examples_cover_the_advertised_cases() -> None:
    names = {p.stem for p in EXAMPLES}
    assert {"cartpole", "pendulum", "multi-agent", "entrypoint-runtime-env", "suspended"} <= names


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_examples_are_valid_envpools(path: Path) -> None:
    doc = yaml.safe_load(path.read_text())
    assert doc["apiVersion"] == spec.API_VERSION and doc["kind"] == spec.KIND
    pool = spec.parse_spec(doc["spec"], name=doc["metadata"]["name"])
    assert pool.replicas >= 1


def test_example_specifics() -> None:
    def load(stem: str) -> spec.PoolSpec:
        doc = yaml.safe_load((ROOT / "manifests" / "examples" / f"{stem}.yaml").read_text())
        return spec.parse_spec(doc["spec"], name=doc["metadata"]["name"])

    cp = load("cartpole")
    assert (cp.env.id, cp.replicas, cp.envs_per_actor) == ("CartPole-v1", 16, 8)
    assert load("pendulum").env.id == "Pendulum-v1"
    assert load("multi-agent").env.multi_agent is True
    slow = load("entrypoint-runtime-env")
    assert slow.ray.runtime_env["env_vars"] and slow.threads_per_actor == slow.envs_per_actor == 4
    assert load("suspended").suspend is True


def test_update_strategy_schema_agrees_with_the_model(crd: dict[str, Any]) -> None:
    node = _spec_schema(crd)["properties"]["updateStrategy"]
    # no schema default: EnvPools that do not set it stay readable by older operators
    # and pool servers (the model's default applies)
    assert "default" not in node
    mu = node["properties"]["maxUnavailable"]
    assert mu["x-kubernetes-int-or-string"] is True and "type" not in mu
    assert "default" not in mu and f'Default "{spec.fields.DEFAULT_MAX_UNAVAILABLE}"' in \
        mu["description"]
    (rule,) = mu["x-kubernetes-validations"]
    assert rule["message"] == spec.fields.MAX_UNAVAILABLE_MESSAGE
    assert f"self <= {spec.MAX_REPLICAS}" in rule["rule"]
    # the CEL pattern takes the percentages the model takes, and no other
    import re

    pattern = re.search(r"matches\('([^']+)'\)", rule["rule"])
    assert pattern is not None
    for text in ("1%", "25%", "99%", "100%", "0%", "101%", "5", "-5%", "05%"):
        model_ok = True
        try:
            spec.parse_spec({"env": {"id": "CartPole-v1"}, "replicas": 4,
                             "updateStrategy": {"maxUnavailable": text}}, name="cp")
        except spec.SpecError:
            model_ok = False
        assert bool(re.match(pattern.group(1), text)) == model_ok, text


def test_rollout_printer_columns(crd: dict[str, Any]) -> None:
    cols = {c["name"]: c for c in _version(crd)["additionalPrinterColumns"]}
    assert cols["Updated"]["jsonPath"] == ".status.updatedEnvs"
    assert cols["Outdated"]["jsonPath"] == ".status.outdatedEnvs"
    assert cols["Revision"]["jsonPath"] == ".status.revision"
    status_props = _version(crd)["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]
    assert {"revision", "updatedEnvs", "outdatedEnvs"} <= set(status_props)
