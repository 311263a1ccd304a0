"""The driver's cost of one ``recv`` of 8 Atari-sized frames, copy=True vs copy=False.

    .venv/bin/python scripts/bench_assembly_copy.py

In-process, no Ray: the :class:`~remote_env.driver.assembly.Assembler` turns a reply of
8 envs whose observations are rows of a shared mapping (as the shared-memory transport
hands them over) into ``recv``'s results. Prints µs per call, the best of 5 x 2,000
calls, for each setting twice (alternating), as one JSON line.
"""

from __future__ import annotations

import json
import mmap
import timeit

import gymnasium as gym
import numpy as np

from remote_env._types import Batch
from remote_env.driver.assembly import Assembler


def main() -> None:
    space = gym.spaces.Box(0, 255, (84, 84, 4), np.uint8)
    segment = mmap.mmap(-1, 16 * int(np.prod(space.shape)))
    shared = np.ndarray((16, *space.shape), np.uint8, buffer=segment)
    shared[:] = 7
    ids = np.arange(8)
    out: dict[str, list[float]] = {"copy": [], "no_copy": []}
    for copy in (True, False, True, False):
        asm = Assembler(space, 16, multi_agent=False, copy=copy)

        def one(asm: Assembler = asm) -> object:
            reply = Batch(list(range(8)), shared[0:8], np.zeros(8), np.zeros(8, np.bool_),
                          np.zeros(8, np.bool_), [], [], False)
            return asm.partial([(ids, reply)])

        best = min(timeit.repeat(one, number=2000, repeat=5)) / 2000
        out["copy" if copy else "no_copy"].append(round(best * 1e6, 1))
    print(json.dumps({"us_per_recv_of_8_frames": out}))


if __name__ == "__main__":
    main()
