"""The pool's env actors: adopted, pinged, replaced and scaled.

:class:`ActorSet` owns the slots (one env actor position each) and what happens to
their actors; :class:`~remote_env.pool.server.PoolServer` drives it once a tick and
publishes what it holds. Failures are counted and retried under
:class:`remote_env.restarts.CrashLoop`'s rule; :mod:`remote_env.pool.launch` asks
Ray for the actors.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

from remote_env import restarts
from remote_env import spec as spec_mod
from remote_env.metrics import FAILURE_REASONS, PoolMetrics
from remote_env.pool import launch
from remote_env.pool.slot import (
    HOST_NAME_RE,
    Slot,
    SlotInfo,
    first_line,
    generation_of,
    kill,
    node_id,
    signature,
)

log = logging.getLogger("remote_env.pool.server")

#: An actor that stayed healthy this long starts its failure count afresh.
HEALTHY_RESET_S: Final = 60.0
#: Without hang detection, an actor Ray calls unavailable this long is dead.
UNAVAILABLE_DEAD_S: Final = 60.0

#: ``withdraw(slots)``: the registry takes the unleased ones of ``slots`` out of reach of
#: new leases and returns them (:meth:`remote_env.pool.registry.PoolRegistry.withdraw`).
Withdraw = Callable[[list[int]], Sequence[int]]


class ActorSet(launch.Launcher):
    """One pool's env actors in Ray namespace ``ray_namespace``.

    ``dirty`` says the layout changed since :class:`PoolServer` last published it.
    """

    def __init__(self, spec: spec_mod.PoolSpec, *, ray_namespace: str, metrics: PoolMetrics,
                 health_interval_s: float, actor_options: Mapping[str, Any],
                 env_resource: bool | None = None) -> None:
        self.spec = spec
        self.ray_namespace = ray_namespace
        self.metrics = metrics
        self.health_interval_s = health_interval_s
        self._actor_options = dict(actor_options)
        self.slots: dict[int, Slot] = {}
        self.dirty = True
        self.last_error = ""
        #: True: place actors by the env resource always (the operator's clusters, whose
        #: workers advertise it). None: detect it; a pool server that starts before any
        #: worker has joined then placed actors by CPU, and two landed on one worker pod.
        self._env_resource_required = env_resource
        self._env_resource: tuple[float, bool] = (0.0, False)

    def layout(self) -> list[SlotInfo]:
        return [s.info() for s in sorted(self.slots.values(), key=lambda x: x.slot)]

    def supervise(self, now: float, leased: Mapping[int, str], withdraw: Withdraw) -> None:
        """One pass: starts, pings, backoffs, then scaling to ``spec.desired_envs``.

        ``leased`` is the registry's last answer, to plan a scale-down by; ``withdraw``
        asks it at the moment of removal (a lease may have been granted since).
        """
        self._check_starts(now)
        self._check_pings(now)
        self._send_pings(now)
        self._retry_backoffs(now)
        self.scale(now, leased, withdraw)

    def reported(self, slot: int, actor_id: str, reason: str, now: float) -> None:
        """A trainer saw actor ``actor_id`` of ``slot`` fail: replace it (once)."""
        s = self.slots.get(slot)
        if s is not None and s.actor_id == actor_id and s.state == "ready":
            why = "no answer within the trainer's step timeout" if reason == "timeout" \
                else "a trainer's call to it failed"
            self.fail(s, reason if reason in FAILURE_REASONS else "actor_died", why, now)

    def respec(self, spec: spec_mod.PoolSpec, now: float) -> None:
        """Run ``spec`` from now on: new actors if they are built differently."""
        old, self.spec = self.spec, spec
        if signature(old) != signature(spec):
            log.info("pool %s: env or actor settings changed: replacing every actor", spec.name)
            for s in self.slots.values():
                s.streak = restarts.Streak()
                self.relaunch(s, after_failure=False)
        for s in self.slots.values():
            if s.state == "failed":  # a new spec is the user's retry
                s.streak = restarts.Streak()
                s.retry_at = now
                s.state = "backoff"
        self.dirty = True

    def kill_all(self) -> None:
        for s in self.slots.values():
            kill(s.handle)
        self.slots.clear()

    def adopt(self, layout: Mapping[str, Any], now: float) -> None:
        """Take over the pool a previous pool server left: the registry's layout and the
        named actors in the namespace, together.

        A live actor is adopted with its slot's record (size, restarts, streak); a slot
        the registry knows without a live actor (in restart backoff, or its actor died
        while no server watched) is restarted under its streak; a failed one stays
        failed. So a restart of the pool server loses no slot a trainer may hold.
        """
        import ray

        known: dict[int, SlotInfo] = {s.slot: s for s in layout.get("slots", [])}
        latest: dict[int, int] = {}
        names: list[tuple[int, int, str]] = []
        for entry in ray.util.list_named_actors(all_namespaces=True):
            if entry["namespace"] != self.ray_namespace:
                continue
            m = HOST_NAME_RE.match(entry["name"])
            if m:
                slot, gen = int(m.group(1)), int(m.group(2))
                names.append((slot, gen, entry["name"]))
                latest[slot] = max(gen, latest.get(slot, -1))
        # Rebuild only actors known to be built from another spec; a registry that lost
        # its record (restarted with the head) cannot tell, so they are kept.
        built_from = layout.get("pool_info", {}).get("signature")
        same_build = built_from is None or built_from == signature(self.spec)
        for slot, gen, name in names:
            try:
                handle = ray.get_actor(name, namespace=self.ray_namespace)
            except ValueError:  # died meanwhile
                continue
            if gen != latest[slot]:
                kill(handle)  # an older generation a crashed server did not finish replacing
                continue
            prev = known.get(slot)
            s = restored(prev, slot, self.spec.envs_per_actor)
            s.generation = gen
            s.handle = handle
            s.actor_id = handle._actor_id.hex()
            s.size_known = prev is not None
            # start() is idempotent: it answers with the description of a started host
            s.start_ref = handle.start.remote()
            self.slots[slot] = s
            if not same_build:
                self.relaunch(s, after_failure=False)
        lost = [prev for slot, prev in known.items() if slot not in self.slots]
        for prev in lost:
            s = restored(prev, prev.slot, self.spec.envs_per_actor)
            self.slots[s.slot] = s
            if prev.state == "failed":
                s.state = "failed"  # out of restarts: a new spec is the user's retry
                self.last_error = s.last_error
            elif prev.state == "backoff":
                s.state, s.retry_at, s.after_failure = "backoff", now, True
            else:
                self.fail(s, "actor_died", "its actor was gone when the pool server "
                                           "restarted", now)
        if self.slots:
            log.info("pool %s: adopted %d actors (%d envs) from namespace %s%s%s",
                     self.spec.name, len(self.slots) - len(lost),
                     sum(s.num_envs for s in self.slots.values()), self.ray_namespace,
                     f"; restarting {len(lost)} the registry knew without an actor"
                     if lost else "",
                     "" if same_build else "; rebuilding them: spec changed")

    def _check_starts(self, now: float) -> None:
        import ray

        starting = {s.start_ref: s for s in self.slots.values()
                    if s.state == "starting" and s.start_ref is not None}
        if not starting:
            return
        ready, pending = ray.wait(list(starting), num_returns=len(starting), timeout=0)
        limit = self.spec.fault_tolerance.start_timeout
        for ref in pending:
            s = starting[ref]
            if s.start_seen is None:
                s.start_seen = now
            elif limit is not None and now - s.start_seen > limit:
                # a hung env constructor: the actor answers nothing else either
                self.fail(s, "timeout", f"start timed out: start() did not finish within "
                                         f"startTimeoutSeconds={limit:g}", now)
        for ref in ready:
            s = starting[ref]
            s.start_ref = None
            try:
                info = ray.get(ref)
            except ray.exceptions.RayActorError as exc:
                self.fail(s, "actor_died", first_line(exc), now)
                continue
            except ray.exceptions.RayError as exc:
                self.fail(s, "exception", first_line(exc), now)
                continue
            permanent = [f for f in info.get("failures", []) if f.permanent]
            if permanent:
                f = permanent[0]
                log.warning("pool %s: %s: sub-env %d failed to start: %s\n%s", self.spec.name,
                            s.name, f.index, f.message, f.traceback)
                self.fail(s, "exception", f"sub-env {f.index}: {f.message}", now)
                continue
            s.num_envs = int(info["num_envs"])
            s.size_known = True
            try:
                s.node_id = ray.get(s.handle.__ray_call__.remote(node_id), timeout=10)
            except Exception:  # only informational
                s.node_id = ""
            s.state = "ready"
            s.streak.up(now)
            s.silent_since = None
            s.last_error = ""
            self.dirty = True
            if s.after_failure:
                self.metrics.actor_restarts.inc()
                self.metrics.env_restarts.inc(s.num_envs)
                s.after_failure = False


    def _check_pings(self, now: float) -> None:
        import ray

        pinged = {s.ping_ref: s for s in self.slots.values()
                  if s.state == "ready" and s.ping_ref is not None}
        if pinged:
            ready, _ = ray.wait(list(pinged), num_returns=len(pinged), timeout=0)
            for ref in ready:
                s = pinged[ref]
                s.ping_ref = None
                try:
                    ray.get(ref)
                    s.silent_since = None
                    if s.streak.failures:
                        self.crash_loop().succeeded(s.streak, now)
                except ray.exceptions.ActorUnavailableError:
                    pass  # maybe transient (network); the silence timer keeps running
                except ray.exceptions.RayActorError as exc:
                    self.fail(s, "actor_died", first_line(exc), now)
        timeout = self.spec.fault_tolerance.step_timeout
        for s in list(self.slots.values()):
            if s.state != "ready" or s.silent_since is None:
                continue
            silent = now - s.silent_since
            if timeout is not None and silent > timeout:
                self.fail(s, "timeout", f"no answer to a health ping within "
                                         f"stepTimeoutSeconds={timeout:g}", now)
            elif timeout is None and silent > UNAVAILABLE_DEAD_S and s.ping_ref is None:
                self.fail(s, "actor_died", f"unreachable for {silent:.0f}s", now)


    def _send_pings(self, now: float) -> None:
        for s in self.slots.values():
            if s.state == "ready" and s.ping_ref is None \
                    and now - s.ping_sent >= self.health_interval_s:
                s.ping_ref = s.handle.ping.remote()
                s.ping_sent = now
                if s.silent_since is None:
                    s.silent_since = now


    def _retry_backoffs(self, now: float) -> None:
        for s in self.slots.values():
            if s.state == "backoff" and now >= s.retry_at:
                self._launch(s)


    def crash_loop(self) -> restarts.CrashLoop:
        """The rule for the pool's actors (from the running spec): no steps are seen
        here, so the proof of health is a good ping after HEALTHY_RESET_S of being up."""
        ft = self.spec.fault_tolerance
        return restarts.CrashLoop(ft.max_restarts, ft.restart_backoff_seconds,
                                  healthy_after_s=HEALTHY_RESET_S)

    def fail(self, s: Slot, reason: str, message: str, now: float) -> None:
        """``s``'s actor failed: kill it and restart it (backoff), or give up."""
        ft = self.spec.fault_tolerance
        self.metrics.failures[reason].inc(s.num_envs)
        kill(s.handle)
        s.ping_ref = s.start_ref = None
        s.silent_since = None
        rule = self.crash_loop()
        if s.state == "ready":
            # up until now: proof of health too, though no ping may have landed since
            rule.succeeded(s.streak, now)
        delay = rule.failed(s.streak)
        s.last_error = f"{s.name}: {reason}: {message}"
        self.last_error = s.last_error
        self.dirty = True
        if not ft.restart_failed_envs or delay is None:
            s.state = "failed"
            why = ("faultTolerance.restartFailedEnvs is false" if not ft.restart_failed_envs
                   else f"{s.streak.failures} failures in a row (maxRestarts={ft.max_restarts})")
            s.last_error += f"; not restarted: {why}"
            self.last_error = s.last_error
            log.error("pool %s: %s", self.spec.name, s.last_error)
            return
        log.warning("pool %s: %s; restarting its %d envs in %.1fs", self.spec.name,
                    s.last_error, s.num_envs, delay)
        s.after_failure = True
        s.restarts += 1
        s.state = "backoff"
        s.retry_at = now + delay
        if delay == 0:
            self._launch(s)


    def scale(self, now: float, leased: Mapping[int, str], withdraw: Withdraw) -> None:
        """Add or remove actors until the pool holds ``desired_envs`` envs."""
        if not all(s.size_known for s in self.slots.values()):
            return  # adopted actors still to report how many envs they hold
        desired = self.spec.desired_envs
        total = sum(s.num_envs for s in self.slots.values())
        if total < desired:
            slot = max(self.slots, default=-1) + 1
            while total < desired:
                n = min(self.spec.envs_per_actor, desired - total)
                s = Slot(slot, n)
                self.slots[slot] = s
                self._launch(s)
                total += n
                slot += 1
            log.info("pool %s: scaled up to %d envs in %d actors", self.spec.name, total,
                     len(self.slots))
        elif total > desired:
            self._scale_down(total - desired, leased, withdraw)

    def _scale_down(self, excess: int, leased: Mapping[int, str], withdraw: Withdraw) -> None:
        """Remove ``excess`` envs from actors no trainer leases; never a leased one.

        What leases hold stays until the lease ends (the next ticks finish the job), so
        a size written from a slightly old lease count (the autoscaler's, an HPA's)
        cannot take envs from a trainer. The plan is made from ``leased`` (the last
        sync); the registry has the last word (``withdraw``): an actor leased since is
        kept, and the next pass plans again.
        """
        remove, cut, cut_by = plan_scale_down(list(self.slots.values()), excess, leased)
        asked = [s.slot for s in remove] + ([cut.slot] if cut is not None else [])
        if not asked:
            return
        granted = set(withdraw(asked))
        removed = 0
        for s in remove:
            if s.slot in granted:
                kill(s.handle)
                del self.slots[s.slot]
                removed += s.num_envs
        if cut is not None and cut.slot in granted:
            # no whole free actor fits the excess: rebuild a free one with fewer envs
            cut.num_envs -= cut_by
            removed += cut_by
            self.relaunch(cut, after_failure=False)
        if granted:
            self.dirty = True  # withdrawn slots left the registry's layout: republish
        kept = len(asked) - len(granted)
        if removed or kept:
            left = sum(s.num_envs for s in self.slots.values())
            held = f" ({left - self.spec.desired_envs} more stay leased until released)" \
                if left > self.spec.desired_envs else ""
            late = f"; {kept} actors leased since the last pass kept" if kept else ""
            log.info("pool %s: scaled down by %d to %d envs in %d actors%s%s", self.spec.name,
                     removed, left, len(self.slots), held, late)


