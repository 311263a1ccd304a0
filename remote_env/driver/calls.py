"""Calls in flight: sending them to hosts, waiting for them, collecting their results.

One wait loop serves ``step``/``reset`` (every call) and ``recv`` (whichever are
ready within ``batch_wait_ms``). Each pass it moves replacements on, and a call
past its deadline counts as done (hung) whatever the others do, so a hang is seen
within ``step_timeout_s + batch_wait_ms`` even while other envs keep answering.
"""

from __future__ import annotations

import itertools
import multiprocessing
import time
import warnings
from typing import Any

import numpy as np

from remote_env import errors, interrupts
from remote_env.driver.actor_set import Call, Deferred
from remote_env.driver.assembly import Batches
from remote_env.driver.faults import FaultHandling
from remote_env.wire import channel

#: a group that is every id given (one host's): sent as given, without a gather
_ALL = np.arange(0)


def _in_order(ids: np.ndarray) -> bool:
    """``ids`` (distinct, in ``[0, n)``, all ``n`` of them) are ``0..n-1`` in order.

    Why: ``per_env[j]`` belongs to ``ids[j]``; only then is it also env ``j``'s, which
    the every-env fast path assumes. A send naming every env in another order (two
    recv() batches joined) goes through the per-host gather like any subset.
    """
    return len(ids) < 2 or bool((ids[1:] > ids[:-1]).all())


