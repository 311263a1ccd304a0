"""Adapters for multi-agent envs: PettingZoo Parallel API and RLlib-style dicts.

Both APIs take and return ``{agent_id: value}`` dicts. RLlib marks the end of an
episode with ``"__all__"``; PettingZoo by emptying ``env.agents``. Results here
always carry ``"__all__"`` in terminations/truncations so either kind of caller
finds what it expects.
"""

from __future__ import annotations

import sys
from typing import Any

import gymnasium as gym

ALL = "__all__"


def _pettingzoo_classes() -> tuple[type, type] | None:
    """PettingZoo's (ParallelEnv, AECEnv), or None when nothing imported PettingZoo.

    Not imported here: a trainer without it (a Ray-free one, which only reads
    results) loads this module too, and no env can be an instance of a class whose
    module was never imported."""
    pz = sys.modules.get("pettingzoo")
    if pz is None:
        return None
    return pz.ParallelEnv, pz.AECEnv


class UnsupportedMultiAgentEnvError(TypeError):
    """A multi-agent env this library cannot step (an AEC env that is not parallelizable)."""


def is_multi_agent(env: Any) -> bool:
    """PettingZoo envs (Parallel or AEC, by class), and other non-gymnasium envs with
    ``possible_agents`` or ``agents`` (PettingZoo's duck type; RLlib-style dicts)."""
    classes = _pettingzoo_classes()
    if classes is not None and isinstance(env, classes):
        return True
    return not isinstance(env, gym.Env) and (
        _has(env, "possible_agents") or _has(env, "agents"))


def _has(env: Any, name: str) -> bool:
    # PettingZoo's base classes only annotate possible_agents: reading it may raise
    try:
        getattr(env, name)
    except AttributeError:
        return False
    return True


def is_aec(env: Any) -> bool:
    """A PettingZoo AEC (agent-by-agent) env: ``agent_iter``/``last`` instead of dict steps."""
    classes = _pettingzoo_classes()
    parallel, aec = classes if classes is not None else ((), ())
    return isinstance(env, aec) or (
        not isinstance(env, (gym.Env, parallel))
        and callable(getattr(env, "agent_iter", None)) and callable(getattr(env, "last", None)))


def as_parallel(env: Any) -> Any:
    """``env`` itself, or an AEC env converted to the Parallel API (PettingZoo's own
    ``aec_to_parallel``). Refused when its metadata does not say ``is_parallelizable``:
    one step of all agents is then not one AEC cycle (PettingZoo's own rule)."""
    if not is_aec(env):
        return env
    metadata = getattr(env, "metadata", None) or {}
    if not metadata.get("is_parallelizable", False):
        raise UnsupportedMultiAgentEnvError(
            f"{type(env).__name__} is a PettingZoo AEC env whose metadata lacks "
            "'is_parallelizable': True, so it cannot be stepped as one Parallel step per "
            "cycle. Return a ParallelEnv from the make-env callable (e.g. the env module's "
            "parallel_env()), or set metadata['is_parallelizable'] = True if every agent "
            "acts once per cycle and the env updates at the cycle's end")
    from pettingzoo.utils import conversions

    return conversions.aec_to_parallel(env)


def agent_list(env: Any) -> list[Any]:
    """The env's agents: ``possible_agents``, else ``agents`` (after a reset if it is
    empty before one, as PettingZoo envs without ``possible_agents`` have it)."""
    if _has(env, "possible_agents"):
        return list(env.possible_agents)
    found = list(getattr(env, "agents", None) or [])
    if not found:
        obs, _ = env.reset()
        found = list(getattr(env, "agents", None) or obs)
    if not found:
        raise UnsupportedMultiAgentEnvError(
            f"{type(env).__name__} has no possible_agents, and no agents even after a reset: "
            "cannot tell its agents' spaces")
    return found


def spaces(env: Any) -> tuple[gym.spaces.Dict, gym.spaces.Dict]:
    """Per-agent spaces as gymnasium ``Dict`` spaces keyed by agent id."""
    agents = agent_list(env)
    if callable(getattr(env, "observation_space", None)):  # PettingZoo: methods
        obs = {a: env.observation_space(a) for a in agents}
        act = {a: env.action_space(a) for a in agents}
    else:  # RLlib MultiAgentEnv: dicts
        obs = {a: env.observation_spaces[a] for a in agents}
        act = {a: env.action_spaces[a] for a in agents}
    return gym.spaces.Dict(obs), gym.spaces.Dict(act)


def reset(env: Any, seed: int | None, options: dict[str, Any] | None) -> tuple[Any, Any]:
    obs, infos = env.reset(seed=seed, options=options)
    return obs, infos


def step(env: Any, actions: dict[str, Any]) -> tuple[Any, Any, Any, Any, Any]:
    obs, rewards, terms, truncs, infos = env.step(actions)
    terms, truncs = dict(terms), dict(truncs)
    agents = [a for a in {**terms, **truncs} if a != ALL]
    terms.setdefault(ALL, bool(agents) and all(terms.get(a, False) for a in agents))
    truncs.setdefault(ALL, bool(agents) and all(truncs.get(a, False) for a in agents))
    return obs, rewards, terms, truncs, infos


def episode_over(env: Any, terms: dict[str, Any], truncs: dict[str, Any]) -> bool:
    if terms.get(ALL) or truncs.get(ALL):
        return True
    agents = [a for a in {**terms, **truncs} if a != ALL]
    if agents and all(terms.get(a, False) or truncs.get(a, False) for a in agents):
        return True
    # PettingZoo removes finished agents from env.agents
    live = getattr(env, "agents", None)
    return live is not None and len(live) == 0


def agent_ids(obs: Any) -> list[str]:
    return list(obs) if isinstance(obs, dict) else []


def ended_dicts(agents: list[str]) -> tuple[dict[str, bool], dict[str, bool], dict[str, float]]:
    """terminations, truncations, rewards for an episode cut short by a failure."""
    terms = {a: False for a in agents}
    truncs = {a: True for a in agents}
    terms[ALL] = False
    truncs[ALL] = True
    return terms, truncs, {a: 0.0 for a in agents}
