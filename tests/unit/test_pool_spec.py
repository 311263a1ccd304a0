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

from envpool_operator import builders, names, settings
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


# ------------------------------------------------------------ updateStrategy (issue 32)
def _with_strategy(max_unavailable: Any) -> spec.PoolSpec:
    return spec.parse_spec({"env": {"id": "CartPole-v1"}, "replicas": 10,
                            "updateStrategy": {"maxUnavailable": max_unavailable}}, name="cp")


def test_update_strategy_defaults_to_a_quarter_rounded_down() -> None:
    pool = spec.parse_spec({"env": {"id": "CartPole-v1"}, "replicas": 10}, name="cp")
    assert pool.update_strategy.max_unavailable == "25%"
    assert pool.update_strategy.max_unavailable_envs(pool.replicas) == 2
    assert "updateStrategy" not in pool.to_manifest()  # older pool servers read it too


@pytest.mark.parametrize(("given", "envs"), [(1, 1), (3, 3), ("1%", 0), ("50%", 5), ("100%", 10)])
def test_update_strategy_accepts_counts_and_percentages(given: Any, envs: int) -> None:
    pool = _with_strategy(given)
    assert pool.update_strategy.max_unavailable == given
    assert pool.update_strategy.max_unavailable_envs(10) == envs
    assert spec.parse_manifest(pool.to_document()) == pool  # round trip (the ConfigMap)


@pytest.mark.parametrize(("given", "says"), [
    (-1, "an env count must be in [1, 100000]"),
    (0, "0 would never replace an actor"),
    ("0%", "a percentage must be in [1%, 100%]"),
    ("150%", "a percentage must be in [1%, 100%] (of replicas), got '150%'"),
    ("-5%", "expected an integer >= 1 or a percentage such as '25%'"),
    ("5", "(digits then %), got '5'"),
    ("abc", "got 'abc'"),
    ("25 %", "got '25 %'"),
    (2.5, "got 2.5"),
    (True, "got True"),
])
def test_update_strategy_rejects_bad_input_clearly(given: Any, says: str) -> None:
    with pytest.raises(spec.SpecError) as err:
        _with_strategy(given)
    (message,) = err.value.errors
    assert message.startswith("spec.updateStrategy.maxUnavailable: "), message
    assert says in message, message


def test_update_strategy_unknown_field_is_named() -> None:
    with pytest.raises(spec.SpecError, match=r"spec.updateStrategy.maxSurge: unknown field"):
        spec.parse_spec({"env": {"id": "CartPole-v1"}, "replicas": 4,
                         "updateStrategy": {"maxSurge": 1}}, name="cp")


def test_revision_follows_the_actor_build_only() -> None:
    base = {"env": {"id": "CartPole-v1"}, "replicas": 16, "envsPerActor": 4}
    rev = spec.parse_spec(base, name="cp").revision()
    for same in ({"replicas": 32}, {"batchWaitMs": 9}, {"suspend": True},
                 {"updateStrategy": {"maxUnavailable": 1}}, {"ray": {"image": "x:1"}}):
        assert spec.parse_spec({**base, **same}, name="cp").revision() == rev, same
    for other in ({"env": {"id": "Acrobot-v1"}}, {"envsPerActor": 8},
                  {"ray": {"runtimeEnv": {"env_vars": {"A": "1"}}}}, {"threadsPerActor": 2}):
        assert spec.parse_spec({**base, **other}, name="cp").revision() != rev, other


def test_leased_actor_policy_defaults_to_waiting_for_release() -> None:
    pool = spec.parse_spec({"env": {"id": "CartPole-v1"}, "replicas": 4}, name="cp")
    assert pool.update_strategy.leased_actors == "WaitForRelease"
    assert pool.update_strategy.leased_grace is None
    pool = spec.parse_spec({"env": {"id": "CartPole-v1"}, "replicas": 4, "updateStrategy": {
        "leasedActors": "ReplaceAfterGrace", "leasedGraceSeconds": 30}}, name="cp")
    assert pool.update_strategy.leased_grace == 30.0
    assert spec.parse_manifest(pool.to_document()) == pool


