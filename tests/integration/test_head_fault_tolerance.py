"""The head's loss under GCS fault tolerance, on local Ray with a real Redis (issue 31).

What a Kubernetes head pod takes with it when it goes: the GCS, the lease actor (it
lives on the head) and the pool server (the head's sidecar). Here, on one machine, the
same three are killed together: the GCS process of the head node (Ray's own GCS fault
tolerance tests do the same), the lease actor's process, and the pool server closed.
The GCS keeps its tables in Debian's ``redis-server`` (what the operator runs per pool),
so when it comes back:

* the env actors are the same ones (none re-created);
* the lease actor, restarted by Ray, rebuilt its leases and layout from the GCS's KV
  (in Redis) before anything else: the trainer's lease is the same one, and a second
  trainer cannot get its envs;
* a new pool server re-adopts every actor;
* the trainer stepped all along (steps go from it to the env actors, not through the
  GCS) and got an answer for every step.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import ray
from pool_envs import constructions
from ray.cluster_utils import Cluster
from ray_checks import wait_for

from remote_env import RemoteVectorEnv, spec
from remote_env.pool import lease_actor, lease_store
from remote_env.pool.server import PoolServer
from remote_env.spec import ENV_RESOURCE

attach = RemoteVectorEnv.from_pool
HERE = Path(__file__).resolve().parent
pytestmark = pytest.mark.timeout(300)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """Debian's redis-server with a password: (address, password)."""
    exe = shutil.which("redis-server")
    if exe is None:
        pytest.fail("redis-server is not installed: apt-get install redis-server (Debian's "
                    "package, the one the test cluster's Redis image holds)", pytrace=False)
    port, password = _free_port(), secrets.token_urlsafe(16)
    data = tmp_path_factory.mktemp("redis")
    proc = subprocess.Popen(
        [exe, "--port", str(port), "--bind", "127.0.0.1", "--requirepass", password,
         "--dir", str(data), "--appendonly", "yes", "--save", ""],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        def listening() -> bool:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                return True
            except OSError:
                return False

        wait_for(listening, 10, "redis-server listening")
        yield f"127.0.0.1:{port}", password
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.fixture(scope="module")
def ft_cluster(redis: tuple[str, str]) -> Iterator[Cluster]:
    """A head (GCS in Redis, as KubeRay's gcsFaultToleranceOptions sets it up) and one
    worker node with the env resource."""
    address, password = redis
    ray.shutdown()
    saved = {k: os.environ.get(k) for k in ("PYTHONPATH", "RAY_REDIS_ADDRESS")}
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(HERE), saved["PYTHONPATH"]) if p)
    os.environ["RAY_REDIS_ADDRESS"] = address  # what KubeRay puts on the head
    c = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 1, "include_dashboard": False, "redis_password": password,
        "_system_config": {"health_check_period_ms": 500, "health_check_failure_threshold": 3,
                           # the raylets and drivers wait for the GCS this long
                           "gcs_rpc_server_reconnect_timeout_s": 60},
    })
    try:
        c.add_node(num_cpus=1, resources={ENV_RESOURCE: 16})
        ray.init(address=c.address)
        yield c
    finally:
        ray.shutdown()
        c.shutdown()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _doc(name: str, counter: Path) -> dict[str, Any]:
    return {
        "apiVersion": "envpool.dev/v1alpha1", "kind": "EnvPool", "metadata": {"name": name},
        "spec": {
            "env": {"entrypoint": "pool_envs:make_counted_cartpole",
                    "kwargs": {"counter_file": str(counter)}},
            "replicas": 4, "envsPerActor": 2,
            "faultTolerance": {"restartBackoffSeconds": 0, "stepTimeoutSeconds": 10},
        },
    }


def _server(doc: dict[str, Any]) -> PoolServer:
    server = PoolServer(spec.parse_manifest(doc), http_port=0, health_interval_s=0.3)
    server.start_background()
    return server


