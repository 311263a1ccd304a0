"""gymnasium's attribute access on the sub-envs: ``call``, ``get_attr``, ``set_attr``.

As ``SyncVectorEnv``: through the envs' wrappers (``get_wrapper_attr`` /
``set_wrapper_attr``), so ``set_attr("gravity", 20.0)`` reaches the physics and not
the outermost wrapper; ``np_random_seed`` is the sub-envs' seeds.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from remote_env import channel, interrupts
from remote_env.calls import CallLoop


def _as_raised(exc: channel.RemoteCallError, method: str, name: str) -> BaseException:
    """The env's own exception, as SyncVectorEnv and AsyncVectorEnv raise it (and Ray
    does, as an instance of its cause), with the actor's traceback as a note."""
    cause = exc.cause
    if cause is None:
        return exc
    cause.add_note(f"raised in a sub-environment's actor by {method}({name!r}); "
                   f"its traceback there:\n{exc.remote_traceback}")
    return cause


class EnvAttributes(CallLoop):
    """Mixin of :class:`~remote_env.vector.RemoteVectorEnv`: the sub-envs' attributes."""

    def _check_open(self) -> None:
        raise NotImplementedError

    def call(self, name: str, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
        """Call ``name`` on every sub-env (or read it if not callable), through wrappers
        (``get_wrapper_attr``), as ``SyncVectorEnv`` does."""
        return tuple(x for r in self._on_each_host("call", name, args, kwargs) for x in r)

    def get_attr(self, name: str) -> tuple[Any, ...]:
        return self.call(name)

    def set_attr(self, name: str, values: list[Any] | tuple[Any, ...] | Any) -> None:
        """Set ``name`` on every sub-env where a wrapper or the env has it
        (``set_wrapper_attr``); one value for all, or a list of ``num_envs``."""
        self._check_open()
        if not isinstance(values, (list, tuple)):
            values = [values] * self.num_envs
        if len(values) != self.num_envs:
            raise ValueError(
                "Values must be a list or tuple with length equal to the number of environments. "
                f"Got `{len(values)}` values for {self.num_envs} environments."
            )
        self._on_each_host("set_attr", name, lambda h: [values[int(e)] for e in h.env_ids])

    def _on_each_host(self, method: str, name: str, *rest: Any) -> list[Any]:
        # an interrupt lands only in a wait: the replies not taken then are matched to
        # their own calls by id and dropped, never read as another call's
        with interrupts.deferred():
            return self._on_each_host_now(method, name, *rest)

    def _on_each_host_now(self, method: str, name: str, *rest: Any) -> list[Any]:
        self._check_open()
        while any(not h.up and h.broken is None for h in self._hosts):
            wake = self._advance()  # a replacement still due: wait for it
            with interrupts.interruptible():
                time.sleep(0.0 if wake is None
                           else min(max(wake - time.perf_counter(), 0.0), 0.05))
        refs = []
        for h in self._hosts:
            args = [r(h) if callable(r) else r for r in rest]
            refs.append(self._host_call(h, method, list(range(len(h.env_ids))), name, *args))
        # Every host's answer is taken before one's error is raised, so no reply is
        # left behind for a later call (nor an error Ray would log as unhandled).
        out, failed = [], []
        for ref in refs:
            try:
                out.append(self._get(ref))
            except Exception as exc:  # the env's (or Ray's RayTaskError, an instance of it)
                failed.append(exc)
        if failed:
            first = failed[0]
            raise _as_raised(first, method, name) if isinstance(first, channel.RemoteCallError) else first
        return out

    @property
    def np_random_seed(self) -> tuple[int, ...]:
        """The sub-envs' seeds (``np_random_seed`` of each), as ``SyncVectorEnv`` gives."""
        return self.get_attr("np_random_seed")

    @property
    def np_random(self) -> tuple[np.random.Generator, ...]:
        """Copies of the sub-envs' generators (they live in the actors)."""
        return self.get_attr("np_random")

    def render(self) -> tuple[Any, ...] | None:
        return self.call("render")
