"""Who may do what to a pool (pure builders): its RBAC and its NetworkPolicy.

ServiceAccount/Role/RoleBinding ``<name>-pool-server`` let the pool server read
its own EnvPool and patch only that EnvPool's status; NetworkPolicy
``<name>-ray`` lets only the pool's own pods and its trainers (label
:data:`~envpool_operator.names.TRAINER_LABEL`) reach the Ray pods. No
Kubernetes client here; the caller adds ownerReferences::

    >>> from remote_env import spec
    >>> pool = spec.parse_spec({"env": {"id": "CartPole-v1"}, "replicas": 4}, name="cp")
    >>> build_role_binding(pool)["roleRef"]["name"]
    'cp-pool-server'
"""

from __future__ import annotations

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

    Ray uses many ports (GCS 6379, dashboard 8265, client 10001, raylets, object
    managers, workers), so peers get every port; the pool server's metrics port is
    open to any pod (Prometheus; ``/status`` shows no lease ids or trainer
    addresses unless asked). Kubelet probes come from the node. Enforced only by a
    policy-enforcing CNI (Calico, Cilium, ...); policies add up, so a wider one of
    yours (trainers in another namespace) works beside it.
    """
    pool_pods = {"matchLabels": {names.POOL_LABEL: pool.name}}
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
            ],
        },
    }
