"""TorchRL over :class:`~remote_env.driver.vector.RemoteVectorEnv`.

TorchRL's ``GymWrapper`` takes a gymnasium vector env as a batched env, but only in the
SAME_STEP or DISABLED autoreset mode (its resets are ``_reset`` masks; DISABLED maps
them to ``reset(options={"reset_mask": ...})``). RemoteVectorEnv defaults to NEXT_STEP,
as gymnasium's own vector envs, and so does a pool spec; :func:`gym_wrapper` says so
in terms of this library (``autoreset_mode=``) before TorchRL's ``RuntimeError`` does.
:func:`from_pool` leases a pool's envs in SAME_STEP, whatever the pool's spec says
(the actors serve each lease in the mode its trainer asks for).

TorchRL is not a dependency of the library: install the ``frameworks`` extra.

Example:
    >>> envs = RemoteVectorEnv([lambda: gym.make("CartPole-v1")] * 8,  # doctest: +SKIP
    ...                        autoreset_mode="SameStep")
    >>> env = gym_wrapper(envs)  # doctest: +SKIP
    >>> check_env_specs(env)  # doctest: +SKIP
    >>> env = from_pool("cartpole", num_envs=8)  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gymnasium.vector import AutoresetMode

try:
    from torchrl.envs.libs.gym import GymWrapper
except ImportError as exc:  # pragma: no cover - the message is the point
    raise ImportError(
        "remote_env.torchrl needs TorchRL: install the 'frameworks' extra, pip install "
        "'envpool-k8s[frameworks]', or pip install torchrl") from exc

from remote_env.driver.vector import RemoteVectorEnv

__all__ = ["TORCHRL_AUTORESET_MODES", "check_autoreset_mode", "from_pool", "gym_wrapper"]

#: the autoreset modes TorchRL's GymWrapper steps (DISABLED is the one it prefers)
TORCHRL_AUTORESET_MODES = (AutoresetMode.SAME_STEP, AutoresetMode.DISABLED)


def check_autoreset_mode(envs: RemoteVectorEnv) -> None:
    """Raise ``ValueError`` unless TorchRL can step ``envs``'s autoreset mode."""
    mode = AutoresetMode(envs.autoreset_mode)
    if mode in TORCHRL_AUTORESET_MODES:
        return
    raise ValueError(
        f"TorchRL's GymWrapper steps vector envs in autoreset mode SameStep or Disabled "
        f"(Disabled preferred); this RemoteVectorEnv runs {mode.value}. Build it with "
        "RemoteVectorEnv(..., autoreset_mode=\"SameStep\") (or \"Disabled\"); lease a "
        "pool's envs with RemoteVectorEnv.from_pool(name, autoreset_mode=\"SameStep\") or "
        "remote_env.torchrl.from_pool(name)")


def gym_wrapper(envs: RemoteVectorEnv, **kwargs: Any) -> GymWrapper:
    """TorchRL's ``GymWrapper`` over ``envs`` (batch size ``[num_envs]``), once
    :func:`check_autoreset_mode` passes. ``kwargs`` are ``GymWrapper``'s (``device``,
    ``categorical_action_encoding``, ...). Closing the wrapper closes ``envs``."""
    if not isinstance(envs, RemoteVectorEnv):
        raise TypeError(f"gym_wrapper wraps a RemoteVectorEnv, got {type(envs).__name__}")
    if envs.multi_agent:
        raise TypeError("gym_wrapper wraps single-agent envs; for PettingZoo envs use "
                        "TorchRL's PettingZooWrapper on the envs themselves")
    check_autoreset_mode(envs)
    return GymWrapper(envs, **kwargs)


def from_pool(name: str, *, autoreset_mode: str | AutoresetMode = AutoresetMode.SAME_STEP,
              wrapper_kwargs: Mapping[str, Any] | None = None, **kwargs: Any) -> GymWrapper:
    """TorchRL's ``GymWrapper`` over envs leased from the running pool ``name``, served
    in ``autoreset_mode`` whatever the pool's spec says.

    SAME_STEP by default: the actors reset a finished env within its step, where
    DISABLED costs TorchRL's masked ``reset`` a round trip to the actors per episode end.
    ``wrapper_kwargs`` are ``GymWrapper``'s; ``kwargs`` are
    :meth:`RemoteVectorEnv.from_pool`'s (``num_envs``, ``address``, ``wait_s``, ...).
    Closing the wrapper releases the lease.

    Raises:
        ValueError: ``autoreset_mode`` is not one TorchRL steps (before any lease).
    """
    modes = " or ".join(repr(m.value) for m in TORCHRL_AUTORESET_MODES)
    try:
        mode = AutoresetMode(autoreset_mode)
    except ValueError:
        raise ValueError(f"autoreset_mode={autoreset_mode!r} is not a gymnasium AutoresetMode; "
                         f"TorchRL steps {modes}") from None
    if mode not in TORCHRL_AUTORESET_MODES:
        raise ValueError(f"TorchRL's GymWrapper steps autoreset mode {modes}, not "
                         f"{mode.value!r}: ask the pool for one of those")
    envs = RemoteVectorEnv.from_pool(name, autoreset_mode=mode, **kwargs)
    try:
        return gym_wrapper(envs, **dict(wrapper_kwargs or {}))
    except BaseException:
        envs.close()
        raise
