"""The resync (issue 34): no API call for a pool whose children are as last applied.

The reconcile and the resync run whole over a stand-in for the HTTP transport
(``kube._send``) that keeps what is applied, as an API server would, and records every
request: what is asserted is which resyncs make requests. The caches the resync reads
are fed as the watches feed them (``remember_pool``, ``remember_ray_cluster``); the
real API server and watches are exercised in tests/e2e/test_operator_e2e.py.
"""

from __future__ import annotations

import asyncio
import copy
import json
import threading
import time
from typing import Any, cast

import kopf
import prometheus_client
import pytest

from envpool_operator import builders, kube, metrics, reconcile, settings
from envpool_operator import runtime as runtime_mod

UID = "11111111-2222-3333-4444-555555555555"
KEY = ("ns", "cp")
ENVPOOL = "/apis/envpool.dev/v1alpha1/namespaces/ns/envpools/cp"


def _body() -> dict[str, Any]:
    return {
        "apiVersion": "envpool.dev/v1alpha1", "kind": "EnvPool",
        "metadata": {"name": "cp", "namespace": "ns", "uid": UID, "generation": 1,
                     "labels": {"team": "a"}},
        "spec": {"env": {"id": "CartPole-v1"}, "replicas": 16}, "status": {},
    }


class _Log:
    def info(self, msg: str) -> None: ...
    def warning(self, msg: str) -> None: ...
    def exception(self, msg: str) -> None: ...


class _ApiServer:
    """Keeps what is applied (a RayCluster gets a uid and generation 1, +1 when its spec
    changes) and answers GETs from it; records every request."""

    def __init__(self, pool: dict[str, Any]) -> None:
        self.pool = pool
        self.objects: dict[str, dict[str, Any]] = {}
        self.requests: list[tuple[str, str]] = []

    def send(self, method: str, path: str, *, query: Any, body: Any,
             content_type: Any) -> tuple[int, str, str]:
        self.requests.append((method, path))
        if path == "/apis/ray.io/v1":
            return 200, "OK", json.dumps({"resources": [{"name": "rayclusters"}]})
        if method == "GET" and path == ENVPOOL:
            return 200, "OK", json.dumps(self.pool)
        if method == "GET":
            if path in self.objects:
                return 200, "OK", json.dumps(self.objects[path])
            return 404, "Not Found", json.dumps({"kind": "Status", "reason": "NotFound"})
        if method == "PATCH" and ("dryRun", "All") not in (query or ()) \
                and not path.endswith("/status"):
            old = self.objects.get(path)
            stored = copy.deepcopy(body)
            meta = stored["metadata"]
            meta["uid"] = (old or {}).get("metadata", {}).get("uid", "rc-uid-1")
            generation = (old or {}).get("metadata", {}).get("generation", 1)
            if old is not None and old.get("spec") != stored.get("spec"):
                generation += 1
            meta["generation"] = generation
            self.objects[path] = stored
            return 200, "OK", json.dumps(stored)
        return 200, "OK", json.dumps(body)

    def take(self) -> list[tuple[str, str]]:
        out, self.requests = self.requests, []
        return out


@pytest.fixture
def api(monkeypatch: pytest.MonkeyPatch) -> _ApiServer:
    WRITTEN.forget(KEY)
    server = _ApiServer(_body())
    monkeypatch.setattr(kube, "_send", server.send)
    kube.forget_ray_api()
    return server


def _started(api: _ApiServer, every: int) -> runtime_mod.Runtime:
    """A runtime that reconciled the pool once and saw it and its RayCluster in the
    watches, then ran resyncs until the first full one (the staggered one) is done."""
    global REGISTRY
    REGISTRY = prometheus_client.CollectorRegistry()
    rt = runtime_mod.Runtime(settings=settings.Settings(resync_full_every=every),
                             metrics=metrics.OperatorMetrics(REGISTRY))
    rt.remember_pool(KEY, api.pool)
    outcome = reconcile.reconcile(api.pool, rt, _Log())
    assert outcome.result == "success"
    WRITTEN.wrote(KEY, outcome.status)  # as the kopf handler does
    api.take()
    for _ in range(every):
        _resync(rt)
        if api.take():
            return rt
    raise AssertionError(f"no full resync within {every} passes")


WRITTEN = reconcile.StatusWrites()
#: The metrics of the runtime :func:`_started` made last.
REGISTRY = prometheus_client.CollectorRegistry()


def _resync(rt: runtime_mod.Runtime) -> None:
    """One resync of the pool, as the resync loop makes it (with the status writes)."""
    reconcile.resync(KEY, rt, _Log(), WRITTEN)


