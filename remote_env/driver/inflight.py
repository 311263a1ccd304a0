"""The calls in flight, the results not handed out yet, and which envs are busy.

A :class:`Call` is one host call in flight, keyed by what its link returned (a Ray
ref or a channel call); one for a host whose replacement is not up yet waits under
a :class:`Deferred` key and is sent when it is. An env is busy from its send until
its result is handed to the caller (or its call ends in an error).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import numpy as np

from remote_env.driver.assembly import Batches


@dataclasses.dataclass
class FollowUp:
    """SAME_STEP: the failed step whose result waits for the replacement's reset."""

    error: str
    last_obs: list[Any]


@dataclasses.dataclass(slots=True)
class Call:
    """A host call in flight (or deferred until its host is replaced). Never changed
    once made: a deferred call is sent as a new one."""

    host: int
    env_ids: np.ndarray
    positions: list[int]
    is_reset: bool
    method: str
    args: tuple[Any, ...]
    #: when it was sent (perf_counter; 0: not yet) and to which of its host's actors
    sent: float = 0.0
    generation: int = 0
    #: sent to a replacement actor still starting: its env constructors may take long
    starting: bool = False
    follow_up: FollowUp | None = None


class Deferred:
    """The key of a call waiting for its host's replacement (stands in for a ref)."""

    __slots__ = ()


@dataclasses.dataclass(frozen=True)
class CallView:
    """A call in flight, as :meth:`RemoteVectorEnv.in_flight` shows it."""

    host: int
    env_ids: np.ndarray
    method: str
    deferred: bool


class InFlight:
    """Calls in flight, results received and not handed out, orphaned calls, busy envs."""

    def __init__(self, num_envs: int) -> None:
        self._calls: dict[Any, Call] = {}
        #: results received and not handed to the caller yet (their envs stay busy)
        self._ready: Batches = []
        #: calls in flight no caller waits for any more (see orphan_all)
        self._orphans: dict[Any, Call] = {}
        self._busy = np.zeros(num_envs, dtype=np.bool_)

    # ---------------------------------------------------------------- reading
    def __len__(self) -> int:
        return len(self._calls)

    def __bool__(self) -> bool:
        return bool(self._calls)

    def __getitem__(self, key: Any) -> Call:
        return self._calls[key]

    def all_keys(self) -> list[Any]:
        return list(self._calls)

    def items(self) -> Iterator[tuple[Any, Call]]:
        return iter(list(self._calls.items()))

    def live(self) -> list[Any]:
        """Keys of the calls sent (not deferred)."""
        return [k for k in self._calls if not isinstance(k, Deferred)]

    def sent(self) -> tuple[list[Any], list[Call]]:
        """The calls sent (not deferred): their keys, and the calls in the same order."""
        keys = list(self._calls)
        for k in keys:
            if isinstance(k, Deferred):
                break
        else:  # the usual case: none held for a replacement
            return keys, list(self._calls.values())
        keys, calls = [], []
        for k, c in self._calls.items():
            if not isinstance(k, Deferred):
                keys.append(k)
                calls.append(c)
        return keys, calls

    def deferred(self, h: int | None = None) -> list[tuple[Any, Call]]:
        """Calls held for a replacement (of host ``h``)."""
        return [(k, c) for k, c in self._calls.items()
                if isinstance(k, Deferred) and (h is None or c.host == h)]

    @property
    def has_ready(self) -> bool:
        return bool(self._ready)

    @property
    def has_orphans(self) -> bool:
        return bool(self._orphans)

    @property
    def pending_reset(self) -> bool:
        """The first call in flight is a reset (what the caller is told is pending)."""
        first = next(iter(self._calls.values()), None)
        return first is not None and first.is_reset

    def busy(self, env_ids: np.ndarray) -> np.ndarray:
        """Which of ``env_ids`` have a call in flight or a result not handed out."""
        out: np.ndarray = env_ids[self._busy[env_ids]]
        return out

    def busy_mask(self) -> np.ndarray:
        """A copy of the busy flags of every env."""
        return self._busy.copy()

    def views(self) -> list[CallView]:
        return [CallView(c.host, c.env_ids.copy(), c.method, isinstance(k, Deferred))
                for k, c in self._calls.items()]

    # ---------------------------------------------------------------- changing
    def add(self, key: Any, call: Call) -> None:
        self._calls[key] = call
        self._busy[call.env_ids] = True

    def remove(self, key: Any) -> Call:
        """A call whose result is in hand: off the books (its envs stay busy until handed)."""
        return self._calls.pop(key)

    def drop(self, key: Any) -> None:
        """A call that ended in an error: off the books, its envs free to be sent again."""
        call = self._calls.pop(key)
        self._busy[call.env_ids] = False

    def deliver(self, env_ids: np.ndarray, batch: Any) -> None:
        self._ready.append((env_ids, batch))

    def take_ready(self) -> Batches:
        """The results waiting to be handed out; their envs are free to be sent again."""
        out, self._ready = self._ready, []
        for ids, _ in out:
            self._busy[ids] = False
        return out

    def put_back(self, batches: Batches) -> None:
        """Results being handed out when an interrupt came: returned by the next wait."""
        self._ready[:0] = batches
        for ids, _ in batches:
            self._busy[ids] = True

    def orphan_all(self) -> None:
        """The caller gave up on the calls in flight (a reset() cut short, a step that
        raised): they are waited out before anything is sent again."""
        self._orphans.update(self._calls)
        self._calls = {}
        self._ready = []
        self._busy[:] = False

    def adopt_orphans(self) -> tuple[dict[Any, Call], Batches]:
        """Make the orphans the calls in flight (to wait them out); what they replace."""
        mine, ready = self._calls, self._ready
        self._calls, self._orphans, self._ready = self._orphans, {}, []
        return mine, ready

    def restore(self, mine: dict[Any, Call], ready: Batches) -> None:
        """After :meth:`adopt_orphans`: what is left orphaned again, ``mine`` back."""
        self._orphans.update(self._calls)
        self._calls, self._ready = mine, ready
        self._busy[:] = False
        for call in self._calls.values():
            self._busy[call.env_ids] = True
        for ids, _ in self._ready:
            self._busy[ids] = True

    def abandon(self) -> None:
        """Forget every call in flight (close)."""
        self._calls = {}
        self._orphans = {}
        self._busy[:] = False
        self._ready = []
