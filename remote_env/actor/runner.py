"""How the actor runs one call's per-env work: in turn, on stepping threads, or
awaited together on an event loop (envs with ``astep``/``areset``)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from remote_env.actor.steps import run_sync
from remote_env.actor.threads import Gang

PerEnv = Callable[[Any, Any], Coroutine[Any, Any, Any]]


class BatchRunner:
    """Runs a per-env coroutine over a call's envs and returns the results in order.

    Args:
        threads: step sub-envs on this many threads (for envs that wait on I/O).
    """

    def __init__(self, threads: int = 1) -> None:
        self._gang = Gang(threads) if threads > 1 else None
        self._await_together = False
        # the event loop of async envs, run by a thread of its own (made on first use),
        # so it works whichever thread (Ray's or a channel's) brings the call
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: threading.Thread | None = None

    def await_together(self) -> None:
        """The envs are async: await their steps together on one event loop."""
        self._await_together = True

    @property
    def inline(self) -> bool:
        """Work runs in the caller's thread, one env after the other."""
        return not self._await_together and self._gang is None

    def map(self, fn: PerEnv, a: Sequence[Any], b: Sequence[Any]) -> list[Any]:
        """``fn`` over pairs: awaited together (async envs), on the gang, or in turn."""
        if self._await_together:
            loop = self._event_loop()

            async def gather() -> list[Any]:
                return list(await asyncio.gather(*(fn(x, y) for x, y in zip(a, b, strict=True))))

            return asyncio.run_coroutine_threadsafe(gather(), loop).result()
        if self._gang is None or len(a) == 1:
            return [run_sync(fn(x, y)) for x, y in zip(a, b, strict=True)]
        return self._gang.map(lambda x, y: run_sync(fn(x, y)), a, b)

    def _event_loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
            self._loop_thread = threading.Thread(target=self._loop.run_forever,
                                                 name="subenv-asyncio", daemon=True)
            self._loop_thread.start()
        return self._loop

    def close(self) -> None:
        if self._gang is not None:
            self._gang.close()
        if self._loop is not None and self._loop_thread is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._loop_thread.join(timeout=10)
            if not self._loop_thread.is_alive():
                self._loop.close()
            self._loop = self._loop_thread = None
