"""Trainers without Ray (issue 30): a real local Ray pool server serves its lease API;
trainers lease over HTTP (``RemoteVectorEnv.from_pool(name, url=...)``) and step the
actors over TCP with the lease's own key. Real parts throughout: the pool server, its
actors, aiohttp, SIGKILL of an actor, a subprocess whose ``import ray`` fails.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import textwrap
import time
import urllib.request
from collections.abc import Iterator
from multiprocessing import AuthenticationError
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import ray
from gymnasium.vector import AutoresetMode
from prometheus_client.parser import text_string_to_metric_families
from ray_checks import wait_for

from remote_env import RemoteVectorEnv, spec
from remote_env.driver.http_lease import LeaseApi, LeaseApiError
from remote_env.pool import lease_actor
from remote_env.pool.server import PoolServer
from remote_env.wire import channel, protocol, relay

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
TOKEN = "integration-lease-token"
pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def pool() -> Iterator[PoolServer]:
    """16 CartPole envs, 4 per actor, on a local Ray; the lease API on a free port."""
    ray.shutdown()
    ray.init(address="local", num_cpus=2, include_dashboard=False)
    doc = {"apiVersion": "envpool.dev/v1alpha1", "kind": "EnvPool",
           "metadata": {"name": "httppool"},
           "spec": {"env": {"id": "CartPole-v1"}, "replicas": 16, "envsPerActor": 4,
                    "faultTolerance": {"restartBackoffSeconds": 0, "stepTimeoutSeconds": 10,
                                       "maxRestarts": 3}}}
    server = PoolServer(spec.parse_manifest(doc), http_port=0, health_interval_s=0.3,
                        lease_host="127.0.0.1", lease_port=0, lease_token=TOKEN.encode())
    try:
        server.start_background()
        server.wait_ready(120)
        assert server.lease_url is not None
        yield server
    finally:
        server.close(destroy=True)
        ray.shutdown()


def _attach(server: PoolServer, num_envs: int, **kwargs: Any) -> RemoteVectorEnv:
    return RemoteVectorEnv.from_pool("httppool", url=server.lease_url, token=TOKEN,
                                     num_envs=num_envs, **kwargs)


def _free(server: PoolServer, n: int) -> None:
    wait_for(lambda: server.status()["freeEnvs"] == n, 30, f"{n} free envs")


def test_a_trainer_leases_8_of_16_over_http_and_steps_as_sync_vector_env(
        pool: PoolServer) -> None:
    seeds = list(range(100, 108))
    rng = np.random.default_rng(0)
    actions = rng.integers(0, 2, size=(300, 8))
    ref = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1")] * 8)
    envs = _attach(pool, 8)
    try:
        assert envs.num_envs == 8 and len(envs.lease.slots) == 2
        wait_for(lambda: pool.status()["leasedEnvs"] == 8, 10, "8 envs leased")
        obs, _ = envs.reset(seed=seeds)
        assert all(h.channel and h.tcp and not h.shared for h in envs.hosts())
        want, _ = ref.reset(seed=seeds)
        np.testing.assert_array_equal(obs, want)
        for a in actions:  # 300 steps: every env terminates and autoresets at least once
            got = envs.step(a)
            exp = ref.step(a)
            for g, e in zip(got[:4], exp[:4], strict=True):
                np.testing.assert_array_equal(g, e)
    finally:
        envs.close()
        ref.close()
    _free(pool, 16)  # released on close


def _sigkill_actor(pool: PoolServer, actor_id: Any) -> Any:
    """SIGKILL the env actor ``actor_id`` of the pool's layout; return its id."""
    layout = lease_actor.PoolLayout.read(
        ray.get(lease_actor.get_lease_actor(pool.ray_namespace).layout.remote()))
    name = next(s.actor_name for s in layout.slots if s.actor_id == actor_id)
    pid = ray.get(ray.get_actor(name, namespace=pool.ray_namespace).ping.remote())
    os.kill(pid, signal.SIGKILL)
    return actor_id


