"""Where a running pool server's spec comes from.

In-cluster the source is the EnvPool itself: :class:`EnvPoolWatch` watches that
one object (its Role allows get/watch of it), so ``kubectl scale`` reaches the
server within a tick instead of after the kubelet's ConfigMap sync (up to about a
minute). :class:`ConfigFile` follows the ``--config`` document: the only source
outside a cluster, and the fallback while the watch is not connected.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from remote_env import kubeconfig, restarts
from remote_env import spec as spec_mod

log = logging.getLogger(__name__)

#: Seconds between checks of the config file for changes.
CONFIG_POLL_S = 2.0


class ConfigFile:
    """Re-reads the config file when its content changes (ConfigMaps swap a symlink)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._text = self._read()
        self._checked = time.monotonic()
        self.reload_now = threading.Event()

    def _read(self) -> str | None:
        try:
            return Path(self.path).read_text()
        except OSError:
            return None

    def poll(self) -> spec_mod.PoolSpec | None:
        """The new spec if the file changed since the last poll, else None.

        Raises:
            spec_mod.SpecError: the changed file is invalid.
        """
        if not self.reload_now.is_set() and time.monotonic() - self._checked < CONFIG_POLL_S:
            return None
        self.reload_now.clear()
        self._checked = time.monotonic()
        text = self._read()
        if text is None or text == self._text:
            return None
        self._text = text
        return spec_mod.load(self.path)


class EnvPoolWatch:
    """Watches EnvPool ``namespace/name`` on a daemon thread; each valid spec it sees
    goes to ``on_spec``. An invalid one is logged and skipped (the operator marks the
    EnvPool ``SpecValid=False``); a broken watch is re-opened with backoff.

    ``connected`` says a watch is open (the config file is the fallback while not).
    """

    def __init__(self, namespace: str, name: str, on_spec: Callable[[spec_mod.PoolSpec], None],
                 *, api: Any = None, timeout_s: int = 300) -> None:
        self.namespace = namespace
        self.name = name
        self.connected = False
        self._on_spec = on_spec
        self._api = api
        self._timeout_s = timeout_s
        self._stop = threading.Event()
        self._watch: Any = None
        self._thread = threading.Thread(target=self._run, name=f"watch-{name}", daemon=True)

    def start(self) -> EnvPoolWatch:
        self._thread.start()
        return self

    def _run(self) -> None:
        failures = 0
        while not self._stop.is_set():
            try:
                self._stream()
                failures = 0
            except Exception as exc:
                self.connected = False
                failures += 1
                delay = restarts.backoff(1.0, failures - 1, 30.0)
                log.warning("watch of EnvPool %s/%s failed (%s); the config file is followed "
                            "meanwhile, retrying in %.0fs", self.namespace, self.name, exc, delay)
                self._stop.wait(delay)
        self.connected = False

    def _stream(self) -> None:
        if self._api is None:
            self._api = kubeconfig.load().client.CustomObjectsApi()
        import kubernetes

        self._watch = kubernetes.watch.Watch()  # type: ignore[no-untyped-call]
        # A watch of one named object is what a Role with resourceNames allows.
        stream = self._watch.stream(
            self._api.list_namespaced_custom_object, spec_mod.GROUP, spec_mod.VERSION,
            self.namespace, spec_mod.PLURAL, field_selector=f"metadata.name={self.name}",
            timeout_seconds=self._timeout_s)
        self.connected = True
        for event in stream:
            if self._stop.is_set():
                break
            if event.get("type") in ("ADDED", "MODIFIED"):
                self._take(event["object"])
        self.connected = False

    def _take(self, obj: Any) -> None:
        try:
            pool = spec_mod.parse_spec(obj.get("spec") or {}, name=self.name,
                                       namespace=self.namespace)
        except spec_mod.SpecError as exc:
            log.error("EnvPool %s/%s changed but is invalid; keeping the running spec: %s",
                      self.namespace, self.name, exc)
            return
        self._on_spec(pool)

    def close(self) -> None:
        self._stop.set()
        if self._watch is not None:
            self._watch.stop()
