"""remote_env.pool.http_server: what /status shows to whom (pure, no server)."""

from __future__ import annotations

from typing import Any

import pytest

from remote_env.pool import http_server

STATUS: dict[str, Any] = {
    "pool": "cp", "readyEnvs": 4, "leasedEnvs": 2, "lastError": "",
    "slots": [
        {"slot": 0, "name": "host-0-g1", "actorId": "a0", "envs": 2, "state": "ready",
         "restarts": 0, "nodeId": "n0", "leasedBy": "trainer-host:4242", "lastError": ""},
        {"slot": 1, "name": "host-1-g1", "actorId": "a1", "envs": 2, "state": "ready",
         "restarts": 1, "nodeId": "n1", "leasedBy": None, "lastError": ""},
    ],
    "leases": [{"lease_id": "0123abcd", "trainer": "trainer-host:4242", "slots": [0]}],
}


def test_plain_status_names_no_lease_trainer_actor_or_node() -> None:
    code, doc = http_server.status_response(STATUS, "", "10.244.0.7")
    assert code == 200
    text = repr(doc)
    for secret in ("0123abcd", "trainer-host:4242", "a0", "a1", "n0", "n1"):
        assert secret not in text
    assert doc["leaseCount"] == 1 and "leases" not in doc
    assert [s["leased"] for s in doc["slots"]] == [True, False]
    assert doc["readyEnvs"] == 4 and doc["slots"][1]["restarts"] == 1


@pytest.mark.parametrize("client", ["127.0.0.1", "::1", "127.0.0.5"])
def test_detail_is_answered_to_loopback(client: str) -> None:
    code, doc = http_server.status_response(STATUS, "detail=1", client)
    assert code == 200 and doc["leases"][0]["lease_id"] == "0123abcd"
    assert doc["slots"][0]["leasedBy"] == "trainer-host:4242"


@pytest.mark.parametrize("client", ["10.244.0.7", "192.168.1.2", "fe80::1", "not-an-ip"])
def test_detail_is_refused_to_other_clients(client: str) -> None:
    code, doc = http_server.status_response(STATUS, "detail=true", client)
    assert code == 403 and "loopback" in doc["error"]
    assert "0123abcd" not in repr(doc)
