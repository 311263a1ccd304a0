"""Issue #28: random interleavings of the vector env's calls, env failures and Ctrl-C.

Each example drives one RemoteVectorEnv through a random sequence of send/recv,
step/step_async/step_wait, reset/async_reset and close, with actions that make an
env raise (restarted) and interrupts from a timer thread at random points. After
every operation the env must be in one consistent state and every env id
accounted for: in flight (its result returned exactly once by a later recv or
step_wait) or free to be sent. Seeded and bounded (derandomize, few examples).
"""

from __future__ import annotations

import functools
from typing import Any

import bad_envs
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from interrupting import Interrupter

from remote_env import errors
from remote_env.driver.vector import RemoteVectorEnv

pytestmark = pytest.mark.usefixtures("ray_local")
bad_envs.register()
N = 4

_ids = st.lists(st.integers(0, N - 1), min_size=1, max_size=N, unique=True)
_action = st.sampled_from([0, 1, 0, 1, 0, 1, 2])  # 2: the env raises (and is restarted)
_delay = st.one_of(st.none(), st.floats(0.0, 0.08))  # when Ctrl-C comes, if at all
_op = st.one_of(
    st.tuples(st.just("send"), _ids, st.lists(_action, min_size=N, max_size=N), _delay),
    st.tuples(st.just("recv"), _delay),
    st.tuples(st.just("step"), st.lists(_action, min_size=N, max_size=N), _delay),
    st.tuples(st.just("step_async"), _delay),
    st.tuples(st.just("step_wait"), _delay),
    st.tuples(st.just("reset"), _delay),
    st.tuples(st.just("async_reset"), _delay),
)


class Model:
    """What the caller knows: which envs it sent and has not got back, and whether a
    step_async()'s step is pending (None: an interrupt left it unknown)."""

    def __init__(self, envs: RemoteVectorEnv) -> None:
        self.envs = envs
        self.out: set[int] = set()  # sent, not returned (recv's)
        self.step: bool | None = False  # a whole step pending for step_wait()

    def got(self, ids: Any) -> None:
        ids = [int(e) for e in ids]
        assert len(set(ids)) == len(ids), f"an env returned twice in one batch: {ids}"
        assert set(ids) <= self.out, f"returned {ids}, not in flight {sorted(self.out)}"
        self.out -= set(ids)

    def learn_step(self) -> None:
        """After an interrupt in step/step_async: pending or not sent (nothing between)."""
        try:
            self.envs.step_wait(timeout=30)
        except errors.NoAsyncCallError:
            pass
        self.step = False

    def check(self) -> None:
        busy = set(np.flatnonzero(self.envs.busy()).tolist())
        if self.step:
            assert busy == set(range(N)), busy
        elif self.step is False:
            assert busy == self.out, f"busy {sorted(busy)} but in flight {sorted(self.out)}"


def _run(model: Model, op: tuple[Any, ...]) -> None:
    envs, kind, delay = model.envs, op[0], op[-1]

    def call(fn: Any) -> tuple[bool, Any]:
        if delay is None:
            return False, fn()
        return Interrupter(delay).run(fn)

    busy_step = model.step is not False
    if kind == "send":
        ids, acts = np.array(op[1]), np.array(op[2])[: len(op[1])]
        if busy_step or set(op[1]) & model.out:
            with pytest.raises(errors.AlreadyPendingCallError):
                envs.send(acts, ids)
            return
        was, _ = call(lambda: envs.send(acts, ids))
        if was:  # sent whole or not at all
            sent = envs.busy()[ids]
            assert sent.all() or not sent.any(), sent
            if not sent.any():
                return
        model.out |= set(op[1])
    elif kind == "recv":
        if busy_step or not model.out:
            with pytest.raises(errors.NoAsyncCallError):
                envs.recv(timeout=30)
            return
        was, result = call(lambda: envs.recv(timeout=30))
        if not was:
            model.got(result[4]["env_id"])
    elif kind in ("step", "step_async", "reset", "async_reset"):
        acts = np.array(op[1]) if kind == "step" else np.zeros(N, dtype=np.int64)
        fn = {"step": lambda: envs.step(acts), "step_async": lambda: envs.step_async(acts),
              "reset": lambda: envs.reset(seed=1), "async_reset": envs.async_reset}[kind]
        if busy_step or model.out:
            with pytest.raises(errors.AlreadyPendingCallError):
                fn()
            return
        was, result = call(fn)
        if kind == "step" and not was:
            assert result[0].shape[0] == N
        elif kind == "async_reset":
            if not was or envs.busy().all():
                model.out = set(range(N))
            else:
                assert not envs.busy().any()
        elif kind == "step_async":
            model.step = None if was else True
        elif kind == "step" and was:
            model.step = None  # pending (step_wait resumes) or never sent
        # reset: over either way
    elif kind == "step_wait":
        if model.step is False:
            with pytest.raises(errors.NoAsyncCallError):
                envs.step_wait(timeout=30)
            return
        was, result = call(lambda: envs.step_wait(timeout=30))
        if not was:
            assert result[0].shape[0] == N
            model.step = False
    if model.step is None:
        model.learn_step()


def _drain_and_use(model: Model) -> None:
    envs = model.envs
    if model.step is not False:
        model.learn_step()
    while model.out:
        model.got(envs.recv(timeout=30)[4]["env_id"])
    with pytest.raises(errors.NoAsyncCallError):
        envs.recv(timeout=1)
    assert not envs.busy().any()
    envs.reset(seed=7)
    obs = envs.step(np.zeros(N, dtype=np.int64))[0]
    assert obs.shape[0] == N


@pytest.mark.slow
@pytest.mark.parametrize("transport", ["auto", "ray"])
def test_random_interleavings_leave_one_consistent_state(transport: str) -> None:
    @settings(max_examples=6, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(ops=st.lists(_op, min_size=4, max_size=14), close_delay=_delay)
    def run(ops: list[tuple[Any, ...]], close_delay: float | None) -> None:
        fns = [functools.partial(bad_envs.ActionFaultEnv, 0.02)] * N
        envs = RemoteVectorEnv(fns, envs_per_actor=2, transport=transport,
                               restart_failed_sub_environments=True, max_restarts=1000,
                               batch_wait_ms=1.0)
        try:
            envs.reset(seed=0)
            model = Model(envs)
            for op in ops:
                _run(model, op)
                model.check()
            _drain_and_use(model)
            if close_delay is not None:  # closed all the same when interrupted inside it
                # The delay starts inside close (its extras, under its try/finally): a
                # delay of ~0 started before the call landed before close was entered, so
                # close never ran (a CI rehearsal's hypothesis FlakyFailure: close_delay
                # 3.6e-306), which is not the case under test.
                interrupter, extras = Interrupter(close_delay), envs.close_extras

                def close_extras(**kwargs: Any) -> None:
                    interrupter.start()
                    extras(**kwargs)

                envs.close_extras = close_extras  # type: ignore[method-assign]
                interrupter.run(envs.close, start=False)
                assert envs.closed
        finally:
            envs.close()
        with pytest.raises(errors.ClosedEnvironmentError):
            envs.step(np.zeros(N, dtype=np.int64))

    run()
