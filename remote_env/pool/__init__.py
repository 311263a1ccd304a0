"""Warm pools: the pool server and the trainers that attach to it.

- :mod:`~remote_env.pool.server`: the supervision loop (``envpool serve``).
- :mod:`~remote_env.pool.actors`: the pool's env actors (adopt, ping, replace,
  scale); :mod:`~remote_env.pool.launch`: asking Ray for one;
  :mod:`~remote_env.pool.slot`: one actor position and its published record.
- :mod:`~remote_env.pool.registry`: the named actor holding layout and leases;
  :mod:`~remote_env.pool.leases`: what a lease is, how a grant is chosen and fenced;
  :mod:`~remote_env.pool.registry_store`: what the registry keeps outside itself
  (Ray's KV store) so that its restart loses neither.
- :mod:`~remote_env.pool.attach`: trainers lease actors (``RemoteVectorEnv.from_pool``).
- :mod:`~remote_env.pool.spec_source`: where the running spec comes from (the
  EnvPool itself in-cluster, else the config file).
- :mod:`~remote_env.pool.snapshot`, :mod:`~remote_env.pool.http_server`,
  :mod:`~remote_env.pool.kube_report`: how the pool shows itself (the ``/status``
  document; ``/status``, ``/metrics``, ``/healthz``; ``status.pool``).

The spec they run is :mod:`remote_env.spec`.
"""
