"""An operator upgrade leaves running pools' pods alone (builders.render_for): a pool
keeps the render generation and default image its RayCluster was made with until its
pods must be replaced anyway, and its status says what newer pods would bring."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from envpool_operator import builders, names, reconcile, settings
from remote_env import spec

OLD = settings.Settings(image="registry.example/envpool:1.0")
NEW = settings.Settings(image="registry.example/envpool:2.0")
#: What an operator of render generation 1 rendered (before GCS fault tolerance).
GEN1 = builders.Render(1, OLD.image)


def _pool(**over: Any) -> spec.PoolSpec:
    raw: dict[str, Any] = {"env": {"id": "CartPole-v1"}, "replicas": 16, **over}
    return spec.parse_spec(raw, name="cp", namespace="team-a")


def _from_before_the_annotations(rc: dict[str, Any]) -> dict[str, Any]:
    """A RayCluster as an operator from before render pins wrote it."""
    old = copy.deepcopy(rc)
    for key in (names.RENDER_GENERATION_ANNOTATION, names.DEFAULT_IMAGE_ANNOTATION):
        old["metadata"]["annotations"].pop(key)
    return old


@pytest.mark.parametrize("annotated", [True, False])
def test_a_new_operator_renders_the_same_pods_for_an_unchanged_pool(annotated: bool) -> None:
    pool = _pool()
    old = builders.build_ray_cluster(pool, OLD, render=GEN1)
    if not annotated:
        old = _from_before_the_annotations(old)
    render = builders.render_for(pool, NEW, old)
    assert render == builders.Render(1, OLD.image)
    again = builders.build_ray_cluster(pool, NEW, render=render)
    assert again["spec"] == old["spec"]  # the pods KubeRay runs: untouched
    assert again["metadata"]["annotations"][names.CLUSTER_HASH_ANNOTATION] == \
        old["metadata"]["annotations"][names.CLUSTER_HASH_ANNOTATION]
    lag = builders.render_lag(pool, NEW, render)
    assert lag is not None and "registry.example/envpool:2.0" in lag
    assert f"{names.RENDER_ANNOTATION}=latest" in lag


def test_a_change_that_needs_new_pods_takes_the_new_rendering() -> None:
    old = builders.build_ray_cluster(_pool(), OLD, render=GEN1)
    bigger = _pool(ray={"worker": {"resources": {"requests": {"cpu": "2"}}}})
    render = builders.render_for(bigger, NEW, old)
    assert render == builders.Render.current(NEW)
    assert builders.render_lag(bigger, NEW, render) is None


def test_an_env_change_keeps_the_pods_and_their_rendering() -> None:
    old = builders.build_ray_cluster(_pool(), OLD, render=GEN1)
    other_env = _pool(env={"id": "Acrobot-v1"})  # rolled in place by the pool server
    assert builders.render_for(other_env, NEW, old) == builders.Render(1, OLD.image)


def test_the_user_asks_for_the_new_rendering() -> None:
    old = builders.build_ray_cluster(_pool(), OLD, render=GEN1)
    assert builders.render_for(_pool(), NEW, old, requested="latest") == builders.Render.current(NEW)


def test_new_pools_and_unreadable_or_newer_renders_get_this_operators() -> None:
    pool = _pool()
    assert builders.render_for(pool, NEW, None) == builders.Render.current(NEW)
    newer = builders.build_ray_cluster(pool, OLD, render=GEN1)
    newer["metadata"]["annotations"][names.RENDER_GENERATION_ANNOTATION] = "99"
    assert builders.render_for(pool, NEW, newer) == builders.Render.current(NEW)
    garbled = builders.build_ray_cluster(pool, OLD, render=GEN1)
    garbled["metadata"]["annotations"][names.RENDER_GENERATION_ANNOTATION] = "two"
    assert builders.render_for(pool, NEW, garbled) == builders.Render.current(NEW)


def test_a_pool_with_its_own_image_is_current_whatever_the_operators_image() -> None:
    pool = _pool(ray={"image": "team/envs:7"})
    old = builders.build_ray_cluster(pool, OLD, render=GEN1)
    render = builders.render_for(pool, NEW, old)
    assert builders.build_ray_cluster(pool, NEW, render=render)["spec"] == old["spec"]
    lag = builders.render_lag(pool, NEW, render)
    # it misses generation 2, not the operator's image (its own is the one it runs)
    assert lag is not None and "render generation 2" in lag and "envpool:2.0" not in lag
    current = builders.build_ray_cluster(pool, NEW)
    assert builders.render_lag(pool, NEW, builders.render_for(pool, NEW, current)) is None


def _body(pool_spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "envpool.dev/v1alpha1", "kind": "EnvPool",
            "metadata": {"name": "cp", "namespace": "team-a", "generation": 1, "uid": "u"},
            "spec": pool_spec}


def test_the_status_says_the_pods_are_older_and_how_to_take_new_ones() -> None:
    raw = {"env": {"id": "CartPole-v1"}, "replicas": 16}
    old = builders.build_ray_cluster(_pool(), OLD, render=GEN1)
    st = reconcile.compute(_body(raw), settings=NEW, ray_cluster=old, reconciled=True)
    cond = {c["type"]: c for c in st["conditions"]}["PodsCurrent"]
    assert cond["status"] == "False" and cond["reason"] == "OlderRender"
    assert "registry.example/envpool:1.0" in cond["message"]
    assert "GCS fault tolerance" in cond["message"]  # what generation 2 would bring
    # no "Updating": the RayCluster reflects the spec as rendered for it
    assert {c["type"]: c for c in st["conditions"]}["RayClusterReady"]["reason"] != "Updating"
    current = builders.build_ray_cluster(_pool(), OLD)
    same = reconcile.compute(_body(raw), settings=OLD, ray_cluster=current, reconciled=True)
    assert {c["type"]: c for c in same["conditions"]}["PodsCurrent"]["status"] == "True"


def test_a_generation_1_pool_keeps_its_head_without_gcs_fault_tolerance() -> None:
    pool = _pool()
    old = builders.build_ray_cluster(pool, OLD, render=GEN1)
    assert "gcsFaultToleranceOptions" not in old["spec"]
    kept = builders.build_ray_cluster(pool, NEW, render=builders.render_for(pool, NEW, old))
    assert "gcsFaultToleranceOptions" not in kept["spec"]
    latest = builders.build_ray_cluster(pool, NEW, render=builders.render_for(
        pool, NEW, old, requested="latest"))
    assert latest["spec"]["gcsFaultToleranceOptions"]["redisAddress"] == "cp-redis.team-a.svc:6379"
