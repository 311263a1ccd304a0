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
Each try is bounded by Ray's own settings (:func:`_bounded_gcs_connect`): by default one
``ray.init`` to a GCS address where nothing answers would outlast any ``wait_s``.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import math
import os
import sys
import time
from collections.abc import Iterator
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
    address = address or os.environ.get("RAY_ADDRESS") or default
    if "ray" in sys.modules and sys.modules["ray"].is_initialized():
        return sys.modules["ray"]
    # A GCS address (or "auto") is bounded even without wait_s: Ray's own default
    # retries a GCS where nothing answers for ~14 min before it raises.
    bounded = (_bounded_gcs_connect(wait_s)
               if address != "local" and not address.startswith("ray://")
               else contextlib.nullcontext())
    with bounded:
        import ray

        if ray.is_initialized():
            return ray
        if address == "local":
            init_kwargs.setdefault("include_dashboard", False)
        return _connect(ray, address, wait_s, init_kwargs)


def _connect(ray: Any, address: str, wait_s: float, init_kwargs: dict[str, Any]) -> Any:
    deadline = time.monotonic() + wait_s
    for attempt in itertools.count():
        try:
            ray.init(address=address, **init_kwargs)
            return ray
        except ConnectionError as exc:
            left = deadline - time.monotonic()
            if left <= 0:
                if wait_s > 0 or address.startswith("ray://"):
                    raise
                # Ray's message names the address it resolved, not the one given
                raise ConnectionError(
                    f"no Ray cluster answered at {address!r} ({exc}); one try was made: "
                    "pass wait_s (envpool serve: --connect-timeout) to wait for a cluster "
                    "that is starting") from exc
            pause = min(restarts.backoff(0.5, attempt, 5.0), left)
            log.info("waiting for the Ray cluster at %s (%s); retry in %.1fs", address,
                     str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__, pause)
            time.sleep(pause)
    raise AssertionError("unreachable")


@contextlib.contextmanager
def _bounded_gcs_connect(wait_s: float) -> Iterator[None]:
    """Ray's own settings that make one ``ray.init`` to a GCS address give up in seconds.

    By default (Ray 2.60, measured here against 127.0.0.1:<a port where nothing
    listens>) ``ray.init`` makes 20 GCS client tries (``NUM_REDIS_GET_RETRIES``), each
    waiting 5 s for the GCS channel and 5 s for its pubsub channel
    (``gcs_rpc_server_connect_timeout_s``), then 30 s for the cluster id
    (``py_gcs_connect_timeout_s``), then 1 s: 41 s a try, ~14 min before it raises, which
    no ``wait_s`` bounded. With these it makes one try (``gcs_server_port_wait_time_s``,
    read at each ``ray.init``) of 1 + 1 + max(2, wait_s / 4, at most Ray's 30) + 1 s, and
    :func:`connect` tries again until ``wait_s``: it gives up at most one try late
    (``wait_s`` 5: after ~10 s). Without ``wait_s`` it makes one try with Ray's own
    timeouts (41 s measured) and raises, instead of Ray's ~14 min.

    They are environment variables, as Ray documents its settings; a setting already
    in the environment is the user's and is kept, and the environment is restored
    afterwards. Ray's C++ part reads its ones when ``ray`` is first imported and when
    its config is initialized again: in a process that imported ``ray`` before
    (``envpool serve`` does to check a runtimeEnv) that is done here, before
    ``ray.init``, and again after a connect that failed, for Ray's defaults back. A
    connected Ray keeps them (the two only bound a connect).
    """
    knobs = {"RAY_gcs_server_port_wait_time_s": "1"}
    if wait_s > 0:
        knobs |= {
            "RAY_gcs_rpc_server_connect_timeout_s": "1",
            "RAY_py_gcs_connect_timeout_s": str(max(2, math.ceil(min(wait_s, 120.0) / 4))),
        }
    added = [k for k in knobs if k not in os.environ]
    os.environ.update({k: knobs[k] for k in added})
    try:
        if added:
            _reread_ray_config()
        yield
    finally:
        for k in added:
            os.environ.pop(k, None)
        if added:
            _reread_ray_config()


def _reread_ray_config() -> None:
    """Ray's C++ config read again from the environment (defaults for the rest), as
    ``import ray`` reads it: only in a process that has imported ``ray`` and is not
    connected (a connected one has its cluster's settings). ``ray._config``: Ray 2.60."""
    ray = sys.modules.get("ray")
    if ray is None or ray.is_initialized():
        return
    config = getattr(ray, "_config", None)
    if config is None or not hasattr(config, "initialize"):
        log.debug("ray._config.initialize is gone: Ray's connect timeouts stay as read at import")
        return
    config.initialize("")
