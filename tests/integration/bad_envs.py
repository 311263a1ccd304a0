"""Envs that misbehave, for the issue-15 tests (pickled by value into the actors).

``register`` makes Ray ship this module by value, so the actors need no PYTHONPATH,
and so plain pickle cannot find its classes by name inside an actor (as with a
class defined in a notebook's ``__main__``).
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Any

import gymnasium as gym
import numpy as np


def register() -> None:
    import ray.cloudpickle

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


def _fire(once_file: str | None) -> bool:
    if once_file is None:
        return True
    try:
        with open(once_file, "x"):
            return True
    except FileExistsError:
        return False


class BadResultEnv(gym.Wrapper[Any, Any, Any, Any]):
    """CartPole whose step ``at_step`` returns a malformed result of kind ``kind``."""

    def __init__(self, kind: str, at_step: int, once_file: str | None = None) -> None:
        super().__init__(gym.make("CartPole-v1"))
        self.kind, self.at_step, self.once_file, self.steps = kind, at_step, once_file, 0

    def step(self, action: Any) -> Any:
        obs, rew, term, trunc, info = self.env.step(action)
        self.steps += 1
        if self.steps == self.at_step and _fire(self.once_file):
            if self.kind == "str_reward":
                rew = "1.0"
            elif self.kind == "obs_shape":
                obs = np.zeros(7, dtype=np.float32)
            elif self.kind == "array_terminated":
                term = np.array([False, True])
        return obs, rew, term, trunc, info


class Opaque:
    """Only this module knows the class: plain pickle cannot name it in an actor."""

    def __init__(self, value: int) -> None:
        self.value = value

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Opaque) and other.value == self.value

    def __hash__(self) -> int:
        return self.value


class OpaqueInfoEnv(gym.Wrapper[Any, Any, Any, Any]):
    """CartPole whose infos hold an :class:`Opaque`."""

    def __init__(self) -> None:
        super().__init__(gym.make("CartPole-v1"))
        self.steps = 0

    def step(self, action: Any) -> Any:
        obs, rew, term, trunc, info = self.env.step(action)
        self.steps += 1
        return obs, rew, term, trunc, {**info, "opaque": Opaque(self.steps)}


def _load_only_in(pid: int) -> Any:
    if os.getpid() != pid:
        raise ImportError("No module named 'only_in_the_actors_runtime_env'")
    return None


class Undecodable:
    """Pickles fine; unpickles only in the process that made it (the actor)."""

    def __reduce__(self) -> Any:
        return _load_only_in, (os.getpid(),)


class UndecodableInfoEnv(gym.Wrapper[Any, Any, Any, Any]):
    """CartPole whose step ``at_step`` has an info the driver cannot unpickle."""

    def __init__(self, at_step: int, once_file: str | None = None) -> None:
        super().__init__(gym.make("CartPole-v1"))
        self.at_step, self.once_file, self.steps = at_step, once_file, 0

    def step(self, action: Any) -> Any:
        obs, rew, term, trunc, info = self.env.step(action)
        self.steps += 1
        if self.steps == self.at_step and _fire(self.once_file):
            info = {**info, "blob": Undecodable()}
        return obs, rew, term, trunc, info


class DyingEnv(gym.Wrapper[Any, Any, Any, Any]):
    """CartPole whose actor process dies (SIGKILL) on every step and on every reset but
    the first (``once_file``): a crash loop, each replacement dying on its first call."""

    def __init__(self, once_file: str) -> None:
        super().__init__(gym.make("CartPole-v1"))
        self.once_file = once_file

    def reset(self, **kwargs: Any) -> Any:
        if not _fire(self.once_file):
            os.kill(os.getpid(), signal.SIGKILL)
        return self.env.reset(**kwargs)

    def step(self, action: Any) -> Any:
        os.kill(os.getpid(), signal.SIGKILL)
        raise AssertionError("unreachable")


class ClosingEnv(gym.Wrapper[Any, Any, Any, Any]):
    """CartPole whose ``close()`` takes ``delay_s`` then writes ``path`` (a last video, a
    simulator saving its state), or raises when ``fail``."""

    def __init__(self, path: str, delay_s: float = 0.2, fail: bool = False) -> None:
        super().__init__(gym.make("CartPole-v1"))
        self.path, self.delay_s, self.fail = path, delay_s, fail

    def close(self) -> None:
        import time

        time.sleep(self.delay_s)
        if self.fail:
            raise OSError(f"could not save {self.path}")
        with open(self.path, "w") as f:
            f.write("closed")
        super().close()


class SlowEnv(gym.Wrapper[Any, Any, Any, Any]):
    """CartPole whose step takes ``step_s`` and reset ``reset_s`` (a slow simulator)."""

    def __init__(self, step_s: float = 0.0, reset_s: float = 0.0, init_s: float = 0.0) -> None:
        import time

        time.sleep(init_s)
        super().__init__(gym.make("CartPole-v1"))
        self.step_s, self.reset_s = step_s, reset_s

    def pause(self, seconds: float) -> float:
        """A slow method for ``call``."""
        import time

        time.sleep(seconds)
        return seconds

    def reset(self, **kwargs: Any) -> Any:
        import time

        time.sleep(self.reset_s)
        return self.env.reset(**kwargs)

    def step(self, action: Any) -> Any:
        import time

        time.sleep(self.step_s)
        return self.env.step(action)


class BigDictEnv(gym.Env[Any, Any]):
    """A Dict observation of ``mib`` MiB (pickled whole through the socket, never the
    shared arrays); its content says how many steps the env took and its seed."""

    def __init__(self, mib: int = 32) -> None:
        n = mib * (1 << 20) // 8
        self.observation_space = gym.spaces.Dict({
            "big": gym.spaces.Box(-np.inf, np.inf, shape=(n,), dtype=np.float64),
            "t": gym.spaces.Discrete(1 << 30)})
        self.action_space = gym.spaces.Discrete(2)
        self.n, self.t, self.total = n, 0, 0

    def _obs(self) -> Any:
        return {"big": np.full(self.n, float(self.total)), "t": self.t}

    def reset(self, *, seed: int | None = None, options: Any = None) -> Any:
        super().reset(seed=seed)
        self.t = 0
        self.total = seed or 0
        return self._obs(), {}

    def step(self, action: Any) -> Any:
        self.t += 1
        self.total += 1 + int(action)
        return self._obs(), 1.0, False, self.t >= 1000, {}


class SpaceEnv(gym.Env[Any, Any]):
    """An env of the observation space given (gymnasium's GenericTestEnv, for spaces)."""

    def __init__(self, space: Any) -> None:
        self.observation_space = space
        self.action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed: int | None = None, options: Any = None) -> Any:
        return self.observation_space.sample(), {}

    def step(self, action: Any) -> Any:
        return self.observation_space.sample(), 0.0, False, False, {}


class ActionFaultEnv(gym.Wrapper[Any, Any, Any, Any]):
    """CartPole whose step takes ``step_s`` and raises on action 2: the caller injects an
    env failure where it wants one."""

    def __init__(self, step_s: float = 0.02) -> None:
        super().__init__(gym.make("CartPole-v1"))
        self.action_space = gym.spaces.Discrete(3)
        self.step_s = step_s

    def step(self, action: Any) -> Any:
        import time

        time.sleep(self.step_s)
        if int(action) == 2:
            raise RuntimeError("injected failure")
        return self.env.step(action)
