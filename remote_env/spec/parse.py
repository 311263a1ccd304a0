"""EnvPool documents and specs (dicts or YAML files) -> :class:`~remote_env.spec.model.PoolSpec`.

The CRD schema rejects what the API server can check; this repeats those checks
(the same YAML runs without an API server: ``envpool run -f pool.yaml``; an old
CRD may be installed) and adds what a schema cannot express: resource quantities
that make sense together and the worker count against the operator's limits.
Stdlib and PyYAML only.

Example:
    >>> pool = parse_manifest({
    ...     "apiVersion": "envpool.dev/v1alpha1", "kind": "EnvPool",
    ...     "metadata": {"name": "cartpole"},
    ...     "spec": {"env": {"id": "CartPole-v1"}, "replicas": 16, "envsPerActor": 8},
    ... })
    >>> pool.replicas, pool.envs_per_actor, pool.ray_namespace, pool.workers
    (16, 8, 'envpool-cartpole', 1)
    >>> try:
    ...     parse_spec({"env": {}, "replicas": 0}, name="cp")
    ... except checker.SpecError as exc:
    ...     for error in exc.errors:
    ...         print(error)
    spec.env: exactly one of env.id (a gymnasium id, e.g. CartPole-v1) or env.entrypoint ('package.module:callable') must be set, got neither
    spec.replicas: must be in [1, 100000], got 0
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from remote_env.spec import checker, fields, model


def _parse_env(c: checker.Checker, raw: Any) -> model.EnvSpec:
    env = c.mapping(raw, "spec.env")
    c.known(env, "spec.env")
    env_id = c.string(env, "spec.env.id")
    entrypoint = c.string(env, "spec.env.entrypoint")
    if (env_id is None) == (entrypoint is None):
        got = "both" if env_id is not None else "neither"
        c.fail("spec.env", "exactly one of env.id (a gymnasium id, e.g. CartPole-v1) or "
                           f"env.entrypoint ('package.module:callable') must be set, got {got}")
    # Whether gymnasium knows the id is asked where the env is made (no gymnasium here):
    # remote_env.entrypoints.env_spec, with the same forms in its message.
    if env_id and not fields.ENV_ID_RE.match(env_id):
        c.fail("spec.env.id", "expected a gymnasium id such as CartPole-v1, or 'module:EnvId' "
                              "for an env another package registers (the module is imported "
                              f"first, e.g. 'ale_py:ALE/Pong-v5'), got {env_id!r}")
    if entrypoint is not None and not fields.ENTRYPOINT_RE.match(entrypoint):
        c.fail("spec.env.entrypoint",
               f"expected 'package.module:callable' (importable names), got {entrypoint!r}")
    kwargs = c.mapping(env.get("kwargs"), "spec.env.kwargs")
    return model.EnvSpec(id=env_id, entrypoint=entrypoint, kwargs=dict(kwargs),
                         multi_agent=c.boolean(env, "spec.env.multiAgent"))


def _parse_tolerations(c: checker.Checker, raw: Any, where: str) -> tuple[Mapping[str, Any], ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        c.fail(f"{where}.tolerations", f"expected a list, got {raw!r}")
        return ()
    c.count(raw, f"{where}.tolerations", fields.MAX_TOLERATIONS)
    out: list[Mapping[str, Any]] = []
    for i, item in enumerate(raw):
        path = f"{where}.tolerations[{i}]"
        tol = c.mapping(item, path)
        c.known(tol, path, "toleration")
        for key, most in (("key", fields.MAX_TOLERATION_KEY_LENGTH),
                          ("value", fields.MAX_LABEL_VALUE_LENGTH)):
            got = tol.get(key)
            if got is not None and not isinstance(got, str):
                c.fail(f"{path}.{key}", f"expected a string, got {got!r}")
            elif got is not None:
                c.length(got, f"{path}.{key}", None, most)
        op = tol.get("operator", "Equal")
        if op not in fields.TOLERATION_OPERATORS:
            c.fail(f"{path}.operator", f"expected Exists or Equal, got {op!r}")
        effect = tol.get("effect")
        if effect is not None and effect not in fields.TOLERATION_EFFECTS:
            c.fail(f"{path}.effect", f"expected one of {', '.join(fields.TOLERATION_EFFECTS)}")
        seconds = tol.get("tolerationSeconds")
        if seconds is not None and (isinstance(seconds, bool) or not isinstance(seconds, int)):
            c.fail(f"{path}.tolerationSeconds", f"expected an integer, got {seconds!r}")
        if op == "Exists" and tol.get("value"):
            c.fail(f"{path}.value", "must be empty when operator is Exists")
        if op == "Exists" and not tol.get("key"):
            # Kubernetes reads that as "tolerate every taint" (NoExecute evictions,
            # control-plane and dedicated nodes included): never what a pool means.
            c.fail(f"{path}.key", "required with operator Exists (an empty key tolerates every "
                                  "taint of every node); name the taint's key")
        out.append(dict(tol))
    return tuple(out)


def _parse_node_selector(c: checker.Checker, raw: Any, where: str) -> dict[str, str]:
    path = f"{where}.nodeSelector"
    node_selector = c.mapping(raw, path)
    c.count(node_selector, path, fields.MAX_NODE_SELECTOR)
    for key, val in node_selector.items():
        if not isinstance(val, str):
            c.fail(f"{path}.{key}", f"expected a string, got {val!r}")
        else:
            c.length(val, f"{path}.{key}", None, fields.MAX_LABEL_VALUE_LENGTH)
    return {str(k): str(v) for k, v in node_selector.items()}


def _parse_secret_names(c: checker.Checker, raw: Any) -> tuple[str, ...]:
    path = "spec.ray.envFromSecrets"
    if raw is None:
        return ()
    if not isinstance(raw, list):
        c.fail(path, f"expected a list of Secret names, got {raw!r}")
        return ()
    c.count(raw, path, fields.MAX_ENV_FROM_SECRETS)
    for i, name in enumerate(raw):
        if not isinstance(name, str) or not fields.SECRET_NAME_RE.match(name) \
                or len(name) > fields.MAX_SECRET_NAME_LENGTH:
            c.fail(f"{path}[{i}]", f"expected a Secret name (lower-case DNS subdomain), got "
                                   f"{name!r}")
    return tuple(str(n) for n in raw)


def _parse_ray(c: checker.Checker, raw: Any) -> model.RaySpec:
    ray = c.mapping(raw, "spec.ray")
    c.known(ray, "spec.ray")
    version = c.string(ray, "spec.ray.version") or fields.DEFAULT_RAY_VERSION
    if not fields.RAY_VERSION_RE.match(version):
        c.fail("spec.ray.version", f"expected a Ray release such as 2.60.0, got {version!r}")
    auth_mode = c.string(ray, "spec.ray.authMode") or "token"
    parts = tuple(int(x) for x in version.split(".")) if fields.RAY_VERSION_RE.match(version) \
        else None
    if auth_mode == "token" and parts is not None and parts < fields.MIN_RAY_TOKEN_AUTH:
        c.fail("spec.ray.authMode",
               f"token needs Ray >= {'.'.join(map(str, fields.MIN_RAY_TOKEN_AUTH))}, got "
               f"ray.version={version}; raise ray.version or set authMode: disabled")
    image = c.string(ray, "spec.ray.image") or ""
    if any(ch.isspace() for ch in image):
        c.fail("spec.ray.image", f"an image reference has no whitespace, got {image!r}")
    head = c.mapping(ray.get("head"), "spec.ray.head")
    c.known(head, "spec.ray.head")
    worker = c.mapping(ray.get("worker"), "spec.ray.worker")
    c.known(worker, "spec.ray.worker")
    return model.RaySpec(
        version=version,
        image=image,
        head=model.HeadSpec(
            resources=c.resources(head.get("resources"), "spec.ray.head.resources"),
            node_selector=_parse_node_selector(c, head.get("nodeSelector"), "spec.ray.head"),
            tolerations=_parse_tolerations(c, head.get("tolerations"), "spec.ray.head"),
        ),
        worker=model.WorkerSpec(
            resources=c.resources(worker.get("resources"), "spec.ray.worker.resources"),
            envs_per_worker=c.integer(worker, "spec.ray.worker.envsPerWorker"),
            node_selector=_parse_node_selector(c, worker.get("nodeSelector"), "spec.ray.worker"),
            tolerations=_parse_tolerations(c, worker.get("tolerations"), "spec.ray.worker"),
        ),
        runtime_env=dict(c.mapping(ray.get("runtimeEnv"), "spec.ray.runtimeEnv")),
        auth_mode=auth_mode,
        env_from_secrets=_parse_secret_names(c, ray.get("envFromSecrets")),
    )


def _parse_fault_tolerance(c: checker.Checker, raw: Any) -> model.FaultTolerance:
    ft = c.mapping(raw, "spec.faultTolerance")
    c.known(ft, "spec.faultTolerance")
    return model.FaultTolerance(
        restart_failed_envs=c.boolean(ft, "spec.faultTolerance.restartFailedEnvs"),
        step_timeout_seconds=c.number(ft, "spec.faultTolerance.stepTimeoutSeconds"),
        max_restarts=c.integer(ft, "spec.faultTolerance.maxRestarts"),
        restart_backoff_seconds=c.number(ft, "spec.faultTolerance.restartBackoffSeconds"),
        start_timeout_seconds=c.number(ft, "spec.faultTolerance.startTimeoutSeconds"),
    )


def _optional_integer(c: checker.Checker, value: Mapping[str, Any], path: str) -> int | None:
    return c.integer(value, path) if path.rsplit(".", 1)[1] in value else None


def _parse_autoscaling(c: checker.Checker, raw: Any) -> model.Autoscaling | None:
    if raw is None:
        return None
    path = "spec.autoscaling"
    auto = c.mapping(raw, path)
    c.known(auto, path)
    lo = c.integer(auto, f"{path}.minReplicas")
    hi = c.integer(auto, f"{path}.maxReplicas")
    if lo > hi:
        c.fail(f"{path}.minReplicas", f"{fields.MIN_MAX_MESSAGE}, got {lo} > {hi}")
    buffer_envs = _optional_integer(c, auto, f"{path}.bufferEnvs")
    buffer_percent = _optional_integer(c, auto, f"{path}.bufferPercent")
    if ("bufferEnvs" in auto) == ("bufferPercent" in auto):
        got = "both" if "bufferEnvs" in auto else "neither"
        c.fail(path, f"{fields.BUFFER_FORMS_MESSAGE}, got {got}")
    return model.Autoscaling(
        min_replicas=lo, max_replicas=hi, buffer_envs=buffer_envs, buffer_percent=buffer_percent,
        scale_down_delay_seconds=c.integer(auto, f"{path}.scaleDownDelaySeconds"),
    )


def _parse_update_strategy(c: checker.Checker, raw: Any) -> model.UpdateStrategy:
    path = "spec.updateStrategy"
    strategy = c.mapping(raw, path)
    c.known(strategy, path)
    leased_actors = c.string(strategy, f"{path}.leasedActors") or \
        fields.LEASED_ACTOR_POLICIES[0]
    grace = c.integer(strategy, f"{path}.leasedGraceSeconds",
                      fields.DEFAULT_LEASED_GRACE_SECONDS)
    where = f"{path}.maxUnavailable"
    got = strategy.get("maxUnavailable", fields.DEFAULT_MAX_UNAVAILABLE)
    max_unavailable: int | str = fields.DEFAULT_MAX_UNAVAILABLE
    if isinstance(got, bool) or not isinstance(got, (int, str)):
        c.fail(where, f"expected an integer >= 1 or a percentage such as '25%', got {got!r}")
    elif isinstance(got, int):
        if not 1 <= got <= fields.MAX_REPLICAS:
            # No surge (the pods are sized for replicas): 0 would never replace an actor.
            c.fail(where, f"an env count must be in [1, {fields.MAX_REPLICAS}] (0 would never "
                          f"replace an actor: the pool adds none beside the old), got {got}")
        else:
            max_unavailable = got
    else:
        m = fields.PERCENT_RE.match(got)
        if m is None:
            c.fail(where, f"expected an integer >= 1 or a percentage such as '25%' (digits "
                          f"then %), got {got!r}")
        elif not 1 <= int(m.group(1)) <= 100:
            c.fail(where, f"a percentage must be in [1%, 100%] (of replicas), got {got!r}")
        else:
            max_unavailable = got
    return model.UpdateStrategy(max_unavailable, leased_actors, grace)


def _parse_head_fault_tolerance(c: checker.Checker, raw: Any) -> model.HeadFaultTolerance:
    path = "spec.headFaultTolerance"
    hft = c.mapping(raw, path)
    c.known(hft, path)
    address = c.string(hft, f"{path}.redisAddress") or ""
    if address and not fields.REDIS_ADDRESS_RE.match(address):
        c.fail(f"{path}.redisAddress", f"expected host:port (e.g. redis.infra.svc:6379), got "
                                       f"{address!r}")
    secret = c.string(hft, f"{path}.passwordSecret") or ""
    if secret and not fields.SECRET_NAME_RE.match(secret):
        c.fail(f"{path}.passwordSecret", f"expected a Secret name (lower-case DNS subdomain), "
                                         f"got {secret!r}")
    if secret and not address:
        c.fail(f"{path}.passwordSecret", fields.PASSWORD_SECRET_MESSAGE)
    return model.HeadFaultTolerance(
        enabled=c.boolean(hft, f"{path}.enabled", default=fields.DEFAULT_HEAD_FAULT_TOLERANCE),
        redis_address=address, password_secret=secret,
        password_key=c.string(hft, f"{path}.passwordKey") or fields.DEFAULT_REDIS_PASSWORD_KEY)


def parse_spec(
    spec: Mapping[str, Any], *, name: str, namespace: str = "default",
    limits: model.Limits | None = None,
) -> model.PoolSpec:
    """Validate an EnvPool's ``spec`` (camelCase, as in the CRD) and fill its defaults.

    Args:
        spec: the ``spec`` mapping as stored by the API server (or read from YAML).
        name: the EnvPool's ``metadata.name`` (children are named after it).
        namespace: the EnvPool's namespace.
        limits: operator-side bounds, e.g. the most worker pods one pool may ask for.

    Raises:
        SpecError: with every problem found, each naming the field and what was expected.
    """
    limits = limits or model.Limits()
    c = checker.Checker()
    if not isinstance(name, str) or not fields.NAME_RE.match(name) \
            or len(name) > fields.MAX_NAME_LENGTH:
        c.fail("metadata.name",
               f"expected a DNS label of at most {fields.MAX_NAME_LENGTH} characters starting "
               f"with a letter (children are named after it), got {name!r}")
    spec = c.mapping(spec, "spec")
    c.known(spec, "spec")
    env = _parse_env(c, spec.get("env"))
    replicas = c.integer(spec, "spec.replicas")
    autoscaling = _parse_autoscaling(c, spec.get("autoscaling"))
    # An autoscaled pool's replicas move: its default actor size follows the floor
    # instead, so actors added later are as large as the first ones.
    smallest = replicas if autoscaling is None else autoscaling.min_replicas
    envs_per_actor = c.integer(spec, "spec.envsPerActor",
                               min(fields.DEFAULT_ENVS_PER_ACTOR, smallest))
    if autoscaling is not None and envs_per_actor > autoscaling.min_replicas:
        c.fail("spec.autoscaling.minReplicas",
               f"{fields.MIN_ACTOR_MESSAGE} (envsPerActor={envs_per_actor}), got "
               f"{autoscaling.min_replicas}")
    if envs_per_actor > replicas:
        c.fail("spec.envsPerActor", f"must be <= replicas={replicas} (an actor hosts "
                                    f"envsPerActor of the pool's sub-envs), got {envs_per_actor}")
    autoreset = c.string(spec, "spec.autoresetMode") or "NextStep"
    ft = _parse_fault_tolerance(c, spec.get("faultTolerance"))
    ray = _parse_ray(c, spec.get("ray"))
    if envs_per_actor > ray.worker.envs_per_worker:
        c.fail("spec.envsPerActor",
               f"must be <= ray.worker.envsPerWorker={ray.worker.envs_per_worker} (an actor "
               f"cannot span worker pods), got {envs_per_actor}")
    metrics = c.mapping(spec.get("metrics"), "spec.metrics")
    c.known(metrics, "spec.metrics")
    port = c.integer(metrics, "spec.metrics.port")
    owner = fields.head_port_owner(port)
    if owner is not None:
        taken = ", ".join([str(p) for p in fields.RAY_PORTS]
                          + [f"{lo}-{hi}" for lo, hi, _ in fields.HEAD_PORT_RANGES])
        free = ", ".join(str(lo) if lo == hi else f"{lo}-{hi}"
                         for lo, hi in fields.free_head_ports())
        c.fail("spec.metrics.port", f"{port} is taken by the Ray head ({taken}): "
               f"{port} is {owner}; pick another (default "
               f"{fields.FIELDS['spec.metrics.port'].default}; free on the head: {free})")
    pool = model.PoolSpec(
        name=name,
        namespace=namespace,
        env=env,
        replicas=replicas,
        envs_per_actor=envs_per_actor,
        threads_per_actor=c.integer(spec, "spec.threadsPerActor"),
        batch_wait_ms=c.integer(spec, "spec.batchWaitMs"),
        autoreset_mode=autoreset,
        fault_tolerance=ft,
        ray=ray,
        metrics_port=port,
        suspend=c.boolean(spec, "spec.suspend"),
        autoscaling=autoscaling,
        update_strategy=_parse_update_strategy(c, spec.get("updateStrategy")),
        head_fault_tolerance=_parse_head_fault_tolerance(c, spec.get("headFaultTolerance")),
    )
    if not c.errors and pool.desired_workers > limits.max_workers:
        c.fail("spec.replicas",
               f"needs {pool.desired_workers} worker pods ({replicas} envs / "
               f"{pool.actors_per_worker * envs_per_actor} per worker) but this operator "
               f"allows at most {limits.max_workers}; raise ray.worker.envsPerWorker or "
               "lower replicas")
    if not c.errors and autoscaling is not None \
            and pool.workers_for(autoscaling.max_replicas) > limits.max_workers:
        c.fail("spec.autoscaling.maxReplicas",
               f"needs {pool.workers_for(autoscaling.max_replicas)} worker pods at "
               f"{autoscaling.max_replicas} envs but this operator allows at most "
               f"{limits.max_workers}; raise ray.worker.envsPerWorker or lower maxReplicas")
    if c.errors:
        raise checker.SpecError(c.errors)
    return pool


def parse_manifest(doc: Mapping[str, Any], *, name: str | None = None) -> model.PoolSpec:
    """An EnvPool document (``apiVersion``/``kind``/``metadata``/``spec``) or a bare spec.

    A bare spec (no ``spec`` key, e.g. ``{"env": ..., "replicas": 4}``) needs ``name``.
    ``name`` also overrides ``metadata.name`` when given.

    Raises:
        SpecError: the document is not an EnvPool or its spec is invalid.
    """
    if not isinstance(doc, Mapping):
        raise checker.SpecError(
            [f"expected an EnvPool document (a mapping), got {type(doc).__name__}"])
    if "spec" not in doc:
        if name is None:
            raise checker.SpecError(["a bare spec needs a pool name (metadata.name is missing)"])
        return parse_spec(doc, name=name)
    errors: list[str] = []
    kind = doc.get("kind", fields.KIND)
    if kind != fields.KIND:
        errors.append(f"kind: expected {fields.KIND}, got {kind!r}")
    api = doc.get("apiVersion", fields.API_VERSION)
    if not isinstance(api, str) or not api.startswith(f"{fields.GROUP}/"):
        errors.append(f"apiVersion: expected {fields.API_VERSION}, got {api!r}")
    meta = doc.get("metadata") or {}
    if not isinstance(meta, Mapping):
        errors.append(f"metadata: expected an object, got {meta!r}")
        meta = {}
    pool_name = name if name is not None else meta.get("name")
    if pool_name is None:
        errors.append("metadata.name: required (the pool's name)")
    if errors:
        raise checker.SpecError(errors)
    return parse_spec(doc["spec"], name=str(pool_name),
                      namespace=str(meta.get("namespace") or "default"))


def loads(text: str, *, name: str | None = None, source: str = "") -> model.PoolSpec:
    """One EnvPool YAML document (text) -> a :class:`PoolSpec`.

    Raises:
        SpecError: bad YAML, not one EnvPool, or an invalid spec; prefixed by ``source``.
    """
    import yaml

    try:
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as exc:
        raise checker.SpecError([f"invalid YAML: {exc}"], source) from exc
    if len(docs) != 1:
        raise checker.SpecError([f"expected one EnvPool document, found {len(docs)}"], source)
    try:
        return parse_manifest(docs[0], name=name)
    except checker.SpecError as exc:
        raise checker.SpecError(exc.errors, source) from None


def load(path: str | Path, *, name: str | None = None) -> model.PoolSpec:
    """Read an EnvPool YAML file (one document) into a :class:`PoolSpec`.

    Raises:
        SpecError: unreadable file, bad YAML, not an EnvPool, or an invalid spec;
            the message starts with the path.
    """
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise checker.SpecError([f"cannot read: {exc.strerror or exc}"], str(path)) from exc
    return loads(text, name=name, source=str(path))
