"""The one module that talks to the Kubernetes API (besides kopf itself).

Children are written with server-side apply under one field manager, so a
re-run, a concurrent timer, or an operator restarted mid-reconcile converges
on the same objects instead of creating duplicates. API failures are turned
into :class:`ApiProblem` with a condition reason and a retry delay.
"""

from __future__ import annotations

import concurrent.futures
import json
import threading
import time
from collections.abc import Callable, Mapping, Sequence
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
JSON_PATCH: Final = "application/json-patch+json"

#: apiVersion/kind -> (API prefix, plural) for the kinds the operator writes.
_KINDS: Final[dict[tuple[str, str], tuple[str, str]]] = {
    ("v1", "ConfigMap"): ("/api/v1", "configmaps"),
    ("v1", "ServiceAccount"): ("/api/v1", "serviceaccounts"),
    ("v1", "Service"): ("/api/v1", "services"),
    ("v1", "Secret"): ("/api/v1", "secrets"),
    ("apps/v1", "Deployment"): ("/apis/apps/v1", "deployments"),
    ("rbac.authorization.k8s.io/v1", "Role"): ("/apis/rbac.authorization.k8s.io/v1", "roles"),
    ("rbac.authorization.k8s.io/v1", "RoleBinding"):
        ("/apis/rbac.authorization.k8s.io/v1", "rolebindings"),
    ("networking.k8s.io/v1", "NetworkPolicy"):
        ("/apis/networking.k8s.io/v1", "networkpolicies"),
    ("ray.io/v1", "RayCluster"): ("/apis/ray.io/v1", "rayclusters"),
    ("v1", "Event"): ("/api/v1", "events"),
    (spec_mod.API_VERSION, spec_mod.KIND): (f"/apis/{spec_mod.API_VERSION}", spec_mod.PLURAL),
}


class ApiProblem(Exception):
    """An API call failed; ``delay`` is None when retrying cannot help."""

    def __init__(self, problem: status_mod.Problem, delay: float | None) -> None:
        super().__init__(problem.message)
        self.problem = problem
        self.delay = delay


#: ``observe(verb, resource, status_code)`` after every request (0: no answer).
RequestObserver = Callable[[str, str, int], None]

#: Connections (and threads of :func:`apply_all`) when :func:`configure` is not told.
DEFAULT_CONNECTIONS: Final = 16

_lock = threading.Lock()
_api: kubernetes.client.ApiClient | None = None
_writers: concurrent.futures.ThreadPoolExecutor | None = None
_observe: RequestObserver | None = None
_ray_api_seen_at: float = -1e9


def configure(observe: RequestObserver | None = None,
              connections: int = DEFAULT_CONNECTIONS, writers: int = DEFAULT_CONNECTIONS) -> None:
    """Load credentials: in-cluster service account, else KUBECONFIG / ~/.kube/config.

    ``observe`` is told about every request (the operator counts them in its metrics).
    ``connections``: the client's connection pool; ``writers``: the threads that write
    reconcile's children at once (:func:`apply_all`). The client's default pool (5
    per core) is smaller than the handler threads of a busy operator: a request that
    finds no free connection opens one and closes it after, a TLS handshake each.
    """
    global _api, _observe, _writers
    kubeconfig.load()
    cfg = kubernetes.client.Configuration.get_default_copy()
    cfg.connection_pool_maxsize = connections
    with _lock:
        _api = kubernetes.client.ApiClient(cfg)
        _observe = observe
        if _writers is not None:
            _writers.shutdown(wait=False)
        _writers = concurrent.futures.ThreadPoolExecutor(
            max_workers=writers, thread_name_prefix="envpool-apply")


def _client() -> kubernetes.client.ApiClient:
    global _api
    with _lock:
        if _api is None:
            _api = kubernetes.client.ApiClient()
        return _api


def _writer_pool() -> concurrent.futures.ThreadPoolExecutor:
    global _writers
    with _lock:
        if _writers is None:
            _writers = concurrent.futures.ThreadPoolExecutor(
                max_workers=DEFAULT_CONNECTIONS, thread_name_prefix="envpool-apply")
        return _writers


def _path(api_version: str, kind: str, namespace: str, name: str | None = None) -> str:
    prefix, plural = _KINDS[(api_version, kind)]
    path = f"{prefix}/namespaces/{quote(namespace)}/{plural}"
    return f"{path}/{quote(name)}" if name else path


def request_kind(method: str, path: str, query: list[tuple[str, str]] | None = None,
                 content_type: str | None = None) -> tuple[str, str]:
    """(verb, resource) of a request, as the operator's metrics label it.

        >>> request_kind("PATCH", "/apis/ray.io/v1/namespaces/a/rayclusters/x",
        ...              [("dryRun", "All")], APPLY)
        ('apply_dry_run', 'rayclusters')
        >>> request_kind("PATCH", "/apis/envpool.dev/v1alpha1/namespaces/a/envpools/x/status",
        ...              content_type=MERGE)
        ('patch', 'envpools/status')
        >>> request_kind("GET", "/apis/ray.io/v1")
        ('get', 'discovery')
    """
    if content_type == APPLY:
        verb = "apply_dry_run" if ("dryRun", "All") in (query or ()) else "apply"
    else:
        verb = method.lower()
    parts = path.strip("/").split("/")
    if "namespaces" not in parts:
        return verb, "discovery"
    rest = parts[parts.index("namespaces") + 2:]  # plural, name, subresource
    resource = rest[0] if rest else "unknown"
    return verb, f"{resource}/{rest[2]}" if len(rest) > 2 else resource


