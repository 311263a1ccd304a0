"""The one way this package starts or joins Ray.

``connect(address)``: ``address``, else ``$RAY_ADDRESS`` (set in Ray pods), else
``default``. ``"local"`` is always a fresh embedded Ray without a dashboard, never
the cluster that a bare ``ray.init()`` would find through
``/tmp/ray/ray_current_cluster`` (whatever ran last on the machine). A Ray this
process is already connected to is kept as it is.
"""

from __future__ import annotations

import os
from typing import Any


def connect(address: str | None = None, *, default: str = "local", **init_kwargs: Any) -> Any:
    """``ray.init`` unless initialized; returns the ``ray`` module.

    ``init_kwargs`` go to ``ray.init`` (``num_cpus``, ``namespace``...). Logs stay
    forwarded to the driver: ``log_to_driver=False`` made every actor call ~7x
    slower here (Ray 2.60).
    """
    import ray

    if ray.is_initialized():
        return ray
    address = address or os.environ.get("RAY_ADDRESS") or default
    if address == "local":
        init_kwargs.setdefault("include_dashboard", False)
    ray.init(address=address, **init_kwargs)
    return ray
