"""Checks of what callers pass in: actions, seeds, env ids, masks, spaces, options.

All run in the driver before anything is sent, so a caller's mistake is a
``ValueError``/``TypeError`` naming the env ids concerned, never an env failure
(no restart, nothing in ``envpool_env_failures_total``). Messages say what was
expected and what arrived, as gymnasium's do.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.spaces.utils import is_space_dtype_shape_equiv
from gymnasium.vector.utils import batch_differing_spaces, batch_space, iterate

# Array action spaces are split by slicing the batched array (no per-env Python loop).
ARRAY_SPACES = (gym.spaces.Box, gym.spaces.Discrete, gym.spaces.MultiDiscrete,
                gym.spaces.MultiBinary)
TRANSPORTS = ("auto", "pickle", "ray")
#: arrays up to this long are checked as Python lists: a numpy reduction costs ~0.7 us
#: whatever the size, ``tolist`` ~5 ns an element (checks that run on every ``send``)
SMALL = 64


def positive_int(name: str, value: Any) -> None:
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}")


def duration(name: str, value: Any, *, positive: bool = False, none: str | None = None) -> None:
    """The one rule for every time option (constructor and call timeouts alike): a finite
    real number, >= 0 (> 0 when ``positive``), or None where ``none`` says what None
    means. NaN, inf, bools and strings are refused everywhere (NaN compares false with
    everything, so a plain ``< 0`` lets it through; inf is spelt None where "no limit"
    is allowed)."""
    if value is None and none is not None:
        return
    ok = (isinstance(value, (int, float, np.integer, np.floating))
          and not isinstance(value, (bool, np.bool_))
          and math.isfinite(value) and (value > 0 if positive else value >= 0))
    if not ok:
        also = f" (or None: {none})" if none is not None else ""
        raise ValueError(f"{name} must be a finite number {'>' if positive else '>='} 0{also}, "
                         f"got {value!r}")


def options(*, envs_per_actor: Any, threads_per_actor: Any, max_restarts: Any,
            batch_wait_ms: Any, step_timeout_s: Any, restart_backoff_s: Any,
            transport: Any, observation_mode: Any, spin_us: Any = 0.0,
            splits_per_actor: Any = 1, start_timeout_s: Any = 300.0,
            close_timeout_s: Any = 5.0) -> None:
    """The constructor's numeric and enum options (before any actor exists)."""
    if envs_per_actor is not None:
        positive_int("envs_per_actor", envs_per_actor)
    positive_int("threads_per_actor", threads_per_actor)
    positive_int("splits_per_actor", splits_per_actor)
    if not isinstance(max_restarts, (int, np.integer)) or isinstance(max_restarts, bool) \
            or max_restarts < 0:
        raise ValueError(f"max_restarts must be an int >= 0, got {max_restarts!r}")
    duration("batch_wait_ms", batch_wait_ms)
    duration("step_timeout_s", step_timeout_s, positive=True, none="wait forever")
    duration("start_timeout_s", start_timeout_s, none="a replacement may take forever to start")
    duration("close_timeout_s", close_timeout_s, none="wait for every sub-env's close()")
    duration("restart_backoff_s", restart_backoff_s)
    if not (isinstance(spin_us, str) and spin_us == "auto"):
        try:
            duration("spin_us", spin_us)
        except ValueError:
            raise ValueError(f"spin_us must be a finite number >= 0 or 'auto', "
                             f"got {spin_us!r}") from None
    if transport not in TRANSPORTS:
        raise ValueError(
            f"transport must be 'auto' (shared memory and a Unix socket to actors on this "
            f"node, TCP to others), 'pickle' (the channel alone, arrays pickled) or 'ray' "
            f"(Ray calls only), got {transport!r}"
        )
    if isinstance(observation_mode, tuple) and len(observation_mode) == 2:
        if not all(isinstance(s, gym.spaces.Space) for s in observation_mode):
            raise TypeError(
                "Expected both elements of observation_mode to be Spaces, got "
                f"{type(observation_mode[0])} and {type(observation_mode[1])}"
            )
    elif not (isinstance(observation_mode, str) and observation_mode in ("same", "different")):
        raise ValueError(
            "Invalid `observation_mode`, expected: 'same' or 'different' or tuple of single and "
            f"batch observation space, actual got {observation_mode}"
        )