class CallLoop(FaultHandling):
    """Mixin of :class:`~remote_env.driver.vector.RemoteVectorEnv`: the calls in flight."""

    #: results received and not handed to the caller yet (their envs stay busy)
    _ready: Batches
    #: calls in flight no caller waits for any more (see _orphan_all)
    _orphans: dict[Any, Call]
    splits_per_actor: int

    def _submit(self, ids: np.ndarray, per_env: Any, options: dict[str, Any] | None, *,
                is_reset: bool) -> None:
        """One call per host (per split of it) for the envs ``ids``; ``per_env[j]`` belongs
        to ``ids[j]``."""
        if self._orphans:
            self._drain_orphans()
        hosts_of = self._env_host[ids]
        groups: list[tuple[int, np.ndarray | None]]
        if len(ids) == self.num_envs and not is_reset and _in_order(ids):
            # every env, ids in order: per_env[e] is env e's (sliced per host, no gather)
            groups = [(h, None) for h in range(len(self._hosts))]
        elif hosts_of.min() == hosts_of.max():  # the usual recv/send loop: one actor's envs
            groups = [(int(hosts_of[0]), _ALL)]
        else:
            groups = [(int(h), np.flatnonzero(hosts_of == h)) for h in np.unique(hosts_of)]
        for h, sel in groups:
            host = self._hosts[h]
            payload: Any
            if sel is None:
                env_ids = host.env_ids
                if host.lo >= 0 and isinstance(per_env, np.ndarray):
                    payload = per_env[host.lo:host.hi]
                else:
                    payload = [per_env[int(e)] for e in env_ids]
            elif sel is _ALL:  # no gather: the caller's arrays as they are
                env_ids, payload = ids, per_env
            else:
                env_ids = ids[sel]
                payload = per_env[sel] if isinstance(per_env, np.ndarray) else [
                    per_env[int(j)] for j in sel]
            positions = self._env_pos[env_ids].tolist()
            for part_ids, part_pos, part in self._split(host, env_ids, positions, payload):
                if is_reset:
                    for e, s in zip(part_ids, part, strict=True):
                        if s is not None:
                            self._seeds[int(e)] = s
                    args: tuple[Any, ...] = (part_pos, list(part), options)
                else:
                    args = (part_pos, part)
                self._enqueue(Call(h, part_ids, part_pos, is_reset, 0.0, 0,
                                   "reset" if is_reset else "step", args))

    def _split(self, host: Any, env_ids: np.ndarray, positions: list[int],
               payload: Any) -> list[tuple[np.ndarray, list[int], Any]]:
        """One host's share of a send as one call per split of its envs (``splits_per_actor``).

        Why: Sample Factory's double-buffered sampling. An actor answers its calls in
        order, so while the driver handles one split's reply (copies its observations,
        sends its next actions) the actor already steps the next split: the driver and
        the actor each keep a core busy instead of taking turns. A split is a fixed
        range of the actor's positions, so it stays one call however the caller
        regroups its sends.
        """
        if self.splits_per_actor == 1:
            return [(env_ids, positions, payload)]
        size = -(-len(host.env_ids) // self.splits_per_actor)
        parts = [p // size for p in positions]
        cuts = [j for j in range(1, len(parts)) if parts[j] != parts[j - 1]]
        if not cuts:
            return [(env_ids, positions, payload)]
        if all(parts[j] > parts[j - 1] for j in cuts):  # ascending: slices, no gather
            bounds = [0, *cuts, len(parts)]
            return [(env_ids[a:b], positions[a:b], payload[a:b])
                    for a, b in itertools.pairwise(bounds)]
        groups: dict[int, list[int]] = {}
        for j, part in enumerate(parts):
            groups.setdefault(part, []).append(j)
        return [(env_ids[js], [positions[j] for j in js],
                 payload[js] if isinstance(payload, np.ndarray) else [payload[j] for j in js])
                for js in groups.values()]

    def _poll(self, *, every: bool, timeout: float | None,
              gather_s: float = 0.0) -> tuple[list[Any], set[Any]]:
        """Keys of finished calls (all of them if ``every``) and which of them hung.

        Finished: answered, past its deadline, or failed before it could be sent.
        Without ``every``: what is ready within ``gather_s``, else the first to finish.
        """
        t0 = time.perf_counter()
        end = None if timeout is None else t0 + timeout
        # a zero window is "whatever is ready with the first": no separate zero-wait pass
        window: float | None = None if every or gather_s <= 0 else gather_s
        while True:
            wake = self._advance()
            now = time.perf_counter()
            live = [k for k in self._calls if not isinstance(k, Deferred)]
            for k in live:
                d = self._deadline(self._calls[k])
                if d is not None:
                    wake = d if wake is None else min(wake, d)
            if end is not None:
                wake = end if wake is None else min(wake, end)
            left = None if wake is None else max(0.0, wake - now)
            if window is not None:
                wait_s = window if left is None else min(window, left)
                ready, _ = channel.wait(live, len(live), wait_s, self._ray)
                window = None
            elif every or not live:
                ready, _ = channel.wait(live, len(live), left, self._ray)
            else:
                ready, _ = channel.wait(live, 1, left, self._ray)
                # socket replies that had arrived were all read with the first; Ray refs
                # need asking
                if ready and len(ready) < len(live) and not all(
                        isinstance(k, channel.ChannelCall) for k in live):
                    ready, _ = channel.wait(live, len(live), 0, self._ray)
            now = time.perf_counter()
            ready_set = set(ready)
            hung = {k for k in live if k not in ready_set and self._expired(self._calls[k], now)}
            done = ready_set | hung
            if len(live) < len(self._calls):  # calls held for a replacement that failed
                done |= {k for k, c in self._calls.items()
                         if isinstance(k, Deferred) and c.error is not None}
            if every and len(done) == len(self._calls):
                return list(self._calls), hung
            if not every and done:
                return [k for k in self._calls if k in done], hung
            if end is not None and now >= end:
                pending = len(self._calls) - len(done)
                raise multiprocessing.TimeoutError(
                    f"timed out after {timeout}s: {pending} of {len(self._calls)} actor calls "
                    "still pending (the calls stay pending: wait again)"
                )
            held = any(isinstance(k, Deferred) and c.error is None for k, c in self._calls.items())
            if held and len(ready_set | hung) == len(live) and left is not None:
                # only calls held for a replacement are left: sleep until it is due
                with interrupts.interruptible():
                    time.sleep(min(max(wake - now, 0.0) if wake is not None else 0.0, 0.05))

    def _collect(self, keys: list[Any], hung: set[Any]) -> None:
        """Move the results of the finished calls ``keys`` into :attr:`_ready`, as
        (global env ids, Batch); faults handled here.

        Every call given is consumed before an error is raised, and the others'
        results stay in ``_ready`` (returned by the next ``recv``, or carried on a
        step's exception), so an error never drops what arrived beside it. A call
        leaves ``_calls`` only once its result is in hand: an interrupt in a wait
        here leaves it in flight, to be read again. Follow-up calls (SAME_STEP after
        a lost actor) stay in flight.
        """
        raised: list[Exception] = []
        lost: list[Exception] = []
        for key in keys:
            call = self._calls[key]
            host = self._hosts[call.host]
            try:
                batch = self._result(key, call, key in hung)
            except errors.SubEnvironmentError as exc:
                self._drop(key, call)
                raised.append(exc)
                continue
            except errors.LeaseLostError as exc:  # fenced out: the envs are someone else's
                self._drop(key, call)
                lost.append(exc)
                continue
            except Exception as exc:  # anything else is this call's error: left in flight
                self._drop(key, call)  # it would fail every later wait the same way
                ids = call.env_ids.tolist()
                raised.append(errors.ResultError(
                    ids[0], f"the result for sub-environments {ids} could not be handled: "
                    f"{type(exc).__name__}: {exc}"))
                continue
            del self._calls[key]
            if batch is None:  # its follow-up call holds these envs now
                continue
            for f in batch.failures:
                e = int(host.env_ids[f.index])
                if f.reason == "exception":
                    self.metrics.failures["exception"].inc()
                if f.restarted:
                    self._restarts[e] += 1
                    self.metrics.env_restarts.inc()
                if f.permanent:
                    self._failed[e] = True
                    raised.append(self._error(host, f))
            # the reply's positions are the call's, in its order (the usual case): its ids
            same = isinstance(batch.indices, list) and batch.indices == call.positions
            ids = call.env_ids if same else host.env_ids[batch.indices]
            self._ready.append((ids, batch))
        if lost or raised:
            raise (lost or raised)[0]

    def _drop(self, key: Any, call: Call) -> None:
        """A call that ended in an error: off the books, its envs free to be sent again."""
        del self._calls[key]
        self._busy[call.env_ids] = False

    def _wait_all(self, timeout: float | None) -> None:
        """Wait for every call in flight, results into ``_ready`` (step/reset).

        A timeout or an interrupt leaves the calls not yet finished in flight, so the
        wait resumes; an env's error is raised once the finished calls are consumed.
        """
        t_end = None if timeout is None else time.perf_counter() + timeout
        while self._calls:
            left = None if t_end is None else max(0.0, t_end - time.perf_counter())
            keys, hung = self._poll(every=True, timeout=left)
            self._collect(keys, hung)

    def _take_ready(self) -> Batches:
        """The results waiting to be handed out; their envs are free to be sent again."""
        out, self._ready = self._ready, []
        for ids, _ in out:
            self._busy[ids] = False
        return out

    def _orphan_all(self) -> None:
        """The caller gave up on the calls in flight (a reset() cut short, a step that
        raised): they are waited out before anything is sent again (:meth:`_drain_orphans`)."""
        self._orphans.update(self._calls)
        self._calls = {}
        self._ready = []
        self._busy[:] = False

    def _drain_orphans(self) -> None:
        """Wait out the calls no caller waits for any more, results dropped.

        Why: an env's next call must follow its previous one (a late reply must not be
        read as a later call's, and the shared arrays hold one call's rows per env), and
        failures in them still count (restarts, failed envs). An interrupt here leaves
        the rest orphaned, waited out by the next send.
        """
        mine, ready = self._calls, self._ready
        self._calls, self._orphans, self._ready = self._orphans, {}, []
        try:
            while self._calls:
                try:
                    self._wait_all(None)
                except Exception as exc:  # an env failed in a call no one waits for
                    warnings.warn(f"a call abandoned earlier (a step or reset that raised or "
                                  f"was interrupted) failed as it finished: {exc}",
                                  RuntimeWarning, stacklevel=2)
        finally:
            self._orphans.update(self._calls)
            self._calls, self._ready = mine, ready
            self._busy[:] = False
            for call in self._calls.values():
                self._busy[call.env_ids] = True
            for ids, _ in self._ready:
                self._busy[ids] = True

    def _abandon(self) -> None:
        """Forget every call in flight (close)."""
        self._calls = {}
        self._orphans = {}
        self._busy[:] = False
        self._ready = []
