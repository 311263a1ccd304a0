"""What ran beside each bench measurement: the bench's own leftovers, checked, not assumed.

A run's env processes (Ray actors and their worker processes, ``AsyncVectorEnv``'s
workers, the limit's processes) must be gone before the next run starts. Closing
does not mean gone: RLlib's ``RemoteBaseEnv.stop()`` only queues
``__ray_terminate__`` behind its actors' pending steps, and a killed actor's worker
takes a moment to exit. With 64 RLlib actors still alive beside them, gymnasium Sync
and the limit measured about half their figures (issue 35). So before each run the
bench looks at the processes themselves (psutil) and waits for its own to go.

The bench's own processes are this process's descendants (a local Ray's raylet and
its workers, multiprocessing children) and, for a cluster given with ``--address``,
its raylets' workers on this machine (workers on other machines are out of sight).
Anything else on the machine is not ours to wait for: its load is measured and
reported instead.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Collection, Mapping
from typing import NamedTuple

import psutil

#: how long to wait for a run's processes to exit before measuring anyway (and saying so):
#: 64 RLlib actors took ~10 s to exit on 2 busy cores
TIMEOUT_S = 120.0
#: the machine's load is sampled over this window just before a run, the bench idle
PROBE_S = 0.2
#: between two looks at the bench's processes
POLL_S = 0.1
#: a process using more of a core than this between two looks is working
WORKING = 0.2


class Beside(NamedTuple):
    """What ran beside one measurement."""

    #: seconds the bench waited for the previous runs' processes to exit
    waited_s: float
    #: the bench's own processes still alive when it gave up waiting, by title (a
    #: disturbed measurement); empty when the machine held nothing of the bench's
    leftover: dict[str, int]
    #: cores busy while the bench idled just before the run: other users' work and
    #: Ray's daemons
    busy_cores: float
    #: the busiest of those processes then, cores by process name
    busiest: dict[str, float]


def roots(gcs_address: str | None = None) -> list[psutil.Process]:
    """This process, and this machine's raylets of the cluster at ``gcs_address`` (a
    cluster given with ``--address``; a local Ray's raylet is this process's child)."""
    me = psutil.Process()
    if not gcs_address:
        return [me]
    flag = f"--gcs-address={gcs_address}"
    return [me] + [p for p in psutil.process_iter()
                   if p.pid != me.pid and flag in _title(p).split()]


class Proc(NamedTuple):
    title: str
    #: user + system CPU seconds so far
    cpu_s: float


def processes(tops: list[psutil.Process]) -> dict[int, Proc]:
    """pid -> title and CPU of the bench's own processes: the descendants of :func:`roots`.

    Other people's Ray clusters on the machine are left out: their load shows in
    :attr:`Beside.busy_cores`.
    """
    found: dict[int, Proc] = {}
    for top in tops:
        try:
            kids = top.children(recursive=True)
        except psutil.Error:  # a raylet that has gone
            continue
        for p in kids:
            try:
                cpu = p.cpu_times()
            except psutil.Error:
                continue
            title = _title(p)
            if title:
                found[p.pid] = Proc(title, cpu.user + cpu.system)
    return found


def _title(p: psutil.Process) -> str:
    # Ray names its workers with setproctitle ("ray::IDLE", "ray::Class.method"), which
    # rewrites argv and pads it with spaces: the title is the command line, squeezed.
    # An exiting process has none left: its name then (15 characters of the title)
    try:
        return " ".join(" ".join(p.cmdline()).split()) or p.name()
    except psutil.Error:  # exited meanwhile, or not ours to read
        return ""


def at_rest(title: str) -> bool:
    """Processes that exist beside any run and do no work of their own: Ray's idle
    pool workers (Ray starts and reaps them itself), its per-node agents, and the
    resource tracker multiprocessing starts once for the limit's semaphores."""
    if title.startswith("ray::"):
        return title.startswith("ray::IDLE") or title.split()[0].endswith("Agent")
    return "multiprocessing.resource_tracker" in title


def working(before: Mapping[int, Proc], now: Mapping[int, Proc], interval_s: float) -> set[int]:
    """The processes that used more than :data:`WORKING` of a core between two looks."""
    return {pid for pid, p in now.items()
            if pid in before and p.cpu_s - before[pid].cpu_s > WORKING * interval_s}


def leftovers(baseline: Collection[int], now: Mapping[int, str],
              busy: Collection[int] = ()) -> dict[int, str]:
    """The processes in ``now`` that were not there at ``baseline`` and are not at rest,
    and Ray's idle workers while they work: a new one boots (imports Ray, ~1 s of CPU)."""
    return {pid: t for pid, t in now.items()
            if (pid not in baseline and not at_rest(t))
            or (pid in busy and t.startswith("ray::IDLE"))}


def by_title(procs: Mapping[int, str]) -> dict[str, int]:
    """How many of each kind: an actor's title without the method it is in
    ("ray::_RemoteSingleAgentEnv.step" -> "ray::_RemoteSingleAgentEnv")."""
    kinds = (t.split(".", 1)[0] if t.startswith("ray::") else t[:80] for t in procs.values())
    return dict(collections.Counter(kinds).most_common())


class Quiet:
    """Waits, before each run, until the bench's earlier runs have left nothing behind.

    Takes its baseline when made: make it once the bench's Ray is up and before the
    first run.
    """

    def __init__(self, gcs_address: str | None = None, timeout_s: float = TIMEOUT_S) -> None:
        self._roots = roots(gcs_address)
        self._timeout_s = timeout_s
        self._baseline = set(processes(self._roots))

    def wait(self) -> Beside:
        t0 = time.monotonic()
        before = processes(self._roots)
        while True:
            time.sleep(POLL_S)  # two looks: what works shows in its CPU between them
            now = processes(self._roots)
            left = leftovers(self._baseline, {pid: p.title for pid, p in now.items()},
                             working(before, now, POLL_S))
            if not left or time.monotonic() - t0 >= self._timeout_s:
                break
            before = now
        waited = time.monotonic() - t0
        everyone = list(psutil.process_iter(["name"]))
        for p in everyone:
            _cores(p)  # the first call starts each process's count
        busy = psutil.cpu_percent(interval=PROBE_S) / 100 * (psutil.cpu_count() or 1)
        return Beside(waited, by_title(left), busy,
                      busiest([(p.info["name"], _cores(p)) for p in everyone]))


def _cores(p: psutil.Process) -> float:
    try:
        return float(p.cpu_percent(None)) / 100
    except psutil.Error:  # gone meanwhile
        return 0.0


def busiest(named: list[tuple[str, float]], k: int = 3, least: float = 0.05) -> dict[str, float]:
    """The ``k`` process names using the most cores (summed by name), from ``least`` up."""
    total: dict[str, float] = collections.defaultdict(float)
    for name, cores in named:
        total[name] += cores
    top = sorted(total.items(), key=lambda kv: -kv[1])[:k]
    return {name: round(cores, 2) for name, cores in top if cores >= least}
