"""Result assembly: host Batches in, gymnasium-shaped batched results out.

Holds the driver's copy of the last observation of every env (the batched buffer
for Box spaces, one entry per env otherwise), which is also what a failed step
returns for envs whose actor was lost.
"""

from __future__ import annotations

from copy import deepcopy
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import VectorEnv
from gymnasium.vector.utils import concatenate, create_empty_array

from remote_env import multi_agent
from remote_env._types import Batch

Results = tuple[Any, Any, Any, Any, dict[str, Any]]
Batches = list[tuple[np.ndarray, Batch]]


def _has_infos(batch: Batch) -> bool:
    """Any non-empty info in ``batch`` (``infos == []``: none at all, the actor sent none)."""
    return any(batch.infos)


def _order(ids: np.ndarray) -> tuple[bool, slice | None]:
    """Whether ``ids`` ascend, and the slice they are when also consecutive.

    On a Python list: for the few dozen ids of a call that is ~1 us against ~3 us of
    numpy compares and reductions, on every ``recv``.
    """
    ids_list = ids.tolist()
    if ids_list != sorted(ids_list):
        return False, None
    if not ids_list or ids_list[-1] - ids_list[0] + 1 != len(ids_list):
        return True, None
    return True, slice(ids_list[0], ids_list[-1] + 1)


class _InfoMerger:
    """Lets gymnasium's own ``VectorEnv._add_info`` build infos for a partial batch."""

    _add_info: Any = VectorEnv._add_info

    def __init__(self, num_envs: int) -> None:
        self.num_envs = num_envs


