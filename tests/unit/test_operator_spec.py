"""remote_env.spec: parse/validate EnvPool specs on plain dicts (what the operator reconciles)."""

from __future__ import annotations

from typing import Any

import pytest

from remote_env import spec


def _spec(**over: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"env": {"id": "CartPole-v1"}, "replicas": 16}
    base.update(over)
    return base


def test_minimal_spec_gets_defaults() -> None:
    pool = spec.parse_spec(_spec(), name="cp", namespace="ns")
    assert pool.envs_per_actor == 8
    assert pool.threads_per_actor == 1
    assert pool.batch_wait_ms == 2
    assert pool.autoreset_mode == "NextStep"
    assert pool.fault_tolerance == spec.FaultTolerance()
    assert pool.ray.version == "2.60.0"
    assert pool.ray.image == ""
    assert pool.ray.worker.envs_per_worker == 64
    assert pool.metrics_port == 9480
    assert pool.suspend is False
    assert pool.workers == 1


def test_envs_per_actor_default_is_capped_by_replicas() -> None:
    assert spec.parse_spec(_spec(replicas=3), name="cp").envs_per_actor == 3


@pytest.mark.parametrize(
    ("replicas", "per_actor", "per_worker", "workers"),
    [
        (16, 8, 64, 1),
        (64, 8, 64, 1),
        (65, 8, 64, 2),
        (100, 8, 64, 2),
        # 8 per actor, 10 per worker: one actor per worker, so 20 envs need 3 workers
        (20, 8, 10, 3),
        (1, 1, 1, 1),
        (100_000, 8, 64, 1563),
    ],
)
def test_worker_count(replicas: int, per_actor: int, per_worker: int, workers: int) -> None:
    pool = spec.parse_spec(
        _spec(replicas=replicas, envsPerActor=per_actor,
              ray={"worker": {"envsPerWorker": per_worker}}),
        name="cp", limits=spec.Limits(max_workers=10_000),
    )
    assert pool.workers == workers
    # every actor fits: workers * actors_per_worker >= actors
    assert pool.workers * pool.actors_per_worker >= pool.actors


def test_suspend_scales_workers_to_zero_but_keeps_desired() -> None:
    pool = spec.parse_spec(_spec(replicas=128, suspend=True), name="cp")
    assert pool.workers == 0
    assert pool.desired_workers == 2


def _errors(raw: dict[str, Any], name: str = "cp", **kw: Any) -> list[str]:
    with pytest.raises(spec.SpecError) as info:
        spec.parse_spec(raw, name=name, **kw)
    return info.value.errors


