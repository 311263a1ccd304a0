"""Remote gymnasium vector envs: sub-environments in Ray actors."""

from remote_env.errors import SubEnvironmentError, SubEnvironmentFailedError
from remote_env.vector import RemoteVectorEnv

__all__ = ["RemoteVectorEnv", "SubEnvironmentError", "SubEnvironmentFailedError"]
