"""The chaos soak's pure parts: the seeded fault schedule, the steps/s timeline read
from the trainers' progress lines, and the report's readable form.

The soak itself (test_soak.py, run by ``scripts/soak``) injects the faults on the
real node; nothing here touches the cluster, so the schedule and the report are
tested on their own (tests/unit/test_soak_kit.py).
"""

from __future__ import annotations

import json
import random
from dataclasses import asdict, dataclass
from typing import Any

#: Every fault the soak knows, in the order the issue lists them.
FAULTS = (
    "worker_pod_deleted",   # a worker pod deleted: its actor is replaced on a new pod
    "actor_killed",         # an env actor's process SIGKILLed inside its pod
    "env_raised",           # one env raises in step (ChaosCartPole's trigger file)
    "env_hung",             # one env hangs in step until the step timeout
    "pool_server_killed",   # the pool-server container's process SIGKILLed
    "operator_pod_deleted", # the operator pod deleted (the Deployment makes a new one)
    "api_server_paused",    # kube-apiserver SIGSTOPped for a while, then SIGCONT
    "scaled",               # kubectl scale up by one worker's envs, then back down
    "env_rolled",           # spec.env changed: a rolling update in place
)


@dataclass(frozen=True)
class Fault:
    #: seconds after the soak's start at which it is due (it runs once the
    #: previous fault has been recovered from, so possibly later)
    due_s: float
    kind: str


def fault_schedule(seed: int, seconds: float, *, kinds: tuple[str, ...] = FAULTS,
                   mean_gap_s: float = 30.0, first_s: float = 15.0) -> list[Fault]:
    """The faults of one soak: every kind once in a seeded order, then kinds drawn at
    random, with exponential gaps (mean ``mean_gap_s``, at least a fifth of it), all
    due within ``seconds``. The same seed gives the same schedule."""
    unknown = sorted(set(kinds) - set(FAULTS))
    if unknown:
        raise ValueError(f"unknown fault kinds {unknown}: expected some of {list(FAULTS)}")
    if not kinds:
        raise ValueError(f"no fault kinds given: expected some of {list(FAULTS)}")
    rng = random.Random(seed)
    order = list(kinds)
    rng.shuffle(order)
    out: list[Fault] = []
    t = first_s
    while t < seconds:
        kind = order[len(out)] if len(out) < len(order) else rng.choice(kinds)
        out.append(Fault(round(t, 1), kind))
        t += max(mean_gap_s / 5, rng.expovariate(1 / mean_gap_s))
    return out


def progress_points(logs: str, origin: float) -> list[tuple[float, int]]:
    """(seconds since ``origin``, a wall-clock time, and steps answered) from a stepping
    trainer's progress lines (``{"wall": ..., "steps": ...}``, STEPPING_TRAINER)."""
    points: list[tuple[float, int]] = []
    for line in logs.splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            doc = json.loads(line)
        except ValueError:
            continue
        if "wall" in doc and "steps" in doc:
            points.append((float(doc["wall"]) - origin, int(doc["steps"])))
    return points


def timeline(trainers: list[list[tuple[float, int]]], end_s: float,
             bucket_s: float = 10.0) -> list[tuple[float, float]]:
    """Steps/s of all trainers together per ``bucket_s`` window from 0 to ``end_s``:
    (window start, rate). Each trainer's steps at a window's edge are those of its last
    progress line before it, so a window in which no trainer made progress has rate 0
    (a stall shows)."""
    def steps_at(points: list[tuple[float, int]], t: float) -> int:
        done = [s for at, s in points if at <= t]
        return done[-1] if done else 0

    out: list[tuple[float, float]] = []
    start = 0.0
    while start < end_s:
        stop = min(start + bucket_s, end_s)
        steps = sum(steps_at(p, stop) - steps_at(p, start) for p in trainers)
        out.append((start, steps / (stop - start)))
        start += bucket_s
    return out


@dataclass
class FaultRecord:
    kind: str
    due_s: float
    at_s: float
    target: str
    recovered_s: float | None  # None: not recovered within the soak's patience
    restarts: int  # actor restarts the pool server counted for it
    note: str = ""


def render(report: dict[str, Any]) -> str:
    """The report as a person reads it: totals, one row per fault, and the steps/s
    timeline with the faults marked where they were injected."""
    lines = [f"chaos soak: seed {report['seed']}, {report['seconds']:.0f} s, "
             f"{report['trainers']} trainers, {report['pools']} pool(s)"]
    t = report["totals"]
    lines.append(f"steps sent {t['sent']:,}  answered {t['answered']:,}  lost {t['lost']:,}  "
                 f"errors {t['errors']:,} (untruncated {t['untruncated_errors']})  "
                 f"slowest recv {t['slowest_recv_s']:.2f} s")
    lines.append("")
    lines.append(f"{'at s':>7} {'fault':<22} {'target':<36} {'recovered s':>11} {'restarts':>8}")
    for f in report["faults"]:
        rec = "-" if f["recovered_s"] is None else f"{f['recovered_s']:.1f}"
        lines.append(f"{f['at_s']:>7.1f} {f['kind']:<22} {f['target'][:36]:<36} {rec:>11} "
                     f"{f['restarts']:>8}")
    lines.append("")
    lines.append("steps/s (all trainers), faults marked:")
    marks: dict[int, list[str]] = {}
    bucket = report.get("bucket_s", 10.0)
    for f in report["faults"]:
        marks.setdefault(int(f["at_s"] // bucket), []).append(f["kind"])
    peak = max((r for _, r in report["timeline"]), default=0.0) or 1.0
    for start, rate in report["timeline"]:
        bar = "#" * int(40 * rate / peak)
        mark = ", ".join(marks.get(int(start // bucket), []))
        lines.append(f"{start:>7.0f} {rate:>9,.0f} {bar:<40} {mark}")
    leaks = report.get("leaks") or {}
    lines.append("")
    lines.append("leaks at the end: " + (", ".join(f"{k}={v}" for k, v in leaks.items()) or "none"))
    return "\n".join(lines)


def as_dict(record: FaultRecord) -> dict[str, Any]:
    return asdict(record)
