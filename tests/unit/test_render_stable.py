"""What the operator renders for an existing pool is stable across operator versions.

Why: KubeRay recreates a RayCluster's pods when their template changes, and the
operator re-renders every pool at start-up. A new operator version that renders a
different template for the same EnvPool (a new label, a new default) would empty every
warm pool in the cluster on one ``helm upgrade``. So the children rendered for the
example pools (and a few edge specs) are pinned here, byte for byte.

A pool keeps the render generation (and the operator default image) its RayCluster
was made with (``builders.render_for``), so the goldens in ``golden/render`` are what
generation 1 renders, forever. A change to the pods goes under ``if render.generation
>= N`` with ``builders.RENDER_GENERATION = N``; new pools get it (their goldens in
``golden/render-g<N>``), existing ones when their pods are replaced anyway.

When this test fails for generation 1, the change is an upgrade hazard: put it under
a new generation. Regenerate on purpose with
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


def _golden_dir(generation: int) -> pathlib.Path:
    return GOLDEN if generation == 1 else GOLDEN.with_name(f"render-g{generation}")


@pytest.mark.parametrize("generation", sorted({1, builders.RENDER_GENERATION}))
@pytest.mark.parametrize("key", sorted(DOCUMENTS))
def test_an_existing_pool_renders_the_children_it_rendered_before(key: str, generation: int) -> None:
    name, raw = DOCUMENTS[key]
    pool = spec.parse_spec(raw, name=name, namespace="team-a")
    render = builders.Render(generation, SETTINGS.image)
    rendered = json.dumps(builders.build_children(pool, SETTINGS, render=render), indent=1,
                          sort_keys=True)
    golden = _golden_dir(generation) / f"{key}.json"
    if UPDATE:
        golden.parent.mkdir(parents=True, exist_ok=True)
        golden.write_text(rendered + "\n")
    assert golden.exists(), f"no golden render for {key}: run with ENVPOOL_UPDATE_GOLDEN=1"
    assert rendered + "\n" == golden.read_text(), (
        f"the operator now renders {key!r} at generation {generation} differently: on "
        f"upgrade this changes running pools' children (a pod template change recreates "
        f"their Ray pods). See this module's docstring.")


@pytest.mark.parametrize("key", sorted(DOCUMENTS))
def test_a_new_pool_gets_the_newest_generation(key: str) -> None:
    name, raw = DOCUMENTS[key]
    pool = spec.parse_spec(raw, name=name, namespace="team-a")
    assert builders.build_children(pool, SETTINGS) == builders.build_children(
        pool, SETTINGS, render=builders.Render(builders.RENDER_GENERATION, SETTINGS.image))


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


#: Keys whose ``{}`` KubeRay's Go types keep: structs (``ScaleStrategy``) or pointers to
#: structs (``emptyDir``), which ``omitempty`` does not drop. An empty map or list under
#: any other key is dropped by ``omitempty`` when KubeRay writes the RayCluster back.
_KEPT_EMPTY = frozenset({"scaleStrategy", "emptyDir"})


def _dropped_by_kuberay(node: Any, path: str = "spec") -> list[str]:
    if isinstance(node, dict):
        if not node and path.rsplit(".", 1)[-1] not in _KEPT_EMPTY:
            return [path]
        return [p for k, v in node.items() for p in _dropped_by_kuberay(v, f"{path}.{k}")]
    if isinstance(node, list):
        if not node:
            return [path]
        return [p for i, v in enumerate(node) for p in _dropped_by_kuberay(v, f"{path}[{i}]")]
    return []


@pytest.mark.parametrize("generation", sorted({builders.GCS_FT_GENERATION, builders.RENDER_GENERATION}))
@pytest.mark.parametrize("key", sorted(DOCUMENTS))
def test_kuberay_writes_back_the_ray_cluster_the_operator_applies(key: str, generation: int) -> None:
    """KubeRay's full Updates of the RayCluster (the GCS fault-tolerance finalizer)
    re-serialize the spec through its Go types; whatever they drop, the operator's next
    server-side apply adds again: a spec change, a generation KubeRay must observe again
    before the pool is Ready. Checked once against KubeRay 1.6.2's own types (every
    RayCluster of these goldens unmarshalled and marshalled again in Go: identical specs
    but for an empty ``workersToDelete``); this keeps the renders in that shape.
    From the generation that brought fault tolerance on: generation 1 has no finalizer,
    so KubeRay never writes its spec back, and it keeps the ``[]`` its operators applied
    (dropping it would change every older pool's spec on upgrade; see the next test)."""
    name, raw = DOCUMENTS[key]
    pool = spec.parse_spec(raw, name=name, namespace="team-a")
    render = builders.Render(generation, SETTINGS.image)
    for workers in (None, (3, ["w-a"])):
        rc = builders.build_ray_cluster(pool, SETTINGS, workers=workers, render=render)
        assert _dropped_by_kuberay(rc["spec"]) == [], (key, workers)


@pytest.mark.parametrize("key", sorted(DOCUMENTS))
def test_generation_1_keeps_its_empty_workers_to_delete(key: str) -> None:
    """The generation-1 operators applied ``scaleStrategy: {workersToDelete: []}``; an
    apply without it would remove the field (server-side apply drops what its manager no
    longer sends): a spec change on every pool an older operator made, at upgrade."""
    name, raw = DOCUMENTS[key]
    pool = spec.parse_spec(raw, name=name, namespace="team-a")
    rc = builders.build_ray_cluster(pool, SETTINGS, render=builders.Render(1, SETTINGS.image))
    assert [g["scaleStrategy"] for g in rc["spec"]["workerGroupSpecs"]] == [{"workersToDelete": []}]
