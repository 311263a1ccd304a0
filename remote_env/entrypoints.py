"""Make-env callables named in text: ``env.id`` / ``env.entrypoint`` of a spec, ``--entrypoint``.

:class:`EnvFactory` is picklable and imports the entrypoint only where it is
called, so the pool server never imports user code: only the env actors (whose
``runtimeEnv`` may bring it) do.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Mapping
from typing import Any

from remote_env.spec import fields, model


@dataclasses.dataclass(frozen=True)
class EnvFactory:
    """``gymnasium.make(env_id, **kwargs)`` or ``entrypoint(**kwargs)``, when called."""

    env_id: str | None
    entrypoint: str | None
    kwargs: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    @classmethod
    def from_spec(cls, env: model.EnvSpec) -> EnvFactory:
        return cls(env.id, env.entrypoint, dict(env.kwargs))

    def __call__(self) -> Any:
        if self.env_id is not None:
            import gymnasium as gym

            return gym.make(self.env_id, **self.kwargs)
        assert self.entrypoint is not None
        return resolve_entrypoint(self.entrypoint)(**self.kwargs)

    def __repr__(self) -> str:
        what = self.env_id if self.env_id is not None else self.entrypoint
        return f"EnvFactory({what!r}, kwargs={dict(self.kwargs)!r})"


def resolve_entrypoint(entrypoint: str) -> Any:
    """``"package.module:callable"`` (or ``:Class.method``) -> the callable.

    Raises:
        ValueError: naming what could not be imported or found.
    """
    module_name, sep, attr = entrypoint.partition(":")
    if not sep or not fields.ENTRYPOINT_RE.match(entrypoint):
        raise ValueError(f"entrypoint must look like 'package.module:callable', got {entrypoint!r}")
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"entrypoint {entrypoint!r}: cannot import {module_name!r}: {exc}") from exc
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ValueError(f"entrypoint {entrypoint!r}: {module_name} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise ValueError(f"entrypoint {entrypoint!r}: {attr} is not callable")
    return obj
