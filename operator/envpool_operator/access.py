"""Who may do what to a pool (pure builders): its RBAC and its NetworkPolicy.

ServiceAccount/Role/RoleBinding ``<name>-pool-server`` let the pool server read
its own EnvPool and patch only that EnvPool's status; NetworkPolicy
``<name>-ray`` lets only the pool's own pods and its trainers (label
:data:`~envpool_operator.names.TRAINER_LABEL`) reach the Ray pods, and trainers
without Ray (label :data:`~envpool_operator.names.LEASE_TRAINER_LABEL`) its lease
API and data ports only; Secret ``<name>-lease-token`` holds the lease API's token.
No Kubernetes client here; the caller adds ownerReferences::

    >>> from remote_env import spec
    >>> pool = spec.parse_spec({"env": {"id": "CartPole-v1"}, "replicas": 4}, name="cp")
    >>> build_role_binding(pool)["roleRef"]["name"]
    'cp-pool-server'
"""

from __future__ import annotations

import base64
from typing import Any

from envpool_operator import names
from remote_env import spec as spec_mod


def build_service_account(pool: spec_mod.PoolSpec) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": names.object_meta(pool, names.service_account_name(pool.name)),
        "automountServiceAccountToken": False,  # only the pool-server sidecar mounts it
    }


def build_role(pool: spec_mod.PoolSpec) -> dict[str, Any]:
    """Least privilege for the pool server: read its EnvPool, patch its status."""
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": names.object_meta(pool, names.service_account_name(pool.name)),
        "rules": [
            {
                "apiGroups": [spec_mod.GROUP],
                "resources": [spec_mod.PLURAL],
                "resourceNames": [pool.name],
                "verbs": ["get", "watch"],
            },
            {
                "apiGroups": [spec_mod.GROUP],
                "resources": [f"{spec_mod.PLURAL}/status"],
                "resourceNames": [pool.name],
                "verbs": ["get", "patch"],
            },
        ],
    }


def build_role_binding(pool: spec_mod.PoolSpec) -> dict[str, Any]:
    sa = names.service_account_name(pool.name)
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": names.object_meta(pool, sa),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": sa},
        "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": pool.namespace}],
    }


def build_network_policy(pool: spec_mod.PoolSpec) -> dict[str, Any]:
    """Ingress to the pool's Ray pods: from the pool's own pods and its trainers only.

    Ray client trainers (:data:`~envpool_operator.names.TRAINER_LABEL`) reach every
    port; trainers without Ray (:data:`~envpool_operator.names.LEASE_TRAINER_LABEL`)
    the lease API and the data port range, which hold only their lease's envs.

    Ray uses many ports (GCS 6379, dashboard 8265, client 10001, raylets, object
    managers, workers), so peers get every port; the pool server's metrics port is
    open to any pod (Prometheus; ``/status`` shows no lease ids or trainer
    addresses unless asked). Kubelet probes come from the node. Enforced only by a
    policy-enforcing CNI (Calico, Cilium, ...); policies add up, so a wider one of
    yours (trainers in another namespace) works beside it.
    """
    pool_pods = {"matchLabels": {names.POOL_LABEL: pool.name}}
    low, high = names.DATA_PORTS
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": names.object_meta(pool, names.network_policy_name(pool.name)),
        "spec": {
            "podSelector": pool_pods,
            "policyTypes": ["Ingress"],
            "ingress": [
                {"from": [{"podSelector": pool_pods},
                          {"podSelector": {"matchLabels": {names.TRAINER_LABEL: pool.name}}}]},
                {"from": [{"namespaceSelector": {}}],
                 "ports": [{"protocol": "TCP", "port": pool.metrics_port}]},
                # Trainers without Ray: the lease API (only the head's pool server
                # listens there) and the actors' data channels (only the workers' env
                # actors listen in that range); no Ray port.
                {"from": [{"podSelector": {"matchLabels": {
                    names.LEASE_TRAINER_LABEL: pool.name}}}],
                 "ports": [{"protocol": "TCP", "port": names.LEASE_API_PORT},
                           {"protocol": "TCP", "port": low, "endPort": high}]},
            ],
        },
    }


def build_lease_token_secret(pool: spec_mod.PoolSpec, token: str) -> dict[str, Any]:
    """Secret ``<name>-lease-token``: the bearer token of the pool's lease API.

    Created once and never updated by the operator (it cannot read Secrets, so it
    could not tell whether a token changed; a re-made token would lock out running
    trainers): the caller creates it and takes "already exists" as done. The pool
    server and trainers mount it; an admin rotates it by replacing the data, or brings
    their own by creating it first.

        >>> from remote_env import spec
        >>> pool = spec.parse_spec({"env": {"id": "CartPole-v1"}, "replicas": 4}, name="cp")
        >>> build_lease_token_secret(pool, "t0k")["data"]
        {'token': 'dDBr'}
    """
    if not token:
        raise ValueError("a lease token must not be empty")
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": names.object_meta(pool, names.lease_token_secret_name(pool.name)),
        "type": "Opaque",
        "data": {names.LEASE_TOKEN_KEY: base64.b64encode(token.encode()).decode()},
    }
