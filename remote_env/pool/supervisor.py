"""The pool's env actors: adopted, pinged, replaced, rolled and scaled.

:class:`ActorSupervisor` owns the slots (one env actor position each), the state
machine of each (starting -> ready -> backoff | failed) and the pool's last error;
it alone writes a slot's fields. :class:`~remote_env.pool.server.PoolServer` drives
it once a tick and publishes its :meth:`~ActorSupervisor.layout` whenever
:attr:`~ActorSupervisor.layout_version` moved. Failures are counted and retried
under :class:`remote_env.restarts.CrashLoop`'s rule; an
:class:`~remote_env.pool.launch.ActorLauncher` (a collaborator) asks Ray for the
actors.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

from remote_env import restarts
from remote_env import spec as spec_mod
from remote_env.metrics import FAILURE_REASONS, PoolMetrics
from remote_env.pool import launch, rollout
from remote_env.pool.slot import (
    HOST_NAME_RE,
    ActorSlot,
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

#: ``withdraw(slots)``: the lease actor takes the unleased ones of ``slots`` out of reach
#: of new leases and returns them (:meth:`remote_env.pool.lease_actor.LeaseActor.withdraw`).
Withdraw = Callable[[list[int]], Sequence[int]]


class ActorSupervisor:
    """One pool's env actors in Ray namespace ``ray_namespace``.

    Owns the slots and every field of each (:class:`~remote_env.pool.slot.ActorSlot`
    is its record), the running spec, ``last_error`` and ``layout_version``, which
    goes up on every change of what :meth:`layout` shows: a publisher compares it
    with the version it last published.
    """

    def __init__(self, spec: spec_mod.PoolSpec, *, ray_namespace: str, metrics: PoolMetrics,
                 health_interval_s: float, launcher: launch.ActorLauncher) -> None:
        self._spec = spec
        self.ray_namespace = ray_namespace
        self.metrics = metrics
        self.health_interval_s = health_interval_s
        self.launcher = launcher
        self._slots: dict[int, ActorSlot] = {}
        self._layout_version = 0
        self._last_error = ""
        #: slot -> when a rollout first found it outdated (the start of a leased one's grace)
        self._outdated_since: dict[int, float] = {}

    # ---------------------------------------------------------------- views
    @property
    def spec(self) -> spec_mod.PoolSpec:
        """The spec the actors run (changed by :meth:`respec`)."""
        return self._spec

    @property
    def last_error(self) -> str:
        """The last failure of an actor (or of a supervision pass); "" while none."""
        return self._last_error

    @property
    def layout_version(self) -> int:
        """Goes up whenever :meth:`layout` would show something new."""
        return self._layout_version

    def slots(self) -> list[ActorSlot]:
        """The slots in slot order (records to read; the supervisor writes them)."""
        return sorted(self._slots.values(), key=lambda x: x.slot)

    def layout(self) -> list[SlotInfo]:
        return [s.info() for s in self.slots()]

    def max_unavailable(self) -> int:
        return self._spec.update_strategy.max_unavailable_envs(self._spec.desired_envs)

    # ------------------------------------------------------------- commands
    def tick_failed(self, message: str) -> None:
        """A supervision pass failed (a Ray hiccup): shown as the last error."""
        self._last_error = message

    def supervise(self, now: float, leased: Mapping[int, str], withdraw: Withdraw) -> None:
        """One pass: starts, pings, backoffs, then scaling to ``spec.desired_envs``.

        ``leased`` is the lease actor's last answer, to plan a scale-down by; ``withdraw``
        asks it at the moment of removal (a lease may have been granted since).
        """
        self._check_starts(now)
        self._check_pings(now)
        self._send_pings(now)
        self._retry_backoffs(now)
        self.scale(now, leased, withdraw)
        self.roll(now, leased, withdraw)

    def reported(self, slot: int, actor_id: str, reason: str, now: float) -> None:
        """A trainer saw actor ``actor_id`` of ``slot`` fail: replace it (once)."""
        s = self._slots.get(slot)
        if s is not None and s.actor_id == actor_id and s.state == "ready":
            why = "no answer within the trainer's step timeout" if reason == "timeout" \
                else "a trainer's call to it failed"
            self._fail(s, reason if reason in FAILURE_REASONS else "actor_died", why, now)

    def respec(self, spec: spec_mod.PoolSpec, now: float) -> None:
        """Run ``spec`` from now on. Actors built differently are not replaced here:
        :meth:`roll` rebuilds them a few at a time, leased ones when released."""
        old, self._spec = self._spec, spec
        if old.revision() != spec.revision():
            log.info("pool %s: env or actor settings changed (revision %s -> %s): rolling "
                     "free actors, at most %d envs at a time; leased ones when released",
                     spec.name, old.revision(), spec.revision(), self.max_unavailable())
        for s in self._slots.values():
            if s.state == "failed":  # a new spec is the user's retry
                s.streak = restarts.Streak()
                s.retry_at = now
                s.state = "backoff"
        self._changed()

    def roll(self, now: float, leased: Mapping[int, str], withdraw: Withdraw) -> None:
        """One rollout step (:func:`remote_env.pool.rollout.plan`): rebuild free actors of
        an older revision in place, or remove those of another size (the next scaling
        pass adds actors of the new size). The lease actor has the last word on which are
        still free (``withdraw``), as for a scale-down. With ``leasedActors:
        ReplaceAfterGrace`` a leased one past its grace is rebuilt too, as after a
        failure: its trainer's calls fail once and it steps the new actor."""
        if not all(s.size_known for s in self._slots.values()):
            return
        spec = self._spec
        revision = spec.revision()
        outdated = {s.slot for s in self._slots.values() if s.revision != revision}
        self._outdated_since = {slot: self._outdated_since.get(slot, now) for slot in outdated}
        grace = spec.update_strategy.leased_grace
        overdue = set() if grace is None else {
            slot for slot in outdated if slot in leased and now - self._outdated_since[slot] >= grace}
        step = rollout.plan(list(self._slots.values()), revision=revision,
                            envs_per_actor=spec.envs_per_actor, desired_envs=spec.desired_envs,
                            max_unavailable=self.max_unavailable(), leased=leased,
                            overdue=overdue)
        for slot_id in step.evict:
            s = self._slots[slot_id]
            log.warning("pool %s: %s: leased past updateStrategy.leasedGraceSeconds=%d: "
                        "rebuilding it for revision %s; its trainer's envs restart",
                        spec.name, s.name, spec.update_strategy.leased_grace_seconds, revision)
            s.restarts += 1
            self._relaunch(s, after_failure=True)  # fresh envs: reset on their next step
            self._changed()
        if not step.slots:
            return
        granted = set(withdraw(step.slots))
        for slot_id in step.rebuild:
            if slot_id in granted:
                s = self._slots[slot_id]
                s.streak = restarts.Streak()
                self._relaunch(s, after_failure=False)
        for slot_id in step.remove:
            if slot_id in granted:
                kill(self._slots.pop(slot_id).handle)
        if granted:
            self._changed()  # withdrawn slots left the lease actor's layout: republish
            left = rollout.progress(list(self._slots.values()), spec.revision(), leased)
            log.info("pool %s: rolling to revision %s: rebuilding %d actors, removing %d "
                     "(resized); %d envs still outdated (%d leased)", spec.name,
                     spec.revision(), len(granted & set(step.rebuild)),
                     len(granted & set(step.remove)), left.outdated_envs,
                     left.outdated_leased_envs)

    def kill_all(self) -> None:
        for s in self._slots.values():
            kill(s.handle)
        self._slots.clear()

    def adopt(self, published: Sequence[SlotInfo], pool_info: Mapping[str, Any],
              now: float) -> None:
        """Take over the pool a previous pool server left: the lease actor's layout and the
        named actors in the namespace, together.

        A live actor is adopted with its slot's record (size, restarts, streak); a slot
        the lease actor knows without a live actor (in restart backoff, or its actor died
        while no server watched) is restarted under its streak; a failed one stays
        failed. So a restart of the pool server loses no slot a trainer may hold.
        """
        import ray

        known: dict[int, SlotInfo] = {s.slot: s for s in published}
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
        # Rebuild only actors known to be built from another spec; a lease actor that lost
        # its record (restarted with the head) cannot tell, so they are kept.
        built_from = pool_info.get("signature")
        same_build = built_from is None or built_from == signature(self._spec)
        for slot, gen, name in names:
            try:
                handle = ray.get_actor(name, namespace=self.ray_namespace)
            except ValueError:  # died meanwhile
                continue
            if gen != latest[slot]:
                kill(handle)  # an older generation a crashed server did not finish replacing
                continue
            prev = known.get(slot)
            s = restored(prev, slot, self._spec.envs_per_actor)
            s.generation = gen
            s.handle = handle
            s.actor_id = handle._actor_id.hex()
            s.size_known = prev is not None
            # Actors known to be built from another spec are rolled; a record without a
            # revision (an older pool server) counts as the pool_info's build.
            s.revision = prev.revision if prev is not None and prev.revision else (
                self._spec.revision() if same_build else "")
            # start() is idempotent: it answers with the description of a started host
            s.start_ref = handle.start.remote()
            self._slots[slot] = s
        lost = [prev for slot, prev in known.items() if slot not in self._slots]
        for prev in lost:
            s = restored(prev, prev.slot, self._spec.envs_per_actor)
            self._slots[s.slot] = s
            if prev.state == "failed":
                s.state = "failed"  # out of restarts: a new spec is the user's retry
                self._last_error = s.last_error
            elif prev.state == "backoff":
                s.state, s.retry_at, s.after_failure = "backoff", now, True
            else:
                self._fail(s, "actor_died", "its actor was gone when the pool server "
                                           "restarted", now)
        if self._slots:
            log.info("pool %s: adopted %d actors (%d envs) from namespace %s%s%s",
                     self._spec.name, len(self._slots) - len(lost),
                     sum(s.num_envs for s in self._slots.values()), self.ray_namespace,
                     f"; restarting {len(lost)} the lease actor knew without an actor"
                     if lost else "",
                     "" if same_build else "; rolling them: spec changed")

    def _check_starts(self, now: float) -> None:
        import ray

        starting = {s.start_ref: s for s in self._slots.values()
                    if s.state == "starting" and s.start_ref is not None}
        if not starting:
            return
        ready, pending = ray.wait(list(starting), num_returns=len(starting), timeout=0)
        limit = self._spec.fault_tolerance.start_timeout
        for ref in pending:
            s = starting[ref]
            if s.start_seen is None:
                s.start_seen = now
            elif limit is not None and now - s.start_seen > limit:
                # a hung env constructor: the actor answers nothing else either
                self._fail(s, "timeout", f"start timed out: start() did not finish within "
                                         f"startTimeoutSeconds={limit:g}", now)
        for ref in ready:
            s = starting[ref]
            s.start_ref = None
            try:
                info = ray.get(ref)
            except ray.exceptions.RayActorError as exc:
                self._fail(s, "actor_died", first_line(exc), now)
                continue
            except ray.exceptions.RayError as exc:
                self._fail(s, "exception", first_line(exc), now)
                continue
            permanent = [f for f in info.get("failures", []) if f.permanent]
            if permanent:
                f = permanent[0]
                log.warning("pool %s: %s: sub-env %d failed to start: %s\n%s", self._spec.name,
                            s.name, f.index, f.message, f.traceback)
                self._fail(s, "exception", f"sub-env {f.index}: {f.message}", now)
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
            self._changed()
            if s.after_failure:
                self.metrics.actor_restarts.inc()
                self.metrics.env_restarts.inc(s.num_envs)
                s.after_failure = False

    def _check_pings(self, now: float) -> None:
        import ray

        pinged = {s.ping_ref: s for s in self._slots.values()
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
                    self._fail(s, "actor_died", first_line(exc), now)
        timeout = self._spec.fault_tolerance.step_timeout
        for s in list(self._slots.values()):
            if s.state != "ready" or s.silent_since is None:
                continue
            silent = now - s.silent_since
            if timeout is not None and silent > timeout:
                self._fail(s, "timeout", f"no answer to a health ping within "
                                         f"stepTimeoutSeconds={timeout:g}", now)
            elif timeout is None and silent > UNAVAILABLE_DEAD_S and s.ping_ref is None:
                self._fail(s, "actor_died", f"unreachable for {silent:.0f}s", now)

    def _send_pings(self, now: float) -> None:
        for s in self._slots.values():
            if s.state == "ready" and s.ping_ref is None \
                    and now - s.ping_sent >= self.health_interval_s:
                s.ping_ref = s.handle.ping.remote()
                s.ping_sent = now
                if s.silent_since is None:
                    s.silent_since = now

    def _retry_backoffs(self, now: float) -> None:
        for s in self._slots.values():
            if s.state == "backoff" and now >= s.retry_at:
                self._launch(s)

    def _changed(self) -> None:
        self._layout_version += 1

    def _relaunch(self, s: ActorSlot, *, after_failure: bool) -> None:
        kill(s.handle)
        s.ping_ref = s.start_ref = None
        s.silent_since = None
        s.after_failure = after_failure
        self._launch(s)

    def _launch(self, s: ActorSlot) -> None:
        """Create ``s``'s next-generation actor and send it ``start()``."""
        spec = self._spec
        try:
            got = self.launcher.launch(spec, slot=s.slot, num_envs=s.num_envs,
                                       generation=s.generation, after_failure=s.after_failure,
                                       restarts=s.restarts)
        except launch.LaunchFailed as exc:
            s.generation = exc.generation
            self._launch_failed(s, str(exc))
            return
        s.generation = got.generation
        s.handle = got.handle
        s.actor_id = got.actor_id
        s.revision = spec.revision()
        s.start_ref = got.start_ref
        s.start_seen = None
        s.state = "starting"
        s.node_id = ""
        self._changed()

    def _launch_failed(self, s: ActorSlot, message: str) -> None:
        """Ray would not create ``s``'s actor: the slot is failed, with the reason."""
        s.handle = s.ping_ref = s.start_ref = None
        s.state = "failed"
        s.last_error = f"{s.name}: launch failed: {message}"
        self._last_error = s.last_error
        self.metrics.failures["exception"].inc(s.num_envs)
        self._changed()
        log.error("pool %s: %s", self._spec.name, s.last_error)

    def crash_loop(self) -> restarts.CrashLoop:
        """The rule for the pool's actors (from the running spec): no steps are seen
        here, so the proof of health is a good ping after HEALTHY_RESET_S of being up."""
        ft = self._spec.fault_tolerance
        return restarts.CrashLoop(ft.max_restarts, ft.restart_backoff_seconds,
                                  healthy_after_s=HEALTHY_RESET_S)

    def _fail(self, s: ActorSlot, reason: str, message: str, now: float) -> None:
        """``s``'s actor failed: kill it and restart it (backoff), or give up."""
        ft = self._spec.fault_tolerance
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
        self._last_error = s.last_error
        self._changed()
        if not ft.restart_failed_envs or delay is None:
            s.state = "failed"
            why = ("faultTolerance.restartFailedEnvs is false" if not ft.restart_failed_envs
                   else f"{s.streak.failures} failures in a row (maxRestarts={ft.max_restarts})")
            s.last_error += f"; not restarted: {why}"
            self._last_error = s.last_error
            log.error("pool %s: %s", self._spec.name, s.last_error)
            return
        log.warning("pool %s: %s; restarting its %d envs in %.1fs", self._spec.name,
                    s.last_error, s.num_envs, delay)
        s.after_failure = True
        s.restarts += 1
        s.state = "backoff"
        s.retry_at = now + delay
        if delay == 0:
            self._launch(s)

    def scale(self, now: float, leased: Mapping[int, str], withdraw: Withdraw) -> None:
        """Add or remove actors until the pool holds ``desired_envs`` envs."""
        if not all(s.size_known for s in self._slots.values()):
            return  # adopted actors still to report how many envs they hold
        desired = self._spec.desired_envs
        total = sum(s.num_envs for s in self._slots.values())
        if total < desired:
            slot = max(self._slots, default=-1) + 1
            while total < desired:
                n = min(self._spec.envs_per_actor, desired - total)
                s = ActorSlot(slot, n)
                self._slots[slot] = s
                self._launch(s)
                total += n
                slot += 1
            log.info("pool %s: scaled up to %d envs in %d actors", self._spec.name, total,
                     len(self._slots))
        elif total > desired:
            self._scale_down(total - desired, leased, withdraw)

    def _scale_down(self, excess: int, leased: Mapping[int, str], withdraw: Withdraw) -> None:
        """Remove ``excess`` envs from actors no trainer leases; never a leased one.

        What leases hold stays until the lease ends (the next ticks finish the job), so
        a size written from a slightly old lease count (the autoscaler's, an HPA's)
        cannot take envs from a trainer. The plan is made from ``leased`` (the last
        sync); the lease actor has the last word (``withdraw``): an actor leased since is
        kept, and the next pass plans again.
        """
        remove, cut, cut_by = plan_scale_down(list(self._slots.values()), excess, leased)
        asked = [s.slot for s in remove] + ([cut.slot] if cut is not None else [])
        if not asked:
            return
        granted = set(withdraw(asked))
        removed = 0
        for s in remove:
            if s.slot in granted:
                kill(s.handle)
                del self._slots[s.slot]
                removed += s.num_envs
        if cut is not None and cut.slot in granted:
            # no whole free actor fits the excess: rebuild a free one with fewer envs
            cut.num_envs -= cut_by
            removed += cut_by
            self._relaunch(cut, after_failure=False)
        if granted:
            self._changed()  # withdrawn slots left the lease actor's layout: republish
        kept = len(asked) - len(granted)
        if removed or kept:
            left = sum(s.num_envs for s in self._slots.values())
            held = f" ({left - self._spec.desired_envs} more stay leased until released)" \
                if left > self._spec.desired_envs else ""
            late = f"; {kept} actors leased since the last pass kept" if kept else ""
            log.info("pool %s: scaled down by %d to %d envs in %d actors%s%s", self._spec.name,
                     removed, left, len(self._slots), held, late)


def restored(prev: SlotInfo | None, slot: int, envs_per_actor: int) -> ActorSlot:
    """A slot rebuilt from its published record (a fresh one when there is none)."""
    if prev is None:
        return ActorSlot(slot, envs_per_actor)
    s = ActorSlot(slot, prev.num_envs, generation_of(prev.actor_name), actor_id=prev.actor_id,
             restarts=prev.restarts, last_error=prev.last_error, node_id=prev.node_id)
    s.streak.failures = prev.streak
    return s


def plan_scale_down(slots: Sequence[ActorSlot], excess: int, leased: Mapping[int, str]
                    ) -> tuple[list[ActorSlot], ActorSlot | None, int]:
    """Which actors to remove for ``excess`` fewer envs, never a leased one.

    Returns (whole actors to remove, newest first; an actor to rebuild smaller or None;
    by how many envs). A free actor is cut only when no whole free actor fits what is
    left of the excess.
    """
    order = sorted((s for s in slots if s.slot not in leased), key=lambda s: -s.slot)
    remove: list[ActorSlot] = []
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
