"""Ctrl-C on the driver lands only where the vector env's state is whole.

Why: a ``KeyboardInterrupt`` is raised between any two bytecodes. Landing between
"the reply was read" and "the call is off the books" lost the reply (a call
neither in flight nor returned), and landing inside a socket read lost part of a
frame, desyncing the stream for good. So while a vector env call runs (an
*operation*, :func:`deferred`), SIGINT is only recorded; it is raised at the next
*interruptible wait* (:func:`interruptible`: blocking in ``poll``, ``ray.wait``,
``sleep``, where nothing is half done), or when the operation ends. The
operations themselves say what an interrupt at their end means (a result put back
to be returned again, see :mod:`remote_env.driver.vector`).

How: one SIGINT handler, installed over the program's own (a callable one: the
default ``KeyboardInterrupt`` or the user's) the first time an operation runs in
the main thread, and left there: outside operations, and inside interruptible
waits, it calls that handler at once, so the program sees no difference. Installing
it per call would cost two ``sigaction`` system calls (~8 us on 2 busy cores) on
every ``recv``. Signals only ever run in the main thread, so other threads'
operations are not deferred (nothing can interrupt them).
"""

from __future__ import annotations

import _signal  # type: ignore[import-not-found]  # the C module: no enum per call
import signal
import threading
from types import FrameType
from typing import Any


class _Deferral:
    depth = 0  # operations running in the main thread (nested calls count once each)
    waiting = False  # inside an interruptible wait
    pending: tuple[int, FrameType | None] | None = None
    previous: Any = None  # the handler ours stands in front of


_D = _Deferral()


def _handler(signum: int, frame: FrameType | None) -> None:
    if _D.depth == 0 or _D.waiting:
        _deliver(signum, frame)
    else:
        _D.pending = (signum, frame)


def _deliver(signum: int, frame: FrameType | None) -> None:
    previous = _D.previous
    if callable(previous):
        previous(signum, frame)


def _install() -> bool:
    """Ours in front of the program's SIGINT handler; False: nothing to defer (the
    signal is ignored, or kills the process as SIG_DFL does)."""
    current = _signal.getsignal(signal.SIGINT)  # not signal's: it makes an enum (~4 us)
    if current is _handler:
        return True
    if not callable(current):
        return False
    _D.previous = current
    signal.signal(signal.SIGINT, _handler)
    return True


_MAIN = threading.main_thread().ident


def _main_thread() -> bool:
    return threading.get_ident() == _MAIN


class _Operation:
    """``with deferred():`` (a class, not a generator: it runs on every recv and send)."""

    __slots__ = ("active",)

    def __enter__(self) -> None:
        self.active = _main_thread() and _install()
        if self.active:
            _D.depth += 1

    def __exit__(self, *exc: object) -> None:
        if self.active:
            _D.depth -= 1
            if _D.depth == 0:
                _D.waiting = False
                take_pending()


def deferred() -> _Operation:
    """An operation: SIGINT is held until an interruptible wait or the end."""
    return _Operation()


def pending() -> bool:
    """An interrupt arrived during the current operation and was not raised yet."""
    return _D.pending is not None


def take_pending() -> None:
    """Raise the held interrupt now (the caller's state is whole here)."""
    if _D.pending is not None:
        held, _D.pending = _D.pending, None
        _deliver(*held)


class _Wait:
    __slots__ = ("active",)

    def __enter__(self) -> None:
        self.active = _D.depth > 0 and not _D.waiting and _main_thread()
        if self.active:
            take_pending()
            _D.waiting = True

    def __exit__(self, *exc: object) -> None:
        if self.active:
            _D.waiting = False


def interruptible() -> _Wait:
    """A blocking wait during which nothing is half done: an interrupt is raised in it."""
    return _Wait()
