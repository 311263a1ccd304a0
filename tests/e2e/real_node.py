"""The test cluster's real node (tests/cluster/node.sh): where its pods go and what they run.

Pods run on the real node only when they ask for it (``NODE_SELECTOR`` and
``TOLERATIONS``); everything else stays on the kwok nodes. The project image is
built offline by ``tests/cluster/image.sh`` and imported into the node's
containerd, so pods use it with ``imagePullPolicy: Never``.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

NODE_SELECTOR = {"envpool.dev/node": "real"}
TOLERATIONS = [{"key": "envpool.dev/real-node", "operator": "Equal", "value": "true", "effect": "NoSchedule"}]

# what the restricted Pod Security Standard asks of a pod and its containers
RESTRICTED_POD = {
    "runAsNonRoot": True,
    "runAsUser": 1000,
    "runAsGroup": 100,
    "seccompProfile": {"type": "RuntimeDefault"},
}
RESTRICTED_CONTAINER = {
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "readOnlyRootFilesystem": True,
    "runAsNonRoot": True,
}


@dataclass(frozen=True)
class RealNode:
    name: str
    image: str  # the project image (localhost/envpool:dev-<source hash>)
    state_dir: Path
    #: Debian's redis-server (localhost/envpool-redis:<version>-<key>, image.sh): the
    #: Redis the operator runs for a pool with GCS fault tolerance (the chart's
    #: redis.image). "": node.sh imported none (an older cluster state).
    redis_image: str = ""
    #: a learner's image without Ray (localhost/envpool-trainer:dev-<source hash>)
    trainer_image: str = ""

    def pod(
        self,
        name: str,
        command: list[str],
        *,
        namespace: str,
        labels: dict[str, str] | None = None,
        restart: str = "Never",
        resources: dict[str, Any] | None = None,
        ports: list[int] | None = None,
        readiness_port: int | None = None,
        security: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """A pod of the project image on the real node, restricted security by default."""
        container: dict[str, Any] = {
            "name": "main",
            "image": self.image,
            "imagePullPolicy": "Never",
            "command": command,
            "securityContext": dict(RESTRICTED_CONTAINER if security is None else security),
            "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
            "resources": resources or {"requests": {"cpu": "50m", "memory": "64Mi"}},
        }
        if ports:
            container["ports"] = [{"containerPort": p} for p in ports]
        if readiness_port:
            container["readinessProbe"] = {
                "tcpSocket": {"port": readiness_port},
                "periodSeconds": 1,
            }
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "labels": labels or {"app": name}},
            "spec": {
                "nodeSelector": NODE_SELECTOR,
                "tolerations": TOLERATIONS,
                "restartPolicy": restart,
                "terminationGracePeriodSeconds": 2,
                "automountServiceAccountToken": False,
                "securityContext": RESTRICTED_POD,
                "containers": [container],
                "volumes": [{"name": "tmp", "emptyDir": {}}],
            },
        }

    def record(self, figure: str, value: float) -> None:
        """Keep a measured figure (seconds) for the README (state/figures/real-node.json)."""
        path = self.state_dir / "figures" / "real-node.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        data = json.loads(path.read_text()) if path.exists() else {}
        data[figure] = {"value": round(value, 3), "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        path.write_text(json.dumps(data, indent=2, sort_keys=True))


def read_images_env(state_dir: Path) -> dict[str, str]:
    """KEY=VALUE lines node.sh wrote when it imported the images."""
    path = state_dir / "node" / "images.env"
    out: dict[str, str] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            if "=" in line:
                key, value = line.split("=", 1)
                out[key] = value
    return out