def _request(
    method: str, path: str, *, query: list[tuple[str, str]] | None = None,
    body: Any = None, content_type: str | None = None,
) -> Any:
    code = 0
    try:
        code, reason, text = _send(method, path, query=query, body=body,
                                   content_type=content_type)
    finally:
        if _observe is not None:
            _observe(*request_kind(method, path, query, content_type), code)
    if not 200 <= code <= 299:
        raise k8s_exceptions.ApiException(status=code, reason=reason, body=text)
    return json.loads(text) if text else None


def _send(
    method: str, path: str, *, query: list[tuple[str, str]] | None,
    body: Any, content_type: str | None,
) -> tuple[int, str, str]:
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
    return int(resp.status), str(resp.reason or ""), data.decode("utf-8", "replace") if data else ""


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


def create_absent(obj: Mapping[str, Any], *, dry_run: bool = False) -> bool:
    """Create ``obj`` unless one of its name exists; whether this call created it.

    For what must be written once and never read back (the lease token Secret: the
    operator may create Secrets, not get them): an existing object is left as it is.
    """
    meta = obj["metadata"]
    what = f"creating {obj['kind']} {meta['namespace']}/{meta['name']}"
    query = [("fieldManager", FIELD_MANAGER)] + ([("dryRun", "All")] if dry_run else [])
    try:
        _request("POST", _path(obj["apiVersion"], obj["kind"], meta["namespace"]),
                 body=dict(obj), content_type="application/json", query=query)
    except k8s_exceptions.ApiException as exc:
        if exc.status == 409 and _status_body(exc).get("reason") == "AlreadyExists":
            return False
        raise problem_from_api_error(exc, what) from exc
    return True


def apply_all(objs: Sequence[Mapping[str, Any]], *, dry_run: bool = False,
              create: Sequence[Mapping[str, Any]] = ()) -> list[dict[str, Any]]:
    """:func:`apply` every object of ``objs`` at once; the objects as stored, in order.

    For objects that do not depend on each other: one round trip instead of one per
    object, which is most of a reconcile's time when the API server is slow to answer.
    ``create``: objects to :func:`create_absent` in the same round trip (not returned).
    Every write is waited for (none is left running), then the first refusal in
    ``objs`` order (then ``create`` order) is raised.
    """
    if len(objs) + len(create) <= 1:
        for obj in create:
            create_absent(obj, dry_run=dry_run)
        return [apply(obj, dry_run=dry_run) for obj in objs]
    futures = [_writer_pool().submit(apply, obj, dry_run=dry_run) for obj in objs]
    created = [_writer_pool().submit(create_absent, obj, dry_run=dry_run) for obj in create]
    pending: list[concurrent.futures.Future[Any]] = [*futures, *created]
    concurrent.futures.wait(pending)
    out = [f.result() for f in futures]
    for f in created:
        f.result()
    return out


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


def remove_finalizer(obj: Mapping[str, Any], finalizer: str) -> bool:
    """Take ``finalizer`` off ``obj`` (as read), if its finalizers are still what was read
    (a JSON patch ``test``: a concurrent change is never overwritten; the caller sees the
    object again and decides again). Whether this call removed it."""
    meta = obj["metadata"]
    found = list(meta.get("finalizers") or ())
    if finalizer not in found:
        return False
    path = _path(obj["apiVersion"], obj["kind"], meta["namespace"], meta["name"])
    ops = [{"op": "test", "path": "/metadata/finalizers", "value": found},
           {"op": "replace", "path": "/metadata/finalizers",
            "value": [f for f in found if f != finalizer]}]
    try:
        _request("PATCH", path, body=ops, content_type=JSON_PATCH)
    except k8s_exceptions.ApiException as exc:
        if exc.status in (404, 422):
            return False  # gone, or its finalizers changed since: decided again on its next event
        raise problem_from_api_error(
            exc, f"removing finalizer {finalizer} of {obj['kind']} {meta['namespace']}/{meta['name']}") from exc
    return True


def patch_envpool_status(namespace: str, name: str, status: Mapping[str, Any]) -> None:
    """Merge-patch an EnvPool's status subresource (from outside a kopf handler)."""
    path = _path(spec_mod.API_VERSION, spec_mod.KIND, namespace, name) + "/status"
    try:
        _request("PATCH", path, body={"status": dict(status)}, content_type=MERGE)
    except k8s_exceptions.ApiException as exc:
        if exc.status == 404:
            return  # the EnvPool was deleted meanwhile
        raise problem_from_api_error(exc, f"patching EnvPool {namespace}/{name} status") from exc


def post_event(pool: Mapping[str, Any], etype: str, reason: str, message: str) -> None:
    """Create a core/v1 Event about EnvPool ``pool`` now (``kubectl describe epool``).

    Not ``kopf.event``, which queues the Event and posts it later: where the Event must
    land before the status that records the change (:func:`reconcile.write_status`),
    an operator killed in between lost it for good (its successor sees no change).
    """
    meta = pool["metadata"]
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    involved = {"apiVersion": spec_mod.API_VERSION, "kind": spec_mod.KIND,
                "name": meta["name"], "namespace": meta["namespace"]}
    if meta.get("uid"):
        involved["uid"] = meta["uid"]
    event = {
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
        "involvedObject": involved, "type": etype, "reason": reason,
        "message": message[:1024], "firstTimestamp": now, "lastTimestamp": now, "count": 1,
        "source": {"component": FIELD_MANAGER}, "reportingComponent": FIELD_MANAGER,
    }
    try:
        _request("POST", _path("v1", "Event", meta["namespace"]), body=event,
                 content_type="application/json")
    except k8s_exceptions.ApiException as exc:
        raise problem_from_api_error(
            exc, f"posting Event {reason} about EnvPool {meta['namespace']}/{meta['name']}") from exc


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
