"""The call planner: which host calls a send of some envs becomes (pure).

``plan(layout, ids, per_env, ...)`` cuts a send of the envs ``ids`` (``per_env[j]``
belongs to ``ids[j]``: an action or a reset seed) into one call per host, and each
host's share into one call per split of its envs (``splits_per_actor``). Nothing here
sends, waits or keeps state: the dispatcher sends what this returns.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

#: arrays up to this long are looked at as Python lists (see ``remote_env.checks.SMALL``)
_SMALL = 64

@dataclasses.dataclass(frozen=True)
class Layout:
    """Where every env lives: its host and its position there. Fixed once the hosts
    exist (a replacement actor holds the same envs)."""

    env_host: np.ndarray
    env_pos: np.ndarray
    #: each host's global env ids, in its slot order
    host_envs: tuple[np.ndarray, ...]
    #: each host's ``(lo, hi)`` when its ids are ``range(lo, hi)``, else ``(-1, -1)``
    spans: tuple[tuple[int, int], ...]

    @classmethod
    def of(cls, host_envs: Sequence[Sequence[int] | np.ndarray], num_envs: int) -> Layout:
        env_host = np.zeros(num_envs, dtype=np.int64)
        env_pos = np.zeros(num_envs, dtype=np.int64)
        arrays, spans = [], []
        for h, ids in enumerate(host_envs):
            arr = np.asarray(ids, dtype=np.int64)
            env_host[arr] = h
            env_pos[arr] = np.arange(len(arr))
            arrays.append(arr)
            contiguous = len(arr) and np.array_equal(arr, np.arange(arr[0], arr[0] + len(arr)))
            spans.append((int(arr[0]), int(arr[0]) + len(arr)) if contiguous else (-1, -1))
        return cls(env_host, env_pos, tuple(arrays), tuple(spans))

    @property
    def num_hosts(self) -> int:
        return len(self.host_envs)


class PlannedCall(NamedTuple):
    """One host call of a send: these envs, at these positions of the host, their share
    of the payload (a view of the caller's array where no gather was needed)."""

    host: int
    env_ids: np.ndarray
    positions: list[int]
    payload: Any


def _in_order(ids: np.ndarray) -> bool:
    """``ids`` (distinct, in ``[0, n)``, all ``n`` of them) are ``0..n-1`` in order.

    Why: ``per_env[j]`` belongs to ``ids[j]``; only then is it also env ``j``'s, which
    the every-env fast path assumes. A send naming every env in another order (two
    recv() batches joined) goes through the per-host gather like any subset.
    """
    if len(ids) <= _SMALL:  # no reduction on a small array (~0.7 us whatever its size)
        listed = ids.tolist()
        return all(a < b for a, b in itertools.pairwise(listed))
    return bool((ids[1:] > ids[:-1]).all())


def _one_value(arr: np.ndarray) -> bool:
    """All of ``arr`` (not empty) is one value."""
    if len(arr) <= _SMALL:
        listed: list[Any] = arr.tolist()
        return listed.count(listed[0]) == len(listed)
    return bool(arr.min() == arr.max())


def plan(layout: Layout, ids: np.ndarray, per_env: Any, *, splits_per_actor: int,
         is_reset: bool) -> list[PlannedCall]:
    """The calls a send of the envs ``ids`` becomes: one per host (per split of it)."""
    hosts_of = layout.env_host[ids]
    # (host, which of ids: None = all the host's envs, sliced from per_env; True = every
    # id given, sent as given)
    groups: list[tuple[int, np.ndarray | bool | None]]
    if len(ids) == len(layout.env_host) and not is_reset and _in_order(ids):
        # every env, ids in order: per_env[e] is env e's (sliced per host, no gather)
        groups = [(h, None) for h in range(layout.num_hosts)]
    elif _one_value(hosts_of):  # the usual recv/send loop: one actor's envs
        groups = [(int(hosts_of[0]), True)]
    else:
        groups = [(int(h), np.flatnonzero(hosts_of == h)) for h in np.unique(hosts_of)]
    out: list[PlannedCall] = []
    for h, sel in groups:
        payload: Any
        if sel is None:
            env_ids = layout.host_envs[h]
            lo, hi = layout.spans[h]
            if lo >= 0 and isinstance(per_env, np.ndarray):
                payload = per_env[lo:hi]
            else:
                payload = [per_env[int(e)] for e in env_ids]
        elif sel is True:  # no gather: the caller's arrays as they are
            env_ids, payload = ids, per_env
        else:
            assert isinstance(sel, np.ndarray)
            env_ids = ids[sel]
            payload = per_env[sel] if isinstance(per_env, np.ndarray) else [
                per_env[int(j)] for j in sel]
        positions = layout.env_pos[env_ids].tolist()
        host_size = len(layout.host_envs[h])
        for part_ids, part_pos, part in split(host_size, env_ids, positions, payload,
                                              splits_per_actor):
            out.append(PlannedCall(h, part_ids, part_pos, part))
    return out


def split(host_size: int, env_ids: np.ndarray, positions: list[int], payload: Any,
          splits_per_actor: int) -> list[tuple[np.ndarray, list[int], Any]]:
    """One host's share of a send as one call per split of its envs (``splits_per_actor``).

    Why: Sample Factory's double-buffered sampling. An actor answers its calls in
    order, so while the driver handles one split's reply (copies its observations,
    sends its next actions) the actor already steps the next split: the driver and
    the actor each keep a core busy instead of taking turns. A split is a fixed
    range of the actor's positions, so it stays one call however the caller
    regroups its sends.
    """
    if splits_per_actor == 1:
        return [(env_ids, positions, payload)]
    size = -(-host_size // splits_per_actor)
    if not positions or min(positions) // size == max(positions) // size:  # one split
        # (the usual send: the ids a recv returned)
        return [(env_ids, positions, payload)]
    parts = [p // size for p in positions]
    cuts = [j for j in range(1, len(parts)) if parts[j] != parts[j - 1]]
    if not cuts:
        return [(env_ids, positions, payload)]
    if all(parts[j] > parts[j - 1] for j in cuts):  # ascending: slices, no gather
        bounds = [0, *cuts, len(parts)]
        return [(env_ids[a:b], positions[a:b], payload[a:b])
                for a, b in itertools.pairwise(bounds)]
    groups: dict[int, list[int]] = {}
    for j, part in enumerate(parts):
        groups.setdefault(part, []).append(j)
    return [(env_ids[js], [positions[j] for j in js],
             payload[js] if isinstance(payload, np.ndarray) else [payload[j] for j in js])
            for js in groups.values()]