def _applies(requests: list[tuple[str, str]]) -> list[str]:
    return [path.rsplit("/", 2)[-2] for method, path in requests
            if method == "PATCH" and not path.endswith("/status")]


def test_unchanged_children_cost_no_call_until_the_full_reapply(api: _ApiServer) -> None:
    rt = _started(api, every=4)
    before = REGISTRY.get_sample_value("envpool_operator_resyncs_unchanged_total") or 0
    for _ in range(3):  # every - 1 resyncs make no request at all
        _resync(rt)
        assert api.take() == []
    _resync(rt)  # the 4th reads both and applies every child
    requests = api.take()
    assert [m for m, p in requests if m == "GET"] == ["GET", "GET"]
    # every child, the pool's Redis (a Deployment, its Service and NetworkPolicy) too
    assert set(_applies(requests)) == {
        "configmaps", "networkpolicies", "rayclusters", "rolebindings", "roles",
        "serviceaccounts", "deployments", "services"}
    assert REGISTRY.get_sample_value("envpool_operator_resyncs_unchanged_total") == before + 3


def test_every_one_applies_at_every_resync(api: _ApiServer) -> None:
    rt = _started(api, every=1)
    for _ in range(2):
        _resync(rt)
        assert "rayclusters" in _applies(api.take())


def _edit_watched_ray_cluster(rt: runtime_mod.Runtime, edit: Any) -> None:
    rc = copy.deepcopy(rt.ray_cluster(KEY))
    assert rc is not None
    edit(rc)
    rt.remember_ray_cluster(KEY, rc)


@pytest.mark.parametrize("edit", [
    pytest.param(lambda rc: rc["metadata"].update(generation=2), id="spec edited by hand"),
    pytest.param(lambda rc: rc["metadata"].update(uid="rc-uid-2"), id="re-created"),
    pytest.param(lambda rc: rc["metadata"]["labels"].pop("team"), id="label removed"),
    pytest.param(lambda rc: rc["metadata"]["annotations"].clear(), id="annotations removed"),
])
def test_a_ray_cluster_changed_behind_our_back_is_applied_at_the_next_resync(
        api: _ApiServer, edit: Any) -> None:
    rt = _started(api, every=100)
    _edit_watched_ray_cluster(rt, edit)
    _resync(rt)
    assert "rayclusters" in _applies(api.take())
    _resync(rt)  # as applied again: back to no call
    assert api.take() == []


def test_a_deleted_ray_cluster_or_a_new_spec_is_applied_at_the_next_resync(
        api: _ApiServer) -> None:
    rt = _started(api, every=100)
    rt.remember_ray_cluster(KEY, None)  # the watch saw it deleted
    _resync(rt)
    assert "rayclusters" in _applies(api.take())
    api.pool["spec"]["replicas"] = 24
    api.pool["metadata"]["generation"] = 2
    rt.remember_pool(KEY, api.pool)  # the watch saw the new spec
    _resync(rt)
    requests = api.take()
    assert "rayclusters" in _applies(requests)
    rc = api.objects["/apis/ray.io/v1/namespaces/ns/rayclusters/cp"]
    assert rc["spec"]["workerGroupSpecs"][0]["replicas"] > 0
    _resync(rt)
    assert api.take() == []


def test_full_reapplies_of_a_burst_are_staggered() -> None:
    rt = runtime_mod.Runtime(
        settings=settings.Settings(resync_full_every=12),
        metrics=metrics.OperatorMetrics(prometheus_client.CollectorRegistry()))
    seen = runtime_mod.Applied("d", 1, "u", 1)
    first_full: list[int] = []
    for i in range(240):
        key = ("ns", f"pool-{i}")
        rt.remember_applied(key, seen)
        passes = 0
        while rt.skip_resync(key, seen):
            passes += 1
        first_full.append(passes)
    assert set(first_full) == set(range(12))  # every pass takes some of the pools
    assert max(first_full.count(n) for n in range(12)) < 240 / 4


def test_resync_full_every_from_env() -> None:
    assert settings.from_env({}).resync_full_every == 12
    assert settings.from_env({"ENVPOOL_RESYNC_FULL_EVERY": "1"}).resync_full_every == 1
    with pytest.raises(ValueError, match="ENVPOOL_RESYNC_FULL_EVERY must be >= 1, got 0"):
        settings.from_env({"ENVPOOL_RESYNC_FULL_EVERY": "0"})


class _Recorder:
    """Stands in for the refresh's API work: records each pool refreshed, the first call
    held until ``release`` is set (the refresh of a slow API server)."""

    def __init__(self) -> None:
        self.refreshed: list[tuple[str, str]] = []
        self.reconciled: list[tuple[str, str]] = []
        self.release = threading.Event()
        self.lock = threading.Lock()

    def refresh(self, key: tuple[str, str], runtime: Any, written: Any,
                logger: Any = None) -> None:
        self.release.wait(10)
        with self.lock:
            self.refreshed.append(key)

    def reconcile_fresh(self, key: tuple[str, str], runtime: Any, logger: Any,
                        written: Any) -> None:
        with self.lock:
            self.reconciled.append(key)


