"""Remote gymnasium vector envs: sub-environments in Ray actors.

Names are imported lazily so ``envpool operator`` (which shares the CLI entry
point) does not pay for gymnasium and numpy at start-up.
"""

from __future__ import annotations

from typing import Any

__all__ = ["RemoteVectorEnv", "SubEnvironmentError", "SubEnvironmentFailedError"]


def __getattr__(name: str) -> Any:
    if name == "RemoteVectorEnv":
        from remote_env.driver.vector import RemoteVectorEnv

        return RemoteVectorEnv
    if name in ("SubEnvironmentError", "SubEnvironmentFailedError"):
        from remote_env import errors

        return getattr(errors, name)
    raise AttributeError(f"module 'remote_env' has no attribute {name!r}")
