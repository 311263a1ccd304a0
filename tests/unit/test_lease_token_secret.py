"""The lease API token Secret (issue 30): created once per pool, never read, never applied.

The reconcile runs whole here over a recording stand-in for the HTTP transport
(``kube._send``), so what is asserted is the requests the operator makes: a create
(POST) of ``<pool>-lease-token`` owned by the EnvPool, "already exists" taken as done,
and no request that reads or replaces a Secret. The real API server's answer to these
requests is exercised in tests/e2e/test_remote_trainer.py.
"""

from __future__ import annotations

import base64
import json
from typing import Any

import prometheus_client
import pytest

from envpool_operator import kube, metrics, reconcile, settings
from envpool_operator import runtime as runtime_mod

UID = "11111111-2222-3333-4444-555555555555"
BODY = {
    "apiVersion": "envpool.dev/v1alpha1", "kind": "EnvPool",
    "metadata": {"name": "cp", "namespace": "ns", "uid": UID, "generation": 1},
    "spec": {"env": {"id": "CartPole-v1"}, "replicas": 16}, "status": {},
}
SECRETS = "/api/v1/namespaces/ns/secrets"


class _Log:
    def info(self, msg: str) -> None: ...
    def warning(self, msg: str) -> None: ...


class _ApiServer:
    """Answers the operator's requests as an API server with no children yet would,
    and records them; ``secret_exists``: the Secret is there already (409 on create)."""

    def __init__(self, secret_exists: bool = False, secret_refused: bool = False) -> None:
        self.requests: list[tuple[str, str, list[tuple[str, str]], Any]] = []
        self.secret_exists, self.secret_refused = secret_exists, secret_refused

    def send(self, method: str, path: str, *, query: Any, body: Any,
             content_type: Any) -> tuple[int, str, str]:
        self.requests.append((method, path, list(query or ()), body))
        if path == "/apis/ray.io/v1":
            return 200, "OK", json.dumps({"resources": [{"name": "rayclusters"}]})
        if method == "GET":
            return 404, "Not Found", json.dumps({"kind": "Status", "reason": "NotFound"})
        if path == SECRETS and self.secret_refused:
            return 403, "Forbidden", json.dumps({"kind": "Status", "message": "secrets is forbidden"})
        if path == SECRETS and self.secret_exists:
            return 409, "Conflict", json.dumps({"kind": "Status", "reason": "AlreadyExists"})
        return 200, "OK", json.dumps(body)

    def secret_requests(self) -> list[tuple[str, str, list[tuple[str, str]], Any]]:
        """The requests about the lease token Secret (the pool's Redis password Secret
        is another one, created once the same way)."""
        return [r for r in self.requests if "/secrets" in r[1] and (
            "-lease-token" in r[1] or "-lease-token" in str((r[3] or {}).get("metadata", {})))]


def _reconcile(monkeypatch: pytest.MonkeyPatch, api: _ApiServer) -> reconcile.Outcome:
    monkeypatch.setattr(kube, "_send", api.send)
    kube.forget_ray_api()
    rt = runtime_mod.Runtime(settings=settings.Settings(),
                             metrics=metrics.OperatorMetrics(prometheus_client.CollectorRegistry()))
    return reconcile.reconcile(BODY, rt, _Log())


def test_first_reconcile_creates_the_token_secret_owned_by_the_pool(
        monkeypatch: pytest.MonkeyPatch) -> None:
    api = _ApiServer()
    outcome = _reconcile(monkeypatch, api)
    assert outcome.result == "success", outcome
    (dry, real) = api.secret_requests()
    # judged with the other children first (a refusal leaves nothing half-made), then made
    assert dry[0] == real[0] == "POST" and dry[1] == real[1] == SECRETS
    assert ("dryRun", "All") in dry[2] and ("dryRun", "All") not in real[2]
    secret = real[3]
    assert secret["metadata"]["name"] == "cp-lease-token"
    (owner,) = secret["metadata"]["ownerReferences"]  # garbage-collected with the pool
    assert (owner["kind"], owner["name"], owner["uid"]) == ("EnvPool", "cp", UID)
    token = base64.b64decode(secret["data"]["token"])
    assert len(token) >= 32
    # the Secret is written before the pods that mount it: with the first wave
    order = [r[1].rsplit("/", 1)[0] if r[0] == "PATCH" else r[1] for r in api.requests
             if ("dryRun", "All") not in r[2] and r[0] != "GET"]
    assert order.index(SECRETS) < order.index("/apis/ray.io/v1/namespaces/ns/rayclusters")


def test_an_existing_secret_is_kept_unread(monkeypatch: pytest.MonkeyPatch) -> None:
    api = _ApiServer(secret_exists=True)
    assert _reconcile(monkeypatch, api).result == "success"
    assert [r[0] for r in api.secret_requests()] == ["POST", "POST"]  # no GET, no PATCH


def test_every_reconcile_makes_a_fresh_token_that_is_used_only_by_a_create(
        monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = _ApiServer(), _ApiServer()
    _reconcile(monkeypatch, a)
    _reconcile(monkeypatch, b)
    assert a.secret_requests()[-1][3]["data"] != b.secret_requests()[-1][3]["data"]


def test_a_refused_create_is_a_retried_problem_before_any_child_is_written(
        monkeypatch: pytest.MonkeyPatch) -> None:
    api = _ApiServer(secret_refused=True)
    outcome = _reconcile(monkeypatch, api)
    assert outcome.result == "retry"
    ready = next(c for c in outcome.status["conditions"] if c["type"] == "Ready")
    assert ready["reason"] == "Forbidden", ready
    assert "creating Secret ns/cp-lease-token" in str(outcome.error)
    # the dry run refused it: nothing was written for real
    assert all(("dryRun", "All") in r[2] for r in api.requests if r[0] in ("POST", "PATCH"))


def test_the_operator_never_reads_or_replaces_a_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    for api in (_ApiServer(), _ApiServer(secret_exists=True)):
        _reconcile(monkeypatch, api)
        assert {r[0] for r in api.secret_requests()} == {"POST"}
    assert ("v1", "Secret") in kube._KINDS  # a create path, and only that is used


def test_the_operator_and_the_pool_server_agree_on_the_lease_api() -> None:
    from envpool_operator import names
    from remote_env.pool import lease_api
    from remote_env.wire import channel

    assert names.LEASE_API_PORT == lease_api.DEFAULT_PORT
    assert names.LEASE_TOKEN_ENV == lease_api.TOKEN_FILE_ENV
    assert names.DATA_PORTS_ENV == channel.DATA_PORTS_ENV
