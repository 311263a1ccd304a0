"""The one Kubernetes credential loader (in-cluster service account, else kubeconfig),
and the one answer to "am I in a pod?" (which decides what our endpoints bind to).

Used by the operator (``envpool_operator.kube``) and the pool server (its EnvPool
watch and ``status.pool`` reports). ``kubernetes`` is imported only when called.
"""

from __future__ import annotations

import os
from typing import Any


def in_pod() -> bool:
    """True inside a Kubernetes pod (the kubelet sets ``KUBERNETES_SERVICE_HOST``)."""
    return bool(os.environ.get("KUBERNETES_SERVICE_HOST"))


def default_bind_address() -> str:
    """Where our HTTP endpoints listen unless told: loopback, except in a pod.

    In a pod, 0.0.0.0 is the pod's own network namespace (its IP and loopback), which
    the kubelet's probes and Prometheus need; on a laptop or a shared host nothing is
    exposed beyond it.
    """
    return "0.0.0.0" if in_pod() else "127.0.0.1"


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
