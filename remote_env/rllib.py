"""RLlib (new API stack) over :class:`~remote_env.driver.vector.RemoteVectorEnv`.

RLlib's ``SingleAgentEnvRunner`` vectorizes envs itself unless the env creator returns
a whole vector env, which RLlib supports only with
``gym_env_vectorize_mode="vector_entry_point"``: it then calls the creator once with
``env_config | {"num_envs": n}``. :func:`register` names such a creator (local envs from
``env_config``, or a warm pool's envs) so a config needs just::

    remote_env.rllib.register("remote-cartpole", "CartPole-v1")
    config = (PPOConfig().environment("remote-cartpole")
              .env_runners(num_envs_per_env_runner=8,
                           gym_env_vectorize_mode="vector_entry_point"))

In any other mode RLlib calls the creator once per sub-env, without ``num_envs``; the
creator then raises :class:`VectorizeModeError` naming the setting, instead of RLlib's
``TypeError``/``IndexError`` far from the cause.

RLlib refuses ``vector_entry_point`` for multi-agent envs ("only synchronous
vectorization"): :class:`RemoteMultiAgentEnvRunner` (``env_runner_cls=``) steps the
PettingZoo envs of a registered name in one multi-agent :class:`RemoteVectorEnv`.

Ray RLlib is not a dependency of the library: ``pip install 'ray[rllib]'`` (or the
``bench`` extra's parts of it, as the tests do).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any, cast

import gymnasium as gym
from gymnasium.vector import AutoresetMode

try:
    from ray.rllib.callbacks.utils import make_callback
    from ray.rllib.env.env_context import EnvContext
    from ray.rllib.env.multi_agent_env_runner import MultiAgentEnvRunner
    from ray.rllib.env.vector.vector_multi_agent_env import VectorMultiAgentEnv
    from ray.tune.registry import ENV_CREATOR, _global_registry, register_env
except ImportError as exc:  # pragma: no cover - the message is the point
    raise ImportError(
        "remote_env.rllib needs Ray RLlib: pip install 'ray[rllib]' (or this project's "
        "'bench' extra, which installs RLlib's dependencies)") from exc

from remote_env import entrypoints
from remote_env.driver.vector import RemoteVectorEnv

__all__ = ["MultiAgentVectorEnv", "RemoteMultiAgentEnvRunner", "VectorEnvCreator",
           "VectorizeModeError", "register"]

#: the ``env_config`` key naming a warm pool to lease the envs from (overrides ``pool=``)
POOL_KEY = "pool"
#: RLlib's runners expect NEXT_STEP: the step after an episode's end is its reset
AUTORESET_MODE = AutoresetMode.NEXT_STEP
#: ``wait_s`` of a runner leasing from a pool (unless given): a runner RLlib restarts
#: after its predecessor died waits the second or two the pool server takes to reclaim
#: that lease, rather than failing with LeaseError and leaving RLlib with no samples
POOL_WAIT_S = 15.0

MakeEnv = str | Callable[[dict[str, Any]], Any]


class VectorizeModeError(TypeError):
    """RLlib called the vector-env creator once per sub-env (the wrong vectorize mode)."""


class VectorEnvCreator:
    """An RLlib env creator returning a :class:`RemoteVectorEnv` of ``num_envs`` envs.

    Args:
        make_env: a gymnasium id (``gym.make(id, **env_config)``; ``"module:EnvId"``
            imports the module that registers it; an unknown id fails before any actor) or
            ``fn(env_config) -> env`` (a gymnasium env or a PettingZoo Parallel/AEC env);
            None when the envs come from a pool.
        pool: a warm pool's name to lease ``num_envs`` envs from
            (:meth:`RemoteVectorEnv.from_pool`); ``env_config["pool"]`` overrides it.
        **vector_kwargs: :class:`RemoteVectorEnv` (or ``from_pool``) options.

    Called by RLlib with ``env_config | {"num_envs": n}``; ``env_config`` minus the
    ``pool`` key goes to ``make_env``.
    """

    def __init__(self, make_env: MakeEnv | None = None, *, pool: str | None = None,
                 **vector_kwargs: Any) -> None:
        if make_env is not None and not (isinstance(make_env, str) or callable(make_env)):
            raise TypeError(f"make_env must be a gymnasium id or a callable of env_config, "
                            f"got {type(make_env).__name__}")
        mode = vector_kwargs.pop("autoreset_mode", AUTORESET_MODE)
        if AutoresetMode(mode) != AUTORESET_MODE:
            raise ValueError(f"RLlib's env runners expect autoreset_mode={AUTORESET_MODE.value!r}"
                             f" (the step after an episode's end resets it), got {mode!r}")
        self.make_env = make_env
        self.pool = pool
        self.vector_kwargs = vector_kwargs

    def __call__(self, config: Mapping[str, Any]) -> RemoteVectorEnv:
        if "num_envs" not in config:
            raise VectorizeModeError(
                "this env creator returns a whole RemoteVectorEnv, so RLlib must not "
                "vectorize it: set config.env_runners(gym_env_vectorize_mode="
                "\"vector_entry_point\") (RLlib called the creator once per sub-env, "
                f"with env_config {dict(config)!r} and no 'num_envs')")
        config = dict(config)
        return self.make(config, int(config.pop("num_envs")))

    def make(self, env_config: Mapping[str, Any], num_envs: int) -> RemoteVectorEnv:
        """``num_envs`` envs: leased from the pool if one is named, else created."""
        env_config = dict(env_config)
        pool = env_config.pop(POOL_KEY, None) or self.pool
        if pool is not None:
            options = {"wait_s": POOL_WAIT_S, **self.vector_kwargs}
            envs = RemoteVectorEnv.from_pool(pool, num_envs=num_envs,
                                             autoreset_mode=AUTORESET_MODE, **options)
            if envs.num_envs != num_envs:
                # a pool leases whole actors: a sum of their sizes
                got = envs.num_envs
                envs.close()
                raise ValueError(f"pool {pool!r} leased {got} envs for num_envs_per_env_runner="
                                 f"{num_envs}: make it a multiple of the pool's envsPerActor")
            return envs
        if self.make_env is None:
            raise ValueError("no envs to make: pass make_env (a gymnasium id or a callable of "
                             f"env_config) or a pool name (pool=, or env_config[{POOL_KEY!r}])")
        if isinstance(self.make_env, str):
            factory = entrypoints.EnvFactory(
                self.make_env, None, env_config, instead="make_env as a callable of env_config")
            factory.check()  # an unknown id fails here, in the env runner, before any actor
            fn: Callable[[], Any] = factory
        else:
            fn = functools.partial(self.make_env, env_config)
        return RemoteVectorEnv([fn] * num_envs, autoreset_mode=AUTORESET_MODE,
                               **self.vector_kwargs)


def register(name: str, make_env: MakeEnv | None = None, *, pool: str | None = None,
             **vector_kwargs: Any) -> str:
    """Register ``name`` with Ray Tune's env registry (which RLlib's runners read) as a
    :class:`VectorEnvCreator`; returns ``name`` for ``config.environment(name)``.

    Example:
        >>> register("remote-cartpole", "CartPole-v1", envs_per_actor=4)  # doctest: +SKIP
        >>> register("pooled-cartpole", pool="cartpole")  # doctest: +SKIP
    """
    register_env(name, VectorEnvCreator(make_env, pool=pool, **vector_kwargs))
    return name


class _AgentSpaces:
    """One sub-env's agents and spaces, where RLlib's runner looks for them
    (``env.envs[i].unwrapped.get_observation_space(agent)``): the envs themselves live
    in Ray actors."""

    def __init__(self, observation_spaces: dict[Any, gym.Space[Any]],
                 action_spaces: dict[Any, gym.Space[Any]]) -> None:
        self.possible_agents = list(observation_spaces)
        self.observation_spaces = observation_spaces
        self.action_spaces = action_spaces

    @property
    def unwrapped(self) -> _AgentSpaces:
        return self

    def get_observation_space(self, agent_id: Any) -> gym.Space[Any]:
        return self.observation_spaces[agent_id]

    def get_action_space(self, agent_id: Any) -> gym.Space[Any]:
        return self.action_spaces[agent_id]


class MultiAgentVectorEnv(VectorMultiAgentEnv):  # type: ignore[misc]  # Any without RLlib stubs
    """RLlib's ``VectorMultiAgentEnv`` API (per-env lists of agent dicts) over a
    multi-agent :class:`RemoteVectorEnv` (dicts keyed env id), in NEXT_STEP autoreset as
    RLlib's own ``SyncVectorMultiAgentEnv``."""

    def __init__(self, envs: RemoteVectorEnv) -> None:
        super().__init__()
        if not envs.multi_agent:
            raise TypeError("RemoteMultiAgentEnvRunner steps multi-agent envs (PettingZoo); "
                            "these are single-agent: use RLlib's default runner with "
                            "gym_env_vectorize_mode=\"vector_entry_point\"")
        if envs.autoreset_mode != AUTORESET_MODE:
            raise ValueError(f"RLlib's multi-agent runner expects autoreset_mode="
                             f"{AUTORESET_MODE.value!r}, the vector env has "
                             f"{envs.autoreset_mode.value!r}")
        self.vector = envs
        self.num_envs = envs.num_envs
        # a multi-agent RemoteVectorEnv's single spaces are Dicts keyed by agent
        obs_space = cast(gym.spaces.Dict, envs.single_observation_space)
        act_space = cast(gym.spaces.Dict, envs.single_action_space)
        self.single_observation_space, self.single_action_space = obs_space, act_space
        self.single_observation_spaces = dict(obs_space.spaces)
        self.single_action_spaces = dict(act_space.spaces)
        view = _AgentSpaces(self.single_observation_spaces, self.single_action_spaces)
        self.envs = [view] * self.num_envs
        self.metadata = dict(envs.metadata)
        self.render_mode = envs.render_mode

    def reset(self, *, seed: int | None = None,
              options: dict[str, Any] | None = None) -> tuple[list[Any], list[Any]]:
        super().reset(seed=seed)
        obs, infos = self.vector.reset(seed=seed, options=options)
        return self._by_env(obs), self._by_env(infos)

    def step(self, actions: list[dict[Any, Any]]) -> tuple[list[Any], ...]:
        results = self.vector.step(list(actions))
        return tuple(self._by_env(r) for r in results)

    def _by_env(self, values: Any) -> list[Any]:
        # results are dicts keyed env id (an int)
        return [values.get(e, {}) for e in range(self.num_envs)]

    def close_extras(self, **kwargs: Any) -> None:
        self.vector.close(**kwargs)