def restored(prev: SlotInfo | None, slot: int, envs_per_actor: int) -> Slot:
    """A slot rebuilt from its published record (a fresh one when there is none)."""
    if prev is None:
        return Slot(slot, envs_per_actor)
    s = Slot(slot, prev.num_envs, generation_of(prev.actor_name), actor_id=prev.actor_id,
             restarts=prev.restarts, last_error=prev.last_error, node_id=prev.node_id)
    s.streak.failures = prev.streak
    return s


def plan_scale_down(slots: Sequence[Slot], excess: int, leased: Mapping[int, str]
                    ) -> tuple[list[Slot], Slot | None, int]:
    """Which actors to remove for ``excess`` fewer envs, never a leased one.

    Returns (whole actors to remove, newest first; an actor to rebuild smaller or None;
    by how many envs). A free actor is cut only when no whole free actor fits what is
    left of the excess.
    """
    order = sorted((s for s in slots if s.slot not in leased), key=lambda s: -s.slot)
    remove: list[Slot] = []
    for s in order:
        if excess == 0:
            break
        if s.num_envs <= excess:
            remove.append(s)
            excess -= s.num_envs
    cut = None
    if excess:
        gone = {s.slot for s in remove}
        cut = next((s for s in order if s.slot not in gone and s.num_envs > excess), None)
    return remove, cut, excess if cut is not None else 0