def spaces(mode: Any, obs: Sequence[Any], act: Sequence[Any], n: int) -> tuple[Any, Any]:
    """``(single_observation_space, observation_space)`` for the envs' spaces, refusing
    spaces that differ as ``SyncVectorEnv(observation_mode=mode)`` does."""
    if isinstance(mode, tuple):
        batched, single = mode
    elif mode == "same":
        single, batched = obs[0], None
    else:
        single, batched = obs[0], batch_differing_spaces(list(obs))
    for e, (o, a) in enumerate(zip(obs, act, strict=True)):
        # gymnasium's own wording (its vector tests match it), then which env differs
        if mode == "same" and o != single:
            raise RuntimeError(
                "RemoteVectorEnv(..., observation_mode='same') however the sub-environments "
                f"observation spaces are not equivalent. sub-environment {e} has observation "
                f"space {o}, expected that of sub-environment 0: {single}. If this is "
                "intentional, use `observation_mode='different'` instead."
            )
        if mode != "same" and not is_space_dtype_shape_equiv(o, single):
            raise RuntimeError(
                "RemoteVectorEnv(..., observation_mode='different' or custom space) however the "
                "sub-environments observation spaces do not share a common shape and dtype, "
                f"single_observation_space={single}, sub-environment {e} observation space={o}"
            )
        if a != act[0]:
            raise RuntimeError(
                "Sub-environment action space doesn't make the `single_action_space`, "
                f"sub-environment {e} action_space={a}, single_action_space={act[0]}"
            )
    return single, (batched if batched is not None else batch_space(single, n))


def seeds(seed: Any, n: int) -> list[int | None]:
    """One seed per env: None, an int (``seed + i``) or a sequence of ints/None."""
    if seed is None:
        return [None] * n
    if isinstance(seed, (int, np.integer)) and not isinstance(seed, bool):
        if seed < 0:
            raise ValueError(f"seed must be an int >= 0 (or None or a list), got {seed}")
        return [int(seed) + i for i in range(n)]
    if not isinstance(seed, (list, tuple, np.ndarray)):
        raise TypeError(
            f"seed must be None, an int or a list of num_envs={n} ints/None, "
            f"got {type(seed).__name__}"
        )
    out = list(seed)
    if len(out) != n:
        raise ValueError(
            f"If seeds are passed as a list the length must match num_envs={n} "
            f"but got length={len(out)}."
        )
    bad_type = [e for e, s in enumerate(out) if s is not None and (
        not isinstance(s, (int, np.integer)) or isinstance(s, (bool, np.bool_)))]
    if bad_type:
        raise TypeError(
            f"seeds for env ids {bad_type} must be ints >= 0 or None, got "
            f"{[type(out[e]).__name__ for e in bad_type]}"
        )
    negative = [e for e, s in enumerate(out) if s is not None and s < 0]
    if negative:
        raise ValueError(
            f"seeds for env ids {negative} must be >= 0, got {[out[e] for e in negative]}"
        )
    return [None if s is None else int(s) for s in out]


def env_ids(ids_in: Sequence[int] | np.ndarray | None, n: int) -> np.ndarray:
    """``ids_in`` as a 1-D int64 array of distinct ids in ``[0, n)``.

    Runs on every ``send()``: one sort answers both range and repeat questions
    (scalar compares on its ends instead of two masks: ~4 us a call on 2 cores).
    """
    if ids_in is None:
        return np.arange(n)
    ids = np.asarray(ids_in)
    if ids.ndim != 1 or (ids.size and ids.dtype.kind not in "iu"):
        raise TypeError(f"env_ids must be a 1-D sequence of ints, got {ids_in!r}")
    if not len(ids):
        raise ValueError("env_ids is empty: send at least one env id")
    ids = ids.astype(np.int64)  # a copy: calls in flight keep it, the caller may reuse theirs
    if len(ids) <= SMALL:
        # the usual send (one split's ids): Python on a list, ~1 us against ~4 us of a
        # sort, compares and a reduction on a small array
        listed = ids.tolist()
        if min(listed) < 0 or max(listed) >= n:
            outside = [e for e in listed if not 0 <= e < n]
            raise ValueError(f"unknown env ids {outside}: expected ids in [0, {n})")
        if len(set(listed)) != len(listed):
            raise ValueError(f"env_ids must not repeat an id, got {listed}")
        return ids
    ordered = np.sort(ids)
    if ordered[0] < 0 or ordered[-1] >= n:
        bad = ids[(ids < 0) | (ids >= n)]
        raise ValueError(f"unknown env ids {bad.tolist()}: expected ids in [0, {n})")
    if len(ids) > 1 and (ordered[1:] == ordered[:-1]).any():
        raise ValueError(f"env_ids must not repeat an id, got {ids.tolist()}")
    return ids


