"""What a zero-copy driver could gain at most: image 16 at the defaults (issue 34).

    PYTHONPATH=. .venv/bin/python scripts/bench_zero_copy_bound.py --rounds 4

With shared memory and ``copy=False`` the driver still copies every frame once, into
the :class:`~remote_env.driver.assembly.Assembler`'s buffer (a lost actor's stand-in
observation must be the last complete frame, and the segment's rows could be half
written by a dying actor). Double-buffered rows in the segment would make that copy
unneeded. Before building that, this runs adjacent rounds of ``copy=True``,
``copy=False``, and ``copy=False`` with the store removed altogether (this process's
assembler only, patched here: stand-ins would be wrong, so measurement only). The last
is an upper bound of what double buffering can gain: it removes the copy without the
bookkeeping double buffering would add. Rounds rotate the order; prints one JSON line
with the raw steps/s of every run and the per-round ratios to ``copy=True``.
Hold the benchmark lock (README "Benchmarks").
"""

from __future__ import annotations

import argparse
import json
import statistics
from typing import Any

import numpy as np
import ray

from remote_env.cli import bench_runners
from remote_env.driver import assembly

_STORE = assembly.Assembler._store_obs


def _no_store(self: assembly.Assembler, ids: np.ndarray, obs: Any,
              span: slice | None = None) -> None:
    if self.copy or not self.box_obs:  # copy=True hands out copies of the buffer: keep it
        _STORE(self, ids, obs, span)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--num-envs", type=int, default=16)
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--num-cpus", type=int, default=2)
    args = ap.parse_args()
    ray.init(address="local", num_cpus=args.num_cpus, include_dashboard=False)
    fn = bench_runners.make_env_fn("image")
    configs: dict[str, dict[str, Any]] = {
        "copy": {}, "nocopy": {"copy": False}, "nocopy_nostore": {"copy": False}}
    names = list(configs)
    sps: dict[str, list[float]] = {name: [] for name in names}
    try:
        for r in range(args.rounds):
            for name in names[r % len(names):] + names[:r % len(names)]:
                assembly.Assembler._store_obs = (  # type: ignore[method-assign]
                    _no_store if name == "nocopy_nostore" else _STORE)
                run = bench_runners.run_remote_env(fn, args.num_envs, args.seconds,
                                                   configs[name])
                sps[name].append(round(run.sps))
    finally:
        assembly.Assembler._store_obs = _STORE  # type: ignore[method-assign]
    ratios = {name: [b / a for a, b in zip(sps["copy"], sps[name], strict=True)]
              for name in names[1:]}
    print(json.dumps({
        "workload": "image", "num_envs": args.num_envs, "raw": sps,
        "median": {name: statistics.median(v) for name, v in sps.items()},
        "over_copy_per_round": {k: [round(x, 3) for x in v] for k, v in ratios.items()},
        "over_copy_median": {k: round(statistics.median(v), 3) for k, v in ratios.items()},
    }), flush=True)


if __name__ == "__main__":
    main()
