"""The dispatcher: sends planned calls over the links, and the one wait loop.

One wait loop serves ``step``/``reset`` (every call) and ``recv`` (whichever are
ready within ``batch_wait_ms``). Each pass it moves replacements on, and a call
past its deadline counts as done (hung) whatever the others do, so a hang is seen
within ``step_timeout_s + batch_wait_ms`` even while other envs keep answering.
It keeps no state of its own: calls are :class:`~remote_env.driver.inflight.InFlight`'s,
host health :class:`~remote_env.driver.recovery.Recovery`'s.
"""

from __future__ import annotations

import multiprocessing
import time
import warnings
from typing import Any

import numpy as np

from remote_env import errors, interrupts
from remote_env.driver import planner
from remote_env.driver.hosts import HostTable
from remote_env.driver.inflight import Call, Deferred, FollowUp, InFlight
from remote_env.driver.ledger import EnvLedger
from remote_env.driver.links import Links
from remote_env.driver.recovery import Recovery
from remote_env.driver.results import ResultReader
from remote_env.wire import channel


def _as_raised(exc: channel.RemoteCallError, method: str, name: str) -> BaseException:
    """The env's own exception, as SyncVectorEnv and AsyncVectorEnv raise it (and Ray
    does, as an instance of its cause), with the actor's traceback as a note."""
    cause = exc.cause
    if cause is None:
        return exc
    cause.add_note(f"raised in a sub-environment's actor by {method}({name!r}); "
                   f"its traceback there:\n{exc.remote_traceback}")
    return cause


