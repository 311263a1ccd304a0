"""A lease's heartbeat: renewals on a daemon thread, each one bounded, none silent.

Both kinds of lease own one: a Ray trainer's (:class:`~remote_env.driver.attach._LeaseKeeper`)
and an HTTP trainer's (:class:`~remote_env.driver.http_lease.HttpLease`); each gives it
its ``renew`` call. The rules, from a head pod lost under GCS fault tolerance (issue 31:
a trainer stepped on with 0 errors while its lease ran out, renewals resumed too late):

* **a failed renewal is tried again within seconds** (:data:`RETRY_BASE_S` doubling to
  :data:`RETRY_CAP_S`), not one interval (a third of the ttl) later: when the head comes
  back, the lease its restarted lease actor rebuilt runs one ttl from then, and a
  trainer that must connect to Ray again first has to be back well within it;
* **every renewal is waited for at most** ``budget_s`` (on a thread of its own): a call
  that hangs inside Ray's client (a wedged connection is noticed by gRPC's keepalive
  only after ~10 min) does not stop the heartbeat, which logs it every interval until
  it returns; no second call is started beside it;
* **any exception is a failed renewal** (logged), never the end of the thread; a
  ``BaseException`` raised inside the call (``SystemExit``) too;
* **only the registry's word ends it:** ``renew`` answering False (the lease expired
  and another trainer holds some of its envs now) sets :attr:`Heartbeat.lost`, and the
  trainer's next call raises :class:`~remote_env.errors.LeaseLostError`.

No Ray here: the HTTP trainer's import path runs without it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Final

from remote_env import restarts

log = logging.getLogger(__name__)

#: The first retry of a failed renewal waits this long; each further one twice as long.
RETRY_BASE_S: Final = 0.5
#: ... up to this (and never longer than the interval).
RETRY_CAP_S: Final = 5.0

#: ``renew()``: True renewed, False lost (another trainer's now); raises when the
#: registry could not be asked (unreachable, restarting, a timeout).
Renew = Callable[[], bool]


class Heartbeat:
    """Calls ``renew`` every ``ttl_s / 3`` until :meth:`stop` or a False answer.

    Owns the lease's liveness as the trainer sees it: :attr:`lost`, the renewals done,
    the failures in a row, when it last renewed.

    Args:
        name: the lease, in log lines and the thread's name (a short lease id).
        ttl_s: the lease's ttl: renewals every third of it.
        renew: one renewal (see :data:`Renew`); it bounds its own calls where it can.
        budget_s: how long one renewal is waited for (default: a third of the ttl).
    """

    def __init__(self, name: str, ttl_s: float, renew: Renew,
                 budget_s: float | None = None) -> None:
        self.name = name
        self.ttl_s = ttl_s
        self.interval_s = ttl_s / 3
        self.budget_s = self.interval_s if budget_s is None else budget_s
        self._renew = renew
        #: the registry said the lease is over: the trainer's next call raises
        self.lost = False
        self.renewals = 0
        #: failed (or unfinished) renewals since the last one that succeeded
        self.failures = 0
        #: monotonic time of the last renewal (the lease's grant at first)
        self.last_renewed = time.monotonic()
        self.last_error = ""
        self._stop = threading.Event()
        #: the renewal in flight (a thread), and what it answered: True, False or the
        #: exception it raised; one at a time
        self._call: threading.Thread | None = None
        self._call_started = 0.0
        self._answer: list[bool | BaseException] = []
        self._thread = threading.Thread(target=self._run, name=f"lease-{name}", daemon=True)
        self._thread.start()

    @property
    def renewing_s(self) -> float:
        """Seconds since the last renewal (the grant at first)."""
        return time.monotonic() - self.last_renewed

    @property
    def alive(self) -> bool:
        """The heartbeat thread runs (until :meth:`stop` or a lost lease)."""
        return self._thread.is_alive()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        wait = self.interval_s
        while not self._stop.wait(wait):
            outcome = self._attempt()
            if outcome is False:
                self.lost = True
                log.error("lease %s: lost: the pool says another trainer holds some of its "
                          "envs now", self.name)
                return
            if outcome is True:
                self.renewals += 1
                self.failures = 0
                self.last_renewed = time.monotonic()
                wait = self.interval_s
                continue
            self.failures += 1
            self.last_error = outcome
            late = self.renewing_s > self.ttl_s
            log.log(logging.ERROR if late else logging.WARNING,
                    "lease %s: renewal failed (%d in a row, %.0fs since the last one%s): %s",
                    self.name, self.failures, self.renewing_s,
                    f", longer than its ttl of {self.ttl_s:g}s: the pool may give its envs "
                    "to another trainer (a lease nobody took is granted again at the next "
                    "renewal)" if late else "", outcome)
            wait = min(self.interval_s,
                       restarts.backoff(RETRY_BASE_S, self.failures - 1, RETRY_CAP_S))

    def _attempt(self) -> bool | str:
        """One renewal, waited for up to the budget: True, False, or why it failed (an
        exception's text, or that it has not returned yet)."""
        if self._call is None:
            answer: list[bool | BaseException] = []
            self._answer = answer
            self._call = threading.Thread(target=self._call_renew, args=(answer,),
                                          name=f"lease-{self.name}-renew", daemon=True)
            self._call_started = time.monotonic()
            self._call.start()
        self._call.join(self.budget_s)
        if self._call.is_alive():
            # left running (Ray's client cannot be interrupted): waited for again at the
            # next beat, and no other call is started meanwhile
            return (f"a renewal has not returned for {time.monotonic() - self._call_started:.0f}s "
                    "(the registry or the connection to it hangs)")
        self._call = None
        # _call_renew always answers; were its thread ever to end without (a failure in
        # the append itself), that is one more failed renewal, not the heartbeat's end
        got = self._answer[0] if self._answer else RuntimeError("the renewal ended unanswered")
        if isinstance(got, BaseException):
            return f"{type(got).__name__}: {_first_line(got)}"
        return got

    def _call_renew(self, answer: list[bool | BaseException]) -> None:
        try:
            answer.append(bool(self._renew()))
        except BaseException as exc:  # every failure is one failed renewal, never the end
            # BaseException too: SystemExit/KeyboardInterrupt here come from the renew call
            # itself (a library calling sys.exit, a client re-raising its own interrupt),
            # never from the user's Ctrl-C, which CPython raises only in the main thread
            # (where remote_env.interrupts handles it). Re-raising would not reach the main
            # thread either: it would only end this thread with no answer for the heartbeat.
            log.debug("lease %s: renewal raised", self.name, exc_info=True)
            answer.append(exc)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else ""
