"""gymnasium's attribute access on the sub-envs: ``call``, ``get_attr``, ``set_attr``.

As ``SyncVectorEnv``: through the envs' wrappers (``get_wrapper_attr`` /
``set_wrapper_attr``), so ``set_attr("gravity", 20.0)`` reaches the physics and not
the outermost wrapper; ``np_random_seed`` is the sub-envs' seeds.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from remote_env import checks, interrupts
from remote_env.driver.calls import CallLoop
from remote_env.wire import channel


def _as_raised(exc: channel.RemoteCallError, method: str, name: str) -> BaseException:
    """The env's own exception, as SyncVectorEnv and AsyncVectorEnv raise it (and Ray
    does, as an instance of its cause), with the actor's traceback as a note."""
    cause = exc.cause
    if cause is None:
        return exc
    cause.add_note(f"raised in a sub-environment's actor by {method}({name!r}); "
                   f"its traceback there:\n{exc.remote_traceback}")
    return cause


#: sub-env ids for ``call``/``get_attr``/``set_attr``; None: all of them
EnvIds = Sequence[int] | np.ndarray | int | None


class EnvAttributes(CallLoop):
    """Mixin of :class:`~remote_env.driver.vector.RemoteVectorEnv`: the sub-envs' attributes."""

    def _check_open(self) -> None:
        raise NotImplementedError

    def call(self, name: str, *args: Any, env_ids: EnvIds = None, **kwargs: Any) -> tuple[Any, ...]:
        """Call ``name`` on every sub-env (or read it if not callable), through wrappers
        (``get_wrapper_attr``), as ``SyncVectorEnv`` does.

        ``env_ids`` (not in gymnasium's API, which always takes every env): only these
        sub-envs, results in their order, as SB3's ``env_method(..., indices=)``. Like
        SB3's ``indices``, the keyword is taken here: an env method's own ``env_ids``
        argument cannot be passed through ``call``.
        """
        ids = self._attr_ids(env_ids)
        if ids is not None and not len(ids):
            return ()
        by_env = self._on_each_host("call", name, args, kwargs, env_ids=ids)
        return tuple(by_env[int(e)] for e in (range(self.num_envs) if ids is None else ids))

    def get_attr(self, name: str, *, env_ids: EnvIds = None) -> tuple[Any, ...]:
        """``name`` of every sub-env (of ``env_ids`` only, in their order, when given)."""
        return self.call(name, env_ids=env_ids)

    def set_attr(self, name: str, values: list[Any] | tuple[Any, ...] | Any, *,
                 env_ids: EnvIds = None) -> None:
        """Set ``name`` on every sub-env where a wrapper or the env has it
        (``set_wrapper_attr``); one value for all, or a list of ``num_envs`` (of
        ``len(env_ids)`` in their order when ``env_ids`` names some sub-envs)."""
        self._check_open()
        ids = self._attr_ids(env_ids)
        n = self.num_envs if ids is None else len(ids)
        if not isinstance(values, (list, tuple)):
            values = [values] * n
        if len(values) != n:
            raise ValueError(
                "Values must be a list or tuple with length equal to the number of environments. "
                f"Got `{len(values)}` values for {n} environments."
            )
        if not n:
            return
        value_of = dict(zip(range(n) if ids is None else ids.tolist(), values, strict=True))
        self._on_each_host("set_attr", name, lambda mine: [value_of[int(e)] for e in mine],
                           env_ids=ids)

    def env_is_wrapped(self, wrapper_class: type, *, env_ids: EnvIds = None) -> tuple[bool, ...]:
        """Whether each sub-env (of ``env_ids``) is wrapped in ``wrapper_class``
        somewhere in its gymnasium wrapper chain, as SB3's ``env_is_wrapped`` asks."""
        ids = self._attr_ids(env_ids)
        if ids is not None and not len(ids):
            return ()
        by_env = self._on_each_host("is_wrapped", wrapper_class, env_ids=ids)  # type: ignore[arg-type]
        return tuple(bool(by_env[int(e)]) for e in (range(self.num_envs) if ids is None else ids))

    def _attr_ids(self, env_ids: EnvIds) -> np.ndarray | None:
        """``env_ids`` checked (distinct, in range); empty is allowed here (no call)."""
        if env_ids is None:
            return None
        if isinstance(env_ids, (int, np.integer)):
            env_ids = [int(env_ids)]
        if not len(env_ids):
            return np.zeros(0, dtype=np.int64)
        return checks.env_ids(env_ids, self.num_envs)

    def _on_each_host(self, method: str, name: str, *rest: Any,
                      env_ids: np.ndarray | None = None) -> dict[int, Any]:
        """``method`` on the hosts of ``env_ids`` (all when None); each result by env id.
        A callable in ``rest`` is called with the host's env ids to give its argument."""
        # an interrupt lands only in a wait: the replies not taken then are matched to
        # their own calls by id and dropped, never read as another call's
        with interrupts.deferred():
            return self._on_each_host_now(method, name, *rest, env_ids=env_ids)

    def _on_each_host_now(self, method: str, name: str, *rest: Any,
                          env_ids: np.ndarray | None = None) -> dict[int, Any]:
        self._check_open()
        while any(not h.up and h.broken is None for h in self._hosts):
            wake = self._advance()  # a replacement still due: wait for it
            with interrupts.interruptible():
                time.sleep(0.0 if wake is None
                           else min(max(wake - time.perf_counter(), 0.0), 0.05))
        refs, groups = [], []
        for h, mine in self._by_host(env_ids):
            args = [r(mine) if callable(r) else r for r in rest]
            refs.append(self._host_call(h, method, self._env_pos[mine].tolist(), name, *args))
            groups.append(mine)
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
        return {int(e): x for mine, r in zip(groups, out, strict=True)
                for e, x in zip(mine.tolist(), r or [None] * len(mine), strict=True)}

    def _by_host(self, env_ids: np.ndarray | None) -> list[tuple[Any, np.ndarray]]:
        """(host, its env ids among ``env_ids``) for each host holding any (all: None)."""
        if env_ids is None:
            return [(h, h.env_ids) for h in self._hosts]
        of = self._env_host[env_ids]
        return [(self._hosts[int(k)], env_ids[of == k]) for k in np.unique(of)]

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
