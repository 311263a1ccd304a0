"""ChaosCartPole (remote_env.examples): the soak's env faults, fired from outside the
env's process by a trigger file, each file taken by exactly one env."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from remote_env.examples import make_chaos_cartpole


def test_a_raise_trigger_fires_once_in_the_env_that_takes_it(tmp_path: Path) -> None:
    envs = [make_chaos_cartpole(str(tmp_path / "chaos")) for _ in range(3)]
    for e in envs:
        e.reset(seed=0)
        e.step(0)  # no trigger directory yet: steps as CartPole
    (tmp_path / "chaos").mkdir()
    (tmp_path / "chaos" / "raise").touch()
    raised = 0
    for e in envs:
        try:
            e.step(0)
        except RuntimeError as exc:
            assert "trigger file 'raise'" in str(exc)
            raised += 1
    assert raised == 1
    assert not (tmp_path / "chaos" / "raise").exists()
    for e in envs:
        e.step(1)  # nothing left to fire


def test_a_hang_trigger_blocks_the_step(tmp_path: Path) -> None:
    env = make_chaos_cartpole(str(tmp_path))
    env.reset(seed=0)
    (tmp_path / "hang").touch()
    done = threading.Event()
    threading.Thread(target=lambda: (env.step(0), done.set()), daemon=True).start()
    time.sleep(0.5)
    assert not done.is_set() and not (tmp_path / "hang").exists()


def test_the_revision_is_part_of_the_signature_only() -> None:
    a, b = make_chaos_cartpole(revision=0), make_chaos_cartpole(revision=1)
    assert a.reset(seed=3)[0] == pytest.approx(b.reset(seed=3)[0])
    assert (a.revision, b.revision) == (0, 1)
