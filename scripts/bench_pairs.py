"""Two RemoteVectorEnv configs side by side, in adjacent pairs (issue 34's spin figures).

    .venv/bin/python scripts/bench_pairs.py --workload cartpole --num-envs 64 \\
        --a '{}' --b '{"spin_us": 0}' --pairs 8 --seconds 2

On a shared machine the load moves by more than the effect of one option between two
``envpool bench`` runs a minute apart. Here A and B run back to back (``envpool
bench``'s send/recv loop, each run alone), in alternating order, ``--pairs`` times; the
figure is the median of the per-pair ratios B/A, which the slow drift of the load
cancels out of. Prints one JSON line with the raw steps/s of every run.
"""

from __future__ import annotations

import argparse
import json
import statistics

import ray

from remote_env.cli import bench_runners


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workload", choices=bench_runners.WORKLOADS, default="cartpole")
    ap.add_argument("--num-envs", type=int, default=64)
    ap.add_argument("--a", default="{}", help="config A, JSON (RemoteVectorEnv keywords)")
    ap.add_argument("--b", default='{"spin_us": 0}', help="config B, JSON")
    ap.add_argument("--pairs", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--num-cpus", type=int, default=2)
    args = ap.parse_args()
    cfg_a, cfg_b = json.loads(args.a), json.loads(args.b)
    ray.init(address="local", num_cpus=args.num_cpus, include_dashboard=False)
    fn = bench_runners.make_env_fn(args.workload)
    a_sps: list[float] = []
    b_sps: list[float] = []
    for i in range(args.pairs):
        order = [("a", cfg_a), ("b", cfg_b)] if i % 2 == 0 else [("b", cfg_b), ("a", cfg_a)]
        for name, cfg in order:
            sps = bench_runners.run_remote_env(fn, args.num_envs, args.seconds, cfg).sps
            (a_sps if name == "a" else b_sps).append(sps)
    ratios = [b / a for a, b in zip(a_sps, b_sps, strict=True)]
    print(json.dumps({"workload": args.workload, "num_envs": args.num_envs, "a": cfg_a,
                      "b": cfg_b, "a_sps": a_sps, "b_sps": b_sps,
                      "a_median": statistics.median(a_sps),
                      "b_median": statistics.median(b_sps),
                      "b_over_a_per_pair": ratios,
                      "b_over_a_median": statistics.median(ratios)}), flush=True)


if __name__ == "__main__":
    main()
