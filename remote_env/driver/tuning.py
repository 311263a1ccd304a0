"""Self-tuning defaults: the actor layout, splits and spin when the caller gives none.

:func:`choose` is a pure function of what was measured at start-up (cores, envs, one
env's step cost and observation bytes) and of what the caller fixed; :func:`probe`
is the measuring (one env built and stepped in the driver process, as gymnasium's
``AsyncVectorEnv`` builds one there to read its spaces). Explicit values always win.

The model behind :func:`choose`: per env-step, the driver spends a call's fixed cost
shared by the envs of the call, a little per env (its action, its row) and a copy or
two of the observation; an actor spends the env's step, its own share of the call
and one write of the observation. When the driver's share of that work is at least
what one core's fair share would be (``1 / (cores + 1)``: the driver is one more
process beside one actor per core), the driver is the bound and three processes
taking turns on two cores cost more than a core left to it: one actor per *spare*
core, each actor's envs in two calls (``splits_per_actor=2``) so that the actor steps
one half while the driver handles the other. Otherwise (envs that cost more than
their data, e.g. a 1 ms physics step): one actor per core, one call each, as before.
The constants are this project's 2-core VM's (README "Benchmarks", issue 34).
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import time
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np

#: driver CPU per call (µs): send, poll, the reply's wake-up (README round 3: ~105)
DRIVER_CALL_US = 80.0
#: driver CPU per env-step of a call beside its observation (action, flags, row)
DRIVER_ENV_US = 1.0
#: driver CPU per KiB of observation per env-step: stored, and copied out with copy=True
DRIVER_US_PER_KIB = 0.18
#: actor CPU per call (µs, README round 3: 60-65)
ACTOR_CALL_US = 60.0
#: actor CPU per KiB of observation per env-step: written into shared memory
ACTOR_US_PER_KIB = 0.09
#: a split is worth its call only when its envs cost at least the actor's share of a
#: call; never more than this many envs needed (cheap envs: README "splits_per_actor")
MAX_MIN_SPLIT_ENVS = 8
#: how long the probe steps its env, at most (s), and how many steps at most
PROBE_BUDGET_S = 0.05
PROBE_STEPS = 32


@dataclasses.dataclass(frozen=True)
class Measured:
    """What :func:`choose` decides from."""

    #: CPUs of the Ray cluster (all on the driver's node: see :func:`choose`)
    cores: int
    num_envs: int
    #: one env step in the driver (µs, the fastest of a few); None: not measured
    step_us: float | None = None
    #: one env's observation (bytes); None: not known
    obs_bytes: int | None = None
    #: the env has ``async def astep``/``areset`` (the actors await it)
    awaited: bool = False
    #: why nothing was measured (shown in the repr/log), when ``step_us`` is None
    unmeasured: str = ""


@dataclasses.dataclass(frozen=True)
class Tuning:
    """The layout and call options a vector env runs with, and where they came from."""

    envs_per_actor: int
    splits_per_actor: int
    spin_us: float | str
    #: one line: what was measured and what the rule chose (or that the caller fixed it)
    why: str

    def describe(self, num_envs: int) -> str:
        actors = -(-num_envs // self.envs_per_actor)
        spin = self.spin_us if isinstance(self.spin_us, str) else f"{self.spin_us:g}"
        return (f"{actors} actor{'s' * (actors != 1)} x {self.envs_per_actor} envs, "
                f"{self.splits_per_actor} split{'s' * (self.splits_per_actor != 1)}, "
                f"spin_us={spin} ({self.why})")


def driver_share(m: Measured, per_call: int) -> float:
    """The driver's fraction of the CPU an env-step costs, calls of ``per_call`` envs."""
    assert m.step_us is not None
    kib = (m.obs_bytes or 0) / 1024
    driver = DRIVER_CALL_US / per_call + DRIVER_ENV_US + DRIVER_US_PER_KIB * kib
    actor = m.step_us + ACTOR_CALL_US / per_call + ACTOR_US_PER_KIB * kib
    return driver / (driver + actor)


def min_split_envs(step_us: float) -> int:
    """The fewest envs a split may hold: their steps at least an actor's call cost."""
    return max(1, min(MAX_MIN_SPLIT_ENVS, math.ceil(ACTOR_CALL_US / max(step_us, 1e-3))))


