"""The vector env options of a pool trainer: what the pool's spec decides, what a
trainer may not give. Pure, and shared by the two ways to lease (through Ray,
:mod:`remote_env.driver.attach`; over HTTP, :mod:`remote_env.driver.http_lease`), so
both build the same vector env from the same spec.
"""

from __future__ import annotations

from typing import Any, Final

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


def pool_options(name: str, document: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
    """The vector env options the pool's spec (``document``) decides, then the trainer's
    ``kwargs`` (it pops ``autoreset_mode``, which must be the pool's). Pure: trainers
    leasing through Ray and over HTTP get the same options."""
    pool = spec_mod.parse_manifest(document)
    mode = pool.autoreset_mode
    asked = kwargs.pop("autoreset_mode", mode)
    if str(getattr(asked, "value", asked)) != mode:
        raise ValueError(f"pool {name!r} runs autoreset_mode={mode} (its actors autoreset); "
                         f"got autoreset_mode={asked!r}")
    ft = pool.fault_tolerance
    return {
        "autoreset_mode": mode,
        "batch_wait_ms": pool.batch_wait_ms,
        "restart_failed_sub_environments": ft.restart_failed_envs,
        "step_timeout_s": ft.step_timeout,
        "max_restarts": ft.max_restarts,
        # the pool server backs off between restarts; no second backoff here
        "restart_backoff_s": 0.0,
        "pool": name,
        **kwargs,
    }
