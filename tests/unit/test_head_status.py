"""HeadAvailable and its Events: the head's outage and recovery on the EnvPool (issue 31)."""

from __future__ import annotations

import datetime
from typing import Any

import prometheus_client

from envpool_operator import builders, kube, metrics, reconcile, runtime, settings, status
from remote_env import spec

SETTINGS = settings.Settings(image="registry.example/envpool:1.0")
T0 = datetime.datetime(2026, 1, 1, tzinfo=datetime.timezone.utc)


def _pool(**over: Any) -> spec.PoolSpec:
    raw: dict[str, Any] = {"env": {"id": "CartPole-v1"}, "replicas": 16}
    raw.update(over)
    return spec.parse_spec(raw, name="cp", namespace="ns")


def _rc(pool: spec.PoolSpec, head_ready: bool) -> dict[str, Any]:
    rc = builders.build_ray_cluster(pool, SETTINGS)
    rc["metadata"].update(generation=1)
    flag = "True" if head_ready else "False"
    rc["status"] = {"observedGeneration": 1, "readyWorkerReplicas": pool.workers,
                    "conditions": [{"type": "HeadPodReady", "status": flag},
                                   {"type": "RayClusterProvisioned", "status": "True"}]}
    return rc


def _status(pool: spec.PoolSpec, head_ready: bool, previous: dict[str, Any],
            at: datetime.datetime) -> dict[str, Any]:
    return status.compute_status(
        name="cp", namespace="ns", generation=1, observed_generation=1, pool=pool,
        spec_error=None, ray_cluster=_rc(pool, head_ready), pool_report=None,
        previous=previous, now=at, expected_hash=builders.cluster_hash(pool, SETTINGS))


def _head(st: dict[str, Any]) -> dict[str, Any]:
    (cond,) = [c for c in st["conditions"] if c["type"] == "HeadAvailable"]
    return dict(cond)


def test_an_outage_under_fault_tolerance_is_recovering_and_its_events_say_how_long() -> None:
    pool = _pool()
    starting = _status(pool, False, {}, T0)
    assert _head(starting)["reason"] == "HeadStarting"
    assert status.head_event({}, starting) is None  # not an outage: it never was up
    up = _status(pool, True, starting, T0 + datetime.timedelta(seconds=30))
    assert _head(up)["status"] == "True" and "Redis cp-redis.ns.svc:6379" in _head(up)["message"]
    assert status.head_event(starting, up) is None

    down = _status(pool, False, up, T0 + datetime.timedelta(seconds=100))
    head = _head(down)
    assert head["status"] == "False" and head["reason"] == "HeadRecovering"
    assert "keep running" in head["message"]
    assert status.head_event(up, down) == ("Warning", "HeadUnavailable", head["message"])
    # still down: the outage keeps its reason and start, and no second event
    still = _status(pool, False, down, T0 + datetime.timedelta(seconds=120))
    assert _head(still)["reason"] == "HeadRecovering"
    assert _head(still)["lastTransitionTime"] == head["lastTransitionTime"]
    assert status.head_event(down, still) is None

    back = _status(pool, True, still, T0 + datetime.timedelta(seconds=163))
    assert _head(back)["status"] == "True"
    assert status.head_event(still, back) == ("Normal", "HeadRecovered",
                                              "the head pod is ready again after 63s")


def test_without_fault_tolerance_the_heads_loss_is_the_pools() -> None:
    pool = _pool(headFaultTolerance={"enabled": False})
    up = _status(pool, True, {}, T0)
    assert "no GCS fault tolerance" in _head(up)["message"]
    down = _status(pool, False, up, T0 + datetime.timedelta(seconds=5))
    assert _head(down)["reason"] == "HeadLost" and "re-created" in _head(down)["message"]
    assert status.head_event(up, down)[:2] == ("Warning", "HeadUnavailable")  # type: ignore[index]


def test_no_ray_cluster_or_spec() -> None:
    pool = _pool()
    st = status.compute_status(name="cp", namespace="ns", generation=1, observed_generation=1,
                               pool=pool, spec_error=None, ray_cluster=None, pool_report=None,
                               previous={}, now=T0)
    assert _head(st)["reason"] == "NotCreated"
    st = status.compute_status(name="cp", namespace="ns", generation=1, observed_generation=1,
                               pool=None, spec_error="bad", ray_cluster=None, pool_report=None,
                               previous={}, now=T0)
    assert _head(st)["status"] == "Unknown"


