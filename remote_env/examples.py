"""Small envs for examples, manifests and fault-injection tests.

Importable by entrypoint (``remote_env.examples:make_slow_cartpole``) from an
EnvPool's ``spec.env.entrypoint``.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

import gymnasium as gym
import numpy as np
from pettingzoo import AECEnv, ParallelEnv

_ROCK, _PAPER, _SCISSORS, _NONE = 0, 1, 2, 3


class RockPaperScissors(ParallelEnv):  # type: ignore[misc]
    """Two-player rock-paper-scissors on the PettingZoo Parallel API.

    PettingZoo's own ``classic.rps_v2`` imports pygame at module load; this one has
    no extra dependency. Observation: the opponent's last move (3 = none yet). Passes
    ``pettingzoo.test.parallel_api_test``: one space object per agent, ``render_mode``.
    """

    metadata: dict[str, Any] = {"name": "rps_v0", "render_modes": ["human", "ansi"],
                                "is_parallelizable": True}

    def __init__(self, max_cycles: int = 100, render_mode: str | None = None) -> None:
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(f"render_mode must be one of {self.metadata['render_modes']} or "
                             f"None, got {render_mode!r}")
        self.possible_agents = ["player_0", "player_1"]
        self.agents: list[str] = []
        self.max_cycles = max_cycles
        self.render_mode = render_mode
        self._cycle = 0
        self._last: dict[str, int] = {}
        # the same object per agent on every call: seeding an agent's space must stick
        self._observation_spaces = {a: gym.spaces.Discrete(4) for a in self.possible_agents}
        self._action_spaces = {a: gym.spaces.Discrete(3) for a in self.possible_agents}

    def observation_space(self, agent: str) -> gym.spaces.Space[Any]:
        return self._observation_spaces[agent]

    def action_space(self, agent: str) -> gym.spaces.Space[Any]:
        return self._action_spaces[agent]

    def reset(
        self, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[str, int], dict[str, dict[str, Any]]]:
        self.agents = list(self.possible_agents)
        self._cycle = 0
        self._last = {}
        return {a: _NONE for a in self.agents}, {a: {} for a in self.agents}

    def step(self, actions: dict[str, int]) -> tuple[Any, Any, Any, Any, Any]:
        a0, a1 = int(actions["player_0"]), int(actions["player_1"])
        r0 = 0.0 if a0 == a1 else (1.0 if (a0 - a1) % 3 == 1 else -1.0)
        self._cycle += 1
        self._last = {"player_0": a0, "player_1": a1}
        done = self._cycle >= self.max_cycles
        obs = {"player_0": a1, "player_1": a0}
        rewards = {"player_0": r0, "player_1": -r0}
        terms = {a: False for a in self.agents}
        truncs = {a: done for a in self.agents}
        infos: dict[str, dict[str, Any]] = {a: {} for a in self.agents}
        if done:
            self.agents = []
        if self.render_mode == "human":
            print(self.render())
        return obs, rewards, terms, truncs, infos

    def render(self) -> str | None:
        if self.render_mode is None:
            return None
        names = {_ROCK: "rock", _PAPER: "paper", _SCISSORS: "scissors"}
        moves = ", ".join(f"{a}: {names[m]}" for a, m in self._last.items()) or "no moves yet"
        return f"cycle {self._cycle}: {moves}"


def rps_parallel_env(max_cycles: int = 100, render_mode: str | None = None) -> RockPaperScissors:
    return RockPaperScissors(max_cycles=max_cycles, render_mode=render_mode)


class RockPaperScissorsAEC(AECEnv):  # type: ignore[misc]
    """:class:`RockPaperScissors` on PettingZoo's AEC API: the players move in turn and
    the round is scored at the cycle's end, so it is ``is_parallelizable`` (a vector env
    converts it with PettingZoo's ``aec_to_parallel``). ``parallelizable=False`` says
    otherwise in its metadata, and a vector env refuses it."""

    metadata: dict[str, Any] = {"name": "rps_aec_v0", "render_modes": [], "is_parallelizable": True}

    def __init__(self, max_cycles: int = 100, parallelizable: bool = True) -> None:
        self.metadata = {**self.metadata, "is_parallelizable": parallelizable}
        self.possible_agents = ["player_0", "player_1"]
        self.agents: list[str] = []
        self.max_cycles = max_cycles
        self.render_mode = None
        self._observation_spaces = {a: gym.spaces.Discrete(4) for a in self.possible_agents}
        self._action_spaces = {a: gym.spaces.Discrete(3) for a in self.possible_agents}

    def observation_space(self, agent: str) -> gym.spaces.Space[Any]:
        return self._observation_spaces[agent]

    def action_space(self, agent: str) -> gym.spaces.Space[Any]:
        return self._action_spaces[agent]

    def observe(self, agent: str) -> int:
        return self._obs[agent]

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> None:
        self.agents = list(self.possible_agents)
        self.agent_selection = self.agents[0]
        self.rewards = {a: 0.0 for a in self.agents}
        self._cumulative_rewards = {a: 0.0 for a in self.agents}
        self.terminations = {a: False for a in self.agents}
        self.truncations = {a: False for a in self.agents}
        self.infos: dict[str, dict[str, Any]] = {a: {} for a in self.agents}
        self._obs = {a: _NONE for a in self.agents}
        self._moves: dict[str, int] = {}
        self._cycle = 0

    def step(self, action: Any) -> None:
        agent = self.agent_selection
        if self.terminations[agent] or self.truncations[agent]:
            self._was_dead_step(action)
            return
        self._cumulative_rewards[agent] = 0.0
        self._moves[agent] = int(action)
        if agent == self.agents[-1]:  # the cycle's end: score it
            a0, a1 = self._moves["player_0"], self._moves["player_1"]
            r0 = 0.0 if a0 == a1 else (1.0 if (a0 - a1) % 3 == 1 else -1.0)
            self.rewards = {"player_0": r0, "player_1": -r0}
            self._obs = {"player_0": a1, "player_1": a0}
            self._cycle += 1
            self.truncations = {a: self._cycle >= self.max_cycles for a in self.agents}
        else:
            self._clear_rewards()
        self.agent_selection = self.agents[(self.agents.index(agent) + 1) % len(self.agents)]
        self._accumulate_rewards()


def rps_aec_env(max_cycles: int = 100, parallelizable: bool = True) -> RockPaperScissorsAEC:
    return RockPaperScissorsAEC(max_cycles=max_cycles, parallelizable=parallelizable)


class AgentsAfterReset(RockPaperScissors):
    """:class:`RockPaperScissors` without ``possible_agents``: as some PettingZoo envs, it
    names its agents only in ``agents`` once reset (PettingZoo warns but allows it)."""

    def __init__(self, max_cycles: int = 100) -> None:
        super().__init__(max_cycles)
        self._agent_names = self.possible_agents
        del self.possible_agents

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        self.possible_agents = self._agent_names
        try:
            return super().reset(seed=seed, options=options)
        finally:
            del self.possible_agents


class SlowCartPole(gym.Wrapper[Any, Any, Any, Any]):
    """CartPole that waits ``step_delay_ms`` per step, like an I/O-bound simulator.

    ``SLOW_CARTPOLE_JITTER_MS`` (env var, e.g. set through a Ray runtimeEnv) adds
    uniform jitter so some envs are slower than others.
    """

    def __init__(self, step_delay_ms: float = 1.0) -> None:
        super().__init__(gym.make("CartPole-v1"))
        self._delay = step_delay_ms / 1000.0
        self._jitter = float(os.environ.get("SLOW_CARTPOLE_JITTER_MS", "0")) / 1000.0
        self._rng = np.random.default_rng()

    def step(self, action: Any) -> Any:
        delay = self._delay + (self._rng.uniform(0, self._jitter) if self._jitter else 0.0)
        if delay > 0:
            time.sleep(delay)
        return self.env.step(action)


def make_slow_cartpole(step_delay_ms: float = 1.0) -> SlowCartPole:
    return SlowCartPole(step_delay_ms)


class AsyncSlowCartPole(SlowCartPole):
    """:class:`SlowCartPole` whose wait can also be awaited (``astep``/``areset``).

    The same env for gymnasium (``step`` still blocks); a host awaits many of them
    on one event loop instead of parking a thread per env in ``time.sleep``.
    """

    async def astep(self, action: Any) -> Any:
        delay = self._delay + (self._rng.uniform(0, self._jitter) if self._jitter else 0.0)
        if delay > 0:
            await asyncio.sleep(delay)
        return self.env.step(action)

    async def areset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        return self.env.reset(seed=seed, options=options)


def make_async_slow_cartpole(step_delay_ms: float = 1.0) -> AsyncSlowCartPole:
    return AsyncSlowCartPole(step_delay_ms)


class FaultyEnv(gym.Wrapper[Any, Any, Any, Any]):
    """CartPole that fails on purpose: raises at step N, in reset, or hangs.

    Args:
        fail_at_step: raise on this step count (1-based) of the env's lifetime.
        fail_in_reset: raise on this reset count (1-based).
        hang_at_step: sleep forever on this step count.
        once_file: when given, the fault fires only if this file does not exist yet
            (and creates it), so a restarted env does not fail again.
    """

    def __init__(
        self,
        fail_at_step: int | None = None,
        fail_in_reset: int | None = None,
        hang_at_step: int | None = None,
        once_file: str | None = None,
    ) -> None:
        super().__init__(gym.make("CartPole-v1"))
        self.fail_at_step = fail_at_step
        self.fail_in_reset = fail_in_reset
        self.hang_at_step = hang_at_step
        self.once_file = once_file
        self.steps = 0
        self.resets = 0

    def _fire(self) -> bool:
        if self.once_file is None:
            return True
        try:
            with open(self.once_file, "x"):
                return True
        except FileExistsError:
            return False

    def reset(self, **kwargs: Any) -> Any:
        self.resets += 1
        if self.resets == self.fail_in_reset and self._fire():
            raise RuntimeError(f"injected failure in reset #{self.resets}")
        return self.env.reset(**kwargs)

    def step(self, action: Any) -> Any:
        self.steps += 1
        if self.steps == self.fail_at_step and self._fire():
            raise RuntimeError(f"injected failure at step {self.steps}")
        if self.steps == self.hang_at_step and self._fire():
            while True:
                time.sleep(3600)
        return self.env.step(action)


def make_flaky_cartpole(fail_every: int = 50) -> FlakyCartPole:
    """CartPole raising every ``fail_every`` steps: a steady source of restarts."""
    return FlakyCartPole(fail_every)


class FlakyCartPole(gym.Wrapper[Any, Any, Any, Any]):
    def __init__(self, fail_every: int = 50) -> None:
        super().__init__(gym.make("CartPole-v1"))
        self.fail_every = fail_every
        self.steps = 0

    def step(self, action: Any) -> Any:
        self.steps += 1
        if self.fail_every > 0 and self.steps % self.fail_every == 0:
            raise RuntimeError(f"injected failure at step {self.steps}")
        return self.env.step(action)


class ChaosCartPole(gym.Wrapper[Any, Any, Any, Any]):
    """CartPole that raises or hangs when told to from outside its process: a file
    ``raise`` or ``hang`` created in ``trigger_dir`` (``kubectl exec <pod> -- touch
    /tmp/envpool-chaos/raise``) is taken by the first env of that pod that steps next
    (it removes the file, so exactly one env fires per file). The chaos soak
    (``scripts/soak``) injects env faults this way on real pods.

    ``revision`` does nothing: changing it changes the env's signature, which rolls a
    pool's envs in place (what the soak's rolling-update fault does).
    """

    def __init__(self, trigger_dir: str = "/tmp/envpool-chaos", revision: int = 0) -> None:
        super().__init__(gym.make("CartPole-v1"))
        self.trigger_dir = trigger_dir
        self.revision = revision
        self._seen_mtime = self._mtime()

    def _mtime(self) -> int:
        try:
            return os.stat(self.trigger_dir).st_mtime_ns
        except OSError:
            return 0

    def _take(self, name: str) -> bool:
        try:
            os.remove(os.path.join(self.trigger_dir, name))
        except OSError:
            return False  # no such trigger, or another env took it first
        return True

    def step(self, action: Any) -> Any:
        # One stat a step: the directory's mtime changes when a trigger is created, so
        # the removes are tried only then.
        mtime = self._mtime()
        if mtime != self._seen_mtime:
            self._seen_mtime = mtime
            if self._take("raise"):
                raise RuntimeError("chaos: injected env failure (trigger file 'raise')")
            if self._take("hang"):
                while True:
                    time.sleep(3600)
        return self.env.step(action)


def make_chaos_cartpole(trigger_dir: str = "/tmp/envpool-chaos", revision: int = 0) -> ChaosCartPole:
    return ChaosCartPole(trigger_dir, revision)


def broken_env(reason: str = "injected constructor failure") -> gym.Env[Any, Any]:
    """A make-env callable that always fails (a missing licence, a bad path...)."""
    raise RuntimeError(reason)


class ActorCartPole:
    """CartPole as a plain class, to run as its own Ray actor (``ray.remote(ActorCartPole)``)."""

    def __init__(self) -> None:
        self.env = gym.make("CartPole-v1")
        self.observation_space = self.env.observation_space
        self.action_space = self.env.action_space
        self.metadata = self.env.metadata
        self.render_mode = None

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        return self.env.reset(seed=seed, options=options)

    def step(self, action: Any) -> Any:
        return self.env.step(action)


class AllDictCounterEnv:
    """RLlib-style multi-agent env: dicts with ``"__all__"``, episodes of 3 steps."""

    possible_agents = ["a", "b"]

    def __init__(self) -> None:
        self.observation_spaces = {a: gym.spaces.Discrete(10) for a in self.possible_agents}
        self.action_spaces = {a: gym.spaces.Discrete(2) for a in self.possible_agents}
        self.t = 0

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        self.t = 0
        return {a: 0 for a in self.possible_agents}, {a: {} for a in self.possible_agents}

    def step(self, actions: dict[str, int]) -> Any:
        self.t += 1
        obs = {a: self.t for a in actions}
        rew = {a: float(actions[a]) for a in actions}
        done = self.t >= 3
        terms = {**{a: done for a in actions}, "__all__": done}
        truncs = {**{a: False for a in actions}, "__all__": False}
        return obs, rew, terms, truncs, {a: {} for a in actions}


class SparseInfoCartPole(gym.Wrapper[Any, Any, Any, Any]):
    """CartPole whose step info is ``{"t": steps so far}`` every ``every``-th step, else
    empty: infos that are rare, as most envs' are (tests their exact ``_t`` masks)."""

    def __init__(self, every: int = 5) -> None:
        super().__init__(gym.make("CartPole-v1"))
        self._every = every
        self.t = 0

    def step(self, action: Any) -> Any:
        obs, rew, term, trunc, _ = self.env.step(action)
        self.t += 1
        return obs, rew, term, trunc, ({"t": self.t} if self.t % self._every == 0 else {})


