"""remote_env.spec as the pool server reads it: EnvPool documents and YAML files.

Includes the contract with the operator: the pool document it writes into the
ConfigMap is what ``envpool serve`` reads back (remote_env may not import the
operator; tests may).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gymnasium as gym
import pytest
import yaml

from envpool_operator import builders, names
from remote_env import entrypoints, spec

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "manifests" / "examples").glob("*.yaml"))


def _doc(**fields: Any) -> dict[str, Any]:
    return {"apiVersion": "envpool.dev/v1alpha1", "kind": "EnvPool",
            "metadata": {"name": "cp", "namespace": "rl"},
            "spec": {"env": {"id": "CartPole-v1"}, "replicas": 4, **fields}}


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_the_operators_config_map_document_is_what_serve_reads(path: Path, tmp_path: Path) -> None:
    doc = yaml.safe_load(path.read_text())
    pool = spec.parse_spec(doc["spec"], name=doc["metadata"]["name"], namespace="team-a")
    cm = builders.build_config_map(pool)
    f = tmp_path / names.CONFIG_KEY
    f.write_text(cm["data"][names.CONFIG_KEY])
    ours = spec.load(f)
    assert (ours.name, ours.namespace, ours.replicas, ours.envs_per_actor) == (
        pool.name, "team-a", pool.replicas, pool.envs_per_actor)


def test_defaults_and_derived_values() -> None:
    pool = spec.parse_manifest(_doc())
    assert pool.namespace == "rl" and pool.ray_namespace == "envpool-cp"
    assert pool.envs_per_actor == 4  # min(8, replicas)
    assert pool.autoreset_mode == "NextStep" and pool.batch_wait_ms == 2
    assert pool.threads_per_actor == 1
    assert pool.fault_tolerance == spec.FaultTolerance(True, 60.0, 100, 1.0)
    assert pool.desired_envs == 4
    assert spec.parse_manifest(_doc(suspend=True)).desired_envs == 0
    no_hang = spec.parse_manifest(_doc(faultTolerance={"stepTimeoutSeconds": 0}))
    assert no_hang.fault_tolerance.step_timeout is None
    # an actor's start (its envs' constructors) has its own, longer deadline
    assert pool.fault_tolerance.start_timeout == 300.0
    no_start_limit = spec.parse_manifest(_doc(faultTolerance={"startTimeoutSeconds": 0}))
    assert no_start_limit.fault_tolerance.start_timeout is None
    assert spec.parse_manifest(_doc(faultTolerance={"startTimeoutSeconds": 5})).to_manifest()[
        "faultTolerance"]["startTimeoutSeconds"] == 5
    bare = spec.parse_manifest({"env": {"id": "CartPole-v1"}, "replicas": 2}, name="bare")
    assert bare.name == "bare" and bare.namespace == "default"


def test_every_problem_is_reported_with_its_field() -> None:
    with pytest.raises(spec.SpecError) as err:
        spec.parse_manifest(_doc(
            env={"id": "CartPole-v1", "entrypoint": "a.b:c"}, replicas=0, envsPerActor=2000,
            autoresetMode="Sometimes", faultTolerance={"maxRestarts": -1, "retries": 3},
            metrics={"port": 6379}, colour="blue", threadsPerActor=2000,
        ))
    text = "\n".join(err.value.errors)
    for expected in (
        "spec.colour: unknown field",
        "spec.env: exactly one of env.id",
        "got both",
        "spec.replicas: must be in [1, 100000], got 0",
        "spec.envsPerActor: must be in [1, 1024], got 2000",
        "spec.threadsPerActor: must be in [1, 1024], got 2000",
        "spec.autoresetMode: expected one of NextStep, SameStep, Disabled, got 'Sometimes'",
        "spec.faultTolerance.maxRestarts: must be in [0, 1000000], got -1",
        "spec.faultTolerance.retries: unknown field",
        "spec.metrics.port: 6379 is taken by the Ray head",
    ):
        assert expected in text, f"{expected!r} missing from:\n{text}"


def test_documents_that_are_not_envpools() -> None:
    with pytest.raises(spec.SpecError, match="kind: expected EnvPool, got 'Deployment'"):
        spec.parse_manifest({**_doc(), "kind": "Deployment"})
    with pytest.raises(spec.SpecError, match=r"metadata\.name: required"):
        spec.parse_manifest({"kind": "EnvPool", "spec": {}})
    with pytest.raises(spec.SpecError, match="a bare spec needs a pool name"):
        spec.parse_manifest({"env": {"id": "CartPole-v1"}, "replicas": 1})
    with pytest.raises(spec.SpecError, match=r"metadata\.name: expected a DNS label"):
        spec.parse_manifest(_doc(), name="Not_A_Label")


def test_load_errors_name_the_file(tmp_path: Path) -> None:
    missing = tmp_path / "missing.yaml"
    with pytest.raises(spec.SpecError, match=rf"^{missing}: cannot read"):
        spec.load(missing)
    bad = tmp_path / "bad.yaml"
    bad.write_text("spec: [unclosed\n")
    with pytest.raises(spec.SpecError, match=rf"^{bad}: invalid YAML"):
        spec.load(bad)
    two = tmp_path / "two.yaml"
    two.write_text(yaml.safe_dump(_doc()) + "---\n" + yaml.safe_dump(_doc()))
    with pytest.raises(spec.SpecError, match="expected one EnvPool document, found 2"):
        spec.load(two)
    wrong = tmp_path / "wrong.yaml"
    wrong.write_text(yaml.safe_dump(_doc(replicas="many")))
    with pytest.raises(spec.SpecError,
                       match=rf"^{wrong}: spec.replicas: expected an integer"):
        spec.load(wrong)


def test_env_factory_builds_ids_and_entrypoints_and_pickles() -> None:
    import pickle

    env = entrypoints.EnvFactory.from_spec(spec.parse_manifest(_doc()).env)()
    assert env.spec is not None and env.spec.id == "CartPole-v1"
    ep = spec.parse_manifest(_doc(env={
        "entrypoint": "remote_env.examples:make_slow_cartpole", "kwargs": {"step_delay_ms": 0}}))
    factory = pickle.loads(pickle.dumps(entrypoints.EnvFactory.from_spec(ep.env)))
    made = factory()
    assert isinstance(made, gym.Wrapper) and made._delay == 0.0
    assert "make_slow_cartpole" in repr(factory)


def test_resolve_entrypoint_errors() -> None:
    with pytest.raises(ValueError, match=r"must look like 'package\.module:callable'"):
        entrypoints.resolve_entrypoint("no_colon")
    with pytest.raises(ValueError, match="cannot import 'no_such_module_xyz'"):
        entrypoints.resolve_entrypoint("no_such_module_xyz:f")
    with pytest.raises(ValueError, match="has no attribute 'nope'"):
        entrypoints.resolve_entrypoint("remote_env.examples:nope")
    with pytest.raises(ValueError, match="is not callable"):
        entrypoints.resolve_entrypoint("remote_env.spec.fields:KIND")
    assert entrypoints.resolve_entrypoint("remote_env.examples:SlowCartPole.step")


def test_host_signature_changes_only_with_what_actors_are_built_from() -> None:
    base = spec.parse_manifest(_doc())
    assert base.host_signature() == spec.parse_manifest(
        _doc(replicas=8, batchWaitMs=10)).host_signature()
    assert base.host_signature() != spec.parse_manifest(
        _doc(env={"id": "Pendulum-v1"})).host_signature()
    assert base.host_signature() != spec.parse_manifest(
        _doc(autoresetMode="SameStep")).host_signature()
    assert base.host_signature() != spec.parse_manifest(
        _doc(threadsPerActor=4)).host_signature()