def test_a_sigkilled_actor_gives_a_truncated_step_then_its_replacement(
        pool: PoolServer) -> None:
    envs = _attach(pool, 8)
    try:
        envs.reset(seed=0)
        envs.step(np.zeros(8, dtype=np.int64))
        victim = envs.hosts()[1]
        old_actor = _sigkill_actor(pool, victim.handle.actor_id)
        _, _, term, trunc, info = envs.step(np.zeros(8, dtype=np.int64))
        dead = victim.env_ids
        assert trunc[dead].all() and not term[dead].any()
        assert all(str(info["error"][i]).startswith("actor_died") for i in dead), info
        assert not trunc[envs.hosts()[0].env_ids].any()
        # the next steps go to the replacement the pool server made (no error)
        deadline = time.monotonic() + 60
        while True:
            _, _, _, trunc, info = envs.step(np.zeros(8, dtype=np.int64))
            if envs.hosts()[1].handle.actor_id != old_actor and "error" not in info:
                break
            assert time.monotonic() < deadline, "no replacement within 60 s"
        assert envs.hosts()[1].handle.slot == victim.handle.slot
        assert envs.hosts()[1].tcp
        for _ in range(5):
            _, _, _, trunc, info = envs.step(np.zeros(8, dtype=np.int64))
            assert "error" not in info
        assert envs.restart_counts.tolist() == [0] * 4 + [1] * 4
    finally:
        envs.close()
    _free(pool, 16)


def test_bad_input_is_refused_clearly_and_disturbs_no_one(pool: PoolServer) -> None:
    assert pool.lease_url is not None
    holder = _attach(pool, 8)  # a trainer stepping all along
    try:
        holder.reset(seed=1)
        # a wrong token
        with pytest.raises(LeaseApiError, match="HTTP 401: a wrong token") as exc:
            RemoteVectorEnv.from_pool("httppool", url=pool.lease_url, token="nope",
                                      num_envs=4)
        # more than the pool has free: at once, with how many are free and asked
        start = time.monotonic()
        with pytest.raises(LeaseApiError) as exc:
            _attach(pool, 12)
        assert time.monotonic() - start < 5
        assert exc.value.status == 409 and exc.value.retryable
        assert (exc.value.free_envs, exc.value.asked_envs) == (8, 12)
        # the pool server exports the attach latency by outcome
        with urllib.request.urlopen(pool.url + "/metrics", timeout=10) as resp:
            samples = {(s.name, s.labels.get("outcome")): s.value
                       for fam in text_string_to_metric_families(resp.read().decode())
                       for s in fam.samples if s.name.startswith("envpool_lease_attach")}
        assert samples[("envpool_lease_attach_seconds_count", "exhausted")] >= 1
        assert samples[("envpool_lease_attach_seconds_count", "granted")] >= 2
        # a malformed body, a client of another wire protocol version
        api = LeaseApi(pool.lease_url, TOKEN)
        with pytest.raises(LeaseApiError, match="field 'num_envs'") as exc:
            api.post("lease", {"num_envs": "4"}, 10)
        assert exc.value.status == 400
        with pytest.raises(LeaseApiError, match="version 3, the client 2") as exc:
            api.post("lease", {"num_envs": 4, "protocol": 2}, 10)
        # a stale epoch: a released lease's key opens nothing once the actors are leased again
        old = api.post("lease", {"num_envs": 8}, 10)
        api.post("release", {"lease_id": old["lease_id"]}, 10)
        newer = _attach(pool, 8)
        try:
            newer.reset(seed=2)
            for actor in old["actors"]:
                with pytest.raises(AuthenticationError, match="another lease is newer"):
                    channel.Channel(actor["address"], bytes.fromhex(actor["key"]))
            # a peer speaking wire version 2 to an actor's port is refused with the reason
            host, port = channel.parse_tcp(old["actors"][0]["address"]) or ("", 0)
            with socket.create_connection((host, port), timeout=5) as sock:
                sock.recv(protocol.HELLO.size + protocol.NONCE)
                sock.sendall(protocol.HELLO.pack(protocol.MAGIC, 2))
                refusal = sock.recv(1024)
            assert refusal[0] == protocol.REFUSED
            (n,) = struct.unpack("<H", refusal[1:3])
            assert b"version 2 is not spoken here" in refusal[3:3 + n]
            newer.step(np.zeros(8, dtype=np.int64))  # the newer lease steps on
        finally:
            newer.close()
        # nothing disturbed the trainer stepping all along
        for _ in range(3):
            _, _, _, _, info = holder.step(np.zeros(8, dtype=np.int64))
            assert "error" not in info
    finally:
        holder.close()
    _free(pool, 16)


