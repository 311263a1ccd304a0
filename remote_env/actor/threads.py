"""Stepping threads inside an actor, for envs that wait on I/O."""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Sequence
from typing import Any


class Gang:
    """``threads`` workers, each stepping a fixed share of the envs; all woken per call.

    For envs that wait (I/O, a simulator process). Lighter than
    ``ThreadPoolExecutor.map`` (no future or queue item per env, the caller does a
    share itself): 8 envs sleeping 1 ms took 1.6 ms a call against 2.8 ms, 32 envs
    2.7 ms against 4.5 ms on 2 cores.
    """

    def __init__(self, threads: int) -> None:
        self._go = [threading.Event() for _ in range(threads - 1)]
        self._done = threading.Event()
        self._lock = threading.Lock()
        self._left = 0
        self._work: list[Callable[[], None]] = []
        self._closed = False
        for i, go in enumerate(self._go):
            threading.Thread(target=self._loop, args=(go, i + 1), name=f"subenv-{i + 1}",
                             daemon=True).start()

    def _loop(self, go: threading.Event, i: int) -> None:
        while True:
            go.wait()
            go.clear()
            if self._closed:
                return
            self._work[i]()
            with self._lock:
                self._left -= 1
                if self._left == 0:
                    self._done.set()

    def map(self, fn: Callable[[Any, Any], Any], a: Sequence[Any], b: Sequence[Any]) -> list[Any]:
        n = len(a)
        shares = min(len(self._go) + 1, n)
        out: list[Any] = [None] * n
        raised: list[BaseException] = []

        def share(t: int) -> None:
            try:
                for i in range(t, n, shares):
                    out[i] = fn(a[i], b[i])
            except BaseException as exc:  # re-raised in the caller's thread
                raised.append(exc)

        self._work = [functools.partial(share, t) for t in range(shares)]
        self._left = shares - 1
        self._done.clear()
        for go in self._go[: shares - 1]:
            go.set()
        share(0)
        if shares > 1:
            self._done.wait()
        if raised:
            raise raised[0]
        return out

    def close(self) -> None:
        self._closed = True
        for go in self._go:
            go.set()
