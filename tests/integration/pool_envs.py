"""Envs for the pool-server tests, imported by the env actors (PYTHONPATH).

``CountingCartPole`` appends one line per construction to a file, so a test can
count how many envs were really created across processes and nodes.
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from typing import Any

import gymnasium as gym
import numpy as np


class CountingCartPole(gym.Wrapper[Any, Any, Any, Any]):
    def __init__(self, counter_file: str) -> None:
        super().__init__(gym.make("CartPole-v1"))
        self.instance = uuid.uuid4().hex
        self.steps = 0
        self.step_thread = 0
        # one short O_APPEND write per line: atomic across processes
        with open(counter_file, "a") as f:
            f.write(f"{os.getpid()} {self.instance}\n")

    def step(self, action: Any) -> Any:
        self.steps += 1
        self.step_thread = threading.get_ident()
        return self.env.step(action)


def make_counted_cartpole(counter_file: str) -> CountingCartPole:
    return CountingCartPole(counter_file)


def constructions(counter_file: str) -> int:
    try:
        with open(counter_file) as f:
            return sum(1 for line in f if line.strip())
    except FileNotFoundError:
        return 0


class StampEnv(gym.Env[Any, Any]):
    """Never ends; every step/reset says when it ran (CLOCK_MONOTONIC, shared by the
    processes of one machine) and how many calls this env has had, so a test can tell
    whose call ran when (fenced leases)."""

    def __init__(self) -> None:
        self.observation_space = gym.spaces.Box(0.0, float("inf"), (1,))
        self.action_space = gym.spaces.Discrete(2)
        self.calls = 0

    def _info(self) -> dict[str, Any]:
        self.calls += 1
        return {"at": time.monotonic(), "calls": self.calls}

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        super().reset(seed=seed)
        info = self._info()
        return np.array([info["calls"]], dtype=np.float32), info

    def step(self, action: Any) -> Any:
        info = self._info()
        return np.array([info["calls"]], dtype=np.float32), 0.0, False, False, info


def make_stamp_env() -> StampEnv:
    return StampEnv()


def make_hang_once(flag_file: str, counter_file: str) -> CountingCartPole:
    """The first construction (across processes) hangs forever; the others are quick."""
    try:
        os.close(os.open(flag_file, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return CountingCartPole(counter_file)
    threading.Event().wait()  # a simulator that never finishes starting
    raise AssertionError("unreachable")


def make_hanging_env() -> gym.Env[Any, Any]:
    """Every construction hangs forever."""
    threading.Event().wait()
    raise AssertionError("unreachable")