def _relayed(server: PoolServer, outcome: str = "relayed") -> float:
    return server.registry.get_sample_value(
        "envpool_relay_connections_total", {"pool": "httppool", "outcome": outcome}) or 0.0


def test_a_trainer_through_the_relay_steps_as_one_stepping_directly(pool: PoolServer) -> None:
    """Two trainers of 8 envs each, one through the pool server's relay and one to the
    pod addresses, with the same seeds and actions: the same steps, step for step."""
    seeds = list(range(200, 208))
    actions = np.random.default_rng(1).integers(0, 2, size=(300, 8))
    before = _relayed(pool)
    relayed = _attach(pool, 8, relay=True)
    direct = _attach(pool, 8, relay=False)
    try:
        assert set(relayed.lease.slots).isdisjoint(direct.lease.slots)
        got_obs, _ = relayed.reset(seed=seeds)
        want_obs, _ = direct.reset(seed=seeds)
        np.testing.assert_array_equal(got_obs, want_obs)
        assert all(h.channel and h.tcp and not h.shared for h in relayed.hosts())
        # each of the relayed trainer's actors: its control channel and its data channel
        assert _relayed(pool) - before == 2 * len(relayed.hosts())
        for a in actions:  # 300 steps: every env terminates and autoresets at least once
            got = relayed.step(a)
            want = direct.step(a)
            for g, w in zip(got[:4], want[:4], strict=True):
                np.testing.assert_array_equal(g, w)
            assert "error" not in got[4]
        bytes_out = pool.registry.get_sample_value(
            "envpool_relay_bytes_total", {"pool": "httppool", "direction": "to_trainer"})
        assert bytes_out is not None and bytes_out > 300 * 8 * 4 * 4  # the observations
    finally:
        relayed.close()
        direct.close()
    _free(pool, 16)


def test_the_relay_refuses_what_is_not_a_current_actor_of_a_held_lease(
        pool: PoolServer) -> None:
    assert pool.lease_url is not None
    holder = _attach(pool, 8, relay=True)  # a relayed trainer stepping all along
    api = LeaseApi(pool.lease_url, TOKEN)
    try:
        holder.reset(seed=1)
        lease = api.post("lease", {"num_envs": 4}, 10)
        actor = lease["actors"][0]
        target = relay.RelayTarget(lease["lease_id"], actor["slot"], actor["actor_id"],
                                   lease["epoch"])
        key = bytes.fromhex(actor["key"])
        # through the relay, the actor is this lease's as it is directly
        chan = channel.Channel(api.dialer(target), key)
        described = channel.get(chan.call(("fenced", lease["epoch"], "describe")), None)
        assert described["num_envs"] == actor["num_envs"]
        chan.close()
        with pytest.raises(relay.RelayRefusedError, match="HTTP 401: a wrong token"):
            channel.Channel(LeaseApi(pool.lease_url, "nope").dialer(target), key)
        # an actor of the pool, but another trainer's: no relay to it
        other = holder.lease.slots[0]
        with pytest.raises(relay.RelayRefusedError,
                           match=f"slot {other} is not an actor of this lease") as exc:
            channel.Channel(api.dialer(dataclasses.replace(target, slot=other)), key)
        assert exc.value.status == 404
        with pytest.raises(relay.RelayRefusedError, match="is not the lease's") as exc:
            channel.Channel(api.dialer(dataclasses.replace(target, epoch=target.epoch - 1)),
                            key)
        assert exc.value.status == 409
        # a stale epoch after release: the lease is gone, nothing is relayed for it
        api.post("release", {"lease_id": lease["lease_id"]}, 10)
        with pytest.raises(relay.RelayRefusedError, match="released or expired") as exc:
            channel.Channel(api.dialer(target), key)
        assert exc.value.status == 404
        assert _relayed(pool, "refused") >= 4
        # nothing disturbed the relayed trainer stepping all along
        for _ in range(3):
            _, _, _, _, info = holder.step(np.zeros(8, dtype=np.int64))
            assert "error" not in info
    finally:
        holder.close()
    _free(pool, 16)