@pytest.mark.parametrize(
    ("raw", "needle"),
    [
        ({"env": {}, "replicas": 1}, "exactly one of env.id (a gymnasium id, e.g. CartPole-v1) or env.entrypoint ('package.module:callable') must be set, got neither"),
        ({"env": {"id": "CartPole-v1", "entrypoint": "a:b"}, "replicas": 1}, "got both"),
        (_spec(env={"entrypoint": "no_colon"}), "expected 'package.module:callable'"),
        (_spec(env={"entrypoint": "a.b:c:d"}), "expected 'package.module:callable'"),
        (_spec(env={"entrypoint": "1bad:fn"}), "expected 'package.module:callable'"),
        (_spec(env={"id": "has space"}), "expected a gymnasium id"),
        (_spec(replicas=0), "spec.replicas: must be in [1, 100000], got 0"),
        (_spec(replicas=-5), "got -5"),
        (_spec(replicas=100_001), "got 100001"),
        (_spec(replicas="16"), "expected an integer"),
        (_spec(replicas=True), "expected an integer"),
        ({"env": {"id": "CartPole-v1"}}, "spec.replicas: required"),
        (_spec(replicas=4, envsPerActor=8), "must be <= replicas=4"),
        (_spec(replicas=200, envsPerActor=100), "must be <= ray.worker.envsPerWorker=64"),
        (_spec(batchWaitMs=-1), "spec.batchWaitMs"),
        (_spec(threadsPerActor=0), "spec.threadsPerActor: must be in [1, 1024], got 0"),
        (_spec(autoresetMode="Sometimes"), "expected one of NextStep, SameStep, Disabled"),
        (_spec(metrics={"port": 6379}), "taken by the Ray head"),
        # the lease API's port on the head: /metrics and the lease API cannot share it
        (_spec(metrics={"port": 8267}), "8267 is the pool server's lease API's; pick another"),
        (_spec(metrics={"port": 80}), "must be in [1024, 65535]"),
        (_spec(ray={"version": "latest"}), "expected a Ray release"),
        (_spec(ray={"image": "bad image"}), "no whitespace"),
        (_spec(ray={"head": {"resources": {"requests": {"cpu": "lots"}}}}), "expected a quantity"),
        (_spec(ray={"head": {"resources": {"requests": {"memory": "-1Gi"}}}}), "expected a quantity"),
        (_spec(ray={"head": {"resources": {"requests": {"cpu": "0"}}}}), "greater than zero"),
        (_spec(ray={"head": {"resources": {"limits": {"memory": "100Mi"}}}}), "at least 256Mi"),
        (_spec(ray={"worker": {"resources": {"requests": {"cpu": "2"}, "limits": {"cpu": "1"}}}}),
         "request 2 exceeds limit 1"),
        (_spec(ray={"worker": {"tolerations": [{"key": "k", "operator": "Exists", "value": "x"}]}}),
         "must be empty when operator is Exists"),
        (_spec(ray={"worker": {"tolerations": [{"operator": "Exists"}]}}),
         "tolerations[0].key: required with operator Exists (an empty key tolerates every taint"),
        (_spec(ray={"worker": {"tolerations": [{"key": "", "operator": "Exists",
                                                 "effect": "NoExecute"}]}}),
         "tolerations[0].key: required with operator Exists"),
        (_spec(ray={"authMode": "none"}), "spec.ray.authMode: expected one of token, disabled"),
        (_spec(ray={"envFromSecrets": ["Bad_Name"]}), "spec.ray.envFromSecrets[0]: expected a Secret"),
        (_spec(ray={"envFromSecrets": "creds"}), "spec.ray.envFromSecrets: expected a list"),
        (_spec(ray={"version": "2.51.0"}), "spec.ray.authMode: token needs Ray >= 2.52.0"),
        (_spec(ray={"worker": {"nodeSelector": {"zone": 3}}}), "expected a string"),
        (_spec(bogus=1), "spec.bogus: unknown field"),
        (_spec(env={"id": "CartPole-v1", "kwarg": {}}), "spec.env.kwarg: unknown field"),
        (_spec(faultTolerance={"maxRestarts": -1}), "spec.faultTolerance.maxRestarts"),
        (_spec(suspend="yes"), "expected true or false"),
    ],
)
def test_malformed_specs_say_what_is_wrong(raw: dict[str, Any], needle: str) -> None:
    errors = _errors(raw)
    assert any(needle in e for e in errors), errors


def test_all_problems_reported_at_once() -> None:
    errors = _errors({"env": {}, "replicas": 0, "autoresetMode": "x", "metrics": {"port": 1}})
    assert len(errors) >= 4
    assert str(spec.SpecError(errors)) == "; ".join(errors)


@pytest.mark.parametrize("name", ["a" * 41, "Upper", "1starts-with-digit", "ends-", "has.dot"])
def test_bad_names(name: str) -> None:
    assert any("metadata.name" in e for e in _errors(_spec(), name=name))


def test_name_of_40_characters_is_fine() -> None:
    assert spec.parse_spec(_spec(), name="a" * 40).name == "a" * 40


def test_worker_limit_is_enforced_with_advice() -> None:
    errors = _errors(_spec(replicas=100_000), limits=spec.Limits(max_workers=10))
    assert "at most 10" in errors[0] and "envsPerWorker" in errors[0]


@pytest.mark.parametrize(
    ("text", "value"),
    [("500m", 0.5), ("2", 2.0), ("1Gi", 2.0**30), ("1.5G", 1.5e9), ("1e3", 1000.0), (".5", 0.5)],
)
def test_parse_quantity(text: str, value: float) -> None:
    assert spec.parse_quantity(text) == pytest.approx(value)


@pytest.mark.parametrize("text", ["", "-1", "1GB", "one", "1 Gi"])
def test_parse_quantity_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        spec.parse_quantity(text)


def test_integer_quantities_are_accepted() -> None:
    pool = spec.parse_spec(
        _spec(ray={"worker": {"resources": {"requests": {"cpu": 2}, "limits": {"cpu": 4}}}}),
        name="cp",
    )
    assert pool.ray.worker.resources.requests == {"cpu": "2"}


def test_to_manifest_round_trips() -> None:
    raw = _spec(
        env={"entrypoint": "remote_env.examples:rps_parallel_env", "kwargs": {"n": 3},
             "multiAgent": True},
        envsPerActor=4,
        threadsPerActor=4,
        ray={"runtimeEnv": {"env_vars": {"A": "1"}},
             "worker": {"tolerations": [{"key": "k", "operator": "Exists"}]}},
    )
    pool = spec.parse_spec(raw, name="cp")
    again = spec.parse_spec(pool.to_manifest(), name="cp")
    assert again == pool and again.threads_per_actor == 4
    assert "id" not in pool.to_manifest()["env"]