class Assembler:
    """Merges per-host results into batched results, as ``SyncVectorEnv`` returns them."""

    def __init__(self, single_observation_space: Any, num_envs: int, *, multi_agent: bool,
                 copy: bool) -> None:
        self.space = single_observation_space
        self.num_envs = num_envs
        self.multi_agent = multi_agent
        self.copy = copy
        self.box_obs = isinstance(single_observation_space, gym.spaces.Box)
        self.env_obs: list[Any] = [None] * num_envs
        self.observations: Any = (
            None if multi_agent else create_empty_array(single_observation_space, num_envs,
                                                        fn=np.zeros)
        )

    def full(self, batches: Batches) -> Results:
        """Results for all envs in env-id order."""
        if self.multi_agent:
            return self._multi_agent(batches)
        n = self.num_envs
        rewards = np.zeros(n, dtype=np.float64)
        terms = np.zeros(n, dtype=np.bool_)
        truncs = np.zeros(n, dtype=np.bool_)
        merger = _InfoMerger(n)
        infos: dict[str, Any] = {}
        per_env_infos: list[tuple[int, dict[str, Any]]] = []
        for ids, b in batches:
            self._store_obs(ids, b.obs, _order(ids)[1])
            rewards[ids] = b.rewards
            terms[ids] = b.terminations
            truncs[ids] = b.truncations
            if b.infos:  # [] : the actor sent none (all empty)
                per_env_infos.extend(zip(ids.tolist(), b.infos, strict=True))
        per_env_infos.sort(key=lambda x: x[0])
        for e, info in per_env_infos:
            if info:
                infos = merger._add_info(infos, info, e)
        if not self.box_obs:
            out: Any = self.observations
            self.observations = concatenate(self.space, self.env_obs, out)
        if not self.copy:
            obs = self.observations
        elif self.box_obs:
            obs = self.observations.copy()
        else:
            obs = deepcopy(self.observations)
        return obs, rewards, terms, truncs, infos

    def partial(self, batches: Batches) -> Results:
        """Results for the envs in ``batches``, ascending env ids in ``infos["env_id"]``.

        The usual ``recv`` holds one host's envs in ascending order: that case costs
        no sort, no gather and no per-env Python (it runs on every call).
        """
        ids = batches[0][0] if len(batches) == 1 else np.concatenate([b[0] for b in batches])
        if self.multi_agent:
            result = self._multi_agent(batches)
            result[4]["env_id"] = np.sort(ids)
            return result
        ascending, span = _order(ids)
        if len(batches) == 1:
            self._store_obs(ids, batches[0][1].obs, span)
        else:
            for b_ids, b in batches:
                self._store_obs(b_ids, b.obs, _order(b_ids)[1])
        m = len(ids)
        if len(batches) == 1:  # no generator, no getattr by name: this runs on every recv
            one = batches[0][1]
            rewards = np.array(one.rewards, dtype=np.float64)
            terms = np.array(one.terminations, dtype=np.bool_)
            truncs = np.array(one.truncations, dtype=np.bool_)
        else:
            rewards, terms, truncs = (
                np.concatenate([np.asarray(getattr(b, f), dtype=dt) for _, b in batches])
                for f, dt in (("rewards", np.float64), ("terminations", np.bool_),
                              ("truncations", np.bool_)))
        order: Any = None
        if not ascending:
            order = np.argsort(ids, kind="stable")
            ids, rewards, terms, truncs = ids[order], rewards[order], terms[order], truncs[order]
        infos: dict[str, Any] = {}
        if (_has_infos(batches[0][1]) if len(batches) == 1
                else any(_has_infos(b) for _, b in batches)):
            all_infos = [i for _, b in batches for i in (b.infos or [{}] * len(b.indices))]
            merger = _InfoMerger(m)
            for j, src in enumerate(range(m) if order is None else order):
                if all_infos[src]:
                    infos = merger._add_info(infos, all_infos[src], j)
        if self.box_obs:
            got = batches[0][1].obs
            if (not self.copy and span is not None and len(batches) == 1
                    and type(got) is np.ndarray and got.flags.writeable
                    and got.dtype == self.observations.dtype and len(got) == m):
                # the batch as it came: rows of the shared-memory segment (valid until
                # these envs are sent again: the actor writes their next rows there) or
                # an array of its own (the socket's pickled path). No copy out, and no
                # fresh array of this size each call (big ones cost page faults). Not
                # Ray's read-only arrays (object store memory): those are copied
                obs: Any = got
            else:  # a slice copies rows without a gather
                obs = (self.observations[span].copy() if span is not None
                       else self.observations[ids])
        else:
            buf: Any = create_empty_array(self.space, m, fn=np.zeros)
            obs = concatenate(self.space, [self.env_obs[int(e)] for e in ids], buf)
        infos["env_id"] = ids.copy() if ids is batches[0][0] else ids
        return obs, rewards, terms, truncs, infos

    def _multi_agent(self, batches: Batches) -> Results:
        obs: dict[int, Any] = {}
        rew: dict[int, Any] = {}
        term: dict[int, Any] = {}
        trunc: dict[int, Any] = {}
        infos: dict[Any, Any] = {}
        for ids, b in batches:
            for j, e in enumerate(ids.tolist()):
                obs[e] = b.obs[j]
                self.env_obs[e] = b.obs[j]
                rew[e], term[e], trunc[e], infos[e] = (
                    b.rewards[j], b.terminations[j], b.truncations[j], b.infos[j]
                )
        keys = sorted(obs)
        result = tuple({k: d[k] for k in keys} for d in (obs, rew, term, trunc, infos))
        out_infos: dict[Any, Any] = dict(result[4])
        return result[0], result[1], result[2], result[3], out_infos

    def _store_obs(self, ids: np.ndarray, obs: Any, span: slice | None = None) -> None:
        """Keep the last observations of ``ids`` (``span``: the same ids as a slice)."""
        if self.box_obs:
            self.observations[ids if span is None else span] = obs  # the truth for Box spaces
        else:
            for e, o in zip(ids.tolist(), obs, strict=True):
                self.env_obs[e] = o

    # ------------------------------------------- results the driver makes up
    def last_obs(self, e: int) -> Any:
        if self.box_obs:
            return self.observations[e].copy()
        if self.env_obs[e] is not None:
            return self.env_obs[e]
        return {} if self.multi_agent else self.space.sample()

    def failed(self, positions: list[int], env_ids: np.ndarray, error: str, is_reset: bool,
               reset: Batch | None = None, last: list[Any] | None = None) -> Batch:
        """The step result of envs whose actor was lost: a truncated episode end.

        With ``reset`` (SAME_STEP: the replacement's reset of these envs) the
        observations are the new episode's and the last ones go to ``final_obs``.
        """
        obs = last if last is not None else [self.last_obs(int(e)) for e in env_ids]
        infos: list[dict[str, Any]] = [{"error": error} for _ in env_ids]
        failures = []
        if reset is not None:
            infos = [
                {"final_obs": o, "final_info": {"error": error}, **ri, "error": error}
                for o, ri in zip(obs, reset.infos or [{}] * len(obs), strict=True)
            ]
            obs = list(reset.obs)
            failures = reset.failures
        if self.multi_agent:
            ended = [multi_agent.ended_dicts(multi_agent.agent_ids(o)) for o in obs]
            return Batch(list(positions), obs, [x[2] for x in ended], [x[0] for x in ended],
                         [x[1] for x in ended], infos, failures, is_reset)
        k = len(env_ids)
        stacked: Any = np.stack(obs) if self.box_obs else obs
        return Batch(list(positions), stacked, np.zeros(k), np.zeros(k, dtype=np.bool_),
                     np.ones(k, dtype=np.bool_), infos, failures, is_reset)
