"""Rolling env updates in place (issue 32) on a real local Ray.

A pool of 8 envs, a trainer leasing 4 of them and stepping all along, the spec's env
changed: the free actors are rebuilt with at most ``maxUnavailable`` envs out of
service at any time (sampled), the trainer never sees an error, its actors are
rebuilt only once it releases the lease, and ``/status`` (``status.pool``) shows the
revision and the updated/outdated envs. The envs count their constructions in a
file named by their kwargs, so the new spec's envs land in a second file.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import ray
from pool_envs import constructions
from ray_checks import wait_for

from remote_env import RemoteVectorEnv, spec
from remote_env.pool import snapshot as snapshot_mod
from remote_env.pool.server import PoolServer

attach = RemoteVectorEnv.from_pool  # the pool's trainer entry point

HERE = Path(__file__).resolve().parent
pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def ray_with_pool_envs() -> Iterator[None]:
    """A local Ray whose workers import ``pool_envs`` (the env actors need it)."""
    ray.shutdown()  # another module's Ray may lack the PYTHONPATH
    old_path = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(HERE), old_path) if p)
    try:
        ray.init(address="local", num_cpus=2, include_dashboard=False)
        yield
    finally:
        ray.shutdown()
        if old_path is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = old_path


def _doc(name: str, counter: Path, *, per_actor: int, max_unavailable: int | str
         ) -> dict[str, Any]:
    return {
        "apiVersion": "envpool.dev/v1alpha1",
        "kind": "EnvPool",
        "metadata": {"name": name},
        "spec": {
            "env": {"entrypoint": "pool_envs:make_counted_cartpole",
                    "kwargs": {"counter_file": str(counter)}},
            "replicas": 8,
            "envsPerActor": per_actor,
            "updateStrategy": {"maxUnavailable": max_unavailable},
            "faultTolerance": {"restartBackoffSeconds": 0, "stepTimeoutSeconds": 10},
        },
    }


class Sampler:
    """Polls ``/status`` on a thread: the most envs out of service, and each sample."""

    def __init__(self, server: PoolServer, period_s: float = 0.02) -> None:
        self.server = server
        self.period_s = period_s
        self.samples: list[dict[str, Any]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        while not self._stop.is_set():
            st = self.server.status()
            self.samples.append({
                "t": time.monotonic(),
                "unavailable": st["desiredEnvs"] - st["readyEnvs"],
                "outdated": st["outdatedEnvs"], "updated": st["updatedEnvs"],
                "actorIds": {s["actorId"] for s in st["slots"]},
            })
            self._stop.wait(self.period_s)

    @property
    def max_unavailable(self) -> int:
        return max(s["unavailable"] for s in self.samples)


class Trainer:
    """Steps leased envs on a thread until stopped; counts steps and errors."""

    def __init__(self, envs: Any) -> None:
        self.envs = envs
        self.steps = 0
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        actions = np.ones(self.envs.num_envs, dtype=np.int64)
        try:
            while not self._stop.is_set():
                info = self.envs.step(actions)[4]
                bad = info.get("_error", np.zeros(self.envs.num_envs, dtype=bool))
                if bad.any():
                    self.errors.append(str(info.get("error")))
                self.steps += 1
        except Exception as exc:  # a step that raised cut the trainer off
            self.errors.append(f"{type(exc).__name__}: {exc}")

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)


def _metric(server: PoolServer, name: str) -> float | None:
    return server.registry.get_sample_value(name, {"pool": server.spec.name})


def _destroy(server: PoolServer) -> None:
    ns = server.ray_namespace
    server.close(destroy=True)
    wait_for(lambda: not [a for a in ray.util.list_named_actors(all_namespaces=True)
                          if a["namespace"] == ns], 30, f"no actors left in {ns}")


def test_env_change_rolls_free_actors_first_and_leased_ones_after_release(
    ray_with_pool_envs: None, tmp_path: Path
) -> None:
    old_counter, new_counter = tmp_path / "old", tmp_path / "new"
    doc = _doc("roll", old_counter, per_actor=2, max_unavailable=2)  # one actor at a time
    server = PoolServer(spec.parse_manifest(doc), http_port=0, health_interval_s=0.3)
    server.start_background()
    trainer = None
    try:
        first = server.wait_ready(120)
        old_revision = first["revision"]
        assert (first["updatedEnvs"], first["outdatedEnvs"]) == (8, 0)
        envs = attach("roll", num_envs=4, trainer="stepper")
        held = {h._actor_id.hex() for h in envs.actors}
        envs.reset(seed=0)
        trainer = Trainer(envs)
        wait_for(lambda: trainer.steps >= 20, 30, "trainer stepping")

        doc["spec"]["env"]["kwargs"]["counter_file"] = str(new_counter)
        new_spec = spec.parse_manifest(doc)
        assert new_spec.revision() != old_revision
        with Sampler(server) as sampler:
            t0 = time.monotonic()
            server.apply_spec(new_spec)
            st = wait_for(lambda: (s := server.status())["updatedEnvs"] == 4
                          and s["readyEnvs"] == 8 and s, 120, "free actors rebuilt")
            free_done_s = time.monotonic() - t0
            assert st["revision"] == new_spec.revision()
            assert (st["outdatedEnvs"], st["outdatedLeasedEnvs"], st["leasedEnvs"]) == (4, 4, 4)
            # the trainer's actors are the old ones, untouched, and it goes on stepping
            steps_then = trainer.steps
            for _ in range(5):  # several supervision ticks: still not taken
                time.sleep(server.health_interval_s)
                assert held <= {s["actorId"] for s in server.status()["slots"]}
            wait_for(lambda: trainer.steps > steps_then + 20, 30, "trainer still stepping")
            assert constructions(str(new_counter)) == 4
            assert _metric(server, "envpool_pool_outdated_envs") == 4
            report = server.pool_report()  # what status.pool gets
            assert set(snapshot_mod.POOL_REPORT_KEYS) <= set(report)
            assert (report["revision"], report["updatedEnvs"], report["outdatedEnvs"]) == (
                new_spec.revision(), 4, 4)

            trainer.stop()
            assert trainer.errors == []
            assert list(envs.restart_counts) == [0, 0, 0, 0]
            steps = trainer.steps
            envs.close()  # the lease ends: now its actors are rebuilt
            t1 = time.monotonic()
            st = wait_for(lambda: (s := server.status())["updatedEnvs"] == 8
                          and s["readyEnvs"] == 8 and s, 120, "leased actors rebuilt")
            leased_done_s = time.monotonic() - t1
        assert st["outdatedEnvs"] == 0 and not held & {s["actorId"] for s in st["slots"]}
        assert {s["revision"] for s in st["slots"]} == {new_spec.revision()}
        assert _metric(server, "envpool_pool_outdated_envs") == 0
        assert constructions(str(new_counter)) == 8
        assert constructions(str(old_counter)) == 8  # no old env was re-created
        assert st["restarts"] == 0
        # the held actors were there in every sample until the lease ended
        before_release = [s for s in sampler.samples if s["t"] < t1]
        assert all(held <= s["actorIds"] for s in before_release)
        assert sampler.max_unavailable <= 2, sampler.max_unavailable
        assert server.wait_ready(10)["revision"] == new_spec.revision()
        print(f"\nrolling update: {len(sampler.samples)} samples, most envs unavailable "
              f"{sampler.max_unavailable} (maxUnavailable 2); free actors rebuilt in "
              f"{free_done_s:.2f}s, leased ones {leased_done_s:.2f}s after release; "
              f"trainer {steps} steps, {len(trainer.errors)} errors")
        trainer = None
    finally:
        if trainer is not None:
            trainer.stop()
        _destroy(server)


def test_envs_per_actor_change_resizes_actors_within_max_unavailable(
    ray_with_pool_envs: None, tmp_path: Path
) -> None:
    counter = tmp_path / "constructed"
    doc = _doc("resize", counter, per_actor=2, max_unavailable=4)
    server = PoolServer(spec.parse_manifest(doc), http_port=-1, health_interval_s=0.3)
    server.start_background()
    try:
        server.wait_ready(120)
        doc["spec"]["envsPerActor"] = 4
        new_spec = spec.parse_manifest(doc)
        with Sampler(server) as sampler:
            server.apply_spec(new_spec)
            st = wait_for(lambda: (s := server.status())["revision"] == new_spec.revision()
                          and s["updatedEnvs"] == 8 and s["readyEnvs"] == 8
                          and s["actors"] == 2 and s, 120, "resized")
        assert sorted(s["envs"] for s in st["slots"]) == [4, 4]
        assert st["outdatedEnvs"] == 0 and st["revision"] == new_spec.revision()
        assert sampler.max_unavailable <= 4, sampler.max_unavailable
        assert constructions(str(counter)) == 16  # 8 old, 8 new
        print(f"\nresize 2 -> 4 envs per actor: most envs unavailable "
              f"{sampler.max_unavailable} (maxUnavailable 4)")
    finally:
        _destroy(server)


def test_a_restarted_pool_server_goes_on_rolling_and_keeps_the_leased_old_actors(
    ray_with_pool_envs: None, tmp_path: Path
) -> None:
    # The head's sidecar restarts with the new spec in its ConfigMap: each actor's
    # revision is in the registry's layout, so only outdated free actors are rebuilt
    # (before, a restarted server with a changed spec rebuilt every actor, leased too).
    old_counter, new_counter = tmp_path / "old", tmp_path / "new"
    doc = _doc("rollrestart", old_counter, per_actor=2, max_unavailable="50%")
    server = PoolServer(spec.parse_manifest(doc), http_port=-1, health_interval_s=0.3)
    server.start_background()
    envs = None
    try:
        server.wait_ready(120)
        envs = attach("rollrestart", num_envs=4, trainer="stays")
        held = {h._actor_id.hex() for h in envs.actors}
        envs.reset(seed=0)
        envs.step(np.ones(4, dtype=np.int64))
        server.close()  # not destroyed: the actors and the lease stay
        doc["spec"]["env"]["kwargs"]["counter_file"] = str(new_counter)
        new_spec = spec.parse_manifest(doc)
        server = PoolServer(new_spec, http_port=-1, health_interval_s=0.3)
        server.start_background()
        st = wait_for(lambda: (s := server.status())["updatedEnvs"] == 4
                      and s["readyEnvs"] == 8 and s, 120, "free actors rebuilt")
        assert (st["outdatedEnvs"], st["outdatedLeasedEnvs"]) == (4, 4)
        assert held <= {s["actorId"] for s in st["slots"]}
        for _ in range(10):
            info = envs.step(np.ones(4, dtype=np.int64))[4]
            assert not info.get("_error", np.zeros(4, dtype=bool)).any(), info.get("error")
        assert list(envs.restart_counts) == [0, 0, 0, 0]
        envs.close()
        envs = None
        st = wait_for(lambda: (s := server.status())["updatedEnvs"] == 8
                      and s["readyEnvs"] == 8 and s, 120, "leased actors rebuilt")
        assert not held & {s["actorId"] for s in st["slots"]}
        assert constructions(str(new_counter)) == 8 and constructions(str(old_counter)) == 8
    finally:
        if envs is not None:
            envs.close()
        _destroy(server)


def test_replace_after_grace_rebuilds_a_leased_actor_and_its_trainer_steps_on(
    ray_with_pool_envs: None, tmp_path: Path
) -> None:
    # the opt-in policy: leased actors go too, once leasedGraceSeconds passed; their
    # trainer sees each of those envs fail once (restarted, as after a fault) and goes on
    old_counter, new_counter = tmp_path / "old", tmp_path / "new"
    doc = _doc("rollgrace", old_counter, per_actor=2, max_unavailable=2)
    doc["spec"]["updateStrategy"].update(leasedActors="ReplaceAfterGrace", leasedGraceSeconds=3)
    server = PoolServer(spec.parse_manifest(doc), http_port=-1, health_interval_s=0.3)
    server.start_background()
    trainer = None
    try:
        server.wait_ready(120)
        envs = attach("rollgrace", num_envs=2, trainer="evicted")
        held = {h._actor_id.hex() for h in envs.actors}
        envs.reset(seed=0)
        trainer = Trainer(envs)
        wait_for(lambda: trainer.steps >= 20, 30, "trainer stepping")
        doc["spec"]["env"]["kwargs"]["counter_file"] = str(new_counter)
        new_spec = spec.parse_manifest(doc)
        t0 = time.monotonic()
        server.apply_spec(new_spec)
        st = wait_for(lambda: (s := server.status())["revision"] == new_spec.revision()
                      and s["updatedEnvs"] == 8 and s["readyEnvs"] == 8 and s, 120,
                      "every actor rebuilt, leased too")
        assert time.monotonic() - t0 >= 3  # not before the grace
        assert st["leasedEnvs"] == 2 and not held & {s["actorId"] for s in st["slots"]}
        steps_then = trainer.steps
        wait_for(lambda: trainer.steps > steps_then + 20, 60, "trainer stepping the new actor")
        trainer.stop()
        # the evicted envs failed once each and were restarted; the trainer was not cut off
        assert all("restart" in e or "actor" in e.lower() for e in trainer.errors), trainer.errors
        assert list(envs.restart_counts) == [1, 1]
        assert envs.get_attr("instance")  # a new env answers
        envs.close()
        assert constructions(str(new_counter)) == 8
        print(f"\nReplaceAfterGrace: leased actor rebuilt {time.monotonic() - t0:.1f}s after the "
              f"change (grace 3 s); trainer {trainer.steps} steps, {len(trainer.errors)} "
              f"error answers, restart counts {[int(n) for n in envs.restart_counts]}")
        trainer = None
    finally:
        if trainer is not None:
            trainer.stop()
        _destroy(server)
