"""The actor side: what runs inside an env actor, top-down (import-linter checks it).

- :mod:`~remote_env.actor.host`: ``SubEnvHost``, one actor holding ``envs_per_actor``
  sub-envs, a thin shim over the core and the endpoint; ``actor_class()`` is the Ray
  actor class made from it.
- :mod:`~remote_env.actor.endpoint`: ``ChannelEndpoint``, the channel's socket, each
  connection's shared arrays, fenced calls by name.
- :mod:`~remote_env.actor.core`: ``HostCore``, set-up, reset/step/call, the call
  lock and the lease fence.
- :mod:`~remote_env.actor.runner`: ``BatchRunner``, one call's envs in turn, on
  threads or awaited together (async envs).
- :mod:`~remote_env.actor.steps`: ``EnvStepper``, per-env stepping (autoreset,
  failed steps, result checks).
- :mod:`~remote_env.actor.slots`: ``EnvSlots``, the sub-envs' records (creating,
  restarting, seeds), their only writer.
- :mod:`~remote_env.actor.threads`: ``Gang``, stepping threads.

The data path it shares with the driver, :mod:`remote_env.wire.channel` and
:mod:`remote_env.wire.shared_arrays`, stays beside the library: both ends use it.
Nothing here imports the driver, the pool server or the command line.
"""
