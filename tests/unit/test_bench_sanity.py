"""The bench's sanity line and leftover check, on figures and process tables given to them."""

from __future__ import annotations

from remote_env.cli import bench_quiet, bench_sanity

YARDSTICKS = ("gymnasium_sync", "gymnasium_async", "rllib_remote_base_env", "limit")


def test_issue_35_figures_are_disturbed_not_ratios() -> None:
    # the run from the issue: Sync 135,512 alone in rep 1, 77,605 beside RLlib's actors;
    # the limit 79,804 below remote_env's 112,019
    samples = {"remote_env": [112_019.0], "gymnasium_sync": [135_512.0, 77_605.0],
               "limit": [79_804.0]}
    bad = bench_sanity.disturbed(samples, {}, YARDSTICKS)
    assert bad["limit"] == ("79,804 is below remote_env's 112,019 and gymnasium_sync's "
                            "106,558, which it bounds")
    assert bad["gymnasium_sync"] == "reps differ by 1.75x (135,512 / 77,605; more than 1.5x)"
    res = {"remote_env": 112_019.0, "gymnasium_sync": 106_558.5, "limit": 79_804.0}
    assert bench_sanity.ratio(res, bad, "remote_env", "limit") is None
    assert bench_sanity.ratio(res, bad, "remote_env", "gymnasium_sync") is None


def test_a_clean_run_is_not_disturbed_and_remote_env_spread_is_its_own() -> None:
    samples = {"remote_env": [42_851.0, 68_440.0, 66_163.0], "gymnasium_sync": [81_254.0, 84_000.0],
               "limit": [156_474.0, 150_000.0]}
    assert bench_sanity.disturbed(samples, {"limit": [{}, {}]}, YARDSTICKS) == {}
    res = {"remote_env": 66_163.0, "limit": 153_237.0}
    assert bench_sanity.ratio(res, {}, "remote_env", "limit") == 66_163.0 / 153_237.0


def test_leftovers_beside_a_run_disturb_it() -> None:
    bad = bench_sanity.disturbed({"gymnasium_sync": [1.0, 1.0]},
                                 {"gymnasium_sync": [{}, {"ray::_RemoteSingleAgentEnv": 56}]},
                                 YARDSTICKS)
    assert bad == {"gymnasium_sync": "rep 2 ran beside the bench's own "
                                     "ray::_RemoteSingleAgentEnv x 56"}


def test_leftovers_are_new_processes_that_do_work() -> None:
    baseline = {10, 11}
    now = {10: "raylet", 12: "ray::IDLE", 13: "ray::DashboardAgent --x",
           14: "/usr/bin/python3 -c from multiprocessing.resource_tracker import main;main(7)",
           15: "ray::_RemoteSingleAgentEnv.step", 16: "ray::_RemoteSingleAgentEnv",
           17: "/usr/bin/python3 -m remote_env.cli bench"}
    left = bench_quiet.leftovers(baseline, now)
    assert set(left) == {15, 16, 17}
    assert bench_quiet.by_title(left) == {"ray::_RemoteSingleAgentEnv": 2,
                                          "/usr/bin/python3 -m remote_env.cli bench": 1}


def test_busiest_sums_cores_by_name() -> None:
    named = [("go", 0.5), ("python", 0.3), ("python", 0.4), ("raylet", 0.01), ("cc", 0.2),
             ("sh", 0.1)]
    assert bench_quiet.busiest(named) == {"python": 0.7, "go": 0.5, "cc": 0.2}
    assert bench_quiet.busiest([("raylet", 0.01)]) == {}


def test_an_idle_ray_worker_that_works_is_a_leftover() -> None:
    before = {12: bench_quiet.Proc("ray::IDLE", 0.50), 13: bench_quiet.Proc("ray::IDLE", 2.0)}
    now = {12: bench_quiet.Proc("ray::IDLE", 0.58), 13: bench_quiet.Proc("ray::IDLE", 2.01)}
    busy = bench_quiet.working(before, now, 0.1)
    assert busy == {12}  # 80 ms of CPU in 100 ms: booting; 13 idles
    titles = {pid: p.title for pid, p in now.items()}
    assert bench_quiet.leftovers({12, 13}, titles, busy) == {12: "ray::IDLE"}
