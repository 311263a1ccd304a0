"""Ctrl-C from a timer thread (``_thread.interrupt_main``), for the issue-#28 tests."""

from __future__ import annotations

import _thread
import threading
from collections.abc import Callable
from typing import Any


class Interrupter:
    """Ctrl-C from a timer thread, ``delay_s`` after start, only while ``fn`` runs: an
    interrupt that would land after it returned is not sent (the call's result would
    be lost by this test, not by the env)."""

    def __init__(self, delay_s: float) -> None:
        self._lock = threading.Lock()
        self._running = True
        self.sent = False
        self._timer = threading.Timer(delay_s, self._fire)

    def _fire(self) -> None:
        with self._lock:
            if self._running:
                self.sent = True
                _thread.interrupt_main()

    def start(self) -> None:
        """Start the delay now: for a caller that starts it from inside ``fn`` (see
        :meth:`run`), once, and only while ``fn`` runs."""
        self._timer.start()  # a short delay may fire before start() returns

    def run(self, fn: Callable[[], Any], *, start: bool = True) -> tuple[bool, Any]:
        """(interrupted, result) of ``fn()``. ``start=False``: ``fn`` calls :meth:`start`
        itself, where the interrupt may begin to land (started here, a delay of ~0 can
        land before ``fn`` is entered at all)."""
        try:
            if start:
                self.start()
            result = fn()
        except KeyboardInterrupt:
            self._stop()
            return True, None
        self._stop()
        return False, result

    def _stop(self) -> None:
        try:
            with self._lock:
                self._running = False
            self._timer.cancel()
            if self._timer.ident is not None:  # started (see start=False)
                self._timer.join()
        except KeyboardInterrupt:  # sent just as fn returned: its result stands
            pass


def interrupted(delay_s: float, fn: Callable[[], Any]) -> bool:
    was, _ = Interrupter(delay_s).run(fn)
    return was
