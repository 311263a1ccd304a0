"""A lease's heartbeat (issue 31): renewals retried within seconds, each one bounded,
no exception the end of it, only the registry's "no" a lost lease; the HTTP lease's
heartbeat against a real local HTTP server that answers badly for a while."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from remote_env import errors
from remote_env.driver import heartbeat, http_lease


def _until(cond: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout}s: {what}")
        time.sleep(0.01)


class Registry:
    """``renew`` answers from a script (True, False, an exception to raise, or an Event
    to block on), then True; records when each call started."""

    def __init__(self, script: list[Any]) -> None:
        self.script = list(script)
        self.calls: list[float] = []
        self.running = 0
        self.most_running = 0
        self._lock = threading.Lock()

    def renew(self) -> bool:
        with self._lock:
            self.calls.append(time.monotonic())
            self.running += 1
            self.most_running = max(self.most_running, self.running)
            step = self.script.pop(0) if self.script else True
        try:
            if isinstance(step, threading.Event):
                step.wait(30)
                return True
            if isinstance(step, BaseException):
                raise step
            return bool(step)
        finally:
            with self._lock:
                self.running -= 1


def test_a_failed_renewal_is_retried_within_seconds_not_an_interval_later() -> None:
    # ttl 3 s: an interval of 1 s; the old heartbeat waited that long after every failure
    reg = Registry([ConnectionError("the head is gone"), OSError("refused"), True])
    beat = heartbeat.Heartbeat("t1", 3.0, reg.renew)
    try:
        _until(lambda: beat.renewals >= 1, 5, "a renewal after two failures")
        first, second, third = reg.calls[:3]
        assert second - first < 0.8 and third - second < 1.3, reg.calls  # 0.5 s, then 1 s
        assert beat.failures == 0 and not beat.lost and beat.alive
        assert "OSError: refused" in beat.last_error
    finally:
        beat.stop()


def test_any_exception_is_a_failed_renewal_never_the_threads_end() -> None:
    reg = Registry([ValueError("Expecting value: line 1 column 1"), KeyError("ok"),
                    RuntimeError("boom"), True, True])
    beat = heartbeat.Heartbeat("t2", 0.6, reg.renew)
    try:
        _until(lambda: beat.renewals >= 2, 10, "renewals after three unexpected exceptions")
        assert beat.alive and not beat.lost
    finally:
        beat.stop()


def test_a_renewal_ended_by_a_base_exception_is_one_failed_renewal() -> None:
    # SystemExit/KeyboardInterrupt raised inside the renew call (a library calling
    # sys.exit, a client re-raising its own interrupt) left the renewal thread without an
    # answer, and unpacking the empty answer killed the heartbeat thread (ValueError)
    reg = Registry([SystemExit(3), KeyboardInterrupt(), True, True])
    beat = heartbeat.Heartbeat("t5", 0.6, reg.renew)
    try:
        _until(lambda: beat.renewals >= 2, 10, "renewals after SystemExit and KeyboardInterrupt")
        assert beat.alive and not beat.lost and beat.failures == 0
        assert len(reg.calls) >= 4, reg.calls
        assert beat.last_error.startswith("KeyboardInterrupt"), beat.last_error
    finally:
        beat.stop()


def test_a_hung_renewal_does_not_stop_the_heartbeat_and_none_runs_beside_it() -> None:
    release = threading.Event()
    reg = Registry([release])
    beat = heartbeat.Heartbeat("t3", 0.6, reg.renew, budget_s=0.1)
    try:
        # the heartbeat goes on, counting the hung call as failures, one call at a time
        _until(lambda: beat.failures >= 3, 5, "the hung renewal reported")
        assert "has not returned" in beat.last_error
        assert len(reg.calls) == 1 and reg.most_running == 1 and beat.alive
        release.set()
        _until(lambda: beat.renewals >= 2, 5, "renewals once the hung call returned")
        assert reg.most_running == 1 and beat.failures == 0
    finally:
        release.set()
        beat.stop()


def test_only_the_registrys_no_loses_the_lease_and_ends_the_heartbeat() -> None:
    reg = Registry([ConnectionError("x"), False])
    beat = heartbeat.Heartbeat("t4", 0.6, reg.renew)
    _until(lambda: beat.lost, 5, "the lease lost")
    _until(lambda: not beat.alive, 2, "the heartbeat ended")
    calls = len(reg.calls)
    time.sleep(0.5)
    assert len(reg.calls) == calls == 2


# ------------------------------------------------------------------ HTTP lease


class _Api:
    """A lease API stand-in on a real socket: heartbeats answered from a script of
    (status, body bytes), then 200 ``{"ok": true}``."""

    def __init__(self, script: list[tuple[int, bytes]], port: int = 0) -> None:
        self.script = list(script)
        self.heartbeats: list[dict[str, Any]] = []
        api = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                status, raw = 200, b'{"ok": true}'
                if self.path == "/v1/heartbeat":
                    api.heartbeats.append(body)
                    if api.script:
                        status, raw = api.script.pop(0)
                self.send_response(status)
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def api_of() -> Iterator[Callable[[list[tuple[int, bytes]]], _Api]]:
    made: list[_Api] = []

    def make(script: list[tuple[int, bytes]]) -> _Api:
        made.append(_Api(script))
        return made[-1]

    yield make
    for a in made:
        a.close()


def _lease(api: _Api, ttl_s: float) -> http_lease.HttpLease:
    answer = {"lease_id": "ab" * 16, "epoch": 7, "actors": [{"slot": 0}, {"slot": 3}]}
    return http_lease.HttpLease(http_lease.LeaseApi(api.url, "tok"), answer, "t", ttl_s)


def test_the_http_heartbeat_rides_out_a_page_that_is_not_json_and_503s(
        api_of: Callable[[list[tuple[int, bytes]]], _Api]) -> None:
    # what a proxy in front of a restarting pool server answers: an HTML page with 200
    # (the old heartbeat thread died of its ValueError: no heartbeat ever again), 503s
    api = api_of([(200, b"<html>upstream starting</html>"),
                  (503, b'{"error": "not ready", "retryable": true}'),
                  (502, b"bad gateway")])
    lease = _lease(api, 0.9)
    try:
        _until(lambda: len(api.heartbeats) >= 5, 10, "heartbeats after the bad answers")
        assert not lease.lost
        lease.check()
        assert api.heartbeats[-1] == {"lease_id": "ab" * 16, "trainer": "t", "slots": [0, 3],
                                      "ttl_s": 0.9, "epoch": 7}
    finally:
        lease.release()


def test_the_http_heartbeat_is_retried_while_the_api_is_unreachable(
        api_of: Callable[[list[tuple[int, bytes]]], _Api]) -> None:
    api = api_of([])
    lease = _lease(api, 0.9)
    try:
        _until(lambda: len(api.heartbeats) >= 1, 5, "a first heartbeat")
        port = api.server.server_address[1]
        api.close()  # the pool server restarting with its head
        time.sleep(1.0)  # heartbeats refused meanwhile
        again = _Api([], port)  # the same address: a restarted pool server behind its Service
        try:
            _until(lambda: len(again.heartbeats) >= 2, 10, "heartbeats once it is back")
            assert not lease.lost
        finally:
            again.close()
    finally:
        lease.release()


def test_a_410_loses_the_http_lease_and_the_next_call_raises(
        api_of: Callable[[list[tuple[int, bytes]]], _Api]) -> None:
    api = api_of([(503, b'{"retryable": true}'), (410, b'{"error": "lease_lost"}')])
    lease = _lease(api, 0.6)
    _until(lambda: lease.lost, 5, "the lease lost on 410")
    with pytest.raises(errors.LeaseLostError, match="another trainer"):
        lease.check()
    time.sleep(0.5)
    assert len(api.heartbeats) == 2  # none after the pool's "lost"
    lease.release()