def _drained(refresher: reconcile.StatusRefresher, rec: _Recorder, count: int) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with rec.lock:
            if refresher.pending() == 0 and len(rec.refreshed) >= count:
                return
        time.sleep(0.01)
    raise AssertionError(f"refreshes: {rec.refreshed}, pending {refresher.pending()}")


def test_ray_cluster_events_of_a_pool_are_refreshed_once_per_turn(
        monkeypatch: pytest.MonkeyPatch) -> None:
    rec = _Recorder()
    monkeypatch.setattr(reconcile, "refresh_from_ray_cluster", rec.refresh)
    monkeypatch.setattr(reconcile, "reconcile_fresh", rec.reconcile_fresh)
    rt = runtime_mod.Runtime(settings=settings.Settings(),
                             metrics=metrics.OperatorMetrics(prometheus_client.CollectorRegistry()))
    rt.remember_pool(("ns", "a"), _body())
    stop = threading.Event()
    refresher = reconcile.StatusRefresher(rt, None, stop, threads=2)
    try:
        refresher.submit(("ns", "a"), deleted=False, logger=_Log())
        time.sleep(0.2)  # a's first refresh is running (held)
        for _ in range(20):  # KubeRay's status writes while it runs: one more refresh
            refresher.submit(("ns", "a"), deleted=False, logger=_Log())
        refresher.submit(("ns", "a"), deleted=True, logger=_Log())
        refresher.submit(("ns", "a"), deleted=False, logger=_Log())  # re-created at once
        refresher.submit(("ns", "b"), deleted=False, logger=_Log())
        time.sleep(0.2)
        assert rec.refreshed == []  # every refresh is held until released
        rec.release.set()
        _drained(refresher, rec, 3)
        assert sorted(rec.refreshed) == [("ns", "a"), ("ns", "a"), ("ns", "b")]
        # the deletion among the coalesced events is not lost: a is put back
        assert rec.reconciled == [("ns", "a")]
    finally:
        stop.set()


def _event(body: dict[str, Any], rt: runtime_mod.Runtime, monkeypatch: pytest.MonkeyPatch,
           ) -> tuple[int, list[str]]:
    """One EnvPool watch event through the kopf handler, on an event loop; how many
    status refreshes it asked for and the functions it sent to a thread."""
    from envpool_operator import handlers

    threaded: list[str] = []

    async def to_thread(fn: Any, *args: Any) -> None:
        threaded.append(fn.__name__)

    monkeypatch.setattr(asyncio, "to_thread", to_thread)
    # a refresher without threads: what the event asked of it stays pending
    refresher = reconcile.StatusRefresher(rt, None, threading.Event(), threads=0)
    memo = kopf.Memo(envpool=rt, envpool_status_writes=reconcile.StatusWrites(),
                     envpool_refresher=refresher)
    handler: Any = handlers.pool_event_fn  # kopf's decorator types it as its callback
    asyncio.run(handler(body=kopf.Body(cast(Any, body)), type="MODIFIED", patch=kopf.Patch(),
                        memo=memo, logger=_Log()))
    return refresher.pending(), threaded


def test_an_envpool_event_is_handled_on_the_event_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    rt = runtime_mod.Runtime(settings=settings.Settings(),
                             metrics=metrics.OperatorMetrics(prometheus_client.CollectorRegistry()))
    body = _body()
    pool = settings.parse_pool(body, rt.settings)
    rt.remember_ray_cluster(KEY, builders.build_ray_cluster(pool, rt.settings))
    pending, threaded = _event(body, rt, monkeypatch)
    assert threaded == []  # a fixed-size pool: the cache, a refresh asked for, no API call
    assert pending == 1
    assert (rt.pool_body(KEY) or {})["spec"] == body["spec"]
    # the refresh (on the refresher's thread) writes the status from the caches
    patched: list[dict[str, Any]] = []
    monkeypatch.setattr(kube, "patch_envpool_status",
                        lambda ns, name, st: patched.append(dict(st)))
    reconcile.refresh_from_ray_cluster(KEY, rt)
    assert [p["phase"] for p in patched] == ["Provisioning"]
    body["spec"]["autoscaling"] = {"maxReplicas": 64, "bufferEnvs": 8}
    pending, threaded = _event(body, rt, monkeypatch)
    assert threaded == ["_scale"]  # the autoscaler may write: on a thread
