"""The vector env options of a pool trainer: what the pool's spec decides, what a
trainer may not give. Pure, and shared by the two ways to lease (through Ray,
:mod:`remote_env.driver.attach`; over HTTP, :mod:`remote_env.driver.http_lease`), so
both build the same vector env from the same spec.
"""

from __future__ import annotations

from typing import Any, Final

from gymnasium.vector import AutoresetMode

from remote_env import spec as spec_mod

#: RemoteVectorEnv arguments the pool decides: its actors already exist.
POOL_OWNED: Final = ("env_fns", "existing_actors", "actor_replacer", "envs_per_actor",
                     "threads_per_actor", "actor_options", "on_sub_environment_created",
                     "runtime")


def check_kwargs(kwargs: dict[str, Any], lease_timeout_s: float) -> None:
    """Raises for arguments a pool trainer cannot give (its actors already exist)."""
    for key in POOL_OWNED:
        if key in kwargs:
            raise TypeError(f"from_pool() does not take {key!r}: the pool's actors are used as-is")
    if lease_timeout_s <= 0:
        raise ValueError(f"lease_timeout_s must be > 0, got {lease_timeout_s}")


def autoreset_mode(name: str, asked: str | AutoresetMode) -> AutoresetMode:
    """``asked`` as an ``AutoresetMode`` (the enum or its value), or a ValueError saying
    what the pool can serve. Checked before a lease is taken (a typo costs nobody's envs)."""
    try:
        return AutoresetMode(asked)
    except ValueError:
        modes = ", ".join(repr(m) for m in spec_mod.AUTORESET_MODES)
        raise ValueError(
            f"from_pool({name!r}, autoreset_mode={asked!r}): not a gymnasium AutoresetMode; "
            f"a pool serves each lease in the mode its trainer asks for: one of {modes} "
            "(or gymnasium.vector.AutoresetMode.NEXT_STEP, ...)") from None


def pool_options(name: str, document: Any, kwargs: dict[str, Any],
                 mode: str | None = None) -> dict[str, Any]:
    """The vector env options the pool's spec (``document``) decides, then the trainer's
    ``kwargs``. ``mode``: the autoreset mode the leased actors serve this lease in (the
    trainer's, switched at attach), else the spec's; an ``autoreset_mode`` left in
    ``kwargs`` (popped) must be that one. Pure: trainers leasing through Ray and over
    HTTP get the same options."""
    pool = spec_mod.parse_manifest(document)
    served = mode or pool.autoreset_mode
    asked = kwargs.pop("autoreset_mode", served)
    if str(getattr(asked, "value", asked)) != served:
        raise ValueError(f"pool {name!r} serves this lease in autoreset_mode={served} (its "
                         f"actors autoreset); got autoreset_mode={asked!r}")
    ft = pool.fault_tolerance
    return {
        "autoreset_mode": served,
        "batch_wait_ms": pool.batch_wait_ms,
        "restart_failed_sub_environments": ft.restart_failed_envs,
        "step_timeout_s": ft.step_timeout,
        "max_restarts": ft.max_restarts,
        # the pool server backs off between restarts; no second backoff here
        "restart_backoff_s": 0.0,
        "pool": name,
        **kwargs,
    }
