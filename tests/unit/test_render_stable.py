"""What the operator renders for an existing pool is stable across operator versions.

Why: KubeRay recreates a RayCluster's pods when their template changes, and the
operator re-renders every pool at start-up. A new operator version that renders a
different template for the same EnvPool (a new label, a new default) would empty every
warm pool in the cluster on one ``helm upgrade``. So the children rendered for the
example pools (and a few edge specs) are pinned here, byte for byte.

When this test fails, the change is an upgrade hazard: either render the old output
for existing pools, or make the change on purpose and say so in the release notes
(a changed pod template recreates that pool's Ray pods on upgrade); then regenerate:
``ENVPOOL_UPDATE_GOLDEN=1 pytest tests/unit/test_render_stable.py``.
"""

from __future__ import annotations

import json
import os
import pathlib
from typing import Any

import pytest
import yaml

from envpool_operator import builders, gcs_store, settings
from remote_env import spec

GOLDEN = pathlib.Path(__file__).parent / "golden" / "render"
#: The pool's own Redis: a change to its pod template restarts it, and a restarted Redis
#: (emptyDir) has lost the GCS tables the next head restart needs.
GOLDEN_REDIS = pathlib.Path(__file__).parent / "golden" / "render-redis"
EXAMPLES = pathlib.Path(__file__).parents[2] / "manifests" / "examples"
SETTINGS = settings.Settings(image="registry.example/envpool:1.0")
UPDATE = os.environ.get("ENVPOOL_UPDATE_GOLDEN") == "1"

# Specs beyond the examples: the fields whose rendering a refactor is likeliest to move.
EDGE_SPECS: dict[str, dict[str, Any]] = {
    "rolling-and-limits": {
        "env": {"id": "CartPole-v1", "kwargs": {"max_episode_steps": 50}},
        "replicas": 40, "envsPerActor": 4,
        "updateStrategy": {"maxUnavailable": 3, "leasedActors": "ReplaceAfterGrace",
                           "leasedGraceSeconds": 30},
        "faultTolerance": {"maxRestarts": 5, "startTimeoutSeconds": 60},
    },
    "head-ft-off": {
        "env": {"id": "CartPole-v1"}, "replicas": 16,
        "headFaultTolerance": {"enabled": False},
    },
    "head-ft-external-redis": {
        "env": {"id": "CartPole-v1"}, "replicas": 16,
        "headFaultTolerance": {"redisAddress": "redis.infra.svc:6379",
                               "passwordSecret": "infra-redis", "passwordKey": "secret"},
        "ray": {"head": {"nodeSelector": {"pool": "control"}}},
    },
}


def _documents() -> dict[str, tuple[str, dict[str, Any]]]:
    docs: dict[str, tuple[str, dict[str, Any]]] = {}
    for path in sorted(EXAMPLES.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc.get("kind") == "EnvPool":
                docs[f"{path.stem}-{doc['metadata']['name']}"] = (doc["metadata"]["name"],
                                                                  doc["spec"])
    for key, raw in EDGE_SPECS.items():
        docs[key] = ("edge", raw)
    return docs


DOCUMENTS = _documents()


def test_there_are_pools_to_pin() -> None:
    assert len(DOCUMENTS) >= 5, sorted(DOCUMENTS)


@pytest.mark.parametrize("key", sorted(DOCUMENTS))
def test_an_existing_pool_renders_the_children_it_rendered_before(key: str) -> None:
    name, raw = DOCUMENTS[key]
    pool = spec.parse_spec(raw, name=name, namespace="team-a")
    rendered = json.dumps(builders.build_children(pool, SETTINGS), indent=1, sort_keys=True)
    golden = GOLDEN / f"{key}.json"
    if UPDATE:
        golden.parent.mkdir(parents=True, exist_ok=True)
        golden.write_text(rendered + "\n")
    assert golden.exists(), f"no golden render for {key}: run with ENVPOOL_UPDATE_GOLDEN=1"
    assert rendered + "\n" == golden.read_text(), (
        f"the operator now renders {key!r} differently: on upgrade this changes running "
        f"pools' children (a pod template change recreates their Ray pods). See this "
        f"module's docstring.")


@pytest.mark.parametrize("key", sorted(DOCUMENTS))
def test_an_existing_pool_renders_the_redis_it_rendered_before(key: str) -> None:
    name, raw = DOCUMENTS[key]
    pool = spec.parse_spec(raw, name=name, namespace="team-a")
    redis = gcs_store.build_redis_children(pool, SETTINGS)
    if pool.head_fault_tolerance.provisioned:
        redis.insert(0, gcs_store.build_password_secret(pool, "<made by the reconcile>"))
    rendered = json.dumps(redis, indent=1, sort_keys=True)
    golden = GOLDEN_REDIS / f"{key}.json"
    if UPDATE:
        golden.parent.mkdir(parents=True, exist_ok=True)
        golden.write_text(rendered + "\n")
    assert golden.exists(), f"no golden render for {key}: run with ENVPOOL_UPDATE_GOLDEN=1"
    assert rendered + "\n" == golden.read_text(), (
        f"the operator now renders {key!r}'s Redis differently: on upgrade its pod is "
        f"replaced and the GCS tables in it are lost. See this module's docstring.")
