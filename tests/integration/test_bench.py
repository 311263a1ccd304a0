"""The benchmark runs end to end at a tiny size and its JSON parses (not a timed test)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from remote_env.cli import bench

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.usefixtures("ray_local")
@pytest.mark.parametrize("workload", bench.WORKLOADS)
def test_every_workload_runs_every_implementation(workload: str) -> None:
    report = bench.bench(workload, 2, 0.2, 1, list(bench.IMPLS), cpus=2)
    report = json.loads(json.dumps(report))
    assert report["workload"] == workload and report["num_envs"] == 2
    expected = set(bench.IMPLS)
    if workload != "sleep1ms":  # the only workload whose env also has astep/areset
        expected.discard("remote_env_async")
        assert "no awaitable" in report["config"]["skipped"]["remote_env_async"]
    assert set(report["results"]) == expected, report["config"]["skipped"]
    assert all(v > 0 for v in report["results"].values())
    assert report["limit"] > 0
    text = bench.table(report)
    assert "x gymnasium_async" in text and "remote_env" in text


def test_cli_json_shape() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "remote_env.cli", "bench", "--workload", "sleep1ms",
         "--num-envs", "2", "--seconds", "0.2", "--reps", "1", "--json",
         "--impl", "remote_env", "gymnasium_sync"],
        capture_output=True, text=True, timeout=300, cwd=REPO, check=True,
    )
    report = json.loads(out.stdout)
    assert set(report) >= {"workload", "num_envs", "seconds", "cpus", "results", "limit", "config"}
    assert set(report["results"]) == {"remote_env", "gymnasium_sync"}
    assert report["limit"] == 2000.0  # 2 envs x 1000 steps/s for sleep1ms
    assert "remote_env: " in out.stderr  # progress lines go to stderr


def test_rss_and_latency_reports() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "remote_env.cli", "bench", "--json", "--rss", "64",
         "--latency", "5"],
        capture_output=True, text=True, timeout=300, cwd=REPO, check=True,
    )
    rss, lat = (json.loads(line) for line in out.stdout.splitlines())
    assert rss["num_envs"] == 64 and rss["rss_per_env_kib"] > 0
    assert lat["batch_wait_ms"] == 5.0 and lat["p99_ms"] >= lat["p50_ms"] > 0
