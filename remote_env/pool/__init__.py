"""Warm pools: the pool server and the trainers that attach to it.

- :mod:`~remote_env.pool.server`: the supervision loop (``envpool serve``).
- :mod:`~remote_env.pool.supervisor`: the pool's env actors (adopt, ping, replace,
  roll, scale), the one owner of every slot's state;
  :mod:`~remote_env.pool.launch`: asking Ray for one actor;
  :mod:`~remote_env.pool.rollout`: which outdated actors a rollout rebuilds now;
  :mod:`~remote_env.pool.slot`: one actor position and its published record.
- :mod:`~remote_env.pool.lease_actor`: the named actor holding layout and leases;
  :mod:`~remote_env.pool.lease_rules`: what a lease is, how a grant is chosen,
  renewed and expired (pure); :mod:`~remote_env.pool.lease_store`: what the lease
  actor keeps outside itself (Ray's KV store) so that its restart loses neither.
- :mod:`~remote_env.pool.spec_source`: where the running spec comes from (the
  EnvPool itself in-cluster, else the config file).
- :mod:`~remote_env.pool.snapshot`, :mod:`~remote_env.pool.http_server`,
  :mod:`~remote_env.pool.kube_report`: how the pool shows itself (the ``/status``
  document; ``/status``, ``/metrics``, ``/healthz``; ``status.pool``, whose model
  is :mod:`remote_env.spec.pool_report`, shared with the operator).

"registry" in this package is the Prometheus registry only (``PoolServer.registry``).
Trainers lease actors from the driver side (:mod:`remote_env.driver.attach`,
``RemoteVectorEnv.from_pool``): nothing here imports the driver.

The spec they run is :mod:`remote_env.spec`.
"""