def test_a_relayed_trainers_killed_actor_gives_a_truncated_step_then_its_replacement(
        pool: PoolServer) -> None:
    envs = _attach(pool, 8, relay=True)
    try:
        envs.reset(seed=0)
        envs.step(np.zeros(8, dtype=np.int64))
        victim = envs.hosts()[1]
        old_actor = victim.handle.actor_id
        assert not isinstance(victim.handle.via, str)  # through the relay
        layout = lease_actor.PoolLayout.read(
            ray.get(lease_actor.get_lease_actor(pool.ray_namespace).layout.remote()))
        name = next(s.actor_name for s in layout.slots if s.actor_id == old_actor)
        pid = ray.get(ray.get_actor(name, namespace=pool.ray_namespace).ping.remote())
        os.kill(pid, signal.SIGKILL)
        _, _, term, trunc, info = envs.step(np.zeros(8, dtype=np.int64))
        dead = victim.env_ids
        assert trunc[dead].all() and not term[dead].any()
        assert all(str(info["error"][i]).startswith("actor_died") for i in dead), info
        assert not trunc[envs.hosts()[0].env_ids].any()
        deadline = time.monotonic() + 60
        while True:
            _, _, _, trunc, info = envs.step(np.zeros(8, dtype=np.int64))
            if envs.hosts()[1].handle.actor_id != old_actor and "error" not in info:
                break
            assert time.monotonic() < deadline, "no replacement within 60 s"
        # the replacement is reached through the relay too
        assert not isinstance(envs.hosts()[1].handle.via, str)
        for _ in range(5):
            _, _, _, trunc, info = envs.step(np.zeros(8, dtype=np.int64))
            assert "error" not in info
        assert envs.restart_counts.tolist() == [0] * 4 + [1] * 4
    finally:
        envs.close()
    _free(pool, 16)


def _steps_as_sync_vector_env(envs: RemoteVectorEnv, mode: AutoresetMode, seed: int) -> int:
    """Step ``envs`` and a local SyncVectorEnv in ``mode`` side by side with the same seeds
    and actions; the episode ends compared."""
    n = envs.num_envs
    local = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1")] * n,
                                     autoreset_mode=mode)
    seeds = list(range(seed, seed + n))
    actions = np.random.default_rng(seed).integers(0, 2, size=(200, n))
    try:
        got, _ = envs.reset(seed=seeds)
        want, _ = local.reset(seed=seeds)
        np.testing.assert_array_equal(got, want)
        ends = 0
        for t, a in enumerate(actions):
            got_step, want_step = envs.step(a), local.step(a)
            for name, g, w in zip(("obs", "reward", "terminated", "truncated"),
                                  got_step[:4], want_step[:4], strict=True):
                np.testing.assert_array_equal(g, w, err_msg=f"{mode.value} step {t}: {name}")
            assert "error" not in got_step[4]
            if mode is AutoresetMode.SAME_STEP:  # the last observation of an ended episode
                final = want_step[4].get("_final_obs", np.zeros(n, bool))
                np.testing.assert_array_equal(got_step[4].get("_final_obs", np.zeros(n, bool)),
                                              final, err_msg=f"step {t}: _final_obs")
                for e in np.flatnonzero(final):
                    np.testing.assert_array_equal(got_step[4]["final_obs"][e],
                                                  want_step[4]["final_obs"][e])
            done = want_step[2] | want_step[3]
            ends += int(done.sum())
            if mode is AutoresetMode.DISABLED and done.any():  # the trainer resets them
                got, _ = envs.reset(options={"reset_mask": done})
                want, _ = local.reset(options={"reset_mask": done})
                np.testing.assert_array_equal(got, want, err_msg=f"step {t}: masked reset")
        return ends
    finally:
        local.close()