@pytest.mark.parametrize(("given", "says"), [
    ({"leasedActors": "Now"}, "spec.updateStrategy.leasedActors: expected one of "
                              "WaitForRelease, ReplaceAfterGrace, got 'Now'"),
    ({"leasedGraceSeconds": -1}, "spec.updateStrategy.leasedGraceSeconds: must be in "
                                 "[0, 604800], got -1"),
    ({"leasedGraceSeconds": "60"}, "spec.updateStrategy.leasedGraceSeconds: expected an "
                                   "integer in [0, 604800], got '60'"),
])
def test_leased_actor_policy_rejects_bad_input(given: dict[str, Any], says: str) -> None:
    with pytest.raises(spec.SpecError) as err:
        spec.parse_spec({"env": {"id": "CartPole-v1"}, "replicas": 4, "updateStrategy": given},
                        name="cp")
    assert err.value.errors == [says]


FREE_ON_HEAD = ("free on the head: 1024-6378, 6380-8079, 8081-8264, 8266, 8268-10000, "
                "20000-22999, 24000-52364, 52366-65535")


@pytest.mark.parametrize(("port", "owner"), [
    (6379, "Ray's GCS's"), (8080, "Ray's metrics export's"), (8265, "Ray's dashboard's"),
    (8267, "the pool server's lease API's"), (10001, "Ray client's"),
    (52365, "Ray's dashboard agent's"),
    (10002, "in the range 10002-19999 of Ray's worker processes"),
    (15000, "in the range 10002-19999 of Ray's worker processes"),
    (19999, "in the range 10002-19999 of Ray's worker processes"),
    (23000, "in the range 23000-23999 of Ray client's per-trainer servers"),
    (23999, "in the range 23000-23999 of Ray client's per-trainer servers"),
])
def test_a_metrics_port_the_ray_head_holds_is_refused_naming_its_holder_and_the_free_ranges(
        port: int, owner: str) -> None:
    with pytest.raises(spec.SpecError) as exc:
        spec.parse_manifest(_doc(metrics={"port": port}))
    text = str(exc.value)
    assert f"spec.metrics.port: {port} is taken by the Ray head" in text
    assert f"{port} is {owner}" in text
    assert FREE_ON_HEAD in text and "default 9480" in text


@pytest.mark.parametrize("port", [1024, 6378, 8266, 8268, 10000, 20000, 22999, 24000, 52364,
                                  52366, 65535, 9480])
def test_a_metrics_port_next_to_the_heads_is_free(port: int) -> None:
    assert spec.parse_manifest(_doc(metrics={"port": port})).metrics_port == port


def test_the_refused_ports_are_the_ones_the_operators_head_pod_binds() -> None:
    """The ranges refused are Ray's own defaults because the operator's head leaves them
    alone: a head ``rayStartParams`` that moved them would need the check moved too."""
    pool = spec.parse_manifest(_doc())
    rc = builders.build_ray_cluster(pool, settings.Settings(image="registry.example/e:1"))
    head = rc["spec"]["headGroupSpec"]
    for moved in ("min-worker-port", "max-worker-port", "worker-port-list", "port",
                  "ray-client-server-port", "dashboard-port", "metrics-export-port",
                  "dashboard-agent-listen-port"):
        assert moved not in head["rayStartParams"], moved
    declared = {p["containerPort"] for c in head["template"]["spec"]["containers"]
                for p in c.get("ports", []) if p.get("name") != "metrics"}
    assert declared <= set(spec.RAY_PORTS), declared - set(spec.RAY_PORTS)
    from ray.scripts import scripts  # ray start's own worker port range
    from ray.util.client.server import proxier  # where Ray client's servers listen

    defaults = {p.name: p.default for p in scripts.start.params}
    assert (defaults["min_worker_port"], defaults["max_worker_port"], 10002, 19999) in [
        (lo, hi, lo, hi) for lo, hi, _ in spec.fields.HEAD_PORT_RANGES]

    assert (proxier.MIN_SPECIFIC_SERVER_PORT, proxier.MAX_SPECIFIC_SERVER_PORT - 1) in [
        (lo, hi) for lo, hi, _ in spec.fields.HEAD_PORT_RANGES]
