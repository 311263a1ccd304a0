"""The one module that talks to the Kubernetes API (besides kopf itself).

Children are written with server-side apply under one field manager, so a
re-run, a concurrent timer, or an operator restarted mid-reconcile converges
on the same objects instead of creating duplicates. API failures are turned
into :class:`ApiProblem` with a condition reason and a retry delay.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Mapping
from typing import Any, Final
from urllib.parse import quote

import kubernetes
from kubernetes.client import exceptions as k8s_exceptions

from envpool_operator import status as status_mod
from remote_env import kubeconfig
from remote_env import spec as spec_mod

FIELD_MANAGER: Final = "envpool-operator"
REQUEST_TIMEOUT: Final = 30.0
APPLY: Final = "application/apply-patch+yaml"
MERGE: Final = "application/merge-patch+json"

#: apiVersion/kind -> (API prefix, plural) for the kinds the operator writes.
_KINDS: Final[dict[tuple[str, str], tuple[str, str]]] = {
    ("v1", "ConfigMap"): ("/api/v1", "configmaps"),
    ("v1", "ServiceAccount"): ("/api/v1", "serviceaccounts"),
    ("rbac.authorization.k8s.io/v1", "Role"): ("/apis/rbac.authorization.k8s.io/v1", "roles"),
    ("rbac.authorization.k8s.io/v1", "RoleBinding"):
        ("/apis/rbac.authorization.k8s.io/v1", "rolebindings"),
    ("networking.k8s.io/v1", "NetworkPolicy"):
        ("/apis/networking.k8s.io/v1", "networkpolicies"),
    ("ray.io/v1", "RayCluster"): ("/apis/ray.io/v1", "rayclusters"),
    (spec_mod.API_VERSION, spec_mod.KIND): (f"/apis/{spec_mod.API_VERSION}", spec_mod.PLURAL),
}


class ApiProblem(Exception):
    """An API call failed; ``delay`` is None when retrying cannot help."""

    def __init__(self, problem: status_mod.Problem, delay: float | None) -> None:
        super().__init__(problem.message)
        self.problem = problem
        self.delay = delay


_lock = threading.Lock()
_api: kubernetes.client.ApiClient | None = None
_ray_api_seen_at: float = -1e9


def configure() -> None:
    """Load credentials: in-cluster service account, else KUBECONFIG / ~/.kube/config."""
    global _api
    kubeconfig.load()
    with _lock:
        _api = kubernetes.client.ApiClient()


def _client() -> kubernetes.client.ApiClient:
    global _api
    with _lock:
        if _api is None:
            _api = kubernetes.client.ApiClient()
        return _api


def _path(api_version: str, kind: str, namespace: str, name: str | None = None) -> str:
    prefix, plural = _KINDS[(api_version, kind)]
    path = f"{prefix}/namespaces/{quote(namespace)}/{plural}"
    return f"{path}/{quote(name)}" if name else path


def _request(
    method: str, path: str, *, query: list[tuple[str, str]] | None = None,
    body: Any = None, content_type: str | None = None,
) -> Any:
    api = _client()
    headers = {"Accept": "application/json"}
    if content_type:
        headers["Content-Type"] = content_type
    # The client JSON-encodes dict bodies for JSON and YAML content types
    # (apply patches are YAML, and JSON is YAML).
    params = api.param_serialize(
        method=method, resource_path=path, query_params=query or [], header_params=headers,
        body=body, auth_settings=["BearerToken"],
    )
    resp: Any = api.call_api(*params, _request_timeout=REQUEST_TIMEOUT)
    data = resp.read()
    text = data.decode("utf-8", "replace") if data else ""
    if not 200 <= resp.status <= 299:
        raise k8s_exceptions.ApiException(status=resp.status, reason=resp.reason, body=text)
    return json.loads(text) if text else None


def _status_body(exc: k8s_exceptions.ApiException) -> Mapping[str, Any]:
    try:
        parsed = json.loads(exc.body or "")
    except (TypeError, ValueError):
        return {}
    return parsed if isinstance(parsed, Mapping) else {}


def problem_from_api_error(exc: k8s_exceptions.ApiException, what: str) -> ApiProblem:
    """Map an API error to a condition reason and a retry delay (None: do not retry)."""
    body = _status_body(exc)
    message = str(body.get("message") or exc.reason or "").strip()
    code = exc.status or 0
    if code == 403 and "exceeded quota" in message:
        return ApiProblem(status_mod.Problem(
            "QuotaExceeded", f"{what}: {message}; raise the ResourceQuota or shrink the pool"), 60)
    if code == 403:
        return ApiProblem(status_mod.Problem(
            "Forbidden", f"{what}: {message}; the operator's RBAC lacks this permission"), 60)
    if code == 404 and body.get("kind") != "Status":
        return ApiProblem(status_mod.Problem(
            "KubeRayMissing", f"{what}: the ray.io/v1 API is not served; install KubeRay"), 30)
    if code == 422:
        return ApiProblem(status_mod.Problem("Invalid", f"{what} rejected: {message}"), None)
    if code in (409, 429) or code >= 500 or code == 0:
        return ApiProblem(status_mod.Problem("ApiError", f"{what}: {code} {message}"), 5)
    return ApiProblem(status_mod.Problem("ApiError", f"{what}: {code} {message}"), 15)


def ray_api_available() -> bool:
    """Whether the KubeRay CRD (ray.io/v1 rayclusters) is served; cached when it is."""
    global _ray_api_seen_at
    if time.monotonic() - _ray_api_seen_at < 300:
        return True
    try:
        found = _request("GET", "/apis/ray.io/v1")
    except k8s_exceptions.ApiException as exc:
        if exc.status == 404:
            return False
        raise problem_from_api_error(exc, "discovering ray.io/v1") from exc
    names = {r.get("name") for r in (found or {}).get("resources", ())}
    if "rayclusters" not in names:
        return False
    _ray_api_seen_at = time.monotonic()
    return True


def forget_ray_api() -> None:
    """Re-check discovery next time (after a 404 that may mean KubeRay was removed)."""
    global _ray_api_seen_at
    _ray_api_seen_at = -1e9


def apply(obj: Mapping[str, Any], *, dry_run: bool = False) -> dict[str, Any]:
    """Server-side apply ``obj`` (create or update); returns the object as stored.

    ``dry_run``: the API server runs admission (quota, RBAC, schema) and
    persists nothing.
    """
    meta = obj["metadata"]
    what = f"applying {obj['kind']} {meta['namespace']}/{meta['name']}"
    path = _path(obj["apiVersion"], obj["kind"], meta["namespace"], meta["name"])
    query = [("fieldManager", FIELD_MANAGER), ("force", "true")]
    if dry_run:
        query.append(("dryRun", "All"))
    try:
        out = _request("PATCH", path, body=dict(obj), content_type=APPLY, query=query)
    except k8s_exceptions.ApiException as exc:
        if obj["kind"] == "RayCluster" and exc.status == 404:
            forget_ray_api()
        raise problem_from_api_error(exc, what) from exc
    return dict(out or {})


def get(api_version: str, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
    try:
        out = _request("GET", _path(api_version, kind, namespace, name))
    except k8s_exceptions.ApiException as exc:
        if exc.status == 404 and _status_body(exc).get("kind") == "Status":
            return None
        raise problem_from_api_error(exc, f"reading {kind} {namespace}/{name}") from exc
    return dict(out or {})


def get_ray_cluster(namespace: str, name: str) -> dict[str, Any] | None:
    return get("ray.io/v1", "RayCluster", namespace, name)


def patch_envpool_status(namespace: str, name: str, status: Mapping[str, Any]) -> None:
    """Merge-patch an EnvPool's status subresource (from outside a kopf handler)."""
    path = _path(spec_mod.API_VERSION, spec_mod.KIND, namespace, name) + "/status"
    try:
        _request("PATCH", path, body={"status": dict(status)}, content_type=MERGE)
    except k8s_exceptions.ApiException as exc:
        if exc.status == 404:
            return  # the EnvPool was deleted meanwhile
        raise problem_from_api_error(exc, f"patching EnvPool {namespace}/{name} status") from exc


def scale_envpool(namespace: str, name: str, replicas: int) -> dict[str, Any] | None:
    """Write ``spec.replicas`` through the scale subresource, as ``kubectl scale`` and an
    HPA do (one path for every resizer). None when the EnvPool is gone."""
    path = _path(spec_mod.API_VERSION, spec_mod.KIND, namespace, name) + "/scale"
    try:
        out = _request("PATCH", path, body={"spec": {"replicas": replicas}}, content_type=MERGE)
    except k8s_exceptions.ApiException as exc:
        if exc.status == 404:
            return None
        raise problem_from_api_error(exc, f"scaling EnvPool {namespace}/{name}") from exc
    return dict(out or {})
