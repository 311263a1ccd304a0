"""Settings for every test session."""

from __future__ import annotations

import signal


def pytest_configure() -> None:
    # A runner started in the background by a non-interactive shell (CI's `cmd &`)
    # starts Python with SIGINT ignored, and then `_thread.interrupt_main()` (the
    # Ctrl-C of the interrupt tests) does nothing: those tests would hang or fail.
    # A user's Ctrl-C is what they simulate, so give the session Python's default.
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
