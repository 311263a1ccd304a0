"""Adapters for multi-agent envs: PettingZoo Parallel API and RLlib-style dicts.

Both APIs take and return ``{agent_id: value}`` dicts. RLlib marks the end of an
episode with ``"__all__"``; PettingZoo by emptying ``env.agents``. Results here
always carry ``"__all__"`` in terminations/truncations so either kind of caller
finds what it expects.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym

ALL = "__all__"


def is_multi_agent(env: Any) -> bool:
    """A non-gymnasium env with ``possible_agents`` is treated as multi-agent."""
    return not isinstance(env, gym.Env) and hasattr(env, "possible_agents")


def spaces(env: Any) -> tuple[gym.spaces.Dict, gym.spaces.Dict]:
    """Per-agent spaces as gymnasium ``Dict`` spaces keyed by agent id."""
    agents = list(env.possible_agents)
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
