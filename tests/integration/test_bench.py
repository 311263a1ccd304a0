"""The benchmark runs end to end at a tiny size and its JSON parses (not a timed test)."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from remote_env.cli import bench, bench_runners

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.usefixtures("ray_local")
@pytest.mark.parametrize("workload", bench.WORKLOADS)
def test_every_workload_runs_every_implementation(workload: str) -> None:
    report = bench.bench(workload, 2, 0.2, 1, list(bench.IMPLS), cpus=2)
    report = json.loads(json.dumps(report))
    assert report["workload"] == workload and report["num_envs"] == 2
    expected = set(bench.IMPLS) - {"limit"}
    if workload != "sleep1ms":  # the only workload whose env also has astep/areset
        expected.discard("remote_env_async")
        assert "no awaitable" in report["config"]["skipped"]["remote_env_async"]
    assert set(report["results"]) == expected, report["config"]["skipped"]
    assert all(v > 0 for v in report["results"].values())
    # the limit is measured (2 processes stepping 1 env each), and so is its CPU
    assert report["limit"] > 0 and len(report["config"]["samples"]["limit"]) == 1
    assert set(report["cpu_us_per_step"]) == expected | {"limit"}
    assert all(v > 0 for v in report["cpu_us_per_step"].values()), report["cpu_us_per_step"]
    assert report["yardsticks"]["in_process_sync"] == report["results"]["gymnasium_sync"]
    text = bench.table(report)
    assert "x gymnasium_async" in text and "remote_env" in text and "us CPU/step" in text


def test_cli_json_shape() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "remote_env.cli", "bench", "--workload", "sleep1ms",
         "--num-envs", "2", "--seconds", "0.2", "--reps", "1", "--json",
         "--impl", "remote_env", "gymnasium_sync"],
        capture_output=True, text=True, timeout=300, cwd=REPO, check=True,
    )
    report = json.loads(out.stdout)
    assert set(report) >= {"workload", "num_envs", "seconds", "cpus", "results", "limit", "config",
                           "cpu_us_per_step", "yardsticks"}
    assert set(report["results"]) == {"remote_env", "gymnasium_sync"}
    assert report["limit"] is None  # not asked for: --impl without limit
    assert report["yardsticks"]["envs_x_1000"] == 2000.0  # the old sleep1ms yardstick
    # progress on stderr: the plan with an estimate, then each run and the time left
    assert "2 implementations x 1 reps x 0.2 s: about " in out.stderr, out.stderr
    assert "rep 1/1 gymnasium_sync ... (" in out.stderr
    assert "rep 1/1 remote_env: " in out.stderr and " left)" in out.stderr


def test_limit_awaits_sleep1ms_and_splits_envs_over_processes() -> None:
    from remote_env.cli import bench_limit

    assert bench_limit.split(5, 2) == [3, 2] and bench_limit.split(1, 2) == [1]
    sps, cpu_us, driver_us = bench_limit.measure("sleep1ms", 8, 2, 0.5, awaited=True)
    # 8 envs awaiting 1 ms each: one round takes >= 1 ms, so at most ~8,000 steps/s;
    # awaited (not 8 ms of sleeps in a row) it is well above SyncVectorEnv's 1,000
    assert 1_500 < sps < 8_000, sps
    assert 0 < cpu_us < 1_000 and driver_us == 0  # no driver: each process steps its own


def test_rss_and_latency_reports() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "remote_env.cli", "bench", "--json", "--rss", "64",
         "--latency", "5"],
        capture_output=True, text=True, timeout=300, cwd=REPO, check=True,
    )
    rss, lat = (json.loads(line) for line in out.stdout.splitlines())
    assert rss["num_envs"] == 64 and rss["rss_per_env_kib"] > 0
    assert lat["batch_wait_ms"] == 5.0 and lat["p99_ms"] >= lat["p50_ms"] > 0


# Beside RLlib's leftover actors (issue 35) Sync measured 0.57 of its figure alone and
# the limit fell below remote_env's. Alone, Sync's reps agree far better: 166,209 and
# 172,117 in the quiet reps of README round 5 (3 s), 140,748-178,083 in 1 s runs on a
# partly busy VM (0.88-1.12 of their mean). 0.7 passes those and fails the leak.
SYNC_TOLERANCE = 0.7
# Others' load (in cores of 2) beyond which figures say more about it than about the
# bench: with a runnable queue of 14 from other work, the limit over Sync ranged
# 0.78-2.35 in six back-to-back 1 s pairs with nothing of the bench's own left over
# (with kernel.sched_autogroup_enabled=1 the limit's two processes share one session's
# slice against the others', as Sync's one does).
BUSY_CORES = 0.5
# RLlib starts an actor per env, and what a leaky teardown leaves is as large: with 8,
# the old bench left 6 actors that exited within a few seconds and Sync after them
# measured 0.94 of Sync alone; with 32 it left 32 that took 12.9 s to go (busy VM).
# 16 actors start in parallel (num_cpus=0) in about the time the rest of the set takes.
N = 16


def _sync_alone() -> dict[str, Any]:
    return bench.bench("cartpole", N, 1.0, 1, ["gymnasium_sync"], cpus=2)


@pytest.mark.usefixtures("ray_local")
def test_default_set_measures_each_implementation_alone() -> None:
    why = bench_runners.rllib_available()
    if why:
        pytest.skip(f"RLlib's RemoteBaseEnv is part of the default set: {why}")
    before = _sync_alone()
    # the default set, in its order: RLlib's teardown right before Sync and the limit
    report = bench.bench("cartpole", N, 1.0, 1, list(bench.IMPLS), cpus=2)
    after = _sync_alone()
    runs: dict[str, list[dict[str, Any]]] = report["beside"]
    # checked, not assumed: nothing of the bench's own ran beside any run, RLlib's
    # actors included (the bench waited for them when they were slow to go)
    assert set(runs) == set(bench.IMPLS) - {"remote_env_async"}, report["config"]["skipped"]
    assert all(r["leftover"] == {} for rs in runs.values() for r in rs), runs
    res = report["results"]
    sync_alone = statistics.mean([before["results"]["gymnasium_sync"],
                                  after["results"]["gymnasium_sync"]])
    busy = max(r["busy_cores"] for rep in (before, report, after)
               for r in (*rep["beside"]["gymnasium_sync"], *rep["beside"].get("limit", [])))
    figures = (f"Sync {res['gymnasium_sync']:,.0f} in the set, {sync_alone:,.0f} alone; limit "
               f"{report['limit']:,.0f}; results {res}; disturbed {report['disturbed']}")
    if busy > BUSY_CORES:
        pytest.skip(f"the machine's other load reached {busy:.1f} cores before a compared "
                    f"run: the figures would measure it, not the bench ({figures})")
    assert res["gymnasium_sync"] >= SYNC_TOLERANCE * sync_alone, figures
    assert report["limit"] >= max(res.values()), figures
    assert "limit" not in report["disturbed"], figures


def test_json_alone_on_stdout_one_object_a_line() -> None:
    # RLlib's actors step terminated CartPoles: gymnasium warns in them and Ray prints
    # that in the driver. Before issue 35 it came after the JSON on stdout.
    args = ["--num-envs", "2", "3", "--seconds", "0.2", "--reps", "1", "--json",
            "--impl", "gymnasium_sync", "limit"]
    if bench_runners.rllib_available() is None:
        args += ["rllib_remote_base_env"]
    out = subprocess.run([sys.executable, "-m", "remote_env.cli", "bench", *args],
                         capture_output=True, text=True, timeout=300, cwd=REPO, check=True)
    reports = [json.loads(line) for line in out.stdout.splitlines()]
    assert [r["num_envs"] for r in reports] == [2, 3], out.stdout
    assert all(r["beside"]["gymnasium_sync"] for r in reports)
