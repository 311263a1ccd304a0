"""Fenced leases at the actor: SubEnvHost refuses calls of an older lease (in-process
and over the socket channel), so a resumed trainer cannot step another's envs."""

from __future__ import annotations

import gymnasium as gym
import pytest

from remote_env import errors
from remote_env.actor.host import SubEnvHost
from remote_env.wire import channel


def _host() -> SubEnvHost:
    host = SubEnvHost([lambda: gym.make("CartPole-v1")] * 2)
    host.start()
    return host


def test_a_newer_lease_fences_out_the_older_one() -> None:
    host = _host()
    host.fenced(5, "reset", [0, 1], [0, 1], None)  # trainer A, epoch 5
    assert host.fenced(5, "step", [0, 1], [0, 1]).indices == [0, 1]
    assert host.fence(7) == 7  # the registry grants the actor to B (epoch 7)
    with pytest.raises(errors.LeaseLostError, match=r"lease epoch 7 > this call's 5"):
        host.fenced(5, "step", [0, 1], [0, 1])
    with pytest.raises(errors.LeaseLostError):
        host.fenced(5, "call", [0], "spec", (), {})
    host.fenced(7, "reset", [0, 1], [3, 4], None)  # B works
    assert host.fence(6) == 7  # an older, late fence never lowers it
    # B's first call raises the fence by itself too (a replacement actor starts at 0)
    fresh = _host()
    fresh.fenced(9, "reset", [0], [0], None)
    with pytest.raises(errors.LeaseLostError):
        fresh.fenced(8, "step", [0], [0])


def test_fenced_only_dispatches_the_hot_calls() -> None:
    host = _host()
    for method in ("close", "fence", "fenced", "_create", "open_channel"):
        with pytest.raises(ValueError, match="unknown fenced call"):
            host.fenced(1, method)


def test_a_stale_call_over_the_channel_is_a_lease_lost_error() -> None:
    import ray  # only for channel.get's signature: no Ray session is started

    host = _host()
    try:
        chan = channel.Channel(*host.endpoint.listen())
        call = chan.call(("fenced", 3, "reset", [0, 1], [0, 1], None))
        assert channel.get(call, ray).indices == [0, 1]
        host.fence(4)
        call = chan.call(("fenced", 3, "step", [0, 1], [0, 1]))
        with pytest.raises(errors.LeaseLostError, match="leased to another trainer"):
            channel.get(call, ray)
        # the channel goes on serving the holder of the new lease
        assert channel.get(chan.call(("fenced", 4, "step", [0], [1])), ray).indices == [0]
        chan.close()
    finally:
        host.close()


def _short_cartpole() -> gym.Env:  # type: ignore[type-arg]
    return gym.make("CartPole-v1", max_episode_steps=3)


def test_each_lease_gets_the_autoreset_mode_it_asked_for_and_the_next_starts_over() -> None:
    host = SubEnvHost([_short_cartpole] * 2)  # the pool's own mode: NextStep
    host.start()
    assert host.describe()["autoreset_mode"] == "NextStep"
    # lease 5 asks for SameStep: a switch, so both envs are due for a reset
    info = host.lease_mode(5, "SameStep")
    assert (info["autoreset_mode"], info["reset_required"]) == ("SameStep", [0, 1])
    host.fenced(5, "reset", [0, 1], [0, 1], None)
    assert host.describe()["reset_required"] == []
    for _ in range(2):
        host.fenced(5, "step", [0, 1], [0, 1])
    batch = host.fenced(5, "step", [0, 1], [0, 1])  # the 3rd step truncates: same-step reset
    assert batch.truncations.all() and "final_obs" in batch.infos[0]
    # the next lease (a newer epoch) is served in the pool's mode again, due for a reset
    assert host.fence(6) == 6
    assert host.describe()["autoreset_mode"] == "NextStep"
    assert host.describe()["reset_required"] == [0, 1]
    # a trainer that steps anyway (an older version, which cannot know) gets the reset
    batch = host.fenced(6, "step", [0, 1], [0, 1])
    assert not batch.truncations.any() and host.describe()["reset_required"] == []
    # asking for the mode served already changes nothing: the envs go on where they are
    assert host.lease_mode(7, "NextStep")["reset_required"] == []
    # an older lease cannot switch the mode of a newer one; a bad value is refused
    with pytest.raises(errors.LeaseLostError):
        host.lease_mode(6, "Disabled")
    with pytest.raises(ValueError, match="Sometimes"):
        host.lease_mode(7, "Sometimes")
    assert host.describe()["autoreset_mode"] == "NextStep"
    # a lease in the mode the episodes started in goes on with them, though the newer
    # lease's fence switched the actor back to its own mode in between
    assert host.lease_mode(8, "SameStep")["reset_required"] == [0, 1]
    host.fenced(8, "reset", [0, 1], [0, 1], None)
    host.fence(9)
    assert host.describe()["reset_required"] == [0, 1]  # NextStep now: not their episodes'
    assert host.lease_mode(9, "SameStep")["reset_required"] == []
    assert host.fenced(9, "step", [0, 1], [0, 1]).indices == [0, 1]
    host.close()
