"""Where a running pool server's spec comes from.

:class:`ConfigFile` follows the EnvPool document the server was started with
(``--config``; a ConfigMap mount in-cluster, which the kubelet refreshes late).
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

from remote_env import spec as spec_mod

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
