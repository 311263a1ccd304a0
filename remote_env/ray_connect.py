"""The one way this package starts or joins Ray.

``connect(address)``: ``address``, else ``$RAY_ADDRESS`` (set in Ray pods), else
``default``. ``"local"`` is always a fresh embedded Ray without a dashboard, never
the cluster that a bare ``ray.init()`` would find through
``/tmp/ray/ray_current_cluster`` (whatever ran last on the machine). A Ray this
process is already connected to is kept as it is.

With ``wait_s``, a cluster that does not answer yet is retried with backoff: a pool
server starts beside its Ray head, whose GCS takes seconds to come up; a trainer Job
starts beside ``kubectl apply``; and the head's Ray client server can fail to start a
client's server when several connect at once (seen on the test cluster's real node:
two trainers attaching together, one got "Starting Ray client server failed").
"""

from __future__ import annotations

import itertools
import logging
import os
import time
from typing import Any

from remote_env import restarts

log = logging.getLogger(__name__)


def connect(address: str | None = None, *, default: str = "local", wait_s: float = 0.0,
            **init_kwargs: Any) -> Any:
    """``ray.init`` unless initialized; returns the ``ray`` module.

    ``init_kwargs`` go to ``ray.init`` (``num_cpus``, ``namespace``...). Logs stay
    forwarded to the driver: ``log_to_driver=False`` made every actor call ~7x
    slower here (Ray 2.60). Raises ``ConnectionError`` when the cluster has not
    answered within ``wait_s``.
    """
    import ray

    if ray.is_initialized():
        return ray
    address = address or os.environ.get("RAY_ADDRESS") or default
    if address == "local":
        init_kwargs.setdefault("include_dashboard", False)
    deadline = time.monotonic() + wait_s
    for attempt in itertools.count():
        try:
            ray.init(address=address, **init_kwargs)
            return ray
        except ConnectionError as exc:
            left = deadline - time.monotonic()
            if left <= 0:
                raise
            pause = min(restarts.backoff(0.5, attempt, 5.0), left)
            log.info("waiting for the Ray cluster at %s (%s); retry in %.1fs", address,
                     str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__, pause)
            time.sleep(pause)
    raise AssertionError("unreachable")
