"""Stable-Baselines3 ``VecEnv`` over :class:`~remote_env.driver.vector.RemoteVectorEnv`.

SB3 takes only its own ``VecEnv`` API: ``reset()`` returns observations alone (their
infos in ``reset_infos``), ``step`` returns ``dones`` and a list of per-env info dicts,
and a finished env is reset in the same step with its last observation in
``info["terminal_observation"]``, as ``DummyVecEnv`` does. This adapter gives that
API in every gymnasium autoreset mode of the vector env: SAME_STEP already resets in
the step (``final_obs``/``final_info``); with NEXT_STEP one more step of just the
finished envs is their reset (``env.reset()`` in their actors, as DummyVecEnv's);
DISABLED resets them with ``reset(options={"reset_mask": ...})``, whose envs get
``options={}`` as in gymnasium's ``SyncVectorEnv``.

Stable-Baselines3 is not a dependency of the library: install the ``frameworks``
extra (``pip install 'envpool-k8s[frameworks]'``).

Example:
    >>> from stable_baselines3 import PPO  # doctest: +SKIP
    >>> from stable_baselines3.common.vec_env import VecMonitor  # doctest: +SKIP
    >>> envs = SB3VecEnv([lambda: gym.make("CartPole-v1")] * 8)  # doctest: +SKIP
    >>> PPO("MlpPolicy", VecMonitor(envs)).learn(10_000)  # doctest: +SKIP
    >>> envs = SB3VecEnv.from_pool("cartpole", num_envs=8)  # a pool's, leased in SameStep  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode

try:
    from stable_baselines3.common.vec_env.base_vec_env import VecEnv
except ImportError as exc:  # pragma: no cover - the message is the point
    raise ImportError(
        "remote_env.sb3 needs Stable-Baselines3 (and torch): install the 'frameworks' "
        "extra, pip install 'envpool-k8s[frameworks]', or pip install 'stable-baselines3>=2.3'"
    ) from exc

from remote_env.actor.host import EnvFn
from remote_env.driver.vector import RemoteVectorEnv

__all__ = ["SB3VecEnv", "unbatch_infos"]

Indices = None | int | Iterable[int]


class SB3VecEnv(VecEnv):  # type: ignore[misc,unused-ignore]  # Any without SB3
    """A Stable-Baselines3 ``VecEnv`` whose sub-envs live in Ray actors.

    Args:
        envs: a :class:`RemoteVectorEnv` (any autoreset mode; closed with this adapter),
            or make-env callables to build one with ``kwargs``.
        **kwargs: :class:`RemoteVectorEnv` options when ``envs`` are callables.

    ``get_attr``/``set_attr``/``env_method``/``env_is_wrapped`` with ``indices`` reach
    only those sub-envs (one call per actor). Seeds (:meth:`seed`) and options
    (:meth:`set_options`) apply at the next :meth:`reset`, as in SB3.
    """

    def __init__(self, envs: RemoteVectorEnv | Sequence[EnvFn], **kwargs: Any) -> None:
        if not isinstance(envs, RemoteVectorEnv):
            envs = RemoteVectorEnv(envs, **kwargs)
        elif kwargs:
            raise TypeError(f"options {sorted(kwargs)} are for building a RemoteVectorEnv; "
                            "this one is built already")
        if envs.multi_agent:
            raise TypeError(
                "SB3VecEnv steps single-agent envs; these are multi-agent (PettingZoo) envs. "
                "Turn them into single-agent ones first (e.g. one policy per agent with "
                "SuperSuit's pettingzoo_env_to_vec_env_v1) or use a multi-agent trainer")
        self.venv = envs
        super().__init__(envs.num_envs, envs.single_observation_space, envs.single_action_space)
        self.metadata = {k: v for k, v in envs.metadata.items() if k != "autoreset_mode"}
        self._actions: Any = None

    @classmethod
    def from_pool(cls, name: str, *,
                  autoreset_mode: str | AutoresetMode = AutoresetMode.SAME_STEP,
                  **kwargs: Any) -> SB3VecEnv:
        """This adapter over envs leased from the running pool ``name``
        (:meth:`RemoteVectorEnv.from_pool`'s ``kwargs``), served in ``autoreset_mode``
        whatever the pool's spec says: SAME_STEP by default, where the actors reset a
        finished env within its step, as SB3 wants, and neither NEXT_STEP's extra step
        nor DISABLED's reset costs a round trip. Closing it releases the lease."""
        envs = RemoteVectorEnv.from_pool(name, autoreset_mode=autoreset_mode, **kwargs)
        try:
            return cls(envs)
        except BaseException:
            envs.close()
            raise

    # ------------------------------------------------------------------ steps
    def reset(self) -> Any:
        """Reset every env with the seeds and options set since the last reset."""
        seeds = list(self._seeds)
        seed = seeds if any(s is not None for s in seeds) else None
        groups: dict[str, tuple[dict[str, Any], list[int]]] = {}
        for i, opts in enumerate(self._options):  # envs with the same options: one reset
            groups.setdefault(repr(sorted(opts.items())), (opts, []))[1].append(i)
        obs: Any = None
        for opts, ids in groups.values():
            options: dict[str, Any] | None = dict(opts) if opts else None
            if len(groups) > 1:
                mask = np.zeros(self.num_envs, dtype=np.bool_)
                mask[ids] = True
                options = {**(options or {}), "reset_mask": mask}
            obs, infos = self.venv.reset(seed=seed, options=options)
            per_env = unbatch_infos(infos, self.num_envs)
            for i in ids:
                self.reset_infos[i] = per_env[i]
        self._reset_seeds()
        self._reset_options()
        return obs

    def step_async(self, actions: np.ndarray) -> None:
        self._actions = actions
        self.venv.step_async(actions)

    def _next_step_reset(self, obs: Any, done_ids: list[int]) -> Any:
        """NEXT_STEP: one more step of the finished envs is their reset (in their
        actors, ``env.reset()`` without options, as DummyVecEnv); the actions, the
        ones they just took, are not used. Their new observations go into ``obs``."""
        ids = np.asarray(done_ids)
        self.venv.send(np.asarray(self._actions)[ids], ids)
        left = set(done_ids)
        while left:
            got, _, _, _, infos = self.venv.recv()
            got_ids = infos["env_id"].tolist()
            for j, (e, info) in enumerate(
                    zip(got_ids, unbatch_infos(infos, len(got_ids)), strict=True)):
                _set_row(self.observation_space, obs, e, _row(self.observation_space, got, j))
                self.reset_infos[e] = info
                left.discard(e)
        return obs

    def step_wait(self) -> tuple[Any, np.ndarray, np.ndarray, list[dict[str, Any]]]:
        obs, rewards, terms, truncs, infos = self.venv.step_wait()
        dones = np.logical_or(terms, truncs)
        per_env = unbatch_infos(infos, self.num_envs)
        done_ids = np.flatnonzero(dones).tolist()
        if self.venv.autoreset_mode is AutoresetMode.SAME_STEP:
            for i in done_ids:  # reset in the step: the step's own info is final_info
                info = per_env[i]
                last = info.pop("final_obs", None)
                step_info = info.pop("final_info", {})
                info.pop("_final_obs", None)
                info.pop("_final_info", None)
                self.reset_infos[i] = info
                per_env[i] = {**step_info, "terminal_observation": last}
        elif done_ids:  # reset the finished envs now, as DummyVecEnv does
            for i in done_ids:
                per_env[i]["terminal_observation"] = _row(self.observation_space, obs, i)
            if self.venv.autoreset_mode is AutoresetMode.NEXT_STEP:
                obs = self._next_step_reset(obs, done_ids)
            else:  # DISABLED: a reset of just these envs
                mask = np.zeros(self.num_envs, dtype=np.bool_)
                mask[done_ids] = True
                obs, reset_infos = self.venv.reset(options={"reset_mask": mask})
                reset_per_env = unbatch_infos(reset_infos, self.num_envs)
                for i in done_ids:
                    self.reset_infos[i] = reset_per_env[i]
        for i, info in enumerate(per_env):
            info["TimeLimit.truncated"] = bool(truncs[i] and not terms[i])
        return obs, np.asarray(rewards, dtype=np.float32), dones, per_env

    def close(self) -> None:
        self.venv.close()

    # -------------------------------------------------------- the sub-envs
    def get_attr(self, attr_name: str, indices: Indices = None) -> list[Any]:
        return list(self.venv.get_attr(attr_name, env_ids=self._ids(indices)))

    def set_attr(self, attr_name: str, value: Any, indices: Indices = None) -> None:
        ids = self._ids(indices)
        self.venv.set_attr(attr_name, [value] * len(ids), env_ids=ids)

    def env_method(self, method_name: str, *method_args: Any, indices: Indices = None,
                   **method_kwargs: Any) -> list[Any]:
        return list(self.venv.call(method_name, *method_args, env_ids=self._ids(indices),
                                   **method_kwargs))

    def env_is_wrapped(self, wrapper_class: type[gym.Wrapper[Any, Any, Any, Any]],
                       indices: Indices = None) -> list[bool]:
        return list(self.venv.env_is_wrapped(wrapper_class, env_ids=self._ids(indices)))

    def get_images(self) -> Sequence[np.ndarray | None]:
        if self.render_mode != "rgb_array":
            return [None] * self.num_envs
        return list(self.venv.call("render"))

    def _ids(self, indices: Indices) -> list[int]:
        return [int(i) for i in self._get_indices(indices)]


def _row(space: gym.spaces.Space[Any], batched: Any, i: int) -> Any:
    """Env ``i``'s observation out of a batch (a copy: the batch is reused)."""
    if isinstance(space, gym.spaces.Dict):
        return {k: _row(s, batched[k], i) for k, s in space.spaces.items()}
    if isinstance(space, gym.spaces.Tuple):
        return tuple(_row(s, b, i) for s, b in zip(space.spaces, batched, strict=True))
    return np.copy(batched[i])


def _set_row(space: gym.spaces.Space[Any], batched: Any, i: int, value: Any) -> None:
    if isinstance(space, gym.spaces.Dict):
        for k, s in space.spaces.items():
            _set_row(s, batched[k], i, value[k])
    elif isinstance(space, gym.spaces.Tuple):
        for s, b, v in zip(space.spaces, batched, value, strict=True):
            _set_row(s, b, i, v)
    else:
        batched[i] = value


def unbatch_infos(infos: dict[str, Any], n: int) -> list[dict[str, Any]]:
    """gymnasium's batched infos (``key`` arrays with ``_key`` masks) as one dict per env.

    Nested dicts come back as dicts; numbers and flags as Python scalars (an array of
    them holds numpy ones), other values as they were.
    """
    out: list[dict[str, Any]] = [{} for _ in range(n)]
    for key, value in infos.items():
        mask = infos.get(f"_{key}") if isinstance(key, str) else None
        if mask is None:
            continue  # a mask itself (or env_id): no per-env value of its own
        where = np.flatnonzero(mask).tolist()
        if isinstance(value, dict):
            sub = unbatch_infos(value, n)
            for i in where:
                out[i][key] = sub[i]
        elif isinstance(value, np.ndarray) and value.dtype != object:
            for i in where:
                out[i][key] = value[i].item() if value.ndim == 1 else value[i]
        else:
            for i in where:
                out[i][key] = value[i]
    return out