def test_the_dashboards_gauge_follows_the_condition_through_an_outage() -> None:
    """envpool_pool_head_available (the dashboard's "Head available" panel) is read from
    the EnvPools the operator keeps: 1 while the head is ready, 0 with the outage's
    reason while it is not, no series for a pool without the condition yet."""
    reg = prometheus_client.CollectorRegistry()
    rt = runtime.Runtime(settings=SETTINGS, metrics=metrics.OperatorMetrics(reg))
    rt.metrics.track_heads(rt.heads)
    pool = _pool()
    up = _status(pool, True, {}, T0)
    down = _status(pool, False, up, T0 + datetime.timedelta(seconds=10))

    def sample(reason: str) -> float | None:
        return reg.get_sample_value("envpool_pool_head_available",
                                    {"namespace": "ns", "pool": "cp", "reason": reason})

    rt.remember_pool(("ns", "fresh"), {"metadata": {"name": "fresh"}, "status": {}})
    rt.remember_pool(("ns", "cp"), {"metadata": {"name": "cp"}, "status": up})
    assert sample("HeadReady") == 1.0
    assert rt.heads() == [("ns", "cp", True, "HeadReady")]  # "fresh": no condition, no series
    rt.remember_pool(("ns", "cp"), {"metadata": {"name": "cp"}, "status": down})
    assert (sample("HeadRecovering"), sample("HeadReady")) == (0.0, None)
    rt.forget(("ns", "cp"))
    assert sample("HeadRecovering") is None


class _Api:
    """The two API writes of :func:`reconcile.write_status`, in the order made (the
    ordering is the point: a unit test of it; tests/e2e/test_head_loss_real_node.py
    kills the operator on a real cluster)."""

    def __init__(self, refuse_events: bool = False) -> None:
        self.calls: list[tuple[str, str]] = []
        self.refuse_events = refuse_events

    def post_event(self, body: Any, etype: str, reason: str, message: str) -> None:
        if self.refuse_events:
            raise kube.ApiProblem(status.Problem("Forbidden", "events is forbidden"), None)
        self.calls.append(("event", reason))

    def patch_envpool_status(self, ns: str, name: str, st: Any) -> None:
        self.calls.append(("status", _head(st)["reason"]))


class _Log:
    def __init__(self) -> None:
        self.warnings: list[str] = []

    def info(self, msg: str) -> None:
        pass

    def warning(self, msg: str) -> None:
        self.warnings.append(msg)


def _written_outage(monkeypatch: Any, api: _Api) -> tuple[reconcile.StatusWrites, _Log]:
    monkeypatch.setattr(reconcile.kube, "post_event", api.post_event)
    monkeypatch.setattr(reconcile.kube, "patch_envpool_status", api.patch_envpool_status)
    pool = _pool()
    up = _status(pool, True, {}, T0)
    down = _status(pool, False, up, T0 + datetime.timedelta(seconds=100))
    rt = runtime.Runtime(settings=SETTINGS,
                         metrics=metrics.OperatorMetrics(prometheus_client.CollectorRegistry()))
    written, log = reconcile.StatusWrites(), _Log()
    body = {"metadata": {"name": "cp", "namespace": "ns"}, "status": up}
    reconcile.write_status(("ns", "cp"), body, down, rt, written, log)
    # the same outage seen again (the next RayCluster event): no second Event
    again = {**body, "status": written.basis(("ns", "cp"), up)}
    reconcile.write_status(("ns", "cp"), again, down, rt, written, log)
    return written, log


def test_the_outages_event_is_posted_before_the_status_that_records_it(monkeypatch: Any) -> None:
    api = _Api()
    _written_outage(monkeypatch, api)
    # an operator killed between the two leaves the status as it was: its successor
    # sees the change again and posts the Event (kopf.event's queue posted it after)
    assert api.calls == [("event", "HeadUnavailable"), ("status", "HeadRecovering"),
                         ("status", "HeadRecovering")]


def test_an_event_the_api_refuses_does_not_hold_the_status(monkeypatch: Any) -> None:
    api = _Api(refuse_events=True)
    _, log = _written_outage(monkeypatch, api)
    assert api.calls == [("status", "HeadRecovering"), ("status", "HeadRecovering")]
    assert len(log.warnings) == 1 and "HeadUnavailable" in log.warnings[0]