@pytest.mark.parametrize("relayed", [False, True], ids=["direct", "relay"])
@pytest.mark.parametrize("mode", [AutoresetMode.SAME_STEP, AutoresetMode.DISABLED],
                         ids=lambda m: m.value)
def test_a_lease_over_http_serves_the_autoreset_mode_it_asks_for(
        pool: PoolServer, mode: AutoresetMode, relayed: bool) -> None:
    """The pool's spec says NextStep; a Ray-free trainer asks for another: its actors
    serve that lease in it, over TCP and through the relay alike, step for step as
    gymnasium's; the next lease that asks for none gets the spec's back."""
    before = _relayed(pool)
    envs = _attach(pool, 8, autoreset_mode=mode.value, relay=relayed)
    try:
        assert envs.autoreset_mode is mode and envs.metadata["autoreset_mode"] is mode
        # the switch made a reset due (gymnasium's order: reset, then step)
        with pytest.raises(gym.error.ResetNeeded):
            envs.step(np.zeros(8, dtype=np.int64))
        ends = _steps_as_sync_vector_env(envs, mode, seed=300)
        assert ends >= 8, f"{mode.value}: only {ends} episode ends compared"
        assert all(h.channel and h.tcp and not h.shared for h in envs.hosts())
        assert (_relayed(pool) > before) is relayed
        ids = sorted(h.handle.actor_id for h in envs.hosts())
    finally:
        envs.close()
    _free(pool, 16)
    # the same warm actors, leased again asking for nothing: the spec's NextStep
    api = LeaseApi(str(pool.lease_url), TOKEN)
    answer = api.post("lease", {"num_envs": 16}, 10)
    api.post("release", {"lease_id": answer["lease_id"]}, 10)
    assert answer["autoreset_mode"] == "NextStep"
    assert set(ids) <= {a["actor_id"] for a in answer["actors"]}
    again = _attach(pool, 8)
    try:
        assert again.autoreset_mode is AutoresetMode.NEXT_STEP
        assert _steps_as_sync_vector_env(again, AutoresetMode.NEXT_STEP, seed=400) >= 8
    finally:
        again.close()
    _free(pool, 16)


def test_a_replacement_serves_the_lease_in_its_asked_mode(pool: PoolServer) -> None:
    """The pool server builds a replacement in the spec's mode: the trainer's replace
    request names the lease's, so the new actor serves it too."""
    envs = _attach(pool, 8, autoreset_mode="SameStep", relay=True)
    try:
        envs.reset(seed=0)
        victim = envs.hosts()[1]
        old_actor = _sigkill_actor(pool, victim.handle.actor_id)
        deadline = time.monotonic() + 60
        while envs.hosts()[1].handle.actor_id == old_actor:
            envs.step(np.zeros(8, dtype=np.int64))
            assert time.monotonic() < deadline, "no replacement within 60 s"
        ends = _steps_as_sync_vector_env(envs, AutoresetMode.SAME_STEP, seed=500)
        assert ends >= 8
    finally:
        envs.close()
    _free(pool, 16)


