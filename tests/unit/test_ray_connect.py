"""Which Ray `ray_connect.connect` joins: the argument, then $RAY_ADDRESS, then the default.

`ray.init` is recorded, not run (the integration tests start real Rays through it); the
settings that bound a connect are read back from Ray's real config.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from typing import Any

import pytest
import ray

from remote_env import ray_connect


@pytest.fixture
def inits(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    calls: list[dict[str, Any]] = []
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda **kw: calls.append(kw))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    return calls


def test_default_is_a_fresh_local_ray_without_dashboard(inits: list[dict[str, Any]]) -> None:
    ray_connect.connect(num_cpus=2)
    assert inits == [{"address": "local", "include_dashboard": False, "num_cpus": 2}]


def test_ray_address_wins_over_the_default(inits: list[dict[str, Any]],
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAY_ADDRESS", "ray://head:10001")
    ray_connect.connect(default="auto")
    assert inits == [{"address": "ray://head:10001"}]


def test_an_explicit_address_wins_over_ray_address(inits: list[dict[str, Any]],
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAY_ADDRESS", "ray://head:10001")
    ray_connect.connect("local", namespace="ns")
    assert inits == [{"address": "local", "include_dashboard": False, "namespace": "ns"}]


def test_a_connected_ray_is_kept(inits: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ray, "is_initialized", lambda: True)
    assert ray_connect.connect("ray://elsewhere:10001") is ray
    assert inits == []


def test_wait_s_retries_a_cluster_that_does_not_answer_yet(monkeypatch: pytest.MonkeyPatch) -> None:
    tries: list[str] = []

    def init(**kw: Any) -> None:
        tries.append(kw["address"])
        if len(tries) < 3:
            raise ConnectionAbortedError("Starting Ray client server failed")

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", init)
    monkeypatch.setattr(ray_connect.time, "sleep", lambda s: None)
    ray_connect.connect("ray://head:10001", wait_s=60)
    assert tries == ["ray://head:10001"] * 3


def test_without_wait_s_the_first_refusal_is_raised(monkeypatch: pytest.MonkeyPatch) -> None:
    def init(**kw: Any) -> None:
        raise ConnectionError("no GCS at head:6379")

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", init)
    with pytest.raises(ConnectionError, match="no GCS"):
        ray_connect.connect("head:6379")


_TRIES, _CHANNEL, _CLUSTER_ID = _KNOBS = (
    "RAY_gcs_server_port_wait_time_s", "RAY_gcs_rpc_server_connect_timeout_s",
    "RAY_py_gcs_connect_timeout_s")


def _in_a_fresh_python(body: str, **env: str) -> None:
    """Run ``body`` (asserts) in a new interpreter: Ray's config is process-wide, and in
    a whole run an earlier test may have left Ray initialized in this one (a connected
    Ray keeps its cluster's settings, and the bound is then rightly not applied)."""
    clean = {k: v for k, v in os.environ.items() if k not in _KNOBS}
    prelude = textwrap.dedent(f"""
        import os
        import ray
        from remote_env import ray_connect
        _TRIES, _CHANNEL, _CLUSTER_ID = _KNOBS = {_KNOBS!r}
        assert not ray.is_initialized()
    """)
    done = subprocess.run([sys.executable, "-c", prelude + textwrap.dedent(body)],
                          env={**clean, **env}, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]


def test_a_bounded_connect_sets_rays_own_timeouts_for_its_duration() -> None:
    # Ray's real config (no ray.init): what each ray.init try would wait for the GCS
    _in_a_fresh_python("""
        default = ray._config.py_gcs_connect_timeout_s()
        for wait_s, per_try in ((5, 2), (60, 15), (300, 30)):
            with ray_connect._bounded_gcs_connect(wait_s):
                assert {k: os.environ[k] for k in _KNOBS} == {
                    _TRIES: "1", _CHANNEL: "1", _CLUSTER_ID: str(per_try)}, {k: os.environ.get(k) for k in _KNOBS}
                got = ray._config.py_gcs_connect_timeout_s()
                assert got == per_try, (wait_s, got)  # read again by Ray
            assert not any(k in os.environ for k in _KNOBS)
            assert ray._config.py_gcs_connect_timeout_s() == default == 30  # Ray's own back
    """)


def test_a_users_own_ray_setting_is_kept() -> None:
    _in_a_fresh_python("""
        with ray_connect._bounded_gcs_connect(5):
            assert (os.environ[_CLUSTER_ID], os.environ[_TRIES]) == ("7", "1")
            assert ray._config.py_gcs_connect_timeout_s() == 7
        assert os.environ[_CLUSTER_ID] == "7" and _TRIES not in os.environ
        assert ray._config.py_gcs_connect_timeout_s() == 7
    """, RAY_py_gcs_connect_timeout_s="7")


def test_without_wait_s_a_gcs_where_nothing_answers_is_one_try_not_rays_fourteen_minutes() -> None:
    # A real ray.init against a port where nothing listens. The user's own (short) Ray
    # timeouts are kept, so one try takes ~5 s; Ray alone would make 20 of them.
    _in_a_fresh_python("""
        import socket, time
        s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
        t0 = time.monotonic()
        try:
            ray_connect.connect(f"127.0.0.1:{port}")
        except ConnectionError as exc:
            took = time.monotonic() - t0
            assert f"no Ray cluster answered at '127.0.0.1:{port}'" in str(exc), exc
            assert "wait_s" in str(exc), exc
        else:
            raise AssertionError("connected to nothing")
        assert took < 30, took
        assert _TRIES not in os.environ  # restored after the connect
    """, RAY_gcs_rpc_server_connect_timeout_s="1", RAY_py_gcs_connect_timeout_s="2")