def choose(m: Measured, *, envs_per_actor: int | None = None,
           splits_per_actor: int | None = None,
           spin_us: float | str | None = None, batch_wait_ms: float = 0.0) -> Tuning:
    """The layout, splits and spin for ``m``; given (not None) values are kept as given.

    A core is left to the driver only with ``batch_wait_ms=0``: with a wait, ``recv``
    gathers an actor's splits into one batch, so they do not overlap, and one actor
    per spare core then steps fewer envs at once (CartPole 64 at ``batch_wait_ms=2``,
    adjacent pairs on 2 cores: 0.79x of one actor per core; README, issue 34).

    Unmeasured (``step_us`` None: actors adopted from a pool, Ray calls, several nodes,
    a probe that failed): the defaults of before, one actor per core, one call each, no
    spin. Awaited envs: two actors per core (one's waits overlap the other's steps).
    """
    cores = max(1, m.cores)
    n = m.num_envs
    fixed = [k for k, v in (("envs_per_actor", envs_per_actor),
                            ("splits_per_actor", splits_per_actor), ("spin_us", spin_us))
             if v is not None]
    given = f"; given: {', '.join(fixed)}" if fixed else ""
    if m.step_us is None:
        per = envs_per_actor or -(-n // cores)
        return Tuning(per, splits_per_actor or 1, 0.0 if spin_us is None else spin_us,
                      f"not measured: {m.unmeasured or 'no probe'}")
    if m.awaited:
        per = envs_per_actor or -(-n // min(2 * cores, n))
        return Tuning(per, splits_per_actor or 1, 0.0 if spin_us is None else spin_us,
                      f"awaited envs, step {m.step_us:.0f} us: two actors per core{given}")
    share = driver_share(m, -(-n // cores))
    bound = share >= 1 / (cores + 1)
    keep_core = cores >= 2 and bound and batch_wait_ms == 0
    if envs_per_actor is None:
        actors = min(n, cores - 1 if keep_core else cores)
        envs_per_actor = -(-n // actors)
    actors = -(-n // envs_per_actor)
    if splits_per_actor is None:
        # splits pay where the driver has a core of its own to handle one split's reply
        # while the actor steps the other; beside an actor per core they add calls only
        spare = actors < cores
        splits_per_actor = 2 if (keep_core and spare and
                                 envs_per_actor >= 2 * min_split_envs(m.step_us)) else 1
    if spin_us is None:
        spin_us = 0.0
    kib = (m.obs_bytes or 0) / 1024
    return Tuning(envs_per_actor, splits_per_actor, spin_us,
                  f"step {m.step_us:.1f} us, obs {kib:.1f} KiB, {cores} cores: driver share "
                  f"{share:.2f} {'>=' if bound else '<'} {1 / (cores + 1):.2f}"
                  f"{': a core left to the driver' if keep_core else ''}"
                  f"{f' (not with batch_wait_ms={batch_wait_ms:g})' if bound and not keep_core and cores >= 2 else ''}"
                  f"{given}")


# --------------------------------------------------------------------- measuring
def obs_bytes(space: Any) -> int | None:
    """Bytes of one observation of ``space`` (Box parts of Dict/Tuple summed); None
    for spaces whose size a sample does not tell (text, graphs, sequences)."""
    if isinstance(space, gym.spaces.Box):
        return int(np.prod(space.shape, dtype=np.int64)) * space.dtype.itemsize
    if isinstance(space, (gym.spaces.Discrete, gym.spaces.MultiDiscrete,
                          gym.spaces.MultiBinary)):
        return int(np.prod(space.shape or (1,), dtype=np.int64)) * 8
    if isinstance(space, gym.spaces.Dict):
        parts = [obs_bytes(s) for s in space.spaces.values()]
    elif isinstance(space, gym.spaces.Tuple):
        parts = [obs_bytes(s) for s in space.spaces]
    else:
        return None
    return None if any(p is None for p in parts) else sum(p for p in parts if p is not None)


def _is_awaited(env: Any) -> bool:
    return (asyncio.iscoroutinefunction(getattr(env, "astep", None))
            and asyncio.iscoroutinefunction(getattr(env, "areset", None)))


def probe(env_fn: Callable[[], Any], cores: int, num_envs: int,
          clock: Callable[[], float] = time.perf_counter) -> Measured:
    """One env built in this process, reset and stepped a few times (at most
    :data:`PROBE_STEPS` steps or :data:`PROBE_BUDGET_S`) with sampled actions, then closed.

    Anything that is not a plain gymnasium env (a multi-agent env, an env actor's
    handle) or that raises gives an unmeasured :class:`Measured` saying why: the
    defaults of before then apply. The probe is an env of its own, with its own seed:
    the vector env's envs are built and seeded in their actors as always.
    """
    try:
        env = env_fn()
    except Exception as exc:
        return Measured(cores, num_envs, unmeasured=f"building an env here raised "
                        f"{type(exc).__name__}")
    try:
        if not isinstance(env, gym.Env):
            if hasattr(getattr(env, "step", None), "remote"):  # an env actor's handle
                import ray

                ray.kill(env, no_restart=True)
            return Measured(cores, num_envs,
                            unmeasured=f"the env is a {type(env).__name__}, not a gym.Env")
        if env.render_mode == "human":  # stepping it would open a window here
            return Measured(cores, num_envs, unmeasured="render_mode='human'")
        if _is_awaited(env.unwrapped) or _is_awaited(env):
            return Measured(cores, num_envs, step_us=0.0, obs_bytes=obs_bytes(
                env.observation_space), awaited=True)
        space = env.action_space
        space.seed(0)
        env.reset(seed=0)
        best = math.inf
        t_end = clock() + PROBE_BUDGET_S
        for _ in range(PROBE_STEPS):
            action = space.sample()
            t0 = clock()
            _, _, term, trunc, _ = env.step(action)
            best = min(best, clock() - t0)
            if term or trunc:
                env.reset()
            if clock() >= t_end:
                break
        return Measured(cores, num_envs, step_us=best * 1e6,
                        obs_bytes=obs_bytes(env.observation_space))
    except Exception as exc:
        return Measured(cores, num_envs,
                        unmeasured=f"stepping an env here raised {type(exc).__name__}")
    finally:
        try:
            close = getattr(env, "close", None)
            if close is not None and isinstance(env, gym.Env):
                close()
        except Exception:  # the probe's close is not the pool's business
            pass
