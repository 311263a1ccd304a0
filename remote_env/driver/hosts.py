"""The host table: the driver's actors, which envs each holds, creating and adopting them.

A host is one ``SubEnvHost`` actor and the global env ids it holds, in its slot
order. The table creates the actors this vector env owns, adopts started ones
(a pool's), checks their start, installs a replacement's handle, and kills what it
owns. How calls reach a host is :mod:`remote_env.driver.links`; its health and
replacement :mod:`remote_env.driver.recovery`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from remote_env import errors, interrupts
from remote_env.actor import host as actor_host
from remote_env.actor.host import EnvFn
from remote_env.driver.ledger import EnvLedger
from remote_env.driver.options import Options
from remote_env.driver.planner import Layout
from remote_env.metrics import PoolMetrics


@dataclasses.dataclass
class Host:
    """One actor and the global env ids it holds, in its slot order."""

    handle: Any
    env_ids: np.ndarray
    #: created by this vector env (killed on close), not adopted
    owned: bool


class NotOurs:
    """The make-env callable of envs in actors from :meth:`RemoteVectorEnv.from_actors`."""

    def __call__(self) -> Any:
        raise RuntimeError("this env lives in an actor given to RemoteVectorEnv.from_actors; "
                           "it is rebuilt by that actor's owner (actor_replacer), not here")


class ReturnHandle:
    """A make-env callable returning an existing env actor (picklable)."""

    def __init__(self, handle: Any) -> None:
        self.handle = handle

    def __call__(self) -> Any:
        return self.handle




def remote_host() -> Any:
    """The Ray actor class hosting sub-envs (made once per process, on the actor side)."""
    return actor_host.actor_class()


def describe_existing(handle: Any, ray: Any) -> dict[str, Any] | None:
    """A host's description (started if needed), or None for a plain env actor.
    ``ray``: the module (or the vector env's stand-in for it)."""
    if not hasattr(handle, "describe"):
        if hasattr(handle, "step") and hasattr(handle, "reset"):
            return None
        raise TypeError(
            f"existing_actors must be SubEnvHost actors (RemoteVectorEnv.host_class()) or env "
            f"actors with reset/step methods, got {handle!r}"
        )
    desc = ray.get(handle.describe.remote())
    if desc is None:
        info = ray.get(handle.start.remote())
        bad = [f for f in info.get("failures", []) if f.permanent]
        if bad:
            raise errors.SubEnvironmentError(bad[0].index, bad[0].message, bad[0].traceback)
        desc = ray.get(handle.describe.remote())
    return dict(desc)


def env_error(env_id: int, failure: Any, *, restart_failed: bool) -> errors.SubEnvironmentError:
    """The error a host's failure report of env ``env_id`` raises on the driver."""
    cls = errors.SubEnvironmentFailedError if restart_failed else errors.SubEnvironmentError
    return cls(env_id, f"{failure.reason}: {failure.message}", failure.traceback)


class HostTable:
    """The hosts, in env order: their records, creation, adoption and start checks."""

    def __init__(self, options: Options, env_fns: list[EnvFn], ray: Any, ledger: EnvLedger,
                 metrics: PoolMetrics, on_created: Callable[[Any, int], None] | None) -> None:
        self._options = options
        self._env_fns = env_fns
        self._ray = ray
        self._ledger = ledger
        self._metrics = metrics
        self._on_created = on_created
        self._hosts: list[Host] = []
        self._layout: Layout | None = None

    # ---------------------------------------------------------------- reading
    def __len__(self) -> int:
        return len(self._hosts)

    @property
    def layout(self) -> Layout:
        """Where each env lives (once :meth:`create` returned)."""
        assert self._layout is not None, "the hosts are not created yet"
        return self._layout

    @property
    def env_fns(self) -> list[EnvFn]:
        return self._env_fns

    def handle(self, h: int) -> Any:
        return self._hosts[h].handle

    def env_ids(self, h: int) -> np.ndarray:
        return self._hosts[h].env_ids

    def owned(self, h: int) -> bool:
        return self._hosts[h].owned

    def handles(self) -> list[Any]:
        return [host.handle for host in self._hosts]

    def by_host(self, env_ids: np.ndarray | None) -> list[tuple[int, np.ndarray]]:
        """(host, its env ids among ``env_ids``) for each host holding any (all: None)."""
        if env_ids is None:
            return [(h, host.env_ids) for h, host in enumerate(self._hosts)]
        of = self.layout.env_host[env_ids]
        return [(int(k), env_ids[of == k]) for k in np.unique(of)]

    def error(self, h: int, failure: Any) -> errors.SubEnvironmentError:
        return env_error(int(self._hosts[h].env_ids[failure.index]), failure,
                         restart_failed=self._options.restart_failed)

    # --------------------------------------------------------------- creating
    def new_actor(self, env_ids: Sequence[int], *, after_failure: bool) -> Any:
        """A new host actor for ``env_ids`` (after a failure: with their seeds and counts)."""
        o = self._options
        kwargs: dict[str, Any] = {
            "autoreset_mode": o.autoreset_mode.value,
            "restart_failed": o.restart_failed,
            "max_restarts": o.max_restarts,
            "restart_backoff_s": o.restart_backoff_s,
            "threads": o.threads_per_actor,
        }
        if after_failure:
            kwargs["restart_seeds"] = self._ledger.seeds_of(env_ids)
            kwargs["restarts"] = self._ledger.restarts_of(env_ids)
        actor_options = {"max_concurrency": 1, **o.actor_options}
        return remote_host().options(**actor_options).remote(
            [self._env_fns[i] for i in env_ids], **kwargs
        )

    def create(self, existing: list[Any]) -> list[dict[str, Any]]:
        """Create (or adopt) every host; return each one's start() description."""
        num_envs = self._options.num_envs
        next_id = 0
        starts: list[tuple[int, Any]] = []
        for handle in existing:
            if next_id >= num_envs:
                raise ValueError(
                    f"existing_actors hold more envs than num_envs={num_envs} (len(env_fns))"
                )
            desc = describe_existing(handle, self._ray)
            if desc is None:  # an env actor, not a host: host it as one sub-env
                self._env_fns[next_id] = ReturnHandle(handle)
                host_handle = self.new_actor([next_id], after_failure=False)
                self._add(host_handle, [next_id], owned=True)
                starts.append((len(self._hosts) - 1, host_handle.start.remote()))
                next_id += 1
                continue
            k = int(desc["num_envs"])
            env_ids = list(range(next_id, min(next_id + k, num_envs)))
            if len(env_ids) < k:
                raise ValueError(
                    f"existing actor {len(self._hosts)} hosts {k} envs but only "
                    f"{len(env_ids)} of num_envs={num_envs} are left"
                )
            self._add(handle, env_ids, owned=False)
            starts.append((len(self._hosts) - 1, None))
            next_id += len(env_ids)
        while next_id < num_envs:
            env_ids = list(range(next_id, min(next_id + self._options.envs_per_actor, num_envs)))
            handle = self.new_actor(env_ids, after_failure=False)
            self._add(handle, env_ids, owned=True)
            starts.append((len(self._hosts) - 1, handle.start.remote()))
            next_id += len(env_ids)
        self._layout = Layout.of([host.env_ids for host in self._hosts], num_envs)

        infos = []
        for h, ref in starts:
            host = self._hosts[h]
            info = (
                self._ray.get(ref)
                if ref is not None
                else {**self._ray.get(host.handle.describe.remote()), "failures": []}
            )
            self.check_start(h, info)
            infos.append(info)
            self.created(h)
        return infos

    def _add(self, handle: Any, env_ids: list[int], *, owned: bool) -> None:
        self._hosts.append(Host(handle, np.asarray(env_ids, dtype=np.int64), owned))

    def install(self, h: int, handle: Any, *, owned: bool) -> None:
        """``handle`` replaces host ``h``'s lost actor (same envs, same positions)."""
        host = self._hosts[h]
        host.handle, host.owned = handle, owned

    def env_spaces(self, infos: list[dict[str, Any]]) -> tuple[list[Any], list[Any]]:
        """Every env's (observation, action) space, from its host's start() report."""
        obs: list[Any] = []
        act: list[Any] = []
        for host, info in zip(self._hosts, infos, strict=True):
            other = info.get("other_spaces", {})
            for pos in range(len(host.env_ids)):
                o, a = other.get(pos, (info["observation_space"], info["action_space"]))
                obs.append(o)
                act.append(a)
        return obs, act

    def check_start(self, h: int, info: Mapping[str, Any]) -> None:
        """Count a host's start failures; raise the first permanent one."""
        host = self._hosts[h]
        for f in info.get("failures", []):
            self._metrics.failures[f.reason].inc()
            if f.permanent:
                self._ledger.fail(host.env_ids[f.index])
                raise self.error(h, f)

    def created(self, h: int) -> None:
        """``on_sub_environment_created`` for each env of host ``h`` (its actor is up)."""
        if self._on_created is not None:
            host = self._hosts[h]
            for e in host.env_ids:
                self._on_created(host.handle, int(e))

    # ---------------------------------------------------------------- ending
    def kill(self, h: int) -> None:
        try:
            self._ray.kill(self._hosts[h].handle, no_restart=True)
        except Exception:  # already gone
            pass

    def kill_owned(self) -> None:
        for h, host in enumerate(self._hosts):
            if host.owned:
                self.kill(h)

    def close_envs(self, hosts: Sequence[int], timeout_s: float | None) -> list[str]:
        """Each of ``hosts``' sub-envs closed (bounded by ``timeout_s``); what went wrong.

        Before the actors are killed: a last video written, a simulator's state saved.
        """
        refs: dict[Any, Host] = {}
        for h in hosts:
            host = self._hosts[h]
            try:
                refs[host.handle.close.remote()] = host
            except Exception:  # the actor is gone: nothing to close there
                pass
        if not refs:
            return []
        with interrupts.interruptible():
            done, late = self._ray.wait(list(refs), num_returns=len(refs), timeout=timeout_s)
        problems: list[str] = []
        for ref in done:
            host = refs[ref]
            try:
                failed = self._ray.get(ref)
            except Exception as exc:  # the actor died while closing
                problems.append(f"sub-environments {host.env_ids.tolist()}: "
                                f"{type(exc).__name__}: {str(exc).splitlines()[0]}")
                continue
            for pos, message in failed or []:
                problems.append(f"sub-environment {int(host.env_ids[pos])}: {message}")
        for ref in late:
            problems.append(f"sub-environments {refs[ref].env_ids.tolist()}: close() did not "
                            f"finish within close_timeout_s={timeout_s}")
        return problems