def reset_mask(mask: Any, n: int) -> np.ndarray:
    if not isinstance(mask, np.ndarray):
        raise TypeError(f"`options['reset_mask']` must be a numpy array, got {type(mask)}")
    if mask.shape != (n,):
        raise ValueError(f"`options['reset_mask']` must have shape `({n},)`, got {mask.shape}")
    if mask.dtype != np.bool_:
        raise TypeError(f"`options['reset_mask']` must have `dtype=np.bool_`, got {mask.dtype}")
    if not np.any(mask):
        raise ValueError(
            "`options['reset_mask']` must contain a boolean array with at least one True "
            f"value, got reset_mask={mask}"
        )
    return mask


def multi_agent_actions(actions: Any, n: int, ids: np.ndarray | None = None) -> list[Any]:
    # a dict keyed by env id (as action_space.sample() gives) or a list in send order
    if not isinstance(actions, (Mapping, list, tuple)):
        raise TypeError(
            f"multi-agent actions must be a dict keyed by env id or a list of {n} per-agent "
            f"action dicts, got {type(actions).__name__}"
        )
    acts = list(actions.values()) if isinstance(actions, Mapping) else list(actions)
    if isinstance(actions, Mapping) and ids is not None and len(actions) == n:
        # by key, not by the dict's order: env 10's action must not go to env 2
        keys = ids.tolist()
        if not all(k in actions for k in keys):
            keys = [str(k) for k in keys]  # str env ids, as action spaces had them before
        if all(k in actions for k in keys):
            acts = [actions[k] for k in keys]
        else:
            raise ValueError(
                f"multi-agent actions keyed by {sorted(actions, key=str)!r} do not name the "
                f"env ids stepped, {ids.tolist()}")
    if len(acts) != n:
        raise ValueError(
            f"expected actions for {n} envs (a dict keyed by env id or a list of "
            f"per-agent action dicts), got {len(acts)}"
        )
    for j, a in enumerate(acts):
        if not isinstance(a, Mapping):
            raise TypeError(
                f"multi-agent actions must be dicts keyed by agent id; item {j} is "
                f"{type(a).__name__}"
            )
    return acts


def actions(space: Any, actions_in: Any, ids: np.ndarray) -> Any:
    """Validate a batch of actions for the envs ``ids``; return something indexable per env.

    Discrete, MultiDiscrete and MultiBinary actions outside the space are refused
    here (the env would raise on them, which is the caller's bug, not the env's);
    Box bounds are not checked, as gymnasium's vector envs do not (envs clip).
    """
    n = len(ids)
    if not isinstance(space, ARRAY_SPACES):
        try:
            acts = list(iterate(batch_space(space, n), actions_in))
        except Exception as exc:
            raise TypeError(
                f"actions must be a batch of {n} actions of {space}: {type(exc).__name__}: {exc}"
            ) from exc
        if len(acts) != n:
            raise ValueError(f"expected {n} actions, got {len(acts)}")
        return acts
    try:
        arr = np.asarray(actions_in)
    except Exception as exc:
        raise TypeError(
            f"actions must be array-like for {space}, got {type(actions_in).__name__}"
        ) from exc
    expected = (n, *(space.shape or ()))
    if arr.ndim == 0:
        raise TypeError(
            f"actions must be a batch of shape {expected} (num_envs={n} x {space}), got a "
            f"scalar {type(actions_in).__name__}"
        )
    if arr.shape != expected:
        raise ValueError(
            f"actions must have shape {expected} (num_envs={n} x {space}) "
            f"but got shape {arr.shape}"
        )
    kind = arr.dtype.kind  # not np.issubdtype: ~1.5 us each, on every send()
    if kind not in "biufc":
        raise TypeError(f"actions must be numeric for {space}, got dtype {arr.dtype}")
    if isinstance(space, gym.spaces.Box):
        return arr
    if kind not in "iu" and not (kind == "b" and isinstance(space, gym.spaces.MultiBinary)):
        raise TypeError(f"actions for {space} must be integers, got dtype {arr.dtype}")
    if isinstance(space, gym.spaces.Discrete):
        low, high = space.start, space.start + space.n
        if arr.size <= SMALL:  # no reductions on a few actions (see SMALL)
            listed = arr.tolist()
            inside = min(listed) >= int(low) and max(listed) < int(high)
        else:
            inside = bool(arr.min() >= low) and bool(arr.max() < high)  # scalar compares
    else:
        if isinstance(space, gym.spaces.MultiDiscrete):
            low, high = space.start, space.start + space.nvec
        else:  # MultiBinary
            low, high = 0, 2
        inside = not ((arr < low) | (arr >= high)).any()
    if not inside:
        outside = (arr < low) | (arr >= high)
        rows = outside.reshape(n, -1).any(axis=1)
        bad = ids[rows].tolist()
        raise ValueError(
            f"actions for env ids {bad} are outside {space}: got "
            f"{arr[rows].tolist()} (nothing was sent)"
        )
    return arr
