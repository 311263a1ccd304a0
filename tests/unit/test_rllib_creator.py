"""remote_env.rllib's creator refuses what it cannot build, before any Ray call: no env
to make, a make_env that is neither an id nor a callable, RLlib's per-sub-env calls."""

from __future__ import annotations

import pytest
from ray.rllib.env.env_context import EnvContext

from remote_env import rllib


def test_creator_called_per_sub_env_names_the_vectorize_mode() -> None:
    creator = rllib.VectorEnvCreator("CartPole-v1")
    # what RLlib passes in "sync"/"async" mode: the EnvContext alone, no num_envs
    with pytest.raises(rllib.VectorizeModeError,
                       match=r'gym_env_vectorize_mode="vector_entry_point".*\{\'max\': 3\}'):
        creator(EnvContext({"max": 3}, worker_index=1))


def test_creator_without_env_or_pool_says_what_to_pass() -> None:
    with pytest.raises(ValueError, match=r"make_env.*or a pool name.*env_config\['pool'\]"):
        rllib.VectorEnvCreator()({"num_envs": 2})


def test_make_env_must_be_an_id_or_a_callable() -> None:
    with pytest.raises(TypeError, match=r"gymnasium id or a callable.*got int"):
        rllib.VectorEnvCreator(3)  # type: ignore[arg-type]


def test_an_unknown_id_fails_in_the_runner_before_any_actor(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import gymnasium as gym

    # whether a vector env (and so any actor) was made: not whether Ray is initialized,
    # which an earlier test of the same run may have done (a whole run failed on that)
    made: list[object] = []
    monkeypatch.setattr(rllib, "RemoteVectorEnv", lambda *a, **k: made.append(a))
    with pytest.raises(gym.error.NameNotFound,
                       match=r"env id 'CartPol-v1' is not registered with gymnasium: .*"
                             r"Did you mean: `CartPole`\?.*'module:EnvId'.*"
                             r"make_env as a callable of env_config"):
        rllib.VectorEnvCreator("CartPol-v1")({"num_envs": 2})
    assert made == []