class RemoteMultiAgentEnvRunner(MultiAgentEnvRunner):  # type: ignore[misc]
    """RLlib's ``MultiAgentEnvRunner`` whose envs are one multi-agent RemoteVectorEnv.

    ``config.environment(name)`` names an env registered with :func:`register` (its
    ``make_env`` returns a PettingZoo env, or ``pool=`` names a multi-agent pool), or any
    creator that returns a multi-agent RemoteVectorEnv when called with
    ``env_config | {"num_envs": n}``. ``gym_env_vectorize_mode`` plays no part.

    Example:
        >>> register("rps", lambda cfg: examples.rps_parallel_env())  # doctest: +SKIP
        >>> config = (PPOConfig().environment("rps")  # doctest: +SKIP
        ...           .env_runners(env_runner_cls=RemoteMultiAgentEnvRunner)
        ...           .multi_agent(policies={"p0", "p1"}, policy_mapping_fn=...))
    """

    def make_env(self) -> None:
        old = getattr(self, "env", None)  # RLlib's attribute, set in its __init__
        if old is not None:
            old.close()
            self.env = None
        env_ctx = self.config.env_config
        if not isinstance(env_ctx, EnvContext):
            env_ctx = EnvContext(env_ctx, worker_index=self.worker_index,
                                 num_workers=self.config.num_env_runners,
                                 remote=self.config.remote_worker_envs)
        creator = self.config.env
        if isinstance(creator, str):
            if not _global_registry.contains(ENV_CREATOR, creator):
                raise ValueError(
                    f"RemoteMultiAgentEnvRunner needs config.environment({creator!r}) to name "
                    "an env registered with remote_env.rllib.register (or a creator)")
            creator = _global_registry.get(ENV_CREATOR, creator)
        n = self.config.num_envs_per_env_runner
        vector = (creator.make(env_ctx, n) if isinstance(creator, VectorEnvCreator)
                  else creator(dict(env_ctx) | {"num_envs": n}))
        if not isinstance(vector, RemoteVectorEnv):
            raise TypeError(f"the env creator returned {type(vector).__name__}, "
                            "not a RemoteVectorEnv")
        try:
            self.env = MultiAgentVectorEnv(vector)
        except BaseException:
            vector.close()
            raise
        self.num_envs = self.env.num_envs
        self._needs_initial_reset = True
        make_callback("on_environment_created", callbacks_objects=self._callbacks,
                      callbacks_functions=self.config.callbacks_on_environment_created,
                      kwargs={"env_runner": self, "metrics_logger": self.metrics,
                              "env": self.env.unwrapped, "env_context": env_ctx})
