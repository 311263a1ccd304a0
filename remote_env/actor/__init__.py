"""The actor side: what runs inside an env actor.

- :mod:`~remote_env.actor.host`: ``SubEnvHost``, one actor holding ``envs_per_actor``
  sub-envs (the Ray actor class is made from it in :mod:`remote_env.driver.actor_set`).
- :mod:`~remote_env.actor.steps`: per-env stepping (autoreset, failed steps, result
  checks).
- :mod:`~remote_env.actor.faults`: creating and restarting sub-envs.
- :mod:`~remote_env.actor.transport`: the channel, lease fences, shared arrays.
- :mod:`~remote_env.actor.threads`: stepping threads.

The data path it shares with the driver, :mod:`remote_env.wire.channel` and
:mod:`remote_env.wire.shared_arrays`, stays beside the library: both ends use it.
Nothing here imports the driver, the pool server or the command line.
"""
