"""remote_env.pool.registry in-process, with a fake clock: leases and replacements."""

from __future__ import annotations

import threading

import pytest

from remote_env.pool.registry import LeaseError, PoolRegistry, SlotInfo


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def _slots(*sizes: int, state: str = "ready") -> list[SlotInfo]:
    return [SlotInfo(i, f"host-{i:05d}-g1", f"id{i}-1", n, state) for i, n in enumerate(sizes)]  # type: ignore[arg-type]


def _registry(*sizes: int) -> tuple[PoolRegistry, Clock]:
    clock = Clock()
    reg = PoolRegistry("p", clock=clock)
    reg.server_sync(_slots(*sizes), {"signature": "s"}, timeout=0)
    return reg, clock


def test_leases_are_disjoint_and_whole_actors() -> None:
    reg, _ = _registry(2, 2, 2)
    a = reg.acquire("a", 2, ttl_s=10)
    b = reg.acquire("b", 4, ttl_s=10)
    got_a = {s.slot for s in a["slots"]}
    got_b = {s.slot for s in b["slots"]}
    assert got_a.isdisjoint(got_b) and got_a | got_b == {0, 1, 2}
    assert a["pool_info"] == {"signature": "s"}
    with pytest.raises(LeaseError, match=r"cannot lease num_envs=1: 0 free \(6 leased\)"):
        reg.acquire("c", 1, ttl_s=10)
    assert reg.release(a["lease_id"]) and not reg.release(a["lease_id"])
    assert {s.slot for s in reg.acquire("c", None, ttl_s=10)["slots"]} == got_a


def test_num_envs_must_be_a_sum_of_free_actor_sizes() -> None:
    reg, _ = _registry(4, 4, 2)
    assert [s.slot for s in reg.acquire("a", 6, ttl_s=10)["slots"]] == [0, 2]
    with pytest.raises(LeaseError, match=r"4 free .*hold \[4\] envs: ask for a sum of those"):
        reg.acquire("b", 3, ttl_s=10)
    with pytest.raises(LeaseError, match="num_envs must be >= 1"):
        reg.acquire("b", 0, ttl_s=10)
    with pytest.raises(LeaseError, match="ttl_s must be > 0"):
        reg.acquire("b", 4, ttl_s=0)


def test_only_ready_actors_are_leased() -> None:
    clock = Clock()
    reg = PoolRegistry("p", clock=clock)
    reg.server_sync(_slots(2, 2, state="starting"), None, timeout=0)
    with pytest.raises(LeaseError, match=r"0 free \(4 starting\)"):
        reg.acquire("a", None, ttl_s=10)


def test_a_lease_expires_without_heartbeats_and_revives_if_untouched() -> None:
    reg, clock = _registry(2, 2)
    a = reg.acquire("a", 2, ttl_s=5)
    slots_a = [s.slot for s in a["slots"]]
    clock.t += 4
    assert reg.renew(a["lease_id"], "a", slots_a, 5)  # heartbeat in time
    clock.t += 5.5
    assert reg.layout()["leases"] == []  # expired
    # nobody took the envs: a late heartbeat gets them back
    assert reg.renew(a["lease_id"], "a", slots_a, 5)
    assert [lease["trainer"] for lease in reg.layout()["leases"]] == ["a"]
    clock.t += 6
    b = reg.acquire("b", 4, ttl_s=5)  # a expired again; b takes everything
    assert len(b["slots"]) == 2
    assert not reg.renew(a["lease_id"], "a", slots_a, 5)


def test_replacement_requests_reach_the_server_and_trainers_wait_for_the_new_actor() -> None:
    reg, _ = _registry(2, 2)
    assert not reg.request_replace(0, "stale-id", "actor_died")  # not the slot's actor
    results: list[dict[str, object]] = []
    waiter = threading.Thread(target=lambda: results.append(
        reg.wait_for_replacement(1, "id1-1", timeout=10)))
    waiter.start()
    assert reg.request_replace(1, "id1-1", "timeout")
    sync = reg.server_sync(None, None, timeout=10)  # returns at once: a request is waiting
    assert sync["requests"] == [(1, "id1-1", "timeout")]
    new = _slots(2, 2)
    new[1] = SlotInfo(1, "host-00001-g2", "id1-2", 2, "starting")
    reg.server_sync(new, None, timeout=0)
    assert waiter.is_alive()  # not ready yet
    new[1] = SlotInfo(1, "host-00001-g2", "id1-2", 2, "ready")
    reg.server_sync(new, None, timeout=0)
    waiter.join(5)
    assert results == [{"slot": new[1]}]
    assert reg.wait_for_replacement(0, "id0-1", timeout=0) == {
        "timeout": True, "server_seen_s_ago": 0.0}
    reg.server_sync(new[1:], None, timeout=0)
    assert reg.wait_for_replacement(0, "id0-1", timeout=0) == {"removed": True}


def test_a_restarted_registry_waits_for_the_layout_instead_of_failing_trainers() -> None:
    reg = PoolRegistry("p", clock=Clock())  # empty, as after a crash
    assert reg.renew("lease-1", "a", [0, 1], 5)  # cannot check slots yet: keep the lease
    assert reg.request_replace(0, "id0-1", "actor_died")
    assert reg.wait_for_replacement(0, "id0-1", timeout=0)["timeout"] is True
    assert reg.server_sync(_slots(2, 2), None, timeout=0)["requests"] == [
        (0, "id0-1", "actor_died")]
