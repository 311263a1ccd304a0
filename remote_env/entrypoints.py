"""Make-env callables named in text: ``env.id`` / ``env.entrypoint`` of a spec, ``--entrypoint``.

:class:`EnvFactory` is picklable and imports the entrypoint only where it is
called, so the pool server never imports user code: only the env actors (whose
``runtimeEnv`` may bring it) do.

Env ids are looked up by gymnasium, as ``gymnasium.make`` does (:func:`env_spec`); an
id it does not know fails with gymnasium's own error class and text (its "Did you
mean" included), prefixed with the id asked for and the forms that are expected.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Mapping
from typing import Any, Final

from remote_env.spec import fields, model

#: The other way to name an env, where it is a spec's (also EnvFactory's default).
SPEC_ENTRYPOINT: Final = "spec.env.entrypoint: 'package.module:callable'"


@dataclasses.dataclass(frozen=True)
class EnvFactory:
    """``gymnasium.make(env_id, **kwargs)`` or ``entrypoint(**kwargs)``, when called.

    ``instead``: how the caller names a make-env callable instead of an id (in an
    unknown id's error: :data:`SPEC_ENTRYPOINT`, ``--entrypoint ...``, ...).
    """

    env_id: str | None
    entrypoint: str | None
    kwargs: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    instead: str = SPEC_ENTRYPOINT

    @classmethod
    def from_spec(cls, env: model.EnvSpec) -> EnvFactory:
        return cls(env.id, env.entrypoint, dict(env.kwargs))

    def __call__(self) -> Any:
        if self.env_id is not None:
            import gymnasium as gym

            # the spec found, then made apart: an error of the env's own constructor
            # is never taken for an unknown id
            return gym.make(env_spec(self.env_id, instead=self.instead), **self.kwargs)
        assert self.entrypoint is not None
        return resolve_entrypoint(self.entrypoint)(**self.kwargs)

    def check(self) -> None:
        """Fail now, as a call would, if the id is unknown or the entrypoint cannot be
        imported (imports the module of a ``module:EnvId`` id or of the entrypoint:
        only where user code may run)."""
        if self.env_id is not None:
            env_spec(self.env_id, instead=self.instead)
        else:
            assert self.entrypoint is not None
            resolve_entrypoint(self.entrypoint)

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


def env_spec(env_id: str, *, instead: str = SPEC_ENTRYPOINT) -> Any:
    """Gymnasium's ``EnvSpec`` of ``env_id``, looked up as ``gymnasium.make`` does: a
    registered id (``CartPole-v1``, ``ns/Name-v0``, an unversioned name: its latest
    version) or ``module:EnvId`` (the module is imported first: it registers the id).

    Raises:
        gymnasium.error.Error: the class gymnasium raised (``NameNotFound``,
            ``VersionNotFound``, ``NamespaceNotFound``, ``DeprecatedEnv``, ...) with a
            message naming the id, gymnasium's reason and the forms expected
            (``instead``: the caller's other way to name an env).
        ModuleNotFoundError: the module of a ``module:EnvId`` id cannot be imported.
    """
    import gymnasium as gym
    from gymnasium.envs import registration

    if env_id.count(":") > 1:  # gymnasium splits "module:EnvId" once, and would fail unpacking
        raise gym.error.Error(f"env id {env_id!r} has more than one ':'. {_expected(instead)}")
    try:
        # gymnasium.make's own lookup (1.x; private: tests/unit/test_env_ids.py pins it),
        # so an id is accepted here exactly when make accepts it
        return registration._find_spec(env_id)
    except ModuleNotFoundError as exc:  # raised by the import of a "module:EnvId" id
        module, _, name = env_id.partition(":")
        raise ModuleNotFoundError(
            f"env id {env_id!r}: cannot import {module!r}, the module that should register "
            f"{name!r}: {exc} {_expected(instead)}", name=exc.name) from exc
    except gym.error.Error as exc:  # NameNotFound, VersionNotFound, DeprecatedEnv, ...
        module, sep, name = env_id.rpartition(":")
        how = f" (importing {module!r} did not register {name!r})" if sep else ""
        raise type(exc)(f"env id {env_id!r} is not registered with gymnasium{how}: {exc} "
                        f"{_expected(instead)}") from exc


def _expected(instead: str) -> str:
    return ("Expected a registered id such as 'CartPole-v1' (gymnasium.pprint_registry() "
            "lists them) or, for an env another package registers, 'module:EnvId' (the "
            "module is imported first, e.g. 'ale_py:ALE/Pong-v5'); or a make-env callable: "
            f"{instead}")