def test_a_bad_autoreset_mode_is_refused_with_400_and_nothing_leased(pool: PoolServer) -> None:
    api = LeaseApi(str(pool.lease_url), TOKEN)
    for bad, says in [("SAME_STEP", "got 'SAME_STEP'"), ("sometimes", "got 'sometimes'"),
                      (3, "must be str or null, got int 3")]:
        with pytest.raises(LeaseApiError, match="field 'autoreset_mode'") as exc:
            api.post("lease", {"num_envs": 4, "autoreset_mode": bad}, 10)
        assert exc.value.status == 400 and exc.value.body["field"] == "autoreset_mode"
        assert says in str(exc.value)
        if isinstance(bad, str):
            assert "one of 'NextStep', 'SameStep', 'Disabled'" in str(exc.value)
        assert pool.status()["freeEnvs"] == 16  # nothing leased
    # the client refuses it before it asks at all
    with pytest.raises(ValueError, match=r"autoreset_mode='Sometimes'.*not a gymnasium "
                                         r"AutoresetMode.*'NextStep', 'SameStep', 'Disabled'"):
        _attach(pool, 4, autoreset_mode="Sometimes")
    assert pool.status()["freeEnvs"] == 16
    # asking for the spec's own mode is the default path
    envs = _attach(pool, 4, autoreset_mode=AutoresetMode.NEXT_STEP)
    try:
        assert envs.autoreset_mode is AutoresetMode.NEXT_STEP
    finally:
        envs.close()
    _free(pool, 16)


RAY_FREE_TRAINER = textwrap.dedent("""
    import importlib.abc, importlib.util, json, sys

    installed = importlib.util.find_spec("ray") is not None

    class NoRay(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name == "ray" or name.startswith("ray."):
                raise ImportError(f"ray is blocked in this trainer (imported: {name})")
            return None

    sys.meta_path.insert(0, NoRay())
    import numpy as np
    from remote_env import RemoteVectorEnv

    relay = {"auto": "auto", "relay": True}[sys.argv[3] if len(sys.argv) > 3 else "auto"]
    envs = RemoteVectorEnv.from_pool("httppool", url=sys.argv[1], token_file=sys.argv[2],
                                     num_envs=4, relay=relay)
    obs, _ = envs.reset(seed=7)
    total = 0.0
    for _ in range(50):
        obs, rew, term, trunc, info = envs.step(np.ones(4, dtype=np.int64))
        total += float(rew.sum())
    envs.close()
    print(json.dumps({"ray": "ray" in sys.modules, "ray_installed": installed,
                      "reward": total, "shape": list(obs.shape)}))
""")


@pytest.mark.parametrize("route", ["auto", "relay"])
def test_a_trainer_runs_with_ray_blocked(pool: PoolServer, tmp_path: Path, route: str) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    relayed = _relayed(pool)
    proc = subprocess.run([sys.executable, "-c", RAY_FREE_TRAINER, str(pool.lease_url),
                           str(token_file), route], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["ray"] is False and out["shape"] == [4, 4] and out["reward"] > 0
    assert out["ray_installed"] is True  # blocked, not absent: the next test has it absent
    # "auto" reaches the actors here directly; "relay" through the pool server
    assert (_relayed(pool) > relayed) is (route == "relay")
    _free(pool, 16)


#: What a Ray-free trainer image installs besides envpool-k8s itself (README: "A
#: trainer without Ray"; pyproject's ``client`` extra), by import name, and numpy's
#: vendored libraries.
CLIENT_IMPORTS = ("gymnasium", "numpy", "numpy.libs", "prometheus_client", "cloudpickle",
                  "yaml", "_yaml", "farama_notifications", "typing_extensions.py")


def test_a_trainer_runs_in_a_venv_without_ray(pool: PoolServer, tmp_path: Path) -> None:
    """A fresh venv holding only the client's dependencies (linked from this venv's
    site-packages, so no network) and this tree: no ray, pettingzoo, psutil, aiohttp."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True,
                   timeout=120)
    site = Path(np.__file__).resolve().parents[1]
    deps = tmp_path / "deps"
    deps.mkdir()
    for name in CLIENT_IMPORTS:
        assert (site / name).exists(), name
        (deps / name).symlink_to(site / name)
    [venv_site] = (venv / "lib").glob("python3*/site-packages")
    (venv_site / "envpool_client.pth").write_text(f"{deps}\n{ROOT}\n")
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    clean = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    proc = subprocess.run([str(venv / "bin" / "python"), "-c", RAY_FREE_TRAINER,
                           str(pool.lease_url), str(token_file)], capture_output=True,
                          text=True, timeout=120, env=clean, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["ray_installed"] is False and out["ray"] is False
    assert out["shape"] == [4, 4] and out["reward"] > 0
    _free(pool, 16)
