"""The driver: the trainer's side, :class:`RemoteVectorEnv` and what it is made of."""

from __future__ import annotations

from remote_env.driver.vector import RemoteVectorEnv

__all__ = ["RemoteVectorEnv"]