class Dispatcher:
    """Sends calls, waits for them, and hands their results to :class:`InFlight`."""

    def __init__(self, *, splits_per_actor: int, hosts: HostTable, links: Links,
                 recovery: Recovery, inflight: InFlight, reader: ResultReader,
                 ledger: EnvLedger, ray: Any) -> None:
        self._splits = splits_per_actor
        self._hosts = hosts
        self._links = links
        self._recovery = recovery
        self._inflight = inflight
        self._reader = reader
        self._ledger = ledger
        self._ray = ray

    # ------------------------------------------------------------ sending
    def submit(self, ids: np.ndarray, per_env: Any, options: dict[str, Any] | None, *,
               is_reset: bool) -> None:
        """One call per host (per split of it) for the envs ``ids``; ``per_env[j]`` belongs
        to ``ids[j]``."""
        if self._inflight.has_orphans:
            self.drain_orphans()
        for p in planner.plan(self._hosts.layout, ids, per_env,
                              splits_per_actor=self._splits, is_reset=is_reset):
            if is_reset:
                self._ledger.remember_seeds(p.env_ids, p.payload)
                self._send(p.host, p.env_ids, p.positions, True, "reset",
                           (p.positions, list(p.payload), options))
            else:
                self._send(p.host, p.env_ids, p.positions, False, "step",
                           (p.positions, p.payload))

    def _send(self, h: int, env_ids: np.ndarray, positions: list[int], is_reset: bool,
              method: str, args: tuple[Any, ...], follow_up: FollowUp | None = None) -> None:
        """Send a call to host ``h`` now, or hold it until the host's replacement is up."""
        recovery = self._recovery
        if recovery.came_up_pending:  # calls held for a replacement go first
            self._resubmit()
        key: Any
        health = recovery.health(h)  # read at once: this runs on every call
        if health.broken is not None:  # fails at once (see ResultReader.read)
            key, call = Deferred(), Call(h, env_ids, positions, is_reset, method, args,
                                         follow_up=follow_up)
        elif not health.up:
            # held until the replacement is up: not a view of a buffer the caller reuses
            args = tuple(a.copy() if isinstance(a, np.ndarray) else a for a in args)
            key, call = Deferred(), Call(h, env_ids, positions, is_reset, method, args,
                                         follow_up=follow_up)
        else:
            starting = health.start_ref is not None
            call = Call(h, env_ids, positions, is_reset, method, args, time.perf_counter(),
                        health.generation, starting, follow_up)
            # direct: up (above) and started (a replacement's start is checked through Ray)
            key = self._links.call(h, method, *args, direct=not starting)
        self._inflight.add(key, call)

    def _resubmit(self) -> None:
        """Send the calls held for hosts whose replacement is up now."""
        for h in self._recovery.take_came_up():
            for key, call in self._inflight.deferred(h):
                self._inflight.remove(key)
                self._send(call.host, call.env_ids, call.positions, call.is_reset,
                           call.method, call.args, call.follow_up)

    def advance(self) -> float | None:
        """Replacements moved on (their held calls sent); when to look again (None: never)."""
        wake = self._recovery.advance()
        if self._recovery.came_up_pending:
            self._resubmit()
        return wake

    # ------------------------------------------------------------ waiting
    def poll(self, *, every: bool, timeout: float | None,
             gather_s: float = 0.0) -> tuple[list[Any], set[Any]]:
        """Keys of finished calls (all of them if ``every``) and which of them hung.

        Finished: answered, past its deadline, or failed before it could be sent.
        Without ``every``: what is ready within ``gather_s``, else the first to finish.
        """
        inflight, recovery, ray = self._inflight, self._recovery, self._ray
        t0 = time.perf_counter()
        end = None if timeout is None else t0 + timeout
        # a zero window is "whatever is ready with the first": no separate zero-wait pass
        window: float | None = None if every or gather_s <= 0 else gather_s
        while True:
            wake = recovery.advance()  # as self.advance(), one call less on every recv
            if recovery.came_up_pending:
                self._resubmit()
            now = time.perf_counter()
            live, calls = inflight.sent()
            deadline = recovery.next_deadline(calls)  # None: none of them can hang
            if deadline is not None:
                wake = deadline if wake is None else min(wake, deadline)
            if end is not None:
                wake = end if wake is None else min(wake, end)
            left = None if wake is None else max(0.0, wake - now)
            if window is not None:
                wait_s = window if left is None else min(window, left)
                ready, _ = channel.wait(live, len(live), wait_s, ray)
                window = None
            elif every or not live:
                ready, _ = channel.wait(live, len(live), left, ray)
            else:
                ready, _ = channel.wait(live, 1, left, ray)
                # socket replies that had arrived were all read with the first; Ray refs
                # need asking
                if ready and len(ready) < len(live) and not channel.only_calls(live):
                    ready, _ = channel.wait(live, len(live), 0, ray)
            now = time.perf_counter()
            ready_set = set(ready)
            hung = set() if deadline is None else {
                k for k, c in zip(live, calls, strict=True)
                if k not in ready_set and recovery.expired(c, now)}
            done = ready_set | hung
            held = []
            if len(live) < len(inflight):  # calls held for a replacement
                for k, c in inflight.deferred():
                    if recovery.broken(c.host) is not None:  # it failed: they fail now
                        done.add(k)
                    else:
                        held.append(k)
            if every and len(done) == len(inflight):
                return inflight.all_keys(), hung
            if not every and done:
                return [k for k in inflight.all_keys() if k in done], hung
            if end is not None and now >= end:
                pending = len(inflight) - len(done)
                raise multiprocessing.TimeoutError(
                    f"timed out after {timeout}s: {pending} of {len(inflight)} actor calls "
                    "still pending (the calls stay pending: wait again)"
                )
            if held and len(ready_set | hung) == len(live) and left is not None:
                # only calls held for a replacement are left: sleep until it is due
                with interrupts.interruptible():
                    time.sleep(min(max(wake - now, 0.0) if wake is not None else 0.0, 0.05))

    def collect(self, keys: list[Any], hung: set[Any]) -> None:
        """Move the results of the finished calls ``keys`` into the ready results, as
        (global env ids, Batch); faults handled here.

        Every call given is consumed before an error is raised, and the others'
        results stay ready (returned by the next ``recv``, or carried on a step's
        exception), so an error never drops what arrived beside it. A call leaves
        the books only once its result is in hand: an interrupt in a wait here leaves
        it in flight, to be read again. Follow-up calls (SAME_STEP after a lost actor)
        stay in flight.
        """
        inflight, reader = self._inflight, self._reader
        raised: list[Exception] = []
        lost: list[Exception] = []
        for key in keys:
            call = inflight[key]
            try:
                batch = reader.read(key, call, key in hung)
            except errors.SubEnvironmentError as exc:
                inflight.drop(key)
                raised.append(exc)
                continue
            except errors.LeaseLostError as exc:  # fenced out: the envs are someone else's
                inflight.drop(key)
                lost.append(exc)
                continue
            except Exception as exc:  # anything else is this call's error: left in flight
                inflight.drop(key)  # it would fail every later wait the same way
                ids = call.env_ids.tolist()
                raised.append(errors.ResultError(
                    ids[0], f"the result for sub-environments {ids} could not be handled: "
                    f"{type(exc).__name__}: {exc}"))
                continue
            inflight.remove(key)
            if isinstance(batch, Call):  # its follow-up call holds these envs now
                self._send(batch.host, batch.env_ids, batch.positions, batch.is_reset,
                           batch.method, batch.args, batch.follow_up)
                continue
            ids, failed = reader.account(call, batch)
            raised.extend(failed)
            inflight.deliver(ids, batch)
        if lost or raised:
            raise (lost or raised)[0]

    def wait_all(self, timeout: float | None) -> None:
        """Wait for every call in flight, results made ready (step/reset).

        A timeout or an interrupt leaves the calls not yet finished in flight, so the
        wait resumes; an env's error is raised once the finished calls are consumed.
        """
        t_end = None if timeout is None else time.perf_counter() + timeout
        while self._inflight:
            left = None if t_end is None else max(0.0, t_end - time.perf_counter())
            keys, hung = self.poll(every=True, timeout=left)
            self.collect(keys, hung)

    def drain_orphans(self) -> None:
        """Wait out the calls no caller waits for any more, results dropped.

        Why: an env's next call must follow its previous one (a late reply must not be
        read as a later call's, and the shared arrays hold one call's rows per env), and
        failures in them still count (restarts, failed envs). An interrupt here leaves
        the rest orphaned, waited out by the next send.
        """
        mine, ready = self._inflight.adopt_orphans()
        try:
            while self._inflight:
                try:
                    self.wait_all(None)
                except Exception as exc:  # an env failed in a call no one waits for
                    warnings.warn(f"a call abandoned earlier (a step or reset that raised or "
                                  f"was interrupted) failed as it finished: {exc}",
                                  RuntimeWarning, stacklevel=2)
        finally:
            self._inflight.restore(mine, ready)

    # ---------------------------------------------- call / get_attr / set_attr
    def on_each_host(self, method: str, name: str, *rest: Any,
                     env_ids: np.ndarray | None = None) -> dict[int, Any]:
        """``method`` on the hosts of ``env_ids`` (all when None); each result by env id.
        A callable in ``rest`` is called with the host's env ids to give its argument."""
        # an interrupt lands only in a wait: the replies not taken then are matched to
        # their own calls by id and dropped, never read as another call's
        with interrupts.deferred():
            return self._on_each_host_now(method, name, *rest, env_ids=env_ids)

    def _on_each_host_now(self, method: str, name: str, *rest: Any,
                          env_ids: np.ndarray | None = None) -> dict[int, Any]:
        while self._recovery.waiting():
            wake = self.advance()  # a replacement still due: wait for it
            with interrupts.interruptible():
                time.sleep(0.0 if wake is None
                           else min(max(wake - time.perf_counter(), 0.0), 0.05))
        env_pos = self._hosts.layout.env_pos
        refs, groups = [], []
        for h, mine in self._hosts.by_host(env_ids):
            args = [r(mine) if callable(r) else r for r in rest]
            refs.append(self._links.call(h, method, env_pos[mine].tolist(), name, *args,
                                         direct=self._recovery.direct_ok(h)))
            groups.append(mine)
        # Every host's answer is taken before one's error is raised, so no reply is
        # left behind for a later call (nor an error Ray would log as unhandled).
        out, failed = [], []
        for ref in refs:
            try:
                out.append(channel.get(ref, self._ray))
            except Exception as exc:  # the env's (or Ray's RayTaskError, an instance of it)
                failed.append(exc)
        if failed:
            first = failed[0]
            raise (_as_raised(first, method, name) if isinstance(first, channel.RemoteCallError)
                   else first)
        return {int(e): x for mine, r in zip(groups, out, strict=True)
                for e, x in zip(mine.tolist(), r or [None] * len(mine), strict=True)}