class BusyCartPole(gym.Wrapper[Any, Any, Any, Any]):
    """CartPole burning ``cpu_ms`` of CPU per step (a CPU-bound simulator)."""

    def __init__(self, cpu_ms: float = 1.0) -> None:
        super().__init__(gym.make("CartPole-v1"))
        self._cpu_s = cpu_ms / 1000.0

    def step(self, action: Any) -> Any:
        end = time.thread_time() + self._cpu_s
        while time.thread_time() < end:
            pass
        return self.env.step(action)


class ImageEnv(gym.Env[np.ndarray, np.int64]):
    """Atari-sized observations (84x84x4 uint8) with a cheap step: tests data movement."""

    observation_space = gym.spaces.Box(0, 255, (84, 84, 4), np.uint8)
    action_space = gym.spaces.Discrete(4)

    def __init__(self, episode_len: int = 1000) -> None:
        self._frame = np.zeros((84, 84, 4), np.uint8)
        self._t = 0
        self._len = episode_len

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        super().reset(seed=seed)
        self._t = 0
        self._frame[:] = self.np_random.integers(0, 256, size=(84, 84, 4), dtype=np.uint8)
        return self._frame.copy(), {}

    def step(self, action: Any) -> Any:
        self._t += 1
        # cheap, deterministic change so frames differ step to step
        self._frame = np.roll(self._frame, int(action) + 1, axis=1)
        return self._frame.copy(), 1.0, False, self._t >= self._len, {}
