"""Batched arrays in shared memory between the driver and one host actor on its node.

Why: pickling each call's observations and actions and pushing them through the
socket was most of what a step cost beyond the env itself (README "Benchmarks").
Here the actor writes its K envs' observations, rewards, terminations and
truncations straight into arrays laid out like the batched spaces
(``gymnasium.vector.utils.batch_space``: row ``p`` is slot ``p``), the driver
writes actions the same way, and the channel's socket carries only "batch ready"
with the rare payload that is not an array (non-empty infos, failures, errors).

One segment per driver connection, named by the driver. It is a file in
``/dev/shm`` only until both ends have mapped it: the driver unlinks it right
after mapping, so a process that dies (SIGKILL included) leaves nothing behind;
the memory goes when the last mapping does. Not ``multiprocessing.shared_memory``:
before Python 3.13 (``track=False``) it registers every segment with a resource
tracker, an extra interpreter (~10 MB) per actor, to clean up names we never leave.

Rows are never shared between calls in flight: the driver sends an env at most one
call at a time and reads its rows when the reply arrives, before it can send again.
"""

from __future__ import annotations

import mmap
import os
import secrets
from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector.utils import batch_space

from remote_env import checks
from remote_env._types import Batch

SHM_DIR = "/dev/shm"
PREFIX = "envpool-"
_ALIGN = 64  # a cache line: rows of different arrays never share one
FIELDS = ("obs", "actions", "rewards", "terminations", "truncations")

Layout = list[tuple[str, tuple[int, ...], str, int]]  # (field, shape, dtype, offset)


def layout(obs_space: Any, act_space: Any, k: int) -> tuple[Layout, int] | None:
    """Where each batched array of ``k`` envs lives in one segment, and its size.

    None when a space does not batch into one fixed-shape array (Dict, Tuple,
    Text, ...): those envs keep the pickled path.
    """
    if not isinstance(obs_space, gym.spaces.Box) or not isinstance(act_space, checks.ARRAY_SPACES):
        return None
    arrays = [("obs", batch_space(obs_space, k)), ("actions", batch_space(act_space, k))]
    shapes = [(name, tuple(space.shape or ()), np.dtype(space.dtype)) for name, space in arrays]
    shapes += [("rewards", (k,), np.dtype(np.float64)), ("terminations", (k,), np.dtype(np.bool_)),
               ("truncations", (k,), np.dtype(np.bool_))]
    out: Layout = []
    offset = 0
    for name, shape, dtype in shapes:
        out.append((name, tuple(int(d) for d in shape), dtype.str, offset))
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        offset += -(-nbytes // _ALIGN) * _ALIGN
    return out, max(offset, 1)


def new_name() -> str:
    """A fresh segment name; the driver's pid in it says whose it was."""
    return f"{PREFIX}{os.getpid()}-{secrets.token_hex(8)}"


class SharedArrays:
    """The numpy views of one segment: ``obs``, ``actions``, ``rewards``, ... by field."""

    def __init__(self, name: str, fields: Layout, size: int, *, create: bool) -> None:
        self.name = name
        self.layout = fields
        path = os.path.join(SHM_DIR, name)
        flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0)
        fd = os.open(path, flags, 0o600)
        try:
            if create:
                os.ftruncate(fd, size)
            elif os.fstat(fd).st_size < size:
                raise ValueError(f"shared segment {name} holds {os.fstat(fd).st_size} bytes, "
                                 f"the layout needs {size}")
            self._mmap: mmap.mmap | None = mmap.mmap(fd, size)
        except BaseException:
            if create:
                unlink(name)
            raise
        finally:
            os.close(fd)  # the mapping keeps the memory
        views = {field: np.ndarray(shape, dtype=np.dtype(dtype), buffer=self._mmap,
                                   offset=offset) for field, shape, dtype, offset in fields}
        self.obs: np.ndarray = views["obs"]
        self.actions: np.ndarray = views["actions"]
        self.rewards: np.ndarray = views["rewards"]
        self.terminations: np.ndarray = views["terminations"]
        self.truncations: np.ndarray = views["truncations"]

    def close(self) -> None:
        """Unmap (idempotent). Views handed out must be gone: readers copy rows."""
        if self._mmap is None:
            return
        for field in FIELDS:
            self.__dict__.pop(field, None)
        try:
            self._mmap.close()
        except BufferError:  # a view still exported: the mapping goes with it
            pass
        self._mmap = None

    @property
    def closed(self) -> bool:
        return self._mmap is None


def unlink(name: str) -> None:
    """Remove the segment's name (best effort: it may be gone already)."""
    try:
        os.unlink(os.path.join(SHM_DIR, name))
    except FileNotFoundError:
        pass


def rows(positions: Sequence[int]) -> Any:
    """An index for ``positions``: a slice when they are consecutive (a view, no gather)."""
    if type(positions) is range and positions.step == 1:  # the channel's "lo..hi" form
        return slice(positions.start, positions.stop)
    first = positions[0]
    n = len(positions)
    if positions[-1] == first + n - 1 and (
            (positions if type(positions) is list else list(positions))
            == list(range(first, first + n))):
        return slice(first, first + n)
    return np.asarray(positions, dtype=np.intp)


def read_batch(arrays: SharedArrays, batch: Batch) -> Batch:
    """Fill a ``shared_step`` reply's arrays from the segment.

    Consecutive rows come as views, not copies: they stay as the actor wrote them
    until these envs are sent again, and the driver's assembler copies them into
    its own buffer before it returns (saves one copy per observation: 8 us a step
    for 84x84x4 frames).
    """
    if batch.obs is not None:  # the actor packed it whole (an env with no observation)
        return batch
    idx = rows(batch.indices)
    batch.obs = arrays.obs[idx]
    batch.rewards = arrays.rewards[idx]
    batch.terminations = arrays.terminations[idx]
    batch.truncations = arrays.truncations[idx]
    # ``infos == []`` stays as it came: every env's info was empty (the assembler's
    # reading of it), which saves a dict per env per call
    return batch


def write_actions(arrays: SharedArrays, positions: Sequence[int], actions: Any) -> bool:
    """Put ``actions`` in the segment if they fit its array exactly (shape and dtype:
    the env must get what it would get over the socket); False: send them along."""
    dst = arrays.actions
    if (not isinstance(actions, np.ndarray) or actions.dtype != dst.dtype
            or actions.shape[1:] != dst.shape[1:]):
        return False
    dst[rows(positions)] = actions
    return True
