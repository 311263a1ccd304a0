"""The chaos soak's pure parts (soak_kit): no cluster needed."""

from __future__ import annotations

import itertools
import json

import pytest
from soak_kit import FAULTS, FaultRecord, as_dict, fault_schedule, progress_points, render, timeline


def test_the_schedule_is_the_seeds_and_runs_every_kind_first() -> None:
    a = fault_schedule(7, 600, mean_gap_s=20)
    assert a == fault_schedule(7, 600, mean_gap_s=20)
    assert a != fault_schedule(8, 600, mean_gap_s=20)
    assert sorted(f.kind for f in a[:len(FAULTS)]) == sorted(FAULTS)
    assert all(0 < f.due_s < 600 for f in a)
    gaps = [b.due_s - x.due_s for x, b in itertools.pairwise(a)]
    assert min(gaps) >= 20 / 5 - 0.1
    assert {f.kind for f in fault_schedule(1, 300, kinds=("scaled",))} == {"scaled"}


def test_the_schedule_refuses_unknown_kinds_naming_the_known_ones() -> None:
    with pytest.raises(ValueError, match=r"unknown fault kinds \['reboot'\].*worker_pod_deleted"):
        fault_schedule(1, 60, kinds=("reboot",))
    with pytest.raises(ValueError, match="no fault kinds"):
        fault_schedule(1, 60, kinds=())


def test_progress_points_read_the_trainers_lines_and_skip_the_rest() -> None:
    logs = "\n".join([
        "starting", json.dumps({"attached_s": 1.0}),
        json.dumps({"t": 2.0, "wall": 1002.0, "steps": 100, "errors": 0}),
        "{not json", json.dumps({"t": 4.0, "wall": 1004.0, "steps": 300, "errors": 1}),
    ])
    assert progress_points(logs, origin=1000.0) == [(2.0, 100), (4.0, 300)]


def test_the_timeline_sums_trainers_and_shows_a_stall_as_zero() -> None:
    a = [(0.0, 0), (5.0, 500), (10.0, 1000), (20.0, 1000), (30.0, 2000)]  # stalls 10-20
    b = [(0.0, 0), (10.0, 100), (20.0, 200), (30.0, 300)]
    got = timeline([a, b], end_s=30.0, bucket_s=10.0)
    assert got == [(0.0, 110.0), (10.0, 10.0), (20.0, 110.0)]


def test_the_readable_report_marks_each_fault_in_its_window() -> None:
    report = {
        "seed": 3, "seconds": 30.0, "pools": 1, "trainers": 2, "bucket_s": 10.0,
        "totals": {"sent": 10, "answered": 10, "lost": 0, "errors": 2, "untruncated_errors": 0,
                   "slowest_recv_s": 1.5},
        "faults": [as_dict(FaultRecord("actor_killed", 12.0, 12.4, "worker-a pid 7", 30.2, 1))],
        "timeline": [(0.0, 100.0), (10.0, 50.0), (20.0, 100.0)],
        "leaks": {"soak-0_extra_slots": 0},
    }
    text = render(report)
    assert "lost 0" in text and "actor_killed" in text
    (line,) = [x for x in text.splitlines() if x.strip().startswith("10 ")]
    assert line.rstrip().endswith("actor_killed"), text
    assert "soak-0_extra_slots=0" in text
