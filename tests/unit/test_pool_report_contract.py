"""status.pool: what the pool server writes is what the operator reads (one typed model)."""

from __future__ import annotations

import datetime
import json

import pytest

from envpool_operator import status as operator_status
from remote_env import spec as spec_mod
from remote_env.pool import snapshot
from remote_env.pool.slot import ActorSlot, SlotState
from remote_env.spec import pool_report
from remote_env.spec.pool_report import PoolReport


def _status() -> dict[str, object]:
    pool = spec_mod.parse_spec({"env": {"id": "CartPole-v1"}, "replicas": 6,
                                "envsPerActor": 2}, name="cp", namespace="ns")
    slots = [ActorSlot(i, 2) for i in range(3)]
    states: tuple[SlotState, ...] = ("ready", "ready", "starting")
    for s, state, node in zip(slots, states, ("n1", "n2", "n2"), strict=True):
        s.state, s.node_id, s.revision = state, node, pool.revision()
    slots[0].last_error = "host-00000-g0: timeout: late"
    return snapshot.snapshot(
        pool, ray_namespace="envpool-cp", slots=slots, leased={0: "abcd1234"},
        leases=[{"lease_id": "abcd1234", "trainer": "t"}], hosts={"n1": "w-a", "n2": "w-b"},
        last_error="host-00000-g0: timeout: late", healthy=True, spec_version=1)


def test_the_written_report_holds_exactly_the_contract_keys() -> None:
    doc = snapshot.pool_report(_status())
    assert tuple(doc) == pool_report.KEYS
    assert doc["leasedWorkers"] == ["w-a"] and doc["freeWorkers"] == ["w-b"]
    assert (doc["readyEnvs"], doc["leasedEnvs"], doc["freeEnvs"]) == (4, 2, 2)


def test_the_operator_reads_back_what_the_pool_server_wrote_byte_for_byte() -> None:
    doc = snapshot.pool_report(_status())
    # through the API server: JSON both ways
    read = PoolReport.read(json.loads(json.dumps(doc)))
    assert read is not None
    assert json.dumps(read.to_document()) == json.dumps(doc)
    now = pool_report.parse_time(doc["updatedAt"])
    assert now is not None
    assert operator_status.fresh_report(doc, now) == read


def test_staleness_is_one_rule_at_the_boundary() -> None:
    t0 = datetime.datetime(2026, 1, 1, tzinfo=datetime.timezone.utc)
    doc = {"readyEnvs": 1, "desiredEnvs": 1, "updatedAt": pool_report.timestamp(t0)}
    edge = t0 + datetime.timedelta(seconds=pool_report.STALE_AFTER_S)
    assert pool_report.fresh(doc, edge) is not None
    assert pool_report.fresh(doc, edge + datetime.timedelta(seconds=1)) is None
    assert pool_report.REPORT_INTERVAL_S < pool_report.STALE_AFTER_S


@pytest.mark.parametrize("doc", [None, {}])
def test_no_report_reads_as_none(doc: dict[str, object] | None) -> None:
    assert PoolReport.read(doc) is None


def test_an_older_writer_reads_without_leases_or_revision_and_bad_counts_as_zero() -> None:
    read = PoolReport.read({"readyEnvs": True, "desiredEnvs": "4", "updatedAt": "x"})
    assert read is not None
    assert (read.ready_envs, read.desired_envs) == (0, 0)
    assert (read.leased_envs, read.free_envs, read.revision) == (None, None, None)
    assert not read.is_fresh(datetime.datetime.now(datetime.timezone.utc))


def test_a_status_without_a_contract_key_is_refused() -> None:
    status = _status()
    del status["outdatedLeasedEnvs"]
    with pytest.raises(KeyError, match="outdatedLeasedEnvs"):
        snapshot.pool_report(status)
