"""The actor's CPU per shared-memory step call (issue 34): one real host, no Ray.

    PYTHONPATH=. .venv/bin/python scripts/bench_actor_calls.py --steps 20000
    PYTHONPATH=. .venv/bin/python scripts/bench_actor_calls.py --callgrind --steps 300 600
    PYTHONPATH=. .venv/bin/python scripts/bench_actor_calls.py --profile --steps 20000

Starts the actor side alone in a child process (a ``HostCore`` of ``--envs`` image envs
behind its ``ChannelEndpoint``, the objects a Ray host actor serves channel calls with),
connects to it as the driver does (``open_shared``, then ``shared_step`` calls of all
its envs with the actions in the segment) and makes ``--steps`` calls one after the
other. The actor does not spin (``spin_us`` 0): a spin's CPU is the driver's pace, not
the call's work.

Default: the child's CPU (every thread's, ``/proc/<pid>/task/*/schedstat``) over the
calls, per call and per env-step. ``--callgrind``: the child runs under valgrind's
callgrind for each count of ``--steps`` and the script prints the instructions of the
whole child per count; the difference between two counts divided by the difference in
calls is the instructions per call, free of the machine's load. ``--profile``: cProfile
of the child's serving thread on its thread CPU clock, the top functions by own time.
"""

from __future__ import annotations

import argparse
import cProfile
import glob
import json
import os
import pstats
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np


def actor_main(envs: int, profile: str | None) -> None:
    """The child: serve the channel until the driver goes; address and key on stdout."""
    from remote_env import examples
    from remote_env.actor.core import HostCore
    from remote_env.actor.endpoint import ChannelEndpoint
    from remote_env.wire import channel

    core = HostCore([examples.ImageEnv] * envs)
    core.start()
    endpoint = ChannelEndpoint(core)
    done = threading.Event()
    if profile:
        serve_calls = channel.ChannelServer._serve_calls

        def profiled(self: channel.ChannelServer, sock: socket.socket) -> None:
            prof = cProfile.Profile(time.thread_time)  # CPU, not wall: waits cost nothing
            try:
                prof.runcall(serve_calls, self, sock)
            finally:
                prof.dump_stats(profile)
                done.set()

        channel.ChannelServer._serve_calls = profiled  # type: ignore[method-assign]
    else:
        serve_calls = channel.ChannelServer._serve_calls

        def plain(self: channel.ChannelServer, sock: socket.socket) -> None:
            try:
                serve_calls(self, sock)
            finally:
                done.set()

        channel.ChannelServer._serve_calls = plain  # type: ignore[method-assign]
    address, key = endpoint.listen()
    print(json.dumps({"address": address, "key": key.hex(), "pid": os.getpid()}), flush=True)
    done.wait()
    endpoint.close()


def cpu_ns(pid: int) -> int:
    total = 0
    for path in glob.glob(f"/proc/{pid}/task/*/schedstat"):
        try:
            with open(path) as f:
                total += int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            pass
    return total


def drive(args: argparse.Namespace, steps: int, prefix: list[str],
          profile: str | None = None) -> dict[str, object]:
    from remote_env.wire import channel, shared_arrays

    cmd = [*prefix, sys.executable, __file__, "--actor", "--envs", str(args.envs)]
    if profile:
        cmd += ["--profile-out", profile]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        hello = json.loads(proc.stdout.readline())
        chan = channel.Channel(hello["address"], bytes.fromhex(hello["key"]),
                               auth_timeout_s=120.0)
        name = shared_arrays.new_name()
        where = channel.get(chan.call(("open_shared", name, 0.0)), None)
        arrays = shared_arrays.SharedArrays(name, *where, create=False)
        shared_arrays.unlink(name)
        rng = np.random.default_rng(0)
        acts = [rng.integers(0, 4, args.envs) for _ in range(64)]
        positions = range(args.envs)
        channel.get(chan.call(("reset", list(positions), [0] * args.envs, None)), None)
        for i in range(args.warmup):
            arrays.actions[:] = acts[i % 64]
            channel.get(chan.call(("shared_step", positions, None)), None)
        c0, t0 = cpu_ns(proc.pid), time.perf_counter()
        for i in range(steps):
            arrays.actions[:] = acts[i % 64]
            batch = channel.get(chan.call(("shared_step", positions, None)), None)
            assert not batch.failures, batch.failures
        wall, cpu = time.perf_counter() - t0, cpu_ns(proc.pid) - c0
        chan.close()
        del batch
        arrays.close()
        _, err = proc.communicate(timeout=600)
        out: dict[str, object] = {"steps": steps, "envs": args.envs}
        if prefix:
            m = re.search(r"Collected : (\d+)", err)
            out["instructions"] = int(m.group(1)) if m else err[-2000:]
        else:
            out.update({"calls_per_s": round(steps / wall),
                        "actor_us_cpu_per_call": round(cpu / steps / 1e3, 2),
                        "actor_us_cpu_per_env_step": round(cpu / steps / args.envs / 1e3, 3)})
        return out
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--actor", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--profile-out", help=argparse.SUPPRESS)
    ap.add_argument("--envs", type=int, default=8)
    ap.add_argument("--steps", type=int, nargs="+", default=[20000])
    ap.add_argument("--warmup", type=int, default=200)
    ap.add_argument("--callgrind", action="store_true")
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args()
    if args.actor:
        actor_main(args.envs, args.profile_out)
        return
    if args.callgrind:
        counts = []
        for steps in args.steps:
            with tempfile.TemporaryDirectory() as tmp:
                prefix = ["valgrind", "--tool=callgrind",
                          f"--callgrind-out-file={tmp}/cg.out"]
                res = drive(args, steps, prefix)
            counts.append(res)
            print(json.dumps(res), flush=True)
        if len(counts) >= 2 and all(isinstance(c["instructions"], int) for c in counts):
            a, b = counts[0], counts[-1]
            per = (b["instructions"] - a["instructions"]) / (b["steps"] - a["steps"])  # type: ignore[operator]
            print(json.dumps({"instructions_per_call": round(per),
                              "instructions_per_env_step": round(per / args.envs)}))
        return
    if args.profile:
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "prof")
            print(json.dumps(drive(args, args.steps[0], [], out)))
            pstats.Stats(out).sort_stats("tottime").print_stats(25)
        return
    for steps in args.steps:
        print(json.dumps(drive(args, steps, [])), flush=True)


if __name__ == "__main__":
    main()
