"""The operator's scale knobs (issue 34): handler threads, writes at once, request counts."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

import prometheus_client
import pytest

from envpool_operator import kube, metrics, reconcile, settings, status


def test_handler_threads_from_env() -> None:
    assert settings.from_env({"ENVPOOL_OPERATOR_THREADS": "4"}).handler_threads == 4
    assert settings.from_env({}).handler_threads == settings.Settings.handler_threads
    for bad in ("0", "-2", "many"):
        with pytest.raises(ValueError, match="ENVPOOL_OPERATOR_THREADS"):
            settings.from_env({"ENVPOOL_OPERATOR_THREADS": bad})


def _obj(kind: str, name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": kind, "metadata": {"namespace": "ns", "name": name}}


def test_apply_all_writes_at_once_and_keeps_order(monkeypatch: pytest.MonkeyPatch) -> None:
    # Every write waits until all three are in flight: run one after another, this
    # would time out at the barrier.
    barrier = threading.Barrier(3, timeout=10)

    def fake_apply(obj: Mapping[str, Any], *, dry_run: bool = False) -> dict[str, Any]:
        barrier.wait()
        return {"name": obj["metadata"]["name"], "dry_run": dry_run}

    monkeypatch.setattr(kube, "apply", fake_apply)
    out = kube.apply_all([_obj("ConfigMap", n) for n in ("a", "b", "c")], dry_run=True)
    assert out == [{"name": n, "dry_run": True} for n in ("a", "b", "c")]


def test_apply_all_waits_for_every_write_then_raises_the_first_refusal(
        monkeypatch: pytest.MonkeyPatch) -> None:
    done: list[str] = []
    slow = threading.Event()

    def fake_apply(obj: Mapping[str, Any], *, dry_run: bool = False) -> dict[str, Any]:
        name = obj["metadata"]["name"]
        if name == "late":
            slow.wait(0.3)
        done.append(name)
        if name in ("refused-1", "refused-2"):
            raise kube.ApiProblem(status.Problem("Forbidden", name), 60)
        return {}

    monkeypatch.setattr(kube, "apply", fake_apply)
    with pytest.raises(kube.ApiProblem, match="refused-1"):
        kube.apply_all([_obj("Role", n) for n in ("ok", "refused-1", "late", "refused-2")])
    assert sorted(done) == ["late", "ok", "refused-1", "refused-2"]  # none left running


def test_api_requests_are_counted_by_verb_and_resource() -> None:
    reg = prometheus_client.CollectorRegistry()
    m = metrics.OperatorMetrics(reg)
    verb, resource = kube.request_kind(
        "PATCH", "/api/v1/namespaces/ns/configmaps/cp-pool", [("fieldManager", "x")], kube.APPLY)
    m.api_requests.labels(verb=verb, resource=resource, code="200").inc()
    assert reg.get_sample_value("envpool_operator_api_requests_total",
                                {"verb": "apply", "resource": "configmaps", "code": "200"}) == 1.0
    m.resyncs.inc()
    assert reg.get_sample_value("envpool_operator_resyncs_total") == 1.0


def test_merge_patched_is_a_json_merge_patch_of_the_top_level() -> None:
    current = {"phase": "Provisioning", "leasedEnvs": 3, "pool": {"readyEnvs": 2}}
    out = reconcile.merge_patched(current, {"phase": "Ready", "leasedEnvs": None})
    assert out == {"phase": "Ready", "pool": {"readyEnvs": 2}}
    assert current["phase"] == "Provisioning"  # the cached body is replaced, not edited


def test_status_writes_make_a_stale_body_look_written() -> None:
    written = reconcile.StatusWrites()
    key = ("ns", "cp")
    stale = {"phase": "Pending", "pool": {"readyEnvs": 1}}
    assert written.basis(key, stale) == stale  # nothing written yet
    written.wrote(key, {"phase": "Provisioning", "leasedEnvs": None})
    written.wrote(key, {"message": "head not ready"})
    # the pool server's field stays as the body has it; ours as last written
    assert written.basis(key, stale) == {"phase": "Provisioning", "message": "head not ready",
                                         "pool": {"readyEnvs": 1}}
    assert not status.status_changed(written.basis(key, stale), {"phase": "Provisioning"})
    written.forget(key)
    assert written.basis(key, stale) == stale
