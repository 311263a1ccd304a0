"""The one Kubernetes credential loader: in-cluster service account, else kubeconfig.

Used by the operator (``envpool_operator.kube``) and the pool server (its EnvPool
watch and ``status.pool`` reports). ``kubernetes`` is imported only when called.
"""

from __future__ import annotations

from typing import Any


def load() -> Any:
    """Load credentials (in a pod: its service account; else ``$KUBECONFIG`` or
    ``~/.kube/config``) and return the ``kubernetes`` package."""
    import kubernetes

    config: Any = kubernetes.config  # untyped module
    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config()
    return kubernetes