def _redis_keys(address: str, password: str) -> int:
    host, port = address.split(":")
    out = subprocess.run(["redis-cli", "-h", host, "-p", port, "--no-auth-warning", "-a",
                          password, "DBSIZE"], capture_output=True, text=True, check=True)
    return int(out.stdout.strip())


def test_the_heads_loss_keeps_actors_leases_and_a_stepping_trainer(
        ft_cluster: Cluster, redis: tuple[str, str], tmp_path: Path) -> None:
    name = "headft"
    counter = tmp_path / "constructed"
    server = _server(_doc(name, counter))
    server2: PoolServer | None = None
    try:
        server.wait_ready(60)
        assert _redis_keys(*redis) > 0, "the GCS keeps nothing in the Redis"
        a = attach(name, num_envs=2, trainer="A")
        a.reset(seed=0)
        a.step(np.zeros(2, dtype=np.int64))
        ns = spec.ray_namespace(name)
        reg = lease_actor.get_lease_actor(ns)
        before = lease_actor.PoolLayout.read(ray.get(reg.layout.remote(), timeout=10))
        actors_before = {s.slot: s.actor_id for s in before.slots}
        assert len(actors_before) == 2 and len(before.leases) == 1
        lease_pid = ray.get(reg.__ray_call__.remote(lambda self: os.getpid()), timeout=10)
        stored = lease_store.load_book(lease_store.RayKVStore(ns).load(lease_store.LEASES), 0.0)
        assert [x.trainer for x in stored.leases] == ["A"]

        # The head goes: its pool server, its GCS and the lease actor on it.
        server.close()
        t0 = time.monotonic()
        ft_cluster.head_node.kill_gcs_server()
        os.kill(lease_pid, signal.SIGKILL)
        steps = answered = 0
        slowest = 0.0
        while time.monotonic() - t0 < 5.0:  # the trainer steps while no GCS runs
            s0 = time.perf_counter()
            _, _, _, _, info = a.step(np.zeros(2, dtype=np.int64))
            slowest = max(slowest, time.perf_counter() - s0)
            steps += 2
            answered += 2 - int(np.sum(info.get("_error", np.zeros(2, dtype=bool))))
        ft_cluster.head_node.start_gcs_server()
        # the restarted head's pool server
        server2 = _server(_doc(name, counter))
        server2.wait_ready(90)
        recovered_s = time.monotonic() - t0

        reg = lease_actor.get_lease_actor(ns)
        after = lease_actor.PoolLayout.read(ray.get(reg.layout.remote(), timeout=30))
        new_pid = ray.get(reg.__ray_call__.remote(lambda self: os.getpid()), timeout=10)
        assert new_pid != lease_pid, "the lease actor was not restarted"
        # the same actors, none re-created, every one adopted by the new pool server
        assert {s.slot: s.actor_id for s in after.slots} == actors_before
        assert constructions(str(counter)) == 4
        assert sorted(s.actor_id for s in server2.supervisor.slots()) == sorted(
            actors_before.values())
        # the same lease (rebuilt from the KV before any grant), still A's
        def lasting(leases: list[dict[str, Any]]) -> list[dict[str, Any]]:
            return [{k: v for k, v in x.items() if k not in ("expires_in_s", "age_s")}
                    for x in leases]

        assert lasting(after.leases) == lasting(before.leases)
        assert after.leased_slots == before.leased_slots
        with pytest.raises(lease_actor.LeaseError, match=r"0 free \(2 leased\)|free"):
            attach(name, num_envs=4)
        b = attach(name, num_envs=2, trainer="B")
        assert set(b.slots).isdisjoint(a.slots)
        for _ in range(3):
            a.step(np.zeros(2, dtype=np.int64))
        assert not a.lease_lost
        assert steps > 0 and answered == steps, (answered, steps)
        print(f"\nhead loss on local Ray: {steps} env steps while the GCS was down, all answered; "
              f"slowest step {slowest * 1000:.1f} ms; pool server Ready again "
              f"{recovered_s:.1f} s after the GCS was killed")
        a.close()
        b.close()
    finally:
        (server2 or server).close(destroy=True)
