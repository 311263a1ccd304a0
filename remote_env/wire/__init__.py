"""The data path the driver and the env actors share.

- :mod:`~remote_env.wire.protocol`: the handshake, frames and the ``shared_step``
  codec (pure encoding over a socket).
- :mod:`~remote_env.wire.channel`: the key-authenticated socket an actor serves and a
  driver calls (both ends).
- :mod:`~remote_env.wire.shared_arrays`: the shared-memory batch a same-node driver and
  its actors read and write in place.

It imports neither the driver, the actor side nor the pool server: both ends import it.
"""
